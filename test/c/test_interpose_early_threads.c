/* Threads that allocate before the preload's constructor runs (run with
 * the preload; early_threads.so, a dependency, starts them from its own
 * constructor, which the loader runs first).  The key whose destructor
 * gives a thread's stacks' memory back is made by the first thread that
 * registers: once, it was made in the constructor only, and each such
 * thread kept its walker and recent stacks, two mappings, for good.
 * And a thread's first free leaves errno as it was, although the key's
 * number, 32 or more, makes glibc's pthread_setspecific allocate, and that
 * allocation, unable to map a new arena under an address-space limit, sets
 * ENOMEM: once, that free returned with errno ENOMEM. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

extern int early_mappings_before, early_mappings_after, early_threads_run;

static void check_early_threads_gave_back(void) {
    CHECK_EQ(early_threads_run, 104);
    CHECK(early_mappings_before > 0);
    int grew = early_mappings_after - early_mappings_before;
    if (grew >= 10)
        fprintf(stderr, "mappings %d -> %d over 100 early threads\n", early_mappings_before,
                early_mappings_after);
    CHECK(grew < 10);
}

static void *volatile block;
static int errno_after_free;

static void *first_free(void *unused) {
    (void)unused;
    errno = 777;
    free(block); /* this thread's first call: it registers */
    errno_after_free = errno;
    return NULL;
}

/* The address space the process has mapped, in bytes. */
static unsigned long long mapped_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (f) {
        if (fscanf(f, "%llu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return pages * (unsigned long long)sysconf(_SC_PAGESIZE);
}

static void check_first_free_keeps_errno(void) {
    if (check_emulator()) { /* an emulator maps for itself under the limit */
        printf("skipped under an emulator: the errno of a first free under a limit\n");
        return;
    }
    block = malloc(100);
    unsigned long long now = mapped_now();
    CHECK(now > 0);
    struct rlimit old, limit;
    CHECK(getrlimit(RLIMIT_AS, &old) == 0);
    /* room for a small thread, not for a new arena (64 MiB, mapped twice) */
    limit.rlim_cur = now + (16ull << 20);
    limit.rlim_max = old.rlim_max;
    CHECK(setrlimit(RLIMIT_AS, &limit) == 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    pthread_t t;
    int created = pthread_create(&t, &attr, first_free, NULL) == 0;
    CHECK(created);
    if (created)
        pthread_join(t, NULL);
    pthread_attr_destroy(&attr);
    CHECK(setrlimit(RLIMIT_AS, &old) == 0);
    if (created)
        CHECK_EQ(errno_after_free, 777);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "errno")) {
        check_first_free_keeps_errno();
        return check_summary();
    }
    check_early_threads_gave_back();
    /* Again without the early threads, whose arenas, free again, would
     * spare the thread of the errno check a new one. */
    setenv("EARLY_THREADS_NONE", "1", 1);
    CHECK(check_child(argv[0], "errno"));
    return check_summary();
}
