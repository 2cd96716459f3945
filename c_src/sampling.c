/* Byte sampling (see sampling.h). */
#include "sampling.h"

#include <math.h>
#include <stdint.h>
#include <time.h>

uint64_t mt_sample_mean;
__thread int64_t mt_sample_left __attribute__((tls_model("initial-exec")));
static __thread uint64_t rng __attribute__((tls_model("initial-exec")));

/* xorshift64*, seeded per thread from its TLS address and the clock. */
static uint64_t next_random(void) {
    if (!rng) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        rng = ((uint64_t)(uintptr_t)&rng * 0x9E3779B97F4A7C15ull) ^ (uint64_t)ts.tv_nsec ^
              ((uint64_t)ts.tv_sec << 32) ^ 1;
    }
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

/* Exponentially distributed gap with mean R, at least 1 byte. */
static int64_t next_gap(void) {
    double u = (double)((next_random() >> 11) + 1) / 9007199254740992.0; /* (0, 1] */
    double gap = -log(u) * (double)mt_sample_mean;
    return gap < 1.0 ? 1 : gap > 9e18 ? (int64_t)9e18 : (int64_t)gap;
}

int mt_sample_crossed(size_t n) {
    static __thread unsigned char started __attribute__((tls_model("initial-exec")));
    if (!started) { /* first allocation of this thread: draw its first gap */
        started = 1;
        mt_sample_left = next_gap() - (int64_t)n;
        if (mt_sample_left > 0)
            return 0;
    }
    /* Memoryless: a fresh gap after each sample keeps p(s) = 1 - exp(-s/R). */
    mt_sample_left = next_gap();
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
