/*
 * The entries the table's 16-byte slots cannot hold: blocks of 128 MiB and
 * more, and addresses that are not 8-byte aligned or lie above 2^48 (no
 * supported allocator returns those, but a tagged pointer would be one).
 * Few by nature, so one open-addressing table of whole entries under one
 * lock.  Called only under the lock of the entry's shard (table.c), which
 * keeps that shard's counters and filter counters in step with it.
 */
#ifndef MT_TABLE_SPILL_H
#define MT_TABLE_SPILL_H

#include <stdatomic.h>
#include <stdint.h>

#include "table.h"

/* Records e: 1 when its address was there (*old is the former entry), 0 when
 * new, -1 when no memory could be mapped to hold it (or, in an orphaned fork
 * child, its lock is held by a thread that did not come along). */
int mt_spill_put(const struct mt_entry *e, struct mt_entry *old);

/* Forgets addr; 1 and *old (if not NULL) when it was there. */
int mt_spill_take(uint64_t addr, struct mt_entry *old);

/* Calls fn with every entry (see mt_table_scan). */
void mt_spill_scan(mt_entries_fn fn, void *ctx);

/* Forgets everything; its memory goes with the table's (mt_mem_release_all). */
void mt_spill_reset(void);

#endif
