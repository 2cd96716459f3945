/*
 * The tracker: everything a hook does besides calling the C library.  It
 * decides whether a call is tracked (the gate, this thread's state,
 * sampling), counts it, records and forgets blocks in the table with their
 * stacks, and keeps that consistent across threads, fork and thread exit.
 *
 * A hook is a libc call plus tracker calls, e.g.
 *     if (mt_will_record(MT_FN_VALLOC, n))
 *         return mt_recorded(libc_valloc(n), n);
 *     return libc_valloc(n);
 * The decisions are inline (one load and compare while tracking is off);
 * the work behind them is out of line.  Tracking happens only after the
 * real call succeeded, and a free forgets its block *before* the block goes
 * back to libc: otherwise another thread could be handed the same address
 * and record it first.
 */
#ifndef MT_TRACKER_H
#define MT_TRACKER_H

#include <stddef.h>
#include <stdint.h>

#include "counters.h"
#include "mtrace_api.h"
#include "sampling.h"
#include "state.h"
#include "table.h"

#define MT_TLS __thread __attribute__((tls_model("initial-exec")))
#define mt_likely(x) __builtin_expect(!!(x), 1)
#define mt_unlikely(x) __builtin_expect(!!(x), 0)

/* Why this thread's calls pass straight through. */
enum mt_busy {
    MT_BUSY_NO,
    MT_BUSY_UNWINDING, /* capturing a stack: nested allocations (libunwind, dlsym)
                        * pass untracked, nested frees still forget */
    MT_BUSY_LOCKED,    /* holding a table or stack lock, or forking: everything
                        * passes, so a signal handler's malloc cannot deadlock */
};

/* Per-thread switches, readable as one word: the fast paths test them all
 * with a single compare against MT_THREAD_FAST. */
union mt_thread_flags {
    struct {
        unsigned char busy;        /* enum mt_busy */
        unsigned char ignored;     /* mt_thread_ignore */
        unsigned char calling_out; /* mt_tracker_call_out */
        unsigned char registered;  /* counts visible to stats */
    } b;
    uint32_t any;
};
#define MT_THREAD_FAST ((union mt_thread_flags){.b = {MT_BUSY_NO, 0, 0, 1}}.any)

/* All per-thread state in one initial-exec TLS block: one address to
 * compute per call, nothing allocated on a thread's first use. */
#define MT_DEFERRED_MAX 8
struct mt_thread {
    union mt_thread_flags f;
    unsigned char fork_saved_busy;
    unsigned char counts_state; /* MT_COUNTS_* */
    unsigned char deferred_n;   /* frees deferred (mt_free_slow), in deferred[] */
    struct mt_counts *counts;   /* the registry's, while f.b.registered */
    struct mt_sampler sampler;
    void *deferred[MT_DEFERRED_MAX];
};
extern MT_TLS struct mt_thread mt_me;

/* Out of line: the work behind the decisions below. */
int mt_will_record_slow(enum mtrace_fn fn, size_t n);
void mt_record_now(void *p, size_t n);
int mt_free_slow(void *p);       /* after a free verdict of 1; 1: deferred, not to be freed now */
void mt_free_deferred(void);     /* the frees deferred, made once the tracker is left */
void mt_seen(enum mtrace_fn fn); /* counts a call that allocates nothing */

static inline enum mt_gate mt_gate(void) {
    return (enum mt_gate)atomic_load_explicit(&mt_state.gate, memory_order_relaxed);
}

/* What the inline first look at a call decided. */
enum mt_verdict {
    MT_PASS,    /* untracked, or counted and skipped by sampling: straight to libc */
    MT_RECORD,  /* counted; its block is to be recorded */
    MT_CROSSED, /* counted; sampling's countdown crossed zero: mt_decide */
    MT_ASK,     /* not counted yet; the slow path decides: mt_decide */
};

/* The first look, inline and free of calls, so that a hook's common cases
 * (switched off, skipped by sampling) end in a tail call to libc with no
 * stack frame to set up. */
static inline enum mt_verdict mt_verdict(enum mtrace_fn fn, size_t n) {
    enum mt_gate g = mt_gate();
    if (mt_likely(g <= MT_GATE_LIBC))
        return MT_PASS;
    /* This thread neither inside the tracer nor ignored, and its counters
     * registered; then setup and lossless are told from sampling, the
     * mode this order keeps shortest, by one compare. */
    if (mt_unlikely(mt_me.f.any != MT_THREAD_FAST))
        return MT_ASK;
    if (mt_unlikely(g <= MT_GATE_TRACK))
        return g == MT_GATE_TRACK ? (mt_counts_bump(mt_me.counts, fn), MT_RECORD) : MT_ASK;
    mt_counts_bump(mt_me.counts, fn);
    return mt_likely(mt_sample_skip(&mt_me.sampler, n)) ? MT_PASS : MT_CROSSED;
}

/* A sampled block is to be recorded: its walk is one of few (returns 1). */
int mt_tracker_sampled(void);

/* The rest of the decision: 1 when the block is to be recorded. */
static inline int mt_decide(enum mt_verdict v, enum mtrace_fn fn, size_t n) {
    switch (v) {
    case MT_PASS:
        return 0;
    case MT_RECORD:
        return 1;
    case MT_CROSSED:
        return mt_sample_crossed(&mt_me.sampler, n) && mt_tracker_sampled();
    default:
        return mt_will_record_slow(fn, n);
    }
}

/* Both at once: will the block this call returns (n bytes) be recorded?
 * Counts the call when it is tracked. */
static inline int mt_will_record(enum mtrace_fn fn, size_t n) {
    return mt_decide(mt_verdict(fn, n), fn, n);
}

/* Records p (when the call succeeded) and returns it. */
static inline void *mt_recorded(void *p, size_t n) {
    if (p)
        mt_record_now(p, n);
    return p;
}

/* The first look at a free, inline and free of calls: 0 when p goes
 * straight back to libc (the free counted if tracked), else what must be
 * done before it: 1 mt_free_slow (decide, count, forget), 2
 * mt_forget_counted (the free counted).  Lossless, every block is asked
 * for in the table; sampling or switched off, most frees are answered by
 * the table's lock-free filter (a NULL p too: the slow paths know it). */
static inline int mt_free_verdict(void *p) {
    enum mt_gate g = mt_gate();
    if (mt_likely(g == MT_GATE_INERT))
        return 0;
    if (g == MT_GATE_LIBC) /* not counted */
        return mt_unlikely(mt_table_may_hold((uintptr_t)p)) ? 1 : 0;
    if (mt_unlikely(mt_me.f.any != MT_THREAD_FAST || g == MT_GATE_SETUP))
        return 1;
    mt_counts_bump(mt_me.counts, MT_FN_FREE);
    if (g == MT_GATE_TRACK) /* lossless: the filter is not kept (table.h) */
        return p ? 2 : 0;
    return mt_unlikely(mt_table_may_hold((uintptr_t)p)) ? 2 : 0;
}

/* After a free verdict of 2: a tracked thread's free of a block the table
 * may hold, all that forgetting asks. */
static inline void mt_forget_counted(void *p) {
    mt_me.f.b.busy = MT_BUSY_LOCKED;
    mt_table_forget((uintptr_t)p);
    mt_me.f.b.busy = MT_BUSY_NO;
    /* (not here: the frees a handler deferred meanwhile are made at this
     * thread's next record or leave, mt_free_deferred, off a free's path) */
}

/* A realloc moves a block: its old entry is taken out before the call and
 * put back if the call fails (the block is then still allocated). */
struct mt_realloc {
    int track, had, saved_errno;
    struct mt_entry old;
};
void mt_realloc_begin(struct mt_realloc *r, void *p, size_t n, enum mtrace_fn fn);
void *mt_realloc_end(const struct mt_realloc *r, void *q, size_t n);

/* Code was unloaded (dlclose): its unwind rules must not be used again. */
void mt_tracker_code_unloaded(void);

/* Keeps the calling thread out of the table while it holds the tracker's
 * locks or works on its own; returns what mt_tracker_leave must restore.
 * Nothing of the tracker's allocates meanwhile, so a call made then is a
 * signal handler's (counted, and its block as dropped: the thread may hold
 * a lock the record needs). */
unsigned char mt_tracker_enter(void);
void mt_tracker_leave(unsigned char was);

/* The same around calls into others' code that may allocate (dlsym, a
 * key's pthread_setspecific, loading libunwind, other libraries' fork
 * handlers): what it allocates is the tracer's doing, passed to libc and
 * not counted.  Returns what mt_tracker_call_back must restore. */
unsigned char mt_tracker_call_out(void);
void mt_tracker_call_back(unsigned char was);

/* Blocks allocated by a signal handler while its thread was inside the
 * tracker, which could not be recorded (part of stats' dropped). */
uint64_t mt_tracker_dropped(void);

/* fork.c's handlers, installed once by the constructor; and what a fork
 * child must undo of the tracker's own (tracker.c). */
void mt_fork_install(void);
void mt_tracker_forked(void);

/* For the contract (api.c): tracking switch, reader threads, counters. */
int mt_tracker_active(void); /* configures on the first call */
void mt_tracker_set_enabled(int on);
uint64_t mt_tracker_reset(void); /* the table's, and the gate after it */
int mt_thread_ignore(int on);

#endif
