/*
 * A tracked thread's registration (its counters, and the key whose
 * destructor gives back what the tracker holds for it) and its exit.
 */
#define _GNU_SOURCE
#include "threads.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>

#include "spinlock.h"
#include "stacks.h"

/* The key whose destructor is thread_exit, made by the first thread that
 * registers or by the constructor, whichever comes first: threads that
 * dependencies' constructors start before this library's run need it too. */
enum { KEY_NONE, KEY_MAKING, KEY_MADE, KEY_FAILED };
static pthread_key_t exit_key;
static _Atomic int exit_key_state;

#ifndef PTHREAD_DESTRUCTOR_ITERATIONS
#define PTHREAD_DESTRUCTOR_ITERATIONS 4 /* glibc's and musl's */
#endif

/* Calls of this thread counted in the shared counters (the registry was
 * full, or it exited): thread_exit tells a quiet round by them too. */
MT_TLS uint64_t mt_shared_calls;

/* This thread's calls counted so far. */
static uint64_t own_calls(void) {
    uint64_t n = mt_shared_calls;
    if (mt_me.f.b.registered)
        for (int f = 0; f < MT_FN_COUNT; f++)
            n += atomic_load_explicit(&mt_me.counts->calls[f], memory_order_relaxed);
    return n;
}

/* Sets the key for this thread, errno kept: with a key number of 32 or more
 * glibc's pthread_setspecific allocates, and a failed try at a new arena
 * there sets ENOMEM though the call succeeds, where a free must not. */
static int set_exit_key(uintptr_t round) {
    int saved_errno = errno;
    int set = pthread_setspecific(exit_key, (void *)round) == 0;
    errno = saved_errno;
    return set;
}

/* own_calls() when thread_exit last looked. */
static MT_TLS uint64_t exit_calls;

/* Thread exit (a pthread key destructor): fold this thread's counts, give
 * back its stacks' memory.  The C library calls the keys' destructors in up
 * to PTHREAD_DESTRUCTOR_ITERATIONS rounds, another round while one of them
 * sets a key again.  This key, made in the constructor at the latest,
 * comes before the keys of libraries loaded later, whose destructors may allocate: it sets
 * itself again (its value counting the rounds) and lets go when a whole
 * round made no call of this thread's, or in its third round, so that those
 * allocations keep their stacks (those of the first two rounds at least;
 * later ones are recorded without).  Not in the last: a thread whose first
 * counted call is a destructor's sets this key in the middle of the
 * rounds, one round late, and its last would never come when a destructor
 * sets its key again in every round (each such thread kept its walker and
 * recent stacks, two mappings, until the process ran out of them); set
 * later still (by a destructor's first call in the C library's third or
 * fourth round) it keeps them all the same. */
static void thread_exit(void *round) {
    uintptr_t r = (uintptr_t)round;
    uint64_t calls = own_calls();
    int quiet = r > 1 && calls == exit_calls;
    exit_calls = calls;
    if (r < PTHREAD_DESTRUCTOR_ITERATIONS - 1 && !quiet) {
        unsigned char was = mt_tracker_call_out(); /* a high key's setspecific allocates */
        int again = set_exit_key(r + 1);
        mt_tracker_call_back(was);
        if (again)
            return;
    }
    struct mt_counts *mine = mt_me.f.b.registered ? mt_me.counts : NULL;
    mt_me.counts_state = MT_COUNTS_SHARED; /* later calls count atomically */
    mt_me.f.b.registered = 0;
    atomic_signal_fence(memory_order_seq_cst); /* before the struct may go to another thread */
    if (mine) {
        unsigned char was = mt_tracker_enter(); /* a handler's fork must not wait for its lock */
        mt_counts_retire(mine);
        mt_tracker_leave(was);
    }
    mt_stacks_thread_exit();
}

static MT_TLS unsigned char making_here; /* this thread is in pthread_key_create */

/* 1 once the key exists.  A thread that finds it being made waits for it
 * (pthread_key_create neither allocates nor blocks); a fork child whose
 * parent was making it makes it again (mt_tracker_forked). */

static int exit_key_ready(void) {
    int none = KEY_NONE;
    if (atomic_compare_exchange_strong(&exit_key_state, &none, KEY_MAKING)) {
        making_here = 1;
        int made = pthread_key_create(&exit_key, thread_exit) == 0;
        making_here = 0;
        atomic_store(&exit_key_state, made ? KEY_MADE : KEY_FAILED);
    }
    int state;
    unsigned yields = 0;
    while ((state = atomic_load(&exit_key_state)) == KEY_MAKING && !making_here)
        mt_backoff(&yields); /* never for itself: a signal handler's call on this thread */
    return state == KEY_MADE;
}

void mt_thread_register(void) {
    unsigned char was =
        mt_tracker_call_out(); /* a high key number makes pthread_setspecific allocate */
    int later;
    mt_me.counts = mt_counts_register(&later);
    mt_me.counts_state = mt_me.counts ? MT_COUNTS_REGISTERED
                         : later      ? MT_COUNTS_NEW
                                      : MT_COUNTS_SHARED;
    mt_me.f.b.registered = mt_me.counts != NULL;
    if (exit_key_ready()) /* registered or not: its stacks' memory goes back too */
        set_exit_key(1);
    mt_tracker_call_back(was);
}

void mt_threads_loaded(void) {
    /* made here at the latest, before the keys of libraries loaded later;
     * a thread registered before this constructor ran sets it now.  As a
     * call-out: a signal handler's malloc meanwhile neither registers nor
     * waits for the key this thread is making. */
    unsigned char was = mt_tracker_call_out();
    if (exit_key_ready() && mt_me.f.b.registered)
        set_exit_key(1);
    mt_tracker_call_back(was);
}

void mt_threads_forked(void) {
    int making = KEY_MAKING; /* by a thread the child does not have */
    atomic_compare_exchange_strong(&exit_key_state, &making, KEY_NONE);
}
