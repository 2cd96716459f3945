/* Byte sampling (see sampling.h). */
#include "sampling.h"

#include <stdint.h>
#include <time.h>

#include "hash.h"
#include "math_lite.h"

/* xorshift64*, seeded per thread from its state's address and the clock. */
static uint64_t next_random(struct mt_sampler *s) {
    if (!s->rng) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s->rng = ((uint64_t)(uintptr_t)s * MT_HASH_GOLDEN) ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)ts.tv_sec << 32) ^ 1;
    }
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 0x2545F4914F6CDD1Dull;
}

/* Exponentially distributed gap with mean R, at least 1 byte, rounded up:
 * a sample falls in the block whose bytes reach the gap, so a block of s
 * bytes is sampled with exactly 1 - e^(-s/R) (rounded down, the block after
 * each sample was sampled more often: estimates about 1/R too high, 1.3x at
 * R = 1). */
static int64_t next_gap(struct mt_sampler *s) {
    double u = (double)((next_random(s) >> 11) + 1) / 9007199254740992.0; /* (0, 1] */
    double gap = -mt_ln(u) * (double)mt_state.sample_mean;
    if (gap <= 1.0)
        return 1;
    if (gap > 9e18)
        return (int64_t)9e18;
    int64_t whole = (int64_t)gap;
    return whole + ((double)whole < gap);
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
