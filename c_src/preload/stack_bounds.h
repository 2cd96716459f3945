/*
 * The bounds of the calling thread's stack, for the walker (unwind.c): it
 * reads only words between the stack pointer and the top found here, so a
 * corrupt frame chain can never make it read unmapped memory.
 */
#ifndef MT_STACK_BOUNDS_H
#define MT_STACK_BOUNDS_H

#include <stdint.h>
#include <sys/syscall.h>
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

static __thread uintptr_t stack_top __attribute__((tls_model("initial-exec")));
/* 1 in the process's main thread (whose thread id is the process id), 2 in
 * any other, 0 until known.  A fork child's only thread keeps its parent
 * thread's answer: a thread's stack and thread pointer stay as they were. */
static __thread int8_t is_main __attribute__((tls_model("initial-exec")));

/* Above every frame of this thread, and below it all is mapped; 0 when it
 * cannot be known (a thread on a stack libc did not set up, such as a
 * coroutine's), and then the walk is left to libunwind.  glibc and musl put
 * a thread's control block at the top of its stack, and the thread pointer
 * (%fs:0 on x86-64; TPIDR_EL0 on aarch64, just above the control block)
 * there; the main thread's stack ends at MAIN_STACK_TOP. */
static __attribute__((noinline, unused)) uintptr_t find_top_of_stack(uintptr_t sp) {
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
        return 0;
    stack_top = top;
    return top;
}

/* Known after a thread's first walk: its callers keep their registers. */
static inline uintptr_t top_of_stack(uintptr_t sp) {
    uintptr_t top = stack_top;
    if (top > sp && top - sp < MAX_STACK)
        return top;
    return find_top_of_stack(sp);
}

#endif
