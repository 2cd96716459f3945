/*
 * A walk's frames as the walker (unwind.c) keeps them: one column per
 * field, the thread's walker memory that holds the previous walk, and the
 * plain operations on frames.  Included by unwind.c only.
 */
#ifndef MT_UNWIND_FRAMES_H
#define MT_UNWIND_FRAMES_H

#include <stdint.h>

#include "mtrace_api.h" /* MTRACE_MAX_DEPTH */
#include "unwind.h"     /* MT_UNWIND_SCRATCH, struct mt_stack_check */

/* The deepest walk asked for: MTRACE_DEPTH frames (at most
 * MTRACE_MAX_DEPTH) and the hooks' own few (stacks.c asks for depth + 2). */
#define WALK_MAX (MTRACE_MAX_DEPTH + 8)
#define PREFIX_MAX 16
#define F_BP_SAVED 1
#define F_NEEDS_BP 2 /* the walk from here on reads the incoming bp */
#define F_CFA_BP 4

struct frames {
    uintptr_t ip[WALK_MAX], sp[WALK_MAX], bp[WALK_MAX];
    int32_t bp_off[WALK_MAX], ra_off[WALK_MAX]; /* from the frame's rule */
    uint8_t flags[WALK_MAX];
};

/* The same columns, wherever they are stored (TLS or the C stack). */
struct cols {
    uintptr_t *ip, *sp, *bp;
    int32_t *bp_off, *ra_off;
    uint8_t *flags;
};

/* A thread's walker memory: 11 KiB in a mapping of its own, made on its
 * first walk and unmapped as it exits.  Not in TLS, whose size glibc takes
 * from the top of every thread's stack in every program the preload is in,
 * traced or not: a thread made with a 16 KiB stack had 3 KiB left.  Nor on
 * the C stack, for the same threads' sake. */
struct walker {
    struct frames last; /* the previous walk */
    /* The previous walk as a list of checks, built once it has repeated:
     * each stack word a frame of it read (return addresses, and saved bps
     * a later frame uses), where and what.  A stack that keeps repeating
     * is then proved the same by one tight loop of independent loads, with
     * no rule to decode per frame.  chk_n < 0: no list (the previous walk
     * changed since). */
    struct mt_stack_check chk[2 * WALK_MAX];
    uintptr_t scratch[MT_UNWIND_SCRATCH]; /* mt_unwind_scratch */
};

/* A return address as read from the stack.  On aarch64 it may be signed
 * (pointer authentication, -mbranch-protection=pac-ret): XPACLRI strips the
 * signature, and is a no-op where there is none (it is in the hint space, so
 * also on processors without pointer authentication). */
static inline uintptr_t return_address(uintptr_t word) {
#if defined(__aarch64__)
    register uintptr_t x30 __asm__("x30") = word;
    __asm__("hint #7" : "+r"(x30)); /* xpaclri */
    return x30;
#else
    return word;
#endif
}

/* F_NEEDS_BP for frames [0, upto), given the flags of frame upto. */
static void mark_needs(struct cols *f, int upto, int n) {
    uint8_t needs = upto < n ? (f->flags[upto] & F_NEEDS_BP) != 0 : 0;
    for (int j = upto - 1; j >= 0; j--) {
        uint8_t x = f->flags[j] & (F_BP_SAVED | F_CFA_BP);
        needs = (x & F_CFA_BP) ? 1 : (x & F_BP_SAVED) ? 0 : needs;
        f->flags[j] = x | (needs ? F_NEEDS_BP : 0);
    }
}

static void put(struct cols *f, int i, uintptr_t ip, uintptr_t sp, uintptr_t bp) {
    f->ip[i] = ip;
    f->sp[i] = sp;
    f->bp[i] = bp;
    f->flags[i] = 0;
    f->bp_off[i] = 0;
    f->ra_off[i] = 0;
}

static void copy_frames(struct cols *to, const struct cols *from, int n) {
    for (int i = 0; i < n; i++) {
        to->ip[i] = from->ip[i];
        to->sp[i] = from->sp[i];
        to->bp[i] = from->bp[i];
        to->bp_off[i] = from->bp_off[i];
        to->ra_off[i] = from->ra_off[i];
        to->flags[i] = from->flags[i];
    }
}

#endif
