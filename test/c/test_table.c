/* The allocation table on its own: exactness under growth, churn from
 * several threads, reset, and what happens when memory cannot be mapped. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <time.h>

#include "check.h"
#include "clock.h"
#include "math_lite.h"
#include "table.h"
#include "table_slot.h"

struct tally {
    uint64_t count, bytes, sum_addr;
};

static void tally_entries(void *ctx, const struct mt_entry *e, size_t n) {
    struct tally *t = ctx;
    for (size_t i = 0; i < n; i++) {
        t->count++;
        t->bytes += e[i].size;
        t->sum_addr += e[i].addr;
    }
}

static struct tally scan(void) {
    struct tally t = {0, 0, 0};
    mt_table_scan(tally_entries, &t);
    return t;
}

static void test_basics(void) {
    struct mt_entry old;
    CHECK_EQ(mt_table_insert(0x1000, 10, 5, 7), MT_INSERTED);
    CHECK_EQ(mt_table_insert(0x1010, 20, 6, 8), MT_INSERTED);
    CHECK_EQ(mt_table_insert(0x1000, 30, 9, 9), MT_REPLACED);
    CHECK(mt_table_remove(0x1000, &old));
    CHECK_EQ(old.size, 30);
    CHECK_EQ(old.t_ms, 9);
    CHECK_EQ(old.stack, 9);
    CHECK(!mt_table_remove(0x1000, NULL));
    CHECK(!mt_table_remove(0x9990, NULL));
    struct mt_table_figures f;
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, 1);
    CHECK_EQ(f.live_bytes, 20);
    CHECK_EQ(f.replaced, 1);
    CHECK_EQ(mt_table_reset(), 1);
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, 0);
    CHECK_EQ(f.table_bytes, 0); /* all of it back to the system */
}

/* What a 16-byte slot cannot hold goes to the spill, and comes back exact:
 * sizes of 128 MiB and more, odd and high addresses, and the same address
 * moving between slot and spill as its free is missed. */
static void test_spill(void) {
    const uint64_t big = (uint64_t)1 << 40, high = (uint64_t)1 << 50;
    struct mt_entry old;
    struct mt_table_figures f;
    mt_table_figures(&f);
    uint64_t replaced = f.replaced; /* counted since the start, across resets */
    CHECK_EQ(mt_table_insert(0x2000, big, 11, 3), MT_INSERTED);
    CHECK_EQ(mt_table_insert(0x2004, 5, 12, 4), MT_INSERTED);    /* not 8-aligned */
    CHECK_EQ(mt_table_insert(high + 16, 6, 13, 5), MT_INSERTED); /* above 2^48 */
    CHECK_EQ(mt_table_insert(0x2010, (1u << 27) - 1, 14, MTRACE_MAX_STACK_ID), MT_INSERTED);
    struct tally t = scan();
    CHECK_EQ(t.count, 4);
    CHECK_EQ(t.bytes, big + 5 + 6 + (1u << 27) - 1);
    CHECK_EQ(t.sum_addr, 0x2000 + 0x2004 + high + 16 + 0x2010);
    CHECK(mt_table_remove(0x2010, &old)); /* the largest size a slot holds */
    CHECK_EQ(old.size, (1u << 27) - 1);
    CHECK_EQ(old.stack, MTRACE_MAX_STACK_ID);
    CHECK_EQ(old.t_ms, 14);
    /* A missed free: the slot's small block becomes a big one, and back. */
    CHECK_EQ(mt_table_insert(0x3000, 7, 15, 6), MT_INSERTED);
    CHECK_EQ(mt_table_insert(0x3000, big, 16, 7), MT_REPLACED);
    CHECK_EQ(mt_table_insert(0x2000, 8, 17, 8), MT_REPLACED);
    CHECK(mt_table_remove(0x3000, &old));
    CHECK_EQ(old.size, big);
    CHECK_EQ(old.t_ms, 16);
    CHECK(mt_table_remove(0x2000, &old));
    CHECK_EQ(old.size, 8);
    CHECK(mt_table_remove(0x2004, &old));
    CHECK_EQ(old.size, 5);
    CHECK_EQ(old.stack, 4);
    CHECK(mt_table_remove(high + 16, &old));
    CHECK_EQ(old.t_ms, 13);
    CHECK(!mt_table_remove(high + 16, NULL));
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, 0);
    CHECK_EQ(f.live_bytes, 0);
    CHECK_EQ(f.replaced - replaced, 2);
    CHECK_EQ(mt_table_reset(), 0);

    /* Many of them: the spill's array grows past a chunk of the table's
     * memory (it once overran it), and everything comes back. */
    const uint64_t n = 30000;
    int refused = 0;
    for (uint64_t i = 0; i < n; i++)
        refused += mt_table_insert(0x100004 + i * 16, i, i, 1) != MT_INSERTED;
    CHECK_EQ(refused, 0);
    t = scan();
    CHECK_EQ(t.count, n);
    CHECK_EQ(t.bytes, n * (n - 1) / 2);
    int missing = 0;
    for (uint64_t i = 0; i < n; i += 2)
        missing += !mt_table_remove(0x100004 + i * 16, NULL);
    CHECK_EQ(missing, 0);
    CHECK_EQ(mt_table_reset(), n / 2);

    /* 8-byte aligned blocks (jemalloc's and tcmalloc's smallest classes)
     * fit slots: more of them than the spill could ever hold, none dropped. */
    mt_table_figures(&f);
    uint64_t dropped_before = f.dropped;
    const uint64_t small = 100000;
    for (uint64_t i = 0; i < small; i++)
        refused += mt_table_insert(0x200008 + i * 16, 8, i, 1) != MT_INSERTED;
    CHECK_EQ(refused, 0);
    mt_table_figures(&f);
    CHECK_EQ(f.dropped, dropped_before);
    CHECK_EQ(f.live_count, small);
    CHECK(mt_table_remove(0x200008 + 16 * 777, &old));
    CHECK_EQ(old.addr, 0x200008 + 16 * 777);
    CHECK_EQ(old.t_ms, 777);
    CHECK_EQ(mt_table_reset(), small - 1);

    /* NULL is no block: never recorded, counted as dropped. */
    uint64_t dropped = f.dropped;
    CHECK_EQ(mt_table_insert(0, 8, 1, 1), MT_DROPPED);
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, 0);
    CHECK_EQ(f.dropped - dropped, 1);
}

/* Times are exact for 2^31 ms from an hour before the first entry, then
 * kept in steps of 1024 ms, never later than they were.  test_basics made
 * the first entry, at 5 ms: the epoch is 0. */
static void test_times(void) {
    struct mt_entry old;
    const uint64_t day = 86400000, t0 = 0;
    uint64_t ts[] = {t0, t0 + 1, t0 + (1ull << 31) - 1, t0 + 30 * day, t0 + 20000 * day};
    for (unsigned i = 0; i < sizeof ts / sizeof *ts; i++) {
        mt_table_insert(0x4000, 1, ts[i], 1);
        CHECK(mt_table_remove(0x4000, &old));
        CHECK(old.t_ms <= ts[i]);
        CHECK(ts[i] - old.t_ms < (ts[i] - t0 < (1ull << 31) ? 1 : 1024));
    }
    mt_table_reset();
}

static uint64_t libc_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The table's clock is the C library's coarse monotonic clock, read
 * through the vDSO wherever the kernel maps one (not under valgrind, which
 * hides it: then through the C library). */
static void test_clock(void) {
    uint64_t before = libc_now_ms(), t = mt_now_ms();
    CHECK(before <= t && t <= libc_now_ms());
    mt_clock_init();
#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
    CHECK_EQ(mt_clock_from_vdso(), getauxval(AT_SYSINFO_EHDR) != 0);
#endif
    for (int i = 0; i < 3; i++) {
        before = libc_now_ms();
        t = mt_now_ms();
        CHECK(before <= t && t <= libc_now_ms());
        struct timespec pause = {0, 3000000};
        nanosleep(&pause, NULL);
    }
}

/* A slot's time code: exact for 2^31 ms after the epoch, then 1024 ms
 * steps, never later than the time, capped at 32 bits; a time before the
 * epoch (which a monotonic clock cannot give) is kept as the epoch. */
static void test_time_codes(void) {
    const uint64_t e = 1000;
    CHECK_EQ(time_code(999, e), 0);
    CHECK_EQ(time_code(0, e), 0);
    CHECK_EQ(time_code(e, e), 0);
    CHECK_EQ(time_code(e + TIME_EXACT - 1, e), TIME_EXACT - 1);
    CHECK_EQ(time_code(e + TIME_EXACT, e), TIME_EXACT);
    CHECK_EQ(time_code(e + TIME_EXACT + 2047, e), TIME_EXACT + 1);
    CHECK_EQ(time_code(UINT64_MAX, e), UINT32_MAX);
    const uint64_t ts[] = {e, e + 5, e + TIME_EXACT - 1, e + TIME_EXACT + 5000, e + (1ull << 40)};
    for (unsigned i = 0; i < sizeof ts / sizeof *ts; i++) {
        uint64_t back = time_of(time_code(ts[i], e), e);
        CHECK(back <= ts[i]);
        CHECK(ts[i] - back < (ts[i] - e < TIME_EXACT ? 1 : 1024));
    }
}

/* Grows every shard many times over, then empties it in a scattered order:
 * every split and deletion must keep each remaining entry reachable. */
static void test_growth(void) {
    const uint64_t n = 1000000;
    for (uint64_t i = 1; i <= n; i++)
        mt_table_insert(i * 16, i % 1000, i, (uint32_t)(i % 100));
    struct mt_table_figures f;
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, n);
    CHECK(f.table_bytes / n <= 40);
    printf("table bytes per live entry at %llu entries: %.1f\n", (unsigned long long)n,
           (double)f.table_bytes / (double)n);
    int missing = 0;
    for (uint64_t i = 1; i <= n; i += 2)
        missing += !mt_table_remove(i * 16, NULL);
    CHECK_EQ(missing, 0);
    for (uint64_t i = 2; i <= n; i += 2)
        missing += !mt_table_remove(i * 16, NULL);
    CHECK_EQ(missing, 0);
    CHECK_EQ(scan().count, 0);
    mt_table_reset();
}

#define THREADS 4
#define OPS 400000
#define WINDOW 1024

/* Each thread owns its address range and keeps a sliding window live. */
static void *churn(void *arg) {
    uint64_t base = (uint64_t)(uintptr_t)arg << 40;
    uint64_t live[WINDOW] = {0};
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (uint64_t i = 1; i <= OPS; i++) {
        unsigned k = (unsigned)rand_r(&seed) % WINDOW;
        if (live[k] && !mt_table_remove(live[k], NULL))
            return (void *)1;
        live[k] = base + i * 16;
        mt_table_insert(live[k], 1, i, 1);
    }
    return NULL;
}

static void test_threads(void) {
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, churn, (void *)(i + 1));
    int lost = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        lost += r != NULL;
    }
    CHECK_EQ(lost, 0);
    struct tally t2 = scan();
    struct mt_table_figures f;
    mt_table_figures(&f);
    CHECK_EQ(t2.count, f.live_count);
    CHECK(t2.count <= THREADS * WINDOW);
    CHECK(t2.count > THREADS * WINDOW * 9 / 10); /* a full window, less a few collisions */
    mt_table_reset();
}

/* A query's work on the entries runs with no lock of the table's held, so
 * that it holds up no malloc or free (table_scan.c); every entry is still
 * seen once, the spill's too. */
static void check_unlocked(void *ctx, const struct mt_entry *e, size_t n) {
    unsigned held = 0;
    for (unsigned k = 0; k < MT_SHARDS; k++)
        held += atomic_load(&mt_shards[k].lock) != 0;
    CHECK_EQ(held, 0);
    tally_entries(ctx, e, n);
}

static void test_scan_unlocked(void) {
    const uint64_t n = 100000;
    for (uint64_t i = 1; i <= n; i++)
        CHECK_EQ(mt_table_insert(i * 48, i, i, 1), MT_INSERTED);
    CHECK_EQ(mt_table_insert(0x7000, (uint64_t)1 << 30, 1, 1), MT_INSERTED); /* spilled */
    struct tally t = {0, 0, 0};
    mt_table_scan(check_unlocked, &t);
    CHECK_EQ(t.count, n + 1);
    CHECK_EQ(t.bytes, n * (n + 1) / 2 + ((uint64_t)1 << 30));
    CHECK_EQ(mt_table_reset(), n + 1);
}

static int maps_left;
static void *failing_map(size_t bytes) {
    if (maps_left-- <= 0)
        return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* With no memory for growth, shards fill to their last free slot, then each
 * further insert is dropped and counted; what was recorded stays exact. */
static void test_map_failure(void) {
    maps_left = 1; /* one more chunk of small arrays, then nothing */
    mt_table_map_hook = failing_map;
    const uint64_t n = 200000;
    uint64_t inserted = 0, dropped = 0;
    struct mt_table_figures f;
    mt_table_figures(&f);
    uint64_t dropped_before = f.dropped; /* counted since the start */
    for (uint64_t i = 1; i <= n; i++) {
        if (mt_table_insert(i * 16, 1, i, 1) == MT_DROPPED)
            dropped++;
        else
            inserted++;
    }
    mt_table_figures(&f);
    CHECK(dropped > 0);
    CHECK_EQ(f.dropped - dropped_before, dropped);
    CHECK_EQ(f.live_count, inserted);
    CHECK_EQ(scan().count, inserted);
    CHECK_EQ(mt_table_reset(), inserted);
    mt_table_map_hook = NULL;
}

/* The preload's own ln and 1 - e^-x (for sampling's gaps and estimates)
 * agree with libm's to a few units in the last place, over every range
 * they are used in. */
static void test_math(void) {
    double worst_ln = 0, worst_exp = 0;
    for (double u = 1.0 / 9007199254740992.0; u <= 1; u *= 1.0009765625) {
        double want = log(u), got = mt_ln(u);
        double err = want ? fabs(got - want) / fabs(want) : fabs(got);
        worst_ln = err > worst_ln ? err : worst_ln;
    }
    CHECK_EQ(mt_ln(1), 0);
    for (double x = 1e-18; x < 60; x *= 1.0009765625) {
        double want = -expm1(-x), got = mt_one_minus_exp(x);
        double err = fabs(got - want) / want;
        worst_exp = err > worst_exp ? err : worst_exp;
    }
    CHECK(worst_ln < 1e-15);
    CHECK(worst_exp < 1e-15);
    CHECK_EQ(mt_one_minus_exp(0), 0);
    CHECK_EQ(mt_one_minus_exp(1e9), 1);
}

/* The filter while it is not kept (lossless tracking on) and after its
 * rebuild: exact again for what the table holds, whatever was inserted and
 * removed meanwhile, and for spilled entries too. */
static void test_filter_kept(void) {
    const uint64_t a = 0x7000000, b = 0x9000000, odd = 0x5008; /* odd: not 16-aligned, spilled */
    mt_table_reset();
    CHECK(mt_table_filter_exact());
    for (uint64_t i = 0; i < 2000; i++)
        mt_table_insert(a + i * 48, 32, 1, 1);
    mt_table_filter_keep(0);
    CHECK(!mt_table_filter_exact());
    for (uint64_t i = 0; i < 1000; i++) {
        mt_table_remove(a + i * 48, NULL);
        mt_table_insert(b + i * 48, 32, 1, 1);
    }
    mt_table_insert(odd, 8, 1, 1);
    mt_table_filter_keep(1);
    CHECK(mt_table_filter_exact());
    int missed = 0;
    for (uint64_t i = 0; i < 1000; i++)
        missed += !mt_table_may_hold(a + (1000 + i) * 48) + !mt_table_may_hold(b + i * 48);
    CHECK_EQ(missed, 0);
    CHECK(mt_table_may_hold(odd));
    CHECK(mt_table_remove(odd, NULL));
    for (uint64_t i = 0; i < 1000; i++) {
        mt_table_remove(a + (1000 + i) * 48, NULL);
        mt_table_remove(b + i * 48, NULL);
    }
    mt_table_filter_keep(0); /* the spilled entry saturated its shard's counts: */
    mt_table_filter_keep(1); /* a rebuild of the now empty table clears them */
    int nonzero = 0;
    for (size_t i = 0; i < sizeof mt_filter; i++)
        nonzero += mt_filter[i] != 0;
    CHECK_EQ(nonzero, 0);
    struct mt_table_figures f;
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, 0);
    mt_table_reset();
}

/* Each counter is its shard's, whichever of its 31 to 33 regions it
 * covers: after inserts and removals across 32 GiB of addresses while the
 * filter is not kept, a rebuild makes every one of its 2^20 counters the
 * number of entries in its KiB (modulo 1 GiB), saturated at 255. */
static void test_filter_rebuilt_exactly(void) {
    enum { N = 60000 };
    static uint64_t addrs[N];
    static uint16_t want[1u << MT_FILTER_BITS];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    mt_table_reset();
    mt_table_filter_keep(0);
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* The first 2048 in one KiB of 32 GiBs: their counter passes 255. */
        addrs[i] = i < 2048 ? ((uint64_t)i / 64 << 30) + 0x12345400 + (uint64_t)i % 64 * 16
                            : (x & 0x1fffffff0ull) + 16;
        if (mt_table_insert(addrs[i], 8, 1, 1) != MT_INSERTED)
            addrs[i] = 0; /* already there: counted once */
    }
    for (int i = 0; i < N; i += 3)
        if (addrs[i] && mt_table_remove(addrs[i], NULL))
            addrs[i] = 0;
    mt_table_filter_keep(1);
    for (int i = 0; i < N; i++)
        if (addrs[i])
            want[mt_filter_index(addrs[i])]++;
    int wrong = 0;
    for (size_t i = 0; i < sizeof mt_filter; i++)
        wrong += mt_filter[i] != (want[i] > 255 ? 255 : want[i]);
    CHECK_EQ(wrong, 0);
    /* Kept from here on: a removal brings its counter down again. */
    for (int i = 0; i < N; i++)
        if (addrs[i])
            CHECK(mt_table_remove(addrs[i], NULL));
    struct mt_table_figures f;
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, 0);
    int left = 0;
    for (size_t i = 0; i < sizeof mt_filter; i++)
        left += mt_filter[i] != 0 && !(want[i] > 255);
    CHECK_EQ(left, 0);
    mt_table_reset();
    for (size_t i = 0; i < sizeof mt_filter; i++)
        left += mt_filter[i] != 0;
    CHECK_EQ(left, 0);
}

int main(void) {
    test_math();
    test_filter_kept();
    test_basics();
    test_spill();
    test_times();
    test_clock();
    test_time_codes();
    test_growth();
    test_threads();
    test_scan_unlocked();
    test_map_failure();            /* its scan has no memory to copy into: under the locks */
    test_filter_rebuilt_exactly(); /* last: its duplicate inserts count as replaced */
    return check_summary();
}
