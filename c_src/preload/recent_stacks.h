/*
 * The calling thread's last few stacks and the ids they were given.  A
 * thread's allocations often alternate between a few places, which the
 * previous walk alone (unwind.h) cannot answer: a release's boot, whose
 * code loading allocates from C++ containers all over the loader, walked
 * 348,000 of its 937,000 stacks with only the last 8 kept and walks 22,000
 * with the last 64, a node's boot 55,000 and then 6,000 of 161,000.  With
 * the last 128 kept, half as many captures walk as with 64 (calls of the
 * capture that walks: 10,400 -> 5,900 in a release's boot, 3,500 -> 1,900
 * in a node's).  Each is proved by re-reading the stack words its walk read.
 */
#ifndef MT_RECENT_STACKS_H
#define MT_RECENT_STACKS_H

#include <stdint.h>

#include "unwind.h"

/* The id of the stack from *at (max frames walked) if it is one of them, else 0. */
uint32_t mt_recent_stack(const struct mt_walk_start *at, int max);

/* Keeps the walk mt_unwind_check just made, given id; 1 if it could. */
int mt_recent_keep(int max, uint32_t id);

/* The calling thread is exiting: its stacks' memory goes back, and it keeps
 * none from now on. */
void mt_recent_thread_exit(void);

#endif
