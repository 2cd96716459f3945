/*
 * tsan_tracker's allocations: the hooks under the names it calls them by
 * (hooks.c's, renamed, in the instrumented build; the C library's, which
 * the preload interposes, in stress_preload's), and a block of any kind
 * through tsan_work.so's call chains, so that blocks have many stacks.
 * Included by tsan_tracker.c only.
 */
#ifndef MT_TEST_TSAN_ALLOC_H
#define MT_TEST_TSAN_ALLOC_H

#include <stdint.h>
#include <stdlib.h>

#ifdef PRELOADED /* the same program against the real preload (stress_preload) */
#define mtt_malloc malloc
#define mtt_calloc calloc
#define mtt_free free
#define mtt_realloc realloc
#define mtt_posix_memalign posix_memalign
#define mtt_aligned_alloc aligned_alloc
#define mtt_memalign memalign
#define mtt_strndup strndup
#define mtt_dlclose dlclose
#include <malloc.h>
#else
#include "libc.h" /* mt_libc_real: the fork child's allocator */
void *mtt_malloc(size_t n);
void *mtt_calloc(size_t n, size_t size);
void mtt_free(void *p);
void *mtt_realloc(void *p, size_t n);
int mtt_posix_memalign(void **p, size_t al, size_t n);
void *mtt_aligned_alloc(size_t al, size_t n);
void *mtt_memalign(size_t al, size_t n);
char *mtt_strndup(const char *s, size_t n);
int mtt_dlclose(void *h);
#endif

typedef void *(*work_alloc)(size_t);
void *work_a(work_alloc f, size_t n, unsigned bits, int depth); /* tsan_work.so */

/* ---- allocation through the renamed hooks ------------------------------ */

static char text[4096];
static void *w_malloc(size_t n) { return mtt_malloc(n); }
static void *w_calloc(size_t n) { return mtt_calloc(1, n); }
static void *w_realloc(size_t n) { return mtt_realloc(NULL, n); }
static void *w_posix(size_t n) {
    void *p;
    return mtt_posix_memalign(&p, 64, n) ? NULL : p;
}
static void *w_aligned(size_t n) { return mtt_aligned_alloc(64, (n + 63) & ~(size_t)63); }
static void *w_memalign(size_t n) { return mtt_memalign(32, n); }
static void *w_strndup(size_t n) {
    return mtt_strndup(text, n < sizeof text ? n : sizeof text - 1);
}
static const work_alloc kinds[] = {w_malloc,  w_calloc,   w_realloc, w_posix,
                                   w_aligned, w_memalign, w_strndup};

static void *alloc_any(unsigned *seed) {
    unsigned r = (unsigned)rand_r(seed);
    size_t n = 1 + (size_t)rand_r(seed) % 4000;
    if (r % 4096 == 0)
        n = (size_t)130 << 20; /* too large for a slot: the spill */
    work_alloc f = n > 4000 ? w_malloc : kinds[r % (sizeof kinds / sizeof *kinds)];
    return work_a(f, n, (unsigned)rand_r(seed), 1 + (int)((r >> 8) % 9));
}

#endif
