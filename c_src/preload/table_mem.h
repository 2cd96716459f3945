/*
 * The table's memory: zeroed blocks of power-of-two sizes carved from a few
 * large mappings, so that growing the table costs no page faults one page
 * at a time and reset gives everything back in a few munmap calls (on a
 * virtual machine each call flushes the TLB through the hypervisor, ~70 us;
 * one call per shard array made a reset of 1M entries take 40 ms).
 *
 * Called only under a shard lock of the table (table.c), so a fork, which
 * holds every shard lock, never finds its own lock taken.
 */
#ifndef MT_TABLE_MEM_H
#define MT_TABLE_MEM_H

#include <stddef.h>
#include <stdint.h>

/* A zeroed block of bytes (a power of two, 64 B to MT_MEM_MAX_BLOCK), or
 * NULL when no memory could be mapped (or, in an orphaned fork child, the
 * lock is held by a thread that did not come along). */
#define MT_MEM_MAX_SHIFT 21
#define MT_MEM_MAX_BLOCK ((size_t)1 << MT_MEM_MAX_SHIFT)
void *mt_mem_take(size_t bytes);

/* Gives a block back for reuse by a later mt_mem_take of the same size. */
void mt_mem_give(void *p, size_t bytes);

/* Unmaps every chunk: all blocks ever taken are gone. */
void mt_mem_release_all(void);

/* Around fork, with every shard lock held: the child does not inherit the
 * current chunk's untouched tail (see table_mem.c). */
void mt_mem_fork_prepare(void);
void mt_mem_fork_parent(void);
void mt_mem_fork_child(void);

/* Bytes mapped now. */
uint64_t mt_mem_mapped(void);

#endif
