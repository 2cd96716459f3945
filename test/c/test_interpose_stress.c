/* Eight threads, a million mixed allocator calls each, with the preload
 * tracking everything (run with LD_PRELOAD, MTRACE_PROGRAMS=test_interpose_stress):
 * malloc, calloc, realloc (grow, shrink, from NULL), reallocarray,
 * posix_memalign, aligned_alloc, memalign, valloc, strndup and free, on a
 * window of blocks per thread whose contents are checked before each block is
 * reallocated or freed.  The threads park before and after their calls, so
 * the counters move by exactly their calls; then the table must hold exactly
 * the blocks still live (same addresses, same sizes), nothing else new, and,
 * once they are freed, none of them.  MTRACE_STRESS=1 runs ten times as many
 * calls. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

#define THREADS 8
#define WINDOW 1024

static const struct mtrace_api *api;
static uint64_t ops_per_thread = 1000000;

struct block {
    unsigned char *p;
    size_t size; /* what the table must say */
    unsigned char seed;
};

struct worker {
    pthread_t tid;
    unsigned seed;
    struct block live[WINDOW];
    uint64_t calls[MT_FN_COUNT];
    uint64_t corrupt, failed;
};

static struct worker workers[THREADS];
static _Atomic int phase; /* 0 wait, 1 run, 2 free everything, 3 exit */
static _Atomic int parked;

static void wait_for(int want) {
    atomic_fetch_add(&parked, 1);
    while (atomic_load(&phase) < want)
        sched_yield();
}

static const char text[] = "the quick brown fox jumps over the lazy dog, again and again and again";

static size_t random_size(unsigned *seed) {
    unsigned r = (unsigned)rand_r(seed);
    if (r % 1024 == 0)
        return 128 * 1024 + r % 100000; /* sometimes past the mmap threshold */
    if (r % 16 == 0)
        return r % 16384;
    return r % 256;
}

/* First and last byte of a block carry its seed. */
static void mark(struct block *b) {
    if (b->size > 1)
        b->p[b->size - 1] = (unsigned char)(b->seed ^ 0x5a);
    if (b->size)
        b->p[0] = b->seed;
}

static int intact(const struct block *b, size_t upto) {
    size_t n = b->size < upto ? b->size : upto;
    if (!b->p || !n)
        return 1;
    if (b->p[0] != b->seed)
        return 0;
    return n < b->size || n == 1 || b->p[n - 1] == (unsigned char)(b->seed ^ 0x5a);
}

static void drop(struct worker *w, struct block *b) {
    if (!intact(b, SIZE_MAX))
        w->corrupt++;
    free(b->p);
    w->calls[MT_FN_FREE]++;
    b->p = NULL;
    b->size = 0;
}

static void one_op(struct worker *w, struct block *b) {
    unsigned r = (unsigned)rand_r(&w->seed);
    size_t n = random_size(&w->seed), al = (size_t)16 << ((r >> 8) % 9); /* 16 .. 4096 */
    int op = (int)(r % 16);
    if (op >= 3 && op <= 5 && !b->p)
        op = 0;
    if (op < 3 || op > 5) { /* a fresh block replaces whatever was there */
        if (b->p)
            drop(w, b);
        else if (op == 15) {
            free(NULL);
            w->calls[MT_FN_FREE]++;
            return;
        }
    }
    unsigned char *p = NULL;
    switch (op) {
    case 0:
    case 1:
    case 2:
        p = malloc(n);
        w->calls[MT_FN_MALLOC]++;
        break;
    case 3: /* realloc: grow or shrink an existing block */
    case 4:
        n = op == 3 ? b->size + n : b->size / 2;
        p = realloc(b->p, n);
        w->calls[MT_FN_REALLOC]++;
        if (!p && n) {
            w->failed++;
            return;
        }
        if (!intact(&(struct block){p, b->size, b->seed}, n))
            w->corrupt++;
        if (!p) { /* realloc(p, 0) freed it */
            b->p = NULL;
            b->size = 0;
            return;
        }
        break;
    case 5: /* reallocarray */
        p = reallocarray(b->p, 1 + n % 8, 1 + n / 8);
        w->calls[MT_FN_REALLOCARRAY]++;
        n = (1 + n % 8) * (1 + n / 8);
        if (!p) {
            w->failed++;
            return;
        }
        if (!intact(&(struct block){p, b->size, b->seed}, n))
            w->corrupt++;
        break;
    case 6:
        p = calloc(1 + n % 7, 1 + n / 7);
        w->calls[MT_FN_CALLOC]++;
        n = (1 + n % 7) * (1 + n / 7);
        for (size_t i = 0; p && i < n; i += 97)
            w->corrupt += p[i] != 0;
        break;
    case 7:
        p = realloc(NULL, n);
        w->calls[MT_FN_REALLOC]++;
        break;
    case 8: {
        void *q = NULL;
        if (posix_memalign(&q, al, n) != 0)
            q = NULL;
        p = q;
        w->calls[MT_FN_POSIX_MEMALIGN]++;
        break;
    }
    case 9:
        p = aligned_alloc(al, n);
        w->calls[MT_FN_ALIGNED_ALLOC]++;
        break;
    case 10:
        p = memalign(al, n);
        w->calls[MT_FN_MEMALIGN]++;
        break;
    case 11:
        if (r % 64 == 11) { /* a page each: keep them rare */
            p = valloc(n);
            w->calls[MT_FN_VALLOC]++;
            al = 4096;
        } else {
            p = (unsigned char *)strndup(text, n % sizeof text);
            w->calls[MT_FN_STRNDUP]++;
            n = strlen(text) < n % sizeof text ? strlen(text) + 1 : n % sizeof text + 1;
            al = 1;
        }
        break;
    default: /* free */
        return;
    }
    if (!p) {
        w->failed++;
        b->p = NULL;
        b->size = 0;
        return;
    }
    if ((op >= 8 && op <= 10) && (uintptr_t)p % al != 0)
        w->corrupt++;
    if (malloc_usable_size(p) < n)
        w->corrupt++;
    b->p = p;
    b->size = n;
    b->seed = (unsigned char)(r >> 16);
    mark(b);
}

static void *work(void *arg) {
    struct worker *w = arg;
    wait_for(1);
    for (uint64_t i = 0; i < ops_per_thread; i++)
        one_op(w, &w->live[(unsigned)rand_r(&w->seed) % WINDOW]);
    wait_for(2);
    for (int k = 0; k < WINDOW; k++)
        if (w->live[k].p)
            drop(w, &w->live[k]);
    wait_for(3);
    return NULL;
}

static void everyone_parked(int count) {
    while (atomic_load(&parked) < count)
        sched_yield();
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The table, sorted by address. */
static struct mtrace_alloc table_before[1 << 16], table_now[1 << 17], live_set[THREADS * WINDOW];

static int by_addr(const void *a, const void *b) {
    uint64_t x = ((const struct mtrace_alloc *)a)->addr, y = ((const struct mtrace_alloc *)b)->addr;
    return x < y ? -1 : x > y;
}

static size_t snapshot(struct mtrace_alloc *out, size_t cap) {
    size_t n = query_olds(api, NULL, out, cap);
    int was = api->thread_ignore(1);
    qsort(out, n, sizeof *out, by_addr);
    api->thread_ignore(was);
    return n;
}

static const struct mtrace_alloc *find(const struct mtrace_alloc *t, size_t n, uint64_t addr) {
    struct mtrace_alloc key = {.addr = addr};
    return bsearch(&key, t, n, sizeof *t, by_addr);
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    /* A quarter under an emulator: the full count takes 20 s there. */
    ops_per_thread = (uint64_t)check_rounds((long)ops_per_thread, 4, "operations a thread");

    printf("%d threads, %llu operations each\n", THREADS, (unsigned long long)ops_per_thread);
    fflush(stdout); /* stdio's buffer is allocated now, before the first snapshot */
    for (int i = 0; i < THREADS; i++) {
        workers[i].seed = 7u * (unsigned)i + 1;
        pthread_create(&workers[i].tid, NULL, work, &workers[i]);
    }
    everyone_parked(THREADS);
    struct mtrace_stats s0, s1, s2;
    size_t n_before = snapshot(table_before, sizeof table_before / sizeof *table_before);
    api->stats(&s0, sizeof s0);
    double t0 = now_s();
    atomic_store(&phase, 1);
    everyone_parked(2 * THREADS);
    double t1 = now_s();
    api->stats(&s1, sizeof s1);

    uint64_t corrupt = 0, failed = 0, expected = 0;
    uint64_t calls[MT_FN_COUNT] = {0};
    for (int i = 0; i < THREADS; i++) {
        corrupt += workers[i].corrupt;
        failed += workers[i].failed;
        for (int f = 0; f < MT_FN_COUNT; f++)
            calls[f] += workers[i].calls[f];
        for (int k = 0; k < WINDOW; k++)
            expected += workers[i].live[k].p != NULL;
    }
    printf("%d threads x %llu operations: %.2f s, %.0f ns per operation and thread\n", THREADS,
           (unsigned long long)ops_per_thread, t1 - t0, (t1 - t0) * 1e9 / (double)ops_per_thread);
    printf("calls: malloc %llu calloc %llu realloc %llu reallocarray %llu free %llu "
           "posix_memalign %llu aligned_alloc %llu memalign %llu valloc %llu strndup %llu\n",
           (unsigned long long)calls[MT_FN_MALLOC], (unsigned long long)calls[MT_FN_CALLOC],
           (unsigned long long)calls[MT_FN_REALLOC], (unsigned long long)calls[MT_FN_REALLOCARRAY],
           (unsigned long long)calls[MT_FN_FREE], (unsigned long long)calls[MT_FN_POSIX_MEMALIGN],
           (unsigned long long)calls[MT_FN_ALIGNED_ALLOC],
           (unsigned long long)calls[MT_FN_MEMALIGN], (unsigned long long)calls[MT_FN_VALLOC],
           (unsigned long long)calls[MT_FN_STRNDUP]);
    CHECK_EQ(corrupt, 0);
    CHECK_EQ(failed, 0);
    /* Every call seen, none invented. */
    for (int f = 0; f < MT_FN_COUNT; f++)
        CHECK_EQ(s1.calls[f] - s0.calls[f], calls[f]);
    CHECK_EQ(s1.dropped, s0.dropped);
    CHECK_EQ(s1.replaced, s0.replaced);

    /* The table: the blocks still live, exactly, and what was there before. */
    size_t n_now = snapshot(table_now, sizeof table_now / sizeof *table_now), n_live = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < WINDOW; k++) {
            const struct block *b = &workers[i].live[k];
            if (b->p) {
                live_set[n_live++] =
                    (struct mtrace_alloc){.addr = (uintptr_t)b->p, .size = b->size};
                bytes += b->size;
            }
        }
    int was = api->thread_ignore(1);
    qsort(live_set, n_live, sizeof *live_set, by_addr);
    api->thread_ignore(was);
    size_t found = 0, wrong_size = 0, phantom = 0;
    for (size_t i = 0; i < n_live; i++) {
        const struct mtrace_alloc *a = find(table_now, n_now, live_set[i].addr);
        found += a != NULL;
        wrong_size += a && a->size != live_set[i].size;
    }
    for (size_t i = 0; i < n_now; i++)
        phantom += !find(live_set, n_live, table_now[i].addr) &&
                   !find(table_before, n_before, table_now[i].addr);
    printf("%llu blocks live at the end, %zu recorded; %zu entries in the table\n",
           (unsigned long long)expected, found, n_now);
    CHECK_EQ(found, expected);
    CHECK_EQ(wrong_size, 0);
    CHECK_EQ(phantom, 0);
    CHECK_EQ(s1.live_count, n_now);
    CHECK_EQ(s1.live_count - s0.live_count, expected);
    CHECK_EQ(s1.live_bytes - s0.live_bytes, bytes);

    /* Freed, all of them are forgotten. */
    atomic_store(&phase, 2);
    everyone_parked(3 * THREADS);
    api->stats(&s2, sizeof s2);
    n_now = snapshot(table_now, sizeof table_now / sizeof *table_now);
    size_t left = 0;
    for (size_t i = 0; i < n_now; i++)
        left += !find(table_before, n_before, table_now[i].addr);
    CHECK_EQ(left, 0);
    CHECK_EQ(s2.live_count, s0.live_count);
    CHECK_EQ(s2.live_bytes, s0.live_bytes);
    CHECK_EQ(s2.calls[MT_FN_FREE] - s1.calls[MT_FN_FREE], expected);
    atomic_store(&phase, 3);
    for (int i = 0; i < THREADS; i++)
        pthread_join(workers[i].tid, NULL);
    return check_summary();
}
