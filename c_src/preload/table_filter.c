/*
 * The filters' upkeep (see table.h): whether inserts and removals keep
 * them, and their rebuild from a shard's entries when they are to be kept
 * again.
 */
#include <stdatomic.h>
#include <string.h>

#include "spinlock.h"
#include "table.h"
#include "table_bucket.h"

_Atomic int mt_filters_kept = 1;
static _Atomic int exact = 1; /* kept, and rebuilt since they were not */

int mt_table_filters_exact(void) { return atomic_load_explicit(&exact, memory_order_acquire); }

/* A shard's filter anew from its entries; under its lock. */
static void rebuild(struct mt_shard *s) {
    uint8_t counts[MT_FILTER_SLOTS];
    /* The spill holds the entries of every shard: rather than look for
     * this one's there, saturated counts say "maybe" for all of them. */
    memset(counts, s->spilled ? 255 : 0, sizeof counts);
    size_t dir_len = s->dir && !s->spilled ? (size_t)1 << s->depth : 0;
    for (size_t d = 0; d < dir_len; d += run_of(s->dir[d], s->depth)) {
        const struct bucket *b = s->dir[d];
        for (unsigned i = 0; i < SLOTS; i++) {
            unsigned k = mt_filter_slot(mt_slot_addr(&b->s[i]));
            if (occupied(b, i) && counts[k] != 255)
                counts[k]++;
        }
    }
    for (unsigned k = 0; k < MT_FILTER_SLOTS; k++)
        atomic_store_explicit(&s->filter[k], counts[k], memory_order_relaxed);
}

void mt_table_filters_keep(int on) {
    if (!on) {
        atomic_store(&exact, 0);
        atomic_store(&mt_filters_kept, 0);
        return;
    }
    if (atomic_load(&exact))
        return;
    /* Kept from here on: a shard's insert or removal either happens before
     * its rebuild, under the same lock, and is counted by it, or after, and
     * finds the filters kept. */
    atomic_store(&mt_filters_kept, 1);
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        mt_lock(&mt_shards[k].lock);
        rebuild(&mt_shards[k]);
        mt_unlock(&mt_shards[k].lock);
    }
    atomic_store(&exact, 1);
}
