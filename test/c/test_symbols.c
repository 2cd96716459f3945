/*
 * Tests for c_src/nif/symbols.c.
 *
 *   gcc -std=gnu11 -O2 -g -DMT_HAVE_LIBDW -Ic_src -Ic_src/nif test/c/test_symbols.c \
 *       c_src/nif/symbols.c c_src/nif/elf_symtab.c c_src/nif/demangle.c c_src/nif/dwarf_lines.c \
 *       c_src/nif/proc_maps.c \
 *       -ldw -lelf -ldl -lpthread -o test_symbols
 *   ./test_symbols [libsymbols_fixture.so | directory holding symbols_fixture.so]
 *
 * Without either, the fixture library is built from symbols_fixture.c next to this file with
 * `cc`; when that is not possible the tests that need it are skipped.  Built without
 * MT_HAVE_LIBDW, only names are checked (no file, line or inlined frames).
 */
#define _GNU_SOURCE
#include "symbols.h"
#include "objects_api.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            passed++;                                                                              \
        } else {                                                                                   \
            failed++;                                                                              \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                 \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

#ifdef MT_HAVE_LIBDW
static const int have_dwarf = 1;
#else
static const int have_dwarf = 0;
#endif

/* ---- code whose return addresses are resolved ------------------------------------------- */

/* noipa: a real call, so the return address lies inside the caller. */
static __attribute__((noipa)) void *capture(void) { return __builtin_return_address(0); }

static int target_line, inner_line, outer_line;

static __attribute__((noinline, noclone)) void *static_target(void) {
    target_line = __LINE__ + 1;
    void *ra = capture();
    __asm__ volatile("" ::: "memory"); /* keeps the call above from becoming a tail call */
    return ra;
}

static inline __attribute__((always_inline)) void *inlined_helper(void) {
    inner_line = __LINE__ + 1;
    void *ra = capture();
    __asm__ volatile("" ::: "memory");
    return ra;
}

static __attribute__((noinline, noclone)) void *inline_host(void) {
    outer_line = __LINE__ + 1;
    void *ra = inlined_helper();
    __asm__ volatile("" ::: "memory");
    return ra;
}

/* A C function under a C++ mangled name, to see demangling end to end. */
static void *mangled(void) __asm__("_ZN2mt7mangledEv");
static __attribute__((noinline, noclone, used)) void *mangled(void) {
    void *ra = capture();
    __asm__ volatile("" ::: "memory");
    return ra;
}

/* A function name of 1280 characters, longer than any text field. */
#define DOUBLE_(x) x##x
#define DOUBLE(x) DOUBLE_(x)
#define LONG_NAME                                                                                  \
    DOUBLE(DOUBLE(DOUBLE(DOUBLE(DOUBLE(DOUBLE(DOUBLE(long_name_))))))) /* 10 * 128                 \
                                                                        */
#define STR_(x) #x
#define STR(x) STR_(x)

static __attribute__((noinline, noclone)) void *LONG_NAME(void) {
    void *ra = capture();
    __asm__ volatile("" ::: "memory");
    return ra;
}

/* ---- helpers ----------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static struct mt_frame_info fr[MT_SYM_MAX_FRAMES];

static int resolve(void *addr, int demangle) {
    memset(fr, 0x5a, sizeof fr); /* so stale text cannot pass for an answer */
    return mt_symbols_resolve((uintptr_t)addr, demangle, fr, MT_SYM_MAX_FRAMES);
}

static void *libc_malloc(void) {
    /* Through libc's own handle: under ASan plain `malloc` is the sanitizer's. */
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void *fn = libc ? dlsym(libc, "malloc") : NULL;
    if (libc)
        dlclose(libc);
    return fn;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_static_function(void) {
    void *ra = static_target();
    int n = resolve(ra, 1);
    CHECK(n == 1, "n=%d", n);
    CHECK(strcmp(fr[0].symbol, "static_target") == 0, "symbol '%s'", fr[0].symbol);
    CHECK(fr[0].addr == (uintptr_t)ra, "addr");
    CHECK(fr[0].inlined == 0, "inlined=%d", fr[0].inlined);
    char exe[PATH_MAX] = "";
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = '\0';
    CHECK(strcmp(fr[0].lib, exe) == 0, "lib '%s', exe '%s'", fr[0].lib, exe);
    Dl_info di;
    if (dladdr(ra, &di))
        CHECK(fr[0].offset == (uintptr_t)ra - (uintptr_t)di.dli_fbase, "offset %#lx",
              (unsigned long)fr[0].offset);
    if (have_dwarf) {
        CHECK(ends_with(fr[0].file, "test_symbols.c"), "file '%s'", fr[0].file);
        CHECK(fr[0].line == target_line, "line %d, want %d", fr[0].line, target_line);
    }
    /* max = 1 and repeated (cached) answers are the same. */
    struct mt_frame_info one;
    CHECK(mt_symbols_resolve((uintptr_t)ra, 1, &one, 1) == 1, "max 1");
    CHECK(strcmp(one.symbol, "static_target") == 0 && one.line == fr[0].line, "cached '%s' %d",
          one.symbol, one.line);
    CHECK(mt_symbols_resolve((uintptr_t)ra, 1, &one, 0) == 0, "max 0 writes nothing");
}

static void test_inlined(void) {
    void *ra = inline_host();
    int n = resolve(ra, 0);
    if (!have_dwarf) {
        CHECK(n == 1 && strcmp(fr[0].symbol, "inline_host") == 0, "n=%d '%s'", n, fr[0].symbol);
        return;
    }
    CHECK(n == 2, "n=%d", n);
    CHECK(strcmp(fr[0].symbol, "inlined_helper") == 0, "inner '%s'", fr[0].symbol);
    CHECK(fr[0].inlined == 1, "inner inlined=%d", fr[0].inlined);
    CHECK(fr[0].line == inner_line, "inner line %d, want %d", fr[0].line, inner_line);
    CHECK(ends_with(fr[0].file, "test_symbols.c"), "inner file '%s'", fr[0].file);
    CHECK(strcmp(fr[1].symbol, "inline_host") == 0, "outer '%s'", fr[1].symbol);
    CHECK(fr[1].inlined == 0, "outer inlined=%d", fr[1].inlined);
    CHECK(fr[1].line == outer_line, "outer line %d, want %d", fr[1].line, outer_line);
    CHECK(ends_with(fr[1].file, "test_symbols.c"), "outer file '%s'", fr[1].file);
    /* With room for one entry only, that entry is the real function at the call site. */
    struct mt_frame_info one;
    n = mt_symbols_resolve((uintptr_t)ra, 0, &one, 1);
    CHECK(n == 1 && strcmp(one.symbol, "inline_host") == 0 && one.inlined == 0 &&
              one.line == outer_line,
          "n=%d '%s' inlined=%d line=%d", n, one.symbol, one.inlined, one.line);
}

static void test_long_name(void) {
    void *ra = LONG_NAME();
    resolve(ra, 1);
    const char *want = STR(LONG_NAME);
    CHECK(strlen(want) == 1280, "len %zu", strlen(want));
    CHECK(strlen(fr[0].symbol) == MT_SYM_TEXT - 1, "truncated to %zu", strlen(fr[0].symbol));
    CHECK(strncmp(fr[0].symbol, want, MT_SYM_TEXT - 1) == 0, "prefix");
}

static void test_libc(void) {
    void *fn = libc_malloc();
    CHECK(fn != NULL, "malloc in libc.so.6");
    if (!fn)
        return;
    int n = resolve((char *)fn + 5, 1);
    CHECK(n >= 1, "n=%d", n);
#ifdef __GLIBC__
    CHECK(strstr(fr[n - 1].lib, "libc.so") != NULL, "lib '%s'", fr[n - 1].lib);
#else /* musl: libc is the dynamic loader */
    CHECK(strstr(fr[n - 1].lib, "ld-musl") != NULL, "lib '%s'", fr[n - 1].lib);
#endif
    CHECK(strcmp(fr[n - 1].symbol, "malloc") == 0, "symbol '%s'", fr[n - 1].symbol);
}

static void test_unknown(void) {
    int n = resolve((void *)0x10, 1);
    CHECK(n == 1, "n=%d", n);
    CHECK(fr[0].lib[0] == '\0' && fr[0].symbol[0] == '\0' && fr[0].file[0] == '\0',
          "lib '%s' symbol '%s'", fr[0].lib, fr[0].symbol);
    CHECK(fr[0].line == 0 && fr[0].inlined == 0 && fr[0].offset == 0 && fr[0].addr == 0x10,
          "fields");
    n = resolve(NULL, 1);
    CHECK(n == 1 && fr[0].symbol[0] == '\0', "address 0");
    n = resolve((void *)UINTPTR_MAX, 1);
    CHECK(n == 1 && fr[0].lib[0] == '\0', "address ~0");
}

static void test_demangle(void) {
    char buf[256];
    int rc = mt_demangle("_ZN3foo3barEv", buf, sizeof buf);
    void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    int available = dlsym(RTLD_DEFAULT, "__cxa_demangle") || (h && dlsym(h, "__cxa_demangle"));
    if (h)
        dlclose(h);
    if (!available) {
        printf("skip: no __cxa_demangle (libstdc++ not loadable)\n");
        CHECK(rc == -1 && strcmp(buf, "_ZN3foo3barEv") == 0, "unchanged '%s'", buf);
        return;
    }
    CHECK(rc == 0 && strcmp(buf, "foo::bar()") == 0, "rc=%d '%s'", rc, buf);
    void *ra = mangled();
    resolve(ra, 1);
    CHECK(strcmp(fr[0].symbol, "mt::mangled()") == 0, "resolved demangled '%s'", fr[0].symbol);
    resolve(ra, 0);
    CHECK(strcmp(fr[0].symbol, "_ZN2mt7mangledEv") == 0, "resolved raw '%s'", fr[0].symbol);
    rc = mt_demangle("_ZN3foo3barEv", buf, 5);
    CHECK(rc == 0 && strcmp(buf, "foo:") == 0, "truncated '%s'", buf);
    rc = mt_demangle("malloc", buf, sizeof buf);
    CHECK(rc == -1 && strcmp(buf, "malloc") == 0, "plain name rc=%d '%s'", rc, buf);
    rc = mt_demangle("_Znot a name", buf, sizeof buf);
    CHECK(rc == -1 && strcmp(buf, "_Znot a name") == 0, "bad name rc=%d '%s'", rc, buf);
    CHECK(mt_demangle(NULL, buf, sizeof buf) == -1 && buf[0] == '\0', "NULL name");
}

/* The fixture library: a static function by name, then nothing once it is unloaded. */
static void test_dlclose(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen %s: %s", lib, dlerror());
    if (!h)
        return;
    void *(*entry)(int *) = (void *(*)(int *))dlsym(h, "mt_fixture_entry");
    CHECK(entry != NULL, "mt_fixture_entry");
    if (!entry) {
        dlclose(h);
        return;
    }
    int line = 0;
    void *ra = entry(&line);
    int n = resolve(ra, 1);
    CHECK(n == 1, "n=%d", n);
    CHECK(strcmp(fr[0].symbol, "fx_hidden") == 0, "symbol '%s'", fr[0].symbol);
    CHECK(strstr(fr[0].lib, "symbols_fixture") != NULL, "lib '%s'", fr[0].lib);
    if (have_dwarf) {
        CHECK(ends_with(fr[0].file, "symbols_fixture.c"), "file '%s'", fr[0].file);
        CHECK(fr[0].line == line, "line %d, want %d", fr[0].line, line);
    }
    dlclose(h);
    Dl_info di;
    if (dladdr(ra, &di)) {
        printf("skip: %s stayed loaded after dlclose\n", lib);
        return;
    }
    n = resolve(ra, 1);
    CHECK(n == 1 && fr[0].lib[0] == '\0' && fr[0].symbol[0] == '\0', "after dlclose: '%s' '%s'",
          fr[0].lib, fr[0].symbol);
}

/* ---- threads ----------------------------------------------------------------------------- */

/* libc is left out here: reloading its (compressed) debug info after each flush
 * takes seconds under ASan; its names are checked single-threaded above. */
#define NADDR 4

struct expect {
    void *addr;
    int n, line;
    char symbol[MT_SYM_TEXT], lib[MT_SYM_TEXT];
};

static struct expect expected[NADDR];
static atomic_int stop;
static const char *fixture_lib;

static void *resolver(void *arg) {
    long bad = 0;
    struct mt_frame_info f[MT_SYM_MAX_FRAMES];
    for (int it = 0; it < 2000; it++) {
        const struct expect *e = &expected[it % NADDR];
        int n = mt_symbols_resolve((uintptr_t)e->addr, 1, f, MT_SYM_MAX_FRAMES);
        if (n != e->n || strcmp(f[n - 1].symbol, e->symbol) || strcmp(f[n - 1].lib, e->lib) ||
            f[n - 1].line != e->line)
            bad++;
    }
    *(long *)arg = bad;
    return NULL;
}

/* Forces rebuilds while the resolvers run: a few full flushes (each makes every
 * object reload, libc's debug info included, so more would only slow the test),
 * then loads and unloads of a library until the resolvers are done. */
static void *churner(void *arg) {
    (void)arg;
    for (int round = 0; !stop; round++) {
        if (round < 3)
            mt_symbols_flush();
        if (fixture_lib) {
            void *h = dlopen(fixture_lib, RTLD_NOW | RTLD_LOCAL);
            if (h)
                dlclose(h);
        }
        usleep(2000);
    }
    return NULL;
}

static void test_threads(void) {
    void *addrs[NADDR] = {static_target(), inline_host(), (void *)0x10, LONG_NAME()};
    for (int i = 0; i < NADDR; i++) {
        struct expect *e = &expected[i];
        e->addr = addrs[i];
        e->n = resolve(addrs[i], 1);
        strcpy(e->symbol, fr[e->n - 1].symbol);
        strcpy(e->lib, fr[e->n - 1].lib);
        e->line = fr[e->n - 1].line;
    }
    pthread_t th[4], churn;
    long bad[4] = {0};
    stop = 0;
    pthread_create(&churn, NULL, churner, NULL);
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, resolver, &bad[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    stop = 1;
    pthread_join(churn, NULL);
    for (int i = 0; i < 4; i++)
        CHECK(bad[i] == 0, "thread %d: %ld inconsistent answers", i, bad[i]);
}

/* ---- timing (printed, not asserted) ------------------------------------------------------ */

static void timing(void) {
    void *addrs[] = {static_target(), inline_host(), (char *)libc_malloc() + 5, LONG_NAME()};
    enum { N = sizeof addrs / sizeof addrs[0] };
    struct mt_frame_info f[MT_SYM_MAX_FRAMES];

    /* First use of an object reads its symbol table and opens its DWARF. */
    mt_symbols_flush();
    double first[N];
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        mt_symbols_resolve((uintptr_t)addrs[i], 1, f, MT_SYM_MAX_FRAMES);
        first[i] = now_ns() - t0;
    }

    /* New addresses in objects already loaded: the per-address work without the table loads. */
    enum { M = 400 };
    double t0 = now_ns();
    for (int i = 0; i < M; i++)
        mt_symbols_resolve((uintptr_t)addrs[i % 2] - 1 - (uintptr_t)(i / 2), 1, f,
                           MT_SYM_MAX_FRAMES);
    double cold = (now_ns() - t0) / M;

    enum { W = 200000 };
    t0 = now_ns();
    for (int i = 0; i < W; i++)
        mt_symbols_resolve((uintptr_t)addrs[i % N], 1, f, MT_SYM_MAX_FRAMES);
    double warm = (now_ns() - t0) / W;
    printf("timing: first use of this executable %.0f us, of libc %.0f us; new address %.0f "
           "ns/frame; warm %.0f ns/frame\n",
           first[0] / 1e3, first[2] / 1e3, cold, warm);
}

/* ---- main -------------------------------------------------------------------------------- */

static int fixture_built;

/* The fixture library: argv[1], or symbols_fixture.so in the directory argv[1], or else built
 * next to this source with cc into a temporary directory. */
static const char *fixture(int argc, char **argv, char *buf, size_t len, char *dir) {
    struct stat sb;
    if (argc > 1 && stat(argv[1], &sb) == 0 && !S_ISDIR(sb.st_mode))
        return argv[1];
    if (argc > 1 && (size_t)snprintf(buf, len, "%s/symbols_fixture.so", argv[1]) < len &&
        access(buf, R_OK) == 0)
        return buf;
    char here[PATH_MAX], src[PATH_MAX + 32];
    snprintf(here, sizeof here, "%s", __FILE__);
    snprintf(src, sizeof src, "%s/symbols_fixture.c", dirname(here));
    if (access(src, R_OK) != 0 || !mkdtemp(dir)) {
        printf("skip: no fixture library (give its path as argument)\n");
        return NULL;
    }
    snprintf(buf, len, "%s/libsymbols_fixture.so", dir);
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -g -O2 -o '%s' '%s'", buf, src);
    fixture_built = 1;
    if (system(cmd) != 0) {
        printf("skip: could not build the fixture library: %s\n", cmd);
        return NULL;
    }
    return buf;
}

int main(int argc, char **argv) {
    mt_symbols_use(&objects_only);
    char lib[PATH_MAX], dir[] = "/tmp/mt_symbols_XXXXXX";
    fixture_lib = fixture(argc, argv, lib, sizeof lib, dir);
    if (fixture_lib)
        printf("fixture library: %s\n", fixture_lib);

    test_static_function();
    test_inlined();
    test_long_name();
    test_libc();
    test_unknown();
    test_demangle();
    if (fixture_lib)
        test_dlclose(fixture_lib);
    test_threads();
    timing();
    mt_symbols_flush();

    if (fixture_built) {
        unlink(lib);
        rmdir(dir);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
