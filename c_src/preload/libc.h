/*
 * The C library's own allocator, which every hook forwards to: the one place
 * that knows how to reach it.  glibc exports its implementations as
 * __libc_malloc & co., callable before any constructor runs (no dlsym
 * bootstrap, no allocation to find them).  posix_memalign, aligned_alloc
 * and dlclose have no such aliases; they are looked up with dlsym once the
 * library is loaded (mt_libc_resolve), with fallbacks for earlier calls.
 */
#ifndef MT_LIBC_H
#define MT_LIBC_H

#include <stddef.h>
#include <stdlib.h> /* defines __GLIBC__ on glibc */

#ifndef __GLIBC__
#error "mtrace's interposer supports glibc (x86-64 and aarch64 Linux)"
#endif

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#define libc_malloc __libc_malloc
#define libc_calloc __libc_calloc
#define libc_realloc __libc_realloc
#define libc_free __libc_free
#define libc_memalign __libc_memalign
#define libc_valloc __libc_valloc
#define libc_pvalloc __libc_pvalloc

/* The functions found with dlsym (NULL until mt_libc_resolve). */
struct mt_libc {
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
    int (*dlclose)(void *);
};
extern struct mt_libc mt_libc;

/* Fills mt_libc.  dlsym may allocate: the caller keeps its thread out of the
 * table meanwhile. */
void mt_libc_resolve(void);

/* posix_memalign for calls made before mt_libc_resolve: glibc's checks,
 * then its memalign. */
int mt_libc_posix_memalign_early(void **memptr, size_t alignment, size_t size);

#endif
