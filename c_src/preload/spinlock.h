/*
 * A test-and-test-and-set spinlock that yields after a short spin.
 *
 * pthread mutexes would do, but the tracking path runs inside malloc of every
 * thread, including during fork and in code that must not block on futexes
 * taken by libc itself; the critical sections guarded here are a few hundred
 * nanoseconds long and never call into libc except mmap (the stack store's
 * also names a new stack's Erlang frames, through the VM's lock-free code
 * lookup, once per such stack).
 */
#ifndef MT_SPINLOCK_H
#define MT_SPINLOCK_H

#include <sched.h>
#include <stdatomic.h>

typedef atomic_int mt_spinlock;

static inline void mt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Waiting, out of line: the caller of an uncontended lock keeps its values
 * in registers instead of saving them around a possible sched_yield. */
static __attribute__((noinline, cold, unused)) void mt_lock_wait(mt_spinlock *l) {
    for (;;) {
        for (int spins = 0; atomic_load_explicit(l, memory_order_relaxed); spins++) {
            if (spins < 64)
                mt_cpu_relax();
            else
                sched_yield(); /* the holder may have been preempted */
        }
        if (!atomic_exchange_explicit(l, 1, memory_order_acquire))
            return;
    }
}

static inline void mt_lock(mt_spinlock *l) {
#ifdef MT_LEAVE_OUT_LOCK /* a benchmark's build only, 1 thread: what the atomic exchange costs */
    atomic_store_explicit(l, 1, memory_order_relaxed);
    return;
#endif
    if (__builtin_expect(atomic_exchange_explicit(l, 1, memory_order_acquire), 0))
        mt_lock_wait(l);
}

/* Takes l if it is free: 1 if taken.  A caller that then waits out of
 * line (mt_lock_wait, in a cold function of its own) keeps its common path
 * free of calls. */
static inline int mt_try_lock(mt_spinlock *l) {
#ifdef MT_LEAVE_OUT_LOCK
    atomic_store_explicit(l, 1, memory_order_relaxed);
    return 1;
#endif
    return !atomic_exchange_explicit(l, 1, memory_order_acquire);
}

static inline void mt_unlock(mt_spinlock *l) { atomic_store_explicit(l, 0, memory_order_release); }

#endif
