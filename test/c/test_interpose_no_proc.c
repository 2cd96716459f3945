/* Without /proc (a chroot, a sandbox) the preload cannot read the program's
 * name from /proc/self/exe.  It takes the path execve was given instead, so
 * a listed program is still traced; and the failed readlink does not leave
 * its ENOENT behind: main starts with errno 0, as C promises, and a malloc
 * that succeeds leaves errno alone, traced or not.  The copies of this
 * program that check it run in a mount namespace of their own with an empty
 * /proc (skipped where no namespace can be made, or under an emulator,
 * which needs /proc itself). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"

static int errno_at_main = -1;

static int without_proc(int traced) {
    CHECK_EQ(errno_at_main, 0);
    CHECK_EQ(access("/proc/self/exe", F_OK), -1); /* the case this is about */
    errno = 1234;
    void *p = malloc(100);
    CHECK(p != NULL);
    CHECK_EQ(errno, 1234);
    free(p);
    CHECK_EQ(errno, 1234);
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (api) {
        struct mtrace_stats s;
        api->stats(&s, sizeof s);
        CHECK_EQ(s.active, (unsigned)traced);
    }
    return check_summary();
}

/* Runs self in a mount namespace with an empty /proc, traced or not.
 * Returns its exit status, or -1 when no namespace could be made. */
static int run_without_proc(const char *self, int traced) {
    int pipefd[2];
    CHECK_EQ(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        int ok = unshare(CLONE_NEWNS) == 0 &&
                 mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
                 mount("none", "/proc", "tmpfs", 0, NULL) == 0;
        if (write(pipefd[1], &ok, sizeof ok) != sizeof ok || !ok)
            _exit(0);
        close(pipefd[1]);
        setenv("MTRACE_PROGRAMS", traced ? "test_interpose_no_proc" : "no-such-program", 1);
        execl(self, self, traced ? "traced" : "untraced", (char *)NULL);
        _exit(126);
    }
    close(pipefd[1]);
    int ok = 0;
    if (read(pipefd[0], &ok, sizeof ok) != sizeof ok)
        ok = 0;
    close(pipefd[0]);
    int status = -1;
    waitpid(pid, &status, 0);
    if (!ok)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int main(int argc, char **argv) {
    errno_at_main = errno;
    if (argc > 1 && (!strcmp(argv[1], "traced") || !strcmp(argv[1], "untraced")))
        return without_proc(!strcmp(argv[1], "traced"));
    if (check_emulator()) {
        printf("skipped: an emulator needs /proc\n");
        return check_summary();
    }
    /* Found before /proc goes: the copies are started by this path. */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0)
        return check_summary();
    self[n] = 0;
    int untraced = run_without_proc(self, 0);
    if (untraced == -1) {
        printf("skipped: no mount namespace of its own (needs CAP_SYS_ADMIN)\n");
        return check_summary();
    }
    CHECK_EQ(untraced, 0);
    CHECK_EQ(run_without_proc(self, 1), 0);
    return check_summary();
}
