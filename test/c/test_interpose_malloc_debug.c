/* glibc's own malloc debugging library (libc_malloc_debug.so.0, preloaded
 * for MALLOC_CHECK_, mcheck and mtrace() since glibc 2.34) preloaded beside
 * this one, in either order: every function of the malloc family reaches
 * what it reaches without this library.  The debugging library defines the
 * family only under a version a plain dlsym passes over; this library's
 * strdup, took glibc's malloc for a block the program then freed through the
 * debugging library's free (an abort under MALLOC_CHECK_=3), and its hooks
 * skipped the debugging library (its checks silently off). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define DEBUG_LIB "libc_malloc_debug.so.0"

/* The children's work, one per mode. */
static int child(const char *mode) {
    if (!strcmp(mode, "probe")) /* whether the loader found the library */
        return dlopen(DEBUG_LIB, RTLD_LAZY | RTLD_NOLOAD) ? 0 : 77;
    if (!strcmp(mode, "dup")) { /* blocks of this library's strdup, freed by the program */
        for (int i = 0; i < 100; i++) {
            char *a = strdup("a string the debugging library must own");
            char *b = strndup("and another one", 7);
            if (!a || !b)
                return 2;
            free(a);
            free(b);
        }
        return 0;
    }
    if (!strcmp(mode, "overrun")) { /* one byte past a block: MALLOC_CHECK_ aborts at free */
        volatile size_t n = 24;
        char *p = malloc(n);
        if (!p)
            return 2;
        memset(p, 1, n + 1);
        free(p);
        printf("the overrun was not detected\n");
        return 1;
    }
    return 3;
}

/* Runs this program again in mode with LD_PRELOAD preload and
 * MALLOC_CHECK_=3; returns its wait status. */
static int run(const char *mode, const char *preload) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("LD_PRELOAD", preload, 1);
        setenv("MALLOC_CHECK_", "3", 1);
        char *args[] = {"test_interpose_malloc_debug", "-", (char *)mode, NULL};
        check_exec_self(args);
        _exit(126);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    return status;
}

int main(int argc, char **argv) {
    if (argc > 2)
        return child(argv[2]);
#if !defined(__GLIBC__)
    printf("skipped: glibc's malloc debugging library exists on glibc only\n");
    return 0;
#endif
    if (check_emulator()) {
        printf("skipped: the emulated loader's LD_PRELOAD is not the program's\n");
        return 0;
    }
    const char *self = getenv("LD_PRELOAD");
    if (!self || !strstr(self, "mtrace.so")) {
        printf("skipped: run with the preload (test/c/run.sh)\n");
        return 0;
    }
    int probe = run("probe", DEBUG_LIB);
    if (!WIFEXITED(probe) || WEXITSTATUS(probe) != 0) {
        printf("skipped: %s is not installed (glibc older than 2.34?)\n", DEBUG_LIB);
        return 0;
    }
    char before[4096], after[4096];
    snprintf(before, sizeof before, "%s %s", DEBUG_LIB, self);
    snprintf(after, sizeof after, "%s %s", self, DEBUG_LIB);

    /* without this library, as it must be with it in either place */
    int s = run("dup", DEBUG_LIB);
    CHECK(WIFEXITED(s) && WEXITSTATUS(s) == 0);
    s = run("overrun", DEBUG_LIB);
    CHECK(WIFSIGNALED(s) && WTERMSIG(s) == SIGABRT);

    s = run("dup", before);
    CHECK(WIFEXITED(s) && WEXITSTATUS(s) == 0);
    s = run("dup", after);
    CHECK(WIFEXITED(s) && WEXITSTATUS(s) == 0);
    s = run("overrun", after);
    CHECK(WIFSIGNALED(s) && WTERMSIG(s) == SIGABRT);
    return check_summary();
}
