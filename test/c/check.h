/* A minimal test harness: CHECK records a failure and goes on, so one run
 * reports every broken assertion; the summary line is "N passed, M failed". */
#ifndef MT_CHECK_H
#define MT_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int checks_passed, checks_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            checks_passed++;                                                                       \
        } else {                                                                                   \
            checks_failed++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                      \
        if (va_ == vb_) {                                                                          \
            checks_passed++;                                                                       \
        } else {                                                                                   \
            checks_failed++;                                                                       \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s = %lld, %s = %lld\n", __FILE__, __LINE__,  \
                    #a, va_, #b, vb_);                                                             \
        }                                                                                          \
    } while (0)

/* The user-mode emulator the tests run under (test/c/run.sh --emulator sets
 * MTRACE_TEST_EMULATOR for a cross build), or NULL when they run natively. */
static inline const char *check_emulator(void) {
    const char *e = getenv("MTRACE_TEST_EMULATOR");
    return e && *e ? e : NULL;
}

/* 1 when MTRACE_STRESS=1 asks for the longer variants of the tests. */
static inline int check_stress(void) {
    const char *s = getenv("MTRACE_STRESS");
    return s && !strcmp(s, "1");
}

/* A test's count of rounds: n, ten times n under MTRACE_STRESS=1, and
 * divided by emulator_div under an emulator (said on stdout), where each
 * round takes many times as long. */
static inline long check_rounds(long n, long emulator_div, const char *what) {
    if (check_stress())
        n *= 10;
    if (check_emulator() && emulator_div > 1) {
        n /= emulator_div;
        printf("note: %ld %s under %s\n", n, what, check_emulator());
    }
    return n;
}

/* Starts this program again with args (args[0] its name); returns only if
 * that failed.  Under an emulator it is started through the emulator: without
 * binfmt_misc the kernel cannot start a foreign executable by itself. */
static inline void check_exec_self(char **args) {
    const char *emulator = check_emulator();
    if (!emulator) {
        execv("/proc/self/exe", args);
        return;
    }
    char self[4096], *argv[16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1); /* the emulated program */
    if (n <= 0)
        return;
    self[n] = 0;
    int k = 0;
    argv[k++] = (char *)emulator;
    argv[k++] = self;
    for (int i = 1; args[i] && k < 15; i++)
        argv[k++] = args[i];
    argv[k] = NULL;
    execvp(emulator, argv);
}

/* Starts this program (argv0) again with argument mode, tracked by the
 * preload or not (another MTRACE_PROGRAMS), with the preload or without;
 * exits 126 if that failed. */
static inline void check_restart(char *argv0, const char *mode, int keep_programs,
                                 int keep_preload) {
    if (!keep_programs)
        setenv("MTRACE_PROGRAMS", "some-other-program", 1);
    if (!keep_preload)
        unsetenv("LD_PRELOAD");
    char *args[] = {argv0, (char *)mode, NULL};
    check_exec_self(args);
    _exit(126);
}

/* Runs this program (argv0) again with argument mode in a child, with the
 * environment as it is now; 1 when that child exited 0. */
static inline int check_child(char *argv0, const char *mode) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char *args[] = {argv0, (char *)mode, NULL};
        check_exec_self(args);
        _exit(126);
    }
    int status = 0;
    int ok =
        pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok)
        fprintf(stderr, "the run with %s failed (status %d)\n", mode, status);
    return ok;
}

/* A line of /proc/self/status (VmRSS, VmSize, ...), in KiB; -1 if absent. */
static inline long check_status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t len = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, len) && line[len] == ':')
            v = strtol(line + len + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static inline int check_summary(void) {
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed ? 1 : 0;
}

#endif
