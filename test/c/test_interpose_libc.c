/* libc semantics under the preload, compared with glibc itself.  Every case
 * runs here (preload active, tracking on) and again in a copy of this program
 * started without LD_PRELOAD: the two transcripts (NULL or not, errno, memptr
 * left alone, alignment, usable size, contents) must be identical, line for
 * line.  The preload run also checks that each block is recorded with its
 * requested size and forgotten when freed.  A few calls are made from
 * DT_PREINIT_ARRAY, which runs before any library constructor (the preload's
 * included), where the preload still uses its fallback paths. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"

#define KEPT 4321 /* not an errno value: still there means errno was left alone */

static const struct mtrace_api *api; /* NULL in the glibc run */
static char transcript[1 << 18];
static size_t tlen;

static void note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(transcript + tlen, sizeof transcript - tlen, fmt, ap);
    va_end(ap);
    if (n > 0)
        tlen = tlen + (size_t)n < sizeof transcript ? tlen + (size_t)n : sizeof transcript - 1;
}

static const char *errno_name(int e) {
    static char buf[32];
    switch (e) {
    case KEPT:
        return "kept";
    case ENOMEM:
        return "ENOMEM";
    case EINVAL:
        return "EINVAL";
    default:
        snprintf(buf, sizeof buf, "%d", e);
        return buf;
    }
}

/* Values the compiler must not see, or it warns about (or folds) the calls. */
static volatile size_t v_max = SIZE_MAX;
#define SMAX ((size_t)v_max)
#define PMAX ((size_t)v_max / 2) /* PTRDIFF_MAX */

/* The same pointer, opaque to the compiler: after a realloc that failed the
 * old block is still valid, and after one that freed it only its address is
 * compared, which gcc's use-after-free analysis cannot know. */
static void *launder(void *p) {
    __asm__ volatile("" : "+r"(p));
    return p;
}

static size_t pow2_at_least(size_t a) {
    size_t p = 1;
    while (p < a && p <= SIZE_MAX / 2)
        p <<= 1;
    return p;
}

/* --- the preload's view (only when preloaded) ----------------------------- */

static struct mtrace_alloc found_buf[8192];

/* Size recorded for p, or -1 when p is not in the table. */
static long long recorded_size(const void *p) {
    size_t n = api->olds(found_buf, sizeof found_buf / sizeof *found_buf, NULL);
    for (size_t i = 0; i < n; i++)
        if (found_buf[i].addr == (uintptr_t)p)
            return (long long)found_buf[i].size;
    return -1;
}

static void expect_recorded(const char *what, const void *p, size_t size) {
    if (!api || !p)
        return;
    long long got = recorded_size(p);
    CHECK_EQ(got, (long long)size);
    if (got != (long long)size)
        fprintf(stderr, "  after %s\n", what);
}

static void expect_forgotten(const char *what, const void *p) {
    if (!api || !p)
        return;
    long long got = recorded_size(p);
    CHECK_EQ(got, -1);
    if (got != -1)
        fprintf(stderr, "  after %s\n", what);
}

/* --- outcomes ------------------------------------------------------------- */

/* One line for a call that returned a pointer; n is the size asked for,
 * al the alignment promised (1 = none beyond malloc's). */
static void outcome(const char *call, void *p, int err, size_t n, size_t al) {
    if (!p) {
        note("%-44s NULL errno=%s\n", call, errno_name(err));
        return;
    }
    size_t usable = malloc_usable_size(p);
    note("%-44s ptr errno=%s aligned=%d usable>=n=%d\n", call, errno_name(err),
         (uintptr_t)p % pow2_at_least(al) == 0 && (uintptr_t)p % 16 == 0, usable >= n);
}

/* Frees p (errno must survive that too) and checks the table forgot it. */
static void release(const char *call, void *p) {
    errno = KEPT;
    free(p);
    int err = errno;
    if (err != KEPT)
        note("%-44s free changed errno to %s\n", call, errno_name(err));
    expect_forgotten(call, p);
}

static void *try_malloc(const char *call, size_t n) {
    errno = KEPT;
    void *p = malloc(n);
    outcome(call, p, errno, n, 1);
    expect_recorded(call, p, n);
    return p;
}

static void check_zero(const char *call, const unsigned char *p, size_t n) {
    size_t nonzero = 0;
    for (size_t i = 0; p && i < n; i++)
        nonzero += p[i] != 0;
    note("%-44s nonzero bytes=%zu\n", call, nonzero);
}

static void *try_calloc(const char *call, size_t n, size_t size) {
    errno = KEPT;
    void *p = calloc(n, size);
    outcome(call, p, errno, p ? n * size : 0, 1);
    if (p) {
        expect_recorded(call, p, n * size);
        check_zero(call, p, n * size);
    }
    return p;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31 + seed);
}

static void check_fill(const char *call, const unsigned char *p, size_t n, unsigned seed) {
    size_t bad = 0;
    for (size_t i = 0; p && i < n; i++)
        bad += p[i] != (unsigned char)(i * 31 + seed);
    note("%-44s changed bytes=%zu\n", call, bad);
}

/* --- the cases ------------------------------------------------------------ */

static void cases_free(void) {
    errno = KEPT;
    free(NULL);
    note("%-44s errno=%s\n", "free(NULL)", errno_name(errno));
    release("free(malloc(100))", try_malloc("malloc(100)", 100));
    release("free(malloc(1 MiB))", try_malloc("malloc(1 MiB)", 1 << 20));
    errno = KEPT;
    size_t u = malloc_usable_size(NULL);
    note("%-44s %zu errno=%s\n", "malloc_usable_size(NULL)", u, errno_name(errno));
}

static void cases_malloc(void) {
    static const struct {
        const char *name;
        int kind; /* 0: literal, 1: SIZE_MAX - v, 2: PTRDIFF_MAX + v */
        size_t v;
    } sizes[] = {
        {"malloc(0)", 0, 0},
        {"malloc(1)", 0, 1},
        {"malloc(24)", 0, 24},
        {"malloc(4096)", 0, 4096},
        {"malloc(128 KiB + 1)", 0, (128 << 10) + 1},
        {"malloc(SIZE_MAX)", 1, 0},
        {"malloc(SIZE_MAX - 4096)", 1, 4096},
        {"malloc(SIZE_MAX - 64 KiB)", 1, 65536},
        {"malloc(PTRDIFF_MAX)", 2, 0},
        {"malloc(PTRDIFF_MAX + 1)", 2, 1},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i].kind == 0   ? sizes[i].v
                   : sizes[i].kind == 1 ? SMAX - sizes[i].v
                                        : PMAX + sizes[i].v;
        release(sizes[i].name, try_malloc(sizes[i].name, n));
    }
}

static void cases_calloc(void) {
    release("calloc(0, 0)", try_calloc("calloc(0, 0)", 0, 0));
    release("calloc(0, 5)", try_calloc("calloc(0, 5)", 0, 5));
    release("calloc(5, 0)", try_calloc("calloc(5, 0)", 5, 0));
    release("calloc(3, 100)", try_calloc("calloc(3, 100)", 3, 100));
    release("calloc(1, 1 MiB)", try_calloc("calloc(1, 1 MiB)", 1, 1 << 20));
    release("calloc(SIZE_MAX, 2)", try_calloc("calloc(SIZE_MAX, 2)", SMAX, 2));
    release("calloc(2, SIZE_MAX)", try_calloc("calloc(2, SIZE_MAX)", 2, SMAX));
    release("calloc(2^32, 2^32)",
            try_calloc("calloc(2^32, 2^32)", (size_t)1 << 32, (size_t)1 << 32));
    release("calloc(SIZE_MAX/2 + 1, 2)", try_calloc("calloc(SIZE_MAX/2 + 1, 2)", PMAX + 1, 2));
    release("calloc(1, SIZE_MAX)", try_calloc("calloc(1, SIZE_MAX)", 1, SMAX));
    release("calloc(PTRDIFF_MAX/2 + 1, 2)",
            try_calloc("calloc(PTRDIFF_MAX/2 + 1, 2)", PMAX / 2 + 1, 2));
    /* A reused chunk comes back zeroed. */
    unsigned char *p = malloc(200);
    if (p)
        memset(p, 0xab, 200);
    free(p);
    release("calloc(1, 200) after a dirty free",
            try_calloc("calloc(1, 200) after a dirty free", 1, 200));
}

static void *try_realloc(const char *call, void *p, size_t n) {
    errno = KEPT;
    void *q = realloc(launder(p), n);
    outcome(call, q, errno, n, 1);
    return q;
}

static void cases_realloc(void) {
    void *p = try_realloc("realloc(NULL, 0)", NULL, 0);
    expect_recorded("realloc(NULL, 0)", p, 0);
    release("realloc(NULL, 0)", p);

    unsigned char *q = try_realloc("realloc(NULL, 100)", NULL, 100);
    expect_recorded("realloc(NULL, 100)", q, 100);
    if (!q)
        return;
    fill(q, 100, 1);
    void *was = q;
    q = try_realloc("realloc(p, 5000) grow", q, 5000);
    check_fill("realloc(p, 5000) grow", q, 100, 1);
    if (q != was)
        expect_forgotten("realloc grow (moved)", was);
    expect_recorded("realloc(p, 5000) grow", q, 5000);
    if (!q)
        return;
    fill(q, 5000, 2);
    q = try_realloc("realloc(p, 10) shrink", q, 10);
    check_fill("realloc(p, 10) shrink", q, 10, 2);
    expect_recorded("realloc(p, 10) shrink", q, 10);
    if (!q)
        return;
    q = try_realloc("realloc(p, 1 MiB) grow to mmap", q, 1 << 20);
    check_fill("realloc(p, 1 MiB) grow to mmap", q, 10, 2);
    expect_recorded("realloc(p, 1 MiB) grow to mmap", q, 1 << 20);
    if (!q)
        return;
    fill(q, 1 << 20, 3);
    q = try_realloc("realloc(p, 300 KiB) shrink mmapped", q, 300 << 10);
    check_fill("realloc(p, 300 KiB) shrink mmapped", q, 300 << 10, 3);
    expect_recorded("realloc(p, 300 KiB) shrink mmapped", q, 300 << 10);
    if (!q)
        return;
    q = try_realloc("realloc(p, 50) mmapped to heap", q, 50);
    check_fill("realloc(p, 50) mmapped to heap", q, 50, 3);
    expect_recorded("realloc(p, 50) mmapped to heap", q, 50);
    if (!q)
        return;

    /* Failures leave the block as it was, recorded as it was. */
    static const struct {
        const char *name;
        int from_max;
        size_t v;
    } huge[] = {
        {"realloc(p, SIZE_MAX)", 1, 0},
        {"realloc(p, SIZE_MAX - 4096)", 1, 4096},
        {"realloc(p, PTRDIFF_MAX + 1)", 0, 1},
    };
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
        size_t n = huge[i].from_max ? SMAX - huge[i].v : PMAX + huge[i].v;
        void *r = try_realloc(huge[i].name, q, n);
        check_fill(huge[i].name, q, 50, 3);
        expect_recorded(huge[i].name, q, 50);
        if (r) /* cannot happen; keeps the test honest if it does */
            q = r;
    }

    errno = KEPT;
    void *r = realloc(launder(q), 0); /* glibc: frees the block, returns NULL */
    outcome("realloc(p, 0)", r, errno, 0, 1);
    expect_forgotten("realloc(p, 0)", q);
    if (r)
        free(r);
}

static void *try_reallocarray(const char *call, void *p, size_t n, size_t size) {
    errno = KEPT;
    void *q = reallocarray(launder(p), n, size);
    outcome(call, q, errno, q ? n * size : 0, 1);
    return q;
}

static void cases_reallocarray(void) {
    unsigned char *p = try_reallocarray("reallocarray(NULL, 3, 5)", NULL, 3, 5);
    expect_recorded("reallocarray(NULL, 3, 5)", p, 15);
    if (!p)
        return;
    fill(p, 15, 4);
    p = try_reallocarray("reallocarray(p, 10, 10)", p, 10, 10);
    check_fill("reallocarray(p, 10, 10)", p, 15, 4);
    expect_recorded("reallocarray(p, 10, 10)", p, 100);
    if (!p)
        return;
    fill(p, 100, 5);
    static const struct {
        const char *name;
        size_t n_from_max, n, size_from_max, size;
    } over[] = {
        {"reallocarray(p, SIZE_MAX, 2)", 1, 0, 0, 2},
        {"reallocarray(p, 2, SIZE_MAX/2 + 1)", 0, 2, 2, 0},
        {"reallocarray(p, 2^32, 2^32)", 0, (size_t)1 << 32, 0, (size_t)1 << 32},
        {"reallocarray(p, 1, SIZE_MAX)", 0, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof over / sizeof *over; i++) {
        size_t n = over[i].n_from_max ? SMAX : over[i].n;
        size_t size = over[i].size_from_max == 1   ? SMAX
                      : over[i].size_from_max == 2 ? PMAX + 1
                                                   : over[i].size;
        void *r = try_reallocarray(over[i].name, p, n, size);
        check_fill(over[i].name, p, 100, 5);
        expect_recorded(over[i].name, p, 100);
        if (r)
            p = r;
    }
    void *r = try_reallocarray("reallocarray(NULL, SIZE_MAX, 2)", NULL, SMAX, 2);
    if (r)
        free(r);
    r = try_reallocarray("reallocarray(p, 0, 5)", p, 0, 5); /* realloc(p, 0): frees */
    expect_forgotten("reallocarray(p, 0, 5)", p);
    if (r)
        free(r);
    p = try_reallocarray("reallocarray(NULL, 5, 0)", NULL, 5, 0);
    expect_recorded("reallocarray(NULL, 5, 0)", p, 0);
    r = try_reallocarray("reallocarray(p, 5, 0)", p, 5, 0);
    expect_forgotten("reallocarray(p, 5, 0)", p);
    if (r)
        free(r);
}

/* Alignments and sizes every aligned allocator is tried with. */
static size_t alignment(size_t i, char *name, size_t len) {
    static const size_t small[] = {0,  1,  2,  3,  4,   5,   7,    8,     16,     24,
                                   32, 48, 64, 96, 100, 128, 4096, 65536, 1 << 20};
    size_t n_small = sizeof small / sizeof *small;
    if (i < n_small) {
        snprintf(name, len, "%zu", small[i]);
        return small[i];
    }
    switch (i - n_small) {
    case 0:
        snprintf(name, len, "SIZE_MAX/2 + 1");
        return PMAX + 1;
    case 1:
        snprintf(name, len, "SIZE_MAX/2 + 2");
        return PMAX + 2;
    case 2:
        snprintf(name, len, "SIZE_MAX/2");
        return PMAX;
    default:
        snprintf(name, len, "SIZE_MAX");
        return SMAX;
    }
}
#define N_ALIGNMENTS 23

static size_t asize(size_t i, char *name, size_t len) {
    static const size_t small[] = {0, 1, 100, 1 << 20};
    if (i < 4) {
        snprintf(name, len, "%zu", small[i]);
        return small[i];
    }
    snprintf(name, len, i == 4 ? "SIZE_MAX" : "SIZE_MAX - 8192");
    return i == 4 ? SMAX : SMAX - 8192;
}
#define N_ASIZES 6

static void cases_aligned(void) {
    char an[32], sn[32], call[96];
    for (size_t i = 0; i < N_ALIGNMENTS; i++) {
        size_t al = alignment(i, an, sizeof an);
        for (size_t j = 0; j < N_ASIZES; j++) {
            size_t n = asize(j, sn, sizeof sn);
            void *sentinel = (void *)0x5eed, *mp = sentinel;
            errno = KEPT;
            int r = posix_memalign(&mp, al, n);
            int err = errno;
            snprintf(call, sizeof call, "posix_memalign(&p, %s, %s)", an, sn);
            if (r != 0) {
                note("%-44s returns %s errno=%s memptr %s\n", call, errno_name(r), errno_name(err),
                     mp == sentinel ? "untouched" : "CHANGED");
            } else {
                outcome(call, mp, err, n, al);
                expect_recorded(call, mp, n);
                release(call, mp);
            }

            snprintf(call, sizeof call, "aligned_alloc(%s, %s)", an, sn);
            errno = KEPT;
            void *p = aligned_alloc(al, n);
            outcome(call, p, errno, n, al);
            expect_recorded(call, p, n);
            if (p)
                release(call, p);

            snprintf(call, sizeof call, "memalign(%s, %s)", an, sn);
            errno = KEPT;
            p = memalign(al, n);
            outcome(call, p, errno, n, al);
            expect_recorded(call, p, n);
            if (p)
                release(call, p);
        }
    }
}

static void cases_page(void) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sizes[] = {0, 1, 5000, SMAX, SMAX - page, SMAX - 2 * page + 2};
    const char *names[] = {
        "0", "1", "5000", "SIZE_MAX", "SIZE_MAX - page", "SIZE_MAX - 2 page + 2"};
    char call[96];
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        snprintf(call, sizeof call, "valloc(%s)", names[i]);
        errno = KEPT;
        void *p = valloc(sizes[i]);
        outcome(call, p, errno, sizes[i], page);
        expect_recorded(call, p, sizes[i]);
        if (p)
            release(call, p);
        snprintf(call, sizeof call, "pvalloc(%s)", names[i]);
        errno = KEPT;
        p = pvalloc(sizes[i]);
        outcome(call, p, errno, sizes[i], page);
        if (p)
            note("%-44s usable is whole pages=%d\n", call, malloc_usable_size(p) % page == 0);
        expect_recorded(call, p, sizes[i]);
        if (p)
            release(call, p);
    }
}

static void cases_strings(void) {
    static const char unterminated[5] = {'a', 'b', 'c', 'd', 'e'};
    struct {
        const char *name;
        char *p;
        size_t want;
    } c[] = {
        {"strdup(\"\")", NULL, 1},
        {"strdup(\"hello\")", NULL, 6},
        {"strndup(\"hello\", 0)", NULL, 1},
        {"strndup(\"hello\", 3)", NULL, 4},
        {"strndup(\"hello\", SIZE_MAX)", NULL, 6},
        {"strndup(unterminated, 5)", NULL, 6},
    };
    errno = KEPT;
    c[0].p = strdup("");
    c[1].p = strdup("hello");
    c[2].p = strndup("hello", 0);
    c[3].p = strndup("hello", 3);
    c[4].p = strndup("hello", SMAX);
    c[5].p = strndup(unterminated, 5);
    note("%-44s errno=%s\n", "strdup/strndup", errno_name(errno));
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        outcome(c[i].name, c[i].p, KEPT, c[i].want, 1);
        if (c[i].p)
            note("%-44s \"%s\"\n", c[i].name, c[i].p);
        expect_recorded(c[i].name, c[i].p, c[i].want);
        release(c[i].name, c[i].p);
    }
}

/* --- before any constructor ----------------------------------------------- */

struct early {
    int pm_ok, pm_odd, pm_zero, pm_huge, pm_small;
    void *pm_block, *aa_block, *aa_odd_block;
    int aa_errno, aa_huge_errno, aa_odd_errno;
    int malloc_max_errno;
    void *pm_odd_ptr;
};
static struct early early;

static void preinit(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    void *sentinel = (void *)0x5eed;
    early.pm_ok = posix_memalign(&early.pm_block, 64, 100);
    early.pm_odd_ptr = sentinel;
    early.pm_odd = posix_memalign(&early.pm_odd_ptr, 24, 100);
    void *unused = sentinel;
    early.pm_zero = posix_memalign(&unused, 0, 100);
    early.pm_small = posix_memalign(&unused, 4, 100); /* a power of two below sizeof(void *) */
    early.pm_huge = posix_memalign(&unused, 64, SMAX);
    errno = KEPT;
    early.aa_block = aligned_alloc(64, 100);
    early.aa_errno = errno;
    errno = KEPT;
    early.aa_odd_block = aligned_alloc(24, 100);
    early.aa_odd_errno = errno;
    errno = KEPT;
    void *none = aligned_alloc(SMAX, 1);
    early.aa_huge_errno = none ? -1 : errno;
    errno = KEPT;
    none = malloc(SMAX);
    early.malloc_max_errno = none ? -1 : errno;
}
__attribute__((section(".preinit_array"),
               used)) static void (*const run_preinit)(int, char **, char **) = preinit;

static void cases_early(void) {
    note("%-44s returns %s aligned=%d\n", "preinit posix_memalign(&p, 64, 100)",
         errno_name(early.pm_ok), early.pm_block && (uintptr_t)early.pm_block % 64 == 0);
    note("%-44s returns %s memptr %s\n", "preinit posix_memalign(&p, 24, 100)",
         errno_name(early.pm_odd), early.pm_odd_ptr == (void *)0x5eed ? "untouched" : "CHANGED");
    note("%-44s returns %s\n", "preinit posix_memalign(&p, 0, 100)", errno_name(early.pm_zero));
    note("%-44s returns %s\n", "preinit posix_memalign(&p, 4, 100)", errno_name(early.pm_small));
    note("%-44s returns %s\n", "preinit posix_memalign(&p, 64, SIZE_MAX)",
         errno_name(early.pm_huge));
    outcome("preinit aligned_alloc(64, 100)", early.aa_block, early.aa_errno, 100, 64);
    outcome("preinit aligned_alloc(24, 100)", early.aa_odd_block, early.aa_odd_errno, 100, 24);
    note("%-44s errno=%s\n", "preinit aligned_alloc(SIZE_MAX, 1)", errno_name(early.aa_huge_errno));
    note("%-44s errno=%s\n", "preinit malloc(SIZE_MAX)", errno_name(early.malloc_max_errno));
    /* Blocks from before the constructors free normally, recorded or not. */
    free(early.pm_block);
    free(early.aa_block);
    free(early.aa_odd_block);
}

static void run_cases(void) {
    cases_early();
    cases_free();
    cases_malloc();
    cases_calloc();
    cases_realloc();
    cases_reallocarray();
    cases_aligned();
    cases_page();
    cases_strings();
}

/* --- glibc's transcript, from a copy of this program without the preload -- */

static char glibc_out[sizeof transcript];

static size_t glibc_transcript(char **argv) {
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        unsetenv("LD_PRELOAD");
        char *args[] = {argv[0], "--glibc", NULL};
        check_exec_self(args);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t r;
    while (len < sizeof glibc_out - 1 &&
           (r = read(fds[0], glibc_out + len, sizeof glibc_out - 1 - len)) > 0)
        len += (size_t)r;
    glibc_out[len] = 0;
    close(fds[0]);
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return len;
}

/* Compares line by line; each differing line is a failed check. */
static void compare(const char *mine, const char *theirs) {
    size_t lines = 0, same = 0;
    while (*mine || *theirs) {
        const char *me = strchr(mine, '\n'), *them = strchr(theirs, '\n');
        size_t lm = me ? (size_t)(me - mine) : strlen(mine);
        size_t lt = them ? (size_t)(them - theirs) : strlen(theirs);
        lines++;
        if (lm == lt && !memcmp(mine, theirs, lm)) {
            same++;
        } else {
            fprintf(stderr, "differs from glibc:\n  preload: %.*s\n  glibc:   %.*s\n", (int)lm,
                    mine, (int)lt, theirs);
        }
        mine += lm + (me != NULL);
        theirs += lt + (them != NULL);
    }
    CHECK_EQ(same, lines);
    printf("%zu outcomes compared with glibc, %zu identical\n", lines, same);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--glibc")) {
        run_cases();
        fwrite(transcript, 1, tlen, stdout);
        return 0;
    }
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    struct mtrace_stats s;
    api->stats(&s);
    CHECK_EQ(s.active, 1);
    run_cases();
    CHECK(tlen > 0 && tlen < sizeof transcript - 1);
    size_t theirs = glibc_transcript(argv);
    CHECK(theirs > 0);
    compare(transcript, glibc_out);
    api->stats(&s);
    CHECK_EQ(s.dropped, 0);
    if (getenv("MTRACE_TEST_VERBOSE"))
        fwrite(transcript, 1, tlen, stdout);
    return check_summary();
}
