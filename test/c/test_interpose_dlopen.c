/* dlopen and dlclose while the preload traces (run with the preload; argv[1]
 * is the build directory holding dl_fixture_a.so and dl_fixture_b.so, the
 * same code with frames of different sizes).  The two are loaded and
 * unloaded in turn, usually at the same address, while two threads allocate:
 * stacks walked through each library's frames (its constructor under dlopen,
 * a callback, its own malloc) must be exact every time, which they are not
 * if an unwind rule of the library unloaded before survives.  Blocks
 * allocated inside a library outlive it: their stacks then point into
 * unmapped memory, and reading, querying and naming them must not crash.
 * The libraries are also unloaded with libc's own dlclose, as glibc does for
 * iconv's gconv modules, so the preload's dlclose never sees the unload
 * (in a child process: a crash fails one check; and in this program started
 * again with sampling, where walks are few and none may miss the rule
 * cache between an unload and the next library's walk).  musl's dlclose unloads
 * nothing: there each library's constructor runs at its first dlopen only,
 * its destructor at exit, and its code stays mapped (UNLOADS is 0); and
 * its libc (the loader) has no unwind tables, so the constructor's stack
 * ends in the loader's frame instead of reaching this program's
 * (LOADER_UNWINDS is 0). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"
#include "symbols.h"

#ifdef __GLIBC__
#define UNLOADS 1
#define LOADER_UNWINDS 1
#else
#define UNLOADS 0
#define LOADER_UNWINDS 0
#endif

#define CTOR_SIZE 7321 /* FIXTURE_CTOR_SIZE of dl_fixture.c */
#define CALL_SIZE 7322
#define LIB_SIZE 7323
#define CHURN_SIZE 7324
#define CYCLES 200
#define KEEP_EVERY 10

typedef void *(*call_fn)(void *(*)(size_t), size_t);
typedef void *(*malloc_fn)(size_t);

static const struct mtrace_api *api;

/* The stack recorded for the block p of this size; its depth, 0 if absent. */
static uint32_t stack_of(const void *p, uint64_t size, uintptr_t *ips, uint32_t max, uint32_t *id) {
    static struct mtrace_alloc buf[1024];
    struct mtrace_alloc a;
    if (!query_block(api, p, size, buf, sizeof buf / sizeof *buf, &a))
        return 0;
    if (id)
        *id = a.stack_id;
    return api->stack(a.stack_id, ips, max);
}

/* Is this return address inside fn (the first 256 bytes of it)? */
static int inside(uintptr_t ip, void *fn) { return ip > (uintptr_t)fn && ip < (uintptr_t)fn + 256; }

static int in_object(uintptr_t ip, const char *path) {
    Dl_info info;
    return dladdr((void *)ip, &info) && info.dli_fname && !strcmp(info.dli_fname, path);
}

__attribute__((noinline)) void *callback(size_t n) {
    void *p = malloc(n);
    __asm__ volatile("" ::: "memory"); /* keeps the call a call */
    return p;
}

__attribute__((noinline)) void *through_library(call_fn call, size_t n) {
    void *p = call(callback, n);
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline)) void *from_library(malloc_fn lib_malloc, size_t n) {
    void *p = lib_malloc(n);
    __asm__ volatile("" ::: "memory");
    return p;
}

__attribute__((noinline)) void *load(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    __asm__ volatile("" ::: "memory");
    return h;
}

static _Atomic int stop;

static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *live[256] = {0};
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        unsigned k = (unsigned)rand_r(&seed) % 256;
        free(live[k]);
        live[k] = malloc(CHURN_SIZE);
    }
    for (int k = 0; k < 256; k++)
        free(live[k]);
    return NULL;
}

struct kept {
    void *block;
    uint32_t stack_id;
    uintptr_t lib_ip; /* frame 0: inside the library, unloaded since */
    uintptr_t base;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The big-frame library, then the other at its address, and so on, each
 * walked through by a block of `size` bytes and unloaded by `unload`;
 * returns how many walks were wrong. */
static int alternate(const char (*paths)[4096], int cycles, int (*unload)(void *), size_t size) {
    int wrong = 0;
    for (int c = 0; c < cycles; c++) {
        void *h = load(paths[(c + 1) % 2]);
        if (!h)
            return cycles;
        call_fn call = (call_fn)(uintptr_t)dlsym(h, "fixture_call");
        uintptr_t ips[MTRACE_MAX_DEPTH];
        void *p = through_library(call, size);
        uint32_t depth = stack_of(p, size, ips, MTRACE_MAX_DEPTH, NULL);
        wrong += !(depth >= 3 && inside(ips[0], callback) &&
                   in_object(ips[1], paths[(c + 1) % 2]) && inside(ips[2], through_library));
        free(p);
        unload(h);
    }
    return wrong;
}

/* A dlclose with no memory for its snapshot of what is loaded (the address
 * space at its limit): what it unloaded is not known, so all code is taken
 * as unloaded since, and the block's frame in the library has no name. */
static void test_unload_without_snapshot(const char *path) {
    void *h = load(path);
    malloc_fn m = h ? (malloc_fn)(uintptr_t)dlsym(h, "fixture_malloc") : NULL;
    CHECK(m != NULL);
    if (!m)
        return;
    void *p = from_library(m, LIB_SIZE + 1);
    uintptr_t ips[MTRACE_MAX_DEPTH];
    uint32_t id = 0;
    uint32_t depth = stack_of(p, LIB_SIZE + 1, ips, MTRACE_MAX_DEPTH, &id);
    CHECK(depth >= 1);
    struct rlimit old, low;
    CHECK(getrlimit(RLIMIT_AS, &old) == 0);
    low = old;
    low.rlim_cur = (rlim_t)check_status_kib("VmSize") * 1024; /* no room for a mapping */
    CHECK(setrlimit(RLIMIT_AS, &low) == 0);
    CHECK_EQ(dlclose(h), 0);
    CHECK(setrlimit(RLIMIT_AS, &old) == 0);
    CHECK(depth >= 1 && api->unloaded_since(api->stack_epoch(id), ips[0]) == 1);
    free(p);
    printf("unloaded without room for the snapshot: taken as unloaded, not named\n");
}

/* More unloads than the log of unloaded code keeps (4,096): a stack walked
 * before them still has the names of the code loaded with the program (its
 * frame in this program, libc's code), while the library unloaded since is
 * still told (before, every frame of such a stack lost its name). */
#define WRAP_SIZE 7325
#define WRAP_CYCLES 4200
static void test_log_wrapped(const char *path) {
    void *p = malloc(WRAP_SIZE);
    uintptr_t ips[MTRACE_MAX_DEPTH];
    uint32_t id = 0;
    uint32_t depth = stack_of(p, WRAP_SIZE, ips, MTRACE_MAX_DEPTH, &id);
    CHECK(depth >= 1);
    uint32_t epoch = api->stack_epoch(id);
    uintptr_t in_libc = (uintptr_t)dlsym(RTLD_DEFAULT, "strtol"), in_lib = 0;
    int cycles = 0;
    for (; cycles < WRAP_CYCLES; cycles++) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            break;
        if (!in_lib)
            in_lib = (uintptr_t)dlsym(h, "fixture_malloc");
        dlclose(h);
    }
    CHECK_EQ(cycles, WRAP_CYCLES);
    CHECK(depth >= 1 && api->unloaded_since(epoch, ips[0]) == 0);
    CHECK(in_libc && api->unloaded_since(epoch, in_libc) == 0);
    CHECK(in_lib && api->unloaded_since(epoch, in_lib) == UNLOADS);
    printf("%d unloads: the program's and libc's code still named\n", cycles);
    free(p);
}

/* objects_generation while a dlclose is under way, read by the library's
 * destructor: odd then, since what it unmaps is not logged yet, and a
 * reader naming frames must wait (another library may be loaded where it
 * was); even before and after, and moved on by it. */
static uint64_t generation_in_fini;
static void note_generation(void) { generation_in_fini = api->objects_generation(); }
static void test_generation_while_closing(const char *path) {
    void *h = load(path);
    void (*set)(void (*)(void)) =
        h ? (void (*)(void (*)(void)))(uintptr_t)dlsym(h, "fixture_set_fini") : NULL;
    CHECK(set != NULL);
    if (!set)
        return;
    set(note_generation);
    uint64_t before = api->objects_generation();
    /* a dlclose that only drops a reference unmaps nothing: no change */
    void *again = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    CHECK(again == h);
    uint64_t opened = api->objects_generation();
    CHECK_EQ(again ? dlclose(again) : -1, 0);
    CHECK(api->objects_generation() == opened);
    CHECK(opened == before || !UNLOADS); /* musl counts every dlopen as a load */
    CHECK_EQ(dlclose(h), 0);
    uint64_t after = api->objects_generation();
    CHECK(before % 2 == 0 && after % 2 == 0 && (after > before || !UNLOADS));
    if (UNLOADS) /* musl runs destructors at exit */
        CHECK(generation_in_fini % 2 == 1);
    printf("objects' generation before, during and after a dlclose: %llu %llu %llu\n",
           (unsigned long long)before, (unsigned long long)generation_in_fini,
           (unsigned long long)after);
}

static const char *build_dir; /* argv[1] */

/* libc's own dlclose, which the preload's does not see. */
static int (*libc_dlclose)(void *);

static int find_libc_dlclose(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    libc_dlclose = libc ? (int (*)(void *))(uintptr_t)dlsym(libc, "dlclose") : NULL;
    return libc_dlclose != NULL;
}

/* ... then a wait longer than a tick of the tracer's coarse clock. */
static int libc_dlclose_then_wait(void *h) {
    int r = libc_dlclose(h);
    usleep(10000);
    return r;
}

/* mode "sampled": this program started again with sampling, where walks are
 * few and none may miss the rule cache between an unload and the next
 * library's walk; the blocks are large enough to be sampled every time. */
static int unhooked_sampled(const char (*paths)[4096]) {
    if (!find_libc_dlclose())
        return 2;
    /* the small-frame library first: its rules, kept, would make the big
     * frames of the other look small (the other way round, the walk sees
     * its frame leave the stack, gives up and is done by libunwind) */
    char swapped[2][4096];
    memcpy(swapped[0], paths[1], sizeof swapped[0]);
    memcpy(swapped[1], paths[0], sizeof swapped[1]);
    return alternate((const char(*)[4096])swapped, 10, libc_dlclose_then_wait, (size_t)32 << 20)
               ? 1
               : 0;
}

/* Runs fn in a child (forked, or this program started again in mode);
 * a crash or wrong stacks fail one check. */
static void in_child(const char *what, char *argv0, const char *mode,
                     int (*fn)(const char (*)[4096]), const char (*paths)[4096]) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!mode)
            _exit(fn(paths));
        setenv("MTRACE_SAMPLE_BYTES", "1048576", 1);
        char *args[] = {argv0, (char *)build_dir, (char *)mode, NULL};
        check_exec_self(args);
        _exit(126);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        fprintf(stderr, "%s: the walk crashed (signal %d)\n", what, WTERMSIG(status));
    else if (WEXITSTATUS(status))
        fprintf(stderr, "%s: wrong stacks\n", what);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        printf("%s: stacks exact\n", what);
}

static int unhooked_forked(const char (*paths)[4096]) {
    return alternate(paths, 20, libc_dlclose, CALL_SIZE) ? 1 : 0;
}

static void test_unhooked_unload(char *argv0, const char (*paths)[4096]) {
    CHECK(find_libc_dlclose());
    if (!libc_dlclose)
        return;
    in_child("unloaded by libc's own dlclose, 20 cycles", argv0, NULL, unhooked_forked, paths);
    in_child("the same, sampled, 10 cycles", argv0, "sampled", unhooked_sampled, paths);
}

int main(int argc, char **argv) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    mt_symbols_use(api);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    char paths[2][4096];
    const char *dir = argc > 1 ? argv[1] : ".";
    snprintf(paths[0], sizeof paths[0], "%s/dl_fixture_a.so", dir);
    snprintf(paths[1], sizeof paths[1], "%s/dl_fixture_b.so", dir);
    /* dladdr reports the path the loader used: make both absolute. */
    for (int i = 0; i < 2; i++) {
        char *real = realpath(paths[i], NULL);
        CHECK(real != NULL);
        if (!real) {
            fprintf(stderr, "%s: not found\n", paths[i]);
            return check_summary();
        }
        snprintf(paths[i], sizeof paths[i], "%s", real);
        free(real);
    }
    build_dir = dir;
    if (argc > 2 && !strcmp(argv[2], "sampled"))
        return unhooked_sampled((const char(*)[4096])paths);

    pthread_t threads[2];
    for (uintptr_t i = 0; i < 2; i++)
        pthread_create(&threads[i], NULL, churn, (void *)(i + 1));

    static struct kept kept[CYCLES / KEEP_EVERY];
    int n_kept = 0, ctor_ok = 0, call_ok = 0, lib_ok = 0, gone_ok = 0, reused = 0;
    uintptr_t last_base[2] = {0, 0};
    double t0 = now_s();
    for (int c = 0; c < CYCLES; c++) {
        const char *path = paths[c % 2];
        void *h = load(path);
        CHECK(h != NULL);
        if (!h)
            break;
        call_fn call = (call_fn)(uintptr_t)dlsym(h, "fixture_call");
        malloc_fn lib_malloc = (malloc_fn)(uintptr_t)dlsym(h, "fixture_malloc");
        Dl_info info;
        uintptr_t base = dladdr((void *)(uintptr_t)call, &info) ? (uintptr_t)info.dli_fbase : 0;
        reused += base && base == last_base[(c + 1) % 2]; /* where the other one was */
        last_base[c % 2] = base;

        uintptr_t ips[MTRACE_MAX_DEPTH];
        /* The constructor's block: frame 0 in the library, walked out
         * through the loader to this program. */
        struct mtrace_alloc ctor[4];
        struct mtrace_query f = sized_query(CTOR_SIZE, CTOR_SIZE);
        size_t n_ctor = query_olds(api, &f, ctor, 4);
        uint32_t depth = n_ctor == 1 ? api->stack(ctor[0].stack_id, ips, MTRACE_MAX_DEPTH) : 0;
        int reaches_load = 0;
        for (uint32_t i = 1; i < depth; i++)
            reaches_load |= inside(ips[i], load);
        if (UNLOADS || c == 0)
            ctor_ok += n_ctor == 1 && depth >= 2 && in_object(ips[0], path) &&
                       (reaches_load || !LOADER_UNWINDS);

        /* A callback from a library frame: callback, library, through_library. */
        void *p = through_library(call, CALL_SIZE);
        depth = stack_of(p, CALL_SIZE, ips, MTRACE_MAX_DEPTH, NULL);
        int ok = depth >= 3 && inside(ips[0], callback) && in_object(ips[1], path) &&
                 inside(ips[2], through_library);
        call_ok += ok;
        if (!ok && depth && call_ok + 3 > c)
            fprintf(stderr, "cycle %d: callback stack %#lx %#lx %#lx (depth %u)\n", c,
                    (unsigned long)ips[0], depth > 1 ? (unsigned long)ips[1] : 0ul,
                    depth > 2 ? (unsigned long)ips[2] : 0ul, depth);
        free(p);

        /* malloc inside the library: library, from_library. */
        uint32_t id = 0;
        p = from_library(lib_malloc, LIB_SIZE);
        depth = stack_of(p, LIB_SIZE, ips, MTRACE_MAX_DEPTH, &id);
        lib_ok += depth >= 2 && in_object(ips[0], path) && inside(ips[1], from_library);
        if (c % KEEP_EVERY == 0 && depth >= 1)
            kept[n_kept++] = (struct kept){p, id, ips[0], base};
        else
            free(p);

        CHECK_EQ(dlclose(h), 0);
        /* The destructor freed its block (musl: both libraries' stay). */
        gone_ok += query_olds(api, &f, ctor, 4) == (UNLOADS ? 0 : c == 0 ? 1u : 2u);
    }
    double t1 = now_s();
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    printf("%d dlopen/dlclose cycles of two libraries, %d loaded where the other had been: "
           "%.2f s\n",
           CYCLES, reused, t1 - t0);
    CHECK_EQ(ctor_ok, UNLOADS ? CYCLES : 1);
    CHECK_EQ(call_ok, CYCLES);
    CHECK_EQ(lib_ok, CYCLES);
    CHECK_EQ(gone_ok, CYCLES);
    if (reused == 0)
        printf("note: the loader never reused an address, so stale rules were not put to the "
               "test\n");

    /* Stacks into unloaded code: read, queried, named, without a crash. */
    int readable = 0, unnamed = 0;
    for (int i = 0; i < n_kept; i++) {
        uintptr_t ips[MTRACE_MAX_DEPTH];
        uint32_t depth = api->stack(kept[i].stack_id, ips, MTRACE_MAX_DEPTH);
        readable += depth >= 2 && ips[0] == kept[i].lib_ip;
        Dl_info info;
        int mapped = dladdr((void *)ips[0], &info) != 0;
        struct mt_frame_info names[MT_SYM_MAX_FRAMES];
        int got = mt_symbols_resolve(ips[0], 0, names, MT_SYM_MAX_FRAMES);
        unnamed +=
            !mapped && got >= 1 && names[got - 1].lib[0] == 0 && names[got - 1].symbol[0] == 0;
    }
    CHECK_EQ(readable, n_kept);
    CHECK_EQ(unnamed, UNLOADS ? n_kept : 0);
    /* Each kept stack went through code unloaded since, and each load's is
     * a stack of its own, though the next library at that address has the
     * same return addresses: else its frames would be named after it. */
    int said_gone = 0, shared = 0;
    for (int i = 0; i < n_kept; i++) {
        said_gone += api->unloaded_since(api->stack_epoch(kept[i].stack_id), kept[i].lib_ip) == 1;
        for (int j = 0; j < i; j++)
            shared += kept[j].stack_id == kept[i].stack_id;
    }
    CHECK_EQ(said_gone, UNLOADS ? n_kept : 0);
    if (UNLOADS)
        CHECK_EQ(shared, 0);
    struct mtrace_alloc olds[64];
    struct mtrace_query lf = sized_query(LIB_SIZE, LIB_SIZE);
    CHECK_EQ(query_olds(api, &lf, olds, 64), n_kept);
    struct mtrace_site sites[8], total;
    size_t ns = query_sites(api, &lf, sites, 8, MTRACE_BY_COUNT, &total);
    CHECK(ns >= 1 && ns != SIZE_MAX);
    CHECK_EQ(total.count, n_kept);
    for (int i = 0; i < n_kept; i++)
        free(kept[i].block);
    CHECK_EQ(query_olds(api, &lf, olds, 64), 0);
    printf("%d blocks outlived %s; their stacks were read, queried and named\n", n_kept,
           UNLOADS ? "their library" : "dlclose (which left the library loaded)");
    if (UNLOADS)
        test_unload_without_snapshot(paths[0]);
    test_log_wrapped(paths[0]);
    test_generation_while_closing(paths[1]);
    test_unhooked_unload(argv[0], (const char(*)[4096])paths);
    return check_summary();
}
