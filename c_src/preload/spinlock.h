/*
 * A test-and-test-and-set spinlock that yields after a short spin, then sleeps.
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

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

typedef atomic_int mt_spinlock;

static inline void mt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One more wait for a holder that is not running.  A yield lets threads of
 * the waiter's own priority run, not one of lower: a SCHED_FIFO waiter
 * whose lock a preempted thread of normal priority holds on the same
 * processor spun until the kernel throttled real-time threads, a second
 * or more.  So after MT_YIELDS yields a wait sleeps, which lets any run
 * (50 us: a holder preempted that long is not about to let go anyway);
 * errno is the caller's, as the C library's lock waits leave it. */
#define MT_YIELDS 128
static inline void mt_backoff(unsigned *yields) {
    if (*yields < MT_YIELDS) {
        ++*yields;
        sched_yield();
        return;
    }
    int saved = errno;
    struct timespec pause = {0, 50000};
    nanosleep(&pause, NULL);
    errno = saved;
}

/* What a wait that may give up watches: forks under way in forking's low
 * 16 bits and forks done above them.  A fork's prepare handler holds the
 * tracker's locks, then waits in the C library for its allocator's locks,
 * and a signal handler that allocates, having interrupted the owner of one
 * of those, would wait for the fork's locks for ever.  So a wait gives up
 * once forking has stood still, with a fork under way, for a second or
 * two, and notes the value in stuck_at: later waits give up at once while
 * that fork stands still, since a thread whose handlers each waited a
 * second, with signals pending all along, would not get back to its own
 * code to free the allocator's lock at all.  Forks that come and go, however
 * many, are waited for. */
struct mt_fork_watch {
    _Atomic int forking;
    _Atomic int stuck_at;
};

/* Waiting that gives up (above): 0 when it does, else 1 with l taken.  Out
 * of line and cold: the caller of an uncontended lock keeps its values in
 * registers instead of saving them around a possible sched_yield. */
static __attribute__((noinline, cold, unused)) int mt_lock_wait_unless(mt_spinlock *l,
                                                                       struct mt_fork_watch *w) {
    time_t from = 0; /* 1 + the second forking was seen at seen; 0: not yet */
    int seen = 0;
    unsigned yields = 0;
    for (;;) {
        for (int spins = 0; atomic_load_explicit(l, memory_order_relaxed); spins++) {
            if (spins < 64) {
                mt_cpu_relax();
                continue;
            }
            int v = atomic_load_explicit(&w->forking, memory_order_relaxed);
            if ((v & 0xFFFF) && v == atomic_load_explicit(&w->stuck_at, memory_order_relaxed))
                return 0; /* a fork already found stuck, still standing */
            mt_backoff(&yields);
            struct timespec now;
            if (!(v & 0xFFFF) || clock_gettime(CLOCK_MONOTONIC, &now) != 0)
                from = 0;
            else if (!from || v != seen)
                from = now.tv_sec + 1, seen = v;
            else if (now.tv_sec + 1 - from >= 2) {
                atomic_store_explicit(&w->stuck_at, v, memory_order_relaxed);
                return 0;
            }
        }
        if (!atomic_exchange_explicit(l, 1, memory_order_acquire))
            return 1;
    }
}

/* Waiting that never gives up: the same loop, with no fork to watch (it
 * yields to a holder that may have been preempted, then sleeps). */
static __attribute__((noinline, cold, unused)) void mt_lock_wait(mt_spinlock *l) {
    static struct mt_fork_watch none;
    (void)mt_lock_wait_unless(l, &none);
}

static inline void mt_lock(mt_spinlock *l) {
#ifdef MT_LEAVE_OUT_LOCK /* a benchmark's build only, 1 thread: what the atomic exchange costs */
    atomic_store_explicit(l, 1, memory_order_relaxed);
    return;
#endif
    if (__builtin_expect(atomic_exchange_explicit(l, 1, memory_order_acquire), 0))
        mt_lock_wait(l);
}

/* mt_lock, but 0 without l when mt_lock_wait_unless gives up. */
static inline int mt_lock_unless(mt_spinlock *l, struct mt_fork_watch *w) {
#ifdef MT_LEAVE_OUT_LOCK
    (void)w;
    atomic_store_explicit(l, 1, memory_order_relaxed);
    return 1;
#endif
    if (__builtin_expect(atomic_exchange_explicit(l, 1, memory_order_acquire), 0))
        return mt_lock_wait_unless(l, w);
    return 1;
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
