/* Code unloaded by dlclose (see unloads.h). */
#define _GNU_SOURCE
#include "unloads.h"

#include <errno.h>
#include <link.h>
#include <stdatomic.h>
#include <sys/mman.h>

#include "objects.h"

#define SLOTS 4096       /* ranges kept: older ones are forgotten */
#define MAX_OBJECTS 8192 /* objects one dlclose's snapshot holds */

struct range {
    uintptr_t lo, hi;
    _Atomic uint32_t epoch; /* the epoch it was unloaded in; 0 while written */
};
static struct range ranges[SLOTS];

/* The epoch (high half) and the ranges ever logged (low half), moved
 * together: a range logged later never has an earlier epoch, so a reader
 * going back from the newest can stop at the first one old enough. */
static _Atomic uint64_t state;

/* dlcloses under way, and done (their unloads logged): see
 * mt_unloads_generation. */
static _Atomic uint32_t closing;
static _Atomic uint64_t closed;

uint32_t mt_unloads_epoch(void) {
    return (uint32_t)(atomic_load_explicit(&state, memory_order_acquire) >> 32);
}

/* The span of an object's executable segments, [lo, hi); lo == hi if none. */
static void code_span(const struct mtrace_object *o, uintptr_t *lo, uintptr_t *hi) {
    const ElfW(Phdr) *ph = o->phdr;
    *lo = UINTPTR_MAX, *hi = 0;
    for (uint32_t i = 0; i < o->phnum; i++)
        if (ph[i].p_type == PT_LOAD && (ph[i].p_flags & PF_X)) {
            uintptr_t a = o->base + ph[i].p_vaddr, z = a + ph[i].p_memsz;
            *lo = a < *lo ? a : *lo;
            *hi = z > *hi ? z : *hi;
        }
    if (*lo >= *hi)
        *lo = *hi = 0;
}

/* The executable spans of the objects loaded before a dlclose, sorted by
 * their start, in memory mapped for the call (a dlclose may come from any
 * thread, on any stack); and the loader's count of loads and unloads. */
struct before {
    uintptr_t (*spans)[2];
    size_t n, max;
    int truncated;       /* more objects than max */
    uint64_t generation; /* the loader's count (objects.h) */
};

static int note_one(void *ctx, const struct mtrace_object *o) {
    struct before *b = ctx;
    uintptr_t lo, hi;
    code_span(o, &lo, &hi);
    b->generation = o->generation;
    if (o->index == 0 || lo == hi) /* the program is never unloaded */
        return 0;
    if (b->n == b->max) {
        b->truncated = 1;
        return 0;
    }
    b->spans[b->n][0] = lo;
    b->spans[b->n][1] = hi;
    b->n++;
    return 0;
}

/* Shell sort by start, in place: no allocation, and no quadratic pass for
 * a process of thousands of objects under the loader's lock. */
static void sort_spans(uintptr_t (*s)[2], size_t n) {
    static const size_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t g = 0; g < sizeof gaps / sizeof *gaps; g++)
        for (size_t i = gaps[g]; i < n; i++) {
            uintptr_t lo = s[i][0], hi = s[i][1];
            size_t j = i;
            for (; j >= gaps[g] && s[j - gaps[g]][0] > lo; j -= gaps[g]) {
                s[j][0] = s[j - gaps[g]][0];
                s[j][1] = s[j - gaps[g]][1];
            }
            s[j][0] = lo;
            s[j][1] = hi;
        }
}

static void note_before(struct before *b) {
    *b = (struct before){.max = MAX_OBJECTS};
    void *m = mmap(NULL, MAX_OBJECTS * sizeof *b->spans, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    b->spans = m == MAP_FAILED ? NULL : m;
    if (!b->spans) {
        b->generation = mt_objects_generation();
        return;
    }
    mt_objects_each(note_one, b);
    sort_spans(b->spans, b->n);
}

struct after {
    struct before *b;
    uint64_t generation;
};

/* Crosses off the spans of the objects still loaded (spans[i][1] = 0). */
static int still_there(void *ctx, const struct mtrace_object *o) {
    struct after *a = ctx;
    struct before *b = a->b;
    uintptr_t lo, hi;
    code_span(o, &lo, &hi);
    a->generation = o->generation;
    size_t first = 0, past = b->n;
    while (first < past) { /* the first span starting at lo or after */
        size_t mid = first + (past - first) / 2;
        if (b->spans[mid][0] < lo)
            first = mid + 1;
        else
            past = mid;
    }
    for (size_t i = first; i < b->n && b->spans[i][0] == lo; i++)
        if (b->spans[i][1] == hi)
            b->spans[i][1] = 0;
    return 0;
}

/* Logs n spans (those of spans whose end is not 0) under a new epoch. */
static void log_spans(uintptr_t (*spans)[2], size_t n, uint32_t gone) {
    uint64_t was = atomic_fetch_add(&state, (1ull << 32) + gone);
    uint32_t epoch = (uint32_t)(was >> 32) + 1, at = (uint32_t)was;
    for (size_t i = 0; i < n; i++) {
        if (!spans[i][1])
            continue;
        struct range *r = &ranges[at++ % SLOTS];
        atomic_store_explicit(&r->epoch, 0, memory_order_relaxed);
        atomic_thread_fence(memory_order_release);
        r->lo = spans[i][0];
        r->hi = spans[i][1];
        atomic_store_explicit(&r->epoch, epoch, memory_order_release);
    }
}

static void note_after(struct before *b) {
    if (!b->spans) { /* no snapshot: what went is not known, so all of it */
        if (mt_objects_generation() != b->generation) {
            uintptr_t all[1][2] = {{0, UINTPTR_MAX}};
            log_spans(all, 1, 1);
        }
        return;
    }
    struct after a = {b, b->generation};
    mt_objects_each(still_there, &a);
    uint32_t gone = 0;
    for (size_t i = 0; i < b->n; i++)
        gone += b->spans[i][1] != 0;
    if (b->truncated && a.generation != b->generation) { /* perhaps one not listed */
        b->spans[0][0] = 0;
        b->spans[0][1] = UINTPTR_MAX;
        gone = 1;
        b->n = 1;
    }
    if (gone)
        log_spans(b->spans, b->n, gone);
    munmap(b->spans, MAX_OBJECTS * sizeof *b->spans);
}

int mt_unloads_dlclose(int (*real)(void *), void *handle) {
    /* A fork child may not ask the loader's list (objects.c): another
     * thread of the parent may have held its lock at the fork, and glibc's
     * own dlclose takes it only if something is unloaded. */
    if (mt_objects_forked())
        return real(handle);
    struct before b;
    int saved = errno;
    atomic_fetch_add(&closing, 1);
    note_before(&b);
    errno = saved;
    int r = real(handle);
    saved = errno;
    note_after(&b);
    /* (one that unmapped nothing, a reference dropped, leaves it as it was) */
    if (mt_objects_generation() != b.generation)
        atomic_fetch_add(&closed, 1);
    atomic_fetch_sub(&closing, 1);
    errno = saved;
    return r;
}

/* Read in this order, a dlclose under way shows as odd or as a later
 * count: one begun after `closing` was read is counted in `closed` by
 * the time a later call reads it, or is still under way then. */
uint64_t mt_unloads_generation(void) {
    uint32_t busy = atomic_load(&closing);
    uint64_t done = atomic_load(&closed);
    return (mt_objects_generation() + done) << 1 | (busy != 0);
}

/* The code of the objects that are never unloaded: the program itself and
 * the C library (which this library needs as long as it is loaded), noted
 * by the constructor.  An address there was never unloaded, whatever the
 * log has forgotten or taken as unloaded for want of a snapshot.  (Other
 * libraries loaded with the program are not unloaded by glibc either, but
 * one that a constructor dlopened looks the same from here.) */
#define PERMANENT_MAX 2
static uintptr_t permanent[PERMANENT_MAX][2];
static _Atomic size_t n_permanent;

static int note_permanent(void *ctx, const struct mtrace_object *o) {
    size_t *n = ctx;
    uintptr_t lo, hi, libc = (uintptr_t)&dl_iterate_phdr;
    code_span(o, &lo, &hi);
    if (lo < hi && *n < PERMANENT_MAX && (o->index == 0 || (libc >= lo && libc < hi))) {
        permanent[*n][0] = lo;
        permanent[*n][1] = hi;
        ++*n;
    }
    return 0;
}

void mt_unloads_started(void) {
    if (atomic_load_explicit(&n_permanent, memory_order_relaxed))
        return;
    size_t n = 0;
    mt_objects_each(note_permanent, &n);
    atomic_store_explicit(&n_permanent, n, memory_order_release);
}

static int permanent_code(uintptr_t addr) {
    size_t n = atomic_load_explicit(&n_permanent, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (addr >= permanent[i][0] && addr < permanent[i][1])
            return 1;
    return 0;
}

int mt_unloaded_since(uint32_t epoch, uintptr_t addr) {
    uint64_t s = atomic_load_explicit(&state, memory_order_acquire);
    if ((uint32_t)(s >> 32) <= epoch || permanent_code(addr))
        return 0; /* nothing unloaded since, or never unloaded */
    uint32_t n = (uint32_t)s, oldest = n > SLOTS ? n - SLOTS : 0;
    for (uint32_t i = n; i-- > oldest;) {
        const struct range *r = &ranges[i % SLOTS];
        uint32_t e = atomic_load_explicit(&r->epoch, memory_order_acquire);
        if (!e)
            continue; /* being logged */
        if (e <= epoch)
            return 0; /* every range logged since was looked at */
        if (addr >= r->lo && addr < r->hi)
            return 1;
    }
    return oldest > 0; /* the log no longer reaches back to epoch */
}
