/*
 * What a fork does to the tracker (pthread_atfork handlers): it holds every
 * lock across the fork, so that the child inherits a consistent table and
 * can allocate at once, and counts the forks under way and done, which the
 * waits on those locks watch (spinlock.h's struct mt_fork_watch).
 */
#define _GNU_SOURCE
#include "tracker.h"

#include <pthread.h>

#include "counters.h"
#include "erlang_frames.h"
#include "objects.h"
#include "stacks.h"
#include "table.h"
#include "unwind_fallback.h"

/* The forking thread keeps out of the table meanwhile (fork itself may
 * allocate).  A signal handler's fork that interrupted its thread inside
 * the tracker (busy) takes nothing, though: the thread may hold one of
 * those locks, or be inside a fork gate, and would wait for itself.  Its
 * child is then orphaned: it records nothing more, and the work the
 * handler interrupted, which goes on there once the handler returns, gives
 * up waiting for the locks that other threads held (stuck_at, spinlock.h).
 * An orphan's later forks take nothing either: its gates' counts, reset in
 * the child while that work may have been inside, no longer add up.
 *
 * One bit a fork under way on this thread, the innermost lowest: a handler
 * may fork inside a fork (during clone, or another prepare handler), and
 * glibc runs the inner fork's handlers within the outer's, last in first
 * out.  With one flag the inner fork's "alone" outlived it, and the outer
 * fork's parent then kept every lock for good. */
static MT_TLS unsigned forks_alone;

static int pop_alone(void) {
    int alone = forks_alone & 1;
    forks_alone >>= 1;
    return alone;
}

static void fork_prepare(void) {
    atomic_fetch_add(&mt_state.fork.forking, 1);
    int alone = mt_me.f.b.busy != MT_BUSY_NO || mt_objects_mine() ||
                atomic_load(&mt_state.mode) == MT_MODE_ORPHANED;
    forks_alone = forks_alone << 1 | (unsigned)alone;
    if (alone)
        return;
    mt_me.fork_saved_busy = mt_tracker_call_out(); /* others' fork handlers allocate */
    /* First: a lookup or a libunwind walk under way may wait in the loader
     * for a thread whose allocation needs one of the locks below. */
    mt_objects_close();
    mt_fallback_close();
    mt_counts_lock();
    mt_stacks_lock();
    mt_table_fork_prepare();
}

static void unlock_rest(void) {
    mt_stacks_unlock();
    mt_counts_unlock();
    mt_tracker_call_back(mt_me.fork_saved_busy);
}

static void fork_parent(void) {
    if (!pop_alone()) {
        mt_table_fork_parent();
        unlock_rest();
        mt_fallback_open();
        mt_objects_open();
    }
    /* One more done, one fewer under way.  A state found stuck is forgotten
     * once it passes: the done count wraps every 65,536 forks, and a fork
     * that many later would otherwise be given up on at once. */
    int was = atomic_fetch_add(&mt_state.fork.forking, (1 << 16) - 1);
    atomic_compare_exchange_strong(&mt_state.fork.stuck_at, &was, 0);
}

static void fork_child(void) {
    int alone = pop_alone();
    mt_erl_forked();
    mt_fallback_open_child(); /* later walks keep out of the loader and libunwind */
    mt_objects_open_child();
    if (alone) {
        atomic_store(&mt_state.mode, MT_MODE_ORPHANED);
        atomic_store(&mt_state.gate, MT_GATE_INERT);
        atomic_store(&mt_state.fork.forking, 1);
        atomic_store(&mt_state.fork.stuck_at, 1);
        return;
    }
    mt_tracker_forked();
    mt_counts_child(mt_me.counts); /* the other threads did not come along */
    mt_table_fork_child();
    unlock_rest();
    atomic_store(&mt_state.fork.forking, 0); /* the other threads' forks did not come along */
    atomic_store(&mt_state.fork.stuck_at, 0);
}

void mt_fork_install(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }
