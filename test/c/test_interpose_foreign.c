/* A program linked with an allocator of its own (foreign_alloc.c, as with
 * libjemalloc or libtcmalloc), run with the preload: every function of the
 * malloc family reaches that allocator, as it does without the preload, so
 * no block goes back to an allocator it did not come from; and the blocks
 * are recorded and forgotten as any others.  Built a second time with the
 * allocator in the program itself (OWN_ALLOC, test_interpose_own_alloc, as
 * chromium's is): the program's definitions come before the preload's,
 * which then sees only the calls the program does not define (strdup),
 * and these must reach the program's malloc too.  Run traced (by run.sh)
 * and untraced. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

int foreign_owns(const void *p);
unsigned long foreign_frees(void);
unsigned long foreign_strays(void);

static const struct mtrace_api *api;
static int traced; /* the preload is there and tracks this program */

/* Whether the table holds p as a block of n bytes (1 when not traced). */
static int recorded(void *p, size_t n) {
#ifdef OWN_ALLOC
    (void)p, (void)n;
    return 1; /* the program's own malloc and free: the preload sees neither */
#endif
    if (!traced)
        return 1;
    struct mtrace_alloc a[64];
    return query_block(api, p, n, a, 64, NULL);
}

static void check_block(void *p, size_t n, const char *fn) {
    CHECK(p != NULL);
    if (!p)
        return;
    if (!foreign_owns(p))
        printf("%s: the block is not the program's allocator's\n", fn);
    CHECK(foreign_owns(p));
    CHECK(malloc_usable_size(p) >= n);
    CHECK(recorded(p, n));
    unsigned long frees = foreign_frees();
    free(p);
    CHECK_EQ(foreign_frees(), frees + 1);
#ifndef OWN_ALLOC
    CHECK(!traced || !recorded(p, n));
#endif
}

int main(void) {
#if defined(OWN_ALLOC) && !defined(__GLIBC__)
    printf("skipped: a program's own allocator is not seen on musl (README, Limitations)\n");
    return 0;
#endif
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    struct mtrace_stats s;
    traced = api && api->stats(&s, sizeof s) == MTRACE_OK && s.active;
    printf("%s\n", traced ? "traced" : api ? "preloaded, not traced" : "without the preload");
    void *p = NULL;
    check_block(malloc(7001), 7001, "malloc");
    check_block(calloc(7, 1001), 7007, "calloc");
    check_block(realloc(malloc(10), 7002), 7002, "realloc");
    CHECK_EQ(posix_memalign(&p, 64, 7003), 0);
    check_block(p, 7003, "posix_memalign");
    check_block(aligned_alloc(128, 7004), 7004, "aligned_alloc");
    check_block(memalign(256, 7005), 7005, "memalign");
    check_block(valloc(7006), 7006, "valloc");
#ifdef __GLIBC__
    check_block(pvalloc(7007), 7007, "pvalloc");
#endif
    check_block(strdup("a string of the program's"), 26, "strdup");
    CHECK_EQ(foreign_strays(), 0); /* nothing freed that the allocator did not give */
    return check_summary();
}
