/* A traced program that closes every file descriptor above 2 and opens
 * its own (a daemon's start) keeps its files to itself: libunwind, which
 * walks the stacks the fast walker gives up on (here: a frame realigned by
 * a DWARF expression), checked reads it could not trust through a pipe it
 * opened as it started, by fd number, and so took a byte of the program's
 * input and wrote one into its output.  The program's own pipe, at those
 * numbers, must hold exactly what the program wrote into it.  Run as is
 * and again with MTRACE_UNWIND=libunwind (every stack walked by libunwind). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dlfcn.h>

#include "check.h"
#include "mtrace_api.h"
#include "queries.h"

#define TEXT "abcdefghijklmnopqrstuvwxyz"

__attribute__((noinline)) static void *deep(int n) {
    if (n) {
        void *p = deep(n - 1);
        __asm__ volatile("" ::: "memory");
        return p;
    }
    return malloc(32);
}

/* A 64-byte aligned local and a variable-length one: the frame's CFA is a
 * DWARF expression on x86-64, which the fast walker hands to libunwind. */
__attribute__((noinline)) static void *realigned(int n) {
    char buf[64] __attribute__((aligned(64)));
    char *v = __builtin_alloca((size_t)n + 1);
    memset(buf, n, sizeof buf);
    v[0] = 1;
    __asm__ volatile("" : : "r"(buf), "r"(v) : "memory");
    return deep(n);
}

static void close_above_stderr(void) {
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0)
        return;
#endif
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
}

static int run(const char *mode) {
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    struct mtrace_stats before;
    api->stats(&before, sizeof before);
    if (!before.libunwind_loaded) {
        printf("skipped: libunwind not loaded (not installed, or a build without it)\n");
        return check_summary();
    }

    close_above_stderr();
    int p[2];
    CHECK_EQ(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0); /* the copy below starts without it */
    CHECK_EQ(p[0], 3);                             /* where libunwind's pipe was */
    CHECK_EQ(p[1], 4);
    CHECK_EQ(write(p[1], TEXT, strlen(TEXT)), (long)strlen(TEXT));

    for (int i = 0; i < 2000; i++)
        free(realigned(i % 7));

    struct mtrace_stats after;
    api->stats(&after, sizeof after);
#if defined(__x86_64__)
    CHECK(after.unwind_fallbacks > before.unwind_fallbacks || !after.fast_unwind);
#endif
    /* and the walks through libunwind still name the program's frames */
    void *q = realigned(5);
    CHECK(block_depth(api, q, 32, 16) >= 7);
    free(q);

    char got[64] = {0};
    ssize_t n = read(p[0], got, sizeof got);
    CHECK_EQ(n, (long)strlen(TEXT));
    CHECK(n > 0 && !memcmp(got, TEXT, strlen(TEXT)));
    if (n != (ssize_t)strlen(TEXT))
        printf("the pipe held %zd bytes: \"%.*s\"\n", n, n > 0 ? (int)n : 0, got);
    printf("%s: the program's pipe at fds 3 and 4 holds what it wrote, %llu stacks "
           "walked by libunwind\n",
           mode, (unsigned long long)(after.unwind_fallbacks - before.unwind_fallbacks));
    return check_summary();
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "libunwind"))
        return run("MTRACE_UNWIND=libunwind");
    int failed = run("fast walker, libunwind behind") != 0;
    /* again, every stack walked by libunwind (a fresh process: the walker
     * is chosen as the preload starts) */
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || check_emulator())
        return failed;
    self[len] = 0;
    pid_t pid = fork();
    if (pid == 0) {
        setenv("MTRACE_UNWIND", "libunwind", 1);
        execl(self, self, "libunwind", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return failed || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
