/* Sampling mode (MTRACE_SAMPLE_BYTES) in a plain C program, run with the
 * preload: every call is still counted, few blocks are recorded, and the
 * estimates of live count and bytes land near the truth for large and small
 * blocks alike.  Re-executes itself with MTRACE_SAMPLE_BYTES set, because the
 * preload reads its settings when the program starts. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

#define R 16384
#define BIG_N 20000
#define BIG_SIZE 4096
#define SMALL_N 400000
#define SMALL_SIZE 64

static void *blocks[BIG_N + SMALL_N]; /* not malloc'ed: the test's own bookkeeping is invisible */
static const struct mtrace_api *api;

/* |got - want| within `share` of want. */
static int near(double got, double want, double share) {
    return got > want * (1 - share) && got < want * (1 + share);
}

/* Allocates n blocks of size bytes; checks counts and estimates of them. */
static void check_estimates(size_t from, size_t n, size_t size, double share) {
    struct mtrace_stats s0, s1;
    api->stats(&s0, sizeof s0);
    for (size_t i = from; i < from + n; i++)
        blocks[i] = malloc(size);
    api->stats(&s1, sizeof s1);
    double est_n = (double)(s1.est_live_count - s0.est_live_count);
    double est_b = (double)(s1.est_live_bytes - s0.est_live_bytes);
    uint64_t recorded = s1.live_count - s0.live_count;
    printf("%zu blocks of %zu bytes: %llu recorded, estimated %.0f blocks, %.0f bytes\n", n, size,
           (unsigned long long)recorded, est_n, est_b);
    CHECK_EQ(s1.calls[MT_FN_MALLOC] - s0.calls[MT_FN_MALLOC], n);
    CHECK(recorded > 0 && recorded < n / 2);
    CHECK(near(est_n, (double)n, share));
    CHECK(near(est_b, (double)(n * size), share));
}

/* A block of 1 byte allocated d calls deep: a stack of its own for each d. */
static __attribute__((noinline)) char *at_depth(int d) {
    char *p = d ? at_depth(d - 1) : malloc(1);
    __asm__ volatile("" ::: "memory"); /* a call, not a jump: a frame each */
    return p;
}

/* At R = 1 byte, blocks of 1 byte: each is sampled with p = 1 - 1/e, and the
 * estimated count lands on the truth.  The countdown once rounded its gap
 * down, sampling the block after each sample more often: 1.30 times the
 * truth here (about 1/R too high in general). */
static int tiny_blocks(void) {
    static char *tiny[500000];
    struct mtrace_stats s0, s1;
    api->stats(&s0, sizeof s0);
    CHECK_EQ(s0.sample_bytes, 1);
    for (size_t i = 0; i < 500000; i++)
        tiny[i] = malloc(1);
    api->stats(&s1, sizeof s1);
    double est_n = (double)(s1.est_live_count - s0.est_live_count);
    printf("500000 blocks of 1 byte at R = 1: estimated %.0f blocks\n", est_n);
    CHECK(near(est_n, 500000.0, 0.02)); /* 0.1% spread */
    for (size_t i = 0; i < 500000; i++)
        free(tiny[i]);
    /* 64 blocks, each at a site of its own (MTRACE_DEPTH=128 tells their
     * stacks apart), about 40 of them sampled, each weighing 1.58: the
     * sites' total estimate is the live one, rounded once.  Summed site by
     * site it was 2 a sampled block, a quarter too many. */
    for (int d = 0; d < 64; d++)
        tiny[d] = at_depth(d);
    static struct mtrace_site sites[128];
    struct mtrace_site total;
    memset(&total, 0, sizeof total);
    api->stats(&s1, sizeof s1);
    struct mtrace_query q = MTRACE_QUERY_ALL(MTRACE_BY_BYTES, 128);
    size_t n_sites = 0, one_block = 0;
    CHECK_EQ(api->sites(&q, sites, &n_sites, &total), MTRACE_OK);
    for (size_t i = 0; i < n_sites; i++)
        one_block += sites[i].count == 1 && sites[i].bytes == 1;
    printf("%zu one-block sites of 1 byte: total estimate %llu, live estimate %llu\n", one_block,
           (unsigned long long)total.est_count, (unsigned long long)s1.est_live_count);
    CHECK(one_block >= 25); /* 64 x 0.63 = 40, 3.9 standard deviations */
    CHECK(total.est_count + 1 >= s1.est_live_count && total.est_count <= s1.est_live_count + 1);
    for (int d = 0; d < 64; d++)
        free(tiny[d]);
    return check_summary();
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "tiny")) {
        api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
        CHECK(api != NULL);
        return api ? tiny_blocks() : check_summary();
    }
    if (!getenv("MTRACE_SAMPLE_BYTES")) {
        setenv("MTRACE_SAMPLE_BYTES", "16384", 1);
        check_exec_self(argv);
        perror("execv");
        return 1;
    }
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api || api->size < sizeof *api)
        return check_summary();
    struct mtrace_stats m0, m1;
    api->stats(&m0, sizeof m0);
    CHECK_EQ(m0.sample_bytes, R);
    /* A request of 2^63 bytes or more fails, and does not take this
     * thread's sampling away (read as negative it pushed the next sample
     * point out by 2^63 bytes: then nothing below was sampled). */
    volatile size_t huge = (size_t)1 << 63 | 4096;
    void *none = malloc(huge);
    CHECK(none == NULL);
    /* Expected samples: 20000 * (1 - e^(-4096/16384)) = 4424 (1.3% spread)
     * and 400000 * (1 - e^(-64/16384)) = 1559 (2.5%): the bounds are over
     * six standard deviations wide. */
    check_estimates(0, BIG_N, BIG_SIZE, 0.10);
    check_estimates(BIG_N, SMALL_N, SMALL_SIZE, 0.15);
    for (size_t i = 0; i < BIG_N + SMALL_N; i++)
        free(blocks[i]);
    api->stats(&m1, sizeof m1);
    /* Weights are integers, added and taken away exactly: back to where it
     * started, give or take stdio's buffer (one sample weighs about 4). */
    CHECK(m1.est_live_count <= m0.est_live_count + 8);
    int failed = check_summary();
    setenv("MTRACE_SAMPLE_BYTES", "1", 1);
    setenv("MTRACE_DEPTH", "128", 1);
    return !check_child(argv[0], "tiny") || failed;
}
