/* Byte sampling (see sampling.h). */
#include "sampling.h"

#include <math.h>
#include <stdint.h>
#include <time.h>

uint64_t mt_sample_mean;
/* xorshift64*, seeded per thread from its state's address and the clock. */
static uint64_t next_random(struct mt_sampler *s) {
    if (!s->rng) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s->rng = ((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull) ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)ts.tv_sec << 32) ^ 1;
    }
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 0x2545F4914F6CDD1Dull;
}

/* Exponentially distributed gap with mean R, at least 1 byte. */
static int64_t next_gap(struct mt_sampler *s) {
    double u = (double)((next_random(s) >> 11) + 1) / 9007199254740992.0; /* (0, 1] */
    double gap = -log(u) * (double)mt_sample_mean;
    return gap < 1.0 ? 1 : gap > 9e18 ? (int64_t)9e18 : (int64_t)gap;
}

int mt_sample_crossed(struct mt_sampler *s, size_t n) {
    if (!s->started) { /* first allocation of this thread: draw its first gap */
        s->started = 1;
        s->left = next_gap(s);
        if (mt_sample_skip(s, n))
            return 0;
    }
    /* Memoryless: a fresh gap after each sample keeps p(s) = 1 - exp(-s/R). */
    s->left = next_gap(s);
    return 1;
}

static double probability(uint64_t size) {
    return -expm1(-(double)(size ? size : 1) / (double)mt_sample_mean);
}

uint64_t mt_sample_weight(uint64_t size) {
    if (!mt_sample_mean)
        return MT_WEIGHT_ONE;
    double p = probability(size);
    return p > 0 ? (uint64_t)((double)MT_WEIGHT_ONE / p + 0.5) : MT_WEIGHT_ONE;
}

uint64_t mt_sample_weighted_bytes(uint64_t size) {
    if (!mt_sample_mean)
        return size;
    double p = probability(size);
    return p > 0 ? (uint64_t)((double)size / p + 0.5) : size;
}
