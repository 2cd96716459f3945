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
 *
 * In lockstep (bench/lockstep.h: CHURN_RING set, and CHURN_SLICES=S) the
 * pairs are run in S slices, one a turn, each after CHURN_WARM pairs (0
 * unless set) that are not timed, and it also prints "slices N N ...":
 * each slice's ns per pair, turn by turn.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lockstep.h"
#include "mtrace_api.h"

#define WINDOW 4096
#define DEPTH 12
#define BATCH 64 /* steps per visit of the leaf */

struct worker {
    uint64_t pairs; /* a slice's, in lockstep */
    uint64_t rng;
    double t0, t1; /* the last slice's start and end, in lockstep */
    void *window[WINDOW];
};

/* Lockstep: the workers run a slice between two barriers the main thread
 * also waits at, while it holds the ring's byte. */
static int slices;
/* Run untimed before each slice: the processes between two turns took
 * this one's lines out of the caches. */
static uint64_t warm_pairs;
static pthread_barrier_t slice_start, slice_end;

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

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void churn(struct worker *w, uint64_t pairs) {
    for (uint64_t done = 0; done < pairs; done += BATCH)
        descend(w, DEPTH / 2, (unsigned)(next(&w->rng) & 63)); /* a + descend per level */
}

static void *run(void *arg) {
    struct worker *w = arg;
    if (!slices) {
        churn(w, w->pairs);
        return NULL;
    }
    for (int i = 0; i < slices; i++) {
        pthread_barrier_wait(&slice_start);
        churn(w, warm_pairs);
        w->t0 = now_ns(); /* each worker times itself: waking it is not the slice's */
        churn(w, w->pairs);
        w->t1 = now_ns();
        pthread_barrier_wait(&slice_end);
    }
    return NULL;
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
    struct lockstep ring;
    int lockstep = lockstep_open(&ring);
    if (lockstep < 0)
        return 2;
    if (lockstep) {
        const char *sl = getenv("CHURN_SLICES");
        slices = sl ? atoi(sl) : 0;
        if (slices < 1 || pairs % (uint64_t)slices) {
            fprintf(stderr, "churn: in lockstep CHURN_SLICES divides the pairs\n");
            return 2;
        }
        const char *warm = getenv("CHURN_WARM");
        warm_pairs = warm ? strtoull(warm, NULL, 10) : 0;
        pthread_barrier_init(&slice_start, NULL, (unsigned)threads + 1);
        pthread_barrier_init(&slice_end, NULL, (unsigned)threads + 1);
        lockstep_wait(&ring); /* the setup takes its turn as well */
    }
    struct worker *ws = calloc((size_t)threads, sizeof *ws);
    pthread_t tid[64];
    for (int t = 0; t < threads; t++) {
        ws[t].pairs = slices ? pairs / (uint64_t)slices : pairs;
        ws[t].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1);
        for (int k = 0; k < WINDOW; k++) /* the window starts full, outside the timing */
            ws[t].window[k] = malloc(16 + (size_t)k % 1025);
    }
    if (after)
        api->set_enabled(0);
    if (slices)
        lockstep_hand_on(&ring, -1);
    double *slice_ns = slices ? calloc((size_t)slices, sizeof *slice_ns) : NULL;
    double t0 = now_ns(), busy = 0;
    for (int t = 0; t < threads; t++)
        pthread_create(&tid[t], NULL, run, &ws[t]);
    for (int i = 0; i < slices; i++) {
        lockstep_wait(&ring);
        pthread_barrier_wait(&slice_start);
        pthread_barrier_wait(&slice_end);
        lockstep_hand_on(&ring, i);
        double first = ws[0].t0, last = ws[0].t1;
        for (int t = 1; t < threads; t++) {
            first = ws[t].t0 < first ? ws[t].t0 : first;
            last = ws[t].t1 > last ? ws[t].t1 : last;
        }
        slice_ns[i] = last - first;
        busy += last - first;
    }
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    double elapsed = slices ? busy : now_ns() - t0;
    printf("ns_per_pair %.1f\n", elapsed / (double)pairs);
    if (slices) {
        printf("slices");
        for (int i = 0; i < slices; i++)
            printf(" %.2f", slice_ns[i] * (double)slices / (double)pairs);
        printf("\n");
    }
    return 0;
}
