/*
 * Sharded table of live allocations (see table.h).
 *
 * Each shard is an extendible hash table: a directory of 2^depth bucket
 * pointers indexed by the top bits of the address's hash, and 1 KiB buckets
 * of 63 slots.  A bucket 3/4 full splits in two by one more hash bit,
 * moving half of its few dozen entries (the directory doubles when the
 * bucket was the only one at its depth).  So growth never rehashes a shard
 * inside someone's malloc, memory grows in 1 KiB steps, and buckets are
 * freed only by reset, which unmaps the table's few chunks (table_mem.c).
 * In a bucket: linear probing with backward-shift deletion, no tombstones,
 * so a table that churns for days never degrades.
 *
 * A slot is 16 bytes, where a plain entry would take 32:
 *   lo: addr >> 4 (44 bits) | size bits 0-19 << 44
 *   hi: stack id (24 bits) | size bits 20-27 << 24 | time << 32
 * Time is in milliseconds since an hour before the table's first entry,
 * exact for 2^31 ms (24.8 days) and in 1.024-second steps after that (for
 * 70 years), never later than the true time.
 * Entries that do not fit (256 MiB and more, odd addresses) go to the spill
 * (table_spill.c).
 */
#include "table.h"

#include <stdatomic.h>
#include <string.h>

#include "estimate.h"
#include "spinlock.h"
#include "state.h"
#include "table_mem.h"
#include "table_spill.h"

struct mt_slot {
    uint64_t lo, hi; /* lo 0 = empty */
};

#define KEY_BITS 44
#define KEY_MASK ((1ull << KEY_BITS) - 1)
#define SIZE_LO_BITS 20
#define SIZE_BITS 28
#define TIME_EXACT (1ull << 31)
#define TIME_STEP_SHIFT 10

#define SLOTS 63     /* per bucket, after its header */
#define SPLIT_AT 48  /* 3/4 of SLOTS, rounded up */
#define MAX_DEPTH 16 /* directory bits: 65,536 buckets, 4M entries a shard */
#define HOME_SHIFT                                                                                 \
    16 /* a bucket's slot comes from hash bits 16-47, its                                          \
        * directory index from the top MAX_DEPTH bits */

struct bucket {
    uint32_t count, depth; /* depth: the hash bits its entries share */
    uint64_t spare;
    struct mt_slot s[SLOTS];
};

struct mt_shard {
    mt_spinlock lock;
    uint32_t depth;      /* the directory has 1 << depth entries */
    struct bucket **dir; /* NULL while nothing was ever recorded here */
    /* Written under the lock, read without it by stats: atomics keep
     * those reads well-defined; relaxed stores cost a plain mov. */
    _Atomic uint64_t count, bytes, dropped, replaced;
    /* Sampling estimates: sum of weights (fixed point) and of weighted bytes. */
    _Atomic uint64_t est_count, est_bytes;
} __attribute__((aligned(64)));

static struct mt_shard shards[MT_SHARDS];
_Atomic uint8_t mt_filters[MT_SHARDS][MT_FILTER_SLOTS] __attribute__((aligned(64)));
/* Times are kept from an hour before the first entry (so that a thread that
 * read the clock just before another's first insert still fits); stored
 * plus one, 0 until then. */
#define EPOCH_MARGIN_MS 3600000
static _Atomic uint64_t epoch_plus1;

/* Filter counters move under the shard lock: plain load and store. */
static void filter_add(uint64_t addr, unsigned k, int d) {
    _Atomic uint8_t *c = &mt_filters[k][mt_filter_slot(addr)];
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    if (v != 255) /* saturated counts stay: "maybe here" is always safe */
        atomic_store_explicit(c, (uint8_t)(v + d), memory_order_relaxed);
}

static void relaxed_add(_Atomic uint64_t *c, int64_t d) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)d,
                          memory_order_relaxed);
}

/* ---- the slot format ------------------------------------------------------ */

static int packable(uint64_t addr, uint64_t size) {
    return addr && !(addr & 15) && !(addr >> (KEY_BITS + 4)) && !(size >> SIZE_BITS);
}

static uint64_t epoch(void) { return atomic_load_explicit(&epoch_plus1, memory_order_relaxed) - 1; }

static uint64_t time_code(uint64_t t_ms) {
    if (!atomic_load_explicit(&epoch_plus1, memory_order_relaxed)) {
        uint64_t none = 0; /* the first entry sets it; of two at once, the first store wins */
        atomic_compare_exchange_strong(&epoch_plus1, &none,
                                       (t_ms > EPOCH_MARGIN_MS ? t_ms - EPOCH_MARGIN_MS : 0) + 1);
    }
    uint64_t e = epoch(), d = t_ms > e ? t_ms - e : 0;
    if (d >= TIME_EXACT)
        d = TIME_EXACT + ((d - TIME_EXACT) >> TIME_STEP_SHIFT);
    return d > UINT32_MAX ? UINT32_MAX : d;
}

static uint64_t time_of(uint64_t code, uint64_t epoch) {
    return epoch +
           (code < TIME_EXACT ? code : TIME_EXACT + ((code - TIME_EXACT) << TIME_STEP_SHIFT));
}

static struct mt_slot pack(const struct mt_entry *e) {
    return (struct mt_slot){e->addr >> 4 | (e->size & ((1u << SIZE_LO_BITS) - 1)) << KEY_BITS,
                            (e->stack & MTRACE_MAX_STACK_ID) |
                                (e->size >> SIZE_LO_BITS) << MTRACE_STACK_ID_BITS |
                                time_code(e->t_ms) << 32};
}

static uint64_t addr_of(const struct mt_slot *s) { return (s->lo & KEY_MASK) << 4; }
static uint64_t size_of(const struct mt_slot *s) {
    return s->lo >> KEY_BITS | (s->hi >> MTRACE_STACK_ID_BITS & 0xff) << SIZE_LO_BITS;
}

static struct mt_entry unpack(const struct mt_slot *s, uint64_t epoch) {
    return (struct mt_entry){addr_of(s), size_of(s), time_of(s->hi >> 32, epoch),
                             (uint32_t)(s->hi & MTRACE_MAX_STACK_ID)};
}

/* ---- buckets -------------------------------------------------------------- */

/* Fibonacci hashing of the whole address: top bits pick the bucket, middle
 * bits the slot in it. */
static inline uint64_t hash_addr(uint64_t addr) { return addr * MT_HASH_GOLDEN; }

static inline size_t dir_index(uint64_t h, uint32_t depth) {
    return depth ? (size_t)(h >> (64 - depth)) : 0;
}

static inline unsigned home_of(uint64_t h) {
    return (unsigned)(((h >> HOME_SHIFT) & 0xffffffffu) * SLOTS >> 32);
}

static inline unsigned next_slot(unsigned i) { return i + 1 == SLOTS ? 0 : i + 1; }

/* How far j lies past i, going round the bucket. */
static inline unsigned past(unsigned i, unsigned j) { return j >= i ? j - i : j + SLOTS - i; }

/* The slot holding key, or the empty one where it would go; SLOTS when the
 * bucket is full without it. */
static unsigned probe(const struct bucket *b, uint64_t key, uint64_t h) {
    unsigned i = home_of(h);
    for (unsigned n = 0; n < SLOTS; n++, i = next_slot(i))
        if (!b->s[i].lo || (b->s[i].lo & KEY_MASK) == key)
            return i;
    return SLOTS;
}

/* Places a slot known to be absent into a bucket with room. */
static void place(struct bucket *b, const struct mt_slot *s) {
    unsigned i = home_of(hash_addr(addr_of(s)));
    while (b->s[i].lo)
        i = next_slot(i);
    b->s[i] = *s;
    b->count++;
}

/* Empties slot i and pulls later entries of its cluster back (backward
 * shift), so that every remaining entry stays reachable from its home. */
static void delete_at(struct bucket *b, unsigned i) {
    unsigned hole = i;
    b->s[hole].lo = 0;
    for (unsigned j = next_slot(i); b->s[j].lo; j = next_slot(j)) {
        unsigned home = home_of(hash_addr(addr_of(&b->s[j])));
        if (past(home, j) >= past(hole, j)) {
            b->s[hole] = b->s[j];
            b->s[j].lo = 0;
            hole = j;
        }
    }
    b->count--;
}

/* Splits the bucket that h falls in; 0 when memory or depth ran out. */
static int split(struct mt_shard *s, uint64_t h) {
    uint32_t d = s->depth;
    struct bucket *b = s->dir[dir_index(h, d)];
    if (b->depth == d) { /* the only bucket for its bits: double the directory */
        if (d == MAX_DEPTH)
            return 0;
        struct bucket **dir = mt_mem_take(sizeof *dir << (d + 1));
        if (!dir)
            return 0;
        for (size_t k = 0; k < (size_t)1 << d; k++)
            dir[2 * k] = dir[2 * k + 1] = s->dir[k];
        mt_mem_give(s->dir, sizeof *dir << d);
        s->dir = dir;
        s->depth = ++d;
    }
    struct bucket *b2 = mt_mem_take(sizeof *b2);
    if (!b2)
        return 0;
    /* b covers a run of 2^(d - b->depth) directory entries; b2 takes the
     * upper half of the run, the entries whose next hash bit is 1. */
    size_t run = (size_t)1 << (d - b->depth), first = dir_index(h, d) & ~(run - 1);
    for (size_t k = first + run / 2; k < first + run; k++)
        s->dir[k] = b2;
    uint32_t depth = ++b->depth;
    b2->depth = depth;
    struct mt_slot old[SLOTS];
    memcpy(old, b->s, sizeof old);
    memset(b->s, 0, sizeof b->s);
    b->count = 0;
    for (unsigned i = 0; i < SLOTS; i++)
        if (old[i].lo)
            place((hash_addr(addr_of(&old[i])) >> (64 - depth)) & 1 ? b2 : b, &old[i]);
    return 1;
}

/* The shard's first bucket, when it has none. */
static int start(struct mt_shard *s) {
    struct bucket **dir = mt_mem_take(sizeof *dir);
    struct bucket *b = dir ? mt_mem_take(sizeof *b) : NULL;
    if (!b) {
        mt_mem_give(dir, sizeof *dir);
        return 0;
    }
    dir[0] = b;
    s->dir = dir;
    s->depth = 0;
    return 1;
}

/* ---- the shards ----------------------------------------------------------- */

static inline struct mt_shard *shard_of(uint64_t addr) { return &shards[mt_shard_index(addr)]; }

/* Counters and estimates follow each entry in (sign 1) and out (-1). */
static void account(struct mt_shard *s, uint64_t size, int sign) {
    relaxed_add(&s->bytes, sign * (int64_t)size);
    if (!mt_state.sample_mean)
        return;
    int64_t w = (int64_t)mt_estimate_weight(size), b = (int64_t)mt_estimate_bytes(size);
    relaxed_add(&s->est_count, sign * w);
    relaxed_add(&s->est_bytes, sign * b);
}

static void counted_in(struct mt_shard *s, uint64_t addr) {
    filter_add(addr, (unsigned)(s - shards), 1);
    relaxed_add(&s->count, 1);
}

static void counted_out(struct mt_shard *s, uint64_t addr, uint64_t size) {
    filter_add(addr, (unsigned)(s - shards), -1);
    relaxed_add(&s->count, -1);
    account(s, size, -1);
}

/* Forgets addr wherever the shard keeps it; under its lock. */
static int remove_locked(struct mt_shard *s, uint64_t addr, struct mt_entry *old) {
    if (!atomic_load_explicit(&s->count, memory_order_relaxed))
        return 0;
    struct mt_entry e;
    int found = 0;
    if (s->dir && packable(addr, 0)) {
        uint64_t h = hash_addr(addr);
        struct bucket *b = s->dir[dir_index(h, s->depth)];
        unsigned i = probe(b, addr >> 4, h);
        if (i < SLOTS && b->s[i].lo) {
            e = unpack(&b->s[i], epoch());
            delete_at(b, i);
            found = 1;
        }
    }
    if (!found && atomic_load_explicit(&mt_spill_count, memory_order_relaxed))
        found = mt_spill_take(addr, &e);
    if (!found)
        return 0;
    counted_out(s, addr, e.size);
    if (old)
        *old = e;
    return 1;
}

/* Records e in the spill; under the shard's lock, e's address not in the slots. */
static enum mt_insert_result spill_locked(struct mt_shard *s, const struct mt_entry *e) {
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
    }
    account(s, e->size, 1);
    return r ? MT_REPLACED : MT_INSERTED;
}

enum mt_insert_result mt_table_insert(uint64_t addr, uint64_t size, uint64_t t_ms,
                                      uint32_t stack_id) {
    struct mt_entry e = {addr, size, t_ms, stack_id};
    struct mt_shard *s = shard_of(addr);
    enum mt_insert_result r = MT_INSERTED;
    mt_lock(&s->lock);
    if (!packable(addr, size)) {
        int had = remove_locked(s, addr, NULL); /* it may sit in a slot */
        r = spill_locked(s, &e);
        if (had && r != MT_DROPPED) {
            relaxed_add(&s->replaced, 1);
            r = MT_REPLACED;
        }
        goto out;
    }
    if (!s->dir && !start(s)) {
        relaxed_add(&s->dropped, 1);
        r = MT_DROPPED;
        goto out;
    }
    uint64_t h = hash_addr(addr), key = addr >> 4;
    struct mt_slot packed = pack(&e);
    for (;;) {
        struct bucket *b = s->dir[dir_index(h, s->depth)];
        unsigned i = probe(b, key, h);
        if (i < SLOTS && b->s[i].lo) { /* its free was missed: overwrite */
            account(s, size_of(&b->s[i]), -1);
            relaxed_add(&s->replaced, 1);
            b->s[i] = packed;
            r = MT_REPLACED;
            break;
        }
        if (b->count >= SPLIT_AT && split(s, h))
            continue;
        if (i == SLOTS) { /* full, and no memory to split it */
            relaxed_add(&s->dropped, 1);
            r = MT_DROPPED;
            goto out;
        }
        struct mt_entry old; /* a former entry of 256 MiB or more */
        if (atomic_load_explicit(&mt_spill_count, memory_order_relaxed) &&
            mt_spill_take(addr, &old)) {
            account(s, old.size, -1);
            relaxed_add(&s->replaced, 1);
            r = MT_REPLACED;
        } else {
            counted_in(s, addr);
        }
        b->s[i] = packed;
        b->count++;
        break;
    }
    account(s, size, 1);
out:
    mt_unlock(&s->lock);
    return r;
}

int mt_table_remove(uint64_t addr, struct mt_entry *old) {
    struct mt_shard *s = shard_of(addr);
    mt_lock(&s->lock);
    int found = remove_locked(s, addr, old);
    mt_unlock(&s->lock);
    return found;
}

uint64_t mt_table_reset(void) {
    uint64_t forgotten = 0;
    mt_table_lock_all(); /* the chunks go at once: no shard may be using them */
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &shards[k];
        forgotten += atomic_load_explicit(&s->count, memory_order_relaxed);
        s->dir = NULL;
        s->depth = 0;
        atomic_store_explicit(&s->count, 0, memory_order_relaxed);
        atomic_store_explicit(&s->bytes, 0, memory_order_relaxed);
        atomic_store_explicit(&s->est_count, 0, memory_order_relaxed);
        atomic_store_explicit(&s->est_bytes, 0, memory_order_relaxed);
    }
    memset(mt_filters, 0, sizeof mt_filters);
    mt_spill_reset();
    mt_mem_release_all();
    mt_table_unlock_all();
    return forgotten;
}

void mt_table_scan(mt_entries_fn fn, void *ctx) {
    struct mt_entry batch[SLOTS];
    uint64_t e = epoch();
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &shards[k];
        mt_lock(&s->lock);
        size_t dir_len = s->dir ? (size_t)1 << s->depth : 0;
        /* A bucket of depth l fills a run of 2^(depth - l) directory entries. */
        for (size_t d = 0; d < dir_len; d += (size_t)1 << (s->depth - s->dir[d]->depth)) {
            const struct bucket *b = s->dir[d];
            size_t n = 0, later = d + ((size_t)1 << (s->depth - b->depth));
            if (later < dir_len) /* buckets lie anywhere in the chunks: fetch the next early */
                for (unsigned line = 0; line < sizeof *b; line += 64)
                    __builtin_prefetch((const char *)s->dir[later] + line);
            for (unsigned i = 0; i < SLOTS; i++) { /* without branches: half are empty */
                batch[n] = unpack(&b->s[i], e);
                n += b->s[i].lo != 0;
            }
            if (n)
                fn(ctx, batch, n);
        }
        mt_unlock(&s->lock);
    }
    mt_spill_scan(fn, ctx);
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
    out->table_bytes = mt_mem_mapped();
}

void mt_table_lock_all(void) {
    for (unsigned k = 0; k < MT_SHARDS; k++)
        mt_lock(&shards[k].lock);
}

void mt_table_unlock_all(void) {
    for (unsigned k = 0; k < MT_SHARDS; k++)
        mt_unlock(&shards[k].lock);
}
