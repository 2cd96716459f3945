/* A signal handler's fork inside a fork (run with the preload).  A prepare
 * handler registered before the preload's (from DT_PREINIT_ARRAY, so glibc
 * runs it after the preload's, which holds every lock by then) raises a
 * signal whose handler forks.  The inner fork must take nothing and give
 * nothing back, and the outer one must give back all it took: afterwards
 * the forking thread is tracked again and another thread can allocate.
 * Before, the inner fork's "alone" outlived it, the outer fork kept every
 * lock, and the new thread waited for ever. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"

#ifndef __GLIBC__
int main(void) {
    printf("skipped: this C library runs no DT_PREINIT_ARRAY\n");
    return check_summary();
}
#else
#define ROUNDS 20

static volatile sig_atomic_t raise_in_prepare, nested;

static void fork_and_wait(void) {
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

static void handler(int sig) {
    (void)sig;
    fork_and_wait();
    nested++;
}

static void prepare(void) {
    if (raise_in_prepare) {
        raise_in_prepare = 0;
        raise(SIGUSR1);
    }
}

static void preinit(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    pthread_atfork(prepare, NULL, NULL);
}
__attribute__((section(".preinit_array"),
               used)) static void (*const run_preinit)(int, char **, char **) = preinit;

static void *allocate(void *done) {
    for (int i = 0; i < 1000; i++) {
        void *volatile p = malloc(100 + (size_t)i);
        free(p);
    }
    *(volatile int *)done = 1;
    return NULL;
}

int main(void) {
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    alarm(60); /* a lock kept for good hangs the stats too: fail, not wait */
    signal(SIGUSR1, handler);
    for (int i = 0; i < ROUNDS; i++) {
        raise_in_prepare = 1;
        fork_and_wait();
    }
    CHECK_EQ(nested, ROUNDS);

    /* This thread's calls are counted again. */
    struct mtrace_stats s0, s1;
    api->stats(&s0, sizeof s0);
    void *volatile p = malloc(1000);
    api->stats(&s1, sizeof s1);
    CHECK_EQ(s1.calls[MT_FN_MALLOC] - s0.calls[MT_FN_MALLOC], 1);
    CHECK_EQ(s1.live_count - s0.live_count, 1);
    free(p);

    /* Another thread takes the locks the forks held. */
    int done = 0;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, allocate, &done), 0);
    for (int ms = 0; ms < 30000 && !*(volatile int *)&done; ms += 10)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    CHECK_EQ(*(volatile int *)&done, 1);
    if (!done) { /* still waiting: no exit handler may wait with it */
        check_summary();
        fflush(stdout);
        _exit(1);
    }
    pthread_join(t, NULL);
    return check_summary();
}
#endif
