/* The C library's own allocator (see libc.h). */
#define _GNU_SOURCE
#include "libc.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>

struct mt_libc mt_libc;

/* What name reaches without this library: the first definition in the
 * global scope, unless that is this library's own (most programs), then
 * the next after it.  A program that defines the malloc family itself
 * comes before this library (chromium's does, with __libc_malloc & co.
 * too); one that links another allocator's library puts it after.
 *
 * What the global scope gives is a definition only where a symbol is
 * defined: a program built without -fPIE that takes the address of a
 * function it only calls (Debian's node) gives the address of its PLT
 * stub, which leads back here.  glibc's dladdr1 gives the symbol to tell;
 * musl has no such call, and there only the next definition is taken (a
 * program's own allocator is not seen: README, Limitations). */
#if defined(__GLIBC__) && (defined(__x86_64__) || defined(__aarch64__))
/* The version a program's references to the malloc family carry.  They
 * bind to the first object that defines the name either without a version
 * or with that one, even where that version is hidden from plain lookups,
 * as in glibc's own libc_malloc_debug.so.0 (MALLOC_CHECK_, mcheck, mtrace()).
 * dlsym finds the first of the former only, dlvsym the first of the latter
 * only: the one found earlier in the loader's order is the program's. */
#if defined(__x86_64__)
#define LIBC_BASE_VERSION "GLIBC_2.2.5"
#define LIBC_ALIGNED_VERSION "GLIBC_2.16"
#else
#define LIBC_BASE_VERSION "GLIBC_2.17"
#define LIBC_ALIGNED_VERSION "GLIBC_2.17"
#endif

struct places {
    uintptr_t a, b;
    int index, of_a, of_b; /* the place in the loader's list of the objects holding a and b */
};

static int place_of(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct places *p = arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type != PT_LOAD)
            continue;
        if (p->a >= lo && p->a < hi)
            p->of_a = p->index;
        if (p->b >= lo && p->b < hi)
            p->of_b = p->index;
    }
    p->index++;
    return p->of_a >= 0 && p->of_b >= 0;
}

/* Whether the object defining a comes before the one defining b in the
 * loader's list (the program, what was preloaded, the rest).  Not dladdr,
 * whose symbol search costs a process's start thousands of instructions a
 * call. */
static int loaded_before(void *a, void *b) {
    struct places p = {(uintptr_t)a, (uintptr_t)b, 0, -1, -1};
    dl_iterate_phdr(place_of, &p);
    return p.of_a >= 0 && p.of_b >= 0 && p.of_a < p.of_b;
}
#endif

/* name's definition in where's scope, as the program's reference finds it. */
static void *lookup(void *where, const char *name) {
    void *f = dlsym(where, name);
#if defined(LIBC_BASE_VERSION)
    const char *version =
        __builtin_strcmp(name, "aligned_alloc") == 0 ? LIBC_ALIGNED_VERSION : LIBC_BASE_VERSION;
    void *v = dlvsym(where, name, version);
    if (v && (!f || loaded_before(v, f)))
        return v;
#endif
    return f;
}

static void *reached(const char *name) {
#if defined(__GLIBC__)
    Dl_info at;
    const ElfW(Sym) *sym = NULL;
    if (!dladdr((const void *)reached, &at))
        return lookup(RTLD_NEXT, name); /* this library unknown: never itself */
    const void *self = at.dli_fbase;
    void *f = lookup(RTLD_DEFAULT, name);
    if (f && dladdr1(f, &at, (void **)&sym, RTLD_DL_SYMENT) && sym && sym->st_shndx != SHN_UNDEF &&
        at.dli_fbase != self && at.dli_saddr == f)
        return f;
#endif
    return lookup(RTLD_NEXT, name);
}

#if defined(__GLIBC__)

static int posix_memalign_early(void **memptr, size_t al, size_t n) {
    if (al % sizeof(void *) != 0 || al == 0 || (al & (al - 1)) != 0)
        return EINVAL;
    void *p = __libc_memalign(al, n);
    if (!p)
        return ENOMEM;
    *memptr = p;
    return 0;
}

struct mt_libc_real mt_libc_real = {
    __libc_malloc, __libc_calloc,  __libc_realloc,       __libc_free,     __libc_memalign,
    __libc_valloc, __libc_pvalloc, posix_memalign_early, __libc_memalign,
};

/* Into slot where found (glibc defines them all, so it always is, and
 * dlsym allocates nothing to answer). */
#define REACHED(slot, name)                                                                        \
    do {                                                                                           \
        void *f = reached(name);                                                                   \
        if (f)                                                                                     \
            __builtin_memcpy(&(slot), &f, sizeof f);                                               \
    } while (0)

void mt_libc_resolve(void) {
    static int done;
    if (!done) {
        done = 1;
        REACHED(mt_libc_real.malloc, "malloc");
        REACHED(mt_libc_real.calloc, "calloc");
        REACHED(mt_libc_real.realloc, "realloc");
        REACHED(mt_libc_real.free, "free");
        REACHED(mt_libc_real.memalign, "memalign");
        REACHED(mt_libc_real.valloc, "valloc");
        REACHED(mt_libc_real.pvalloc, "pvalloc");
        REACHED(mt_libc_real.posix_memalign, "posix_memalign");
        REACHED(mt_libc_real.aligned_alloc, "aligned_alloc");
    }
    if (!mt_libc.dlclose)
        mt_libc.dlclose = dlsym(RTLD_NEXT, "dlclose");
}

#else /* musl */

#include <malloc.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* ---- the bootstrap arena ------------------------------------------------- */

/* Blocks are 16-aligned (or more, for aligned_alloc) with their size in the
 * word before them; they are never reused. */
__attribute__((aligned(4096))) char mt_libc_arena[MT_LIBC_ARENA_BYTES];
static _Atomic size_t arena_used;
#define ARENA_HEADER 16

static void *arena_alloc(size_t al, size_t n) {
    if (al < ARENA_HEADER)
        al = ARENA_HEADER;
    if (n > MT_LIBC_ARENA_BYTES || al > MT_LIBC_ARENA_BYTES)
        goto full;
    size_t used = atomic_load_explicit(&arena_used, memory_order_relaxed), start;
    do {
        start = (used + ARENA_HEADER + al - 1) & ~(al - 1);
        if (start + n > MT_LIBC_ARENA_BYTES)
            goto full;
    } while (!atomic_compare_exchange_weak(&arena_used, &used, start + n));
    memcpy(mt_libc_arena + start - sizeof n, &n, sizeof n);
    return mt_libc_arena + start;
full:
    errno = ENOMEM;
    return NULL;
}

static size_t arena_size(const void *p) {
    size_t n;
    memcpy(&n, (const char *)p - sizeof n, sizeof n);
    return n;
}

/* ---- before musl's functions are found ----------------------------------- */

static void *first_malloc(size_t n);
static void *first_realloc(void *p, size_t n);
static void first_free(void *p);
static void *first_aligned_alloc(size_t al, size_t n);
static size_t first_usable_size(void *p);

struct mt_libc_real mt_libc_real = {first_malloc, first_realloc, first_free, first_aligned_alloc,
                                    first_usable_size};

/* Set while this thread is in dlsym: whatever it allocates meanwhile comes
 * from the arena (musl's dlsym allocates nothing, but another libc might). */
static __thread int resolving __attribute__((tls_model("initial-exec")));

/* reached() finds the next definition of each name after this library:
 * musl's, or another allocator's.  All or none are taken: a block must go
 * back to the allocator it came from. */
static void find_real(void) {
    if (resolving || MT_LIBC_REAL(malloc) != first_malloc)
        return;
    resolving = 1;
    void *m = reached("malloc"), *r = reached("realloc");
    void *f = reached("free"), *a = reached("aligned_alloc");
    void *u = reached("malloc_usable_size");
    if (m && r && f && a && u) {
        __atomic_store_n(&mt_libc_real.usable_size, (size_t(*)(void *))u, __ATOMIC_RELEASE);
        __atomic_store_n(&mt_libc_real.free, (void (*)(void *))f, __ATOMIC_RELEASE);
        __atomic_store_n(&mt_libc_real.realloc, (void *(*)(void *, size_t))r, __ATOMIC_RELEASE);
        __atomic_store_n(&mt_libc_real.aligned_alloc, (void *(*)(size_t, size_t))a,
                         __ATOMIC_RELEASE);
        __atomic_store_n(&mt_libc_real.malloc, (void *(*)(size_t))m, __ATOMIC_RELEASE);
    }
    resolving = 0;
}

void mt_libc_resolve(void) {
    find_real();
    mt_libc.dlclose = dlsym(RTLD_NEXT, "dlclose");
}

static void *first_malloc(size_t n) {
    find_real();
    void *(*f)(size_t) = MT_LIBC_REAL(malloc);
    return f != first_malloc ? f(n) : arena_alloc(ARENA_HEADER, n);
}

static void *first_aligned_alloc(size_t al, size_t n) {
    find_real();
    void *(*f)(size_t, size_t) = MT_LIBC_REAL(aligned_alloc);
    if (f != first_aligned_alloc)
        return f(al, n);
    if ((al & -al) != al) { /* musl's check: not a power of two (0 is allowed) */
        errno = EINVAL;
        return NULL;
    }
    return arena_alloc(al, n);
}

static void *first_realloc(void *p, size_t n) {
    find_real();
    void *(*f)(void *, size_t) = MT_LIBC_REAL(realloc);
    if (f != first_realloc)
        return f(p, n);
    if (!p)
        return libc_malloc(n);
    errno = ENOMEM; /* a block of musl's while its realloc is unknown: cannot be */
    return NULL;
}

static void first_free(void *p) {
    find_real();
    void (*f)(void *) = MT_LIBC_REAL(free);
    if (f != first_free)
        f(p);
}

static size_t first_usable_size(void *p) {
    find_real();
    size_t (*f)(void *) = MT_LIBC_REAL(usable_size);
    return f != first_usable_size ? f(p) : 0;
}

/* realloc of an arena block: moved to a new block, the old one left as is. */
void *mt_libc_realloc_arena(void *p, size_t n) {
    if (n > PTRDIFF_MAX) {
        errno = ENOMEM;
        return NULL;
    }
    void *q = libc_malloc(n);
    if (q) {
        size_t had = arena_size(p);
        memcpy(q, p, had < n ? had : n);
    }
    return q;
}

/* musl's malloc_usable_size knows nothing of the arena. */
__attribute__((visibility("default"))) size_t malloc_usable_size(void *p) {
    if (mt_libc_in_arena(p))
        return arena_size(p);
    return MT_LIBC_REAL(usable_size)(p);
}

/* ---- what musl builds on malloc and aligned_alloc ------------------------ */

/* A page is zeroed only if it is not already zero, as musl's calloc does
 * when malloc is replaced: untouched pages of a fresh mapping stay unbacked. */
static int page_is_zero(const unsigned char *page, size_t bytes) {
    typedef uint64_t __attribute__((may_alias)) word;
    const word *w = (const word *)page;
    word any = 0;
    for (size_t i = 0; i < bytes / sizeof(word); i++)
        any |= w[i];
    return any == 0;
}

static void clear(unsigned char *p, size_t n) {
    const size_t page = 4096;
    unsigned char *end = p + n;
    unsigned char *q = (unsigned char *)(((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1));
    if (n < page || q >= end) {
        memset(p, 0, n);
        return;
    }
    memset(p, 0, (size_t)(q - p));
    for (; (size_t)(end - q) >= page; q += page)
        if (!page_is_zero(q, page))
            memset(q, 0, page);
    memset(q, 0, (size_t)(end - q));
}

void *libc_calloc(size_t n, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    unsigned char *p = libc_malloc(bytes);
    if (p)
        clear(p, bytes);
    return p;
}

void *libc_valloc(size_t n) { return libc_aligned_alloc((size_t)sysconf(_SC_PAGESIZE), n); }

int libc_posix_memalign(void **memptr, size_t al, size_t n) {
    if (al < sizeof(void *))
        return EINVAL;
    void *p = libc_aligned_alloc(al, n);
    if (!p)
        return errno;
    *memptr = p;
    return 0;
}

#endif
