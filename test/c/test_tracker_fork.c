/* Forks that meet the tracker's locks held, with the tracker built into this
 * program (hooks.c's names renamed: malloc -> mtt_malloc, ...), so that the
 * test can reach inside it:
 * - the rule of waits on those locks (spinlock.h's mt_lock_wait_unless):
 *   forks that come and go are waited for, a fork that stands still is
 *   given up on after a second or two, and then at once (before a holder
 *   lets go half a second on);
 * - a signal handler's fork that interrupted its own thread holding a table
 *   lock (raised from the table's map hook, which runs under it) waits for
 *   nothing: its child allocates, untraced, and exits, and the parent's
 *   table goes on exact, through a plain fork after it too.  Without that
 *   rule the fork waited for itself, and alarm() ends the test;
 * - such a fork while another thread holds the table memory's lock (stopped
 *   in the map hook): the interrupted work, which goes on in the child
 *   and needs that lock, gives up on it there at once, and the child exits
 *   (its stats() summing the counts without their lock, held by another);
 * - a fork found stuck is forgotten once it is done: the count of forks
 *   done wraps, and a fork 65,536 later must not be given up on at once.
 * Run with MTRACE_PROGRAMS=test_tracker_fork (test/c/run.sh does).
 *   test_tracker_fork BUILD */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include "check.h"
#include "counters.h"
#include "mtrace_api.h"
#include "spinlock.h"
#include "state.h"
#include "table.h"

extern const struct mtrace_api mtrace_api_v2;
void *mtt_malloc(size_t n);
void mtt_free(void *p);

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- the rule ------------------------------------------------------------ */

static mt_spinlock lock;
static struct mt_fork_watch watch;

struct holder {
    int tenths; /* holds the lock this many tenths of a second */
    int bump;   /* a fork done every tenth meanwhile */
};

static void *unlock_later(void *arg) {
    const struct holder *h = arg;
    for (int i = 0; i < h->tenths; i++) {
        usleep(100000);
        if (h->bump)
            atomic_fetch_add(&watch.forking, 1 << 16);
    }
    mt_unlock(&lock);
    return NULL;
}

/* Waits for the lock while a thread holds it for a while: 1 when the wait
 * got it, 0 when it gave up first; *waited, how long it took (s). */
static int wait_for_holder(int tenths, int forks_come_and_go, double *waited) {
    pthread_t t;
    struct holder h = {tenths, forks_come_and_go};
    atomic_store(&lock, 1);
    pthread_create(&t, NULL, unlock_later, &h);
    double t0 = now_s();
    int got = mt_lock_wait_unless(&lock, &watch);
    *waited = now_s() - t0;
    pthread_join(t, NULL);
    mt_unlock(&lock);
    return got;
}

static void test_rule(void) {
    atomic_store(&lock, 1); /* held for ever by a thread the fork waits for */
    atomic_store(&watch.forking, 1);
    double t0 = now_s(), first, again;
    CHECK_EQ(mt_lock_wait_unless(&lock, &watch), 0); /* given up on */
    first = now_s() - t0;
    CHECK_EQ(atomic_load(&watch.stuck_at), 1); /* and noted */
    /* The same fork: given up at once, before a holder lets go 0.5 s on
     * (a wait of a second or two would have got the lock). */
    CHECK_EQ(wait_for_holder(5, 0, &again), 0);
    printf("a fork standing still: given up after %.2f s, then after %.6f s\n", first, again);

    /* Another fork under way, which others' forks move on from (one done
     * every 0.1 s): waited for, however long. */
    atomic_store(&watch.forking, (1 << 16) + 1);
    CHECK_EQ(wait_for_holder(25, 1, &again), 1);
    /* No fork under way, only forks done: waited for. */
    atomic_store(&watch.forking, 3 << 16);
    CHECK_EQ(wait_for_holder(25, 0, &again), 1);
}

/* ---- a signal handler's fork inside the tracker -------------------------- */

static _Atomic int map_calls;
static volatile sig_atomic_t child_status = -1;

static void *map_and_signal(size_t bytes) {
    if (atomic_fetch_add(&map_calls, 1) == 0)
        raise(SIGUSR1); /* the table's locks held: a shard's and its memory's */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static struct mtrace_stats stats(void);

/* Forks a child that allocates and exits 0 when its tracking is as
 * expected (on after a plain fork, off after an orphaning one). */
static int fork_and_wait(int active) {
    pid_t pid = fork();
    if (pid == 0) {
        void *p = mtt_malloc(100);
        mtt_free(p);
        _exit(!p ? 3 : stats().active != (uint32_t)active ? 4 : 0);
    }
    int st = -1;
    if (pid > 0)
        waitpid(pid, &st, 0);
    return st;
}

static void on_usr1(int sig) {
    (void)sig;
    child_status = fork_and_wait(0);
}

static struct mtrace_stats stats(void) {
    struct mtrace_stats s;
    memset(&s, 0, sizeof s);
    if (mtrace_api_v2.stats(&s, sizeof s) != MTRACE_OK)
        s.live_count = UINT64_MAX;
    return s;
}

static uint64_t live_count(void) { return stats().live_count; }

#define MAX_BLOCKS (1 << 21)

/* Installs handler for sig; room for MAX_BLOCKS blocks kept, zeroed, or
 * NULL. */
static void **handler_and_room(int sig, void (*handler)(int)) {
    struct sigaction sa = {.sa_handler = handler};
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    void **kept = mmap(NULL, MAX_BLOCKS * sizeof(void *), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(kept != MAP_FAILED);
    return kept == MAP_FAILED ? NULL : kept;
}

static void test_handler_fork(void) {
    void **kept = handler_and_room(SIGUSR1, on_usr1);
    if (!kept)
        return;
    uint64_t before = live_count();
    mt_table_map_hook = map_and_signal;
    size_t n = 0;
    while (n < MAX_BLOCKS && !atomic_load(&map_calls))
        kept[n++] = mtt_malloc(64);
    mt_table_map_hook = NULL;
    CHECK(atomic_load(&map_calls) > 0); /* the table grew while recording */
    printf("the table mapped memory at block %zu; the handler's child: status %#x\n", n,
           (unsigned)child_status);
    CHECK(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0);
    CHECK_EQ(live_count(), before + n); /* every block recorded, the interrupted one too */
    int st = fork_and_wait(1);          /* and a plain fork after it */
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (size_t i = 0; i < n; i++)
        mtt_free(kept[i]);
    CHECK_EQ(live_count(), before);
    munmap(kept, MAX_BLOCKS * sizeof(void *));
}

/* ---- the same fork, another thread holding the table memory's lock ---- */

static pthread_t holder;
static _Atomic int holding, let_go, orphan_status_set;
static volatile sig_atomic_t in_child, orphan_status = -1;

static void *map_and_hold(size_t bytes) {
    if (pthread_equal(pthread_self(), holder) && !atomic_exchange(&holding, 1))
        while (!atomic_load(&let_go))
            usleep(1000);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void *allocate_until_held(void *kept) {
    for (size_t n = 0; n < MAX_BLOCKS && !atomic_load(&holding); n++)
        ((void **)kept)[n] = mtt_malloc(64);
    return NULL;
}

/* The child waits here for nothing: it goes on with the interrupted work. */
static void fork_on_usr2(int sig) {
    (void)sig;
    pid_t pid = fork();
    if (pid == 0) {
        in_child = 1;
        return;
    }
    int st = -1;
    for (int i = 0; pid > 0 && i < 1000 && waitpid(pid, &st, WNOHANG) == 0; i++)
        usleep(10000);
    if (pid > 0 && !WIFEXITED(st) && !WIFSIGNALED(st)) { /* still waiting after 10 s */
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    orphan_status = st;
    atomic_store(&orphan_status_set, 1);
}

struct nudge {
    pthread_t target;
};

static void *nudge_then_let_go(void *arg) {
    usleep(200000);   /* the target is waiting for the lock by then */
    mt_counts_lock(); /* the child's stats() sums the counts without it */
    pthread_kill(((struct nudge *)arg)->target, SIGUSR2);
    while (!atomic_load(&orphan_status_set))
        usleep(1000);
    mt_counts_unlock();
    atomic_store(&let_go, 1);
    return NULL;
}

static void test_orphan_waits(void) {
    void **kept = handler_and_room(SIGUSR2, fork_on_usr2);
    if (!kept)
        return;
    uint64_t before = live_count();
    mt_table_map_hook = map_and_hold;
    pthread_create(&holder, NULL, allocate_until_held, kept);
    while (!atomic_load(&holding))
        usleep(1000);
    pthread_t nudger;
    struct nudge n = {pthread_self()};
    pthread_create(&nudger, NULL, nudge_then_let_go, &n);
    /* 128 MiB goes to the spill, whose first entry needs the table's
     * memory: this waits for the holder, and is interrupted meanwhile. */
    void *big = mtt_malloc((size_t)128 << 20);
    if (in_child)
        _exit(!big ? 3 : stats().active ? 4 : 0);
    pthread_join(nudger, NULL);
    pthread_join(holder, NULL);
    mt_table_map_hook = NULL;
    printf("the orphaned child's status: %#x\n", (unsigned)orphan_status);
    CHECK(WIFEXITED(orphan_status) && WEXITSTATUS(orphan_status) == 0);
    size_t held = 0;
    while (held < MAX_BLOCKS && kept[held])
        held++;
    CHECK(big != NULL);
    CHECK_EQ(live_count(), before + held + 1); /* the parent's table exact */
    mtt_free(big);
    for (size_t i = 0; i < held; i++)
        mtt_free(kept[i]);
    CHECK_EQ(live_count(), before);
    munmap(kept, MAX_BLOCKS * sizeof(void *));
}

/* ---- a stuck fork forgotten once done ------------------------------------ */

static void test_stuck_forgotten(void) {
    /* As if found stuck 65,536 forks ago, with the value the forks' word
     * will have while the next fork is under way. */
    int during = atomic_load(&mt_state.fork.forking) + 1;
    atomic_store(&mt_state.fork.stuck_at, during);
    int st = fork_and_wait(1);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ(atomic_load(&mt_state.fork.stuck_at), 0);
    CHECK_EQ(atomic_load(&mt_state.fork.forking), during - 1 + (1 << 16));
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* what was done shows if the alarm ends it */
    alarm(120);                       /* a fork waiting for itself: killed, and so failed */
    CHECK(stats().active);            /* MTRACE_PROGRAMS names this program */
    test_rule();
    test_handler_fork();
    test_orphan_waits();
    test_stuck_forgotten();
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed != 0;
}
