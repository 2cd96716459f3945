/*
 * The musl glue (libc.c) on its own, without the preload: built with
 * -Ddlsym=glue_dlsym, so that the lookups it makes on its first call come
 * here.  The first lookup allocates through the glue meanwhile, as another
 * C library's dlsym might: those blocks must come from the bootstrap arena,
 * and free, realloc and malloc_usable_size must know them afterwards.  Then
 * the functions the glue builds on musl's (calloc, posix_memalign, valloc)
 * keep musl's semantics.  Only for musl (make ctest-musl).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "libc.h"

#undef dlsym
void *dlsym(void *restrict handle, const char *restrict name);

static volatile size_t huge = SIZE_MAX;
static int lookups;
static unsigned char *inner, *inner_aligned, *inner_zeroed;
static int inner_bad_errno, inner_full_errno;
static void *inner_full;

void *glue_dlsym(void *handle, const char *name);
void *glue_dlsym(void *handle, const char *name) {
    (void)handle;
    if (lookups++ == 0) { /* allocations while the lookup runs */
        inner = libc_malloc(40);
        inner_aligned = libc_aligned_alloc(256, 10);
        inner_zeroed = libc_calloc(3, 10);
        errno = 0;
        CHECK(libc_aligned_alloc(24, 1) == NULL); /* not a power of two */
        inner_bad_errno = errno;
        errno = 0;
        inner_full = libc_malloc(MT_LIBC_ARENA_BYTES + 1);
        inner_full_errno = errno;
    }
    return dlsym(RTLD_NEXT, name); /* from this program: musl's */
}

static void test_bootstrap(void) {
    unsigned char *p = libc_malloc(100); /* the first call: looks the functions up */
    CHECK(p != NULL && !mt_libc_in_arena(p));
    CHECK_EQ(lookups, 5);
    CHECK(inner && mt_libc_in_arena(inner) && (uintptr_t)inner % 16 == 0);
    CHECK(inner_aligned && mt_libc_in_arena(inner_aligned) && (uintptr_t)inner_aligned % 256 == 0);
    CHECK(inner_zeroed && mt_libc_in_arena(inner_zeroed));
    CHECK_EQ(inner_bad_errno, EINVAL);
    CHECK(inner_full == NULL);
    CHECK_EQ(inner_full_errno, ENOMEM);
    if (!inner || !inner_zeroed)
        return;
    size_t zero = 0;
    for (int i = 0; i < 30; i++)
        zero += inner_zeroed[i] == 0;
    CHECK_EQ(zero, 30);
    CHECK_EQ(malloc_usable_size(inner), 40);
    CHECK_EQ(malloc_usable_size(inner_zeroed), 30);
    CHECK(malloc_usable_size(p) >= 100); /* musl's own answer */

    /* Arena blocks move out on realloc, contents kept; free leaves them be. */
    for (int i = 0; i < 40; i++)
        inner[i] = (unsigned char)(i * 7);
    errno = 0;
    CHECK(libc_realloc(inner, huge) == NULL && errno == ENOMEM);
    unsigned char *moved = libc_realloc(inner, 1000);
    CHECK(moved != NULL && !mt_libc_in_arena(moved));
    size_t same = 0;
    for (int i = 0; moved && i < 40; i++)
        same += moved[i] == (unsigned char)(i * 7);
    CHECK_EQ(same, 40);
    libc_free(inner_aligned);
    libc_free(inner_zeroed);
    libc_free(moved);
    libc_free(p);
    CHECK(libc_malloc(10) != inner); /* never reused */
}

static void test_calloc(void) {
    errno = 0;
    CHECK(libc_calloc(huge, 2) == NULL && errno == ENOMEM);
    /* Dirty memory handed out again is cleared, pages and the odd ends. */
    const size_t n = 5 * 4096 + 123;
    for (int round = 0; round < 3; round++) {
        unsigned char *d = libc_malloc(n);
        if (d)
            memset(d, 0xab, n);
        libc_free(d);
        unsigned char *c = libc_calloc(1, n);
        CHECK(c != NULL);
        size_t nonzero = 0;
        for (size_t i = 0; c && i < n; i++)
            nonzero += c[i] != 0;
        CHECK_EQ(nonzero, 0);
        libc_free(c);
    }
}

static void test_aligned(void) {
    void *sentinel = (void *)0x5eed, *p = sentinel;
    CHECK_EQ(libc_posix_memalign(&p, 4, 10), EINVAL); /* below sizeof(void *) */
    CHECK_EQ(libc_posix_memalign(&p, 24, 10), EINVAL);
    CHECK_EQ(libc_posix_memalign(&p, 64, huge - 4096), ENOMEM);
    CHECK(p == sentinel);
    CHECK_EQ(libc_posix_memalign(&p, 64, 10), 0);
    CHECK(p != sentinel && (uintptr_t)p % 64 == 0);
    libc_free(p);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *v = libc_valloc(1);
    CHECK(v != NULL && (uintptr_t)v % page == 0);
    libc_free(v);
    void *m = libc_memalign(4096, 3);
    CHECK(m != NULL && (uintptr_t)m % 4096 == 0);
    libc_free(m);
}

int main(void) {
    test_bootstrap();
    test_calloc();
    test_aligned();
    return check_summary();
}
