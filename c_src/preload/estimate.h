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

/* 1/p(size) in MT_WEIGHT_ONE units (MT_WEIGHT_ONE when lossless). */
uint64_t mt_estimate_weight(uint64_t size);

/* size/p(size): the bytes one recorded block of that size stands for. */
uint64_t mt_estimate_bytes(uint64_t size);

/* A sum of weights as a count of blocks, rounded to nearest. */
static inline uint64_t mt_estimate_count(uint64_t weights) {
    return (weights + MT_WEIGHT_ONE / 2) / MT_WEIGHT_ONE;
}

#endif
