/* A signal handler's calls while its thread is inside the tracker (run with
 * the preload).  A profiling timer interrupts a thread that allocates and
 * frees in a loop, so mostly inside the tracker (walking its stack,
 * updating the table), and the handler allocates a block it keeps and
 * frees one the thread allocated before.  None of the handler's calls may be lost: the call
 * counters count every call exactly, and each block the handler keeps is either in the table or
 * counted as dropped (it cannot be recorded while its thread may hold a lock the record needs),
 * and each block it frees leaves the table (before, a few of them stayed there, freed: a free
 * made while the thread held a table lock could not forget its block).  Before, such calls
 * passed uncounted, and about half of the kept blocks were in neither.  The same again with
 * MTRACE_UNWIND=libunwind, where the thread is inside libunwind for most of a walk (before,
 * the handler's calls there went uncounted).  A signal that interrupts the libc itself (its
 * own malloc) is let pass: see interrupted.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "check.h"
#include "interrupted.h"
#include "mtrace_api.h"
#include "queries.h"

#define KEPT 256
#define KEPT_SIZE 24    /* no other block of the test has this size */
#define SPARE_SIZE 4001 /* nor this one */

static const struct mtrace_api *api;
static void *kept[KEPT], *spare[KEPT];
static volatile sig_atomic_t handled;

static void handler(int sig, siginfo_t *info, void *uc) {
    (void)sig;
    (void)info;
    if (handled < KEPT && !interrupted_libc(uc)) {
        kept[handled] = malloc(KEPT_SIZE);
        free(spare[handled]);
        handled++;
    }
}

static uint64_t calls(const struct mtrace_stats *s, enum mtrace_fn fn) { return s->calls[fn]; }

int main(int argc, char **argv) {
    int child = argc > 1 && !strcmp(argv[1], "libunwind");
    if (!child) { /* the run with libunwind walking, in a child */
        setenv("MTRACE_UNWIND", "libunwind", 1);
        CHECK(check_child(argv[0], "libunwind"));
        unsetenv("MTRACE_UNWIND");
    }
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    CHECK(interrupted_init());
    if (!api)
        return check_summary();
    for (int k = 0; k < KEPT; k++)
        spare[k] = malloc(SPARE_SIZE);
    struct mtrace_stats before, after;
    api->stats(&before, sizeof before);

    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGPROF, &sa, &old);
    struct itimerval every = {{0, 100}, {0, 100}}, stop = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &every, NULL);
    uint64_t loop = 0;
    while (handled < KEPT) {
        void *p = malloc(32);
        free(p);
        loop++;
    }
    setitimer(ITIMER_PROF, &stop, NULL);
    sigaction(SIGPROF, &old, NULL);
    api->stats(&after, sizeof after);

    /* Every call counted, the handler's too. */
    CHECK_EQ(calls(&after, MT_FN_MALLOC) - calls(&before, MT_FN_MALLOC), loop + KEPT);
    CHECK_EQ(calls(&after, MT_FN_FREE) - calls(&before, MT_FN_FREE), loop + KEPT);

    /* Each kept block recorded or counted as dropped, exactly. */
    static struct mtrace_alloc buf[2 * KEPT];
    struct mtrace_query q = sized_query(KEPT_SIZE, KEPT_SIZE);
    size_t n = query_olds(api, &q, buf, 2 * KEPT), recorded = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < KEPT; k++)
            if (buf[i].addr == (uintptr_t)kept[k]) {
                recorded++;
                break;
            }
    uint64_t dropped = after.dropped - before.dropped;
    printf("%d blocks kept by the handler: %zu recorded, %llu dropped\n", KEPT, recorded,
           (unsigned long long)dropped);
    CHECK_EQ(recorded + dropped, KEPT);

    /* Each block the handler freed is gone from the table. */
    static struct mtrace_alloc spares[2 * KEPT];
    struct mtrace_query sq = sized_query(SPARE_SIZE, SPARE_SIZE);
    size_t still = query_olds(api, &sq, spares, 2 * KEPT);
    printf("%d blocks freed by the handler: %zu still in the table%s\n", KEPT, still,
           child ? " (MTRACE_UNWIND=libunwind)" : "");
    CHECK_EQ(still, 0);

    for (int k = 0; k < KEPT; k++)
        free(kept[k]);
    void *later = malloc(3009); /* recording goes on as before */
    CHECK(query_block(api, later, 3009, buf, 2 * KEPT, NULL));
    free(later);
    return check_summary();
}
