/*
 * The malloc-family functions this library exports, preloaded into beam.smp
 * (and, through the inherited LD_PRELOAD, into every program it starts).
 * Each is the C library's own function (libc.h) plus tracker calls
 * (tracker.h); no policy lives here.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "libc.h"
#include "tracker.h"
#include "unloads.h"

#define EXPORT __attribute__((visibility("default")))
#define COLD __attribute__((noinline))

/* malloc, the hottest, decides in two steps: the first inline, the rest
 * out of line, so that its common cases need no stack frame. */
static COLD void *malloc_tracked(size_t n, enum mt_verdict v) {
    if (mt_decide(v, MT_FN_MALLOC, n))
        return mt_recorded(libc_malloc(n), n);
    return libc_malloc(n);
}

EXPORT void *malloc(size_t n) {
    enum mt_verdict v = mt_verdict(MT_FN_MALLOC, n);
    if (mt_likely(v == MT_PASS))
        return libc_malloc(n);
    return malloc_tracked(n, v);
}

EXPORT void *calloc(size_t n, size_t size) {
    size_t bytes;
    if (mt_unlikely(__builtin_mul_overflow(n, size, &bytes))) {
        mt_seen(MT_FN_CALLOC);
        return libc_calloc(n, size); /* fails in libc, as it should */
    }
    if (mt_will_record(MT_FN_CALLOC, bytes))
        return mt_recorded(libc_calloc(n, size), bytes);
    return libc_calloc(n, size);
}

/* free likewise: the common cases end in a tail call to libc. */
static COLD void free_tracked(void *p, int verdict) {
    /* libc's free reads the block's header first, most often a cache miss:
     * started now, it overlaps the table's own miss instead of following it. */
    __builtin_prefetch((const void *)((uintptr_t)p - sizeof(size_t)), 1); /* p may be NULL */
    if (mt_likely(verdict == 2))
        mt_forget_counted(p);
    else if (mt_free_slow(p))
        return; /* a signal handler's, freed once its thread leaves the tracker */
    libc_free(p);
}

EXPORT void free(void *p) {
    int verdict = mt_free_verdict(p);
    if (mt_likely(verdict == 0))
        libc_free(p);
    else
        free_tracked(p, verdict);
}

EXPORT void *realloc(void *p, size_t n) {
    struct mt_realloc r;
    mt_realloc_begin(&r, p, n, MT_FN_REALLOC);
    return mt_realloc_end(&r, libc_realloc(p, n), n);
}

EXPORT void *reallocarray(void *p, size_t n, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        mt_seen(MT_FN_REALLOCARRAY);
        errno = ENOMEM; /* as glibc and musl: p is left untouched */
        return NULL;
    }
    struct mt_realloc r;
    mt_realloc_begin(&r, p, bytes, MT_FN_REALLOCARRAY);
    return mt_realloc_end(&r, libc_realloc(p, bytes), bytes);
}

EXPORT int posix_memalign(void **memptr, size_t al, size_t n) {
    int record = mt_will_record(MT_FN_POSIX_MEMALIGN, n);
    int r = libc_posix_memalign(memptr, al, n);
    if (record && r == 0)
        mt_record_now(*memptr, n);
    return r;
}

EXPORT void *aligned_alloc(size_t al, size_t n) {
    if (mt_will_record(MT_FN_ALIGNED_ALLOC, n))
        return mt_recorded(libc_aligned_alloc(al, n), n);
    return libc_aligned_alloc(al, n);
}

EXPORT void *memalign(size_t al, size_t n) {
    if (mt_will_record(MT_FN_MEMALIGN, n))
        return mt_recorded(libc_memalign(al, n), n);
    return libc_memalign(al, n);
}

EXPORT void *valloc(size_t n) {
    if (mt_will_record(MT_FN_VALLOC, n))
        return mt_recorded(libc_valloc(n), n);
    return libc_valloc(n);
}

#ifdef MT_LIBC_HAS_PVALLOC /* not every C library has it */
EXPORT void *pvalloc(size_t n) {
    if (mt_will_record(MT_FN_PVALLOC, n))
        return mt_recorded(libc_pvalloc(n), n);
    return libc_pvalloc(n);
}
#endif

/* strdup/strndup are hooked so that frame 0 is their caller and the
 * counters match the seed's; glibc's would call malloc from inside libc. */
static char *dup_bytes(const char *s, size_t len, enum mtrace_fn fn) {
    int record = mt_will_record(fn, len + 1);
    char *p = libc_malloc(len + 1);
    if (!p)
        return NULL;
    memcpy(p, s, len);
    p[len] = 0;
    return record ? mt_recorded(p, len + 1) : p;
}

EXPORT char *strdup(const char *s) { return dup_bytes(s, strlen(s), MT_FN_STRDUP); }

EXPORT char *strndup(const char *s, size_t n) { return dup_bytes(s, strnlen(s, n), MT_FN_STRNDUP); }

/* Unloaded code takes its unwind rules with it: the walker must not apply
 * them to whatever is mapped at those addresses next; and the stacks walked
 * through it must not be named after that either (unloads.h). */
EXPORT int dlclose(void *handle) {
    if (!mt_libc.dlclose) {
        unsigned char was = mt_tracker_call_out(); /* dlsym may allocate */
        mt_libc_resolve();
        mt_tracker_call_back(was);
    }
    /* (in a program the tracker does not track, no stack names anything) */
    int r = !mt_libc.dlclose      ? -1
            : mt_tracker_active() ? mt_unloads_dlclose(mt_libc.dlclose, handle)
                                  : mt_libc.dlclose(handle);
    mt_tracker_code_unloaded();
    return r;
}
