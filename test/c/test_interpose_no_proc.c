/* Without /proc (a chroot, a sandbox) the preload cannot read the program's
 * name from /proc/self/exe.  It takes the path execve was given instead, so
 * a listed program is still traced; and the failed readlink does not leave
 * its ENOENT behind: main starts with errno 0, as C promises, and a malloc
 * that succeeds leaves errno alone, traced or not.  Likewise without
 * libunwind (a release machine need not have it): the failed dlopen leaves
 * no message for the program's first dlerror(), stats says libunwind is
 * not loaded, and MTRACE_UNWIND=libunwind walks with the own walker (said
 * in config_garbage) rather than taking no stack.  The copies of this program
 * that check it run in a mount namespace of their own with an empty /proc,
 * or an empty file over libunwind (skipped where no namespace can be made,
 * or under an emulator, which needs /proc itself). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"
#include "queries.h"

static int errno_at_main = -1;
static const char *dlerror_at_main;

/* A copy run with libunwind hidden: traced, and nothing for dlerror. */
static int without_libunwind(void) {
    CHECK_EQ(errno_at_main, 0);
    CHECK(dlerror_at_main == NULL);
    if (dlerror_at_main)
        printf("dlerror at main: %s\n", dlerror_at_main);
    CHECK(dlopen("libunwind.so.8", RTLD_NOW) == NULL); /* the case this is about */
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (api) {
        struct mtrace_stats s;
        api->stats(&s, sizeof s);
        CHECK_EQ(s.active, 1u);
        CHECK_EQ(s.libunwind_loaded, 0u);
        const char *mode = getenv("MTRACE_UNWIND");
        int asked = mode && !strcmp(mode, "libunwind");
        CHECK_EQ(s.fast_unwind, 1u);
        CHECK_EQ(s.config_garbage & MTRACE_GARBAGE_NO_LIBUNWIND,
                 asked ? MTRACE_GARBAGE_NO_LIBUNWIND : 0u);
        /* a stack is taken all the same: this program's frames below malloc */
        void *p = malloc(7331);
        CHECK(block_depth(api, p, 7331, 8) >= 2);
        free(p);
        printf("without libunwind%s: own walker, stacks taken\n",
               asked ? ", MTRACE_UNWIND=libunwind" : "");
    }
    return check_summary();
}

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

/* Runs self in a mount namespace with an empty /proc, traced or not, or
 * (hide set) traced with the file hide over that path instead.  Returns its
 * exit status, or -1 when no namespace could be made. */
static int run_without(const char *self, int traced, const char *hide, const char *empty) {
    int pipefd[2];
    CHECK_EQ(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        int ok = unshare(CLONE_NEWNS) == 0 &&
                 mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
                 (hide ? mount(empty, hide, NULL, MS_BIND, NULL)
                       : mount("none", "/proc", "tmpfs", 0, NULL)) == 0;
        if (write(pipefd[1], &ok, sizeof ok) != sizeof ok || !ok)
            _exit(0);
        close(pipefd[1]);
        setenv("MTRACE_PROGRAMS", traced ? "test_interpose_no_proc" : "no-such-program", 1);
        execl(self, self, hide ? "no-libunwind" : traced ? "traced" : "untraced", (char *)NULL);
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

/* Where libunwind.so.8 is, into path; 0 when it cannot be found. */
static int libunwind_path(char path[PATH_MAX]) {
    void *h = dlopen("libunwind.so.8", RTLD_NOW);
    struct link_map *map = NULL;
    if (!h || dlinfo(h, RTLD_DI_LINKMAP, &map) || !map || !realpath(map->l_name, path))
        return 0;
    return 1;
}

int main(int argc, char **argv) {
    errno_at_main = errno;
    dlerror_at_main = dlerror();
    if (argc > 1 && (!strcmp(argv[1], "traced") || !strcmp(argv[1], "untraced")))
        return without_proc(!strcmp(argv[1], "traced"));
    if (argc > 1 && !strcmp(argv[1], "no-libunwind"))
        return without_libunwind();
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
    int untraced = run_without(self, 0, NULL, NULL);
    if (untraced == -1) {
        printf("skipped: no mount namespace of its own (needs CAP_SYS_ADMIN)\n");
        return check_summary();
    }
    CHECK_EQ(untraced, 0);
    CHECK_EQ(run_without(self, 1, NULL, NULL), 0);
    char unwind[PATH_MAX], empty[] = "/tmp/mtrace_empty_XXXXXX";
    int fd = mkstemp(empty);
    if (libunwind_path(unwind) && fd >= 0) {
        CHECK_EQ(run_without(self, 1, unwind, empty), 0);
        setenv("MTRACE_UNWIND", "libunwind", 1);
        CHECK_EQ(run_without(self, 1, unwind, empty), 0);
        unsetenv("MTRACE_UNWIND");
    } else
        printf("skipped without libunwind: none to hide\n");
    if (fd >= 0) {
        close(fd);
        unlink(empty);
    }
    return check_summary();
}
