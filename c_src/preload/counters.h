/*
 * Per-call counters (malloc_cnt, free_cnt, ...) at the cost of one plain
 * increment per call.
 *
 * Each thread counts into a struct mt_counts of its own, taken once from a
 * registry in this library's memory (never from the thread's TLS or stack,
 * which go away with the thread); stats sums the registered ones.  When a
 * thread exits its counts are folded into a total and its struct goes back
 * to the registry; anything it still counts (later TLS destructors that
 * free) goes to shared atomic counters, as do the calls of threads beyond
 * the registry's size.  A thread that registers too late for its exit to
 * be seen (in the C library's last clean-up, after the TLS destructors)
 * keeps its struct: its counts stay readable and right, only the struct is
 * not reused.  No allocation anywhere.
 */
#ifndef MT_COUNTERS_H
#define MT_COUNTERS_H

#include <stdatomic.h>
#include <stdint.h>

#include "mtrace_api.h"

enum { MT_COUNTS_NEW, MT_COUNTS_REGISTERED, MT_COUNTS_SHARED };

/* 128-byte aligned: no two threads' counts share a pair of lines. */
struct mt_counts {
    _Atomic uint64_t calls[MT_FN_COUNT]; /* written by the owner only, read by stats */
} __attribute__((aligned(128)));

/* A struct of the registry's for the calling thread, zeroed, or NULL when
 * all are taken, or (*later set) when a fork held the registry too long:
 * to be asked again. */
struct mt_counts *mt_counts_register(int *later);

/* The owner of c is exiting: folds its counts into the total and gives c
 * back. */
void mt_counts_retire(struct mt_counts *c);

/* For threads without a registered struct. */
void mt_counts_shared_add(enum mtrace_fn fn);

/* Sums everything into out[MT_FN_COUNT]. */
void mt_counts_sum(uint64_t *out);

/* Around fork: the child keeps only the forking thread's registration. */
void mt_counts_lock(void);
void mt_counts_unlock(void);
void mt_counts_child(const struct mt_counts *mine);

/* The owner's increment.  Only the owner writes, so no lock prefix is
 * needed, but a signal handler that allocates may interrupt the owner
 * between a load and its store and count a call of its own there: the
 * increment must be one instruction, or atomic.  On x86-64 it is one add
 * to memory (a reader sees the old or the new value of an aligned word);
 * elsewhere a relaxed atomic add (a single LSE add on aarch64 when the
 * processor has it, else a load-exclusive/store-exclusive pair that a
 * signal makes retry). */
static inline void mt_counts_bump(struct mt_counts *c, enum mtrace_fn fn) {
#if defined(__x86_64__)
    __asm__("addq $1, %0" : "+m"(*(uint64_t *)&c->calls[fn]));
#else
    atomic_fetch_add_explicit(&c->calls[fn], 1, memory_order_relaxed);
#endif
}

#endif
