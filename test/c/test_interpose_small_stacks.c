/* Threads with small stacks (run with the preload): the preload's own
 * thread-local storage, which glibc takes from the top of every thread's
 * stack in every program the preload is in, stays small; and a thread on a
 * stack of the smallest size the system allows, given by the caller inside
 * a painted region, records blocks from call sites it has never used
 * (each a fresh walk, and the first of a new stack) without writing a
 * byte below that stack.  A capture once kept 11 KiB on the C stack and
 * 9 KiB in TLS: this thread then wrote 6 KiB below its stack. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"

#define TLS_MAX 1024 /* bytes of mtrace.so's TLS block, at most */
#define BELOW 65536  /* painted bytes below the thread's stack */
#define PAINT 0xA5

static const struct mtrace_api *api;

static int find_tls(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    size_t len = strlen(name);
    if (len < 9 || strcmp(name + len - 9, "mtrace.so") != 0)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_TLS)
            *(long *)arg = (long)info->dlpi_phdr[i].p_memsz;
    if (*(long *)arg < 0)
        *(long *)arg = 0; /* loaded, without any TLS */
    return 1;
}

/* Distinct call sites, each a stack of its own. */
static void *volatile sink[8];
static __attribute__((noinline)) void site_malloc(void) { sink[0] = malloc(3001); }
static __attribute__((noinline)) void site_calloc(void) { sink[1] = calloc(7, 433); }
static __attribute__((noinline)) void site_strdup(void) { sink[2] = strdup("small stacks"); }
static __attribute__((noinline)) void site_realloc(void) { sink[3] = realloc(NULL, 3007); }
static __attribute__((noinline)) void deeper(int n) {
    if (n > 0) {
        deeper(n - 1);
        __asm__ volatile("" ::: "memory"); /* not a tail call: a frame each */
        return;
    }
    sink[4] = malloc(3011);
}

static void *on_small_stack(void *arg) {
    (void)arg;
    site_malloc();
    site_calloc();
    site_strdup();
    site_realloc();
    deeper(12);
    for (int i = 0; i < 5; i++)
        free(sink[i]);
    return NULL;
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        goto done;

    long tls = -1;
    dl_iterate_phdr(find_tls, &tls);
    CHECK(tls >= 0); /* the preload is loaded */
    CHECK(tls <= TLS_MAX);
    if (tls > TLS_MAX)
        fprintf(stderr, "mtrace.so's TLS block: %ld bytes\n", tls);

    long min = sysconf(_SC_THREAD_STACK_MIN);
    size_t stack = (size_t)(min > 16384 ? min : 16384);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t total = BELOW + stack;
    unsigned char *region =
        mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(region != MAP_FAILED);
    if (region == MAP_FAILED)
        goto done;
    memset(region, PAINT, total);
    unsigned char *base = region + BELOW; /* stack [base, base + stack) */
    CHECK((uintptr_t)base % page == 0);

    struct mtrace_stats before, after;
    memset(&before, 0, sizeof before);
    memset(&after, 0, sizeof after);
    api->stats(&before, sizeof before);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    CHECK(pthread_attr_setstack(&attr, base, stack) == 0);
    pthread_t t;
    int created = pthread_create(&t, &attr, on_small_stack, NULL) == 0;
    CHECK(created);
    if (created)
        pthread_join(t, NULL);
    pthread_attr_destroy(&attr);

    size_t written = 0;
    for (size_t i = 0; i < BELOW; i++)
        written += region[i] != PAINT;
    CHECK_EQ(written, 0);

    api->stats(&after, sizeof after);
    CHECK(after.calls[MT_FN_MALLOC] >= before.calls[MT_FN_MALLOC] + 2);
    CHECK(after.calls[MT_FN_STRDUP] >= before.calls[MT_FN_STRDUP] + 1);
    CHECK(after.stacks >= before.stacks + 5); /* each site a new stack */
    CHECK_EQ(after.stacks_dropped, before.stacks_dropped);
    munmap(region, total);
done:
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed != 0;
}
