/*
 * A scan of the table for the queries (see mt_table_scan in table.h): each
 * shard's entries are copied out under its lock and handed to the query
 * after the lock is released.
 *
 * A query's work on an entry (olds' bounded heap of up to a million
 * entries, a sites tally's estimate) costs far more than reading it, and
 * while a shard's lock is held every malloc and free of its addresses, in
 * every thread of the VM, waits: run under the lock, a query of 1M olds
 * over 4M entries held up an insert and removal for 5 ms.  Copied out, a
 * shard's lock is held only as long as reading its buckets takes.
 *
 * The copies go to memory mapped for the scan, as large as the largest
 * shard (about 32 bytes an entry: 64 KiB a shard at 1M entries) and
 * unmapped after it.  Should it not hold a shard's entries (no memory
 * could be mapped, or the shard grew between its sizing and its lock),
 * the entries that do not fit are handed over under the lock.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "spinlock.h"
#include "table.h"
#include "table_bucket.h"
#include "table_spill.h"

#define BATCH 64
#define SCAN_AHEAD 32
#define ROOM_MIN 1024 /* entries: what the spill, few by nature, most often fits in */

struct copies {
    mt_entries_fn fn;
    void *ctx;
    struct mt_entry *e; /* mapped, room entries, n of them taken */
    size_t n, room;
};

/* Room for at least want entries; 0 when none could be mapped (the room
 * there was is kept). */
static int make_room(struct copies *c, size_t want) {
    if (want <= c->room)
        return 1;
    size_t room = want + want / 4 + ROOM_MIN, bytes = room * sizeof *c->e;
    void *m = mt_table_map_hook ? mt_table_map_hook(bytes)
                                : mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (!m || m == MAP_FAILED)
        return 0;
    if (c->e)
        munmap(c->e, c->room * sizeof *c->e);
    c->e = m;
    c->room = room;
    return 1;
}

/* Under a lock: keeps e for later, or hands it over now when there is no
 * room. */
static void copy_out(void *ctx, const struct mt_entry *e, size_t n) {
    struct copies *c = ctx;
    if (n > c->room - c->n) {
        c->fn(c->ctx, e, n);
        return;
    }
    memcpy(c->e + c->n, e, n * sizeof *e);
    c->n += n;
}

/* After the lock: what was kept. */
static void hand_over(struct copies *c) {
    if (c->n)
        c->fn(c->ctx, c->e, c->n);
    c->n = 0;
}

/* A shard's entries, BATCH at a time, to fn; under its lock. */
static void read_shard(const struct mt_shard *s, mt_entries_fn fn, void *ctx) {
    struct mt_entry batch[BATCH];
    uint64_t e = mt_table_epoch(); /* under a lock: a first entry's epoch is seen */
    size_t n = 0, dir_len = s->dir ? (size_t)1 << s->depth : 0;
    for (size_t d = 0; d < dir_len; d += run_of(s->dir[d], s->depth)) {
        const struct bucket *b = s->dir[d];
        /* Buckets lie anywhere in the chunks: fetch some ahead (by
         * directory entries, which may repeat a bucket: harmless). */
        size_t later = d + SCAN_AHEAD < dir_len ? d + SCAN_AHEAD : dir_len - 1;
        for (unsigned line = 0; line < sizeof *b; line += 64)
            __builtin_prefetch((const char *)s->dir[later] + line);
        for (unsigned i = 0; i < SLOTS; i++) { /* without branches: many are empty */
            batch[n] = mt_slot_unpack(&b->s[i], e);
            n += occupied(b, i);
        }
        if (n > BATCH - SLOTS) {
            fn(ctx, batch, n);
            n = 0;
        }
    }
    if (n)
        fn(ctx, batch, n);
}

void mt_table_scan(mt_entries_fn fn, void *ctx) {
    struct copies c = {fn, ctx, NULL, 0, 0};
    make_room(&c, ROOM_MIN);
    for (unsigned k = 0; k < MT_SHARDS; k++) {
        struct mt_shard *s = &mt_shards[k];
        make_room(&c, (size_t)atomic_load_explicit(&s->count, memory_order_relaxed));
        mt_lock(&s->lock);
        read_shard(s, copy_out, &c);
        mt_unlock(&s->lock);
        hand_over(&c);
    }
    /* The spill is touched only under some shard's lock, so that a fork,
     * which holds them all, never finds the spill's own lock taken. */
    mt_lock(&mt_shards[0].lock);
    mt_spill_scan(copy_out, &c);
    mt_unlock(&mt_shards[0].lock);
    hand_over(&c);
    if (c.e)
        munmap(c.e, c.room * sizeof *c.e);
}
