/*
 * The malloc-family interposer preloaded into beam.smp (and, through the
 * inherited LD_PRELOAD, into every program it starts).
 *
 * Every function forwards to glibc's own entry points (__libc_malloc & co.),
 * which exist before any constructor runs, so there is no dlsym bootstrap
 * problem.  Tracking happens only after the real call succeeded, and a free
 * forgets its block *before* the block goes back to libc: otherwise another
 * thread could be handed the same address and record it first.
 *
 * Per-thread state sits in initial-exec TLS (no allocation on first use):
 *   busy = 1 while this thread unwinds: nested allocations (libunwind, dlsym)
 *            pass through untracked, nested frees still forget;
 *   busy = 2 while it holds a table or stack lock (or forks): everything
 *            passes through, so a signal handler's malloc cannot deadlock.
 */
#define _GNU_SOURCE
#include "interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "counters.h"
#include "erlang_frames.h"
#include "sampling.h"
#include "stacks.h"
#include "table.h"
#include "unwind.h"

#ifndef __GLIBC__
#error "the interposer forwards to glibc's __libc_* entry points"
#endif

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern char **__environ;

enum { MODE_UNINIT, MODE_INIT, MODE_INERT, MODE_ACTIVE };

static _Atomic int mode = MODE_UNINIT;
static _Atomic int enabled;
/* The one word every call reads first: GATE_INERT means straight to libc,
 * frees included (this process is not traced and its table never held a
 * block); GATE_LIBC straight to libc too, but frees ask the table's
 * lock-free filters (tracking is switched off, and blocks recorded before
 * must still be forgotten); GATE_SETUP that the first call must configure,
 * GATE_TRACK that calls are counted and blocks recorded, GATE_SAMPLE the
 * same with MTRACE_SAMPLE_BYTES choosing the blocks. */
enum { GATE_INERT, GATE_LIBC, GATE_SETUP, GATE_TRACK, GATE_SAMPLE };
static _Atomic int gate = GATE_SETUP;
static int provisional; /* configured before libc had set up the environment */
static struct mt_config cfg;

/* Per-thread switches, readable as one word: the fast paths test them all
 * with a single compare against FAST_OK. */
union flags {
    struct {
        unsigned char busy;    /* see the top of this file */
        unsigned char ignored; /* mt_thread_ignore */
        unsigned char spare;
        unsigned char registered; /* counts visible to stats */
    } b;
    uint32_t any;
};
static const union flags FAST_OK = {.b = {0, 0, 0, 1}};

/* All per-thread state in one initial-exec TLS block: one address to
 * compute per call, nothing allocated on a thread's first use. */
static TLS struct {
    union flags f;
    unsigned char fork_saved_busy;
    struct mt_counts counts;
    struct mt_sampler sampler;
} me;
static pthread_key_t exit_key;
static int exit_key_made;

static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);

static void update_gate(void) {
    int m = atomic_load(&mode);
    int on = m == MODE_ACTIVE && atomic_load(&enabled);
    struct mt_table_figures t;
    mt_table_figures(&t); /* a provisional configuration may have recorded blocks */
    atomic_store(&gate, m == MODE_UNINIT || m == MODE_INIT  ? GATE_SETUP
                        : m == MODE_INERT && !t.table_bytes ? GATE_INERT
                        : !on                               ? GATE_LIBC
                        : mt_sample_mean                    ? GATE_SAMPLE
                                                            : GATE_TRACK);
}

static void configure(void) {
    mt_config_load(&cfg);
    mt_sample_mean = cfg.active ? cfg.sample_bytes : 0;
    mt_stacks_fast_unwind = cfg.fast_unwind;
    mt_erl_allow(cfg.erlang);
    if (cfg.active)
        mt_stacks_init();
    atomic_store(&enabled, cfg.enabled);
    atomic_store(&mode, cfg.active ? MODE_ACTIVE : MODE_INERT);
    update_gate();
}

/* First call of any interposed function, possibly before constructors. */
static void init(void) {
    int expected = MODE_UNINIT;
    if (!atomic_compare_exchange_strong(&mode, &expected, MODE_INIT)) {
        while (atomic_load(&mode) == MODE_INIT)
            sched_yield();
        return;
    }
    me.f.b.busy = 2;
    provisional = (__environ == NULL);
    configure();
    me.f.b.busy = 0;
}

static inline int ready(void) {
    int m = atomic_load_explicit(&mode, memory_order_relaxed);
    if (m == MODE_ACTIVE)
        return 1;
    if (m == MODE_UNINIT && !me.f.b.busy) {
        init();
        return atomic_load(&mode) == MODE_ACTIVE;
    }
    return 0;
}

/* Is this call to be counted, and its block considered for the table? */
static inline int tracking(void) {
    int g = atomic_load_explicit(&gate, memory_order_relaxed);
    if (likely(g <= GATE_LIBC))
        return 0;
    if (unlikely(g == GATE_SETUP) &&
        !(ready() && atomic_load_explicit(&enabled, memory_order_relaxed)))
        return 0;
    return !(me.f.b.busy | me.f.b.ignored);
}

/* Thread exit (a pthread key destructor): fold this thread's counts. */
static void thread_exit(void *unused) {
    (void)unused;
    mt_counts_retire(&me.counts); /* state SHARED: later calls count atomically */
    me.f.b.registered = 0;
}

static __attribute__((noinline)) void register_thread(void) {
    unsigned char was = me.f.b.busy;
    me.f.b.busy = 2; /* a high key number makes pthread_setspecific allocate */
    mt_counts_register(&me.counts);
    me.f.b.registered = me.counts.state == MT_COUNTS_REGISTERED;
    if (me.f.b.registered && exit_key_made)
        pthread_setspecific(exit_key, (void *)1);
    me.f.b.busy = was;
}

static inline void count(enum mtrace_fn fn) {
    if (unlikely(!me.f.b.registered)) {
        if (me.counts.state == MT_COUNTS_NEW)
            register_thread();
        if (!me.f.b.registered) {
            mt_counts_shared_add(fn);
            return;
        }
    }
    mt_counts_bump(&me.counts, fn);
}

/* The coarse clock is the monotonic clock at tick resolution (1-4 ms): a
 * few ns per read instead of ~20, and allocation ages are what matter. */
uint64_t mt_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void insert(uint64_t addr, uint64_t size, uint64_t t_ms, uint32_t stack) {
    me.f.b.busy = 2;
    mt_table_insert(addr, size, t_ms, stack);
}

static __attribute__((noinline)) void record_now(void *p, size_t size) {
    int saved = errno; /* unwinding and mmap must not disturb what libc set */
    me.f.b.busy = 1;
    uint32_t stack = mt_stack_capture(cfg.depth);
    insert((uintptr_t)p, size, mt_now_ms(), stack);
    me.f.b.busy = 0;
    errno = saved;
}

/* Records a block the caller got for this thread (sampling decides). */
static inline void record(void *p, size_t size) {
    if (mt_sample_take(&me.sampler, size))
        record_now(p, size);
}

static __attribute__((noinline)) int forget_now(void *p, struct mt_slot *old) {
    unsigned char was = me.f.b.busy;
    me.f.b.busy = 2;
    int found = mt_table_remove((uintptr_t)p, old);
    me.f.b.busy = was;
    return found;
}

/* Removes p from the table; returns 1 (and the entry) if it was recorded.
 * Inline up to the table's lock-free filters, which answer most frees. */
static inline int forget(void *p, struct mt_slot *old) {
    if (!p || !mt_table_may_hold((uintptr_t)p) || me.f.b.busy >= 2)
        return 0;
    return forget_now(p, old);
}

/* Puts back an entry whose block turned out to stay alive (failed realloc). */
static void restore(const struct mt_slot *old) {
    int saved = errno;
    unsigned char was = me.f.b.busy;
    insert(old->addr, old->size, mt_slot_time(old), mt_slot_stack(old));
    me.f.b.busy = was;
    errno = saved;
}

/* malloc, calloc and free are split: the exported function holds only the
 * common cases (switched off; tracking a block that sampling skips) ending
 * in a tail call to libc, everything else sits in a noinline slow path. */
static inline int gate_open(void) {
    return atomic_load_explicit(&gate, memory_order_relaxed) > GATE_LIBC;
}

/* Tracking on (gate g), this thread neither inside the tracer nor ignored,
 * and its counters registered. */
static inline int tracking_fast(int g) { return g >= GATE_TRACK && me.f.any == FAST_OK.any; }

static void *malloc_recorded(size_t n) {
    void *p = __libc_malloc(n);
    if (p)
        record_now(p, n);
    return p;
}

/* The sampling decision comes first: an allocation that is not sampled
 * ends in a tail call to libc, with nothing to keep across it. */
static __attribute__((noinline)) void *malloc_slow(size_t n) {
    if (!tracking())
        return __libc_malloc(n);
    count(MT_FN_MALLOC);
    return mt_sample_take(&me.sampler, n) ? malloc_recorded(n) : __libc_malloc(n);
}

/* The fast path's countdown crossed zero (or was never started). */
static __attribute__((noinline)) void *malloc_sampled(size_t n) {
    return mt_sample_crossed(&me.sampler, n) ? malloc_recorded(n) : __libc_malloc(n);
}

EXPORT void *malloc(size_t n) {
    int g = atomic_load_explicit(&gate, memory_order_relaxed);
    if (likely(g <= GATE_LIBC))
        return __libc_malloc(n);
    if (likely(g == GATE_SAMPLE && me.f.any == FAST_OK.any)) {
        mt_counts_bump(&me.counts, MT_FN_MALLOC);
        if (likely(mt_sample_skip(&me.sampler, n)))
            return __libc_malloc(n);
        return malloc_sampled(n);
    }
    return malloc_slow(n);
}

static __attribute__((noinline)) void *calloc_slow(size_t n, size_t size) {
    if (!tracking())
        return __libc_calloc(n, size);
    count(MT_FN_CALLOC);
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes) || !mt_sample_take(&me.sampler, bytes))
        return __libc_calloc(n, size); /* an overflow fails in libc, as it should */
    void *p = __libc_calloc(n, size);
    if (p)
        record_now(p, bytes);
    return p;
}

EXPORT void *calloc(size_t n, size_t size) {
    if (unlikely(gate_open()))
        return calloc_slow(n, size);
    return __libc_calloc(n, size);
}

static __attribute__((noinline)) void free_slow(void *p, int counted) {
    int g = atomic_load_explicit(&gate, memory_order_relaxed);
    if (unlikely(g == GATE_SETUP) && !ready()) {
        __libc_free(p);
        return;
    }
    if (!counted && g > GATE_LIBC && tracking())
        count(MT_FN_FREE);
    forget(p, NULL);
    __libc_free(p);
}

EXPORT void free(void *p) {
    int counted = 0, g = atomic_load_explicit(&gate, memory_order_relaxed);
    if (likely(g == GATE_INERT))
        return __libc_free(p);
    if (unlikely(g != GATE_LIBC)) {
        if (!tracking_fast(g))
            return free_slow(p, 0);
        mt_counts_bump(&me.counts, MT_FN_FREE);
        counted = 1;
    }
    if (unlikely(p && mt_table_may_hold((uintptr_t)p)))
        return free_slow(p, counted);
    __libc_free(p);
}

static void *tracked_realloc(void *p, size_t n, enum mtrace_fn fn) {
    if (!ready())
        return __libc_realloc(p, n);
    int track = tracking();
    if (track)
        count(fn);
    struct mt_slot old;
    int had = forget(p, &old);
    void *q = __libc_realloc(p, n);
    if (q) {
        if (track)
            record(q, n);
    } else if (had && n != 0) {
        restore(&old); /* failed: p is still allocated (n == 0 freed it) */
    }
    return q;
}

EXPORT void *realloc(void *p, size_t n) { return tracked_realloc(p, n, MT_FN_REALLOC); }

EXPORT void *reallocarray(void *p, size_t n, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        if (tracking())
            count(MT_FN_REALLOCARRAY);
        errno = ENOMEM; /* as glibc: p is left untouched */
        return NULL;
    }
    return tracked_realloc(p, bytes, MT_FN_REALLOCARRAY);
}

/* glibc's own posix_memalign/aligned_alloc validate alignment differently
 * across versions; calling them keeps errno and EINVAL behaviour exact.
 * Looked up in the constructor; the fallbacks only serve calls made earlier. */
static int fallback_posix_memalign(void **memptr, size_t al, size_t n) {
    if (al % sizeof(void *) != 0 || al == 0 || (al & (al - 1)) != 0)
        return EINVAL;
    void *p = __libc_memalign(al, n);
    if (!p)
        return ENOMEM;
    *memptr = p;
    return 0;
}

static int (*real_dlclose)(void *);

static void resolve_real(void) {
    unsigned char was = me.f.b.busy;
    me.f.b.busy = 2;
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    real_dlclose = dlsym(RTLD_NEXT, "dlclose");
    me.f.b.busy = was;
}

/* Unloaded code takes its unwind rules with it: the walker's cache must not
 * apply them to whatever is mapped at those addresses next. */
EXPORT int dlclose(void *handle) {
    if (!real_dlclose)
        resolve_real();
    int r = real_dlclose ? real_dlclose(handle) : -1;
    mt_unwind_forget();
    return r;
}

EXPORT int posix_memalign(void **memptr, size_t al, size_t n) {
    int (*real)(void **, size_t, size_t) =
        real_posix_memalign ? real_posix_memalign : fallback_posix_memalign;
    if (!tracking())
        return real(memptr, al, n);
    count(MT_FN_POSIX_MEMALIGN);
    int r = real(memptr, al, n);
    if (r == 0)
        record(*memptr, n);
    return r;
}

static void *recorded(void *p, size_t n) {
    if (p)
        record(p, n);
    return p;
}

EXPORT void *aligned_alloc(size_t al, size_t n) {
    void *(*real)(size_t, size_t) = real_aligned_alloc ? real_aligned_alloc : __libc_memalign;
    if (!tracking())
        return real(al, n);
    count(MT_FN_ALIGNED_ALLOC);
    return recorded(real(al, n), n);
}

EXPORT void *memalign(size_t al, size_t n) {
    if (!tracking())
        return __libc_memalign(al, n);
    count(MT_FN_MEMALIGN);
    return recorded(__libc_memalign(al, n), n);
}

EXPORT void *valloc(size_t n) {
    if (!tracking())
        return __libc_valloc(n);
    count(MT_FN_VALLOC);
    return recorded(__libc_valloc(n), n);
}

EXPORT void *pvalloc(size_t n) {
    if (!tracking())
        return __libc_pvalloc(n);
    count(MT_FN_PVALLOC);
    return recorded(__libc_pvalloc(n), n);
}

/* strdup/strndup are interposed so that frame 0 is their caller and the
 * counters match the seed's; glibc would call malloc from inside libc. */
static char *dup_bytes(const char *s, size_t len, enum mtrace_fn fn) {
    int track = tracking();
    if (track)
        count(fn);
    char *p = __libc_malloc(len + 1);
    if (!p)
        return NULL;
    memcpy(p, s, len);
    p[len] = 0;
    if (track)
        record(p, len + 1);
    return p;
}

EXPORT char *strdup(const char *s) { return dup_bytes(s, strlen(s), MT_FN_STRDUP); }

EXPORT char *strndup(const char *s, size_t n) { return dup_bytes(s, strnlen(s, n), MT_FN_STRNDUP); }

/* fork: hold every lock so the child inherits a consistent table, and keep
 * this thread out of the table meanwhile (fork itself may allocate). */
static void fork_prepare(void) {
    me.fork_saved_busy = me.f.b.busy;
    me.f.b.busy = 2;
    mt_counts_lock();
    mt_stacks_lock();
    mt_table_lock_all();
}

static void fork_parent(void) {
    mt_table_unlock_all();
    mt_stacks_unlock();
    mt_counts_unlock();
    me.f.b.busy = me.fork_saved_busy;
}

static void fork_child(void) {
    mt_counts_child(&me.counts); /* the other threads did not come along */
    mt_erl_forked();
    fork_parent();
}

__attribute__((constructor)) static void on_load(void) {
    if (atomic_load(&mode) == MODE_UNINIT)
        init();
    else if (provisional)
        configure(); /* the environment is readable now */
    resolve_real();
    if (atomic_load(&mode) == MODE_ACTIVE) {
        pthread_atfork(fork_prepare, fork_parent, fork_child);
        exit_key_made = pthread_key_create(&exit_key, thread_exit) == 0;
        if (exit_key_made && me.f.b.registered) /* registered before this constructor ran */
            pthread_setspecific(exit_key, (void *)1);
    }
}

void mt_sum_calls(uint64_t *out) { mt_counts_sum(out); }

uint32_t mt_depth(void) { return cfg.depth; }
int mt_is_active(void) { return ready(); }
int mt_is_enabled(void) { return mt_is_active() && atomic_load(&enabled); }
void mt_set_enabled(int on) {
    atomic_store(&enabled, on != 0);
    update_gate();
}
uint64_t mt_sample_bytes(void) { return mt_sample_mean; }
uint32_t mt_config_garbage(void) { return cfg.garbage; }

int mt_thread_ignore(int on) {
    int was = me.f.b.ignored;
    me.f.b.ignored = on != 0;
    return was;
}
