/* The preload in a plain C program (run with LD_PRELOAD and
 * MTRACE_PROGRAMS=test_interpose): every interposed function is recorded with
 * the right size and caller, libc semantics are unchanged, threads and fork
 * work, and the live set is exact. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

static const struct mtrace_api *api;

/* Finds the live entry for p among allocations of exactly `size` bytes. */
static int lookup(void *p, uint64_t size, struct mtrace_alloc *found) {
    static struct mtrace_alloc buf[65536];
    return query_block(api, p, size, buf, 65536, found);
}

static __attribute__((noinline)) void *leak_here(size_t n) {
    void *p = malloc(n);
    __asm__ __volatile__("" ::: "memory"); /* keep the call a call, not a jump */
    return p;
}

static void test_caller_is_frame_zero(void) {
    void *p = leak_here(1234567);
    struct mtrace_alloc a;
    CHECK(lookup(p, 1234567, &a));
    uintptr_t ips[MTRACE_MAX_DEPTH];
    uint32_t depth = api->stack(a.stack_id, ips, MTRACE_MAX_DEPTH);
    CHECK(depth >= 2);
    CHECK(ips[0] > (uintptr_t)leak_here && ips[0] < (uintptr_t)leak_here + 128);
    Dl_info info;
    CHECK(dladdr((void *)ips[1], &info) && info.dli_fname &&
          strstr(info.dli_fname, "test_interpose"));
    free(p);
    CHECK(!lookup(p, 1234567, NULL));
}

#ifdef __GLIBC__
#define PVALLOC(n) pvalloc(n)
#else
#define PVALLOC(n) NULL /* musl has no pvalloc (nor does the preload there) */
#endif

static void test_each_function(void) {
    struct mtrace_stats before, after;
    api->stats(&before, sizeof before);
    void *m = malloc(1001), *c = calloc(7, 143), *r = realloc(NULL, 1003);
    r = realloc(r, 2003);
    void *ra = reallocarray(NULL, 3, 335), *pm = NULL, *aa = aligned_alloc(64, 1006);
    CHECK_EQ(posix_memalign(&pm, 64, 1005), 0);
    void *ma = memalign(128, 1007), *va = valloc(1008), *pv = PVALLOC(1009);
    char *sd = strdup("hello"), *sn = strndup("hello world", 5);
    api->stats(&after, sizeof after);
    CHECK(lookup(m, 1001, NULL));
    CHECK(lookup(c, 1001, NULL));
    CHECK(lookup(r, 2003, NULL));
    CHECK(lookup(ra, 1005, NULL));
    CHECK(lookup(pm, 1005, NULL));
    CHECK(lookup(aa, 1006, NULL));
    CHECK(lookup(ma, 1007, NULL));
    CHECK(lookup(va, 1008, NULL));
    CHECK(!pv || lookup(pv, 1009, NULL));
    CHECK(lookup(sd, 6, NULL));
    CHECK(lookup(sn, 6, NULL));
    CHECK_EQ(strcmp(sn, "hello"), 0);
    CHECK(((uintptr_t)pm & 63) == 0 && ((uintptr_t)ma & 127) == 0);
    CHECK_EQ(after.calls[MT_FN_MALLOC] - before.calls[MT_FN_MALLOC], 1);
    CHECK_EQ(after.calls[MT_FN_REALLOC] - before.calls[MT_FN_REALLOC], 2);
    for (int f = 0; f < MT_FN_COUNT; f++)
        if (f != MT_FN_REALLOC && f != MT_FN_FREE)
            CHECK_EQ(after.calls[f] - before.calls[f], f == MT_FN_PVALLOC && !pv ? 0 : 1);
    void *all[] = {m, c, r, ra, pm, aa, ma, va, pv, sd, sn};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    CHECK(!lookup(m, 1001, NULL) && !lookup(r, 2003, NULL) && !lookup(sn, 6, NULL));
    CHECK(after.live_count >= 11);
}

/* Hides values from the compiler, which rightly warns about the calls below. */
static volatile size_t huge = SIZE_MAX;
static void *opaque(void *p) {
    __asm__ __volatile__("" : "+r"(p));
    return p;
}

static void test_libc_semantics(void) {
    free(NULL);
    errno = 0;
    CHECK(malloc(huge) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(huge / 2, 3) == NULL && errno == ENOMEM);

    void *p = malloc(2100);
    CHECK(malloc_usable_size(p) >= 2100);
    errno = 0;
    CHECK(reallocarray(opaque(p), huge / 2, 3) == NULL && errno == ENOMEM);
    CHECK(lookup(opaque(p), 2100, NULL)); /* untouched and still recorded */
    errno = 0;
    CHECK(realloc(opaque(p), huge - 4096) == NULL && errno == ENOMEM);
    CHECK(lookup(opaque(p), 2100, NULL)); /* a failed realloc keeps the block */
#ifdef __GLIBC__
    CHECK(realloc(opaque(p), 0) == NULL); /* glibc frees and returns NULL */
#else
    free(realloc(opaque(p), 0)); /* musl returns a block of size 0 */
#endif
    CHECK(!lookup(opaque(p), 2100, NULL));

    void *sentinel = (void *)0x1234, *mp = sentinel;
    CHECK_EQ(posix_memalign(&mp, 3, 10), EINVAL);
    CHECK_EQ(posix_memalign(&mp, 0, 10), EINVAL);
    CHECK_EQ(posix_memalign(&mp, 24, 10), EINVAL);
    CHECK(mp == sentinel); /* memptr untouched on error */
    CHECK_EQ(posix_memalign(&mp, 64, huge - 4096), ENOMEM);
    CHECK(mp == sentinel);
    errno = 0;
    CHECK(memalign(huge / 2 + 2, 10) == NULL && errno == EINVAL);
}

#define THREADS 4
#define OPS 100000
#define WINDOW 512
#define CHURN_SIZE 4099

struct churn {
    void *live[WINDOW];
    unsigned seed;
};

static void *churn(void *arg) {
    struct churn *c = arg;
    for (int i = 0; i < OPS; i++) {
        unsigned k = (unsigned)rand_r(&c->seed) % WINDOW;
        switch (rand_r(&c->seed) % 3) {
        case 0:
            free(c->live[k]);
            c->live[k] = malloc(CHURN_SIZE);
            break;
        case 1:
            free(c->live[k]);
            c->live[k] = calloc(1, CHURN_SIZE);
            break;
        default:
            free(c->live[k]);
            c->live[k] = realloc(malloc(10), CHURN_SIZE);
        }
    }
    return NULL;
}

static void test_threads_exact(void) {
    static struct churn c[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        c[i].seed = (unsigned)i + 1;
        pthread_create(&t[i], NULL, churn, &c[i]);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    static struct mtrace_alloc buf[THREADS * WINDOW + 64];
    struct mtrace_query f = sized_query(CHURN_SIZE, CHURN_SIZE);
    size_t n = query_olds(api, &f, buf, THREADS * WINDOW + 64);
    size_t expected = 0, found = 0;
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < WINDOW; k++)
            if (c[i].live[k]) {
                expected++;
                for (size_t j = 0; j < n; j++)
                    found += buf[j].addr == (uintptr_t)c[i].live[k];
            }
    CHECK_EQ(n, expected);
    CHECK_EQ(found, expected);
    for (int i = 0; i < THREADS; i++)
        for (int k = 0; k < WINDOW; k++)
            free(c[i].live[k]);
    CHECK_EQ(query_olds(api, &f, buf, 16), 0);
}

/* Threads that exit: what they counted is counted once, and stats reads
 * nothing that went away with them.  Their stacks (which hold their TLS)
 * are unmapped after each join; half of the threads never allocate, so
 * that their first counted calls are glibc's frees as they exit. */
static void *vallocs(void *n) {
    for (uintptr_t i = 0; i < (uintptr_t)n; i++)
        free(valloc(64));
    return NULL;
}

static void test_thread_exit(void) {
    enum { ROUNDS = 8, AT_ONCE = 8, EACH = 10, STACK = 1 << 20 };
    struct mtrace_stats before, after;
    api->stats(&before, sizeof before);
    for (int r = 0; r < ROUNDS; r++) {
        void *stack[AT_ONCE];
        pthread_t t[AT_ONCE];
        for (int i = 0; i < AT_ONCE; i++) {
            stack[i] =
                mmap(NULL, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            CHECK(stack[i] != MAP_FAILED);
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setstack(&at, stack[i], STACK);
            pthread_create(&t[i], &at, vallocs, (void *)(uintptr_t)(i % 2 ? EACH : 0));
            pthread_attr_destroy(&at);
        }
        for (int i = 0; i < AT_ONCE; i++) {
            pthread_join(t[i], NULL);
            munmap(stack[i], STACK);
        }
        api->stats(&after, sizeof after); /* reads every registered thread's counts */
    }
    CHECK_EQ(after.calls[MT_FN_VALLOC] - before.calls[MT_FN_VALLOC],
             (uint64_t)ROUNDS * (AT_ONCE / 2) * EACH);
}

/* Forks while other threads allocate: each child allocates and frees at once. */
static void *background(void *stop) {
    while (!__atomic_load_n((int *)stop, __ATOMIC_RELAXED))
        free(malloc(64));
    return NULL;
}

static void test_fork(void) {
    int stop = 0, ok = 0;
    pthread_t t;
    pthread_create(&t, NULL, background, &stop);
    for (int i = 0; i < 200; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *p = malloc(100);
            char *s = strdup("child");
            free(p);
            free(s);
            _exit(api->olds != NULL ? 0 : 3);
        }
        int status = -1;
        waitpid(pid, &status, 0);
        ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    pthread_join(t, NULL);
    CHECK_EQ(ok, 200);
}

static void test_switches(void) {
    void *before = malloc(3001);
    api->set_enabled(0);
    struct mtrace_stats s;
    api->stats(&s, sizeof s);
    CHECK_EQ(s.enabled, 0);
    void *untracked = malloc(3002);
    CHECK(!lookup(untracked, 3002, NULL));
    free(before); /* frees are still honoured while disabled */
    CHECK(!lookup(before, 3001, NULL));
    api->set_enabled(1);
    int was = api->thread_ignore(1);
    void *ignored = malloc(3003);
    api->thread_ignore(was);
    CHECK(!lookup(ignored, 3003, NULL));
    free(untracked);
    free(ignored);

    void *kept = malloc(3004);
    uint64_t forgotten = api->reset();
    CHECK(forgotten >= 1);
    CHECK(!lookup(kept, 3004, NULL));
    free(kept); /* a forgotten block frees normally */
    void *again = malloc(3005);
    CHECK(lookup(again, 3005, NULL));
    free(again);

    /* Switched off with an empty table (frees then skip the filters), and
     * on again: recording and forgetting work as before. */
    api->set_enabled(0);
    api->reset();
    void *off = malloc(3006);
    free(off);
    api->set_enabled(1);
    void *on = malloc(3007);
    CHECK(lookup(on, 3007, NULL));
    api->set_enabled(0); /* the table holds it: frees ask again */
    free(on);
    CHECK(!lookup(on, 3007, NULL));
    api->set_enabled(1);
    api->stats(&s, sizeof s);
    CHECK_EQ(s.enabled, 1);
}

/* A signal handler that allocates, run on a thread while it is inside
 * olds, sites, stats and reset: every call returns, as none of the
 * tracer's locks waits for the thread that holds it.  A watchdog ends the
 * test as failed if one does not. */
static volatile sig_atomic_t handled;
static _Atomic int queries_done;

static void allocating_handler(int sig) {
    (void)sig;
    for (int i = 0; i < 8; i++)
        free(malloc(24 + (size_t)i));
    handled++;
}

static void *watchdog(void *unused) {
    (void)unused;
    for (int s = 0; s < 60 && !atomic_load(&queries_done); s++)
        sleep(1);
    if (!atomic_load(&queries_done)) {
        fprintf(stderr, "test_signals_in_queries: a query did not return in 60 s\n");
        _exit(1);
    }
    return NULL;
}

static void test_signals_in_queries(void) {
    sigset_t alrm, was;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, &was); /* the watchdog must not take them */
    pthread_t dog;
    pthread_create(&dog, NULL, watchdog, NULL);
    pthread_sigmask(SIG_SETMASK, &was, NULL);
    void *keep[256];
    for (int i = 0; i < 256; i++)
        keep[i] = malloc(100 + (size_t)i);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = allocating_handler;
    sigaction(SIGALRM, &sa, &old);
    struct itimerval every = {{0, 250}, {0, 250}}, stop = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &every, NULL);
    struct mtrace_alloc a[16];
    struct mtrace_site site[16], total;
    struct mtrace_stats s;
    for (int i = 0; i < 3000; i++) {
        query_olds(api, NULL, a, 16);
        query_sites(api, NULL, site, 16, MTRACE_BY_BYTES, &total);
        api->stats(&s, sizeof s);
        if (i % 100 == 0)
            api->reset();
    }
    setitimer(ITIMER_REAL, &stop, NULL);
    sigaction(SIGALRM, &old, NULL);
    atomic_store(&queries_done, 1);
    pthread_join(dog, NULL);
    CHECK(handled > 0);
    for (int i = 0; i < 256; i++)
        free(keep[i]);
    void *after = malloc(3008); /* and recording goes on as before */
    CHECK(lookup(after, 3008, NULL));
    free(after);
    CHECK(!lookup(after, 3008, NULL));
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    struct mtrace_stats s;
    api->stats(&s, sizeof s);
    CHECK_EQ(s.active, 1);
    CHECK_EQ(s.enabled, 1);
    CHECK_EQ(s.depth, 32);
    test_caller_is_frame_zero();
    test_each_function();
    test_libc_semantics();
    test_threads_exact();
    test_thread_exit();
    test_fork();
    test_switches();
    test_signals_in_queries();
    return check_summary();
}
