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
 * of atanh's series leave an error below 1e-18. */
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
    double s = (m - 1) / (m + 1), s2 = s * s, t = 0;
    for (int k = 21; k >= 1; k -= 2)
        t = t * s2 + 1.0 / k;
    return 2 * s * t + e * MT_LN2;
}

/* 1 - e^-r for 0 <= r < ln 2, by its series x - x^2/2! + x^3/3! - ...
 * (Horner from the 20th term: the rest is below 1e-24); exact in relative
 * terms for small r, where 1 - exp(-r) would cancel. */
static inline double mt_one_minus_exp_small(double r) {
    double t = 1;
    for (int k = 20; k >= 2; k--)
        t = 1 - r / k * t;
    return r * t;
}

/* 1 - e^-x for x >= 0 (what -expm1(-x) gives): e^-x = 2^-n e^-r, with
 * x = n ln 2 + r. */
static inline double mt_one_minus_exp(double x) {
    if (!(x < 40)) /* e^-40 < 2^-57: 1 in double precision (and for NaN) */
        return 1;
    int n = (int)(x / MT_LN2);
    double r = x - n * MT_LN2;
    if (r < 0) { /* x / ln 2 rounded up to an integer */
        n--;
        r += MT_LN2;
    }
    if (n == 0)
        return mt_one_minus_exp_small(r);
    return 1 - (1 - mt_one_minus_exp_small(r)) / (double)(1ull << n);
}

#endif
