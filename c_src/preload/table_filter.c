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
 * it, listed once (under the rebuild's turn: table.h). */
#define GRAINS (1u << (MT_REGION_BITS - MT_FILTER_GRAIN_BITS))
#define KEYS (1u << MT_REGION_KEY_BITS)
#define KEYS_MAX 33 /* of one shard: the hash gives each 31 to 33 */
static struct {
    uint16_t of[MT_SHARDS][KEYS_MAX];
    uint8_t n[MT_SHARDS];
    uint8_t nth[KEYS];  /* a key's place among its shard's */
    _Atomic int listed; /* all of them: a fork child may inherit half a list */
} keys;

static void list_keys(void) {
    if (atomic_load_explicit(&keys.listed, memory_order_acquire))
        return;
    memset(keys.n, 0, sizeof keys.n);
    for (unsigned k = 0; k < KEYS; k++) {
        unsigned s = (unsigned)mt_hash_index(k, MT_SHARD_BITS);
        keys.nth[k] = keys.n[s];
        keys.of[s][keys.n[s]++] = (uint16_t)k;
    }
    atomic_store_explicit(&keys.listed, 1, memory_order_release);
}

/* Stores n counters, but leaves a run that is and stays all zero alone:
 * its page may never have been touched. */
static void store(_Atomic uint8_t *to, const uint8_t *from, size_t n) {
    uint8_t any = 0;
    for (size_t i = 0; i < n; i++)
        any |= from[i] | atomic_load_explicit(&to[i], memory_order_relaxed);
    for (size_t i = 0; any && i < n; i++)
        atomic_store_explicit(&to[i], from[i], memory_order_relaxed);
}

/* A shard's counters anew from its entries; under its lock. */
static void rebuild(unsigned shard) {
    const struct mt_shard *s = &mt_shards[shard];
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
    for (unsigned k = 0; k < keys.n[shard]; k++)
        store(&mt_filter[(size_t)keys.of[shard][k] * GRAINS], counts[k], GRAINS);
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
    list_keys();
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        mt_lock(&mt_shards[k].lock);
        rebuild(k);
        mt_unlock(&mt_shards[k].lock);
    }
    atomic_store(&exact, 1);
}

void mt_table_filter_clear(void) {
    static const uint8_t zeros[GRAINS];
    for (size_t i = 0; i < sizeof mt_filter; i += GRAINS)
        store(&mt_filter[i], zeros, GRAINS);
}
