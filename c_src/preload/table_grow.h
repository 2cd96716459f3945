/*
 * A shard's growth (table.c's rare steps): its first bucket, and a full
 * bucket split in two, doubling the directory when it must.  All under the
 * shard's lock; memory from table_mem.c.
 */
#ifndef MT_TABLE_GROW_H
#define MT_TABLE_GROW_H

#include <stdint.h>

#include "table.h"

/* The shard's first bucket, when it has none; 0 when no memory. */
int mt_shard_start(struct mt_shard *s);

/* Splits the full bucket that hash h falls in; 0 when memory or depth ran
 * out. */
int mt_shard_split(struct mt_shard *s, uint64_t h);

/* Forgets every shard's bucket runs, with every shard lock held, as a
 * reset gives the table's memory back. */
void mt_shard_growth_reset(void);

#endif
