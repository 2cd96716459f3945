/*
 * Cost of mt_symbols_resolve() (c_src/nif/symbols.c), the symbolizer behind the NIF's reports.
 *
 *   cc -std=gnu11 -O2 -g -DMT_HAVE_LIBDW -Ic_src -Ic_src/nif -o symbols_bench \
 *       bench/symbols_bench.c c_src/nif/symbols.c c_src/nif/elf_symtab.c c_src/nif/demangle.c \
 *       c_src/nif/dwarf_lines.c -ldw -lelf -ldl -lpthread
 *   ./symbols_bench
 *
 * Addresses: the return addresses of 100 call sites in this program, and 16 bytes into each of
 * ~100 libc functions and a few libdw/libelf ones (found with dlsym), so a few hundred distinct
 * addresses in several objects.  No preload is needed.
 *
 * Cold: every address resolved once in this fresh process, each call timed on its own.  The
 * first call scans the loaded objects; the first call with demangling on may dlopen libstdc++
 * (and so rescan); the first address of each object reads its ELF symbol table and opens its
 * DWARF (the object's own or /usr/lib/debug/.build-id); later new addresses in that object pay
 * for the symbol search and the DWARF lookup (libdw parses each compilation unit on first use).
 * Warm: the same addresses again, answered from the per-object caches; the median of 11 passes.
 * Those caches are direct-mapped, so a few addresses that share a slot are resolved afresh on
 * every pass; which ones depends on where objects are loaded, so the warm figure varies from run
 * to run.  One more pass, each call timed, counts the calls slower than 5 µs.
 * "Frame" in the output means one return address, whatever number of inlined entries it yields.
 * Prints markdown table rows; nothing here is asserted.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "symbols.h"
#include "../test/c/objects_api.h"

#define MAX_ADDRS 512
#define MAX_OBJS 16
#define WARM_PASSES 11

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Called through a volatile pointer, so it is a real call and its return address lies inside
 * the calling site. */
static __attribute__((noinline)) void *capture(void) { return __builtin_return_address(0); }
static void *(*volatile capture_fn)(void) = capture;

// clang-format off
#define SITE(k)                                                                                    \
    static __attribute__((noinline)) void *site_##k(void) {                                        \
        void *ra = capture_fn();                                                                   \
        __asm__ __volatile__("" ::: "memory");                                                     \
        return ra;                                                                                 \
    }
// clang-format on
#include "hundred_sites.h"
static void *(*sites[])(void) = {HUNDRED_SITES};

static const char *const lib_names[] = {
    /* libc */
    "malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc", "memcpy", "memmove",
    "memset", "memcmp", "memchr", "strlen", "strnlen", "strcmp", "strncmp", "strcpy", "strncpy",
    "strcat", "strchr", "strrchr", "strstr", "strdup", "strndup", "strtok_r", "strtol", "strtoul",
    "strtoll", "strtoull", "strtod", "atoi", "qsort", "bsearch", "printf", "fprintf", "sprintf",
    "snprintf", "vsnprintf", "sscanf", "puts", "fputs", "fwrite", "fread", "fopen", "fclose",
    "fflush", "fgets", "getline", "open", "close", "read", "write", "pread", "pwrite", "lseek",
    "stat", "fstat", "mmap", "munmap", "mprotect", "madvise", "brk", "sbrk", "getpid", "gettid",
    "getenv", "setenv", "clock_gettime", "gettimeofday", "time", "localtime_r", "strftime",
    "nanosleep", "usleep", "sched_yield", "pthread_create", "pthread_join", "pthread_mutex_lock",
    "pthread_mutex_unlock", "pthread_cond_wait", "pthread_cond_signal", "pthread_once",
    "pthread_rwlock_rdlock", "pthread_key_create", "pthread_getspecific", "dlopen", "dlsym",
    "dladdr", "dl_iterate_phdr", "socket", "connect", "accept", "send", "recv", "poll",
    "epoll_wait", "select", "fork", "execve", "waitpid", "kill", "sigaction", "raise", "abort",
    "exit", "atexit", "backtrace", "readlink", "realpath", "opendir", "readdir", "closedir",
    "mkdir", "unlink", "rename", "isatty", "sysconf", "getrlimit", "setlocale", "strerror",
    "perror", "rand", "srand", "random",
    /* libdw / libelf, linked with DW_LIBS */
    "dwarf_begin_elf", "dwarf_end", "dwarf_addrdie", "dwarf_getscopes", "dwarf_getsrc_die",
    "dwarf_lineno", "dwarf_linesrc", "dwarf_diename", "dwarf_tag", "dwarf_attr", "elf_begin",
    "elf_end", "elf_version", "elf_nextscn", "elf_getdata", "elf_strptr", "gelf_getshdr",
    "gelf_getsym"};

struct obj {
    char lib[MT_SYM_TEXT];
    double first_s; /* the first address in this object */
    double rest_s;  /* all its other addresses */
    int rest;       /* how many other addresses */
    int with_line;  /* addresses whose outermost frame has a source line */
};

static const char *base(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    mt_symbols_use(&objects_only);
    static uintptr_t addrs[MAX_ADDRS];
    static struct mt_frame_info fr[MT_SYM_MAX_FRAMES];
    static struct obj objs[MAX_OBJS];
    int n = 0, nobj = 0, total_frames = 0;

    for (size_t i = 0; i < sizeof sites / sizeof *sites; i++)
        addrs[n++] = (uintptr_t)sites[i]();
    for (size_t i = 0; i < sizeof lib_names / sizeof *lib_names && n < MAX_ADDRS; i++) {
        void *f = dlsym(RTLD_DEFAULT, lib_names[i]);
        uintptr_t a = (uintptr_t)f + 16;
        int dup = !f;
        for (int j = 0; j < n && !dup; j++)
            dup = addrs[j] == a; /* aliases */
        if (!dup)
            addrs[n++] = a;
    }

    /* Address 0 is in no object: the call only pays for the scan of the loaded objects. */
    double t0 = now_s();
    mt_symbols_resolve(0, 0, fr, MT_SYM_MAX_FRAMES);
    double scan_s = now_s() - t0;
    t0 = now_s();
    mt_symbols_resolve(0, 1, fr, MT_SYM_MAX_FRAMES);
    double demangle_s = now_s() - t0;

    for (int i = 0; i < n; i++) {
        t0 = now_s();
        int k = mt_symbols_resolve(addrs[i], 1, fr, MT_SYM_MAX_FRAMES);
        double d = now_s() - t0;
        const struct mt_frame_info *outer = &fr[k - 1];
        int o = 0;
        while (o < nobj && strcmp(objs[o].lib, outer->lib))
            o++;
        if (o == nobj) {
            if (nobj == MAX_OBJS)
                continue;
            snprintf(objs[nobj].lib, sizeof objs[nobj].lib, "%s", outer->lib);
            objs[nobj++].first_s = d;
        } else {
            objs[o].rest_s += d;
            objs[o].rest++;
        }
        objs[o].with_line += outer->line > 0;
        total_frames += k;
    }

    double warm[WARM_PASSES];
    for (int p = 0; p < WARM_PASSES; p++) {
        t0 = now_s();
        for (int i = 0; i < n; i++)
            mt_symbols_resolve(addrs[i], 1, fr, MT_SYM_MAX_FRAMES);
        warm[p] = now_s() - t0;
    }
    qsort(warm, WARM_PASSES, sizeof *warm, cmp_double);
    int slow = 0;
    for (int i = 0; i < n; i++) {
        t0 = now_s();
        mt_symbols_resolve(addrs[i], 1, fr, MT_SYM_MAX_FRAMES);
        slow += now_s() - t0 > 5e-6;
    }

    printf("| symbolization: return addresses / entries with inlined frames | %d / %d |\n", n,
           total_frames);
    printf("| symbolization, cold: first call (scan of loaded objects) | %.0f µs |\n",
           scan_s * 1e6);
    printf("| symbolization, cold: first call with demangling (may dlopen libstdc++) | %.0f µs |\n",
           demangle_s * 1e6);
    for (int o = 0; o < nobj; o++) {
        const struct obj *b = &objs[o];
        const char *what = b->with_line ? "names + lines" : "names only";
        printf("| symbolization, cold: first address in %s (%s) | %.2f ms |\n",
               b->lib[0] ? base(b->lib) : "(no object)", what, b->first_s * 1e3);
        if (b->rest >= 3)
            printf("| symbolization, cold: new address in %s, object loaded (%d of them) | %.1f "
                   "µs/frame |\n",
                   b->lib[0] ? base(b->lib) : "(no object)", b->rest, b->rest_s * 1e6 / b->rest);
    }
    printf("| symbolization, warm (median of %d passes) | %.2f µs/frame |\n", WARM_PASSES,
           warm[WARM_PASSES / 2] * 1e6 / n);
    printf("| symbolization, warm: calls over 5 µs (slot shared, resolved again) | %d of %d |\n",
           slow, n);
    return 0;
}
