/* Blocks allocated as a thread exits (run with the preload): the
 * destructors of another library's thread keys run after the preload's own
 * (its key is made first), in the round the C library calls them all or in
 * a later one when they set their key again.  Their blocks keep their
 * stacks: the preload lets go of the thread's walker only after a round
 * with no call of the thread's, or in the last.  It once did in the first,
 * and these blocks were recorded without a stack (stacks_dropped).  And a
 * thread whose only calls are a destructor's, which sets the preload's key
 * in the middle of the rounds, still gives its memory back, with the
 * counter registry full as well, or when that destructor sets its key
 * again in every round (no round is quiet): once, each kept two mappings. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mappings.h"
#include "mtrace_api.h"
#include "queries.h"

#define FIRST_ROUND 4099  /* bytes a destructor allocates in the first round */
#define SECOND_ROUND 4111 /* and in the second, having set its key again */

static const struct mtrace_api *api;
static pthread_key_t key;
static void *volatile made[2];

static __attribute__((noinline)) void *allocate_on_exit(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory"); /* a call, not a jump: a frame of its own */
    return p;
}

static void on_exit_of_thread(void *value) {
    if ((uintptr_t)value == 1) {
        made[0] = allocate_on_exit(FIRST_ROUND);
        pthread_setspecific(key, (void *)2); /* once more, in the next round */
    } else {
        made[1] = allocate_on_exit(SECOND_ROUND);
    }
}

static void *thread_main(void *unused) {
    (void)unused;
    free(malloc(64)); /* a counted call: the preload's key is set */
    pthread_setspecific(key, (void *)1);
    return NULL;
}

static pthread_key_t late_key;
/* The late destructor sets its key again in every round, as long as the C
 * library calls it (and allocates in each). */
static int late_rearms;

static void late_exit_of_thread(void *value) {
    free(allocate_on_exit(100)); /* this thread's first counted calls */
    if (late_rearms)
        pthread_setspecific(late_key, value);
}

static void *late_thread_main(void *unused) {
    (void)unused;
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

/* Threads one after another, each counted first by its destructor. */
static void check_late_threads_give_back(void) {
    int threads = 200, before = count_mappings();
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, late_thread_main, NULL) == 0)
            pthread_join(t, NULL);
    }
    int after = count_mappings();
    CHECK(before > 0);
    if (after - before >= threads / 10)
        fprintf(stderr, "mappings %d -> %d over %d threads\n", before, after, threads);
    CHECK(after - before < threads / 10);
}

/* The stack of p, a live block of n bytes, starts in allocate_on_exit. */
static void check_has_its_stack(void *p, uint64_t n) {
    struct mtrace_query q = sized_query(n, n);
    struct mtrace_alloc a[4];
    size_t got = query_olds(api, &q, a, 4);
    CHECK_EQ(got, 1);
    if (got != 1)
        return;
    CHECK_EQ(a[0].addr, (uintptr_t)p);
    uintptr_t ips[MTRACE_MAX_DEPTH];
    uint32_t depth = api->stack(a[0].stack_id, ips, MTRACE_MAX_DEPTH);
    CHECK(depth >= 2);
    CHECK(depth > 0 && ips[0] > (uintptr_t)allocate_on_exit &&
          ips[0] < (uintptr_t)allocate_on_exit + 128);
}

/* Threads that hold every struct of the preload's counter registry: the
 * threads after them count in the shared counters. */
#define HOLDERS 1024
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
static int holding, released;

static void *holder_main(void *unused) {
    (void)unused;
    free(malloc(64)); /* registers */
    pthread_mutex_lock(&hold_lock);
    holding++;
    pthread_cond_broadcast(&hold_cond);
    while (!released)
        pthread_cond_wait(&hold_cond, &hold_lock);
    pthread_mutex_unlock(&hold_lock);
    return NULL;
}

/* Late threads give back what they took with the registry full too. */
static void check_late_threads_give_back_unregistered(void) {
    static pthread_t holders[HOLDERS];
    pthread_attr_t attr;
    CHECK(pthread_attr_init(&attr) == 0);
    /* small, but not below aarch64's smallest (128 KiB) */
    CHECK(pthread_attr_setstacksize(&attr, 256 << 10) == 0);
    int n = 0;
    while (n < HOLDERS && pthread_create(&holders[n], &attr, holder_main, NULL) == 0)
        n++;
    CHECK_EQ(n, HOLDERS);
    pthread_mutex_lock(&hold_lock);
    while (holding < n)
        pthread_cond_wait(&hold_cond, &hold_lock);
    pthread_mutex_unlock(&hold_lock);
    check_late_threads_give_back();
    pthread_mutex_lock(&hold_lock);
    released = 1;
    pthread_cond_broadcast(&hold_cond);
    pthread_mutex_unlock(&hold_lock);
    for (int i = 0; i < n; i++)
        pthread_join(holders[i], NULL);
    pthread_attr_destroy(&attr);
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    CHECK(pthread_key_create(&key, on_exit_of_thread) == 0);
    struct mtrace_stats before, after;
    memset(&before, 0, sizeof before);
    memset(&after, 0, sizeof after);
    api->stats(&before, sizeof before);

    pthread_t t;
    int created = pthread_create(&t, NULL, thread_main, NULL) == 0;
    CHECK(created);
    if (created)
        pthread_join(t, NULL);

    api->stats(&after, sizeof after);
    CHECK(made[0] != NULL && made[1] != NULL);
    CHECK_EQ(after.stacks_dropped, before.stacks_dropped);
    check_has_its_stack(made[0], FIRST_ROUND);
    check_has_its_stack(made[1], SECOND_ROUND);
    free(made[0]);
    free(made[1]);
    CHECK(pthread_key_create(&late_key, late_exit_of_thread) == 0);
    check_late_threads_give_back();
    check_late_threads_give_back_unregistered();
    /* the preload's key set in the first round, never a quiet one after */
    late_rearms = 1;
    check_late_threads_give_back();
    return check_summary();
}
