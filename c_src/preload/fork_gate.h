/*
 * A way in that a fork closes, for code that may wait in the loader
 * (dl_iterate_phdr) or in a library's own lock: objects.c's lookups and
 * unwind_fallback.c's libunwind walks.  Whoever goes in counts itself in
 * `inside`; a fork closes the way and waits until none is inside, so that
 * its child never inherits such a lock held by a thread that did not come
 * along.  Going in is each user's own (see theirs); what a fork does is
 * the same for both.
 *
 * It waits MT_FORK_GATE_WAIT_MS at most: a fork made inside a
 * dl_iterate_phdr callback holds the loader's lock that those inside wait
 * for, and waiting for them deadlocked.  Giving up is safe there (they
 * hold no lock, they wait for the forking thread's), and a fork child's
 * walks keep out of the loader and libunwind whatever the parent's
 * threads held (mt_objects_forked).  A walk holds the loader's lock for
 * microseconds, so a wait this long is one for the forking thread.
 */
#ifndef MT_FORK_GATE_H
#define MT_FORK_GATE_H

#include <sched.h>
#include <stdatomic.h>

#include "clock.h"
#include "spinlock.h"

#define MT_FORK_GATE_WAIT_MS 50

struct mt_fork_gate {
    _Atomic int inside;  /* threads inside */
    _Atomic int closing; /* forks under way */
};

static inline void mt_fork_gate_close(struct mt_fork_gate *g) {
    atomic_fetch_add(&g->closing, 1);
    uint64_t deadline = 0;
    unsigned yields = 0;
    while (atomic_load(&g->inside)) {
        uint64_t now = mt_now_ms();
        if (!deadline)
            deadline = now + MT_FORK_GATE_WAIT_MS + 1; /* a coarse tick may end at once */
        else if (now >= deadline)
            return;
        mt_backoff(&yields);
    }
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
