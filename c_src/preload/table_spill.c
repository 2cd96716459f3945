/*
 * Whole entries the table's slots cannot hold (see table_spill.h): linear
 * probing with backward-shift deletion, doubling at 3/4 full up to
 * MT_MEM_MAX_BLOCK of entries (65,536 slots), which then fill up to 65,535
 * (probing stays bounded: one slot is always empty); beyond that an insert
 * fails and the table counts it as dropped.
 */
#include "table_spill.h"

#include "hash.h"
#include "spinlock.h"
#include "state.h"
#include "table_mem.h"

#define MIN_BITS 4

static _Atomic uint64_t mt_spill_count; /* entries held */

static mt_spinlock lock;
static struct mt_entry *slots; /* addr 0 = empty */
static unsigned cap_bits;

static size_t home(uint64_t addr, unsigned bits) { return (size_t)mt_hash_index(addr, bits); }

static size_t probe(uint64_t addr) {
    size_t mask = ((size_t)1 << cap_bits) - 1, i = home(addr, cap_bits);
    while (slots[i].addr && slots[i].addr != addr)
        i = (i + 1) & mask;
    return i;
}

/* Doubles the array; 0 when there is no memory (or it is at its largest). */
static int grow(void) {
    unsigned bits = cap_bits ? cap_bits + 1 : MIN_BITS;
    struct mt_entry *fresh = mt_mem_take(sizeof(struct mt_entry) << bits);
    if (!fresh)
        return 0;
    size_t mask = ((size_t)1 << bits) - 1, cap = cap_bits ? (size_t)1 << cap_bits : 0;
    for (size_t k = 0; k < cap; k++) {
        if (!slots[k].addr)
            continue;
        size_t i = home(slots[k].addr, bits);
        while (fresh[i].addr)
            i = (i + 1) & mask;
        fresh[i] = slots[k];
    }
    if (slots)
        mt_mem_give(slots, sizeof(struct mt_entry) << cap_bits);
    slots = fresh;
    cap_bits = bits;
    return 1;
}

/* put and take wait as table_mem.c's lock does, and for the same orphaned
 * fork child: giving up, put drops the entry and take finds nothing. */
int mt_spill_put(const struct mt_entry *e, struct mt_entry *old) {
    int r = -1;
    if (!mt_lock_unless(&lock, &mt_state.fork))
        return r;
    uint64_t n = atomic_load_explicit(&mt_spill_count, memory_order_relaxed);
    size_t cap = cap_bits ? (size_t)1 << cap_bits : 0;
    if (4 * (n + 1) > 3 * cap && !grow() && n + 1 >= cap)
        goto out;
    size_t i = probe(e->addr);
    r = slots[i].addr != 0;
    if (r)
        *old = slots[i];
    else
        atomic_store_explicit(&mt_spill_count, n + 1, memory_order_relaxed);
    slots[i] = *e;
out:
    mt_unlock(&lock);
    return r;
}

int mt_spill_take(uint64_t addr, struct mt_entry *old) {
    int found = 0;
    if (!mt_lock_unless(&lock, &mt_state.fork))
        return found;
    if (!slots)
        goto out;
    size_t mask = ((size_t)1 << cap_bits) - 1, i = probe(addr);
    if (!slots[i].addr)
        goto out;
    found = 1;
    if (old)
        *old = slots[i];
    atomic_store_explicit(&mt_spill_count,
                          atomic_load_explicit(&mt_spill_count, memory_order_relaxed) - 1,
                          memory_order_relaxed);
    /* Backward shift: pull later entries of the cluster into the hole when
     * their home slot lies cyclically at or before it. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; slots[j].addr; j = (j + 1) & mask) {
        size_t h = home(slots[j].addr, cap_bits);
        if (((j - h) & mask) >= ((j - hole) & mask)) {
            slots[hole] = slots[j];
            hole = j;
        }
    }
    slots[hole].addr = 0;
out:
    mt_unlock(&lock);
    return found;
}

void mt_spill_scan(mt_entries_fn fn, void *ctx) {
    mt_lock(&lock);
    size_t cap = slots ? (size_t)1 << cap_bits : 0;
    for (size_t i = 0; i < cap; i++)
        if (slots[i].addr)
            fn(ctx, &slots[i], 1);
    mt_unlock(&lock);
}

void mt_spill_reset(void) {
    mt_lock(&lock);
    slots = NULL;
    cap_bits = 0;
    atomic_store_explicit(&mt_spill_count, 0, memory_order_relaxed);
    mt_unlock(&lock);
}
