/* The allocation table on its own: exactness under growth, churn from
 * several threads, reset, and what happens when memory cannot be mapped. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "table.h"

struct tally {
    uint64_t count, bytes, sum_addr;
};

static void tally_shard(void *ctx, const struct mt_slot *slots, size_t cap) {
    struct tally *t = ctx;
    for (size_t i = 0; i < cap; i++)
        if (slots[i].addr) {
            t->count++;
            t->bytes += slots[i].size;
            t->sum_addr += slots[i].addr;
        }
}

static struct tally scan(void) {
    struct tally t = {0, 0, 0};
    mt_table_scan(tally_shard, &t);
    return t;
}

static void test_basics(void) {
    struct mt_slot old;
    CHECK_EQ(mt_table_insert(0x1000, 10, 5, 7), MT_INSERTED);
    CHECK_EQ(mt_table_insert(0x1010, 20, 6, 8), MT_INSERTED);
    CHECK_EQ(mt_table_insert(0x1000, 30, 9, 9), MT_REPLACED);
    CHECK(mt_table_remove(0x1000, &old));
    CHECK_EQ(old.size, 30);
    CHECK_EQ(mt_slot_time(&old), 9);
    CHECK_EQ(mt_slot_stack(&old), 9);
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
    CHECK_EQ(f.table_bytes, 1u << 20); /* the chunk of small arrays stays for reuse */
}

/* Grows every shard many times over, then empties it in a scattered order:
 * backward-shift deletion must keep every remaining entry reachable. */
static void test_growth(void) {
    const uint64_t n = 1000000;
    for (uint64_t i = 1; i <= n; i++)
        mt_table_insert(i * 16, i % 1000, i, (uint32_t)(i % 100));
    struct mt_table_figures f;
    mt_table_figures(&f);
    CHECK_EQ(f.live_count, n);
    CHECK(f.table_bytes / n <= 64);
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
    for (uint64_t i = 1; i <= n; i++) {
        if (mt_table_insert(i * 16, 1, i, 1) == MT_DROPPED)
            dropped++;
        else
            inserted++;
    }
    struct mt_table_figures f;
    mt_table_figures(&f);
    CHECK(dropped > 0);
    CHECK_EQ(f.dropped, dropped);
    CHECK_EQ(f.live_count, inserted);
    CHECK_EQ(scan().count, inserted);
    CHECK_EQ(mt_table_reset(), inserted);
    mt_table_map_hook = NULL;
}

int main(void) {
    test_basics();
    test_growth();
    test_threads();
    test_map_failure();
    return check_summary();
}
