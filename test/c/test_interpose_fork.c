/* A fork storm (run with the preload): four threads allocate and free while
 * the main thread forks 1,000 children, up to 16 at a time.  Each child
 * checks that it inherited a consistent table and that its own mallocs and
 * frees are recorded and forgotten, then exits 0; every tenth child instead
 * starts this program again as one the preload does not track (another
 * MTRACE_PROGRAMS), where it allocates and finds nothing counted, recorded
 * or mapped.  (What such a program spends in mtrace.so is counted in
 * test_interpose_cost.c; forks while the loader's lock is held elsewhere,
 * in test_interpose_fork_loader.c.)  MTRACE_STRESS=1 forks ten times as
 * many children. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

#define THREADS 4
#define WINDOW 512
#define IN_FLIGHT 16
#define ANCHOR_SIZE 6666
#define CHURN_SIZE 6001

static const struct mtrace_api *api;
static char **self_argv;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Is p recorded with this size? */
static int recorded(const void *p, uint64_t size) {
    static struct mtrace_alloc buf[4 * THREADS * WINDOW];
    return query_block(api, p, size, buf, sizeof buf / sizeof *buf, NULL);
}

/* The stack id of the recorded block p of this size (0 = none). */
static uint32_t stack_of(const void *p, uint64_t size) {
    struct mtrace_alloc buf[16], a;
    return query_block(api, p, size, buf, 16, &a) ? a.stack_id : 0;
}

#define SITE_SIZE 7777

/* A fork child finds the stacks its parent interned, under the same ids
 * (the store's bucket heads do not come along a fork: the child rebuilds
 * them), and interns no copy of them. */
static __attribute__((noinline)) void test_child_knows_stacks(void) {
    uint32_t ids[2] = {0, 0};
    pid_t pid = -1;
    struct mtrace_stats before;
    static volatile int times = 2; /* not unrolled: one call site */
    for (int i = 0; i < times; i++) {
        void *p = malloc(SITE_SIZE); /* the same stack both times */
        ids[i] = stack_of(p, SITE_SIZE);
        free(p);
        if (i == 0) {
            pid = fork();
            if (pid == 0) {
                alarm(20);
                free(strdup("another stack")); /* the next walk cannot be the last one */
                api->stats(&before, sizeof before);
            }
        }
    }
    if (pid == 0) {
        struct mtrace_stats after;
        api->stats(&after, sizeof after);
        _exit(ids[1] && ids[1] == ids[0] && after.stacks == before.stacks ? 0 : 1);
    }
    CHECK(ids[0] != 0);
    CHECK_EQ(ids[1], ids[0]);
    int status = -1;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A fork child does not inherit the untouched end of the table's current
 * chunk: it must grow its table past it, and count its memory right.  The
 * parent's later use of that end must come along the next fork. */
#define MANY 200000
static int grows_in_child(void **blocks, size_t n, const void *from_parent) {
    struct mtrace_stats before, after;
    api->stats(&before, sizeof before);
    for (size_t i = 0; i < n; i++)
        if (!(blocks[i] = malloc(24)))
            return 30;
    api->stats(&after, sizeof after);
    if (after.live_count != before.live_count + n || after.table_bytes < before.table_bytes)
        return 31;
    if (from_parent && !recorded(from_parent, ANCHOR_SIZE + 3))
        return 32;
    for (size_t i = 0; i < n; i++)
        free(blocks[i]);
    api->stats(&after, sizeof after);
    return after.live_count == before.live_count ? 0 : 33;
}

static int forked(void **blocks, const void *from_parent) {
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        _exit(grows_in_child(blocks, MANY, from_parent));
    }
    int status = -1;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

static void test_child_grows_table(void) {
    void **blocks = calloc(MANY, sizeof *blocks);
    CHECK(blocks != NULL);
    if (!blocks)
        return;
    CHECK_EQ(forked(blocks, NULL), 0);
    /* The parent fills the end it kept out of that child, then forks again. */
    CHECK_EQ(grows_in_child(blocks, MANY / 4, NULL), 0);
    for (size_t i = 0; i < MANY / 4; i++)
        blocks[i] = malloc(24);
    char *p = malloc(ANCHOR_SIZE + 3);
    CHECK_EQ(forked(blocks, p), 0); /* the child writes its own copy of blocks */
    for (size_t i = 0; i < MANY / 4; i++)
        free(blocks[i]);
    free(p);
    free(blocks);
}

/* --- the untracked child -------------------------------------------------- */

static int inert_child(void) {
    if (!api)
        return 10;
    void *keep[64];
    for (int i = 0; i < 1000; i++) {
        void *p = malloc((size_t)i + 1);
        if (!p)
            return 11;
        free(p);
    }
    for (int i = 0; i < 64; i++)
        keep[i] = calloc(1, 100 + (size_t)i);
    for (int i = 0; i < 64; i++) {
        keep[i] = realloc(keep[i], 1000);
        if (!keep[i])
            return 12;
    }
    struct mtrace_stats s;
    api->stats(&s, sizeof s);
    for (int i = 0; i < 64; i++)
        free(keep[i]);
    if (s.active != 0)
        return 13;
    for (int f = 0; f < MT_FN_COUNT; f++)
        if (s.calls[f] != 0)
            return 14;
    if (s.live_count || s.table_bytes || s.stacks || s.stack_bytes)
        return 15;
    return 0;
}

/* --- the storm ------------------------------------------------------------ */

struct churner {
    pthread_t tid;
    unsigned seed;
    void *live[WINDOW];
};
static struct churner churners[THREADS];
static _Atomic int stop;

static void *churn(void *arg) {
    struct churner *c = arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        unsigned k = (unsigned)rand_r(&c->seed) % WINDOW;
        free(c->live[k]);
        c->live[k] = rand_r(&c->seed) % 2 ? malloc(CHURN_SIZE) : calloc(1, CHURN_SIZE);
    }
    return NULL;
}

/* A forked child of the tracking process: exit code 0 when all is well. */
static int tracked_child(const void *anchor) {
    if (!recorded(anchor, ANCHOR_SIZE))
        return 20; /* the parent's table came along */
    char *p = malloc(ANCHOR_SIZE + 1);
    if (!p || !recorded(p, ANCHOR_SIZE + 1))
        return 21;
    p = realloc(p, ANCHOR_SIZE + 2);
    if (!p || !recorded(p, ANCHOR_SIZE + 2))
        return 22;
    free(p);
    if (recorded(p, ANCHOR_SIZE + 2))
        return 23;
    char *s = strdup("child");
    void *c = calloc(3, 5);
    if (!s || !c || strcmp(s, "child"))
        return 24;
    free(s);
    free(c);
    return 0;
}

static void test_storm(int forks) {
    void *anchor = malloc(ANCHOR_SIZE);
    CHECK(recorded(anchor, ANCHOR_SIZE));
    for (int i = 0; i < THREADS; i++) {
        churners[i].seed = (unsigned)i + 3;
        pthread_create(&churners[i].tid, NULL, churn, &churners[i]);
    }
    int ok = 0, started = 0, in_flight = 0, inert = 0, failing = 0, codes[128] = {0};
    double t0 = now_s();
    while ((started < forks && !failing) || in_flight) {
        if (started < forks && !failing) {
            int i = started;
            pid_t pid = fork();
            if (pid == 0) {
                alarm(20); /* a child stuck on a lock inherited from fork dies, and says so */
                if (i % 10 == 9)
                    check_restart(self_argv[0], "--inert-child", 0, 1);
                _exit(tracked_child(anchor));
            }
            if (pid < 0) {
                fprintf(stderr, "fork: %s\n", strerror(errno));
                failing = 1;
                continue;
            }
            started++;
            inert += i % 10 == 9;
            in_flight++;
            if (in_flight < IN_FLIGHT && started < forks)
                continue;
        }
        int status = -1;
        if (waitpid(-1, &status, 0) < 0)
            break;
        in_flight--;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            ok++;
        } else { /* no more children after a failure */
            failing = 1;
            codes[WIFEXITED(status) ? WEXITSTATUS(status) % 128 : 127]++;
            if (WIFSIGNALED(status))
                fprintf(stderr, "a child died of signal %d\n", WTERMSIG(status));
        }
    }
    double t1 = now_s();
    atomic_store(&stop, 1);
    for (int i = 0; i < THREADS; i++)
        pthread_join(churners[i].tid, NULL);
    printf("%d forks (%d of them starting an untracked program) from %d allocating threads: "
           "%.2f s, %.0f us per child\n",
           started, inert, THREADS, t1 - t0, (t1 - t0) * 1e6 / (started ? started : 1));
    for (int c = 1; c < 128; c++)
        if (codes[c])
            fprintf(stderr, "%d children exited with %d\n", codes[c], c);
    CHECK_EQ(ok, forks);

    /* The parent's table survived the storm exactly. */
    static struct mtrace_alloc buf[THREADS * WINDOW + 64];
    struct mtrace_query f = sized_query(CHURN_SIZE, CHURN_SIZE);
    size_t n = query_olds(api, &f, buf, sizeof buf / sizeof *buf), expected = 0, found = 0;
    for (int t = 0; t < THREADS; t++)
        for (int k = 0; k < WINDOW; k++) {
            if (!churners[t].live[k])
                continue;
            expected++;
            for (size_t j = 0; j < n; j++)
                found += buf[j].addr == (uintptr_t)churners[t].live[k];
        }
    CHECK_EQ(found, expected);
    CHECK_EQ(n, expected);
    for (int t = 0; t < THREADS; t++)
        for (int k = 0; k < WINDOW; k++)
            free(churners[t].live[k]);
    CHECK_EQ(query_olds(api, &f, buf, 16), 0);
    free(anchor);
    struct mtrace_stats s;
    api->stats(&s, sizeof s);
    CHECK_EQ(s.dropped, 0);
}

int main(int argc, char **argv) {
    self_argv = argv;
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    if (argc > 1 && !strcmp(argv[1], "--inert-child"))
        return inert_child();
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    setvbuf(stdout, NULL, _IOLBF, 0);
    int forks = (int)check_rounds(1000, 5, "forks"); /* 1000 take 40 s under qemu */
    test_child_knows_stacks();
    test_child_grows_table();
    test_storm(forks);
    return check_summary();
}
