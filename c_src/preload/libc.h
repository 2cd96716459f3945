/*
 * The C library's own allocator, which every hook forwards to: the one place
 * that knows how to reach it.  The hooks call libc_malloc, libc_calloc,
 * libc_realloc, libc_free, libc_memalign, libc_valloc, libc_pvalloc (where
 * MT_LIBC_HAS_PVALLOC), libc_posix_memalign and libc_aligned_alloc, and
 * mt_libc.dlclose once mt_libc_resolve has run.
 *
 * glibc exports its implementations as __libc_malloc & co., callable before
 * any constructor runs (no dlsym bootstrap, no allocation to find them);
 * they serve until the process's first hook call has looked up, with
 * dlsym, what each name would reach without the preload
 * (mt_libc_resolve; see struct mt_libc_real below).  posix_memalign and
 * aligned_alloc have no such aliases: until then posix_memalign is built
 * on __libc_memalign with glibc's checks, and aligned_alloc is
 * __libc_memalign itself.
 *
 * musl (1.2) exports no such aliases: its __libc_malloc & co. are hidden.
 * It lets a preloaded library replace malloc, calloc, realloc, free,
 * memalign, posix_memalign, aligned_alloc and malloc_usable_size (the
 * symbols its libc.so leaves interposable), and its own code calls the
 * replacements: calloc, memalign, posix_memalign and valloc are built on
 * the public malloc or aligned_alloc.  So only malloc, realloc, free,
 * aligned_alloc and malloc_usable_size are taken from musl, found with
 * dlsym (which allocates nothing there); the rest are built here
 * on them exactly as musl builds them.  Until the lookup is done (the first
 * call, the constructor at the latest), and on the thread doing it, blocks
 * come from a small static arena that free, realloc and malloc_usable_size
 * recognise by address.
 */
#ifndef MT_LIBC_H
#define MT_LIBC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h> /* defines __GLIBC__ on glibc */

/* The functions found with dlsym (NULL until mt_libc_resolve). */
struct mt_libc {
    int (*dlclose)(void *);
};
extern struct mt_libc mt_libc;

/* Looks up the functions the hooks forward to and fills mt_libc; the
 * process's first hook call makes it, before its own libc call.  dlsym may
 * allocate: the caller keeps its thread out of the table meanwhile. */
void mt_libc_resolve(void);

#if defined(__GLIBC__)

#define MT_LIBC_HAS_PVALLOC 1

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

/* What each hook forwards to: the definition of its name that the program
 * would reach without the preload.  That is glibc's own, unless the
 * program defines the function itself (chromium's allocator shim) or
 * links another allocator (libjemalloc, libtcmalloc) whose definitions
 * come before glibc's: then it is that one, for every function defined
 * there, so that no block goes back to an allocator it did not come from
 * (this library's own calls too: strdup's malloc).  Until the process's
 * first hook call looks them up (mt_libc_resolve, before its libc call),
 * glibc's __libc_ functions, callable before any constructor.  Written
 * only there, by the process's first hook call, which the loader makes
 * before any other thread exists; a thread that called meanwhile would
 * not wait (tracker.c's ready()) but read each pointer whole, the old or
 * the new.  Read with plain loads, as the hooks' calls through the GOT
 * were. */
struct mt_libc_real {
    void *(*malloc)(size_t);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    void (*free)(void *);
    void *(*memalign)(size_t, size_t);
    void *(*valloc)(size_t);
    void *(*pvalloc)(size_t);
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
};
extern struct mt_libc_real mt_libc_real;

#define libc_malloc mt_libc_real.malloc
#define libc_calloc mt_libc_real.calloc
#define libc_realloc mt_libc_real.realloc
#define libc_free mt_libc_real.free
#define libc_memalign mt_libc_real.memalign
#define libc_valloc mt_libc_real.valloc
#define libc_pvalloc mt_libc_real.pvalloc
#define libc_posix_memalign mt_libc_real.posix_memalign
#define libc_aligned_alloc mt_libc_real.aligned_alloc

#elif defined(__linux__) && !defined(__BIONIC__)

/* musl: it defines no macro of its own (glibc and uClibc define __GLIBC__,
 * bionic __BIONIC__). */

/* The functions the hooks reach: musl's once found, and until then the
 * glue's own, which find them (or serve from the arena).  Each is set once,
 * as a whole pointer: a hook reads it with one load and calls it. */
struct mt_libc_real {
    void *(*malloc)(size_t);
    void *(*realloc)(void *, size_t);
    void (*free)(void *);
    void *(*aligned_alloc)(size_t, size_t);
    size_t (*usable_size)(void *);
};
extern struct mt_libc_real mt_libc_real;
#define MT_LIBC_REAL(f) __atomic_load_n(&mt_libc_real.f, __ATOMIC_ACQUIRE)

/* The bootstrap arena, whose blocks never reach musl. */
extern char mt_libc_arena[];
#define MT_LIBC_ARENA_BYTES (64u << 10)
static inline int mt_libc_in_arena(const void *p) {
    return (uintptr_t)p - (uintptr_t)mt_libc_arena < MT_LIBC_ARENA_BYTES;
}
void *mt_libc_realloc_arena(void *p, size_t n);

static inline void *libc_malloc(size_t n) { return MT_LIBC_REAL(malloc)(n); }

static inline void *libc_realloc(void *p, size_t n) {
    if (__builtin_expect(mt_libc_in_arena(p), 0))
        return mt_libc_realloc_arena(p, n);
    return MT_LIBC_REAL(realloc)(p, n);
}

static inline void libc_free(void *p) {
    if (__builtin_expect(!mt_libc_in_arena(p), 1)) /* arena blocks are never reused */
        MT_LIBC_REAL(free)(p);
}

/* musl's aligned_alloc, which its memalign is. */
static inline void *libc_aligned_alloc(size_t al, size_t n) {
    return MT_LIBC_REAL(aligned_alloc)(al, n);
}
#define libc_memalign libc_aligned_alloc

/* musl's calloc, valloc and posix_memalign, on the functions above. */
void *libc_calloc(size_t n, size_t size);
void *libc_valloc(size_t n);
int libc_posix_memalign(void **memptr, size_t al, size_t n);

#else
#error "mtrace's interposer supports glibc and musl (Linux)"
#endif

#endif
