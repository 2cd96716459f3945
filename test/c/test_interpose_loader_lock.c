/* The loader's lock and libunwind's (run with the preload, started again
 * with MTRACE_UNWIND=libunwind so that every stack is libunwind's): two
 * threads run on makecontext stacks in static memory.  One allocates in a
 * loop; the other calls dl_iterate_phdr, whose callback strdup()s each
 * object's name while the loader's lock is held.  libunwind holds its own lock while it waits for
 * the loader's: a capture that waited for libunwind inside that callback
 * hung both threads for ever (in most runs).  The test ends, or the alarm
 * kills it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__GLIBC__)
#include <ucontext.h>
#endif
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"

#define SECONDS 1.5
#define COROUTINE_STACK (256 * 1024)

static _Atomic int stop;
static _Atomic long allocated, iterated;

static int keep_name(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    char **kept = arg;
    static __thread unsigned k;
    free(kept[k % 8]);
    kept[k++ % 8] = strdup(info->dlpi_name ? info->dlpi_name : "");
    return 0;
}

static void iterate_loop(void) {
    char *kept[8] = {0};
    while (!atomic_load(&stop)) {
        dl_iterate_phdr(keep_name, kept);
        atomic_fetch_add(&iterated, 1);
    }
    for (int i = 0; i < 8; i++)
        free(kept[i]);
}

static void *volatile sink;
static void alloc_loop(void) {
    while (!atomic_load(&stop)) {
        sink = malloc(64);
        free(sink);
        atomic_fetch_add(&allocated, 1);
    }
}

#if defined(__GLIBC__)
/* In the program's data, far from any thread's stack. */
static char stacks[2][COROUTINE_STACK] __attribute__((aligned(64)));
static _Atomic int stacks_used;

static void *on_coroutine(void *fn) {
    ucontext_t back, co;
    getcontext(&co);
    co.uc_stack.ss_sp = stacks[atomic_fetch_add(&stacks_used, 1)];
    co.uc_stack.ss_size = COROUTINE_STACK;
    co.uc_link = &back;
    makecontext(&co, (void (*)(void))fn, 0);
    swapcontext(&back, &co);
    return NULL;
}
#define FALLS_BACK 1
#else
/* musl has no makecontext (and the preload no libunwind there): the same
 * loops on the threads' own stacks. */
static void *on_coroutine(void *fn) {
    ((void (*)(void))fn)();
    return NULL;
}
#define FALLS_BACK 0
#endif

int main(int argc, char **argv) {
    (void)argc;
    if (FALLS_BACK && !getenv("MTRACE_UNWIND")) {
        setenv("MTRACE_UNWIND", "libunwind", 1);
        check_exec_self(argv);
        fprintf(stderr, "could not start again with MTRACE_UNWIND=libunwind\n");
        return 1;
    }
    alarm(120); /* a hang fails the test (SIGALRM ends it) */
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        goto done;
    struct mtrace_stats before, after;
    memset(&before, 0, sizeof before);
    memset(&after, 0, sizeof after);
    api->stats(&before, sizeof before);

    pthread_t a, b;
    CHECK(pthread_create(&a, NULL, on_coroutine, (void *)alloc_loop) == 0);
    CHECK(pthread_create(&b, NULL, on_coroutine, (void *)iterate_loop) == 0);
    struct timespec ts = {(time_t)SECONDS, (long)((SECONDS - (time_t)SECONDS) * 1e9)};
    nanosleep(&ts, NULL);
    atomic_store(&stop, 1);
    pthread_join(a, NULL);
    pthread_join(b, NULL);

    api->stats(&after, sizeof after);
    CHECK(atomic_load(&allocated) > 0);
    CHECK(atomic_load(&iterated) > 0);
    CHECK(!FALLS_BACK || after.fast_unwind == 0); /* every stack libunwind's */
    CHECK(after.stacks > before.stacks);
    printf("%ld allocations, %ld iterations; %llu stacks cut short\n", atomic_load(&allocated),
           atomic_load(&iterated), (unsigned long long)(after.unwind_cut - before.unwind_cut));
done:
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed != 0;
}
