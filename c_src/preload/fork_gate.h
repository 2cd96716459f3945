/*
 * A way in that a fork closes, for code that may wait in the loader
 * (dl_iterate_phdr) or in a library's own lock: objects.c's lookups and
 * unwind_fallback.c's libunwind walks.  Whoever goes in counts itself in
 * `inside`; a fork closes the way and waits until none is inside, so that
 * its child never inherits such a lock held by a thread that did not come
 * along.  Going in is each user's own (see theirs); what a fork does is
 * the same for both.
 */
#ifndef MT_FORK_GATE_H
#define MT_FORK_GATE_H

#include <sched.h>
#include <stdatomic.h>

struct mt_fork_gate {
    _Atomic int inside;  /* threads inside */
    _Atomic int closing; /* forks under way */
};

static inline void mt_fork_gate_close(struct mt_fork_gate *g) {
    atomic_fetch_add(&g->closing, 1);
    while (atomic_load(&g->inside))
        sched_yield();
}

static inline void mt_fork_gate_open(struct mt_fork_gate *g) { atomic_fetch_sub(&g->closing, 1); }

/* In the child, where only the forking thread came along: none is inside,
 * though one that saw the fork and went back out (in the parent) may have
 * been counted in the copy the child got, and a later fork would wait for
 * it for ever. */
static inline void mt_fork_gate_open_child(struct mt_fork_gate *g) {
    atomic_store(&g->inside, 0);
    atomic_store(&g->closing, 0);
}

#endif
