/* libunwind loaded on demand (see unwind_fallback.h). */
#define _GNU_SOURCE
#include "unwind_fallback.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "clock.h"
#include "fork_gate.h"
#include "spinlock.h"

/* One walk at a time goes into libunwind: it takes a global lock of its
 * own there (Debian's ignores the per-thread cache setting) and holds it
 * while it asks dl_iterate_phdr, that is while it waits for the loader's
 * lock.  A thread that holds the loader's lock, inside a dl_iterate_phdr
 * callback (other code's) that allocates, and so walks, must then not wait
 * for libunwind's: it waits here instead, a few milliseconds at most, and
 * keeps the frames its own walker found (mt_fallback_cut counts them).
 * Nor may a fork happen while a walk is inside: the child would inherit
 * libunwind's lock held.  So a fork closes the way in and waits for the
 * walk under way to end; until it is done a walk gives up at once. */
static struct mt_fork_gate gate; /* inside: 1 while a walk is in libunwind */
static _Atomic uint64_t cut;
/* The thread whose walk is inside (pthread_self), 0 for none: what libunwind
 * allocates for it is the tracer's doing (mt_fallback_running). */
static _Atomic uintptr_t walker;

int mt_fallback_running(void) {
    return atomic_load_explicit(&walker, memory_order_relaxed) == (uintptr_t)pthread_self();
}

uint64_t mt_fallback_cut(void) { return atomic_load_explicit(&cut, memory_order_relaxed); }
void mt_fallback_count_cut(void) { atomic_fetch_add_explicit(&cut, 1, memory_order_relaxed); }

/* Set once libunwind has walked on this thread (mt_fallback_warm). */
static __thread unsigned char warm __attribute__((tls_model("initial-exec")));
int mt_fallback_warm(void) { return warm; }

void mt_fallback_close(void) { mt_fork_gate_close(&gate); }
void mt_fallback_open(void) { mt_fork_gate_open(&gate); }
void mt_fallback_open_child(void) { mt_fork_gate_open_child(&gate); }

#ifdef MT_NO_LIBUNWIND

void mt_fallback_load(void) {}
int mt_fallback_loaded(void) { return 0; }
int mt_fallback_backtrace(void **buf, int max) {
    (void)buf;
    (void)max;
    return -1;
}

#else

#define UNW_LOCAL_ONLY
#include <dlfcn.h>
#include <errno.h>
#include <libunwind.h>
#include <sys/uio.h>
#include <unistd.h>

#include "unwind.h"

#ifndef MT_LIBUNWIND_SONAME
#define MT_LIBUNWIND_SONAME "libunwind.so.8"
#endif
/* libunwind's local-only names carry the target (_ULx86_64_...): the
 * header's own macros spell them. */
#define NAME_(x) #x
#define NAME(x) NAME_(x)

#define WAIT_MS 3 /* on the coarse clock: 3 to about 7 ms */

static int enter(void) {
    uint64_t deadline = 0;
    for (int spins = 0;; spins++) {
        int none = 0;
        /* seq_cst: a fork sees this walk, or this walk sees the fork */
        if (!atomic_load(&gate.closing) && atomic_compare_exchange_weak(&gate.inside, &none, 1)) {
            if (!atomic_load(&gate.closing))
                return 1;
            atomic_store(&gate.inside, 0);
        }
        if (atomic_load(&gate.closing))
            break;
        if (spins < 64) {
            mt_cpu_relax();
            continue;
        }
        uint64_t now = mt_now_ms();
        if (!deadline)
            deadline = now + WAIT_MS;
        else if (now >= deadline)
            break;
        sched_yield();
    }
    atomic_fetch_add_explicit(&cut, 1, memory_order_relaxed);
    return 0;
}

static void leave(void) { atomic_store_explicit(&gate.inside, 0, memory_order_release); }

typedef int (*backtrace_fn)(void **, int);
typedef int (*policy_fn)(unw_addr_space_t, unw_caching_policy_t);
typedef unw_accessors_t *(*accessors_fn)(unw_addr_space_t);
typedef int (*read_fn)(unw_addr_space_t, unw_word_t, unw_word_t *, int, void *);
static backtrace_fn _Atomic backtrace_of;
static read_fn libunwind_read;

/* libunwind checks a read it cannot trust (past a frame without unwind
 * information, and at a stack's end) by writing the word's first byte into
 * a pipe it opened as it started, named by the pipe's fd numbers: in a
 * program that closed those numbers and opened its own files there since
 * (closefrom, dup2: a daemon's start), it took a byte of the program's
 * input and wrote one into its output.  So every read of libunwind's comes
 * here instead, and none reaches its pipe: a word on the thread's own
 * stack, proved readable by the walker, is read; any other is copied by
 * the kernel, or refused where it cannot be (unmapped, or the kernel
 * refuses to copy at all: the walk then ends there). */
static int read_word(unw_addr_space_t as, unw_word_t addr, unw_word_t *val, int write, void *arg) {
    if (write) /* a resume's, never a backtrace's */
        return libunwind_read(as, addr, val, write, arg);
    if (mt_unwind_stack_holds((uintptr_t)addr, (uintptr_t)addr + sizeof *val)) {
        *val = *(const unw_word_t *)(uintptr_t)addr;
        return 0;
    }
    struct iovec local = {val, sizeof *val}, remote = {(void *)(uintptr_t)addr, sizeof *val};
    int saved = errno;
    ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    errno = saved;
    return got == (ssize_t)sizeof *val ? 0 : -UNW_EINVAL;
}

void mt_fallback_load(void) {
    if (atomic_load(&backtrace_of))
        return;
    void *h = dlopen(MT_LIBUNWIND_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen("libunwind.so", RTLD_NOW | RTLD_LOCAL);
    backtrace_fn bt = h ? (backtrace_fn)dlsym(h, "unw_backtrace") : NULL;
    policy_fn policy = h ? (policy_fn)dlsym(h, NAME(unw_set_caching_policy)) : NULL;
    unw_addr_space_t *local = h ? dlsym(h, NAME(unw_local_addr_space)) : NULL;
    accessors_fn accessors = h ? (accessors_fn)dlsym(h, NAME(unw_get_accessors)) : NULL;
    /* A failure leaves its message for the program's first dlerror(): the
     * program's own calls never failed, so none is left. */
    if (!h || !bt || !policy || !local || !accessors)
        dlerror();
    /* Without its reads taken over (read_word), libunwind is not used:
     * never unloaded either, a handle is cheap, a dlclose here is not. */
    unw_accessors_t *acc = bt && local && accessors ? accessors(*local) : NULL;
    if (!acc || !acc->access_mem)
        return;
    libunwind_read = acc->access_mem;
    acc->access_mem = read_word;
    /* Per-thread caches keep libunwind off its global lock while unwinding. */
    if (policy)
        policy(*local, UNW_CACHE_PER_THREAD);
    atomic_store(&backtrace_of, bt);
}

int mt_fallback_loaded(void) { return atomic_load(&backtrace_of) != NULL; }

int mt_fallback_backtrace(void **buf, int max) {
    backtrace_fn bt = atomic_load_explicit(&backtrace_of, memory_order_acquire);
    if (!bt)
        return -1;
    if (!enter())
        return -1;
    atomic_store_explicit(&walker, (uintptr_t)pthread_self(), memory_order_relaxed);
    int n = bt(buf, max);
    warm = 1;
    atomic_store_explicit(&walker, 0, memory_order_relaxed);
    leave();
    return n;
}

#endif
