/* Forks and the dynamic loader's list lock (run with the preload).  The
 * walker looks objects up with dl_iterate_phdr, which holds that lock, and
 * a fork child does not get it back from a thread that held it: children
 * forked while other threads look objects up, or while other code iterates
 * over the loader's list, must still walk their stacks and exit, and an
 * allocating dl_iterate_phdr callback must not deadlock against lookups;
 * nor may a child's dlclose that unloads nothing.
 * A hung child is killed by its alarm and counted.  MTRACE_STRESS=1 forks
 * ten times as many children. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

#define ANCHOR_SIZE 6666

static const struct mtrace_api *api;
static _Atomic int stop;

/* Is p recorded with this size? */
static int recorded(const void *p, uint64_t size) {
    struct mtrace_alloc buf[16];
    return query_block(api, p, size, buf, 16, NULL);
}

/* The stack id of the recorded block p of this size (0 = none). */
static uint32_t stack_of(const void *p, uint64_t size) {
    struct mtrace_alloc buf[16], a;
    return query_block(api, p, size, buf, 16, &a) ? a.stack_id : 0;
}

/* Threads that look objects up, as walks do on a rule the cache lacks:
 * dl_iterate_phdr holds the loader's list lock meanwhile, which a fork
 * child does not get back.  A child's first walks miss its empty rule
 * cache and look up objects too: unless fork waits for lookups under way,
 * such a child waits for that lock for ever. */
static void *look_up(void *arg) {
    (void)arg;
    struct mtrace_object o;
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        api->object_at((uintptr_t)&look_up, &o);
    return NULL;
}

enum { LOOKERS = 2 };
static pthread_t lookers[LOOKERS];

static void start_lookers(void) {
    atomic_store(&stop, 0);
    for (int i = 0; i < LOOKERS; i++)
        pthread_create(&lookers[i], NULL, look_up, NULL);
}

static void stop_lookers(void) {
    atomic_store(&stop, 1);
    for (int i = 0; i < LOOKERS; i++)
        pthread_join(lookers[i], NULL);
}

static void test_fork_during_lookups(int forks) {
    start_lookers();
    int ok = 0, hung = 0;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            void *p = malloc(ANCHOR_SIZE + 3); /* walked: every rule is looked up */
            _exit(p && recorded(p, ANCHOR_SIZE + 3) ? 0 : 1);
        }
        int status = -1;
        if (pid < 0 || waitpid(pid, &status, 0) < 0)
            break;
        ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        hung += WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
        if (ok <= i) /* one says enough, and each hung child takes 10 s */
            break;
    }
    stop_lookers();
    printf("%d forks while %d threads looked objects up: %d children hung\n", forks, LOOKERS, hung);
    CHECK_EQ(ok, forks);
}

/* Other code's dl_iterate_phdr callback that allocates (a backtrace
 * library's does) holds the loader's list lock while its allocation is
 * walked, and with the rules forgotten (any dlclose) that walk looks
 * objects up while other threads' lookups wait for that very lock.
 * Lookups that took turns under a lock of the tracer's hung here. */
static int allocating_callback(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)info;
    (void)size;
    void *p = malloc(96); /* walked: its rules were forgotten */
    *(int *)arg += p != NULL;
    free(p);
    return 1; /* one object is enough */
}

static int lookups_inside_callbacks(int rounds) {
    start_lookers();
    int n = 0;
    for (int i = 0; i < rounds; i++) {
        void *h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        if (h)
            dlclose(h); /* every rule forgotten */
        dl_iterate_phdr(allocating_callback, &n);
    }
    stop_lookers();
    return n == rounds;
}

/* Runs body(rounds) in a child, whose alarm ends it after `seconds` if it
 * hangs; checks that it returned 1, and says what it did. */
static void in_child(int (*body)(int), int rounds, unsigned seconds, const char *what) {
    pid_t pid = fork();
    if (pid == 0) {
        alarm(seconds);
        _exit(body(rounds) ? 0 : 1);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    int hung = WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
    printf("%d %s while %d threads looked objects up: %s\n", rounds, what, LOOKERS,
           hung ? "hung" : "done");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_lookup_inside_loader_callback(int rounds) {
    in_child(lookups_inside_callbacks, rounds, 20, "allocating loader callbacks");
}

/* A fork made inside a dl_iterate_phdr callback (other code's) holds the
 * loader's list lock, which lookups under way in other threads wait for:
 * the fork must not wait for them in turn (it did, for ever). */
static int forking_callback(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)info;
    (void)size;
    usleep(100); /* the lookers meet the lock held */
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    int status = -1;
    *(int *)arg += pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status);
    return 1; /* one object is enough */
}

static int forks_inside_callbacks(int rounds) {
    start_lookers();
    int n = 0;
    for (int i = 0; i < rounds; i++)
        dl_iterate_phdr(forking_callback, &n);
    stop_lookers();
    return n == rounds;
}

static void test_fork_inside_loader_callback(int rounds) {
    in_child(forks_inside_callbacks, rounds, 30, "forks inside loader callbacks");
}

/* Other code's dl_iterate_phdr under way in another thread at the fork
 * (libunwind's, the program's) holds the loader's list lock, which the
 * child does not get back: the child's walks must never ask for it, yet
 * still walk their stacks whole (glibc 2.35 and later). */
static int slow_callback(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)info;
    (void)size;
    (void)arg;
    usleep(200);
    return 0;
}

static void *iterate_for_ever(void *arg) {
    (void)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        dl_iterate_phdr(slow_callback, NULL);
    return NULL;
}

/* A library opened twice: the child's dlclose of one only drops a reference,
 * which takes glibc no lock of the loader's list, nor may it the preload. */
static void *second_ref;

static __attribute__((noinline)) int child_walks(void) {
    if (second_ref && dlclose(second_ref) != 0)
        return 3;
    void *p = malloc(ANCHOR_SIZE + 5); /* walked: the child's rule cache starts empty */
    uint32_t id = p ? stack_of(p, ANCHOR_SIZE + 5) : 0;
    uintptr_t ips[8];
    uint32_t n = id ? api->stack(id, ips, 8) : 0;
    __asm__ __volatile__("" ::: "memory"); /* no tail call: keep the frame */
    /* child_walks, test_fork_during_foreign_iteration, main, and libc's */
    return n >= 3 ? 0 : 2;
}

static void test_fork_during_foreign_iteration(int forks) {
    void *first_ref = dlopen("libm.so.6", RTLD_NOW);
    second_ref = first_ref ? dlopen("libm.so.6", RTLD_NOW) : NULL;
    CHECK(second_ref != NULL);
    atomic_store(&stop, 0);
    pthread_t t;
    pthread_create(&t, NULL, iterate_for_ever, NULL);
    usleep(5000);
    int ok = 0, hung = 0, short_stack = 0;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            _exit(child_walks());
        }
        int status = -1;
        if (pid < 0 || waitpid(pid, &status, 0) < 0)
            break;
        ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        short_stack += WIFEXITED(status) && WEXITSTATUS(status) == 2;
        hung += WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
        if (hung) /* each hung child takes 10 s */
            break;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("%d forks while another thread was in dl_iterate_phdr: %d children hung (in a walk "
           "or a dlclose), %d with a cut stack\n",
           forks, hung, short_stack);
    CHECK_EQ(hung, 0);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
    CHECK_EQ(ok, forks);
#endif
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    setvbuf(stdout, NULL, _IOLBF, 0);
    int forks = (int)check_rounds(1000, 5, "forks"); /* as test_interpose_fork */
    test_fork_during_lookups(forks / 5);
    test_lookup_inside_loader_callback(forks * 2);
    test_fork_during_foreign_iteration(forks / 20);
    /* each fork may wait MT_FORK_GATE_WAIT_MS for the lookups it holds up */
    test_fork_inside_loader_callback(forks / 10 < 100 ? forks / 10 : 100);
    return check_summary();
}
