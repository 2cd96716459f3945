/* A stand-in for an allocator a program links dynamically (libjemalloc,
 * libtcmalloc): it defines the malloc family, serves every block from a
 * static pool of its own and counts frees of blocks it never gave out
 * (test_interpose_foreign.c). */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define POOL (64u << 20)
static _Alignas(4096) unsigned char pool[POOL];
static size_t used;
static unsigned long frees, strays;
#define HEADER 16 /* the block's size, before it */

int foreign_owns(const void *p) { return (const unsigned char *)p - pool < (ptrdiff_t)POOL; }
unsigned long foreign_frees(void) { return __atomic_load_n(&frees, __ATOMIC_RELAXED); }
unsigned long foreign_strays(void) { return __atomic_load_n(&strays, __ATOMIC_RELAXED); }

static void *take(size_t al, size_t n) {
    if (al < HEADER)
        al = HEADER;
    if (al & (al - 1) || n > POOL) {
        errno = al & (al - 1) ? EINVAL : ENOMEM;
        return NULL;
    }
    size_t at, next, was = __atomic_load_n(&used, __ATOMIC_RELAXED);
    do {
        at = (was + HEADER + al - 1) & ~(al - 1);
        next = at + n;
        if (next > POOL) {
            errno = ENOMEM;
            return NULL;
        }
    } while (
        !__atomic_compare_exchange_n(&used, &was, next, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    memcpy(pool + at - sizeof n, &n, sizeof n);
    return pool + at;
}

size_t malloc_usable_size(void *p) {
    size_t n = 0;
    if (p && foreign_owns(p))
        memcpy(&n, (unsigned char *)p - sizeof n, sizeof n);
    return n;
}

void free(void *p) {
    if (!p)
        return;
    __atomic_fetch_add(foreign_owns(p) ? &frees : &strays, 1, __ATOMIC_RELAXED);
}

void *malloc(size_t n) { return take(HEADER, n); }
void *memalign(size_t al, size_t n) { return take(al, n); }
void *aligned_alloc(size_t al, size_t n) { return take(al, n); }
void *valloc(size_t n) { return take(4096, n); }
void *pvalloc(size_t n) { return take(4096, (n + 4095) & ~(size_t)4095); }

void *calloc(size_t a, size_t b) {
    size_t n;
    if (__builtin_mul_overflow(a, b, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return take(HEADER, n); /* the pool is never reused: still zero */
}

void *realloc(void *p, size_t n) {
    void *q = take(HEADER, n);
    if (q && p) {
        size_t had = malloc_usable_size(p);
        memcpy(q, p, had < n ? had : n);
        free(p);
    }
    return q;
}

int posix_memalign(void **out, size_t al, size_t n) {
    if (al < sizeof(void *) || al & (al - 1))
        return EINVAL;
    void *p = take(al, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
