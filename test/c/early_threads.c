/* A library whose constructor runs before the preload's (a dependency of
 * the program, see test_interpose_early_threads.c): it makes 40 thread keys,
 * so that the preload's own key has a number of 32 or more, and then
 * (unless EARLY_THREADS_NONE is set) runs threads that allocate, one after
 * another, counting the process's mappings around them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "mappings.h"

#define KEYS 40
#define WARM_UP 4
#define THREADS 100

int early_mappings_before = -1, early_mappings_after = -1, early_threads_run;

static void *volatile kept; /* so that the compiler keeps each malloc */

static void *allocating(void *unused) {
    (void)unused;
    for (int i = 0; i < 100; i++) {
        kept = malloc(32 + (size_t)i);
        free(kept);
    }
    return NULL;
}

static void run_threads(int n) {
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, allocating, NULL) == 0 && pthread_join(t, NULL) == 0)
            early_threads_run++;
    }
}

__attribute__((constructor)) static void start_early_threads(void) {
    pthread_key_t keys[KEYS];
    for (int i = 0; i < KEYS; i++)
        pthread_key_create(&keys[i], NULL);
    if (getenv("EARLY_THREADS_NONE")) /* their arenas would spare a later thread its own */
        return;
    run_threads(WARM_UP); /* the process's first threads map what they all share */
    early_mappings_before = count_mappings();
    run_threads(THREADS);
    early_mappings_after = count_mappings();
}
