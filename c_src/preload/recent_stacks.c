/*
 * The calling thread's last few stacks (see recent_stacks.h): the proofs of
 * its last 128 walks with their checks in a ring that the oldest proofs give
 * up first.  A capture tries the one found last, then the one found after
 * it last time, then those with the same first frame, through a small
 * index, and among them the one whose checked words hash alike, through
 * another.
 */
#define _GNU_SOURCE
#include "recent_stacks.h"

#include <stdatomic.h>
#include <stddef.h>
#include <sys/mman.h>

#include "hash.h"

#define RECENT 128 /* stacks kept: a bit each in an index bucket's mask */
#define MASK_WORDS (RECENT / 64)
#define INDEX_BITS 4 /* 16 buckets, by first frame */
#define POOL 2048    /* checks of them all, in a ring */
#define PROOF_MAX 96 /* checks of the longest stack kept */
_Static_assert(PROOF_MAX <= POOL, "a proof fits the ring");

struct kept {
    struct mt_walk_proof p;         /* p.sp 0: none */
    const struct mt_stack_check *c; /* its checks: &ring[start % POOL], kept at hand
                                     * for the check every capture makes */
    uint32_t start;                 /* where its checks are in the ring, counted from the first */
    uint32_t id;
};

/* A thread's: 43 KiB in a mapping of its own (made on the first walk kept,
 * unmapped as the thread exits), not in TLS, whose size is taken from every
 * thread's stack in every program the preload is in. */
struct recent {
    struct kept k[RECENT];
    uint64_t bucket[1u << INDEX_BITS][MASK_WORDS]; /* the stacks each holds, a bit each */
    /* Hashes of each one's check words and of their addresses: stacks of
     * one bucket walked through frames of the same sizes read the same
     * addresses, so one hash of the words there now rules out all of them
     * but the one it matches, a compare each. */
    uint64_t words[RECENT], places[RECENT];
    /* Which one was kept with each pair of those hashes, by 10 bits of
     * them: one plus its index, 0 for none.  Stacks reached through many
     * paths share their first frame and stack pointer, and so a bucket;
     * this finds the one among them at once, where trying each in turn
     * took ~1,200 instructions a search in the churn benchmark (an entry a
     * later one overwrote, or whose stack was replaced, fails the
     * compares, and the search goes on). */
    uint8_t by_words[1024];
    uint32_t next; /* the slot to reuse next */
    uint32_t end;  /* the ring's writes so far, counted from the first */
    uint32_t hit;  /* the one found last */
    /* The one found after each, last time: a thread's allocations most
     * often follow the same order (in a release's boot, 4 in 5 of those
     * the last one found did not answer). */
    uint8_t next_of[RECENT];
    int trust;
    struct mt_stack_check ring[POOL];
};

#define GONE ((struct recent *)1) /* the thread exited, or no memory: none kept */
static __thread struct recent *me __attribute__((tls_model("initial-exec")));

static inline unsigned bucket_of(uintptr_t ip, uintptr_t sp) {
    return (unsigned)mt_hash_index(sp ^ ip << 7, INDEX_BITS);
}

static inline unsigned words_key(uint64_t places, uint64_t words) {
    return (unsigned)mt_hash_index(places ^ words, 10);
}

/* Its checks are still those it was kept with: none of the ring's writes
 * since went a whole turn past its first. */
static inline int intact(const struct recent *r, const struct kept *k) {
    return r->end - k->start <= POOL;
}

/* One hash for words and for addresses; its terms are independent of each
 * other, so a long proof hashes in a few cycles a check.  Each term is
 * folded before the sum, and the index key mixes the sum again: a sum of
 * plain products is a product of the sum, in which stacks that differ
 * only in which of two callers some frames have (the churn benchmark's 64
 * call chains) cancel out: half of its searches were named a stack whose
 * words hashed alike and differed. */
static inline uint64_t term(uintptr_t x, int k) {
    uint64_t v = (x ^ (uint64_t)k * MT_HASH_GOLDEN) * MT_HASH_MIX;
    return v ^ v >> 32;
}
static uint64_t hash_words(const struct mt_stack_check *c, int n) {
    uint64_t h = 0;
    for (int k = 0; k < n; k++)
        h += term(c[k].word, k);
    return h;
}
static uint64_t hash_places(const struct mt_stack_check *c, int n) {
    uint64_t h = (uint64_t)n;
    for (int k = 0; k < n; k++)
        h += term((uintptr_t)c[k].at, k);
    return h;
}
static MT_READS_STACK uint64_t hash_words_now(const struct mt_stack_check *c, int n) {
    uint64_t h = 0;
    for (int k = 0; k < n; k++)
        h += term(*c[k].at, k);
    return h;
}

static struct recent *mine(void) {
    if (me)
        return me;
    /* Populated: a page read before it is written maps the zero page, and
     * its first write then replaces that mapping, which in a threaded
     * process flushes every other CPU's TLB by an interrupt (45 such
     * faults in a node's boot, about 40 us each on a VM). */
    void *m = mmap(NULL, sizeof(struct recent), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (m == MAP_FAILED)
        return me = GONE;
#ifdef MADV_WIPEONFORK
    /* A fork child starts with none kept (all zero) rather than sharing
     * the pages copy on write, which the parent would fault on again. */
    madvise(m, sizeof(struct recent), MADV_WIPEONFORK);
#endif
    return me = m;
}

int mt_recent_keep(int max, uint32_t id) {
    struct recent *r = id ? mine() : GONE;
    if (r == GONE)
        return 0;
    unsigned i = r->next % RECENT;
    struct kept *k = &r->k[i];
    if (k->p.sp)
        r->bucket[bucket_of(k->p.ip, k->p.sp)][i / 64] &= ~(1ull << i % 64);
    /* A proof's checks are contiguous: one that might not fit before the
     * ring's end starts at its beginning. */
    uint32_t start = r->end;
    if (start % POOL + PROOF_MAX > POOL)
        start += POOL - start % POOL;
    struct mt_stack_check *c = &r->ring[start % POOL];
    k->c = c;
    int kept = mt_unwind_prove(&k->p, c, PROOF_MAX, max);
    /* Even a proof that did not fit may have written all the room. */
    r->end = start + (uint32_t)(kept ? k->p.n : PROOF_MAX);
    if (!kept)
        return 0;
    k->start = start;
    k->id = id;
    r->words[i] = hash_words(k->c, k->p.n);
    r->places[i] = hash_places(k->c, k->p.n);
    r->bucket[bucket_of(k->p.ip, k->p.sp)][i / 64] |= 1ull << i % 64;
    r->by_words[words_key(r->places[i], r->words[i])] = (uint8_t)(i + 1);
    r->next++;
    r->next_of[r->hit] = (uint8_t)i;
    r->hit = i; /* the next allocation most likely repeats it */
    return 1;
}

/* Whether k proves the stack from *at; its checks are read only if they
 * are its own (any stack words they name are in this thread's stack). */
static inline MT_READS_STACK int proves(const struct recent *r, const struct kept *k,
                                        const struct mt_walk_start *at, int max) {
    return mt_proof_applies(&k->p, at, max) && intact(r, k) && !mt_checks_differ(k->c, k->p.n);
}

static __attribute__((noinline)) MT_READS_STACK uint32_t find(struct recent *r,
                                                              const struct mt_walk_start *at,
                                                              int max) {
    const uint64_t *mask = r->bucket[bucket_of(at->ip, at->sp)];
    uint64_t places = 0, words = 0; /* the words at places now, once hashed */
    int hashed = 0;
    for (unsigned w = 0; w < MASK_WORDS; w++) {
        uint64_t m = mask[w];
        if (r->hit / 64 == w) /* already tried */
            m &= ~(1ull << r->hit % 64);
        for (; m; m &= m - 1) {
            unsigned i = 64 * w + (unsigned)__builtin_ctzll(m);
            const struct kept *k = &r->k[i];
            if (!hashed || r->places[i] != places) {
                /* Stacks most often part in their first 4 words. */
                if (!mt_proof_applies(&k->p, at, max) || !intact(r, k) ||
                    mt_checks_differ(k->c, k->p.n < 4 ? k->p.n : 4))
                    continue;
                places = r->places[i];
                words = hash_words_now(k->c, k->p.n);
                hashed = 1;
                unsigned j = r->by_words[words_key(places, words)];
                if (j-- && j != r->hit && r->places[j] == places && r->words[j] == words &&
                    proves(r, &r->k[j], at, max)) {
                    r->hit = j;
                    return r->k[j].id;
                }
            }
            if (r->words[i] == words && proves(r, k, at, max)) {
                r->hit = i;
                return k->id;
            }
        }
    }
    return 0;
}

/* After the last one found did not answer: the one found after it last
 * time, then the others while that pays: a thread whose stacks vary more
 * than the ones kept (each candidate costs a few loads) looks once in 32
 * misses, until they answer again. */
static __attribute__((noinline)) MT_READS_STACK uint32_t others(struct recent *r,
                                                                const struct mt_walk_start *at,
                                                                int max) {
    uint32_t last = r->hit, then = r->next_of[last];
    if (then != last && proves(r, &r->k[then], at, max)) {
        r->hit = then;
        return r->k[then].id;
    }
    if (r->trust < 0) {
        r->trust++;
        return 0;
    }
    uint32_t id = find(r, at, max);
    if (id)
        r->next_of[last] = (uint8_t)r->hit;
    r->trust = id ? (r->trust < 29 ? r->trust + 3 : 32) : r->trust ? r->trust - 1 : -32;
    return id;
}

MT_READS_STACK uint32_t mt_recent_stack(const struct mt_walk_start *at, int max) {
    struct recent *r = me;
    if (!r || r == GONE)
        return 0;
    const struct kept *k = &r->k[r->hit];
    if (proves(r, k, at, max)) /* they come in runs */
        return k->id;
    return others(r, at, max);
}

void mt_recent_thread_exit(void) {
    struct recent *r = me;
    /* Its last frees and allocations keep none, nor does a signal handler
     * that runs before the unmap. */
    me = GONE;
    atomic_signal_fence(memory_order_seq_cst);
    if (r && r != GONE)
        munmap(r, sizeof *r);
}
