/*
 * The two runs of test_interpose_libc and what they share: each writes a
 * transcript of outcomes (note, outcome, release, ...), the preloaded run
 * also checks the table (expect_recorded, expect_forgotten), and compares
 * its transcript with the one of a copy of itself started without the
 * preload (libc_transcript, compare).
 */
#ifndef MT_TEST_LIBC_TRANSCRIPT_H
#define MT_TEST_LIBC_TRANSCRIPT_H

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

#ifdef __GLIBC__
#define LIBC_NAME "glibc"
#else
#define LIBC_NAME "musl"
#endif

#define KEPT 4321 /* not an errno value: still there means errno was left alone */

static const struct mtrace_api *api; /* NULL in the run without the preload */
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
    size_t n = query_olds(api, NULL, found_buf, sizeof found_buf / sizeof *found_buf);
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

/* --- the C library's transcript, from a copy without the preload -------- */

static char libc_out[sizeof transcript];

static size_t libc_transcript(char **argv) {
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        unsetenv("LD_PRELOAD");
        char *args[] = {argv[0], "--libc", NULL};
        check_exec_self(args);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t r;
    while (len < sizeof libc_out - 1 &&
           (r = read(fds[0], libc_out + len, sizeof libc_out - 1 - len)) > 0)
        len += (size_t)r;
    libc_out[len] = 0;
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
            fprintf(stderr, "differs from " LIBC_NAME ":\n  preload: %.*s\n  " LIBC_NAME ": %.*s\n",
                    (int)lm, mine, (int)lt, theirs);
        }
        mine += lm + (me != NULL);
        theirs += lt + (them != NULL);
    }
    CHECK_EQ(same, lines);
    printf("%zu outcomes compared with " LIBC_NAME ", %zu identical\n", lines, same);
}

#endif
