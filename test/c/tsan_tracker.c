/* The tracker under ThreadSanitizer.  The preload itself cannot run under
 * TSan (an instrumented mtrace.so is entered by the loader's first malloc,
 * before TSan's runtime has mapped its shadow), so this program is built
 * from the preload's sources, instrumented, with hooks.c's names renamed
 * (malloc -> mtt_malloc, ...): the hooks then forward to TSan's own
 * allocator, and every access the tracker makes is seen.
 *
 * For SECONDS (argv[2], default 10) allocator threads allocate (through
 * tsan_work.so's call chains: many stacks), reallocate and free blocks, some
 * handed to another thread to free, and are sent signals whose handler
 * allocates and frees; other threads start and end short-lived threads,
 * fork (the child allocates, queries and exits), dlopen and dlclose, and
 * query, reset and switch tracking.  Then, all quiet, the counts must be
 * exact: threads that exit fold theirs, and the table holds what is live.
 * Run with MTRACE_PROGRAMS=tsan_tracker (test/c/run.sh does).
 *   tsan_tracker BUILD [SECONDS] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mtrace_api.h"

#ifdef PRELOADED
static const struct mtrace_api *api; /* looked up by main */
#else
extern const struct mtrace_api mtrace_api_v2;
static const struct mtrace_api *api = &mtrace_api_v2;
#endif

#include "interrupted.h"
#include "tsan_alloc.h"

static const char *build;
static _Atomic int stop, failures;
static _Atomic uint64_t forks, child_failures, threads_made, dl_rounds, signals_sent;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                       \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        atomic_fetch_add(&failures, 1);                                                            \
    } while (0)

/* ---- the signal handler: allocates inside whatever it interrupts ------- */

/* Whatever but the C library itself (interrupted.h): glibc's malloc,
 * interrupted holding an arena's lock, would wait for itself in
 * stress_preload. */

static int handler_forks; /* STRESS_HANDLER_FORK: the handler also forks, now and then */
static _Atomic uint64_t handler_forked;

static void on_signal(int sig, siginfo_t *info, void *uc) {
    (void)sig;
    (void)info;
    if (interrupted_libc(uc)) /* its malloc, perhaps holding an arena's lock */
        return;
    void *p = mtt_malloc(48);
    mtt_free(mtt_malloc(24));
    mtt_free(p);
    if (handler_forks && atomic_fetch_add(&handler_forked, 1) % 64 == 0) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        if (pid > 0)
            waitpid(pid, NULL, 0);
    }
}

/* ---- allocators ---------------------------------------------------------- */

#define ALLOCATORS 6
#define WINDOW 256
#define MAILBOX 64
static void *_Atomic mailbox[MAILBOX];
static pthread_t alloc_tid[ALLOCATORS];

static void *allocator(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;
    void *live[WINDOW] = {0};
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        unsigned k = (unsigned)rand_r(&seed) % WINDOW, r = (unsigned)rand_r(&seed);
        if (live[k] && r % 8 == 0) {
            void *q = mtt_realloc(live[k], 1 + (size_t)rand_r(&seed) % 6000);
            if (q)
                live[k] = q;
        } else if (live[k] && r % 8 == 1) { /* to another thread's free */
            live[k] = atomic_exchange(&mailbox[r % MAILBOX], live[k]);
        } else {
            mtt_free(live[k]);
            live[k] = alloc_any(&seed);
            if (live[k])
                memset(live[k], 1, 8);
        }
    }
    for (unsigned k = 0; k < WINDOW; k++)
        mtt_free(live[k]);
    return NULL;
}

/* ---- short-lived threads, signals, fork, dlopen ------------------------- */

static void *brief(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *p[16];
    for (int i = 0; i < 16; i++)
        p[i] = alloc_any(&seed);
    for (int i = 0; i < 16; i++)
        mtt_free(p[i]);
    return NULL;
}

static void *spawner(void *arg) {
    (void)arg;
    for (unsigned i = 0; !atomic_load(&stop); i++) {
        pthread_t t[4];
        for (int k = 0; k < 4; k++)
            pthread_create(&t[k], NULL, brief, (void *)(uintptr_t)(i * 4 + k));
        for (int k = 0; k < 4; k++)
            pthread_join(t[k], NULL);
        atomic_fetch_add(&threads_made, 4);
    }
    return NULL;
}

static void *signaller(void *arg) {
    (void)arg;
    for (unsigned i = 0; !atomic_load(&stop); i++) {
        pthread_kill(alloc_tid[i % ALLOCATORS], SIGUSR1);
        atomic_fetch_add(&signals_sent, 1);
        usleep(200);
    }
    return NULL;
}

/* The child's blocks: not TSan's allocator, whose stack depot's allocator
 * lock (GCC 12's runtime) a fork child may inherit held by another thread,
 * and then hang in its first malloc. */
#ifndef PRELOADED
static char child_arena[1 << 20] __attribute__((aligned(64)));
static size_t child_used;
static void *child_malloc(size_t n) {
    size_t at = (child_used + 63) & ~(size_t)63;
    if (at + n > sizeof child_arena)
        return NULL;
    child_used = at + n;
    return child_arena + at;
}
static void child_free(void *p) { (void)p; }
#endif

/* In the child: the table and counters must work (no lock left taken). */
static int child(void) {
    alarm(20); /* a hang shows as SIGALRM */
#ifndef PRELOADED
    mt_libc_real.malloc = child_malloc;
    mt_libc_real.free = child_free;
#endif
    unsigned seed = 5;
    struct mtrace_stats s0, s1;
    memset(&s0, 0, sizeof s0);
    memset(&s1, 0, sizeof s1);
    api->set_enabled(1);
    api->stats(&s0, sizeof s0);
    void *p[64];
    for (int i = 0; i < 64; i++)
        p[i] = work_a(w_malloc, 1 + (size_t)rand_r(&seed) % 4000, (unsigned)rand_r(&seed), i % 9);
    for (int i = 0; i < 64; i++)
        mtt_free(p[i]);
    api->stats(&s1, sizeof s1);
    struct mtrace_alloc out[8];
    size_t n = 0;
    struct mtrace_query q = {0, UINT64_MAX, 0, UINT64_MAX, NULL, 0, 8, MTRACE_BY_OLDEST, 0};
    api->olds(&q, out, &n);
    api->reset();
    uint64_t fr = s1.calls[MT_FN_FREE] - s0.calls[MT_FN_FREE];
    return fr == 64 ? 0 : 3;
}

static void *forker(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(child());
        int st = 0;
        if (pid > 0 && getenv("TSAN_GDB_HANG")) { /* debugging: a hung child's stacks */
            for (int t = 0; t < 150 && waitpid(pid, &st, WNOHANG) == 0; t++)
                usleep(100000);
            if (waitpid(pid, &st, WNOHANG) == 0) {
                char cmd[256];
                snprintf(cmd, sizeof cmd, "gdb -q -batch -p %d -ex 'thread apply all bt' >&2", pid);
                if (system(cmd) < 0)
                    perror("system");
            }
        }
        if (pid > 0 && waitpid(pid, &st, 0) == pid && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            FAIL("fork child: status %#x", st);
            atomic_fetch_add(&child_failures, 1);
        }
        atomic_fetch_add(&forks, 1);
        usleep(20000);
    }
    return NULL;
}

static void *loader(void *arg) {
    (void)arg;
    char path[4096];
    snprintf(path, sizeof path, "%s/dl_fixture_a.so", build);
    while (!atomic_load(&stop)) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            FAIL("dlopen %s: %s", path, dlerror());
            return NULL;
        }
        mtt_dlclose(h);
        atomic_fetch_add(&dl_rounds, 1);
        usleep(1000);
    }
    return NULL;
}

/* ---- the reader --------------------------------------------------------- */

static int visit_object(void *ctx, const struct mtrace_object *o) {
    (void)o;
    ++*(int *)ctx;
    return 0;
}

static void *reader(void *arg) {
    (void)arg;
    static struct mtrace_alloc olds[256];
    static struct mtrace_site sites[64];
    for (unsigned i = 0; !atomic_load(&stop); i++) {
        int was = api->thread_ignore(1);
        struct mtrace_stats s;
        memset(&s, 0, sizeof s);
        api->stats(&s, sizeof s);
        size_t n = 0;
        struct mtrace_query q = {0, UINT64_MAX, 0, UINT64_MAX, NULL, 0, 256, i % 2, 0};
        api->olds(&q, olds, &n);
        uintptr_t ips[MTRACE_MAX_DEPTH];
        for (size_t k = 0; k < n; k++)
            api->stack(olds[k].stack_id, ips, MTRACE_MAX_DEPTH);
        struct mtrace_site total;
        q.limit = 64;
        q.order = i % 3;
        api->sites(&q, sites, &n, &total);
        int objects = 0;
        api->objects(visit_object, &objects);
        api->objects_generation();
        struct mtrace_object o;
        api->object_at((uintptr_t)work_a, &o);
        if (i % 16 == 5)
            api->reset();
        if (i % 16 == 9)
            api->set_enabled(0);
        if (i % 16 == 11)
            api->set_enabled(1);
        api->thread_ignore(was);
        usleep(500);
    }
    api->set_enabled(1);
    return NULL;
}

static void *idle(void *arg) {
    (void)arg;
    return NULL;
}

/* ---- all quiet: exact counts --------------------------------------------- */

#define QUIET_THREADS 16
#define QUIET_BLOCKS 200
#define QUIET_SIZE 70001 /* of this phase's blocks only */
/* Exact where the program's own calls are all there is (TSan's build);
 * preloaded, glibc's own (thread set-up, stdio) count too. */
#ifdef PRELOADED
#define COUNTED(got, want) ((got) >= (want))
#else
#define COUNTED(got, want) ((got) == (want))
#endif

static uint64_t quiet_live(void) {
    struct mtrace_query q = {0, UINT64_MAX, QUIET_SIZE, QUIET_SIZE + QUIET_BLOCKS, NULL, 0,
                             0, 0,          0};
    struct mtrace_site total;
    size_t n = 0;
    memset(&total, 0, sizeof total);
    api->sites(&q, NULL, &n, &total);
    return total.count;
}
static void *quiet_holder(void *arg) {
    void **mine = arg;
    for (int i = 0; i < QUIET_BLOCKS; i++)
        mine[i] = work_a(w_malloc, QUIET_SIZE + (size_t)i, (unsigned)i, i % 5);
    return NULL;
}

static void *quiet_reader(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        struct mtrace_stats s;
        api->stats(&s, sizeof s);
    }
    return NULL;
}

static void quiet_check(void) {
    static void *blocks[QUIET_THREADS][QUIET_BLOCKS];
    api->set_enabled(1);
    struct mtrace_stats s0, s1, s2;
    memset(&s0, 0, sizeof s0);
    memset(&s1, 0, sizeof s1);
    memset(&s2, 0, sizeof s2);
    api->reset();
    api->stats(&s0, sizeof s0);
    if (s0.live_count)
        FAIL("after reset, %llu live", (unsigned long long)s0.live_count);
    atomic_store(&stop, 0);
    pthread_t r, t[QUIET_THREADS];
    pthread_create(&r, NULL, quiet_reader, NULL);
    for (int k = 0; k < QUIET_THREADS; k++)
        pthread_create(&t[k], NULL, quiet_holder, blocks[k]);
    for (int k = 0; k < QUIET_THREADS; k++)
        pthread_join(t[k], NULL); /* each thread exits: its counts are folded */
    api->stats(&s1, sizeof s1);
    uint64_t want = (uint64_t)QUIET_THREADS * QUIET_BLOCKS;
    uint64_t mallocs = s1.calls[MT_FN_MALLOC] - s0.calls[MT_FN_MALLOC];
    if (!COUNTED(mallocs, want))
        FAIL("mallocs counted %llu, made %llu", (unsigned long long)mallocs,
             (unsigned long long)want);
    uint64_t live = quiet_live();
    if (!s1.sample_bytes && live != want)
        FAIL("live %llu, held %llu", (unsigned long long)live, (unsigned long long)want);
    for (int k = 0; k < QUIET_THREADS; k++)
        for (int i = 0; i < QUIET_BLOCKS; i++)
            mtt_free(blocks[k][i]);
    atomic_store(&stop, 1);
    pthread_join(r, NULL);
    api->stats(&s2, sizeof s2);
    if ((live = quiet_live()) != 0)
        FAIL("after the frees, %llu live", (unsigned long long)live);
    if (!COUNTED(s2.calls[MT_FN_FREE] - s1.calls[MT_FN_FREE], want))
        FAIL("frees counted %llu, made %llu",
             (unsigned long long)(s2.calls[MT_FN_FREE] - s1.calls[MT_FN_FREE]),
             (unsigned long long)want);
    printf("quiet: %llu mallocs, %llu live; %llu stacks, %llu dropped, %llu replaced\n",
           (unsigned long long)mallocs, (unsigned long long)s1.live_count,
           (unsigned long long)s2.stacks, (unsigned long long)s2.dropped,
           (unsigned long long)s2.replaced);
}

int main(int argc, char **argv) {
    build = argc > 1 ? argv[1] : ".";
#ifdef PRELOADED
    api = dlsym(RTLD_DEFAULT, "mtrace_api_v2");
    if (!api) {
        printf("FAIL: no preload\n");
        return 1;
    }
#endif
    handler_forks = getenv("STRESS_HANDLER_FORK") != NULL;
    int seconds = argc > 2 ? atoi(argv[2]) : 10;
    memset(text, 'x', sizeof text - 1);
    struct mtrace_stats s;
    memset(&s, 0, sizeof s);
    api->stats(&s, sizeof s);
    if (!s.active) {
        printf("FAIL: not active (MTRACE_PROGRAMS=tsan_tracker?)\n");
        return 1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    if (!interrupted_init()) {
        printf("FAIL: the C library's code not found\n");
        return 1;
    }
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_RESTART | SA_SIGINFO;
    sigaction(SIGUSR1, &sa, NULL);

    pthread_t others[5];
    void *(*fns[5])(void *) = {spawner, signaller, forker, loader, reader};
    for (int k = 0; k < ALLOCATORS; k++)
        pthread_create(&alloc_tid[k], NULL, allocator, (void *)(uintptr_t)k);
    /* TSAN_SKIP=fork,signal,... leaves those threads out (to tell causes apart). */
    const char *skip = getenv("TSAN_SKIP"), *names[5] = {"spawn", "signal", "fork", "dl", "read"};
    for (int k = 0; k < 5; k++)
        if (skip && strstr(skip, names[k]))
            fns[k] = idle;
    for (int k = 0; k < 5; k++)
        pthread_create(&others[k], NULL, fns[k], NULL);
    sleep((unsigned)seconds);
    atomic_store(&stop, 1);
    for (int k = 0; k < 5; k++)
        pthread_join(others[k], NULL);
    for (int k = 0; k < ALLOCATORS; k++)
        pthread_join(alloc_tid[k], NULL);
    for (int k = 0; k < MAILBOX; k++)
        mtt_free(atomic_exchange(&mailbox[k], NULL));
    printf("chaos: %llu forks, %llu threads, %llu dlopen rounds, %llu signals\n",
           (unsigned long long)forks, (unsigned long long)threads_made,
           (unsigned long long)dl_rounds, (unsigned long long)signals_sent);
    quiet_check();
    int f = atomic_load(&failures);
    printf("%d passed, %d failed\n", f ? 0 : 1, f);
    return f != 0;
}
