/*
 * The calling thread's last few stacks and the ids they were given.  A
 * thread's allocations often alternate between a few places, which the
 * previous walk alone (unwind.h) cannot answer: of the stacks it did not
 * answer, a node's boot found half among the last 8 and a mixed workload
 * (bench/vm_mixed.erl) 4 in 5.  Each is proved by re-reading the stack
 * words its walk read.
 */
#ifndef MT_RECENT_STACKS_H
#define MT_RECENT_STACKS_H

#include <stdint.h>

#include "unwind.h"

/* The id of the stack from *at (max frames walked) if it is one of them, else 0. */
uint32_t mt_recent_stack(const struct mt_walk_start *at, int max);

/* Keeps the walk mt_unwind_check just made, given id; 1 if it could. */
int mt_recent_keep(int max, uint32_t id);

#endif
