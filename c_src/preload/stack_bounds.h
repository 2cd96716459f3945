/*
 * The bounds of the calling thread's stack, for the walker (unwind.c): it
 * reads only words between the stack pointer and the top found here, and
 * every page in between was proved readable, so that neither a corrupt
 * frame chain nor a coroutine's stack (whose frames may point past its own
 * top, onto another stack's guard page) can make it fault.
 */
#ifndef MT_STACK_BOUNDS_H
#define MT_STACK_BOUNDS_H

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__GLIBC__)
extern void *__libc_stack_end; /* ld.so: where the main thread's stack begins */
/* argv, the environment and the auxiliary vector (hundreds of bytes at
 * least) lie above it. */
#define MAIN_STACK_TOP() ((uintptr_t)__libc_stack_end + 256)
#else
#include <sys/auxv.h>
/* musl has no __libc_stack_end: the kernel puts the program's file name
 * (AT_EXECFN) at the very top of the main thread's stack. */
#define MAIN_STACK_TOP() ((uintptr_t)getauxval(AT_EXECFN))
#endif

#define MAX_STACK ((uintptr_t)1 << 30)
/* Pages are proved readable 4 KiB at a time (the smallest page there is),
 * 16 to a system call; a stack not the thread's own is proved at most this
 * far above its stack pointer, each walk anew. */
#define PROBE_PAGE ((uintptr_t)4096)
#define PROBE_BATCH 16
#define PROBE_OTHER ((uintptr_t)1 << 20)

/* [stack_low, stack_top): this thread's own stack, proved readable from the
 * lowest stack pointer a walk started at. */
static __thread uintptr_t stack_top __attribute__((tls_model("initial-exec")));
static __thread uintptr_t stack_low __attribute__((tls_model("initial-exec")));
/* 1 in the process's main thread (whose thread id is the process id), 2 in
 * any other, 0 until known.  A fork child's only thread keeps its parent
 * thread's answer: a thread's stack and thread pointer stay as they were. */
static __thread int8_t is_main __attribute__((tls_model("initial-exec")));
/* The kernel refused process_vm_readv (a seccomp filter, qemu-user): a
 * thread's own stack is then trusted whole, as libc set it up. */
static _Atomic int no_probe;

/* How many bytes from lo (page aligned) up to hi can be read: whole pages,
 * up to the first that cannot (unmapped, or a PROT_NONE guard).  The kernel
 * reads a word of each page and stops where a load of ours would fault.
 * -1 when it will not (no_probe then says whether it ever will). */
static __attribute__((noinline, unused)) long readable_bytes(uintptr_t lo, uintptr_t hi) {
    if (atomic_load_explicit(&no_probe, memory_order_relaxed))
        return -1;
    uintptr_t sink, at = lo;
    struct iovec local[PROBE_BATCH], remote[PROBE_BATCH];
    int saved = errno;
    long result = (long)(hi - lo);
    pid_t self = getpid();
    while (at < hi) {
        int k = 0;
        for (; k < PROBE_BATCH && at + (uintptr_t)k * PROBE_PAGE < hi; k++) {
            local[k] = (struct iovec){&sink, sizeof sink};
            remote[k] = (struct iovec){(void *)(at + (uintptr_t)k * PROBE_PAGE), sizeof sink};
        }
        ssize_t got = process_vm_readv(self, local, (unsigned long)k, remote, (unsigned long)k, 0);
        if (got < 0) {
            if (errno == ENOSYS || errno == EPERM)
                atomic_store_explicit(&no_probe, 1, memory_order_relaxed);
            result = errno == EFAULT ? (long)(at - lo) : -1;
            break;
        }
        at += (uintptr_t)got / sizeof sink * PROBE_PAGE;
        if ((size_t)got < (size_t)k * sizeof sink) {
            result = (long)(at - lo);
            break;
        }
    }
    errno = saved;
    return result;
}

/* Above every frame the walker may read, and below it all is readable; 0
 * when that cannot be known, and then the walk is left to libunwind.
 * *own is 0 when sp is not on the thread's own stack (a coroutine's, a
 * signal stack): the top is then where readable memory ends, and a walk
 * that stops short of its end must not be handed to libunwind, which
 * would read on.  glibc and musl put a thread's control block at the top
 * of its stack, and the thread pointer (%fs:0 on x86-64; TPIDR_EL0 on
 * aarch64, just above the control block) there; the main thread's stack
 * ends at MAIN_STACK_TOP. */
static __attribute__((noinline, unused)) uintptr_t find_top_of_stack(uintptr_t sp, int *own) {
    uintptr_t top, tp;
#if defined(__x86_64__)
    __asm__("mov %%fs:0, %0" : "=r"(tp));
#else
    __asm__("mrs %0, tpidr_el0" : "=r"(tp));
#endif
    uintptr_t end = MAIN_STACK_TOP();
    /* The main thread's thread pointer is not on its stack, and may lie above
     * it within MAX_STACK with unmapped pages between (qemu-user maps the
     * stack below the libraries): the main thread only trusts its own end. */
    if (!is_main)
        is_main = syscall(SYS_gettid) == getpid() ? 1 : 2;
    if (is_main == 2 && tp > sp && tp - sp < MAX_STACK)
        top = tp;
    else if (is_main == 1 && end > sp && end - sp < MAX_STACK)
        top = end;
    else
        top = 0;
    uintptr_t lo = sp & ~(PROBE_PAGE - 1);
    *own = 1;
    if (top && top != stack_top) {
        stack_top = top;
        stack_low = top;
    }
    /* The own stack: from sp up to where it was proved before. */
    long n = top && stack_low - lo <= PROBE_OTHER ? readable_bytes(lo, stack_low) : 0;
    if (top && n >= 0 && (uintptr_t)n >= stack_low - lo) {
        stack_low = lo;
        return top;
    }
    /* Unreadable pages between, or too far below to tell: another stack,
     * proved afresh each walk, for it may be unmapped at any time. */
    if (n >= 0)
        n = readable_bytes(lo, lo + PROBE_OTHER);
    if (n > 0) {
        *own = 0;
        return lo + (uintptr_t)n;
    }
    if (top && atomic_load_explicit(&no_probe, memory_order_relaxed)) {
        stack_low = lo; /* nothing can be proved: trusted, as libc set it up */
        return top;
    }
    return 0;
}

/* Known after a thread's first walk: its callers keep their registers. */
static inline uintptr_t top_of_stack(uintptr_t sp, int *own) {
    *own = 1;
    if (sp >= stack_low && sp < stack_top)
        return stack_top;
    return find_top_of_stack(sp, own);
}

#endif
