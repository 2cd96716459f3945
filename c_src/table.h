/*
 * The live-allocation table: address -> (size, time, stack).
 *
 * Lossless by design: entries stay until their block is freed or the table is
 * reset.  It is split into shards, each an open-addressing hash table behind
 * its own spinlock, so threads that allocate at once rarely meet on a lock or
 * a cache line.  All of its memory comes from mmap, never from malloc.
 */
#ifndef MT_TABLE_H
#define MT_TABLE_H

#include <stddef.h>
#include <stdint.h>

#define MT_SHARD_BITS 9
#define MT_SHARDS (1u << MT_SHARD_BITS)

/* A slot packs time and stack into one word: 40 bits of milliseconds
 * (34 years) and 24 bits of stack id (16.7 million distinct stacks). */
#define MT_STACK_BITS 24
#define MT_MAX_STACK_ID ((1u << MT_STACK_BITS) - 1)

struct mt_slot {
    uint64_t addr; /* 0 = empty */
    uint64_t size;
    uint64_t meta; /* t_ms << MT_STACK_BITS | stack_id */
};

static inline uint64_t mt_slot_time(const struct mt_slot *s) { return s->meta >> MT_STACK_BITS; }
static inline uint32_t mt_slot_stack(const struct mt_slot *s) {
    return (uint32_t)(s->meta & MT_MAX_STACK_ID);
}

enum mt_insert_result { MT_INSERTED, MT_REPLACED, MT_DROPPED };

/* Records a block; an address already present is overwritten (its free was
 * missed) and reported as MT_REPLACED.  MT_DROPPED when no memory could be
 * mapped to hold it. */
enum mt_insert_result mt_table_insert(uint64_t addr, uint64_t size, uint64_t t_ms,
                                      uint32_t stack_id);

/* Forgets a block; returns 1 and copies the entry to *old when it was there. */
int mt_table_remove(uint64_t addr, struct mt_slot *old);

/* Forgets everything (memory is returned to the system); returns the count. */
uint64_t mt_table_reset(void);

/* Calls fn once per shard, under that shard's lock, with its slot array
 * (empty slots have addr 0).  fn must not allocate through malloc. */
typedef void (*mt_shard_fn)(void *ctx, const struct mt_slot *slots, size_t cap);
void mt_table_scan(mt_shard_fn fn, void *ctx);

struct mt_table_figures {
    uint64_t live_count, live_bytes, table_bytes, dropped, replaced;
};
/* Lock-free snapshot of the counters (each shard's figures are consistent). */
void mt_table_figures(struct mt_table_figures *out);

/* Holds every shard lock across fork() so the child gets a consistent table. */
void mt_table_lock_all(void);
void mt_table_unlock_all(void);

/* Test hook: when set, the table asks it instead of mmap for memory. */
extern void *(*mt_table_map_hook)(size_t bytes);

#endif
