/*
 * Stack capture and interning (see stacks.h).
 *
 * Lookups are lock-free: a record is fully written before its id is
 * published in a bucket with a release store, and records are never moved
 * or freed.  Inserting a new stack takes one spinlock; after warm-up almost
 * every capture finds its stack already there.
 */
#include "stacks.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "eh_frame.h"
#include "erlang_frames.h"
#include "mtrace_api.h"
#include "objects.h"
#include "hash.h"
#include "recent_stacks.h"
#include "state.h"
#include "spinlock.h"
#include "unwind.h"
#include "unwind_fallback.h"
#include "unloads.h"

/* 2^17 buckets (512 KiB), mapped populated: hashing scatters even a few
 * hundred stacks over every page of the array, and faulting them in one by
 * one costs far more than populating them at once (a node's boot interns
 * ~900 stacks, which touched ~600 pages of a 4 MiB array).  Chains stay
 * short for realistic stack counts: ~2 records at 300,000 stacks.
 *
 * The array is wiped in a fork child (MADV_WIPEONFORK), not shared copy on
 * write: else every page the parent writes after a fork (the VM forks its
 * child setup process early in its boot) faults again.  The buckets hold
 * only the chain heads; the chains themselves are in the records, which the
 * child keeps, so a child rebuilds the heads on its first miss. */
#define BUCKET_BITS 17
#define DIR_BITS 12 /* ids = 2^DIR_BITS * 2^BLOCK_BITS = 2^24, the table's id width */
#define BLOCK_BITS 12
#define CHUNK_BYTES (1u << 20)
#define MAX_OWN_FRAMES 8  /* frames of this library above the caller of malloc */
#define MAX_HOOK_FRAMES 2 /* the same from a walk's start (mt_stack_capture's at) */

/* ips holds depth native return addresses, then erl Erlang frame pcs (the
 * key is all of them), then the erl frames' names and, with any, the
 * thread progress value at which they were last seen to hold. */
struct stack_rec {
    uint32_t next; /* next id in the bucket chain, 0 = end */
    uint32_t hash;
    uint16_t depth;
    uint16_t erl;
    _Atomic uint32_t epoch; /* its native frames' code was loaded as of it (unloads.h) */
    uintptr_t ips[];
};

static const struct mtrace_erl_frame *erl_names(const struct stack_rec *r) {
    return (const struct mtrace_erl_frame *)(r->ips + r->depth + r->erl);
}
static _Atomic uint64_t *erl_checked(const struct stack_rec *r) {
    return (_Atomic uint64_t *)(erl_names(r) + r->erl);
}

static _Atomic uint32_t *buckets;     /* head id per bucket, 0 = empty */
static _Atomic uint32_t *heads_valid; /* just after the buckets: 0 once wiped by a fork */
static struct stack_rec **_Atomic dir[1u << DIR_BITS];
static mt_spinlock insert_lock;
static _Atomic uint32_t next_id = 1;
static char *chunk, *chunk_end;
static _Atomic uint64_t mapped_bytes, dropped;
static _Atomic uint64_t erl_stacks; /* stacks with Erlang frames */

/* This library's own code, whose frames are not part of a reported stack.
 * Hidden references bind to this object's own linker-defined symbols. */
extern const char __ehdr_start[] __attribute__((visibility("hidden")));
extern const char etext[] __attribute__((visibility("hidden")));

static void *map(size_t bytes, int flags) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    atomic_fetch_add_explicit(&mapped_bytes, bytes, memory_order_relaxed);
    return p;
}

#define BUCKETS_BYTES (sizeof(*buckets) * ((1u << BUCKET_BITS) + 1))

void mt_stacks_init(void) {
    if (!buckets) {
        _Atomic uint32_t *b = map(BUCKETS_BYTES, MAP_POPULATE);
        if (b) {
#ifdef MADV_WIPEONFORK
            madvise((void *)b, BUCKETS_BYTES, MADV_WIPEONFORK); /* else shared: also correct */
#endif
            heads_valid = &b[1u << BUCKET_BITS];
            atomic_store_explicit(heads_valid, 1, memory_order_relaxed);
            buckets = b;
        }
    }
}

/* The multiplies are independent of each other, so a deep stack hashes in
 * a few cycles per frame instead of one multiply latency per frame. */
static uint32_t hash_frames(const uintptr_t *ips, uint32_t depth, uint32_t erl) {
    uint64_t h = MT_HASH_GOLDEN ^ depth ^ ((uint64_t)erl << 32);
    depth += erl;
    for (uint32_t i = 0; i < depth; i++) {
        h += (ips[i] ^ (i * MT_HASH_GOLDEN)) * MT_HASH_MIX;
        h = h << 27 | h >> 37;
    }
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return (uint32_t)(h ^ (h >> 32));
}

static struct stack_rec *rec_of(uint32_t id) {
    struct stack_rec **block = atomic_load_explicit(&dir[id >> BLOCK_BITS], memory_order_acquire);
    return block ? block[id & ((1u << BLOCK_BITS) - 1)] : NULL;
}

/* Whether a record's Erlang frames still name the code at their pcs: the
 * JIT may give a purged module's code memory to the next module loaded.
 * Checked with a lookup each only once the VM's thread progress has moved
 * since they last held (no other code runs at their addresses before it
 * does: a load is committed after it), so not again within a NIF call. */
static int names_hold(const struct stack_rec *r) {
    /* Except a NIF's own frame keyed by the VM's record (more NIFs than
     * the preload keeps: erlang_frames.c): for a dirty or rescheduled NIF
     * the VM rewrites that in place, progress or not.  Three words each. */
    if (!mt_erl_nifs_named(r->ips + r->depth, erl_names(r), r->erl))
        return 0;
    uint64_t now = mt_erl_progress();
    _Atomic uint64_t *checked = erl_checked(r);
    if (now && atomic_load_explicit(checked, memory_order_relaxed) == now)
        return 1;
    if (!mt_erl_names_hold(r->ips + r->depth, erl_names(r), r->erl))
        return 0;
    atomic_store_explicit(checked, now, memory_order_relaxed);
    return 1;
}

/* Whether none of the code its native frames were walked in was unloaded
 * since its epoch (another library's stacks at those addresses are others). */
static int code_stayed(const struct stack_rec *r, uint32_t now) {
    uint32_t epoch = atomic_load_explicit(&r->epoch, memory_order_relaxed);
    if (epoch == now)
        return 1;
    for (uint32_t i = 0; i < r->depth; i++)
        if (mt_unloaded_since(epoch, r->ips[i]))
            return 0;
    atomic_store_explicit((_Atomic uint32_t *)&r->epoch, now, memory_order_relaxed);
    return 1;
}

static int still_named(uint32_t id) {
    const struct stack_rec *r = id != MTRACE_NO_STACK ? rec_of(id) : NULL;
    return r && names_hold(r);
}

/* The stack of these frames, newest first.  With Erlang frames, addresses
 * are not enough: a record whose names no longer hold is passed over (an
 * older one may hold again, a new one is made if none does). */
static uint32_t find(uint32_t head, uint32_t hash, const uintptr_t *ips, uint32_t depth,
                     uint32_t erl) {
    for (uint32_t id = head; id;) {
        const struct stack_rec *r = rec_of(id);
        if (!r)
            return 0;
        if (r->hash == hash && r->depth == depth && r->erl == erl &&
            !memcmp(r->ips, ips, (depth + erl) * sizeof(uintptr_t)) && (!erl || names_hold(r)) &&
            code_stayed(r, mt_unloads_epoch()))
            return id;
        id = r->next;
    }
    return 0;
}

/* Bump allocation from 1 MiB chunks; called under insert_lock. */
static struct stack_rec *alloc_rec(uint32_t depth, uint32_t erl) {
    size_t need = sizeof(struct stack_rec) + (depth + erl) * sizeof(uintptr_t) +
                  erl * sizeof(struct mtrace_erl_frame) + (erl ? sizeof(uint64_t) : 0);
    if (!chunk || (size_t)(chunk_end - chunk) < need) {
        char *c = map(CHUNK_BYTES, MAP_NORESERVE);
        if (!c)
            return NULL;
        chunk = c;
        chunk_end = c + CHUNK_BYTES;
    }
    struct stack_rec *r = (struct stack_rec *)chunk;
    chunk += need;
    return r;
}

/* In a fork child, under insert_lock: the heads again, from the records.
 * Setting each record's bucket in id order leaves every bucket at its
 * newest record, whose chain is as the parent built it.  Meanwhile lookups
 * may miss, and then wait for the lock; every head they find is valid. */
static void rebuild_heads(void) {
    if (atomic_load_explicit(heads_valid, memory_order_relaxed))
        return;
#ifdef MADV_POPULATE_WRITE
    madvise((void *)buckets, BUCKETS_BYTES, MADV_POPULATE_WRITE); /* a hint: may fail */
#endif
    uint32_t end = atomic_load_explicit(&next_id, memory_order_relaxed);
    for (uint32_t id = 1; id < end; id++) {
        const struct stack_rec *r = rec_of(id);
        if (r)
            atomic_store_explicit(&buckets[r->hash & ((1u << BUCKET_BITS) - 1)], id,
                                  memory_order_release);
    }
    atomic_store_explicit(heads_valid, 1, memory_order_relaxed);
}

/* Reserves a directory slot for id; called under insert_lock. */
static struct stack_rec **slot_for(uint32_t id) {
    struct stack_rec **block = atomic_load_explicit(&dir[id >> BLOCK_BITS], memory_order_relaxed);
    if (!block) {
        block = map(sizeof(*block) << BLOCK_BITS, MAP_NORESERVE);
        if (!block)
            return NULL;
        atomic_store_explicit(&dir[id >> BLOCK_BITS], block, memory_order_release);
    }
    return &block[id & ((1u << BLOCK_BITS) - 1)];
}

uint32_t mt_stack_intern(const uintptr_t *ips, uint32_t depth) {
    return mt_stack_intern_erl(ips, depth, 0);
}

uint32_t mt_stack_intern_erl(const uintptr_t *ips, uint32_t depth, uint32_t erl) {
    if (!buckets || depth + erl == 0)
        goto none;
    uint32_t hash = hash_frames(ips, depth, erl);
    _Atomic uint32_t *bucket = &buckets[hash & ((1u << BUCKET_BITS) - 1)];
    uint32_t id = find(atomic_load_explicit(bucket, memory_order_acquire), hash, ips, depth, erl);
    if (id)
        return id;

    if (!mt_lock_unless(&insert_lock, &mt_state.fork))
        goto none; /* a fork held it too long (spinlock.h) */
    rebuild_heads();
    id = find(atomic_load_explicit(bucket, memory_order_relaxed), hash, ips, depth, erl);
    if (!id) {
        uint32_t fresh = atomic_load_explicit(&next_id, memory_order_relaxed);
        struct stack_rec **slot = fresh <= MTRACE_MAX_STACK_ID ? slot_for(fresh) : NULL;
        struct stack_rec *r = slot ? alloc_rec(depth, erl) : NULL;
        if (r) {
            r->next = atomic_load_explicit(bucket, memory_order_relaxed);
            r->hash = hash;
            r->depth = (uint16_t)depth;
            r->erl = (uint16_t)erl;
            atomic_store_explicit(&r->epoch, mt_unloads_epoch(), memory_order_relaxed);
            memcpy(r->ips, ips, (depth + erl) * sizeof(uintptr_t));
            /* Named in place, not on the C stack (128 names are 5 KiB),
             * once: new stacks with Erlang frames are few. */
            struct mtrace_erl_frame *names = (struct mtrace_erl_frame *)erl_names(r);
            uint64_t now = erl ? mt_erl_progress() : 0; /* before the names are taken */
            for (uint32_t i = 0; i < erl; i++)
                mt_erl_name(ips[depth + i], &names[i]);
            if (erl) {
                atomic_store_explicit(erl_checked(r), now, memory_order_relaxed);
                atomic_fetch_add_explicit(&erl_stacks, 1, memory_order_relaxed);
            }
            *slot = r;
            atomic_store_explicit(&next_id, fresh + 1, memory_order_release);
            atomic_store_explicit(bucket, fresh, memory_order_release);
            id = fresh;
        }
    }
    mt_unlock(&insert_lock);
    if (id)
        return id;
none:
    atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
    return MTRACE_NO_STACK;
}

/* The id this thread got last; reused when the walker saw the same stack. */
static __thread uint32_t last_id __attribute__((tls_model("initial-exec")));
/* Whether that stack had Erlang frames. */
static __thread uint32_t last_erl __attribute__((tls_model("initial-exec")));
/* Where that stack's frames began in the walk, and how many were kept. */
static __thread int last_skip __attribute__((tls_model("initial-exec")));
static __thread uint32_t last_got __attribute__((tls_model("initial-exec")));
/* Whether that stack is among the last few (recent_stacks.h), which then
 * answer for it: the repeat check below would only make theirs again. */
static __thread int last_recent __attribute__((tls_model("initial-exec")));

_Static_assert(MAX_OWN_FRAMES + 2 * MTRACE_MAX_DEPTH <= MT_UNWIND_SCRATCH,
               "a walk and its Erlang frames fit the walker's scratch");

/* libunwind's first walk on a thread allocates (unwind_fallback.h): in a
 * signal handler that interrupted the thread's malloc, that malloc would
 * wait for the arena lock the interrupted one holds.  So where the walker
 * gave up at a signal frame, on a thread libunwind has not walked yet, the
 * frames walked stand, counted as cut short. */
static int fallback_safe(const uintptr_t *ips, int walked) {
    if (walked <= 0 || mt_fallback_warm())
        return 1;
    struct mt_frame_rule r;
    uint64_t loads;
    mt_eh_frame_rule(ips[walked - 1] - 1, &r, &loads); /* the rule cache keeps no such kind */
    if (r.kind != MT_RULE_SIGNAL)
        return 1;
    mt_fallback_count_cut();
    return 0;
}

/* MTRACE_UNWIND=libunwind hands every stack to libunwind, but on a thread
 * it has not walked yet the walker looks first, for the signal frame under
 * which that first walk could hang: -1 (to libunwind) or, when the walk
 * gave up, what mt_unwind_check returned, for fallback_safe to judge. */
static int libunwind_mode_look(const struct mt_walk_start *at, uintptr_t *buf, int max) {
    if (mt_fallback_warm())
        return -1;
    int same = 0; /* buf is rewritten by libunwind when the walk went through */
    int n = mt_unwind_check(at, buf, max, &same);
    return n >= 0 ? -1 : n;
}

static __attribute__((noinline)) uint32_t capture(const struct mt_walk_start *at, uint32_t depth) {
    /* Not on the C stack: 2 KiB there, under every allocation of a new
     * stack, is more than a small thread stack can spare. */
    void **buf = (void **)mt_unwind_scratch();
    if (!buf) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return MTRACE_NO_STACK;
    }
    int same = 0;
    int n = mt_state.fast_unwind
                ? mt_unwind_check(at, (uintptr_t *)buf, (int)(depth + MAX_HOOK_FRAMES), &same)
                : libunwind_mode_look(at, (uintptr_t *)buf, (int)(depth + MAX_HOOK_FRAMES));
    int walked = n >= 0;
    if (n < 0) {
        if (mt_state.fast_unwind)
            mt_unwind_count_fallback();
        /* Without libunwind (a musl build, or before it is loaded): the
         * frames walked before the walker gave up. */
        int walked = -1 - n;
        /* Not in a fork child: libunwind asks dl_iterate_phdr (objects.h). */
        n = mt_objects_forked() || !fallback_safe((const uintptr_t *)buf, walked)
                ? -1
                : mt_fallback_backtrace(buf, (int)(depth + MAX_OWN_FRAMES));
        if (n < 0)
            n = walked;
    }
    /* The same walk as last time left buf unwritten: what was made of it
     * then (skip, got, the id) still holds. */
    if (same && !last_id) {
        mt_unwind_last((uintptr_t *)buf, n);
        same = 0;
    }
    int skip = last_skip;
    uint32_t got = last_got;
    if (!same) {
        skip = 0;
        while (skip < n && (const char *)buf[skip] >= __ehdr_start &&
               (const char *)buf[skip] < etext)
            skip++;
        got = (uint32_t)(n - skip);
        if (got > depth)
            got = depth;
    }
    /* The Erlang frames follow the native ones in the key: the previous
     * stack is this one only if both parts are unchanged. */
    uintptr_t *ips = (uintptr_t *)(buf + skip);
    int erl_same;
    uint32_t erl = mt_erl_capture(ips + got, depth, &erl_same);
    /* The same words can be other code's: a module purged and another
     * loaded at its addresses between two NIF calls (names_hold). */
    if (same && (erl ? erl_same && still_named(last_id) : !last_erl))
        return last_id;
    if (same) /* the native frames are needed after all (the Erlang ones follow them) */
        mt_unwind_last((uintptr_t *)buf, skip + (int)got);
    last_skip = skip;
    last_got = got;
    last_erl = erl;
    last_id = mt_stack_intern_erl(ips, got, erl);
    last_recent =
        !erl && !same && walked && mt_recent_keep((int)(depth + MAX_HOOK_FRAMES), last_id);
    return last_id;
}

uint32_t mt_stack_capture(const struct mt_walk_start *at, uint32_t depth) {
#ifdef MT_LEAVE_OUT_STACKS /* a benchmark's build only: what taking stacks costs */
    (void)at, (void)depth;
    return MTRACE_NO_STACK;
#endif
    if (depth > MTRACE_MAX_DEPTH)
        depth = MTRACE_MAX_DEPTH;
    /* The common case, before capture() sets up its frame: one of this
     * thread's last few stacks, most often the last, outside a NIF (a
     * stack with Erlang frames is told apart by them too).  The last walk's
     * repeat is checked here only while no frames are taken: else capture()
     * makes that check with theirs, and would make it again. */
    int allowed, max = (int)(depth + MAX_HOOK_FRAMES);
    if (mt_state.fast_unwind) {
        int erl = mt_erl_active(&allowed);
        if (!erl || !mt_erl_in_nif()) {
            uint32_t id = mt_recent_stack(at, max);
            if (id)
                return id;
        }
        if (!erl && last_id && !last_erl && !last_recent && mt_unwind_repeats(at, max))
            return last_id;
    }
    return capture(at, depth);
}

/* The record of a published id, or NULL. */
static const struct stack_rec *published(uint32_t id) {
    if (id == MTRACE_NO_STACK || id >= atomic_load_explicit(&next_id, memory_order_acquire))
        return NULL;
    return rec_of(id);
}

uint32_t mt_stack_get(uint32_t id, uintptr_t *ips, uint32_t max) {
    const struct stack_rec *r = published(id);
    uint32_t n = r ? (r->depth < max ? r->depth : max) : 0;
    if (n)
        memcpy(ips, r->ips, n * sizeof(uintptr_t));
    return n;
}

uint32_t mt_stack_epoch(uint32_t id) {
    const struct stack_rec *r = published(id);
    return r ? atomic_load_explicit(&r->epoch, memory_order_relaxed) : 0;
}

uint32_t mt_stack_erl(uint32_t id, struct mtrace_erl_frame *out, uint32_t max) {
    const struct stack_rec *r = published(id);
    uint32_t n = r ? (r->erl < max ? r->erl : max) : 0;
    if (n)
        memcpy(out, erl_names(r), n * sizeof *out);
    return n;
}

void mt_stack_figures(struct mt_stack_figures *out) {
    out->stacks = atomic_load_explicit(&next_id, memory_order_relaxed) - 1;
    out->bytes = atomic_load_explicit(&mapped_bytes, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&dropped, memory_order_relaxed);
    out->erl_stacks = atomic_load_explicit(&erl_stacks, memory_order_relaxed);
}

void mt_stacks_thread_exit(void) {
    mt_recent_thread_exit();
    mt_unwind_thread_exit();
}

void mt_stacks_lock(void) { mt_lock(&insert_lock); }

void mt_stacks_unlock(void) { mt_unlock(&insert_lock); }
