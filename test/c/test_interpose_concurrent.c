/* The reader's calls racing the allocators (run with the preload): four
 * threads allocate, reallocate and free blocks (some handed to another
 * thread to free) while one thread flips reset, disable and enable and
 * another asks olds (with and without a stack set), sites and stats, checking each answer for
 * internal consistency.  When the dust settles (tracking on, no more resets)
 * the allocators free their blocks and allocate a fresh set: the table must
 * then hold exactly that set, the counters must agree with the table, and
 * sites and olds with a stack set must account for every block.  MTRACE_STRESS=1 runs
 * ten times as many rounds. */
#define _GNU_SOURCE
#include <dlfcn.h>
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

#define ALLOCATORS 4
#define WINDOW 1024
#define MAILBOX 256
#define MIN_SIZE 5000 /* blocks of this test are 5000..5999 bytes: nothing else is */
#define MAX_SIZE 5999

static const struct mtrace_api *api;
static unsigned rounds = 10000;

struct allocator {
    pthread_t tid;
    unsigned seed;
    void *live[WINDOW];
    size_t size[WINDOW];
    uint64_t ops;
};
static struct allocator allocs[ALLOCATORS];
static void *_Atomic mailbox[MAILBOX]; /* blocks on their way to another thread's free */

static _Atomic int chaos_over, phase, parked;
static _Atomic uint64_t inconsistent; /* query answers that contradict themselves */

static void park_until(int want) {
    atomic_fetch_add(&parked, 1);
    while (atomic_load(&phase) < want)
        sched_yield();
}

static void wait_parked(int count) {
    while (atomic_load(&parked) < count)
        sched_yield();
}

static size_t block_size(unsigned *seed) {
    return MIN_SIZE + (size_t)rand_r(seed) % (MAX_SIZE - MIN_SIZE + 1);
}

static void *allocate(unsigned *seed, size_t n) {
    void *p = NULL;
    switch (rand_r(seed) % 4) {
    case 0:
        return malloc(n);
    case 1:
        return calloc(1, n);
    case 2:
        return realloc(NULL, n);
    default:
        return posix_memalign(&p, 64, n) == 0 ? p : NULL;
    }
}

static void churn_once(struct allocator *a) {
    unsigned k = (unsigned)rand_r(&a->seed) % WINDOW, r = (unsigned)rand_r(&a->seed);
    size_t n = block_size(&a->seed);
    if (r % 8 == 0 && a->live[k]) { /* resize in place or move */
        void *q = realloc(a->live[k], n);
        if (q) {
            a->live[k] = q;
            a->size[k] = n;
        }
    } else if (r % 8 == 1 && a->live[k]) { /* hand it to whichever thread comes next */
        void *other = atomic_exchange(&mailbox[r / 8 % MAILBOX], a->live[k]);
        free(other);
        a->live[k] = NULL;
    } else {
        free(a->live[k]);
        a->live[k] = allocate(&a->seed, n);
        a->size[k] = n;
    }
    a->ops++;
}

static void *allocator_main(void *arg) {
    struct allocator *a = arg;
    while (!atomic_load(&chaos_over))
        churn_once(a);
    park_until(1);
    /* The dust has settled: everything freed, a fresh set made. */
    for (int k = 0; k < WINDOW; k++) {
        free(a->live[k]);
        a->size[k] = block_size(&a->seed);
        a->live[k] = allocate(&a->seed, a->size[k]);
    }
    park_until(2);
    for (int k = 0; k < WINDOW; k++)
        free(a->live[k]);
    park_until(3);
    return NULL;
}

static void *switcher_main(void *arg) {
    (void)arg;
    unsigned seed = 99;
    for (unsigned i = 0; i < rounds; i++) {
        switch (rand_r(&seed) % 4) {
        case 0:
            api->reset();
            break;
        case 1:
            api->set_enabled(0);
            break;
        default:
            api->set_enabled(1);
        }
        if (i % 64 == 0)
            sched_yield();
    }
    api->set_enabled(1);
    return NULL;
}

static struct mtrace_query in_range; /* sized_query(MIN_SIZE, MAX_SIZE), set in main */

static int sorted_oldest_first(const struct mtrace_alloc *o, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (o[i - 1].t_ms > o[i].t_ms || (o[i - 1].t_ms == o[i].t_ms && o[i - 1].addr >= o[i].addr))
            return 0;
    return 1;
}

static int site_sane(const struct mtrace_site *s, uint64_t stacks) {
    return s->count > 0 && s->bytes >= s->count * MIN_SIZE && s->bytes <= s->count * MAX_SIZE &&
           s->oldest_t_ms <= s->newest_t_ms && s->stack_id <= stacks;
}

static int ranked(const struct mtrace_site *a, const struct mtrace_site *b, int order) {
    switch (order) {
    case MTRACE_BY_BYTES:
        return a->bytes >= b->bytes;
    case MTRACE_BY_COUNT:
        return a->count >= b->count;
    default:
        return a->oldest_t_ms <= b->oldest_t_ms;
    }
}

/* One round of questions; returns how many answers contradicted themselves. */
static uint64_t ask(uint64_t *stack_set, uint64_t set_bits) {
    static struct mtrace_alloc o[64];
    static struct mtrace_site s[16];
    uint64_t bad = 0;
    struct mtrace_stats st;
    api->stats(&st, sizeof st);
    size_t n = query_olds(api, &in_range, o, 64);
    bad += n > 64 || !sorted_oldest_first(o, n);
    for (size_t i = 0; i < n && i < 64; i++) {
        bad += o[i].size < MIN_SIZE || o[i].size > MAX_SIZE;
        if (o[i].stack_id < set_bits)
            stack_set[o[i].stack_id / 64] |= 1ull << (o[i].stack_id % 64);
    }
    struct mtrace_query where = in_range;
    where.stack_set = stack_set;
    where.stack_set_bits = set_bits;
    n = query_olds(api, &where, o, 64);
    bad += n > 64 || !sorted_oldest_first(o, n);
    for (size_t i = 0; i < n && i < 64; i++)
        bad += o[i].stack_id >= set_bits ||
               !((stack_set[o[i].stack_id / 64] >> (o[i].stack_id % 64)) & 1);
    for (int order = MTRACE_BY_BYTES; order <= MTRACE_BY_OLDEST; order++) {
        struct mtrace_site total;
        api->stats(&st, sizeof st);
        n = query_sites(api, &in_range, s, 16, order, &total);
        if (n == SIZE_MAX) /* no scratch memory: a legitimate answer */
            continue;
        uint64_t count = 0, bytes = 0, stacks = st.stacks + 64; /* stacks grow meanwhile */
        bad += n > 16;
        for (size_t i = 0; i < n && i < 16; i++) {
            bad += !site_sane(&s[i], stacks);
            bad += i > 0 && !ranked(&s[i - 1], &s[i], order);
            count += s[i].count;
            bytes += s[i].bytes;
        }
        bad += total.count < count || total.bytes < bytes;
        bad += total.count && !site_sane(&total, stacks);
    }
    return bad;
}

static uint64_t stack_set[(1u << 16) / 64];

static void *reader_main(void *arg) {
    (void)arg;
    uint64_t bad = 0, asked = 0;
    while (!atomic_load(&chaos_over)) {
        bad += ask(stack_set, 1u << 16);
        asked++;
    }
    atomic_fetch_add(&inconsistent, bad);
    printf(
        "reader: %llu rounds of olds, olds with a stack set, sites (3 orders) during the chaos\n",
        (unsigned long long)asked);
    return NULL;
}

static struct mtrace_alloc everything[1 << 16];
static struct mtrace_site sites[4096];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The settled table against the allocators' fresh sets. */
static void check_settled(void) {
    size_t n = query_olds(api, &in_range, everything, sizeof everything / sizeof *everything);
    size_t expected = 0, found = 0, wrong = 0;
    uint64_t bytes = 0;
    for (int t = 0; t < ALLOCATORS; t++)
        for (int k = 0; k < WINDOW; k++) {
            if (!allocs[t].live[k])
                continue;
            expected++;
            bytes += allocs[t].size[k];
            for (size_t i = 0; i < n; i++)
                if (everything[i].addr == (uintptr_t)allocs[t].live[k]) {
                    found++;
                    wrong += everything[i].size != allocs[t].size[k];
                    break;
                }
        }
    printf("settled: %zu blocks live, %zu recorded, %zu entries of this test in the table\n",
           expected, found, n);
    CHECK_EQ(expected, ALLOCATORS * WINDOW);
    CHECK_EQ(found, expected); /* none lost */
    CHECK_EQ(n, expected);     /* no phantom: every entry of this test is a live block */
    CHECK_EQ(wrong, 0);

    /* The counters agree with the table. */
    struct mtrace_stats st;
    api->stats(&st, sizeof st);
    size_t all = query_olds(api, NULL, everything, sizeof everything / sizeof *everything);
    CHECK_EQ(st.live_count, all);
    uint64_t all_bytes = 0;
    for (size_t i = 0; i < all; i++)
        all_bytes += everything[i].size;
    CHECK_EQ(st.live_bytes, all_bytes);

    struct mtrace_site total;
    size_t ns =
        query_sites(api, &in_range, sites, sizeof sites / sizeof *sites, MTRACE_BY_COUNT, &total);
    CHECK(ns != SIZE_MAX && ns > 0);
    if (ns == SIZE_MAX)
        return;
    uint64_t count = 0, site_bytes = 0;
    static uint64_t set[(1u << 16) / 64];
    uint64_t set_bits = 1u << 16;
    int ids_fit = 1;
    for (size_t i = 0; i < ns; i++) {
        count += sites[i].count;
        site_bytes += sites[i].bytes;
        if (sites[i].stack_id < set_bits)
            set[sites[i].stack_id / 64] |= 1ull << (sites[i].stack_id % 64);
        else
            ids_fit = 0;
        uintptr_t ips[4];
        CHECK(api->stack(sites[i].stack_id, ips, 4) >= 1);
    }
    printf("settled: %zu sites hold them\n", ns);
    CHECK_EQ(total.count, expected);
    CHECK_EQ(total.bytes, bytes);
    CHECK_EQ(count, expected);
    CHECK_EQ(site_bytes, bytes);
    CHECK(ids_fit);
    struct mtrace_query where = in_range;
    where.stack_set = set;
    where.stack_set_bits = set_bits;
    CHECK_EQ(query_olds(api, &where, everything, sizeof everything / sizeof *everything), expected);
    memset(set, 0, sizeof set);
    CHECK_EQ(query_olds(api, &where, everything, sizeof everything / sizeof *everything), 0);
}

/* Switched off with an empty table, frees skip the filters; a block whose
 * recording was under way at that moment must still be forgotten when it
 * is freed.  Two threads allocate and free at once (the table is empty
 * most of the time) while tracking flips off and on: no block of theirs
 * may be left in the table. */
#define FLIP_SIZE 7001
static _Atomic int flipping;

static void *flip_churn(void *arg) {
    (void)arg;
    while (atomic_load_explicit(&flipping, memory_order_relaxed))
        free(malloc(FLIP_SIZE));
    return NULL;
}

static void test_off_while_recording(void) {
    pthread_t t[2];
    atomic_store(&flipping, 1);
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, flip_churn, NULL);
    /* A reset holds every shard lock for a while: recordings under way
     * wait in the table, and complete just as tracking goes off (a tenth
     * as many flips under an emulator, whatever MTRACE_STRESS says). */
    unsigned flips = check_emulator() ? 6000 : 60000;
    for (unsigned r = 0; r < flips; r++) {
        api->set_enabled(1);
        api->reset(); /* empty, unless a block is between its malloc and free */
        api->set_enabled(0);
    }
    atomic_store(&flipping, 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    api->set_enabled(1);
    struct mtrace_query q = sized_query(FLIP_SIZE, FLIP_SIZE);
    size_t left = query_olds(api, &q, everything, 16);
    printf("switched off %u times during recording: %zu blocks left behind\n", flips, left);
    CHECK_EQ(left, 0);
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    in_range = sized_query(MIN_SIZE, MAX_SIZE);
    rounds = (unsigned)check_rounds(rounds, 1, "rounds");
    printf("%d allocating threads, %u rounds of reset/enable/disable\n", ALLOCATORS, rounds);
    fflush(stdout);

    pthread_t switcher, reader;
    double t0 = now_s();
    for (int i = 0; i < ALLOCATORS; i++) {
        allocs[i].seed = 11u * (unsigned)i + 5;
        pthread_create(&allocs[i].tid, NULL, allocator_main, &allocs[i]);
    }
    pthread_create(&reader, NULL, reader_main, NULL);
    pthread_create(&switcher, NULL, switcher_main, NULL);
    pthread_join(switcher, NULL);
    atomic_store(&chaos_over, 1);
    pthread_join(reader, NULL);
    wait_parked(ALLOCATORS);
    double t1 = now_s();
    uint64_t ops = 0;
    for (int i = 0; i < ALLOCATORS; i++)
        ops += allocs[i].ops;
    printf("chaos: %.2f s, %llu allocator operations\n", t1 - t0, (unsigned long long)ops);
    CHECK_EQ(atomic_load(&inconsistent), 0);

    /* Settle: tracking on, the mailbox emptied, fresh sets allocated. */
    struct mtrace_stats st;
    api->stats(&st, sizeof st);
    CHECK_EQ(st.enabled, 1);
    for (int i = 0; i < MAILBOX; i++)
        free(atomic_exchange(&mailbox[i], NULL));
    atomic_store(&phase, 1);
    wait_parked(2 * ALLOCATORS);
    check_settled();

    /* Freed, they are all forgotten. */
    atomic_store(&phase, 2);
    wait_parked(3 * ALLOCATORS);
    CHECK_EQ(query_olds(api, &in_range, everything, 16), 0);
    struct mtrace_site total;
    CHECK_EQ(query_sites(api, &in_range, sites, 16, MTRACE_BY_BYTES, &total), 0);
    CHECK_EQ(total.count, 0);
    atomic_store(&phase, 3);
    for (int i = 0; i < ALLOCATORS; i++)
        pthread_join(allocs[i].tid, NULL);
    test_off_while_recording();
    return check_summary();
}
