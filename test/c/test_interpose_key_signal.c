/* A signal handler that allocates while the preload's constructor makes its
 * thread-exit key (run with the preload).  This program's own
 * pthread_key_create, which the preload's call reaches first, raises the
 * signal there: the handler's malloc must neither register the thread nor
 * wait for the key its own thread is making.  Once, it waited for good, at
 * full CPU, before main. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

static volatile sig_atomic_t handled;
static void *volatile kept;

static void allocate_in_handler(int sig) {
    (void)sig;
    kept = malloc(48);
    free(kept);
    handled++;
}

int pthread_key_create(pthread_key_t *key, void (*destructor)(void *)) {
    static int (*real)(pthread_key_t *, void (*)(void *));
    if (!real) {
        real = (int (*)(pthread_key_t *, void (*)(void *)))dlsym(RTLD_NEXT, "pthread_key_create");
        alarm(20); /* a hang ends the test, killed by SIGALRM */
    }
    signal(SIGUSR1, allocate_in_handler);
    raise(SIGUSR1);
    return real ? real(key, destructor) : -1;
}

static void *thread_main(void *unused) {
    (void)unused;
    kept = malloc(100);
    free(kept);
    return NULL;
}

int main(void) {
    alarm(0);
    CHECK(handled > 0); /* the preload made its key through this function */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_main, NULL) == 0 && pthread_join(t, NULL) == 0);
    return check_summary();
}
