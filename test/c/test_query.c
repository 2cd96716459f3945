/* The contract over a known table, without the hooks (the preload's other
 * files linked in; nothing is interposed): olds and sites compared with a
 * brute force on every query bound, stack sets, orders, limits and bad
 * arguments with their result codes; reset and stats; and queries racing a
 * writer.  Small enough to run under AddressSanitizer and valgrind. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"
#include "stacks.h"
#include "table.h"

extern const struct mtrace_api mtrace_api_v2;
static const struct mtrace_api *api = &mtrace_api_v2;

/* --- a known table ---------------------------------------------------------- */

#define N 20000
#define STACKS 60

static struct mtrace_alloc known[N];
static size_t n_known;
static uint32_t stack_ids[STACKS + 1];

static int older(const struct mtrace_alloc *a, const struct mtrace_alloc *b) {
    return a->t_ms != b->t_ms ? a->t_ms < b->t_ms : a->addr < b->addr;
}

static int cmp_older(const void *a, const void *b) {
    return older(a, b) ? -1 : older(b, a) ? 1 : 0;
}

static void fill(unsigned seed) {
    for (uint32_t s = 1; s <= STACKS; s++) {
        uintptr_t ips[4] = {0x400000 + s, 0x500000 + s * 7, 0x600000, s % 3};
        stack_ids[s] = mt_stack_intern(ips, 1 + s % 4);
    }
    n_known = 0;
    for (size_t i = 0; i < N; i++) {
        struct mtrace_alloc a;
        a.addr = 0x10000000ull + (uint64_t)i * 48 + (uint64_t)(rand_r(&seed) % 3) * 16;
        a.size = 1 + (uint64_t)rand_r(&seed) % 10000;
        a.t_ms = 1 + (uint64_t)rand_r(&seed) % 1000;
        unsigned k = (unsigned)rand_r(&seed) % (STACKS + 5);
        a.stack_id = k < STACKS ? stack_ids[k + 1] : MTRACE_NO_STACK;
        a.reserved = 0;
        if (mt_table_insert(a.addr, a.size, a.t_ms, a.stack_id) == MT_INSERTED)
            known[n_known++] = a;
    }
}

static int keeps(const struct mtrace_alloc *a, const struct mtrace_query *q) {
    if (a->t_ms < q->min_t_ms || a->t_ms > q->max_t_ms || a->size < q->min_size ||
        a->size > q->max_size)
        return 0;
    return !q->stack_set || (a->stack_id < q->stack_set_bits &&
                             ((q->stack_set[a->stack_id / 64] >> (a->stack_id % 64)) & 1));
}

/* --- olds ------------------------------------------------------------------- */

static struct mtrace_alloc expect[N], got[N + 8192];

static size_t brute_olds(const struct mtrace_query *q, size_t n) {
    size_t m = 0;
    for (size_t i = 0; i < n_known; i++)
        if (keeps(&known[i], q))
            expect[m++] = known[i];
    qsort(expect, m, sizeof *expect, cmp_older);
    return m < n ? m : n;
}

/* olds against the brute force. */
static int olds_agree(const struct mtrace_query *q, size_t n) {
    size_t want = brute_olds(q, n);
    size_t have = query_olds(api, q, got, n);
    if (have != want)
        return 0;
    for (size_t i = 0; i < have; i++)
        if (got[i].addr != expect[i].addr || got[i].size != expect[i].size ||
            got[i].t_ms != expect[i].t_ms || got[i].stack_id != expect[i].stack_id)
            return 0;
    return 1;
}

static uint64_t stack_set[(MTRACE_MAX_STACK_ID + 1) / 64 + 1];

static void random_query(unsigned *seed, struct mtrace_query *q) {
    *q = MTRACE_QUERY_ALL(MTRACE_BY_OLDEST, 0);
    unsigned r = (unsigned)rand_r(seed);
    if (r & 1)
        q->min_t_ms = 1 + (uint64_t)rand_r(seed) % 1000;
    if (r & 2)
        q->max_t_ms = 1 + (uint64_t)rand_r(seed) % 1000;
    if (r & 4)
        q->min_size = 1 + (uint64_t)rand_r(seed) % 10000;
    if (r & 8)
        q->max_size = 1 + (uint64_t)rand_r(seed) % 10000;
    if (r & 16) {
        memset(stack_set, 0, sizeof stack_set);
        for (uint32_t s = 0; s <= STACKS; s++)
            if (rand_r(seed) % 2)
                stack_set[stack_ids[s] / 64] |= 1ull << (stack_ids[s] % 64);
        q->stack_set = stack_set;
        q->stack_set_bits = r & 32 ? stack_ids[STACKS / 2] : MTRACE_MAX_STACK_ID + 1;
    }
}

static void test_olds(void) {
    struct mtrace_query all = MTRACE_QUERY_ALL(MTRACE_BY_OLDEST, 0);
    CHECK(olds_agree(&all, N + 16));
    CHECK(olds_agree(&all, 1));
    CHECK(olds_agree(&all, 100));
    CHECK_EQ(query_olds(api, NULL, got, 0), 0);
    CHECK_EQ(query_olds(api, NULL, got, N + 16), n_known);
    /* Each bound on its own, at its edges. */
    struct mtrace_query q = all;
    q.min_t_ms = 500;
    CHECK(olds_agree(&q, N));
    q = all;
    q.max_t_ms = 500;
    CHECK(olds_agree(&q, N));
    q = all;
    q.min_t_ms = q.max_t_ms = 777;
    CHECK(olds_agree(&q, N));
    q = all;
    q.min_size = 9999;
    CHECK(olds_agree(&q, N));
    q = all;
    q.max_size = 1;
    CHECK(olds_agree(&q, N));
    q = all;
    q.max_size = 0; /* only empty blocks: none here */
    CHECK_EQ(query_olds(api, &q, got, N), 0);
    q = all;
    q.min_size = 6000;
    q.max_size = 5000; /* empty range */
    CHECK_EQ(query_olds(api, &q, got, N), 0);
    q = all;
    q.min_t_ms = 2000; /* after everything */
    CHECK_EQ(query_olds(api, &q, got, N), 0);

    /* Largest first, ties oldest first. */
    q = all;
    q.order = MTRACE_BY_BYTES;
    q.limit = 50;
    size_t written = 99, bad = 0;
    CHECK_EQ(api->olds(&q, got, &written), MTRACE_OK);
    CHECK_EQ(written, 50);
    uint64_t largest = 0;
    for (size_t i = 0; i < n_known; i++)
        largest = known[i].size > largest ? known[i].size : largest;
    CHECK_EQ(got[0].size, largest);
    for (size_t i = 1; i < written; i++)
        bad += got[i].size > got[i - 1].size ||
               (got[i].size == got[i - 1].size && older(&got[i], &got[i - 1]));
    CHECK_EQ(bad, 0);

    /* Result codes. */
    q = all;
    q.limit = 10;
    CHECK_EQ(api->olds(NULL, got, &written), MTRACE_ERR_ARGUMENT);
    CHECK_EQ(api->olds(&q, NULL, &written), MTRACE_ERR_ARGUMENT);
    CHECK_EQ(written, 0);
    CHECK_EQ(api->olds(&q, got, NULL), MTRACE_ERR_ARGUMENT);
    q.order = MTRACE_BY_COUNT; /* not an order of single allocations */
    CHECK_EQ(api->olds(&q, got, &written), MTRACE_ERR_ARGUMENT);
    q.order = 77;
    CHECK_EQ(api->olds(&q, got, &written), MTRACE_ERR_ARGUMENT);
    q.order = MTRACE_BY_OLDEST;
    q.limit = 0;
    CHECK_EQ(api->olds(&q, NULL, &written), MTRACE_OK); /* nothing asked, nothing written */
    CHECK_EQ(written, 0);

    /* The reader's own thread_ignore setting is its own. */
    CHECK_EQ(api->thread_ignore(1), 0);
    query_olds(api, NULL, got, 10);
    CHECK_EQ(api->thread_ignore(0), 1);
}

static void test_olds_stack_set(void) {
    struct mtrace_query q = MTRACE_QUERY_ALL(MTRACE_BY_OLDEST, 0);
    q.stack_set = stack_set;
    q.stack_set_bits = MTRACE_MAX_STACK_ID + 1;
    memset(stack_set, 0, sizeof stack_set);
    CHECK_EQ(query_olds(api, &q, got, N), 0); /* an empty set keeps nothing */
    stack_set[0] = 1;                         /* only "no stack" */
    CHECK(olds_agree(&q, N));
    CHECK(brute_olds(&q, N) > 0);
    stack_set[stack_ids[7] / 64] |= 1ull << (stack_ids[7] % 64);
    CHECK(olds_agree(&q, N));
    q.stack_set_bits = 0; /* every id at or beyond the bits: nothing */
    CHECK_EQ(query_olds(api, &q, got, N), 0);
    q.stack_set = NULL; /* no set: everything */
    CHECK_EQ(query_olds(api, &q, got, N + 16), n_known);
    unsigned seed = 3;
    int agree = 0;
    for (int i = 0; i < 200; i++) {
        random_query(&seed, &q);
        agree += olds_agree(&q, 1 + (size_t)rand_r(&seed) % 300);
    }
    CHECK_EQ(agree, 200);
}

/* --- sites ------------------------------------------------------------------ */

struct group {
    uint64_t count, bytes, oldest, newest;
};
static struct group groups[STACKS + 2];

static size_t group_of(uint32_t id) {
    for (size_t s = 0; s <= STACKS; s++)
        if (stack_ids[s] == id)
            return s;
    return STACKS + 1;
}

static uint64_t key(const struct mtrace_site *s, int order) {
    return order == MTRACE_BY_BYTES   ? s->bytes
           : order == MTRACE_BY_COUNT ? s->count
                                      : UINT64_MAX - s->oldest_t_ms;
}

static uint64_t group_key(const struct group *g, int order) {
    return order == MTRACE_BY_BYTES   ? g->bytes
           : order == MTRACE_BY_COUNT ? g->count
                                      : UINT64_MAX - g->oldest;
}

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

/* sites against the brute force: each site's figures, the total, and that
 * the n returned are the n best by the order's key, best first. */
static int sites_agree(const struct mtrace_query *q, int order, size_t n) {
    static struct mtrace_site out[STACKS + 8];
    static uint64_t keys[STACKS + 2];
    memset(groups, 0, sizeof groups);
    struct group total = {0, 0, UINT64_MAX, 0};
    for (size_t i = 0; i < n_known; i++) {
        if (!keeps(&known[i], q))
            continue;
        struct group *g = &groups[group_of(known[i].stack_id)];
        uint64_t t = known[i].t_ms;
        if (!g->count || t < g->oldest)
            g->oldest = t;
        if (!g->count || t > g->newest)
            g->newest = t;
        g->count++;
        g->bytes += known[i].size;
        total.count++;
        total.bytes += known[i].size;
        total.oldest = t < total.oldest ? t : total.oldest;
        total.newest = t > total.newest ? t : total.newest;
    }
    size_t m = 0;
    for (size_t s = 0; s <= STACKS; s++)
        if (groups[s].count)
            keys[m++] = group_key(&groups[s], order);
    qsort(keys, m, sizeof *keys, cmp_desc);

    struct mtrace_site sum;
    memset(&sum, 0xff, sizeof sum);
    size_t have = query_sites(api, q, out, n, order, &sum);
    if (have != (m < n ? m : n) || sum.count != total.count || sum.bytes != total.bytes)
        return 0;
    if (sum.est_count != sum.count || sum.est_bytes != sum.bytes) /* lossless: exact */
        return 0;
    if (total.count && (sum.oldest_t_ms != total.oldest || sum.newest_t_ms != total.newest))
        return 0;
    for (size_t i = 0; i < have; i++) {
        const struct group *g = &groups[group_of(out[i].stack_id)];
        if (group_of(out[i].stack_id) > STACKS || out[i].count != g->count ||
            out[i].bytes != g->bytes || out[i].oldest_t_ms != g->oldest ||
            out[i].newest_t_ms != g->newest || key(&out[i], order) != keys[i] ||
            out[i].est_count != out[i].count || out[i].est_bytes != out[i].bytes)
            return 0;
    }
    return 1;
}

static void test_sites(void) {
    struct mtrace_query all = MTRACE_QUERY_ALL(MTRACE_BY_BYTES, 0);
    for (int order = MTRACE_BY_BYTES; order <= MTRACE_BY_OLDEST; order++) {
        CHECK(sites_agree(&all, order, STACKS + 8));
        CHECK(sites_agree(&all, order, 5));
        CHECK(sites_agree(&all, order, 1));
    }
    struct mtrace_site out[4], total;
    CHECK_EQ(query_sites(api, NULL, out, 4, MTRACE_BY_BYTES, &total), 4);
    CHECK_EQ(total.count, n_known);
    CHECK_EQ(query_sites(api, &all, out, 0, MTRACE_BY_COUNT, &total), 0); /* the total alone */
    CHECK_EQ(total.count, n_known);
    /* Result codes. */
    size_t written = 99;
    struct mtrace_query q = all;
    CHECK_EQ(api->sites(&q, NULL, &written, NULL), MTRACE_OK); /* limit 0: nothing written */
    CHECK_EQ(written, 0);
    q.limit = 4;
    CHECK_EQ(api->sites(&q, NULL, &written, &total), MTRACE_ERR_ARGUMENT);
    CHECK_EQ(api->sites(NULL, out, &written, &total), MTRACE_ERR_ARGUMENT);
    CHECK_EQ(api->sites(&q, out, NULL, &total), MTRACE_ERR_ARGUMENT);
    q.order = 3;
    CHECK_EQ(api->sites(&q, out, &written, &total), MTRACE_ERR_ARGUMENT);
    q.order = 1000000;
    CHECK_EQ(api->sites(&q, out, &written, NULL), MTRACE_ERR_ARGUMENT);
    CHECK_EQ(written, 0);
    unsigned seed = 5;
    int agree = 0;
    for (int i = 0; i < 150; i++) {
        struct mtrace_query q;
        random_query(&seed, &q);
        agree += sites_agree(&q, i % 3, 1 + (size_t)rand_r(&seed) % (STACKS + 4));
    }
    CHECK_EQ(agree, 150);
    /* An entry whose stack id was never interned is left out, not looked up. */
    CHECK_EQ(mt_table_insert(0x7000000000ull, 123, 5, MTRACE_MAX_STACK_ID), MT_INSERTED);
    CHECK(sites_agree(&all, MTRACE_BY_COUNT, STACKS + 8));
    CHECK(mt_table_remove(0x7000000000ull, NULL));
}

/* --- stacks, stats, reset ----------------------------------------------------- */

static void test_stacks_and_stats(void) {
    uintptr_t ips[8];
    CHECK_EQ(api->stack(MTRACE_NO_STACK, ips, 8), 0);
    CHECK_EQ(api->stack(MTRACE_MAX_STACK_ID, ips, 8), 0);
    CHECK_EQ(api->stack(stack_ids[4], ips, 8), 1 + 4 % 4);
    CHECK_EQ(api->stack(stack_ids[3], ips, 8), 4);
    CHECK_EQ(api->stack(stack_ids[3], ips, 2), 2);
    CHECK_EQ(ips[0], 0x400003);
    CHECK_EQ(api->stack(stack_ids[3], ips, 0), 0);

    struct mtrace_stats s;
    uint64_t before = api->now_ms();
    CHECK_EQ(api->stats(&s, sizeof s), MTRACE_OK);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n_known; i++)
        bytes += known[i].size;
    CHECK_EQ(s.live_count, n_known);
    CHECK_EQ(s.live_bytes, bytes);
    CHECK_EQ(s.shards, MT_SHARDS);
    CHECK(s.stacks >= STACKS);
    CHECK(s.now_ms >= before && s.now_ms <= api->now_ms());
    CHECK_EQ(s.sample_bytes, 0);
    CHECK_EQ(s.est_live_count, n_known);
    CHECK_EQ(s.est_live_bytes, bytes);
    unsigned char small[4];
    memset(small, 0xee, sizeof small);
    api->stats((struct mtrace_stats *)(void *)small, 2); /* writes 2 bytes, no more */
    CHECK_EQ(small[2], 0xee);
    CHECK_EQ(small[3], 0xee);
    CHECK_EQ(api->stats(NULL, sizeof s), MTRACE_ERR_ARGUMENT);
}

/* --- queries racing a writer --------------------------------------------------- */

static _Atomic int writer_done, query_rounds;

static void *writer(void *arg) {
    (void)arg;
    unsigned seed = 17;
    uint64_t base = 0x20000000000ull;
    for (int round = 0; round < 20000 || atomic_load(&query_rounds) < 300; round++) {
        uint64_t a = base + (uint64_t)(rand_r(&seed) % 4096) * 32;
        if (!mt_table_remove(a, NULL))
            mt_table_insert(a, 100 + (uint64_t)(rand_r(&seed) % 100), 1 + (uint64_t)round % 999,
                            stack_ids[1 + round % STACKS]);
    }
    atomic_store(&writer_done, 1);
    return NULL;
}

static void test_racing_writer(void) {
    pthread_t t;
    pthread_create(&t, NULL, writer, NULL);
    int bad = 0, rounds = 0;
    struct mtrace_query q = sized_query(100, 199);
    while (!atomic_load(&writer_done)) {
        size_t n = query_olds(api, &q, got, 64);
        for (size_t i = 0; i < n; i++)
            bad += got[i].size < 100 || got[i].size > 199 || (i && older(&got[i], &got[i - 1]));
        struct mtrace_site out[8], total;
        size_t ns = query_sites(api, &q, out, 8, MTRACE_BY_BYTES, &total);
        uint64_t c = 0;
        for (size_t i = 0; i < ns && i < 8; i++) {
            c += out[i].count;
            bad += out[i].bytes < 100 * out[i].count || out[i].bytes > 199 * out[i].count;
        }
        bad += ns > 8 || c > total.count;
        atomic_store(&query_rounds, ++rounds);
    }
    pthread_join(t, NULL);
    CHECK_EQ(bad, 0);
    printf("%d query rounds raced table writes\n", rounds);
    /* Settled: the counters and a full listing agree. */
    struct mtrace_stats s;
    api->stats(&s, sizeof s);
    size_t n = query_olds(api, NULL, got, N + 8192);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += got[i].size;
    CHECK_EQ(n, s.live_count);
    CHECK_EQ(bytes, s.live_bytes);
}

static void test_reset(void) {
    struct mtrace_stats s;
    api->stats(&s, sizeof s);
    CHECK_EQ(api->reset(), s.live_count);
    api->stats(&s, sizeof s);
    CHECK_EQ(s.live_count, 0);
    CHECK_EQ(s.live_bytes, 0);
    CHECK_EQ(query_olds(api, NULL, got, 16), 0);
    CHECK_EQ(api->reset(), 0);
    CHECK_EQ(mt_table_insert(0x1230, 7, 9, stack_ids[2]), MT_INSERTED);
    CHECK_EQ(query_olds(api, NULL, got, 16), 1);
    CHECK_EQ(got[0].stack_id, stack_ids[2]);
    CHECK_EQ(api->reset(), 1);
}

int main(void) {
    mt_stacks_init();
    fill(1);
    CHECK(n_known > N * 9 / 10);
    test_olds();
    test_olds_stack_set();
    test_sites();
    test_stacks_and_stats();
    test_racing_writer();
    test_reset();
    return check_summary();
}
