/*
 * The live-allocation table: address -> (size, time, stack).
 *
 * Lossless by design: entries stay until their block is freed or the table is
 * reset.  It is split into shards, each an extendible hash table behind its
 * own spinlock, so threads that allocate at once rarely meet on a lock or a
 * cache line, and growth never moves more than one bucket.  All of its
 * memory comes from mmap (table_mem.c), never from malloc.
 */
#ifndef MT_TABLE_H
#define MT_TABLE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hash.h"
#include "mtrace_api.h"
#include "spinlock.h"

#define MT_SHARD_BITS 9
#define MT_SHARDS (1u << MT_SHARD_BITS)

/* One live allocation, as the table's readers and writers see it (the
 * table stores it packed, in 16 bytes: see table.c). */
struct mt_entry {
    uint64_t addr, size, t_ms;
    uint32_t stack;
};

enum mt_insert_result { MT_INSERTED, MT_REPLACED, MT_DROPPED };

/* A shard holds the blocks of some 64 KiB regions of the address space.
 * glibc gives each thread its own arena, so threads mostly work on shards
 * of their own and do not pass lock cache lines back and forth.  The
 * shard is a hash of the region's number modulo 2^14 (of the address
 * modulo 1 GiB), so that each of the filter's counters (below) belongs to
 * one shard; 31 to 33 such keys hash to each shard (table_filter.c lists
 * them). */
#define MT_REGION_BITS 16
#define MT_FILTER_GRAIN_BITS 10 /* one filter counter per KiB of address space */
#define MT_FILTER_BITS 20       /* 2^20 of them: addresses modulo 1 GiB */
#define MT_REGION_KEY_BITS (MT_FILTER_GRAIN_BITS + MT_FILTER_BITS - MT_REGION_BITS)
static inline unsigned mt_region_key(uint64_t addr) {
    return (unsigned)(addr >> MT_REGION_BITS) & ((1u << MT_REGION_KEY_BITS) - 1);
}
static inline unsigned mt_shard_index(uint64_t addr) {
    return (unsigned)mt_hash_index(mt_region_key(addr), MT_SHARD_BITS);
}

/* A lock-free filter that lets most frees skip the table: a counter of
 * the table's entries for each KiB of address space modulo 1 GiB
 * (saturating: a counter that reached 255 stays there and only means
 * "maybe").  Written under the lock of the one shard its addresses go to,
 * read without it.  A free's look is a shift, a mask and one byte load:
 * no multiply, and its answer is almost always "no".  1 MiB of zeroed
 * memory, of which only the pages of addresses in use are touched. */
extern _Atomic uint8_t mt_filter[1u << MT_FILTER_BITS];

static inline size_t mt_filter_index(uint64_t addr) {
    return (size_t)(addr >> MT_FILTER_GRAIN_BITS) & ((1u << MT_FILTER_BITS) - 1);
}

/* A shard (table.c): its lock, counts and a small directory.  128-byte
 * aligned: processors fetch aligned pairs of lines together, and two
 * threads on neighbouring shards would otherwise pull each other's lock
 * line. */
struct bucket;
#define MT_SMALL_DIR 8
struct mt_shard {
    mt_spinlock lock;
    uint32_t depth;      /* the directory has 1 << depth entries */
    struct bucket **dir; /* NULL while nothing was ever recorded here */
    uint64_t spilled;    /* of its entries, those in the spill: while 0, the
                          * spill's lock (one for all shards) is not taken */
    /* Written under the lock, read without it by stats: atomics keep
     * those reads well-defined; relaxed stores cost a plain mov. */
    _Atomic uint64_t count, bytes, dropped, replaced;
    int filter_set; /* 0: all of its filter counters are 0 (table_filter.c) */
    /* The directory while it has at most 8 entries, in the line next to
     * the lock's, which the processor fetches with it: a shard of a few
     * hundred entries needs no line of its own for its directory. */
    struct bucket *small_dir[MT_SMALL_DIR];
} __attribute__((aligned(128)));
extern struct mt_shard mt_shards[MT_SHARDS];

/* Could addr be in the table?  An exact "no" for any block whose insertion
 * happened before this call, as it has for a block being freed: its
 * counter was raised then and cannot fall while it is there. */
static inline int mt_table_may_hold(uint64_t addr) {
    return atomic_load_explicit(&mt_filter[mt_filter_index(addr)], memory_order_relaxed) != 0;
}

/* The filter is kept only while a free may ask it: not while lossless
 * tracking is on (gate TRACK), when every free goes to the table anyway and
 * keeping it cost a lossless malloc/free pair about 32 instructions.
 * mt_table_filter_keep(1) rebuilds it from the entries, a shard's counters
 * at a time under its lock, before tracking switches off (table_filter.c);
 * its callers take turns.  While it is not exact, a "no" from
 * mt_table_may_hold means nothing. */
void mt_table_filter_keep(int on);
int mt_table_filter_exact(void);
extern _Atomic int mt_filter_kept; /* read by inserts and removals, under the shard's lock */
/* All counters to zero, with every shard's lock held (a reset). */
void mt_table_filter_clear(void);

/* Records a block; an address already present is overwritten (its free was
 * missed) and reported as MT_REPLACED.  MT_DROPPED when no memory could be
 * mapped to hold it. */
enum mt_insert_result mt_table_insert(uint64_t addr, uint64_t size, uint64_t t_ms,
                                      uint32_t stack_id);

/* Forgets a block; returns 1 and copies the entry to *old when it was there. */
int mt_table_remove(uint64_t addr, struct mt_entry *old);
/* The same without the entry: a free's, whose every step counts. */
int mt_table_forget(uint64_t addr);

/* Forgets everything and gives all of the table's memory back to the
 * system, in a few munmap calls; returns the count. */
uint64_t mt_table_reset(void);

/* Calls fn with every entry, n at a time (n > 0): each shard's entries as
 * they were at one moment, copied out under its lock and given to fn after
 * it (table_scan.c), so that a query's work does not hold up the
 * allocations of that shard's addresses.  fn must not allocate through
 * malloc. */
typedef void (*mt_entries_fn)(void *ctx, const struct mt_entry *e, size_t n);
void mt_table_scan(mt_entries_fn fn, void *ctx);

struct mt_table_figures {
    uint64_t live_count, live_bytes, table_bytes, dropped, replaced;
    uint64_t est_count, est_bytes; /* sampling estimates; est_count in MT_WEIGHT_ONE units */
};
/* Lock-free snapshot of the counters (each shard's figures are consistent). */
void mt_table_figures(struct mt_table_figures *out);

/* The table's memory mapped now, without touching the shards. */
uint64_t mt_table_mapped(void);

/* Every shard lock: held across a reset, and while the tracker decides
 * whether the table is empty as tracking goes off. */
void mt_table_lock_all(void);
void mt_table_unlock_all(void);

/* Around fork(): every lock held, so the child gets a consistent table. */
void mt_table_fork_prepare(void);
void mt_table_fork_parent(void);
void mt_table_fork_child(void);

/* Test hook: when set, the table asks it instead of mmap for every mapping
 * (see table_mem.h). */
extern void *(*mt_table_map_hook)(size_t bytes);

#endif
