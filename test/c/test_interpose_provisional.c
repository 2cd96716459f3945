/* A configuration made before the environment can be read.  glibc runs
 * DT_PREINIT_ARRAY before __environ is set, so the preload's first call
 * there configures provisionally, with the defaults: beam.smp traced,
 * lossless.  The constructor then reads MTRACE_SAMPLE_BYTES; the blocks
 * recorded meanwhile weighed nothing in the estimates, and their frees must
 * not take off weights never added (the estimates wrapped to 2^64 - n).
 * So this program starts a copy of itself named beam.smp, with sampling on
 * and MTRACE_PROGRAMS unset, and that copy frees its preinit blocks. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"

#define EARLY_N 64
static void *early[EARLY_N]; /* not malloc'ed: invisible to the estimates */

static void preinit(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    for (int i = 0; i < EARLY_N; i++)
        early[i] = malloc(16);
}
__attribute__((section(".preinit_array"),
               used)) static void (*const run_preinit)(int, char **, char **) = preinit;

#ifndef __GLIBC__
int main(void) {
    printf("skipped: this C library runs no DT_PREINIT_ARRAY\n");
    return check_summary();
}
#else
/* In the copy named beam.smp. */
static int as_beam(void) {
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api || api->size < sizeof *api)
        return check_summary();
    struct mtrace_stats s0, s1;
    api->stats(&s0, sizeof s0);
    CHECK_EQ(s0.active, 1);
    CHECK_EQ(s0.sample_bytes, 4096);
    /* The preinit blocks were recorded under the provisional configuration
     * and forgotten when the real one came: a reset, said as one. */
    CHECK(s0.reset_ms != 0);
    for (int i = 0; i < EARLY_N; i++)
        free(early[i]);
    api->stats(&s1, sizeof s1);
    CHECK(s1.est_live_count <= s0.est_live_count);
    CHECK(s1.est_live_bytes <= s0.est_live_bytes);
    return check_summary();
}

/* Copies this program to dir/beam.smp. */
static int copy_self(const char *to) {
    int in = open("/proc/self/exe", O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_EXCL, 0700);
    char buf[65536];
    ssize_t n = 0;
    while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            n = -1;
    int ok = in >= 0 && out >= 0 && n == 0;
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return ok;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "beam"))
        return as_beam();
    for (int i = 0; i < EARLY_N; i++)
        free(early[i]);
    char dir[] = "/tmp/mtrace-provisional-XXXXXX", beam[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(beam, sizeof beam, "%s/beam.smp", dir);
    CHECK(copy_self(beam));
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("MTRACE_PROGRAMS");
        setenv("MTRACE_SAMPLE_BYTES", "4096", 1);
        const char *emulator = check_emulator();
        if (emulator)
            execlp(emulator, emulator, beam, "beam", (char *)NULL);
        else
            execl(beam, beam, "beam", (char *)NULL);
        _exit(126);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    unlink(beam);
    rmdir(dir);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    return check_summary();
}
#endif
