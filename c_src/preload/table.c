/*
 * Sharded open-addressing hash table of live allocations (see table.h).
 *
 * Linear probing with backward-shift deletion: no tombstones, so a table
 * that churns for days never degrades.  A shard doubles when it is 3/4 full;
 * if mmap fails it keeps filling up to its last free slot and only then
 * drops, counting each drop.
 */
#include "table.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "estimate.h"
#include "spinlock.h"
#include "state.h"

/* 16 slots (384 bytes): 512 sparse shards stay within a few cache-friendly
 * pages in a small process; a shard doubles as soon as it needs to. */
#define MT_MIN_CAP_BITS 4

struct mt_shard {
    mt_spinlock lock;
    uint32_t cap_bits; /* 0 while no slots are mapped */
    struct mt_slot *slots;
    /* Written under the lock, read without it by stats: atomics keep
     * those reads well-defined; relaxed stores cost a plain mov. */
    _Atomic uint64_t count, bytes, dropped, replaced;
    /* Sampling estimates: sum of weights (fixed point) and of weighted bytes. */
    _Atomic uint64_t est_count, est_bytes;
} __attribute__((aligned(64)));

static struct mt_shard shards[MT_SHARDS];
_Atomic uint8_t mt_filters[MT_SHARDS][MT_FILTER_SLOTS] __attribute__((aligned(64)));

/* Filter counters move under the shard lock: plain load and store. */
static void filter_add(uint64_t addr, unsigned k, int d) {
    _Atomic uint8_t *c = &mt_filters[k][mt_filter_slot(addr)];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    if (v != 255) /* saturated counts stay: "maybe here" is always safe */
        atomic_store_explicit(c, (uint8_t)(v + d), memory_order_relaxed);
}

void *(*mt_table_map_hook)(size_t bytes);

/* Slot arrays.  Small ones are carved from shared 1 MiB chunks, so that
 * 512 sparse shards sit on a few dozen pages instead of one page each (TLB
 * and cache misses dominated frees); an outgrown small array goes on a free
 * list for the next shard of its size.  Large ones get their own mapping. */
#define SLAB_MAX_BITS 7 /* 128 slots, 3 KiB: outgrown arrays waste at most 3 MiB */
#define SLAB_CHUNK (1u << 20)

static mt_spinlock slab_lock;
static char *slab_next, *slab_end;
static struct mt_slot *slab_free[SLAB_MAX_BITS + 1]; /* a free array's first word links */
static _Atomic uint64_t mapped_bytes;

static void *map_bytes(size_t bytes) {
    void *p = mt_table_map_hook
                  ? mt_table_map_hook(bytes)
                  : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || !p)
        return NULL;
    atomic_fetch_add_explicit(&mapped_bytes, bytes, memory_order_relaxed);
    return p;
}

static struct mt_slot *slab_take(uint32_t cap_bits) {
    size_t bytes = sizeof(struct mt_slot) << cap_bits;
    struct mt_slot *p = slab_free[cap_bits];
    if (p) {
        memcpy(&slab_free[cap_bits], p, sizeof p);
        memset(p, 0, bytes);
        return p;
    }
    if ((size_t)(slab_end - slab_next) < bytes) {
        char *chunk = map_bytes(SLAB_CHUNK);
        if (!chunk)
            return NULL; /* the rest of the old chunk is too small: left unused */
        slab_next = chunk;
        slab_end = chunk + SLAB_CHUNK;
    }
    p = (struct mt_slot *)slab_next;
    slab_next += bytes;
    return p; /* fresh mmap memory is zero */
}

static struct mt_slot *map_slots(uint32_t cap_bits) {
    if (cap_bits > SLAB_MAX_BITS)
        return map_bytes(sizeof(struct mt_slot) << cap_bits);
    mt_lock(&slab_lock);
    struct mt_slot *p = slab_take(cap_bits);
    mt_unlock(&slab_lock);
    return p;
}

static void unmap_slots(struct mt_slot *slots, uint32_t cap_bits) {
    if (!slots)
        return;
    if (cap_bits > SLAB_MAX_BITS) {
        munmap(slots, sizeof(struct mt_slot) << cap_bits);
        atomic_fetch_sub_explicit(&mapped_bytes, sizeof(struct mt_slot) << cap_bits,
                                  memory_order_relaxed);
        return;
    }
    mt_lock(&slab_lock);
    memcpy(slots, &slab_free[cap_bits], sizeof slots);
    slab_free[cap_bits] = slots;
    mt_unlock(&slab_lock);
}

static void relaxed_add(_Atomic uint64_t *c, int64_t d) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d,
                          memory_order_relaxed);
}

/* Fibonacci hashing of the whole address picks the slot in a shard. */
static inline uint64_t hash_addr(uint64_t addr) { return addr * MT_HASH_GOLDEN; }

static inline size_t home_slot(uint64_t h, uint32_t cap_bits) {
    return (size_t)(h >> (64 - cap_bits));
}

static inline struct mt_shard *shard_of(uint64_t addr) { return &shards[mt_shard_index(addr)]; }

/* Sampling estimates move with each entry (no-ops in lossless mode). */
static void account(struct mt_shard *s, uint64_t size, int sign) {
    if (!mt_state.sample_mean)
        return;
    int64_t w = (int64_t)mt_estimate_weight(size), b = (int64_t)mt_estimate_bytes(size);
    relaxed_add(&s->est_count, sign * w);
    relaxed_add(&s->est_bytes, sign * b);
}

/* Places an entry known to be absent; the shard has a free slot. */
static void place(struct mt_slot *slots, uint32_t cap_bits, const struct mt_slot *e) {
    size_t mask = ((size_t)1 << cap_bits) - 1;
    size_t i = home_slot(hash_addr(e->addr), cap_bits);
    while (slots[i].addr)
        i = (i + 1) & mask;
    slots[i] = *e;
}

/* Doubles the shard; returns 0 when no memory could be had. */
static int grow(struct mt_shard *s) {
    uint32_t bits = s->cap_bits ? s->cap_bits + 1 : MT_MIN_CAP_BITS;
    struct mt_slot *fresh = map_slots(bits);
    if (!fresh)
        return 0;
    if (s->slots) {
        size_t cap = (size_t)1 << s->cap_bits;
        for (size_t i = 0; i < cap; i++)
            if (s->slots[i].addr)
                place(fresh, bits, &s->slots[i]);
        unmap_slots(s->slots, s->cap_bits);
    }
    s->slots = fresh;
    s->cap_bits = bits;
    return 1;
}

/* Index of addr in the shard, or of the empty slot where it would go. */
static size_t probe(const struct mt_shard *s, uint64_t addr, uint64_t h) {
    size_t mask = ((size_t)1 << s->cap_bits) - 1;
    size_t i = home_slot(h, s->cap_bits);
    while (s->slots[i].addr && s->slots[i].addr != addr)
        i = (i + 1) & mask;
    return i;
}

enum mt_insert_result mt_table_insert(uint64_t addr, uint64_t size, uint64_t t_ms,
                                      uint32_t stack_id) {
    uint64_t h = hash_addr(addr);
    struct mt_shard *s = shard_of(addr);
    enum mt_insert_result r = MT_INSERTED;
    mt_lock(&s->lock);
    uint64_t count = atomic_load_explicit(&s->count, memory_order_relaxed);
    size_t cap = s->cap_bits ? (size_t)1 << s->cap_bits : 0;
    if (4 * (count + 1) > 3 * cap && !grow(s) && count + 1 >= cap) {
        relaxed_add(&s->dropped, 1);
        mt_unlock(&s->lock);
        return MT_DROPPED;
    }
    size_t i = probe(s, addr, h);
    struct mt_slot *slot = &s->slots[i];
    if (slot->addr) {
        relaxed_add(&s->bytes, -(int64_t)slot->size);
        relaxed_add(&s->replaced, 1);
        account(s, slot->size, -1);
        r = MT_REPLACED;
    } else {
        filter_add(addr, (unsigned)(s - shards), 1);
        relaxed_add(&s->count, 1);
    }
    account(s, size, 1);
    slot->addr = addr;
    slot->size = size;
    slot->meta = t_ms << MT_STACK_BITS | (stack_id & MTRACE_MAX_STACK_ID);
    relaxed_add(&s->bytes, (int64_t)size);
    mt_unlock(&s->lock);
    return r;
}

int mt_table_remove(uint64_t addr, struct mt_slot *old) {
    uint64_t h = hash_addr(addr);
    struct mt_shard *s = shard_of(addr);
    mt_lock(&s->lock);
    if (!atomic_load_explicit(&s->count, memory_order_relaxed)) {
        mt_unlock(&s->lock);
        return 0;
    }
    size_t mask = ((size_t)1 << s->cap_bits) - 1;
    size_t i = probe(s, addr, h);
    if (!s->slots[i].addr) {
        mt_unlock(&s->lock);
        return 0;
    }
    if (old)
        *old = s->slots[i];
    relaxed_add(&s->count, -1);
    filter_add(addr, (unsigned)(s - shards), -1);
    relaxed_add(&s->bytes, -(int64_t)s->slots[i].size);
    account(s, s->slots[i].size, -1);
    /* Backward shift: pull later entries of the cluster into the hole when
     * their home slot lies cyclically at or before it. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; s->slots[j].addr; j = (j + 1) & mask) {
        size_t home = home_slot(hash_addr(s->slots[j].addr), s->cap_bits);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            s->slots[hole] = s->slots[j];
            hole = j;
        }
    }
    s->slots[hole].addr = 0;
    mt_unlock(&s->lock);
    return 1;
}

uint64_t mt_table_reset(void) {
    uint64_t forgotten = 0;
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &shards[k];
        mt_lock(&s->lock);
        forgotten += atomic_load_explicit(&s->count, memory_order_relaxed);
        unmap_slots(s->slots, s->cap_bits);
        s->slots = NULL;
        s->cap_bits = 0;
        atomic_store_explicit(&s->count, 0, memory_order_relaxed);
        atomic_store_explicit(&s->bytes, 0, memory_order_relaxed);
        atomic_store_explicit(&s->est_count, 0, memory_order_relaxed);
        atomic_store_explicit(&s->est_bytes, 0, memory_order_relaxed);
        for (unsigned f = 0; f < MT_FILTER_SLOTS; f++)
            atomic_store_explicit(&mt_filters[k][f], 0, memory_order_relaxed);
        mt_unlock(&s->lock);
    }
    return forgotten;
}

void mt_table_scan(mt_shard_fn fn, void *ctx) {
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &shards[k];
        mt_lock(&s->lock);
        if (s->slots)
            fn(ctx, s->slots, (size_t)1 << s->cap_bits);
        mt_unlock(&s->lock);
    }
}

void mt_table_figures(struct mt_table_figures *out) {
    memset(out, 0, sizeof *out);
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &shards[k];
        out->live_count += atomic_load_explicit(&s->count, memory_order_relaxed);
        out->live_bytes += atomic_load_explicit(&s->bytes, memory_order_relaxed);
        out->dropped += atomic_load_explicit(&s->dropped, memory_order_relaxed);
        out->replaced += atomic_load_explicit(&s->replaced, memory_order_relaxed);
        out->est_count += atomic_load_explicit(&s->est_count, memory_order_relaxed);
        out->est_bytes += atomic_load_explicit(&s->est_bytes, memory_order_relaxed);
    }
    out->table_bytes = atomic_load_explicit(&mapped_bytes, memory_order_relaxed);
}

void mt_table_lock_all(void) {
    for (unsigned k = 0; k < MT_SHARDS; k++)
        mt_lock(&shards[k].lock);
}

void mt_table_unlock_all(void) {
    for (unsigned k = 0; k < MT_SHARDS; k++)
        mt_unlock(&shards[k].lock);
}
