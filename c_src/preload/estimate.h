/*
 * What a recorded block stands for when MTRACE_SAMPLE_BYTES samples (see
 * sampling.h): a block of s bytes was recorded with probability
 * p(s) = 1 - exp(-s/R), so it stands for 1/p(s) blocks and s/p(s) bytes.
 * Summing these over the recorded blocks estimates the live figures without
 * bias.  In lossless mode every block stands for itself.
 */
#ifndef MT_ESTIMATE_H
#define MT_ESTIMATE_H

#include <stdint.h>

/* Fixed point of the counts: 1/p(s) in units of 2^-16. */
#define MT_WEIGHT_ONE 65536u

/* What one recorded block of size bytes stands for: 1/p(size) blocks, in
 * MT_WEIGHT_ONE units, and size/p(size) bytes (itself when lossless).  One
 * call gives both, from one p(size). */
struct mt_estimate {
    uint64_t weight, bytes;
};
struct mt_estimate mt_estimate_of(uint64_t size);

/* A sum of weights as a count of blocks, rounded to nearest. */
static inline uint64_t mt_estimate_count(uint64_t weights) {
    return (weights + MT_WEIGHT_ONE / 2) / MT_WEIGHT_ONE;
}

#endif
