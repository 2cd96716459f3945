/*
 * One hundred distinct call sites for the benchmarks: define SITE(k) as a
 * noinline function named site_##k, include this header, then list them
 * with HUNDRED_SITES, e.g. static void *(*sites[])(size_t) = {HUNDRED_SITES};
 */
// clang-format off
#define TEN(d) SITE(d##0) SITE(d##1) SITE(d##2) SITE(d##3) SITE(d##4) \
               SITE(d##5) SITE(d##6) SITE(d##7) SITE(d##8) SITE(d##9)
TEN(1) TEN(2) TEN(3) TEN(4) TEN(5) TEN(6) TEN(7) TEN(8) TEN(9) TEN(10)
#define REF(k) site_##k,
#define TENREF(d) REF(d##0) REF(d##1) REF(d##2) REF(d##3) REF(d##4) \
                  REF(d##5) REF(d##6) REF(d##7) REF(d##8) REF(d##9)
#define HUNDRED_SITES TENREF(1) TENREF(2) TENREF(3) TENREF(4) TENREF(5) \
                      TENREF(6) TENREF(7) TENREF(8) TENREF(9) TENREF(10)
    // clang-format on
