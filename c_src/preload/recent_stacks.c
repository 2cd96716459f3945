/* The calling thread's last few stacks (see recent_stacks.h). */
#include "recent_stacks.h"

#define RECENT 8

/* 4.4 KiB a thread, in TLS: nothing to allocate, nothing to free. */
static __thread struct {
    struct mt_walk_proof proof;
    uint32_t id;
} recent[RECENT] __attribute__((tls_model("initial-exec")));
static __thread unsigned next_slot __attribute__((tls_model("initial-exec")));
static __thread unsigned hit __attribute__((tls_model("initial-exec"))); /* the one found last */
static __thread int trust __attribute__((tls_model("initial-exec")));

int mt_recent_keep(int max, uint32_t id) {
    unsigned i = next_slot % RECENT;
    if (!id || !mt_unwind_prove(&recent[i].proof, max))
        return 0;
    recent[i].id = id;
    next_slot++;
    hit = i; /* the next allocation most likely repeats it */
    return 1;
}

static __attribute__((noinline)) MT_READS_STACK uint32_t scan(const struct mt_walk_start *at,
                                                              int max) {
    for (unsigned i = 0; i < RECENT; i++)
        if (i != hit && mt_unwind_proves(&recent[i].proof, at, max, 0)) {
            hit = i;
            return recent[i].id;
        }
    return 0;
}

MT_READS_STACK uint32_t mt_recent_stack(const struct mt_walk_start *at, int max) {
    if (mt_unwind_proves(&recent[hit].proof, at, max, 1)) /* they come in runs */
        return recent[hit].id;
    /* The others, while that pays: a thread whose stacks vary more than the
     * few kept (a miss costs a few loads each) looks at them once in 32
     * misses, until they answer again. */
    if (trust < 0) {
        trust++;
        return 0;
    }
    uint32_t id = scan(at, max);
    trust = id ? (trust < 29 ? trust + 3 : 32) : trust ? trust - 1 : -32;
    return id;
}
