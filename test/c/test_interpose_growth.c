/* The table at scale and out of memory (run with the preload).
 *
 * This program defines its own mmap, which fails on demand.  The preload's
 * own mappings (table, stack store) resolve mmap through the global scope,
 * where the executable comes first, so they come through here; glibc's malloc
 * calls its internal __mmap and never does.  Both facts are checked before
 * they are relied on.  Then:
 *   - with every mapping failing, 300,000 allocations of all kinds still
 *     succeed; what the table could not hold is counted in `dropped`, and
 *     recorded + dropped = allocated, exactly;
 *   - with mappings back, the table grows to 10,000,000 live entries and
 *     holds exactly them (MTRACE_STRESS=1 also lists all of them with
 *     olds); time and memory are printed.
 * (Under an address-space limit: test_interpose_limit.c.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

static const struct mtrace_api *api;

/* --- mmap, as the preload sees it ----------------------------------------- */

static _Atomic int fail_maps;
static _Atomic uint64_t maps_preload, bytes_preload, maps_other, maps_failed, unmapped_preload;
static uintptr_t preload_lo, preload_hi; /* mtrace.so's address range */

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    uintptr_t caller = (uintptr_t)__builtin_return_address(0);
    int from_preload = caller >= preload_lo && caller < preload_hi;
    if (atomic_load(&fail_maps) && (flags & MAP_ANONYMOUS)) {
        atomic_fetch_add(&maps_failed, 1);
        errno = ENOMEM;
        return MAP_FAILED;
    }
    void *p = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (p != MAP_FAILED && from_preload) {
        atomic_fetch_add(&maps_preload, 1);
        atomic_fetch_add(&bytes_preload, len);
    } else if (p != MAP_FAILED) {
        atomic_fetch_add(&maps_other, 1);
    }
    return p;
}

int munmap(void *addr, size_t len) {
    uintptr_t caller = (uintptr_t)__builtin_return_address(0);
    int r = (int)syscall(SYS_munmap, addr, len);
    if (r == 0 && caller >= preload_lo && caller < preload_hi)
        atomic_fetch_add(&unmapped_preload, len);
    return r;
}

static int find_preload(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    uintptr_t want = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && want >= lo && want < lo + ph->p_memsz) {
            preload_lo = info->dlpi_addr;
            for (int j = 0; j < info->dlpi_phnum; j++)
                if (info->dlpi_phdr[j].p_type == PT_LOAD &&
                    info->dlpi_addr + info->dlpi_phdr[j].p_vaddr + info->dlpi_phdr[j].p_memsz >
                        preload_hi)
                    preload_hi =
                        info->dlpi_addr + info->dlpi_phdr[j].p_vaddr + info->dlpi_phdr[j].p_memsz;
            return 1;
        }
    }
    return 0;
}

/* Memory for this test's own bookkeeping, outside malloc. */
static void *raw(size_t bytes) {
    void *p = (void *)syscall(SYS_mmap, NULL, bytes, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* --- the mmap symbol is the one the preload uses, and glibc's malloc is not */

static void test_interposition(void) {
    struct mtrace_stats s0, s1;
    api->stats(&s0, sizeof s0);
    uint64_t maps0 = atomic_load(&maps_preload);
    uint64_t net0 = atomic_load(&bytes_preload) - atomic_load(&unmapped_preload);
    static void *blocks[200000];
    for (int i = 0; i < 200000; i++)
        blocks[i] = malloc(40);
    api->stats(&s1, sizeof s1);
    uint64_t maps = atomic_load(&maps_preload) - maps0;
    uint64_t net = atomic_load(&bytes_preload) - atomic_load(&unmapped_preload) - net0;
    printf(
        "table growth to %llu entries: %llu mappings through this mmap, %llu KiB net of munmap\n",
        (unsigned long long)s1.live_count, (unsigned long long)maps,
        (unsigned long long)net / 1024);
    CHECK(s1.table_bytes > s0.table_bytes);
    CHECK(maps > 0);
    /* Every byte the table and the stack store gained came through here. */
    CHECK_EQ((s1.table_bytes - s0.table_bytes) + (s1.stack_bytes - s0.stack_bytes), net);
    for (int i = 0; i < 200000; i++)
        free(blocks[i]);
    api->reset(); /* shards back to their smallest, so that they must grow again */

    int was = api->thread_ignore(1);
    uint64_t calls = atomic_load(&maps_preload) + atomic_load(&maps_other);
    char *big = malloc(64 << 20); /* past glibc's largest mmap threshold: always mmapped */
    CHECK(big != NULL);
    if (big) {
        big[0] = 1;
        big[(64 << 20) - 1] = 1;
    }
    CHECK_EQ(atomic_load(&maps_preload) + atomic_load(&maps_other), calls);
    free(big);
    api->thread_ignore(was);
}

static int by_addr(const void *a, const void *b) {
    uint64_t x = ((const struct mtrace_alloc *)a)->addr, y = ((const struct mtrace_alloc *)b)->addr;
    return x < y ? -1 : x > y;
}

static int ptr_order(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* --- every mapping failing ------------------------------------------------- */

#define FAIL_N 300000
#define FAIL_MIN 50 /* sizes of this part: 50..57 */

static void test_no_memory(void) {
    void **blocks = raw(FAIL_N * sizeof(void *));
    CHECK(blocks != NULL);
    if (!blocks)
        return;
    struct mtrace_stats s0, s1, s2;
    api->stats(&s0, sizeof s0);
    uint64_t failed = 0, errno_changed = 0;
    atomic_store(&fail_maps, 1);
    for (size_t i = 0; i < FAIL_N; i++) {
        size_t n = FAIL_MIN + i % 8;
        void *p = NULL;
        errno = EDOM; /* a success leaves errno alone, whatever the table went through */
        switch (i % 6) {
        case 0:
        case 1:
            p = malloc(n);
            break;
        case 2:
            p = calloc(1, n);
            break;
        case 3:
            p = realloc(NULL, n);
            break;
        case 4:
            if (posix_memalign(&p, 64, n) != 0)
                p = NULL;
            break;
        default:
            p = aligned_alloc(32, n);
        }
        failed += p == NULL;
        errno_changed += p && errno != EDOM;
        if (p)
            memset(p, 0x5a, n);
        blocks[i] = p;
    }
    /* Growth of an existing block, too. */
    for (size_t i = 0; i < FAIL_N; i += 1000) {
        errno = EDOM;
        void *q = realloc(blocks[i], FAIL_MIN + 7);
        failed += q == NULL;
        errno_changed += q && errno != EDOM;
        if (q)
            blocks[i] = q;
    }
    uint64_t refused = atomic_load(&maps_failed);
    atomic_store(&fail_maps, 0);
    api->stats(&s1, sizeof s1);
    uint64_t recorded = s1.live_count - s0.live_count, dropped = s1.dropped - s0.dropped;
    printf("no memory for the table: %d allocations, all succeeded; %llu recorded, %llu dropped; "
           "%llu mappings refused\n",
           FAIL_N, (unsigned long long)recorded, (unsigned long long)dropped,
           (unsigned long long)refused);
    CHECK_EQ(failed, 0);
    CHECK_EQ(errno_changed, 0);
    CHECK(dropped > 0);
    CHECK(refused > 0);
    /* Each insertion is recorded or dropped; the 300 reallocs insert again
     * after removing the old entry, if it was recorded. */
    CHECK(recorded + dropped >= FAIL_N && recorded + dropped <= FAIL_N + FAIL_N / 1000);

    /* What was recorded is among what was allocated, with its size. */
    struct mtrace_alloc *table = raw(FAIL_N * sizeof *table);
    uintptr_t *sorted = raw(FAIL_N * sizeof *sorted);
    struct mtrace_query f = sized_query(FAIL_MIN, FAIL_MIN + 7);
    size_t n = table && sorted ? query_olds(api, &f, table, FAIL_N) : 0, strangers = 0;
    CHECK_EQ(n, recorded);
    if (sorted) {
        for (size_t i = 0; i < FAIL_N; i++)
            sorted[i] = (uintptr_t)blocks[i];
        int was = api->thread_ignore(1);
        qsort(sorted, FAIL_N, sizeof *sorted, ptr_order);
        api->thread_ignore(was);
        for (size_t i = 0; i < n; i++)
            strangers += !bsearch(&table[i].addr, sorted, FAIL_N, sizeof *sorted, ptr_order);
        munmap(sorted, FAIL_N * sizeof *sorted);
    }
    CHECK_EQ(strangers, 0);

    /* Freed, every block leaves the table (dropped ones were never in it). */
    for (size_t i = 0; i < FAIL_N; i++)
        free(blocks[i]);
    api->stats(&s2, sizeof s2);
    CHECK_EQ(s2.live_count, s0.live_count);
    CHECK_EQ(s2.live_bytes, s0.live_bytes);
    CHECK_EQ(query_olds(api, &f, table, 16), 0);

    /* Memory back: recording resumes, nothing more dropped. */
    for (size_t i = 0; i < 1000; i++)
        blocks[i] = malloc(FAIL_MIN);
    struct mtrace_stats s3;
    api->stats(&s3, sizeof s3);
    CHECK_EQ(s3.live_count - s2.live_count, 1000);
    CHECK_EQ(s3.dropped, s1.dropped);
    for (size_t i = 0; i < 1000; i++)
        free(blocks[i]);
    munmap(blocks, FAIL_N * sizeof(void *));
    if (table)
        munmap(table, FAIL_N * sizeof *table);
}

/* --- growth to millions of live entries ------------------------------------ */

#define GROW_MIN 16 /* sizes of this part: 16..47, and 48 for every 1000th block */
#define GROW_SIZES 32
#define SAMPLE_SIZE 48

/* Grows the table to n live entries.  Exactly those, by counting: the
 * table gains n entries and the n sizes; freeing the n blocks then takes
 * every one of them away again, which it can only do if each address was
 * there.  Where cheap, by looking: every 1000th block (its own size) is
 * found by olds, sites accounts for all n, and with full = 1 olds lists all n. */
static void test_growth(size_t n, int full) {
    uintptr_t *blocks = raw(n * sizeof *blocks);
    size_t listed = full ? n + 1 : n / 1000 + 1;
    struct mtrace_alloc *table = raw(listed * sizeof *table);
    CHECK(blocks && table);
    if (!blocks || !table)
        return;
    struct mtrace_stats s0, s1, s2;
    long rss0 = check_status_kib("VmRSS");
    api->stats(&s0, sizeof s0);
    uint64_t bytes = 0;
    double t0 = now_s();
    for (size_t i = 0; i < n; i++) {
        size_t size = i % 1000 == 0 ? SAMPLE_SIZE : GROW_MIN + i % GROW_SIZES;
        blocks[i] = (uintptr_t)malloc(size);
        bytes += size;
    }
    double t1 = now_s();
    api->stats(&s1, sizeof s1);
    long rss1 = check_status_kib("VmRSS");
    printf("%zu live entries: allocated in %.2f s (%.0f ns each); table %.0f MiB (%.1f bytes an "
           "entry), RSS +%ld MiB\n",
           n, t1 - t0, (t1 - t0) * 1e9 / (double)n, (double)s1.table_bytes / 1048576.0,
           (double)s1.table_bytes / (double)s1.live_count, (rss1 - rss0) / 1024);
    CHECK_EQ(s1.live_count - s0.live_count, n);
    CHECK_EQ(s1.live_bytes - s0.live_bytes, bytes);
    CHECK_EQ(s1.dropped, s0.dropped);

    /* Every 1000th block, by address. */
    struct mtrace_query sample = sized_query(SAMPLE_SIZE, SAMPLE_SIZE);
    size_t got = query_olds(api, &sample, table, listed), found = 0;
    int was = api->thread_ignore(1);
    qsort(table, got, sizeof *table, by_addr);
    api->thread_ignore(was);
    for (size_t i = 0; i < n; i += 1000)
        found += bsearch(&blocks[i], table, got, sizeof *table, by_addr) != NULL;
    CHECK_EQ(got, (n + 999) / 1000);
    CHECK_EQ(found, got);

    struct mtrace_query q = sized_query(GROW_MIN, SAMPLE_SIZE);
    struct mtrace_site site, total;
    double t = now_s();
    size_t ns = query_sites(api, &q, &site, 1, MTRACE_BY_COUNT, &total);
    printf("sites over %zu entries: %.2f s\n", n, now_s() - t);
    CHECK(ns == 1);
    CHECK_EQ(total.count, n);
    CHECK_EQ(total.bytes, bytes);

    if (full) { /* all of them, by address and size */
        double t2 = now_s();
        struct mtrace_query f = sized_query(GROW_MIN, SAMPLE_SIZE);
        got = query_olds(api, &f, table, listed);
        double t3 = now_s();
        was = api->thread_ignore(1);
        qsort(table, got, sizeof *table, by_addr);
        qsort(blocks, n, sizeof *blocks, ptr_order);
        api->thread_ignore(was);
        size_t same = 0;
        for (size_t i = 0; i < got && i < n; i++)
            same += table[i].addr == blocks[i] && table[i].size >= GROW_MIN &&
                    table[i].size <= SAMPLE_SIZE;
        printf("olds over %zu entries: %.2f s\n", got, t3 - t2);
        CHECK_EQ(got, n);
        CHECK_EQ(same, n);
    }

    double t4 = now_s();
    for (size_t i = 0; i < n; i++)
        free((void *)blocks[i]);
    double t5 = now_s();
    api->stats(&s2, sizeof s2);
    printf("freed in %.2f s (%.0f ns each)\n", t5 - t4, (t5 - t4) * 1e9 / (double)n);
    CHECK_EQ(s2.live_count, s0.live_count);
    CHECK_EQ(s2.live_bytes, s0.live_bytes);
    munmap(blocks, n * sizeof *blocks);
    munmap(table, listed * sizeof *table);
    api->reset();
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    dl_iterate_phdr(find_preload, (void *)(uintptr_t)api);
    CHECK(preload_hi > preload_lo);
    int full = check_stress();
    printf("mtrace.so at %#lx-%#lx\n", (unsigned long)preload_lo, (unsigned long)preload_hi);
    fflush(stdout);
    test_interposition();
    test_no_memory();
    /* A tenth as many under an emulator, where 10,000,000 take over 30 s. */
    test_growth(check_emulator() ? 1000000 : 10000000, full);
    return check_summary();
}
