/*
 * A shard's growth (see table_grow.h): buckets taken 8 at a time, the
 * directory doubled, a full bucket's entries parted by one more hash bit.
 * Growth moves at most 15 entries inside someone's malloc, and memory grows
 * a 2 KiB slab of buckets at a time (and by directory doublings); buckets
 * are freed only by a reset (table.c).
 */
#include "table_grow.h"

#include <string.h>

#include "table_bucket.h"
#include "table_mem.h"
#include "table_slot.h"

#define MAX_DEPTH 18 /* directory bits: its 2 MiB is the largest block table_mem.c gives */
_Static_assert(sizeof(void *) << MAX_DEPTH <= MT_MEM_MAX_BLOCK, "a directory fits a block");

/* A shard's buckets come 8 at a time, in 2 KiB of its own.  Threads
 * allocate in address regions of their own (glibc gives each its arena),
 * and so into shards of their own; with buckets of two threads' shards
 * side by side, though they share no line, the 2-thread churn ran 10%
 * slower than two processes of it (presumably the processors'
 * prefetchers, which fetch beyond the line asked for).  Larger runs cost
 * one thread page reach: 16 made its pairs 2 ns slower.  Under the
 * shard's lock. */
#define SLAB_BUCKETS 8
static struct slab { struct bucket *next, *end; } slabs[MT_SHARDS];

static struct bucket *new_bucket(struct mt_shard *s) {
    struct slab *sl = &slabs[s - mt_shards];
    if (sl->next == sl->end) {
        struct bucket *run = mt_mem_take(sizeof *run * SLAB_BUCKETS);
        if (!run)
            return NULL;
        sl->next = run;
        sl->end = run + SLAB_BUCKETS;
    }
    return sl->next++;
}

/* Doubles the shard's directory; 0 when memory or depth ran out. */
static int double_dir(struct mt_shard *s) {
    uint32_t d = s->depth;
    size_t grown = (size_t)2 << d;
    struct bucket **dir = grown <= MT_SMALL_DIR ? s->small_dir
                          : d < MAX_DEPTH       ? mt_mem_take(sizeof *dir * grown)
                                                : NULL;
    if (!dir)
        return 0;
    for (size_t k = grown / 2; k-- > 0;) /* downwards: the small one grows in place */
        dir[2 * k] = dir[2 * k + 1] = s->dir[k];
    if (s->dir != s->small_dir)
        mt_mem_give(s->dir, sizeof *dir * (grown / 2));
    s->dir = dir;
    s->depth = d + 1;
    return 1;
}

/* Out of line even where LTO could inline it: the insert that calls it
 * keeps its common case short. */
#define RARE __attribute__((noinline, cold))

RARE int mt_shard_split(struct mt_shard *s, uint64_t h) {
    struct bucket *b = s->dir[dir_index(h, s->depth)];
    if (depth_of(b) == s->depth && !double_dir(s)) /* the only bucket for its bits */
        return 0;
    struct bucket *b2 = new_bucket(s);
    if (!b2)
        return 0;
    /* b covers a run of 2^(d - depth) directory entries; b2 takes the upper
     * half of the run, the entries whose next hash bit is 1. */
    uint32_t d = s->depth, depth = depth_of(b) + 1;
    size_t run = run_of(b, d), first = dir_index(h, d) & ~(run - 1);
    for (size_t k = first + run / 2; k < first + run; k++)
        s->dir[k] = b2;
    struct mt_slot old[SLOTS];
    memcpy(old, b->s, sizeof old);
    memset(b->s, 0, sizeof b->s);
    memset(b->tag, 0, sizeof b->tag);
    memset(b2->tag, 0, sizeof b2->tag);
    b->tag[SLOTS] = b2->tag[SLOTS] = (uint8_t)depth;
    for (unsigned i = 0; i < SLOTS; i++) {
        uint64_t he = hash_addr(mt_slot_addr(&old[i]));
        place((he >> (64 - depth)) & 1 ? b2 : b, &old[i], tag_of(he));
    }
    return 1;
}

RARE int mt_shard_start(struct mt_shard *s) {
    struct bucket *b = new_bucket(s);
    if (!b)
        return 0;
    s->small_dir[0] = b;
    s->dir = s->small_dir;
    s->depth = 0;
    return 1;
}

void mt_shard_growth_reset(void) { memset(slabs, 0, sizeof slabs); }
