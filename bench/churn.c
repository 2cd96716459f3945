/*
 * Allocation churn, the workload a tracer must not slow down:
 *   churn THREADS PAIRS_PER_THREAD [disabled | disabled-after]
 * Each thread keeps a live window of 4096 pointers and replaces a random one
 * per step (free + malloc of 16..1040 bytes), always from call depth 12 below
 * its thread function, through 64 different call chains.
 * "disabled" turns tracking off through the preload's API first (as
 * Mtrace.disable/0 does), to measure the cost of a loaded but idle tracer;
 * "disabled-after" only once the windows are filled (and recorded), so the
 * frees also ask the table about blocks recorded before.
 * Prints "ns_per_pair N": wall time of the churn loop only, all threads.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mtrace_api.h"

#define WINDOW 4096
#define DEPTH 12
#define BATCH 64 /* steps per visit of the leaf */

struct worker {
    uint64_t pairs;
    uint64_t rng;
    void *window[WINDOW];
};

static inline uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static __attribute__((noinline)) void leaf(struct worker *w) {
    for (int i = 0; i < BATCH; i++) {
        uint64_t r = next(&w->rng);
        size_t k = r & (WINDOW - 1);
        free(w->window[k]);
        char *p = malloc(16 + (r >> 16) % 1025);
        p[0] = (char)r; /* touch it, as a real user would */
        w->window[k] = p;
    }
}

/* Two functions per level, chosen by a bit of the path: 64 distinct chains. */
static void level_a(struct worker *w, int n, unsigned path);
static void level_b(struct worker *w, int n, unsigned path);

static __attribute__((noinline)) void descend(struct worker *w, int n, unsigned path) {
    if (n == 0)
        leaf(w);
    else if ((path >> (n % 6)) & 1)
        level_a(w, n - 1, path);
    else
        level_b(w, n - 1, path);
    __asm__ __volatile__("" ::: "memory"); /* no tail call: keep the frame */
}

static __attribute__((noinline)) void level_a(struct worker *w, int n, unsigned path) {
    descend(w, n, path);
    __asm__ __volatile__("" ::: "memory");
}

static __attribute__((noinline)) void level_b(struct worker *w, int n, unsigned path) {
    descend(w, n, path);
    __asm__ __volatile__("" ::: "memory");
}

static void *run(void *arg) {
    struct worker *w = arg;
    for (uint64_t done = 0; done < w->pairs; done += BATCH)
        descend(w, DEPTH / 2, (unsigned)(next(&w->rng) & 63)); /* a + descend per level */
    return NULL;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: churn THREADS PAIRS_PER_THREAD [disabled]\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    uint64_t pairs = strtoull(argv[2], NULL, 10);
    if (threads < 1 || threads > 64 || pairs == 0) {
        fprintf(stderr, "churn: 1..64 threads and a positive pair count\n");
        return 2;
    }
    const char *mode = argc > 3 ? argv[3] : "";
    int after = !strcmp(mode, "disabled-after");
    const struct mtrace_api *api = NULL;
    if (after || !strcmp(mode, "disabled")) {
        api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
        if (!api) {
            fprintf(stderr, "churn: %s needs the preload (LD_PRELOAD=.../mtrace.so)\n", mode);
            return 2;
        }
        if (!after)
            api->set_enabled(0);
    }
    struct worker *ws = calloc((size_t)threads, sizeof *ws);
    pthread_t tid[64];
    for (int t = 0; t < threads; t++) {
        ws[t].pairs = pairs;
        ws[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
        for (int k = 0; k < WINDOW; k++) /* the window starts full, outside the timing */
            ws[t].window[k] = malloc(16 + (size_t)k % 1025);
    }
    if (after)
        api->set_enabled(0);
    double t0 = now_ns();
    for (int t = 0; t < threads; t++)
        pthread_create(&tid[t], NULL, run, &ws[t]);
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    double elapsed = now_ns() - t0;
    printf("ns_per_pair %.1f\n", elapsed / (double)pairs);
    return 0;
}
