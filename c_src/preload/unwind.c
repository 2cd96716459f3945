/*
 * Fast stack walker (see unwind.h): one cached rule per frame
 * (unwind_rules.c), and a stack that repeats proved by re-reading it.
 *
 * A rule applied to the wrong code (a library unloaded and another mapped at
 * its address before any miss noticed) must give a wrong stack, never a
 * crash: every stack word the walker reads lies between the stack pointer
 * and the top of this thread's stack.
 */
#define _GNU_SOURCE
#include "unwind.h"

#include <stdatomic.h>

static _Atomic uint64_t fallbacks, cut;

uint64_t mt_unwind_fallbacks(void) {
    return atomic_load_explicit(&fallbacks, memory_order_relaxed);
}
uint64_t mt_unwind_cut(void) { return atomic_load_explicit(&cut, memory_order_relaxed); }
void mt_unwind_count_fallback(void) {
    atomic_fetch_add_explicit(&fallbacks, 1, memory_order_relaxed);
}

#if !(defined(__x86_64__) || defined(__aarch64__)) || !defined(__linux__)
#error "mtrace's walker supports Linux on x86-64 and aarch64"
#endif

#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "mtrace_api.h" /* MTRACE_MAX_DEPTH */
#include "unwind_frames.h"
#include "unwind_rules.h"

/* ---- reusing this thread's previous walk ------------------------------- *
 *
 * Allocations come in bursts from the same place, so the outer part of a
 * stack is usually the one walked last time.  A walk is a pure function of
 * (ip, sp, bp) at a frame and of the stack words it reads from there on, so
 * when a frame matches a frame of the previous walk, re-reading those words
 * (independent loads, no hash probes) and finding them unchanged proves the
 * rest of the stack is the same.  bp (the frame pointer) only matters if a
 * later frame uses it before restoring it from the stack.  The previous walk
 * lives in the thread's walker memory (unwind_frames.h); new frames above
 * the match point are collected on the C stack first, so the common case
 * (same frames, same depth) copies none. */
#define GONE ((struct walker *)1) /* none: the thread exited, or no memory */
static __thread struct walker *w __attribute__((tls_model("initial-exec")));
/* w->last and w->chk are read only where last_n, chk_n or fresh_n says
 * there is a walk, which only a walker's memory holds. */

/* When mapping it last failed, on the table's clock: a thread asks again a
 * second later, not at every allocation meanwhile (nor never again). */
static __thread uint64_t failed_ms __attribute__((tls_model("initial-exec")));

static struct walker *mine(void) {
    if (w)
        return w;
    if (failed_ms && mt_now_ms() - failed_ms < 1000)
        return GONE;
    /* Populated: its pages are written at once (a page read before it is
     * written maps the zero page, which the write then replaces with a
     * flush of every other CPU's TLB). */
    void *m = mmap(NULL, sizeof(struct walker), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED) {
        failed_ms = mt_now_ms() | 1; /* never 0 */
        return GONE;
    }
    return w = m;
}

uintptr_t *mt_unwind_scratch(void) {
    struct walker *m = mine();
    return m == GONE ? NULL : m->scratch;
}

static __thread int last_n __attribute__((tls_model("initial-exec"))); /* 0 = none */
static __thread uint64_t last_gen __attribute__((tls_model("initial-exec")));
static __thread int last_max __attribute__((tls_model("initial-exec")));

static __thread int chk_n __attribute__((tls_model("initial-exec"))) = -1;
/* Frames of the walk just made in last's columns, with their flags set,
 * for mt_unwind_prove; 0 when it made none (a repeat, or it gave up). */
static __thread int fresh_n __attribute__((tls_model("initial-exec")));

#include "stack_bounds.h"

/* From which frame on does the previous walk still describe this stack?
 * Checks every step from frame c outwards: the return address slot, and
 * the saved-bp slot where a later frame uses that bp.  Returns the first
 * frame after the outermost step that changed (c when nothing changed). */
/* The stack words step j of the previous walk (frame j to j + 1) read:
 * the return address, and the saved bp when a later frame uses it. */
static inline const uintptr_t *ra_slot(int j) {
    return (const uintptr_t *)(w->last.sp[j + 1] + (intptr_t)w->last.ra_off[j]);
}
static inline const uintptr_t *bp_slot(int j) {
    return (w->last.flags[j] & F_BP_SAVED) && (w->last.flags[j + 1] & F_NEEDS_BP)
               ? (const uintptr_t *)(w->last.sp[j + 1] + (intptr_t)w->last.bp_off[j])
               : NULL;
}

static MT_READS_STACK int valid_from(int c) {
    int from = c;
    for (int j = c; j + 1 < last_n; j++) {
        const uintptr_t *bp = bp_slot(j);
        int same = return_address(*ra_slot(j)) == w->last.ip[j + 1];
        if (bp)
            same &= *bp == w->last.bp[j + 1];
        if (!same)
            from = j + 1;
    }
    return from;
}

/* The checks of steps [0, steps) of the previous walk into c, as its words
 * are now; their count, or -1 if more than cap. */
static MT_READS_STACK int collect_checks(int steps, struct mt_stack_check *c, int cap) {
    int k = 0;
    for (int j = 0; j < steps; j++) {
        const uintptr_t *at[2] = {ra_slot(j), bp_slot(j)};
        for (int i = 0; i < 2 && at[i]; i++) {
            if (k == cap)
                return -1;
            c[k].at = at[i];
            c[k++].word = *at[i];
        }
    }
    return k;
}

/* The checks valid_from(0) makes, as a list; right after it found nothing
 * changed, so the words read now are those of the walk (return addresses
 * as stored: on aarch64 possibly signed).  Only the steps to the frames a
 * repeat gives (last_max): the outer ones are checked again (valid_from)
 * before any other walk relies on them, and a node's stacks are often far
 * deeper than what is kept. */
static MT_READS_STACK void build_checks(void) {
    chk_n = collect_checks((last_n < last_max ? last_n : last_max) - 1, w->chk, 2 * WALK_MAX);
}

/* Whether the stack from (ip, sp, bp) is the previous walk's, by its checks. */
static inline MT_READS_STACK int repeats(uintptr_t ip, uintptr_t sp, uintptr_t bp, int max) {
    if (chk_n < 0 || w->last.sp[0] != sp || w->last.ip[0] != ip || max != last_max ||
        ((w->last.flags[0] & F_NEEDS_BP) && w->last.bp[0] != bp))
        return 0;
    return !mt_checks_differ(w->chk, chk_n);
}

static struct cols last_cols(void) {
    return (struct cols){w->last.ip,     w->last.sp,     w->last.bp,
                         w->last.bp_off, w->last.ra_off, w->last.flags};
}

/* Frames [0, n) of pre replace the previous walk's frames above c. */
static void splice(const struct cols *pre, int n, int c) {
    int tail = last_n - c;
    if (n + tail > WALK_MAX)
        tail = WALK_MAX - n;
    if (n != c) {
        memmove(w->last.ip + n, w->last.ip + c, (size_t)tail * sizeof(uintptr_t));
        memmove(w->last.sp + n, w->last.sp + c, (size_t)tail * sizeof(uintptr_t));
        memmove(w->last.bp + n, w->last.bp + c, (size_t)tail * sizeof(uintptr_t));
        memmove(w->last.bp_off + n, w->last.bp_off + c, (size_t)tail * sizeof(int32_t));
        memmove(w->last.ra_off + n, w->last.ra_off + c, (size_t)tail * sizeof(int32_t));
        memmove(w->last.flags + n, w->last.flags + c, (size_t)tail);
    }
    struct cols l = last_cols();
    copy_frames(&l, pre, n);
    last_n = n + tail;
    mark_needs(&l, n, last_n);
}

/* The walk has met the previous one at its frame c, which holds from there
 * on: frames [0, n) of f go before it, and the walk is done. */
static inline __attribute__((always_inline)) int
join(const struct cols *f, int n, int c, uintptr_t *out, int max, int *same, int lazy) {
    *same = n == 0 && c == 0 && max == last_max;
    last_max = max;
    splice(f, n, c);
    int give = last_n < max ? last_n : max;
    if (*same)
        build_checks();
    else
        fresh_n = give;
    if (lazy && *same)
        return give;
    /* A plain loop: the block is short, and GCC's inline memcpy for it (rep
     * movsq) costs more than the copy. */
    for (int i = 0; i < give; i++)
        out[i] = w->last.ip[i];
    return give;
}

/* lazy: when the stack is the one walked last time, out is left alone. */
static inline __attribute__((always_inline)) MT_READS_STACK int
walk(const struct mt_walk_start *at, uintptr_t *out, int max, int *same, int lazy) {
    uintptr_t ip = at->ip, sp = at->sp, bp = at->bp;
    uint64_t gen = atomic_load_explicit(&mt_rules_generation, memory_order_relaxed);
    chk_n = -1; /* whatever this walk finds, the list is rebuilt only on a repeat */
    *same = 0;
    fresh_n = 0;
    if (mine() == GONE)
        return -1;
    uintptr_t pre_ip[PREFIX_MAX], pre_sp[PREFIX_MAX], pre_bp[PREFIX_MAX];
    int32_t pre_bp_off[PREFIX_MAX], pre_ra_off[PREFIX_MAX];
    uint8_t pre_flags[PREFIX_MAX];
    /* While a match is possible, frames go to pre (the C stack), else to last. */
    struct cols pre = {pre_ip, pre_sp, pre_bp, pre_bp_off, pre_ra_off, pre_flags},
                in_last = last_cols();
    struct cols *f = &pre;
    /* On a stack not the thread's own, every frame is walked and none kept
     * for later walks to reuse: it may be unmapped before they come. */
    int own;
    uintptr_t top = top_of_stack(sp, &own);
    int bounded = !own;
    int c = (!bounded && last_n && last_gen == gen) ? 0 : WALK_MAX;
    if (c) { /* nothing to reuse: write straight into last */
        f = &in_last;
        last_n = 0;
        last_gen = gen;
    }
    if (max > WALK_MAX)
        max = WALK_MAX;
    int n = 0, natural = 0, valid = -1; /* valid: frames from here on checked */
    if (!top)
        goto give_up;
    last_max = max;
    while (n < max) {
        while (c < last_n && w->last.sp[c] < sp)
            c++;
        if (c < last_n && w->last.sp[c] == sp && w->last.ip[c] == ip &&
            (!(w->last.flags[c] & F_NEEDS_BP) || w->last.bp[c] == bp)) {
            if (valid < 0)
                valid = valid_from(c); /* once: the stack does not change meanwhile */
            if (c >= valid)
                return join(f, n, c, out, max, same, lazy);
        }
        if (f == &pre && (c >= last_n || n == PREFIX_MAX)) {
            /* No reuse after all: move what pre holds into last and go on there. */
            copy_frames(&in_last, &pre, n);
            f = &in_last;
            c = WALK_MAX;
            last_n = 0;
            last_gen = gen;
        }
        out[n] = ip;
        put(f, n, ip, sp, bp);
        n++;
        struct mt_frame_rule r;
        mt_rule_for(ip, &r);
        if (r.kind == MT_RULE_LAST || r.kind == MT_RULE_NO_INFO) {
            natural = 1;
            break;
        }
        if (r.kind != MT_RULE_FRAME)
            goto give_up;
        uintptr_t cfa = (r.cfa_bp ? bp : sp) + (intptr_t)r.cfa_off;
        /* Stacks grow down, and end at top: a rule that says otherwise is
         * wrong.  The saved words lie below the CFA (ra_off, bp_off < 0) and
         * must lie in this frame too. */
        if (cfa <= sp || cfa + (intptr_t)r.ra_off < sp ||
            (r.bp_saved && cfa + (intptr_t)r.bp_off < sp))
            goto give_up;
        if (cfa > top) {
            if (!bounded)
                goto give_up;
            /* Off the end of another stack: on to the one the frame names
             * (the thread's own, say), where it can be proved readable. */
            intptr_t low = r.bp_saved && r.bp_off < r.ra_off ? r.bp_off : r.ra_off;
            top = top_of_stack(cfa + (uintptr_t)low, &(int){0}); /* bounded still */
            if (!top || cfa > top)
                goto give_up;
        }
        f->flags[n - 1] = (r.cfa_bp ? F_CFA_BP : 0) | (r.bp_saved ? F_BP_SAVED : 0);
        f->bp_off[n - 1] = r.bp_off;
        f->ra_off[n - 1] = r.ra_off;
        if (r.bp_saved)
            bp = *(const uintptr_t *)(cfa + (intptr_t)r.bp_off);
        ip = return_address(*(const uintptr_t *)(cfa + (intptr_t)r.ra_off));
        sp = cfa;
        if (!ip) {
            natural = 1;
            break;
        }
    }
    if (f != &in_last) { /* a short stack that ended before any match: keep it */
        copy_frames(&in_last, &pre, n);
        last_gen = gen;
    }
    /* A walk cut short by max cannot stand for a longer one, but its n
     * frames can stand for themselves (mt_unwind_prove). */
    if (bounded) {
        last_n = 0;
        return n;
    }
    last_n = natural ? n : 0;
    mark_needs(&in_last, n, n);
    fresh_n = n;
    return n;
give_up:
    last_n = 0;
    if (bounded) {
        /* On a stack not the thread's own, only what was proved readable
         * may be read: libunwind would read on.  The frames walked stand,
         * counted as a stack cut short. */
        fresh_n = 0;
        atomic_fetch_add_explicit(&cut, 1, memory_order_relaxed);
        return n;
    }
    return -1 - n;
}

MT_READS_STACK __attribute__((noinline)) int mt_unwind(uintptr_t *out, int max, int *same) {
    struct mt_walk_start at;
#if defined(__x86_64__)
    __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2"
                     : "=r"(at.ip), "=r"(at.sp), "=r"(at.bp));
#else
    __asm__ volatile("adr %0, .\n\tmov %1, sp\n\tmov %2, x29"
                     : "=r"(at.ip), "=r"(at.sp), "=r"(at.bp));
#endif
    return walk(&at, out, max, same, 0);
}

static __attribute__((noinline)) MT_READS_STACK int walk_lazy(const struct mt_walk_start *at,
                                                              uintptr_t *out, int max, int *same) {
    return walk(at, out, max, same, 1);
}

MT_READS_STACK int mt_unwind_repeats(const struct mt_walk_start *at, int max) {
    /* Proved by the previous walk's checks, in the same thread stack (sp is
     * the walk's own). */
    return last_gen == atomic_load_explicit(&mt_rules_generation, memory_order_relaxed) &&
           repeats(at->ip, at->sp, at->bp, max) && top_of_stack(at->sp, &(int){0});
}

MT_READS_STACK int mt_unwind_check(const struct mt_walk_start *at, uintptr_t *out, int max,
                                   int *same) {
    /* The common case first, before the walk's frame is set up: the same
     * stack as last time. */
    if (mt_unwind_repeats(at, max)) {
        *same = 1;
        return last_n < max ? last_n : max;
    }
    return walk_lazy(at, out, max, same);
}

void mt_unwind_last(uintptr_t *out, int n) {
    for (int i = 0; i < n && i < last_n; i++)
        out[i] = w->last.ip[i];
}

/* ---- proofs of a walk, kept elsewhere -------------------------------- */

MT_READS_STACK int mt_unwind_prove(struct mt_walk_proof *p, struct mt_stack_check *c, int cap,
                                   int max) {
    int n = fresh_n;
    fresh_n = 0;
    p->sp = 0; /* no stack's, until the proof is whole (a stack pointer is never 0) */
    if (!n || max != last_max || (p->n = collect_checks(n - 1, c, cap)) < 0)
        return 0;
    p->ip = w->last.ip[0];
    p->sp = w->last.sp[0];
    p->bp = w->last.bp[0];
    p->needs_bp = (w->last.flags[0] & F_NEEDS_BP) != 0;
    p->gen = last_gen;
    p->max = max;
    return 1;
}

int mt_unwind_stack_holds(uintptr_t lo, uintptr_t hi) {
    return stack_low && lo < hi && lo >= stack_low && hi <= stack_top;
}

void mt_unwind_thread_exit(void) {
    struct walker *m = w;
    /* In this order, whatever a signal handler's malloc finds in between:
     * no walk to reuse before the memory goes, which later walks of this
     * thread (other exit handlers' mallocs) then do without. */
    last_n = fresh_n = 0;
    chk_n = -1;
    atomic_signal_fence(memory_order_seq_cst);
    w = GONE;
    atomic_signal_fence(memory_order_seq_cst);
    if (m && m != GONE)
        munmap(m, sizeof *m);
}
