/*
 * Query cost at scale, run with the preload active:
 *   LD_PRELOAD=priv/mtrace.so MTRACE_PROGRAMS=query_bench _build/c/query_bench [N]
 * Makes N live allocations (default 1,000,000) from 100 call sites, first with
 * tracking disabled (what malloc itself costs here, page faults included:
 * the tracker's own cost is the difference), then tracked; then times
 * olds(10), sites(10) and stats() (median of 7 runs) and reset() (once: it empties the table),
 * and reports table bytes per live entry.  Then both fills again into the
 * heap they grew (freed, not trimmed), as on a node that has run a while:
 * on a host whose page faults are slow, those of a new heap dwarf malloc
 * and the tracker alike.
 * Prints markdown table rows; nothing here is asserted.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../test/c/queries.h"
#include "mtrace_api.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define REPS 7

static double median(double *v) {
    qsort(v, REPS, sizeof *v, cmp_double);
    return v[REPS / 2];
}

/* 100 distinct call sites: each function is its own return address. */
// clang-format off
#define SITE(k)                                                                                    \
    static __attribute__((noinline)) void *site_##k(size_t n) {                                    \
        void *p = malloc(n + k);                                                                   \
        __asm__ __volatile__("" ::: "memory");                                                     \
        return p;                                                                                  \
    }
// clang-format on
#include "hundred_sites.h"
static void *(*sites[])(size_t) = {HUNDRED_SITES};

/* Seconds to make n blocks, into blocks[]. */
static double fill_s(void **blocks, size_t n) {
    double t0 = now_s();
    for (size_t i = 0; i < n; i++)
        blocks[i] = sites[i % 100](16);
    return now_s() - t0;
}

static void free_all(void **blocks, size_t n) {
    for (size_t i = n; i-- > 0;)
        free(blocks[i]);
}

int main(int argc, char **argv) {
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    if (!api) {
        fprintf(stderr,
                "query_bench: run with LD_PRELOAD=priv/mtrace.so MTRACE_PROGRAMS=query_bench\n");
        return 2;
    }
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000;
    void **blocks = malloc(n * sizeof *blocks);
    api->set_enabled(0);
    double untracked = fill_s(blocks, n);
    free_all(blocks, n);
#ifdef __GLIBC__
    malloc_trim(0); /* back to the system: the tracked fill faults its pages in too */
#endif
    api->set_enabled(1);
    api->reset();
    double fill = fill_s(blocks, n);

    struct mtrace_stats s;
    api->stats(&s, sizeof s);
    double t0;
    struct mtrace_alloc out[10];
    struct mtrace_site top[10];
    double olds_s[REPS], sites_s[REPS], stats_s[REPS];
    for (int r = 0; r < REPS; r++) {
        t0 = now_s();
        query_olds(api, NULL, out, 10);
        olds_s[r] = now_s() - t0;
        t0 = now_s();
        query_sites(api, NULL, top, 10, MTRACE_BY_BYTES, NULL);
        sites_s[r] = now_s() - t0;
        t0 = now_s();
        api->stats(&s, sizeof s);
        stats_s[r] = now_s() - t0;
    }
    printf("| live entries | %llu |\n", (unsigned long long)s.live_count);
    printf("| call sites (stacks interned) | %llu |\n", (unsigned long long)s.stacks);
    printf("| table bytes per live entry | %.1f |\n", (double)s.table_bytes / (double)s.live_count);
    printf("| table + stack store bytes per live entry | %.1f |\n",
           (double)(s.table_bytes + s.stack_bytes) / (double)s.live_count);
    printf("| fill: ns per malloc, tracked / with tracking disabled | %.0f / %.0f |\n",
           fill * 1e9 / (double)n, untracked * 1e9 / (double)n);
    printf("| olds(10), median of %d | %.1f ms |\n", REPS, median(olds_s) * 1e3);
    printf("| sites(10), median of %d | %.1f ms |\n", REPS, median(sites_s) * 1e3);
    printf("| stats(), median of %d | %.3f ms |\n", REPS, median(stats_s) * 1e3);
    t0 = now_s();
    uint64_t forgotten = api->reset();
    printf("| reset() of %llu entries | %.1f ms |\n", (unsigned long long)forgotten,
           (now_s() - t0) * 1e3);

    /* The heap stays grown: the same fills again, untracked first. */
    free_all(blocks, n);
    api->set_enabled(0);
    untracked = fill_s(blocks, n);
    free_all(blocks, n);
    api->set_enabled(1);
    api->reset(); /* the table starts empty, and unmapped, as before */
    fill = fill_s(blocks, n);
    printf(
        "| fill into a grown heap: ns per malloc, tracked / with tracking disabled | %.0f / %.0f "
        "|\n",
        fill * 1e9 / (double)n, untracked * 1e9 / (double)n);
    free_all(blocks, n);
    free(blocks);
    return 0;
}
