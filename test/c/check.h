/* A minimal test harness: CHECK records a failure and goes on, so one run
 * reports every broken assertion; the summary line is "N passed, M failed". */
#ifndef MT_CHECK_H
#define MT_CHECK_H

#include <stdio.h>

static int checks_passed, checks_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            checks_passed++;                                                                       \
        } else {                                                                                   \
            checks_failed++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        if (va_ == vb_) {                                                                          \
            checks_passed++;                                                                       \
        } else {                                                                                   \
            checks_failed++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %lld, %s = %lld\n", __FILE__, __LINE__,  \
                    #a, va_, #b, vb_);                                                             \
        }                                                                                          \
    } while (0)

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed ? 1 : 0;
}

#endif
