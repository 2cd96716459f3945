/*
 * The tracker (see tracker.h): the gate and the process's set-up, thread
 * state, counting and record/forget (a thread's registration and exit:
 * threads.c; fork: fork.c).
 */
#define _GNU_SOURCE
#include "tracker.h"

#include <errno.h>
#include <sched.h>

#include "erlang_frames.h"
#include "libc.h"
#include "objects.h"
#include "stacks.h"
#include "threads.h"
#include "unwind.h"
#include "unloads.h"
#include "unwind_fallback.h"

extern char **__environ;

MT_TLS struct mt_thread mt_me;

/* ---- the gate ------------------------------------------------------------ */

/* Tracking is off in a traced process: frees must still ask the filter
 * while the table holds blocks recorded before (LIBC), but with an empty
 * table they need not, and a tracer loaded switched off (MTRACE_ENABLED=0,
 * or disabled and reset) costs what interposing costs (INERT).  Decided
 * with every shard lock held: an insert that was under way as tracking went
 * off either finished before (the table is not empty) or takes its lock
 * after, then finds INERT and puts LIBC back (insert()). */
static void gate_off(void) {
    unsigned char was = mt_tracker_enter(); /* no malloc may wait on the locks */
    mt_table_lock_all();
    struct mt_table_figures t;
    mt_table_figures(&t);
    int libc = MT_GATE_LIBC; /* unless switched on again meanwhile */
    if (!t.live_count)
        atomic_compare_exchange_strong(&mt_state.gate, &libc, MT_GATE_INERT);
    mt_table_unlock_all();
    mt_tracker_leave(was);
}

/* One gate change at a time: the filter must be exact before the gate
 * leaves TRACK (table.h), and two changes at once could leave it unkept
 * behind a gate that asks it. */
static mt_spinlock gate_turn;

static void update_gate(void) {
    if (atomic_load(&mt_state.mode) == MT_MODE_ORPHANED) /* its locks may be held for ever */
        return;
    unsigned char was = mt_tracker_enter(); /* a rebuild holds shard locks */
    mt_lock(&gate_turn);
    enum mt_mode m = atomic_load(&mt_state.mode);
    /* A provisional configuration may have recorded blocks.  (Not from the
     * shards' figures: reading them faults in some 20 pages in every untraced
     * program.) */
    uint64_t held = mt_table_mapped();
    enum mt_gate g = m == MT_MODE_UNCONFIGURED || m == MT_MODE_CONFIGURING ? MT_GATE_SETUP
                     : m == MT_MODE_INERT && !held                         ? MT_GATE_INERT
                     : !mt_state_tracking_on()                             ? MT_GATE_LIBC
                     : mt_state.sample_mean                                ? MT_GATE_SAMPLE
                                                                           : MT_GATE_TRACK;
    if (g != MT_GATE_TRACK)
        mt_table_filter_keep(1);
    atomic_store(&mt_state.gate, g);
    if (g == MT_GATE_TRACK)
        mt_table_filter_keep(0);
    if (g == MT_GATE_LIBC && m == MT_MODE_ACTIVE)
        gate_off();
    mt_unlock(&gate_turn);
    mt_tracker_leave(was);
}

static void configure(void) {
    mt_state_configure();
    if (mt_state.cfg.active) { /* what only a traced process needs */
        mt_stacks_init();
        mt_clock_init();
        unsigned char was = mt_tracker_call_out();
        mt_objects_init(); /* dlsym may allocate */
        mt_tracker_call_back(was);
    }
    atomic_store(&mt_state.mode, mt_state.cfg.active ? MT_MODE_ACTIVE : MT_MODE_INERT);
    update_gate();
}

/* First call of any hook, possibly before constructors.  errno is kept:
 * finding the program's name may fail (no /proc), and neither the call that
 * configures nor main in an untraced child may see that. */
static void setup(void) {
    int expected = MT_MODE_UNCONFIGURED;
    if (!atomic_compare_exchange_strong(&mt_state.mode, &expected, MT_MODE_CONFIGURING)) {
        for (unsigned yields = 0; atomic_load(&mt_state.mode) == MT_MODE_CONFIGURING;)
            mt_backoff(&yields);
        return;
    }
    int saved_errno = errno;
    unsigned char was = mt_tracker_call_out(); /* dlsym may allocate */
    mt_libc_resolve();                         /* before this first call reaches libc */
    mt_state.provisional = (__environ == NULL);
    configure();
    mt_tracker_call_back(was);
    errno = saved_errno;
}

/* Whether this process is traced; the first call configures it. */
static inline int ready(void) {
    enum mt_mode m = atomic_load_explicit(&mt_state.mode, memory_order_relaxed);
    if (m == MT_MODE_ACTIVE)
        return 1;
    if (m == MT_MODE_UNCONFIGURED && !mt_me.f.b.busy) {
        setup();
        return atomic_load(&mt_state.mode) == MT_MODE_ACTIVE;
    }
    return 0;
}

/* Is this call to be counted, and its block considered for the table? */
static inline int tracking(void) {
    enum mt_gate g = mt_gate();
    if (mt_likely(g <= MT_GATE_LIBC))
        return 0;
    if (mt_unlikely(g == MT_GATE_SETUP) &&
        !(ready() && atomic_load_explicit(&mt_state.enabled, memory_order_relaxed)))
        return 0;
    return !(mt_me.f.b.busy | mt_me.f.b.ignored);
}

/* ---- threads and counting ------------------------------------------------ */

/* A thread registers on its first counted call, but not for a free(NULL):
 * glibc's last clean-up of an exiting thread makes those after the TLS
 * destructors, too late for thread_exit to give its struct back. */
static inline void count_as(enum mtrace_fn fn, int may_register) {
    if (mt_unlikely(!mt_me.f.b.registered)) {
        if (mt_me.counts_state == MT_COUNTS_NEW && may_register)
            mt_thread_register();
        if (!mt_me.f.b.registered) {
            mt_counts_shared_add(fn);
            mt_shared_calls++;
            return;
        }
    }
    mt_counts_bump(mt_me.counts, fn);
}

static inline void count(enum mtrace_fn fn) { count_as(fn, 1); }

/* ---- a signal handler's calls while its thread is inside the tracker ---- */

/* Blocks allocated then, which cannot be recorded (mt_record_now). */
static _Atomic uint64_t handler_dropped;

uint64_t mt_tracker_dropped(void) {
    return atomic_load_explicit(&handler_dropped, memory_order_relaxed);
}

/* A call tracking() turned away because this thread is inside the tracker,
 * but neither the tracker's own (it allocates nothing there) nor made by
 * code it called out to (mt_tracker_call_out, a libunwind walk): a signal
 * handler's, which interrupted it.  Such a call is counted, atomically, as
 * the handler may have interrupted the thread's own counting. */
static inline int handler_context(void) {
    /* libunwind allocates only in a thread's first walk (its per-thread
     * cache): a later walk's calls are a handler's */
    return mt_me.f.b.busy && !mt_me.f.b.calling_out && !mt_me.f.b.ignored &&
           !(mt_fallback_running() && !mt_fallback_warm());
}
static inline int in_handler(void) { return handler_context() && mt_gate() >= MT_GATE_TRACK; }

/* Out of the way of a record's path, which tests for it first. */
static __attribute__((cold, noinline)) void handler_block(void) {
    atomic_fetch_add_explicit(&handler_dropped, 1, memory_order_relaxed);
}

void mt_seen(enum mtrace_fn fn) {
    if (tracking())
        count(fn);
    else if (mt_unlikely(in_handler()))
        mt_counts_shared_add(fn);
}

/* Whether a block of n bytes is to be recorded; a sampled one, as on the
 * hooks' inline path, by way of mt_tracker_sampled. */
static int sample(size_t n) {
    if (!mt_sample_take(&mt_me.sampler, n))
        return 0;
    return !mt_state.sample_mean || mt_tracker_sampled();
}

/* A handler's allocation goes on as any other (sampling may choose it);
 * mt_record_now then counts its block as dropped. */
int mt_will_record_slow(enum mtrace_fn fn, size_t n) {
    if (tracking())
        count(fn);
    else if (mt_unlikely(in_handler()))
        mt_counts_shared_add(fn);
    else
        return 0;
    return sample(n);
}

unsigned char mt_tracker_enter(void) {
    unsigned char was = mt_me.f.b.busy;
    mt_me.f.b.busy = MT_BUSY_LOCKED;
    return was;
}

void mt_tracker_leave(unsigned char was) {
    mt_me.f.b.busy = was;
    if (mt_unlikely(mt_me.deferred_n) && was == MT_BUSY_NO)
        mt_free_deferred();
}

/* A count, not a flag: calls out nest (setup configures). */
unsigned char mt_tracker_call_out(void) {
    mt_me.f.b.calling_out++;
    return mt_tracker_enter();
}

void mt_tracker_call_back(unsigned char was) {
    mt_tracker_leave(was);
    mt_me.f.b.calling_out--;
}

/* ---- record and forget --------------------------------------------------- */

static void insert(uint64_t addr, uint64_t size, uint64_t t_ms, uint32_t stack) {
    mt_me.f.b.busy = MT_BUSY_LOCKED;
    mt_table_insert(addr, size, t_ms, stack);
    /* Tracking went off, with an empty table, while this block was being
     * recorded: its free must ask the filter (see gate_off). */
    if (mt_unlikely(mt_gate() == MT_GATE_INERT)) {
        int inert = MT_GATE_INERT;
        atomic_compare_exchange_strong(&mt_state.gate, &inert, MT_GATE_LIBC);
    }
}

/* The walk starts in the hook that called this (or the tracker function
 * between them): its frame and the caller of malloc are all that is walked. */
__attribute__((noinline)) void mt_record_now(void *p, size_t size) {
    if (mt_unlikely(mt_me.f.b.busy)) /* a signal handler's block (in_handler) */
        return handler_block();
    struct mt_walk_start at = MT_WALK_START_CALLER();
    int *err = &errno, saved = *err; /* unwinding and mmap must not disturb what libc set */
    mt_me.f.b.busy = MT_BUSY_UNWINDING;
    uint32_t stack = mt_stack_capture(&at, mt_state.cfg.depth);
    insert((uintptr_t)p, size, mt_now_ms(), stack);
    mt_me.f.b.busy = MT_BUSY_NO;
    if (mt_unlikely(mt_me.deferred_n))
        mt_free_deferred();
    *err = saved;
}

static inline int forget_now(void *p, struct mt_entry *old) {
    unsigned char was = mt_tracker_enter();
    int found = mt_table_remove((uintptr_t)p, old);
    mt_tracker_leave(was);
    return found;
}

/* Removes p from the table; returns 1 (and the entry) if it was recorded. */
static inline int forget(void *p, struct mt_entry *old) {
    if (!p || mt_me.f.b.busy >= MT_BUSY_LOCKED ||
        (mt_table_filter_exact() && !mt_table_may_hold((uintptr_t)p)))
        return 0;
    return forget_now(p, old);
}

/* A signal handler's free of a block the table may hold, while its thread
 * holds a table lock (busy LOCKED), cannot forget the block (the lock may
 * be the one held), nor give it back (its entry would outlive it): it waits
 * in the thread's state until the thread leaves the tracker.  Beyond
 * MT_DEFERRED_MAX, a free goes through unforgotten, as one the interposer
 * did not see (replaced when its address is recorded again).  The count
 * moves by compare-and-swap of the thread's own byte, so that a handler
 * interrupting a push or a pop never takes a place or a block twice: a
 * place is claimed before it is written, and a pop runs with busy LOCKED,
 * when handlers push and never pop. */
static int defer(void *p) {
    unsigned char n = __atomic_load_n(&mt_me.deferred_n, __ATOMIC_RELAXED);
    do
        if (n >= MT_DEFERRED_MAX)
            return 0;
    while (!__atomic_compare_exchange_n(&mt_me.deferred_n, &n, (unsigned char)(n + 1), 0,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    mt_me.deferred[n] = p;
    atomic_signal_fence(memory_order_seq_cst); /* written before the handler returns */
    return 1;
}

/* One deferred free, taken off the list; NULL when there is none. */
static void *pop_deferred(void) {
    unsigned char was = mt_tracker_enter(); /* handlers push, never pop */
    unsigned char n = __atomic_load_n(&mt_me.deferred_n, __ATOMIC_RELAXED);
    void *p = NULL;
    /* a handler may push meanwhile (the count grows): try again */
    while (n && (p = mt_me.deferred[n - 1],
                 !__atomic_compare_exchange_n(&mt_me.deferred_n, &n, (unsigned char)(n - 1), 0,
                                              __ATOMIC_RELAXED, __ATOMIC_RELAXED)))
        p = NULL;
    mt_me.f.b.busy = was;
    return p;
}

__attribute__((cold, noinline)) void mt_free_deferred(void) {
    for (void *p; (p = pop_deferred());) {
        forget(p, NULL); /* counted already: forgotten, then given back */
        libc_free(p);
    }
}

__attribute__((noinline)) int mt_free_slow(void *p) {
    enum mt_gate g = mt_gate();
    if (mt_unlikely(g == MT_GATE_SETUP) && !ready())
        return 0;
    if (g > MT_GATE_LIBC && tracking())
        count_as(MT_FN_FREE, p != NULL);
    else if (mt_unlikely(handler_context())) {
        if (g >= MT_GATE_TRACK) /* counted while tracking is on */
            mt_counts_shared_add(MT_FN_FREE);
        /* and deferred while the table may hold its block (tracking off
         * with entries left too) */
        if (p && g > MT_GATE_INERT && mt_me.f.b.busy >= MT_BUSY_LOCKED &&
            (!mt_table_filter_exact() || mt_table_may_hold((uintptr_t)p)))
            return defer(p);
    }
    forget(p, NULL);
    return 0;
}

/* realloc(p, 0) returns NULL both when it freed p (glibc, jemalloc's
 * default) and when it failed to allocate a smallest block (musl, the BSDs,
 * any allocator out of memory), p then still allocated: only errno tells,
 * ENOMEM for a failure.  So it is cleared around such a call, and the
 * caller's put back unless the call failed. */
void mt_realloc_begin(struct mt_realloc *r, void *p, size_t n, enum mtrace_fn fn) {
    r->track = r->had = 0;
    if (n == 0) {
        r->saved_errno = errno;
        errno = 0;
    }
    if (!ready())
        return;
    r->track = tracking();
    if (r->track)
        count(fn);
    else if (mt_unlikely(in_handler())) {
        mt_counts_shared_add(fn);
        r->track = 1; /* its block counted as dropped (mt_record_now) */
    }
    r->had = forget(p, &r->old);
}

void *mt_realloc_end(const struct mt_realloc *r, void *q, size_t n) {
    int failed = !q && (n != 0 || errno == ENOMEM);
    if (n == 0 && !failed)
        errno = r->saved_errno;
    if (q) {
        if (r->track && sample(n))
            mt_record_now(q, n);
    } else if (r->had && failed) { /* p is still allocated */
        int saved = errno;
        unsigned char was = mt_me.f.b.busy;
        insert(r->old.addr, r->old.size, r->old.t_ms, r->old.stack);
        mt_tracker_leave(was);
        errno = saved;
    }
    return q;
}

void mt_tracker_code_unloaded(void) { mt_unwind_forget(); }

/* Sampled walks are few: see mt_unwind_check_loads. */
int mt_tracker_sampled(void) {
    mt_unwind_check_loads(mt_now_ms());
    return 1;
}

/* ---- load ---------------------------------------------------------------- */

/* In a fork child (fork.c): perhaps held by a thread that did not come along. */
void mt_tracker_forked(void) {
    mt_threads_forked();
    mt_unlock(&gate_turn);
}

/* The environment is readable now.  Blocks recorded under a provisional
 * configuration (lossless: it cannot see MTRACE_SAMPLE_BYTES) weigh what
 * that configuration said; under another sampling mean their frees would
 * take off weights never added, so they are forgotten, as by a reset. */
static void reconfigure(void) {
    uint64_t mean = mt_state.sample_mean;
    configure();
    mt_state.provisional = 0;
    if (mt_state.sample_mean != mean && mt_table_mapped())
        mt_tracker_reset();
}

__attribute__((constructor)) static void on_load(void) {
    int saved_errno = errno; /* main starts with the errno it would have had */
    if (atomic_load(&mt_state.mode) == MT_MODE_UNCONFIGURED)
        setup();
    else if (mt_state.provisional)
        reconfigure();
    unsigned char was = mt_tracker_call_out();
    if (atomic_load(&mt_state.mode) == MT_MODE_ACTIVE) {
        mt_fallback_load(); /* allocates */
        /* MTRACE_UNWIND=libunwind without libunwind (libunwind8 not
         * installed) would take no stack at all: the own walker takes
         * them, and stats says why. */
        if (!mt_state.fast_unwind && !mt_fallback_loaded()) {
            mt_state.fast_unwind = 1;
            mt_state.cfg.garbage |= MT_GARBAGE_NO_LIBUNWIND;
        }
    }
    mt_tracker_call_back(was);
    if (atomic_load(&mt_state.mode) == MT_MODE_ACTIVE) {
        mt_fork_install();
        mt_threads_loaded();
        mt_unloads_started();
    }
    errno = saved_errno;
}

/* ---- for the contract ---------------------------------------------------- */

int mt_tracker_active(void) { return ready(); }

void mt_tracker_set_enabled(int on) {
    atomic_store(&mt_state.enabled, on != 0);
    update_gate();
}

uint64_t mt_tracker_reset(void) {
    unsigned char was = mt_tracker_enter(); /* every lock is held meanwhile */
    uint64_t forgotten = mt_table_reset();
    atomic_store(&mt_state.reset_ms, mt_now_ms()); /* marks before it lost their past */
    mt_tracker_leave(was);
    if (atomic_load(&mt_state.mode) == MT_MODE_ACTIVE && !mt_state_tracking_on())
        gate_off(); /* now empty: frees need not ask */
    return forgotten;
}

int mt_thread_ignore(int on) {
    int was = mt_me.f.b.ignored;
    mt_me.f.b.ignored = on != 0;
    return was;
}
