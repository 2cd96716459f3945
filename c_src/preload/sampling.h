/*
 * Byte sampling (MTRACE_SAMPLE_BYTES = R, 0 = lossless).
 *
 * As in tcmalloc and jemalloc, every allocated byte is a sample point with
 * probability 1/R: each thread counts down an exponentially distributed
 * number of bytes, and the allocation that crosses zero is recorded.  An
 * allocation of s bytes is therefore recorded with probability
 * p(s) = 1 - exp(-s/R), whatever the allocation pattern (estimate.h turns
 * the recorded blocks back into live figures).
 */
#ifndef MT_SAMPLING_H
#define MT_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "state.h"

/* One per thread, zero-initialised (in the tracker's TLS block). */
struct mt_sampler {
    int64_t left; /* bytes until the next sample point */
    uint64_t rng;
    int started;
};

/* Slow half of mt_sample_take: the countdown crossed zero (or was never set). */
int mt_sample_crossed(struct mt_sampler *s, size_t n);

/* Counts n bytes down; 1 while no sample point was crossed (malloc(0)
 * holds memory too, so it counts as one byte).  Compared unsigned: the
 * countdown (from 1 to 9e18 until crossed, when mt_sample_crossed draws it
 * anew) is crossed by a request larger than what is left, a request of
 * 2^63 bytes or more (which fails) too; compared signed, such a request
 * read as negative and pushed the next sample point out by that much. */
static inline int mt_sample_skip(struct mt_sampler *s, size_t n) {
    uint64_t bytes = (uint64_t)n + (n == 0);
#if defined(__x86_64__) && defined(__GCC_ASM_FLAG_OUTPUTS__)
    /* One subtract from memory, whose flags answer (above: no borrow, not
     * zero): GCC loads, subtracts, stores and tests. */
    int more;
    __asm__("subq %2, %0" : "+m"(s->left), "=@cca"(more) : "r"(bytes));
    return more;
#else
    uint64_t left = (uint64_t)s->left;
    s->left = (int64_t)(left - bytes);
    return left > bytes;
#endif
}

/* Should this thread record an allocation of n bytes?  Always in lossless mode. */
static inline int mt_sample_take(struct mt_sampler *s, size_t n) {
    if (!mt_state.sample_mean)
        return 1;
    if (mt_sample_skip(s, n))
        return 0;
    return mt_sample_crossed(s, n);
}

#endif
