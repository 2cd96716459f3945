/*
 * Call stacks: captured by the fast walker of unwind.c (libunwind where it
 * gives up; in a build without libunwind, -DMT_NO_LIBUNWIND as on musl, the
 * frames it walked until then), interned once, named by a 24-bit id.
 *
 * Most allocations come from a few thousand call sites, so a table entry
 * stores an id instead of its frames.  The store only grows (ids stay valid
 * across reset) and lives in memory mapped here, never in malloc'ed memory.
 */
#ifndef MT_STACKS_H
#define MT_STACKS_H

#include <stdint.h>

#include "mtrace_api.h"
#include "unwind.h"

/* Called once before the first capture. */
void mt_stacks_init(void);

/* Captures the current call stack (through the fast walker from *at,
 * unless mt_state.fast_unwind is 0), skipping this library's own frames,
 * and returns its id (MTRACE_NO_STACK if it could not be stored).  *at is a
 * frame of this library's, at most MAX_HOOK_FRAMES (stacks.c) below the
 * caller of malloc (see MT_WALK_START_CALLER). */
uint32_t mt_stack_capture(const struct mt_walk_start *at, uint32_t depth);

/* Interns depth frames; returns the id, MTRACE_NO_STACK if the store is full. */
uint32_t mt_stack_intern(const uintptr_t *ips, uint32_t depth);

/* The same for depth native frames followed by erl Erlang frame pcs (see
 * erlang_frames.h), which are named when the stack is new. */
uint32_t mt_stack_intern_erl(const uintptr_t *ips, uint32_t depth, uint32_t erl);

/* Copies up to max Erlang frames of a stack; returns the count. */
uint32_t mt_stack_erl(uint32_t id, struct mtrace_erl_frame *out, uint32_t max);

/* Copies up to max frames of a stack; returns the count (0 for unknown ids). */
uint32_t mt_stack_get(uint32_t id, uintptr_t *ips, uint32_t max);

/* The unloads' epoch as of which a stack's native frames are the code they
 * were walked in (unloads.h); 0 for unknown ids. */
uint32_t mt_stack_epoch(uint32_t id);

struct mt_stack_figures {
    uint64_t stacks, bytes, dropped;
    uint64_t erl_stacks; /* stacks with Erlang frames */
};
void mt_stack_figures(struct mt_stack_figures *out);

/* The calling thread is exiting (its last allocations are still tracked). */
void mt_stacks_thread_exit(void);

/* Held across fork() so that no half-published stack, and no lock inside
 * libunwind, reaches the child. */
void mt_stacks_lock(void);
void mt_stacks_unlock(void);

#endif
