/* A SCHED_FIFO thread and a thread of normal priority on one processor,
 * each freeing the other's blocks (run with the preload): when the
 * real-time thread waits for a table lock the other holds, preempted, it
 * must let that thread run.  It spun, yielding (which runs only threads of
 * its own priority), until the kernel throttled real-time threads: a
 * second or more a wait, about ten rounds in four seconds.  Here 2,000
 * rounds must end before the alarm.  Skipped where real-time scheduling
 * is not allowed (no CAP_SYS_NICE, no RLIMIT_RTPRIO) or under an emulator. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define SLOTS 4096
#define ROUNDS 2000

static _Atomic(void *) pool[SLOTS];
static atomic_int stop, high_done;

static void pin(void) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(0, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* Replaces blocks of the shared pool: each frees what the other made. */
static void churn(unsigned *seed, int n) {
    for (int i = 0; i < n; i++) {
        unsigned k = (unsigned)rand_r(seed) % SLOTS;
        free(atomic_exchange(&pool[k], NULL));
        void *p = malloc(16 + (unsigned)rand_r(seed) % 512);
        free(atomic_exchange(&pool[k], p));
    }
}

static void *low(void *arg) {
    (void)arg;
    pin();
    unsigned seed = 1;
    while (!atomic_load(&stop))
        churn(&seed, 1000);
    return NULL;
}

static void *high(void *arg) {
    int *allowed = arg;
    pin();
    struct sched_param sp = {.sched_priority = 10};
    *allowed = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0;
    unsigned seed = 2;
    for (int i = 0; *allowed && i < ROUNDS; i++) {
        struct timespec pause = {0, 100000}; /* the other thread runs meanwhile */
        nanosleep(&pause, NULL);
        churn(&seed, 20);
        atomic_store(&high_done, i + 1);
    }
    atomic_store(&stop, 1);
    return NULL;
}

/* In a child, whose alarm ends a wait that never does. */
static int run(void) {
    alarm(60);
    int allowed = 0;
    pthread_t a, b;
    pthread_create(&a, NULL, low, NULL);
    pthread_create(&b, NULL, high, &allowed);
    pthread_join(b, NULL);
    pthread_join(a, NULL);
    if (!allowed)
        return 2;
    return atomic_load(&high_done) == ROUNDS ? 0 : 1;
}

int main(void) {
    if (check_emulator()) {
        printf("skipped: real-time scheduling under an emulator\n");
        return check_summary();
    }
    pid_t pid = fork();
    if (pid == 0)
        _exit(run());
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
        printf("skipped: SCHED_FIFO not allowed here\n");
        return check_summary();
    }
    int hung = WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
    printf("%d rounds of a SCHED_FIFO thread sharing blocks with a normal one: %s\n", ROUNDS,
           hung ? "not done in 60 s" : "done");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return check_summary();
}
