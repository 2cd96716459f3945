/*
 * Byte sampling (MTRACE_SAMPLE_BYTES = R, 0 = lossless).
 *
 * As in tcmalloc and jemalloc, every allocated byte is a sample point with
 * probability 1/R: each thread counts down an exponentially distributed
 * number of bytes, and the allocation that crosses zero is recorded.  An
 * allocation of s bytes is therefore recorded with probability
 * p(s) = 1 - exp(-s/R), whatever the allocation pattern, and weighting each
 * recorded one by 1/p(s) estimates live counts and bytes without bias.
 */
#ifndef MT_SAMPLING_H
#define MT_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

/* Fixed point of the weights: 1/p(s) in units of 2^-16. */
#define MT_WEIGHT_ONE 65536u

extern uint64_t mt_sample_mean; /* R; 0 = every allocation is recorded */

/* One per thread, zero-initialised (in the interposer's TLS block). */
struct mt_sampler {
    int64_t left; /* bytes until the next sample point */
    uint64_t rng;
    int started;
};

/* Slow half of mt_sample_take: the countdown crossed zero (or was never set). */
int mt_sample_crossed(struct mt_sampler *s, size_t n);

/* Counts n bytes down; 1 while no sample point was crossed (malloc(0)
 * holds memory too, so it counts as one byte). */
static inline int mt_sample_skip(struct mt_sampler *s, size_t n) {
    return (s->left -= (int64_t)(n + (n == 0))) > 0;
}

/* Should this thread record an allocation of n bytes?  Always in lossless mode. */
static inline int mt_sample_take(struct mt_sampler *s, size_t n) {
    if (!mt_sample_mean)
        return 1;
    if (mt_sample_skip(s, n))
        return 0;
    return mt_sample_crossed(s, n);
}

/* 1/p(size) as fixed point (MT_WEIGHT_ONE = weight 1), and size/p(size) in
 * bytes: what one recorded allocation of that size stands for. */
uint64_t mt_sample_weight(uint64_t size);
uint64_t mt_sample_weighted_bytes(uint64_t size);

#endif
