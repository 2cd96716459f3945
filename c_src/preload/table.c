/*
 * Sharded table of live allocations (see table.h).
 *
 * Each shard is an extendible hash table: a directory of 2^depth bucket
 * pointers indexed by the top bits of the address's hash, and 256-byte
 * buckets of 15 slots.  A bucket carries a tag byte per slot (7 more hash
 * bits, 0 = empty), so a lookup compares all its tags at once and reads
 * the one slot they point to, and a delete clears a tag: no probe
 * sequences, no shifting, no tombstones, and a table that churns for days
 * never degrades.  (Linear probing's loops, of unpredictable length, cost
 * about one branch miss per step: tags halved the table's share of a
 * malloc/free pair.)  A full bucket splits in two by one more hash bit,
 * the directory doubling when the bucket was the only one at its depth
 * (table_grow.c; buckets of 7 grew the directory too fast: 50 bytes an
 * entry at 10M).  Buckets are freed only by reset, which unmaps the table's
 * few chunks (table_mem.c).
 *
 * Slots are 16 bytes (table_slot.h); entries that do not fit go to the
 * spill (table_spill.c).
 */
#include "table.h"

#include <stdatomic.h>
#include <string.h>

#include "estimate.h"
#include "spinlock.h"
#include "state.h"
#include "table_mem.h"
#include "table_bucket.h"
#include "table_grow.h"
#include "table_slot.h"
#include "table_spill.h"

/* The rare steps (an insert that must grow the shard, a first entry's
 * epoch, a block that spills) stay out of line, so that the common insert
 * keeps its values in registers. */
#define RARE static __attribute__((noinline, cold))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

struct mt_shard mt_shards[MT_SHARDS];
_Static_assert(sizeof(struct mt_shard) == 128, "a shard is a 128-byte aligned pair of lines");
_Static_assert(sizeof(struct bucket) == 256, "a bucket is 4 lines");
/* Sampling estimates per shard (sum of weights, fixed point, and of
 * weighted bytes), apart: lossless mode never touches them. */
static struct { _Atomic uint64_t count, bytes; } estimates[MT_SHARDS];
/* Times are kept from an hour before the first entry (so that a thread that
 * read the clock just before another's first insert still fits); stored
 * plus one, 0 until then. */
#define EPOCH_MARGIN_MS 3600000
static _Atomic uint64_t epoch_plus1;

/* A filter counter moves under the lock of the shard its addresses go to:
 * plain load and store (when the filter is kept: see table.h). */
ALWAYS_INLINE void filter_add(struct mt_shard *s, uint64_t addr, int d) {
    /* Acquire: a block left out of the filter is not yet freed by a thread
     * that still reads it as exact (table_filter.c stores exact first). */
    if (!atomic_load_explicit(&mt_filter_kept, memory_order_acquire))
        return;
    _Atomic uint8_t *c = &mt_filter[mt_filter_index(addr)];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    if (v != 255) /* saturated counts stay: "maybe here" is always safe */
        atomic_store_explicit(c, (uint8_t)(v + d), memory_order_relaxed);
    s->filter_set = 1;
}

static void relaxed_add(_Atomic uint64_t *c, int64_t d) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d,
                          memory_order_relaxed);
}

/* ---- times, from the table's epoch ---------------------------------------- */

static uint64_t epoch(void) { return atomic_load_explicit(&epoch_plus1, memory_order_relaxed) - 1; }
uint64_t mt_table_epoch(void) { return epoch(); }

/* The first entry sets the epoch; of two at once, the first store wins.
 * Returns the epoch. */
RARE uint64_t set_epoch(uint64_t t_ms) {
    uint64_t none = 0;
    atomic_compare_exchange_strong(&epoch_plus1, &none,
                                   (t_ms > EPOCH_MARGIN_MS ? t_ms - EPOCH_MARGIN_MS : 0) + 1);
    return epoch();
}

/* ---- the shards ----------------------------------------------------------- */

static inline struct mt_shard *shard_of(uint64_t addr) { return &mt_shards[mt_shard_index(addr)]; }

/* Counters and estimates follow each entry in (sign 1) and out (-1). */
ALWAYS_INLINE void account(struct mt_shard *s, uint64_t size, int sign) {
    relaxed_add(&s->bytes, sign * (int64_t)size);
    if (!mt_state.sample_mean)
        return;
    struct mt_estimate e = mt_estimate_of(size);
    relaxed_add(&estimates[s - mt_shards].count, sign * (int64_t)e.weight);
    relaxed_add(&estimates[s - mt_shards].bytes, sign * (int64_t)e.bytes);
}

ALWAYS_INLINE void counted_in(struct mt_shard *s, uint64_t addr) {
    filter_add(s, addr, 1);
    relaxed_add(&s->count, 1);
}

ALWAYS_INLINE void counted_out(struct mt_shard *s, uint64_t addr, uint64_t size) {
    filter_add(s, addr, -1);
    relaxed_add(&s->count, -1);
    account(s, size, -1);
}

/* Where addr sits in the shard's slots (i == SLOTS: not there); under its lock. */
struct spot {
    struct bucket *b;
    unsigned i;
};
ALWAYS_INLINE struct spot slot_of(const struct mt_shard *s, uint64_t addr) {
    if (!atomic_load_explicit(&s->count, memory_order_relaxed) || !s->dir || !mt_slot_fits(addr, 0))
        return (struct spot){NULL, SLOTS};
    uint64_t h = hash_addr(addr);
    struct bucket *b = s->dir[dir_index(h, s->depth)];
    return (struct spot){b, find(b, addr >> MT_SLOT_ADDR_SHIFT, tag_of(h))};
}

/* Forgets addr wherever the shard keeps it; under its lock. */
ALWAYS_INLINE int remove_locked(struct mt_shard *s, uint64_t addr, struct mt_entry *old) {
    struct mt_entry e;
    int found = 0;
    struct spot at = slot_of(s, addr);
    if (at.i < SLOTS) {
        if (old) /* a free needs only the size */
            e = mt_slot_unpack(&at.b->s[at.i], epoch());
        else
            e.size = mt_slot_size(&at.b->s[at.i]);
        delete_at(at.b, at.i);
        found = 1;
    }
    /* (A shard that counts no entry has none in the spill either.) */
    if (!found && s->spilled && (found = mt_spill_take(addr, &e)))
        s->spilled--;
    if (!found)
        return 0;
    counted_out(s, addr, e.size);
    if (old)
        *old = e;
    return 1;
}

/* Records e in the spill; under the shard's lock, e's address not in the slots. */
RARE enum mt_insert_result spill_locked(struct mt_shard *s, const struct mt_entry *e) {
    struct mt_entry old;
    int r = mt_spill_put(e, &old);
    if (r < 0) {
        relaxed_add(&s->dropped, 1);
        return MT_DROPPED;
    }
    if (r) {
        account(s, old.size, -1);
        relaxed_add(&s->replaced, 1);
    } else {
        counted_in(s, e->addr);
        s->spilled++;
    }
    account(s, e->size, 1);
    return r ? MT_REPLACED : MT_INSERTED;
}

/* Inserts that gave up waiting for a lock a fork held (spinlock.h), counted
 * apart: without the lock, a shard's own counters may not be written. */
static _Atomic uint64_t fork_drops;

RARE enum mt_insert_result fork_held(void) {
    atomic_fetch_add_explicit(&fork_drops, 1, memory_order_relaxed);
    return MT_DROPPED;
}

/* The inserts the slots cannot take: no address, or a block the slot's
 * packing cannot hold (it goes to the spill, and may replace a slot). */
RARE enum mt_insert_result insert_odd(struct mt_shard *s, uint64_t addr, uint64_t size,
                                      uint64_t t_ms, uint32_t stack_id) {
    struct mt_entry e = {addr, size, t_ms, stack_id};
    if (!mt_lock_unless(&s->lock, &mt_state.fork))
        return fork_held();
    enum mt_insert_result r;
    if (!addr) { /* not a block: never recorded, counted so that it shows */
        relaxed_add(&s->dropped, 1);
        r = MT_DROPPED;
    } else {
        int had = remove_locked(s, addr, NULL); /* it may sit in a slot */
        r = spill_locked(s, &e);
        if (had && r != MT_DROPPED) {
            relaxed_add(&s->replaced, 1);
            r = MT_REPLACED;
        }
    }
    mt_unlock(&s->lock);
    return r;
}

/* The rest of an insert whose bucket is full, or whose address the spill
 * may hold; under the lock, which it releases. */
RARE enum mt_insert_result insert_slow(struct mt_shard *s, uint64_t addr, uint64_t size,
                                       struct mt_slot packed) {
    uint64_t h = hash_addr(addr), key = addr >> MT_SLOT_ADDR_SHIFT, tag = tag_of(h);
    enum mt_insert_result r = MT_INSERTED;
    if (!s->dir && !mt_shard_start(s)) {
        relaxed_add(&s->dropped, 1);
        r = MT_DROPPED;
        goto out;
    }
    for (;;) {
        struct bucket *b = s->dir[dir_index(h, s->depth)];
        unsigned i = find(b, key, tag);
        if (i < SLOTS) { /* its free was missed: overwrite */
            account(s, mt_slot_size(&b->s[i]), -1);
            relaxed_add(&s->replaced, 1);
            b->s[i] = packed;
            r = MT_REPLACED;
            break;
        }
        if (full(b)) {
            if (mt_shard_split(s, h))
                continue;
            relaxed_add(&s->dropped, 1); /* no memory to split it */
            r = MT_DROPPED;
            goto out;
        }
        struct mt_entry old; /* a former entry of 128 MiB or more */
        if (s->spilled && mt_spill_take(addr, &old)) {
            s->spilled--;
            account(s, old.size, -1);
            relaxed_add(&s->replaced, 1);
            r = MT_REPLACED;
        } else {
            counted_in(s, addr);
        }
        place(b, &packed, tag);
        break;
    }
    account(s, size, 1);
out:
    mt_unlock(&s->lock);
    return r;
}

/* An insert that found the lock taken, or is the first (no epoch yet). */
RARE enum mt_insert_result insert_waiting(struct mt_shard *s, uint64_t addr, uint64_t size,
                                          uint64_t t_ms, uint32_t stack_id) {
    uint64_t e =
        atomic_load_explicit(&epoch_plus1, memory_order_relaxed) ? epoch() : set_epoch(t_ms);
    struct mt_slot packed = mt_slot_pack(&(struct mt_entry){addr, size, t_ms, stack_id}, e);
    if (!mt_lock_unless(&s->lock, &mt_state.fork))
        return fork_held();
    return insert_slow(s, addr, size, packed);
}

/* The common case has no call but tail calls (GCC still saves registers
 * for it, but fewer values live across its steps: 5 instructions a pair
 * fewer with the forget below). */
enum mt_insert_result mt_table_insert(uint64_t addr, uint64_t size, uint64_t t_ms,
                                      uint32_t stack_id) {
#ifdef MT_LEAVE_OUT_TABLE /* a benchmark's build only: what the table costs (bench/churn.sh) */
    (void)size, (void)t_ms, (void)stack_id;
    return addr ? MT_INSERTED : MT_DROPPED;
#endif
    struct mt_shard *s = shard_of(addr);
    if (UNLIKELY(!mt_slot_fits(addr, size)))
        return insert_odd(s, addr, size, t_ms, stack_id);
    /* What needs no lock is done before it is taken. */
    uint64_t epoch_1 = atomic_load_explicit(&epoch_plus1, memory_order_relaxed);
    if (UNLIKELY(!epoch_1 || !mt_try_lock(&s->lock)))
        return insert_waiting(s, addr, size, t_ms, stack_id);
    uint64_t h = hash_addr(addr), key = addr >> MT_SLOT_ADDR_SHIFT, tag = tag_of(h);
    struct mt_slot packed =
        mt_slot_pack(&(struct mt_entry){addr, size, t_ms, stack_id}, epoch_1 - 1);
    /* The common case: a bucket with room, an address not there yet, and
     * nothing of this shard in the spill. */
    if (UNLIKELY(!s->dir || s->spilled))
        return insert_slow(s, addr, size, packed);
    struct bucket *b = s->dir[dir_index(h, s->depth)];
    unsigned same_tag = matching(b, tag), empty = ~taken(b) & SLOT_MASK;
    if (UNLIKELY((same_tag && find_in(b, same_tag, key) < SLOTS) || !empty))
        return insert_slow(s, addr, size, packed);
    counted_in(s, addr);
    place_in(b, empty, &packed, tag);
    account(s, size, 1);
    mt_unlock(&s->lock);
    return MT_INSERTED;
}

/* A removal that gave up (spinlock.h) leaves its entry, counted as
 * replaced when the address comes back. */
int mt_table_remove(uint64_t addr, struct mt_entry *old) {
    struct mt_shard *s = shard_of(addr);
    if (!mt_lock_unless(&s->lock, &mt_state.fork))
        return 0;
    int found = remove_locked(s, addr, old);
    mt_unlock(&s->lock);
    return found;
}

/* A removal that found the lock taken. */
RARE int forget_waiting(struct mt_shard *s, uint64_t addr) {
    if (!mt_lock_wait_unless(&s->lock, &mt_state.fork))
        return 0;
    int found = remove_locked(s, addr, NULL);
    mt_unlock(&s->lock);
    return found;
}

/* A removal the slots did not answer: the spill may; under the lock,
 * which it releases. */
RARE int forget_rest(struct mt_shard *s, uint64_t addr) {
    struct mt_entry e;
    int found = s->spilled && mt_spill_take(addr, &e);
    if (found) {
        s->spilled--;
        counted_out(s, addr, e.size);
    }
    mt_unlock(&s->lock);
    return found;
}

/* remove_locked for old == NULL, apart so that its common case has no
 * call but tail calls. */
int mt_table_forget(uint64_t addr) {
    struct mt_shard *s = shard_of(addr);
    if (UNLIKELY(!mt_try_lock(&s->lock)))
        return forget_waiting(s, addr);
    struct spot at = slot_of(s, addr);
    if (at.i == SLOTS)
        return forget_rest(s, addr);
    uint64_t size = mt_slot_size(&at.b->s[at.i]);
    delete_at(at.b, at.i);
    counted_out(s, addr, size);
    mt_unlock(&s->lock);
    return 1;
}

uint64_t mt_table_reset(void) {
    uint64_t forgotten = 0;
    mt_table_lock_all(); /* the chunks go at once: no shard may be using them */
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &mt_shards[k];
        forgotten += atomic_load_explicit(&s->count, memory_order_relaxed);
        s->dir = NULL;
        s->depth = 0;
        s->spilled = 0;
        atomic_store_explicit(&s->count, 0, memory_order_relaxed);
        atomic_store_explicit(&s->bytes, 0, memory_order_relaxed);
        atomic_store_explicit(&estimates[k].count, 0, memory_order_relaxed);
        atomic_store_explicit(&estimates[k].bytes, 0, memory_order_relaxed);
    }
    mt_shard_growth_reset();
    mt_table_filter_clear();
    mt_spill_reset();
    mt_mem_release_all();
    mt_table_unlock_all();
    return forgotten;
}

void mt_table_figures(struct mt_table_figures *out) {
    memset(out, 0, sizeof *out);
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &mt_shards[k];
        out->live_count += atomic_load_explicit(&s->count, memory_order_relaxed);
        out->live_bytes += atomic_load_explicit(&s->bytes, memory_order_relaxed);
        out->dropped += atomic_load_explicit(&s->dropped, memory_order_relaxed);
        out->replaced += atomic_load_explicit(&s->replaced, memory_order_relaxed);
        out->est_count += atomic_load_explicit(&estimates[k].count, memory_order_relaxed);
        out->est_bytes += atomic_load_explicit(&estimates[k].bytes, memory_order_relaxed);
    }
    out->dropped += atomic_load_explicit(&fork_drops, memory_order_relaxed);
    out->table_bytes = mt_table_mapped();
}

uint64_t mt_table_mapped(void) { return mt_mem_mapped(); }

void mt_table_fork_prepare(void) {
    mt_table_lock_all();
    mt_mem_fork_prepare();
}

void mt_table_fork_parent(void) {
    mt_mem_fork_parent();
    mt_table_unlock_all();
}

void mt_table_fork_child(void) {
    mt_mem_fork_child();
    mt_table_unlock_all();
}

void mt_table_lock_all(void) {
    for (unsigned k = 0; k < MT_SHARDS; k++)
        mt_lock(&mt_shards[k].lock);
}

void mt_table_unlock_all(void) {
    for (unsigned k = 0; k < MT_SHARDS; k++)
        mt_unlock(&mt_shards[k].lock);
}
