/*
 * The fast stack walker used on every tracked allocation.
 *
 * libunwind's unw_backtrace costs ~40 ns to set up a cursor plus ~5 ns a
 * frame.  This walker reads the same .eh_frame call-frame information, but
 * reduces each instruction address to a small rule ("CFA = RSP + 40, return
 * address at CFA - 8, RBP saved at CFA - 16") that is cached by address, so
 * a warm walk is a hash probe and one or two stack loads per frame.
 *
 * It handles what compilers emit for ordinary code (CFA from the stack or
 * the frame pointer, return address and frame pointer saved in the frame).
 * Anything else (signal frames, DWARF expressions, realigned stacks) makes
 * it give up, and the caller asks libunwind for that stack instead (a build
 * without libunwind, as on musl, keeps the frames walked until then).  A
 * frame without any unwind information (JIT code, musl's libc) ends the
 * stack: the frame itself is kept.
 *
 * x86-64 and aarch64 Linux; elsewhere mt_unwind always gives up.
 */
#ifndef MT_UNWIND_H
#define MT_UNWIND_H

#include <stdatomic.h>
#include <stdint.h>

#include "mtrace_api.h" /* MTRACE_MAX_DEPTH */
#include "unwind_rules.h"

/* A walker reads other frames' stack words on purpose. */
#define MT_READS_STACK __attribute__((no_sanitize_address))

/* Writes up to max addresses: out[0] is inside mt_unwind, then one return
 * address per frame.  Returns the count, or -1 - k when libunwind must be
 * used, out then holding the k frames walked before it gave up (the last
 * one the frame it could not step past).  *same is set to 1 when the stack
 * is exactly the one this thread walked last time (with the same max),
 * else 0. */
int mt_unwind(uintptr_t *out, int max, int *same);

/* Where a walk starts: a return address and the stack pointer (the CFA of
 * the function it returns from) and frame pointer that go with it. */
struct mt_walk_start {
    uintptr_t ip, sp, bp;
};

/* The caller's frame as it was when it called the current function, which
 * gets a frame pointer for this.  A walk from there leaves out the frames
 * of the function itself and of whatever it calls to walk, on every walk
 * and every check of a previous walk. */
#define MT_WALK_START_CALLER()                                                                     \
    ((struct mt_walk_start){(uintptr_t)__builtin_return_address(0),                                \
                            (uintptr_t)__builtin_dwarf_cfa(),                                      \
                            *(const uintptr_t *)__builtin_frame_address(0)})

/* mt_unwind from *at, whose frames must stay as they are meanwhile (a
 * caller of this function, or the current function's own frame): out[0] is
 * at->ip.  But when the stack is the one walked last time (*same set) out
 * is left as it was: the caller keeps what it made of that walk, and
 * mt_unwind_last gives its n frames if they are needed after all.  A stack
 * that repeats, the common case, then costs no copy. */
int mt_unwind_check(const struct mt_walk_start *at, uintptr_t *out, int max, int *same);
/* Only whether the stack from *at is the one walked last time (max as then). */
int mt_unwind_repeats(const struct mt_walk_start *at, int max);
void mt_unwind_last(uintptr_t *out, int n);

/* A buffer of MT_UNWIND_SCRATCH addresses for a capture's frames, in the
 * calling thread's walker memory (mapped on its first use, with room for
 * the longest walk and as many Erlang frames); NULL when none could be
 * mapped.  One a thread: a capture does not nest. */
#define MT_UNWIND_SCRATCH (8 + 2 * MTRACE_MAX_DEPTH)
uintptr_t *mt_unwind_scratch(void);

/* The thread is exiting: its walker memory is given back. */
void mt_unwind_thread_exit(void);

/* Whether [lo, hi) lies in the part of the calling thread's own stack its
 * walks proved readable: libunwind's reads there need no check
 * (unwind_fallback.c). */
int mt_unwind_stack_holds(uintptr_t lo, uintptr_t hi);

/* A walk's proof, to be kept elsewhere (recent_stacks.c): its first frame
 * and each stack word the walk read (return addresses, and saved frame
 * pointers a later frame used) with what it held, its checks, stored apart
 * (so that a keeper can give each proof the room it needs).  While they
 * hold the same, a walk from that frame gives the same frames. */
struct mt_stack_check {
    const uintptr_t *at;
    uintptr_t word;
};
struct mt_walk_proof {
    uintptr_t ip, sp, bp;
    uint64_t gen; /* of the unwind rules */
    int max, n, needs_bp;
};

/* Whether any of the n checks c no longer holds: one loop of independent
 * loads, no branch but the loop's. */
static inline MT_READS_STACK int mt_checks_differ(const struct mt_stack_check *c, int n) {
    uintptr_t diff = 0;
#pragma GCC unroll 4 /* the loop's own counting was a third of its instructions */
    for (int k = 0; k < n; k++)
        diff |= *c[k].at ^ c[k].word;
    return diff != 0;
}
/* The proof of the walk mt_unwind_check just made (max as then), its
 * checks written to c (at most cap of them); 0 when it made none (a
 * repeat, or it gave up) or they would not fit, and then p->sp is 0. */
int mt_unwind_prove(struct mt_walk_proof *p, struct mt_stack_check *c, int cap, int max);
/* Whether a walk from *at (max frames) starts as the one p proves: then
 * it gives the same frames if the proof's checks still hold.  Those read
 * words a walk read from the same stack pointer in this thread's own stack
 * (mt_unwind_prove is given none that gave up), which stays mapped while
 * the thread lives. */
static inline int mt_proof_applies(const struct mt_walk_proof *p, const struct mt_walk_start *at,
                                   int max) {
    return p->sp == at->sp && p->ip == at->ip && p->max == max &&
           p->gen == atomic_load_explicit(&mt_rules_generation, memory_order_relaxed) &&
           (!p->needs_bp || p->bp == at->bp);
}

/* Code may have been unmapped (dlclose): forget every cached rule. */
void mt_unwind_forget(void);

/* An unload the dlclose hook does not see (the C library's own dlclose of a
 * module it loaded) is found at the next rule that misses the cache; where
 * walks are few (sampling), code mapped where the unloaded code was may be
 * walked with the old rules before any miss.  This compares the loader's
 * count of loads and unloads, at most once per tick of now_ms. */
void mt_unwind_check_loads(uint64_t now_ms);

/* Walks that gave up (and were done by libunwind, or in a build without
 * libunwind were cut short), for stats. */
uint64_t mt_unwind_fallbacks(void);
void mt_unwind_count_fallback(void);
/* Walks on a stack not the thread's own (a coroutine's) that stopped where
 * readable memory did, short of the walk's natural end, for stats. */
uint64_t mt_unwind_cut(void);

#endif
