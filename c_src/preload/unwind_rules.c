/*
 * The unwind rules' cache (see unwind_rules.h): a fixed open-addressing
 * table in its own mapping.  Writers claim the key with a compare-and-swap,
 * then store the rule word; a key never changes once set, so readers need no
 * lock, and a rule word is only ever written by a thread that computed it for
 * that key.  Each rule word carries the generation it was computed in (its
 * low 15 bits, never 0, so that a word not yet written is a miss); dlclose
 * bumps the generation, which turns every cached rule into a miss without
 * touching the table.  Once those bits have wrapped, each bump first turns
 * the rules last kept under its bits into misses (bump_to).  So does any cache miss that finds the
 * loader's load/unload count changed: libc unloads some modules itself (iconv's gconv, NSS) without
 * going through the interposed dlclose.  (dlopen is not interposed: glibc searches the RUNPATH of
 * dlopen's caller, which a wrapper would change.)
 */
#define _GNU_SOURCE
#include "unwind_rules.h"

#include <stddef.h>
#include <sys/mman.h>

#include "hash.h"
#include "objects.h"
#include "unwind.h"

#define CACHE_BITS 15 /* 32768 addresses, 512 KiB */
#define CACHE_PROBES 8
/* A rule packed in one word: offsets in 8-byte units as magnitudes (the CFA
 * lies above its register, the saved registers below the CFA), then flags,
 * then the generation.  aarch64 compilers put the saved x29 and x30 at the
 * bottom of the frame, so they need the range of the CFA offset; a rule
 * beyond these ranges (a frame over 1 MiB, saved registers more than
 * 128 KiB below the CFA) is left to libunwind. */
#define CFA_BITS 17
#define SLOT_BITS 14
#define RA_SHIFT CFA_BITS
#define BP_SHIFT (RA_SHIFT + SLOT_BITS)
#define FLAGS_SHIFT (BP_SHIFT + SLOT_BITS)
#define GEN_SHIFT (FLAGS_SHIFT + 4)
#define GEN_MASK ((1ull << (64 - GEN_SHIFT)) - 1)

struct entry {
    _Atomic uint64_t key; /* return address; 0 = free */
    _Atomic uint64_t val; /* packed rule | generation << GEN_SHIFT */
};

static struct entry *_Atomic cache;
_Atomic uint64_t mt_rules_generation = 1;
static _Atomic uint64_t seen_loads; /* mt_objects_generation at the last miss */

/* The generation after g: its stored bits are never 0. */
static uint64_t next_generation(uint64_t g) { return ((g + 1) & GEN_MASK) ? g + 1 : g + 2; }

/* Before generation `next` is published: a rule kept 2^15 bumps ago under
 * the same stored bits would match it again, for whatever code is at its
 * address now; its word becomes a miss (bits 0).  Only after the bits have
 * wrapped, so that a process with fewer dlcloses pays nothing; a scan of the
 * cache (512 KiB) then costs tens of µs, next to the dlclose behind it. */
static void bump_to(uint64_t next) {
    struct entry *t = next > GEN_MASK ? atomic_load_explicit(&cache, memory_order_acquire) : NULL;
    if (!t)
        return;
    for (size_t i = 0; i < (size_t)1 << CACHE_BITS; i++) {
        uint64_t v = atomic_load_explicit(&t[i].val, memory_order_relaxed);
        if (v >> GEN_SHIFT == (next & GEN_MASK))
            atomic_compare_exchange_strong_explicit(&t[i].val, &v, v & ((1ull << GEN_SHIFT) - 1),
                                                    memory_order_relaxed, memory_order_relaxed);
    }
}

void mt_unwind_forget(void) {
    uint64_t g = atomic_load(&mt_rules_generation);
    for (;;) {
        uint64_t next = next_generation(g);
        bump_to(next);
        if (atomic_compare_exchange_weak(&mt_rules_generation, &g, next))
            return;
    }
}

void mt_unwind_check_loads(uint64_t now_ms) {
    static _Atomic uint64_t checked_ms;
    if (atomic_exchange_explicit(&checked_ms, now_ms, memory_order_relaxed) == now_ms)
        return;
    uint64_t loads = mt_objects_generation_walking();
    if (!loads)
        return;
    uint64_t was = atomic_exchange_explicit(&seen_loads, loads, memory_order_relaxed);
    if (was && was != loads)
        mt_unwind_forget();
}

/* Can r be packed?  eh_frame.c only makes frame rules with cfa_off > 0 and
 * ra_off, bp_off < 0, all multiples of 8 but cfa_off. */
static int packable(const struct mt_frame_rule *r) {
    return r->kind != MT_RULE_FRAME ||
           (r->cfa_off % 8 == 0 && r->cfa_off / 8 < (1 << CFA_BITS) &&
            -(r->ra_off / 8) < (1 << SLOT_BITS) && -(r->bp_off / 8) < (1 << SLOT_BITS));
}

static uint64_t pack(const struct mt_frame_rule *r, uint64_t gen) {
    return (uint64_t)(r->cfa_off / 8) | (uint64_t)(-(r->ra_off / 8)) << RA_SHIFT |
           (uint64_t)(-(r->bp_off / 8)) << BP_SHIFT | (uint64_t)r->cfa_bp << FLAGS_SHIFT |
           (uint64_t)r->bp_saved << (FLAGS_SHIFT + 1) |
           (uint64_t)(r->kind & 3) << (FLAGS_SHIFT + 2) | gen << GEN_SHIFT;
}

static void unpack(uint64_t v, struct mt_frame_rule *r) {
    r->cfa_off = (int32_t)(v & ((1u << CFA_BITS) - 1)) * 8;
    r->ra_off = -(int32_t)((v >> RA_SHIFT) & ((1u << SLOT_BITS) - 1)) * 8;
    r->bp_off = -(int32_t)((v >> BP_SHIFT) & ((1u << SLOT_BITS) - 1)) * 8;
    r->cfa_bp = (v >> FLAGS_SHIFT) & 1;
    r->bp_saved = (v >> (FLAGS_SHIFT + 1)) & 1;
    r->kind = (v >> (FLAGS_SHIFT + 2)) & 3;
}

static struct entry *cache_table(void) {
    struct entry *c = atomic_load_explicit(&cache, memory_order_acquire);
    if (c)
        return c;
    /* Populated: addresses hash all over the table, so a few thousand cached
     * rules touch every page, each first read and then write costing a page
     * fault (~250 of them in a node's boot) where populating costs ~0.2 ms. */
    void *m = mmap(NULL, sizeof(struct entry) << CACHE_BITS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
#ifdef MADV_WIPEONFORK
    /* An empty cache in a fork child rather than one shared copy on write,
     * whose every page the parent would fault on again when it next writes
     * there (the child's rules are for the same code: it just recomputes). */
    madvise(m, sizeof(struct entry) << CACHE_BITS, MADV_WIPEONFORK);
#endif
    struct entry *none = NULL;
    if (!atomic_compare_exchange_strong(&cache, &none, (struct entry *)m)) {
        munmap(m, sizeof(struct entry) << CACHE_BITS); /* another thread won */
        return none;
    }
    return m;
}

static inline size_t slot_of(uintptr_t ra) { return (size_t)mt_hash_index(ra, CACHE_BITS); }

void mt_rule_for(uintptr_t ra, struct mt_frame_rule *r) {
    uint64_t gen = atomic_load_explicit(&mt_rules_generation, memory_order_relaxed) & GEN_MASK;
    struct entry *t = cache_table();
    size_t mask = ((size_t)1 << CACHE_BITS) - 1, i = slot_of(ra);
    if (t) {
        for (int k = 0; k < CACHE_PROBES; k++, i = (i + 1) & mask) {
            uint64_t key = atomic_load_explicit(&t[i].key, memory_order_acquire);
            if (key == ra) {
                uint64_t v = atomic_load_explicit(&t[i].val, memory_order_relaxed);
                if (v >> GEN_SHIFT == gen) {
                    unpack(v, r);
                    return;
                }
                break; /* stale: recompute into this slot */
            }
            if (!key)
                break;
        }
    }
    uint64_t loads;
    mt_eh_frame_rule(ra - 1, r, &loads);
    /* The walker gives up on both.  Offsets too large for their bits go with
     * the kind: packed, they would spill into the flags, kind and generation
     * and come back from the cache as another, wrong frame rule. */
    if (!packable(r) || r->kind == MT_RULE_SIGNAL)
        *r = (struct mt_frame_rule){.kind = MT_RULE_UNSUPPORTED};
    /* Nothing looked up (a fork under way: the walk falls back), or looked up
     * without the loader's count (in a fork child): used, not kept. */
    if (!loads)
        return;
    uint64_t was = atomic_exchange_explicit(&seen_loads, loads, memory_order_relaxed);
    if (was && was != loads) { /* objects came or went since: drop every cached rule */
        mt_unwind_forget();
        gen = atomic_load_explicit(&mt_rules_generation, memory_order_relaxed) & GEN_MASK;
    }
    if (!t)
        return;
    uint64_t v = pack(r, gen);
    i = slot_of(ra);
    for (int k = 0; k < CACHE_PROBES; k++, i = (i + 1) & mask) {
        uint64_t key = atomic_load_explicit(&t[i].key, memory_order_acquire);
        if (key == ra) {
            atomic_store_explicit(&t[i].val, v, memory_order_relaxed);
            return;
        }
        if (key)
            continue;
        /* The key first: a thread that loses the slot to another key writes
         * nothing there.  A reader that sees the key before the value reads
         * generation bits 0 (or those of a rule for this same key): a miss. */
        uint64_t none = 0;
        if (atomic_compare_exchange_strong_explicit(&t[i].key, &none, ra, memory_order_relaxed,
                                                    memory_order_relaxed) ||
            none == ra) {
            atomic_store_explicit(&t[i].val, v, memory_order_release);
            return;
        }
    }
}
