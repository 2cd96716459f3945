/*
 * The fast walker must return exactly what libunwind returns, for every
 * stack shape compilers produce, also when it reuses the previous walk of
 * the thread (stacks that share, or almost share, their outer frames).
 * Built without libunwind (MT_NO_LIBUNWIND, musl), libgcc's unwinder is the
 * reference instead.
 */
#define _GNU_SOURCE
#define UNW_LOCAL_ONLY
#include <alloca.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mtrace_api.h"
#include "unwind.h"

#define MAXF 64

#ifdef MT_NO_LIBUNWIND
/* libgcc's unwinder (the Itanium ABI's _Unwind_Backtrace; its unwind.h is
 * shadowed here by the walker's). */
#define REFERENCE "libgcc"
#define URC_NO_REASON 0
#define URC_END_OF_STACK 5
struct _Unwind_Context;
extern int _Unwind_Backtrace(int (*)(struct _Unwind_Context *, void *), void *);
extern uintptr_t _Unwind_GetIP(struct _Unwind_Context *);

/* Debian's libgcc finds a pc's unwind tables with glibc's _dl_find_object,
 * which musl lacks: the same answer, from dl_iterate_phdr. */
#include <link.h>
struct dl_find_object {
    unsigned long long flags;
    void *map_start, *map_end, *link_map, *eh_frame;
#ifndef __x86_64__
    void *eh_dbase;
#endif
    unsigned long long reserved[7];
};

struct find {
    uintptr_t pc;
    struct dl_find_object *out;
    int found;
};

static int find_one(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct find *f = arg;
    const ElfW(Phdr) *eh = NULL;
    int inside = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && f->pc >= start && f->pc < start + ph->p_memsz)
            inside = 1;
        if (ph->p_type == PT_GNU_EH_FRAME)
            eh = ph;
    }
    if (!inside)
        return 0;
    memset(f->out, 0, sizeof *f->out);
    f->out->eh_frame = eh ? (void *)(info->dlpi_addr + eh->p_vaddr) : NULL;
    f->found = 1;
    return 1;
}

int _dl_find_object(void *pc, struct dl_find_object *out);
int _dl_find_object(void *pc, struct dl_find_object *out) {
    struct find f = {(uintptr_t)pc, out, 0};
    dl_iterate_phdr(find_one, &f);
    return f.found ? 0 : -1;
}

struct trace {
    void **buf;
    int n, max;
};

static int trace_one(struct _Unwind_Context *c, void *arg) {
    struct trace *t = arg;
    uintptr_t ip = _Unwind_GetIP(c);
    if (!ip || t->n == t->max)
        return URC_END_OF_STACK;
    t->buf[t->n++] = (void *)ip;
    return URC_NO_REASON;
}

/* As unw_backtrace: the first frame is the caller's. */
static __attribute__((noinline)) int reference_backtrace(void **buf, int max) {
    void *all[MAXF + 1];
    struct trace t = {all, 0, MAXF + 1};
    _Unwind_Backtrace(trace_one, &t);
    int n = t.n - 1 < max ? t.n - 1 : max; /* all[0] is in here */
    for (int i = 0; i < n; i++)
        buf[i] = all[i + 1];
    __asm__ __volatile__("" ::: "memory"); /* not a tail call */
    return n < 0 ? 0 : n;
}
#else
#include <libunwind.h>

#define REFERENCE "libunwind"
#define reference_backtrace unw_backtrace
#endif

static int compared, mismatches, gave_up;

/* A frame as libunwind reports it.  On aarch64, libunwind's unw_backtrace
 * gives every return address minus one (libunwind issue 911, fixed after
 * 1.8; Debian 12 has 1.6.2): instructions are 4-byte aligned there, so an
 * odd address is one of those. */
static uintptr_t libunwind_frame(void *p) {
#if defined(__aarch64__)
    return (uintptr_t)p & 1 ? (uintptr_t)p + 1 : (uintptr_t)p;
#else
    return (uintptr_t)p;
#endif
}

/* Compares the two walkers from the leaf's caller outwards: frame 0 of each
 * is inside the walker, frame 1 (fast) / 0 (reference) a call site in here. */
static __attribute__((noinline)) void compare_here(void) {
    uintptr_t fast[MAXF];
    void *slow[MAXF];
    int unchanged;
    int n = mt_unwind(fast, MAXF, &unchanged);
    int m = reference_backtrace(slow, MAXF);
    compared++;
    if (n < 0) {
        gave_up++;
        return;
    }
    int same = n - 1 == m;
    for (int i = 1; same && i < m; i++)
        same = fast[i + 1] == libunwind_frame(slow[i]);
    if (!same && mismatches++ < 3) {
        fprintf(stderr, "mismatch: fast %d frames, " REFERENCE " %d\n", n - 1, m);
        for (int i = 0; i < MAXF && (i < n || i < m); i++)
            fprintf(stderr, "  %2d %#18lx %#18lx\n", i,
                    i + 1 < n ? (unsigned long)fast[i + 1] : 0ul,
                    i < m ? (unsigned long)libunwind_frame(slow[i]) : 0ul);
    }
}

/* Frame shapes: plain, dynamic stack allocation (CFA from RBP), a large
 * frame, and unoptimised code with frame pointers. */
static void shape(unsigned path, int depth);

static __attribute__((noinline)) void plain(unsigned path, int depth) {
    shape(path, depth);
    __asm__ __volatile__("" ::: "memory");
}

static __attribute__((noinline)) void dynamic(unsigned path, int depth) {
    volatile char *buf = alloca(16 + (path & 0xff));
    buf[0] = 1;
    shape(path, depth);
    buf[1] = buf[0];
}

static __attribute__((noinline)) void large(unsigned path, int depth) {
    volatile char buf[70000];
    buf[0] = (char)path;
    shape(path, depth);
    buf[69999] = buf[0];
}

#ifdef __clang__
#define UNOPTIMISED optnone
#else
#define UNOPTIMISED optimize("O0")
#endif
static __attribute__((noinline, UNOPTIMISED)) void unoptimised(unsigned path, int depth) {
    shape(path, depth);
}

static int cmp_ints(const void *a, const void *b) {
    static unsigned calls;
    if (calls++ % 7 == 0)
        compare_here(); /* from inside libc's qsort */
    return *(const int *)a - *(const int *)b;
}

static __attribute__((noinline)) void through_libc(unsigned path, int depth) {
    (void)path;
    (void)depth;
    int v[8] = {5, 3, 8, 1, 9, 2, 7, 4};
    qsort(v, 8, sizeof *v, cmp_ints);
}

static void shape(unsigned path, int depth) {
    if (depth == 0) {
        compare_here();
        compare_here(); /* the second one reuses the first walk */
        return;
    }
    switch ((path >> (2 * depth)) & 3) {
    case 0:
        plain(path, depth - 1);
        break;
    case 1:
        dynamic(path, depth - 1);
        break;
    case 2:
        large(path, depth - 1);
        break;
    default:
        unoptimised(path, depth - 1);
        break;
    }
}

static void *shapes(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < 3000; i++) {
        seed = seed * 1103515245u + 12345u;
        shape(seed, 1 + (int)((seed >> 8) % 12));
        if (i % 100 == 0)
            through_libc(seed, 0);
    }
    return NULL;
}

static void test_shapes(void) {
    shapes((void *)1);
    pthread_t t;
    pthread_attr_t attr; /* up to 12 frames of 70 kB: more than musl's 128 KiB default */
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8u << 20);
    pthread_create(&t, &attr, shapes, (void *)2);
    pthread_join(t, NULL);
    pthread_attr_destroy(&attr);
    printf("compared %d stacks with " REFERENCE "'s, %d given up\n", compared, gave_up);
    CHECK(compared > 10000);
    CHECK_EQ(mismatches, 0);
    CHECK_EQ(gave_up, 0);
}

/* Two walks from one call site: the second says the stack is unchanged and
 * returns the same frames; a walk from elsewhere does not. */
static __attribute__((noinline)) void walk_twice(int *unchanged, int *n, uintptr_t (*out)[MAXF]) {
    static volatile int times = 2; /* not unrolled: one call site */
    for (int i = 0; i < times; i++)
        n[i] = mt_unwind(out[i], MAXF, &unchanged[i]);
}

static void test_unchanged(void) {
    int unchanged[2], n[2], other;
    uintptr_t out[2][MAXF];
    walk_twice(unchanged, n, out);
    CHECK_EQ(unchanged[1], 1);
    CHECK_EQ(n[0], n[1]);
    CHECK(n[0] > 0 && !memcmp(out[0], out[1], (size_t)n[0] * sizeof(uintptr_t)));
    mt_unwind(out[0], MAXF, &other);
    CHECK_EQ(other, 0);
    mt_unwind(out[0], MAXF / 2, &other); /* same place, other max */
    CHECK_EQ(other, 0);
}

/* The lazy walk's proof that a stack repeats: from the same frame (same
 * ip and sp, one call site in probe_mid) it must still see that an outer
 * return address changed, as when outer_a's caller becomes outer_b. */
static uintptr_t mid_sp[4];
static __attribute__((noinline)) int probe(int *same, uintptr_t *out) {
    struct mt_walk_start at = MT_WALK_START_CALLER();
    return mt_unwind_check(&at, out, MAXF, same);
}
static __attribute__((noinline)) int probe_mid(int k, int *same, uintptr_t *out) {
    mid_sp[k] = (uintptr_t)__builtin_frame_address(0);
    int n = probe(same, out);
    __asm__ __volatile__("" ::: "memory"); /* no tail call: keep the frame */
    return n;
}
static __attribute__((noinline)) int outer_a(int k, int *same, uintptr_t *out) {
    int n = probe_mid(k, same, out);
    __asm__ __volatile__("" ::: "memory");
    return n;
}
static __attribute__((noinline)) int outer_b(int k, int *same, uintptr_t *out) {
    int n = probe_mid(k, same, out);
    __asm__ __volatile__("" ::: "memory");
    return n;
}

static void test_repeat_proof(void) {
    int same[4], n[4];
    uintptr_t out[4][MAXF];
    int (*const outer[4])(int, int *, uintptr_t *) = {outer_a, outer_a, outer_a, outer_b};
    for (int k = 0; k < 4; k++) {
        memset(out[k], 0, sizeof out[k]);
        n[k] = outer[k](k, &same[k], out[k]);
    }
    CHECK(n[0] > 3);
    CHECK_EQ(mid_sp[0], mid_sp[3]); /* else this test proves nothing */
    CHECK_EQ(same[0], 0);
    CHECK_EQ(same[1], 1); /* repeated: out left alone */
    CHECK_EQ(same[2], 1); /* repeated again: the proof by the list of checks */
    CHECK_EQ(same[3], 0); /* outer_b instead of outer_a, 2 frames up */
    CHECK_EQ(n[3], n[0]);
    CHECK_EQ(out[3][0], out[0][0]); /* in probe_mid */
    CHECK(out[3][1] != out[0][1]);  /* in outer_b, not outer_a */
    for (int i = 2; i < n[0]; i++)
        CHECK_EQ(out[3][i], out[0][i]);
}

/* A signal frame is libunwind's business: the walker must give up there,
 * after the handler's frames.  It knows one by its unwind information
 * (glibc's or the vDSO's sigreturn trampoline) or, for musl's trampoline,
 * which has none, by its code; qemu-user before 8.0 returns from aarch64
 * handlers through a trampoline of its own, outside every object, where the
 * walk just ends. */
static int in_handler, trampoline_known;
static __attribute__((noinline)) void on_signal(int sig) {
    (void)sig;
    uintptr_t fast[MAXF];
    int unchanged;
    Dl_info info;
    trampoline_known = dladdr(__builtin_return_address(0), &info) != 0;
    in_handler = mt_unwind(fast, MAXF, &unchanged);
}

static void test_signal_frame(void) {
    signal(SIGUSR1, on_signal);
    raise(SIGUSR1);
    if (trampoline_known)
        CHECK(in_handler <= -3); /* -1 - frames walked: the walker's, on_signal's, the trampoline */
    else
        printf("skipped: signal frame (the handler returns to code outside every object, as "
               "under qemu-user without a vDSO)\n");
}

/* After dlclose and mt_unwind_forget, code loaded at the same place is
 * walked with its own rules. */
static void test_reload(const char *build) {
    char path[4096];
    snprintf(path, sizeof path, "%s/symbols_fixture.so", build);
    for (int round = 0; round < 3; round++) {
        void *h = dlopen(path, RTLD_NOW);
        CHECK(h != NULL);
        if (!h)
            return;
        void (*call)(void (*)(void)) = (void (*)(void (*)(void)))dlsym(h, "fixture_call_back");
        CHECK(call != NULL);
        int before = mismatches;
        if (call)
            call(compare_here);
        CHECK_EQ(mismatches, before);
        dlclose(h);
        mt_unwind_forget();
    }
}

/* The deepest walk a capture asks for (MTRACE_DEPTH up to MTRACE_MAX_DEPTH,
 * and the hooks' frames) is walked whole, not cut short. */
#define DEEP (MTRACE_MAX_DEPTH + 2)
static int deep_n[2];
static __attribute__((noinline)) void deep(int level, int k) {
    if (level > 0) {
        deep(level - 1, k);
        __asm__ __volatile__("" ::: "memory"); /* no tail call: keep the frame */
        return;
    }
    uintptr_t out[DEEP];
    int same;
    deep_n[k] = mt_unwind(out, DEEP, &same);
}

static void test_deep(void) {
    for (int k = 0; k < 2; k++)
        deep(DEEP + 10, k);
    CHECK_EQ(deep_n[0], DEEP);
    CHECK_EQ(deep_n[1], DEEP); /* and again, from what the first left */
}

int main(int argc, char **argv) {
    test_deep();
    test_shapes();
    test_unchanged();
    test_repeat_proof();
    test_signal_frame();
    test_reload(argc > 1 ? argv[1] : "_build/c");
    return check_summary();
}
