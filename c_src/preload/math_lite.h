/*
 * The two functions of libm the preload needs: a natural logarithm for
 * sampling's gaps and 1 - e^-x for its estimates.  Computed here, to double
 * precision, so that mtrace.so does not make every process it is preloaded
 * into (each `dirname` of a release's start script) load libm as well: that
 * was about 50 us of the 80-100 us the preload added to each process's
 * start (perf stat -r 400 dirname, 2.3 GHz Xeon).
 */
#ifndef MT_MATH_LITE_H
#define MT_MATH_LITE_H

#include <stdint.h>
#include <string.h>

#define MT_LN2 0.69314718055994530942
#define MT_SQRT2 1.41421356237309504880

/* ln(x) for a finite normal x > 0.  x = m 2^e with m in [sqrt(2)/2, sqrt(2)),
 * and ln(m) = 2 atanh(s) with s = (m-1)/(m+1), |s| < 0.172: eleven terms
 * of atanh's series leave an error below 1e-18.  Its coefficients 1/k are
 * constants: computed in a loop (which GCC does not unroll), they were
 * eleven divisions a sampled block, 76 of its 1,284 instructions. */
static inline double mt_ln(double x) {
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    int e = (int)((b >> 52) & 0x7ff) - 1023;
    b = (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    double m;
    memcpy(&m, &b, sizeof m);
    if (m > MT_SQRT2) {
        m *= 0.5;
        e++;
    }
    double s = (m - 1) / (m + 1), s2 = s * s, s4 = s2 * s2, s8 = s4 * s4;
    /* 1 + s2/3 + s4/5 + ... + s20/21 in pairs (Estrin's scheme): the pairs
     * are independent, so the processor computes them at once instead of
     * one after the other as in Horner's ten dependent steps (25 -> 16 ns
     * a call, in a loop). */
    double t = ((1.0 + s2 * (1.0 / 3)) + s4 * (1.0 / 5 + s2 * (1.0 / 7))) +
               s8 * (((1.0 / 9 + s2 * (1.0 / 11)) + s4 * (1.0 / 13 + s2 * (1.0 / 15))) +
                     s8 * ((1.0 / 17 + s2 * (1.0 / 19)) + s4 * (1.0 / 21)));
    return 2 * s * t + e * MT_LN2;
}

/* 1 - e^-x is computed as (1 - 2^-j/16) + 2^-j/16 (1 - e^-r): x is split
 * into n ln 2 + j ln 2/16 + r with 0 <= r < ln 2/16, so that a series of 10
 * terms is exact for r, and the sum adds two positive terms (no
 * cancellation).  The earlier series over all of [0, ln 2) took 19 terms,
 * each with a division (a sampled block's record then computed it twice and
 * its free twice again), which took 8% of a churn sampled at 16 KiB. */
#define MT_LN2_16_HI 0x1.62e42fefa3000p-5   /* ln 2/16, its low 12 bits zero */
#define MT_LN2_16_LO 1.7647056601894736e-14 /* ln 2/16 - MT_LN2_16_HI */
#define MT_16_LN2 23.083120654223414

/* 2^-j/16 and 1 - 2^-j/16, each rounded to the nearest double. */
static const double mt_exp2_sixteenths[16][2] = {
    {1.0, 0.0},
    {0.9576032806985737, 0.042396719301426355},
    {0.9170040432046712, 0.08299595679532877},
    {0.8781260801866497, 0.12187391981335026},
    {0.8408964152537145, 0.15910358474628547},
    {0.8052451659746271, 0.19475483402537286},
    {0.7711054127039704, 0.2288945872960296},
    {0.7384130729697497, 0.2615869270302503},
    {0.7071067811865476, 0.2928932188134525},
    {0.6771277734684463, 0.3228722265315536},
    {0.6484197773255048, 0.3515802226744952},
    {0.620928906036742, 0.379071093963258},
    {0.5946035575013605, 0.4053964424986395},
    {0.5693943173783458, 0.43060568262165416},
    {0.5452538663326288, 0.45474613366737116},
    {0.5221368912137069, 0.47786310878629307},
};

/* 1 - e^-r for |r| < ln 2/16 (0.0434), by its series r - r^2/2! + r^3/3!
 * ... to r^10/10!: the next term is below 1e-21 of the sum.  Exact in
 * relative terms for small r, where 1 - exp(-r) would cancel. */
static inline double mt_one_minus_exp_small(double r) {
    /* The coefficients (-1)^k/(k+1)!, k = 0 to 9, in pairs as in mt_ln
     * (22.7 -> 14.6 ns a call, in a loop). */
    double r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;
    double p = (1 - r * 0.5) + r2 * (0.16666666666666666 - r * 0.041666666666666664) +
               r4 * ((0.008333333333333333 - r * 0.001388888888888889) +
                     r2 * (0.0001984126984126984 - r * 2.48015873015873e-05)) +
               r8 * (2.7557319223985893e-06 - r * 2.755731922398589e-07);
    return r * p;
}

/* 1 - e^-x for x >= 0 (what -expm1(-x) gives). */
static inline double mt_one_minus_exp(double x) {
    if (!(x < 40)) /* e^-40 < 2^-57: 1 in double precision (and for NaN) */
        return 1;
    int k = (int)(x * MT_16_LN2); /* k ln 2/16 <= x, give or take a rounding */
    double r = (x - k * MT_LN2_16_HI) - k * MT_LN2_16_LO;
    const double *t = mt_exp2_sixteenths[k & 15];
    double s = mt_one_minus_exp_small(r);
    if (k < 16) /* no power of 2 to take out */
        return t[1] + t[0] * s;
    uint64_t scale = (uint64_t)(1023 - (k >> 4)) << 52; /* 2^-n, n = k/16 */
    double two_n;
    memcpy(&two_n, &scale, sizeof two_n);
    return 1 - two_n * (t[0] - t[0] * s);
}

#endif
