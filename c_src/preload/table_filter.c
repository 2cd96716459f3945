/*
 * The filter's upkeep (see table.h): whether inserts and removals keep it,
 * its rebuild from a shard's entries when it is to be kept again, and its
 * clearing.
 */
#include <stdatomic.h>
#include <string.h>

#include "spinlock.h"
#include "table.h"
#include "table_bucket.h"

_Atomic uint8_t mt_filter[1u << MT_FILTER_BITS] __attribute__((aligned(4096)));
_Atomic int mt_filter_kept = 1;
static _Atomic int exact = 1; /* kept, and rebuilt since it was not */

int mt_table_filter_exact(void) { return atomic_load_explicit(&exact, memory_order_acquire); }

/* A shard's counters: a run of GRAINS for each region key that hashes to
 * it, listed once, under shard 0's lock (which a reset and a fork hold
 * too). */
#define GRAINS (1u << (MT_REGION_BITS - MT_FILTER_GRAIN_BITS))
#define KEYS (1u << MT_REGION_KEY_BITS)
#define KEYS_MAX 33 /* of one shard: the hash gives each 31 to 33 */
static struct {
    uint16_t of[MT_SHARDS][KEYS_MAX];
    uint8_t n[MT_SHARDS];
    uint8_t nth[KEYS]; /* a key's place among its shard's */
    int listed;
} keys;

static void list_keys(void) {
    if (keys.listed)
        return;
    for (unsigned k = 0; k < KEYS; k++) {
        unsigned s = (unsigned)mt_hash_index(k, MT_SHARD_BITS);
        keys.nth[k] = keys.n[s];
        keys.of[s][keys.n[s]++] = (uint16_t)k;
    }
    keys.listed = 1;
}

static _Atomic uint8_t *counters(unsigned shard, unsigned k) {
    return &mt_filter[(size_t)keys.of[shard][k] * GRAINS];
}

/* Writes a run of GRAINS counters; returns whether any is non-zero.  A
 * run that is and stays all 0 is not written: its page may never have
 * been touched. */
static uint8_t put_run(_Atomic uint8_t *to, const uint8_t *from) {
    uint8_t run = 0, any = 0;
    for (unsigned g = 0; g < GRAINS; g++)
        run |= from[g] | atomic_load_explicit(&to[g], memory_order_relaxed);
    for (unsigned g = 0; run && g < GRAINS; g++) {
        atomic_store_explicit(&to[g], from[g], memory_order_relaxed);
        any |= from[g];
    }
    return any;
}

/* A shard's counters anew from its entries; under its lock.  A shard whose
 * counters are all 0 and that holds nothing is left alone, so that
 * switching off a small table does not read the whole filter. */
static void rebuild(unsigned shard) {
    struct mt_shard *s = &mt_shards[shard];
    if (!s->filter_set && !atomic_load_explicit(&s->count, memory_order_relaxed))
        return;
    uint8_t counts[KEYS_MAX][GRAINS];
    /* The spill holds the entries of every shard: rather than look for
     * this one's there, saturated counts say "maybe" for all of them. */
    memset(counts, s->spilled ? 255 : 0, sizeof counts);
    size_t dir_len = s->dir && !s->spilled ? (size_t)1 << s->depth : 0;
    for (size_t d = 0; d < dir_len; d += run_of(s->dir[d], s->depth)) {
        const struct bucket *b = s->dir[d];
        for (unsigned i = 0; i < SLOTS; i++) {
            uint64_t addr = mt_slot_addr(&b->s[i]);
            uint8_t *c = &counts[keys.nth[mt_region_key(addr)]][mt_filter_index(addr) % GRAINS];
            if (occupied(b, i) && *c != 255)
                ++*c;
        }
    }
    uint8_t any = 0;
    for (unsigned k = 0; k < keys.n[shard]; k++)
        any |= put_run(counters(shard, k), counts[k]);
    s->filter_set = any != 0;
}

void mt_table_filter_keep(int on) {
    if (!on) {
        atomic_store(&exact, 0);
        atomic_store(&mt_filter_kept, 0);
        return;
    }
    if (atomic_load(&exact))
        return;
    /* Kept from here on: a shard's insert or removal either happens before
     * its rebuild, under the same lock, and is counted by it, or after, and
     * finds the filter kept. */
    atomic_store(&mt_filter_kept, 1);
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        mt_lock(&mt_shards[k].lock);
        if (k == 0)
            list_keys();
        rebuild(k);
        mt_unlock(&mt_shards[k].lock);
    }
    atomic_store(&exact, 1);
}

void mt_table_filter_clear(void) {
    static const uint8_t zeros[GRAINS];
    list_keys();
    for (unsigned shard = 0; shard < MT_SHARDS; shard++) {
        if (!mt_shards[shard].filter_set)
            continue;
        for (unsigned k = 0; k < keys.n[shard]; k++)
            put_run(counters(shard, k), zeros);
        mt_shards[shard].filter_set = 0;
    }
}
