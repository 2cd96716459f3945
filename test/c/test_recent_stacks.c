/*
 * The calling thread's last stacks (recent_stacks.h): a capture is answered
 * by the id a stack was kept with, told apart from stacks that share its
 * first frame, or by none, never by a wrong one.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "recent_stacks.h"
#include "unwind.h"

#define MAXF 64

/* The last few stacks (recent_stacks.h): stacks that share their first
 * frame (one call site in recent_mid) but not their callers are told
 * apart, each by the id it was kept with; one never kept is not found, and
 * none is once the rules are forgotten (dlclose). */
static uint32_t recent_id; /* in: the id to keep (0: look up instead); out: found */
static uintptr_t recent_sp[2];
static __attribute__((noinline)) void recent_probe(void) {
    struct mt_walk_start at = MT_WALK_START_CALLER();
    recent_sp[recent_id != 0] = at.sp;
    if (recent_id) {
        uintptr_t out[MAXF];
        int same;
        CHECK(mt_unwind_check(&at, out, MAXF, &same) > 3);
        CHECK_EQ(mt_recent_keep(MAXF, recent_id), 1);
    } else
        recent_id = mt_recent_stack(&at, MAXF);
}
static __attribute__((noinline)) void recent_mid(void) {
    recent_probe();
    __asm__ __volatile__("" ::: "memory"); /* no tail call: keep the frame */
}
#define RECENT_OUTER(name)                                                                         \
    static __attribute__((noinline)) void name(void) {                                             \
        recent_mid();                                                                              \
        __asm__ __volatile__("" ::: "memory");                                                     \
    }
RECENT_OUTER(recent_a)
RECENT_OUTER(recent_b)
RECENT_OUTER(recent_c)

static void test_recent_stacks(void) {
    /* One call site for all: the stacks differ in recent_a/b/c alone. */
    static const struct {
        void (*outer)(void);
        uint32_t keep, want; /* keep 0: look up, and want that id */
    } steps[] = {{recent_a, 7, 0}, {recent_b, 8, 0}, {recent_a, 0, 7},
                 {recent_b, 0, 8}, {recent_b, 0, 8}, {recent_a, 0, 7},
                 {recent_c, 0, 0}, {NULL, 0, 0},     {recent_a, 0, 0}};
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        if (!steps[i].outer) { /* as after dlclose */
            mt_unwind_forget();
            continue;
        }
        recent_id = steps[i].keep;
        steps[i].outer();
        if (!steps[i].keep)
            CHECK_EQ(recent_id, steps[i].want);
    }
    CHECK_EQ(recent_sp[0], recent_sp[1]); /* one first frame, else this test proves nothing */
}

/* Many stacks that share their first frame and all of their frame sizes
 * (128 paths through two identical functions, as bench/churn.c makes 64):
 * each kept one is found with its own id or not at all (its checks gave
 * way to later ones), the last kept always; none once the thread exited. */
static void chain_a(int n, unsigned path);
static void chain_b(int n, unsigned path);
static __attribute__((noinline)) void chain(int n, unsigned path) {
    if (n == 0)
        recent_mid();
    else if ((path >> (n - 1)) & 1)
        chain_a(n - 1, path);
    else
        chain_b(n - 1, path);
    __asm__ __volatile__("" ::: "memory");
}
static __attribute__((noinline)) void chain_a(int n, unsigned path) {
    chain(n, path);
    __asm__ __volatile__("" ::: "memory");
}
static __attribute__((noinline)) void chain_b(int n, unsigned path) {
    chain(n, path);
    __asm__ __volatile__("" ::: "memory");
}

static __attribute__((noinline)) uint32_t visit(unsigned path, uint32_t keep) {
    recent_id = keep;
    chain(7, path);
    __asm__ __volatile__("" ::: "memory");
    return recent_id;
}

static void *many_recent_stacks(void *unused) {
    (void)unused;
    enum { PATHS = 128, ID = 1000 }; /* as many as are kept: both words of a mask */
    int found = 0, wrong = 0;
    uint32_t got[2 * PATHS];
    /* One call site (a walk reads the return addresses up to main): keep
     * them all, then look each up, the last kept first (a run of misses
     * would make lookups rarer, recent_stacks.c). */
    for (volatile unsigned step = 0; step < 2 * PATHS; step++)
        got[step] = visit(step < PATHS ? step : 2 * PATHS - 1 - step, step < PATHS ? ID + step : 0);
    for (unsigned path = 0; path < PATHS; path++) {
        uint32_t id = got[2 * PATHS - 1 - path];
        found += id == ID + path;
        wrong += id && id != ID + path;
    }
    CHECK_EQ(got[PATHS], ID + PATHS - 1); /* the last kept */
    CHECK_EQ(wrong, 0);
    /* As many as their checks leave room for: more than one mask word holds,
     * except where AddressSanitizer's frames make each proof about twice as
     * long (55 of 128 found). */
#ifdef __SANITIZE_ADDRESS__
    CHECK(found >= PATHS / 4);
#else
    CHECK(found > 64);
#endif
    printf("%d of %d stacks with one first frame found among the last kept\n", found, PATHS);
    mt_recent_thread_exit();
    recent_id = 0;
    chain(7, PATHS - 1);
    CHECK_EQ(recent_id, 0);
    return NULL;
}

/* In a thread of its own, which starts with none kept. */
static void test_many_recent_stacks(void) {
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, many_recent_stacks, NULL), 0);
    pthread_join(t, NULL);
}

int main(void) {
    test_recent_stacks();
    test_many_recent_stacks();
    return check_summary();
}
