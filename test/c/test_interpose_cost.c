/* What a call costs inside mtrace.so, counted exactly rather than timed
 * (run with the preload): this program starts itself again as a traced
 * child, single-steps through one malloc and one free and counts the
 * instructions executed inside mtrace.so, in a program the preload does
 * not track, in one it tracks, in one switched off (MTRACE_ENABLED=0) and
 * without the preload.  Skipped where ptrace is not permitted (and under
 * qemu-user, which does not emulate it). */
#define _GNU_SOURCE
#include <elf.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static char **self_argv;

static volatile size_t probe_size = 64;

static __attribute__((noinline)) void stop_if(int stops) {
    if (stops)
        raise(SIGSTOP);
}

/* One malloc and one free, from the same place whether stopped around or not. */
static __attribute__((noinline)) int pair(int stops) {
    stop_if(stops);
    void *p = malloc(probe_size);
    stop_if(stops);
    free(p);
    stop_if(stops);
    return p != NULL;
}

/* In the traced child: the pair warmed up, then measured between stops. */
static int probe_child(void) {
    int ok = 1;
    for (int i = 0; i <= 100; i++) /* one call site: the last call walks a known stack */
        ok &= pair(i == 100);
    return ok ? 0 : 1;
}

struct range {
    uintptr_t lo, hi;
};

/* Executable mappings of mtrace.so in process pid. */
static int mtrace_text(pid_t pid, struct range *r, int max) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    int n = 0;
    if (!f)
        return 0;
    while (n < max && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[2] == 'x' &&
            strstr(line, "/mtrace.so")) {
            r[n].lo = lo;
            r[n].hi = hi;
            n++;
        }
    }
    fclose(f);
    return n;
}

/* The program counter of the stopped pid (PTRACE_GETREGSET: every Linux
 * architecture has it, PTRACE_GETREGS only some); -1 where unknown. */
static int pc_of(pid_t pid, uintptr_t *pc) {
    struct user_regs_struct regs;
    struct iovec io = {&regs, sizeof regs};
    if (ptrace(PTRACE_GETREGSET, pid, (void *)NT_PRSTATUS, &io) != 0)
        return -1;
#if defined(__x86_64__)
    *pc = regs.rip;
#elif defined(__aarch64__)
    *pc = regs.pc;
#else
    return -1;
#endif
    return 0;
}

/* Single-steps pid to its next SIGSTOP; counts all instructions and those in r. */
static int step_to_stop(pid_t pid, const struct range *r, int nr, long *all, long *ours) {
    *all = *ours = 0;
    for (;;) {
        if (ptrace(PTRACE_SINGLESTEP, pid, NULL, NULL) != 0)
            return -1;
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFSTOPPED(status))
            return -1;
        if (WSTOPSIG(status) == SIGSTOP)
            return 0;
        if (WSTOPSIG(status) != SIGTRAP)
            return -1;
        uintptr_t pc;
        if (pc_of(pid, &pc) != 0)
            return -1;
        (*all)++;
        for (int i = 0; i < nr; i++)
            *ours += pc >= r[i].lo && pc < r[i].hi;
        if (*all > 10000000)
            return -1;
    }
}

struct probe {
    long malloc_all, malloc_ours, free_all, free_ours;
};

/* Runs this program as a traced child in the given mode; 0 when counted. */
static int probe(int tracked, int preload, int off, struct probe *out) {
    pid_t pid = fork();
    if (pid == 0) {
        if (ptrace(PTRACE_TRACEME, 0, NULL, NULL) != 0)
            _exit(125);
        if (off)
            setenv("MTRACE_ENABLED", "0", 1);
        check_restart(self_argv[0], "--probe", tracked, preload);
    }
    int status;
    /* exec stops the child with SIGTRAP; then it runs to its first SIGSTOP */
    if (waitpid(pid, &status, 0) != pid || !WIFSTOPPED(status) ||
        ptrace(PTRACE_CONT, pid, NULL, NULL) != 0 || waitpid(pid, &status, 0) != pid ||
        !WIFSTOPPED(status) || WSTOPSIG(status) != SIGSTOP) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    struct range r[8];
    int nr = mtrace_text(pid, r, 8);
    int bad = (preload && nr == 0) ||
              step_to_stop(pid, r, nr, &out->malloc_all, &out->malloc_ours) != 0 ||
              step_to_stop(pid, r, nr, &out->free_all, &out->free_ours) != 0;
    if (bad) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    ptrace(PTRACE_CONT, pid, NULL, NULL);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static void test_inert_cost(void) {
    struct probe inert, tracked, off, glibc;
    if (probe(0, 1, 0, &inert) != 0) {
        printf("skipped: instruction counts (ptrace single-stepping not permitted%s)\n",
               check_emulator() ? ": qemu-user does not emulate ptrace" : " here");
        return;
    }
    CHECK_EQ(probe(1, 1, 0, &tracked), 0);
    CHECK_EQ(probe(1, 1, 1, &off), 0);
    CHECK_EQ(probe(0, 0, 0, &glibc), 0);
    printf("instructions in mtrace.so (all instructions between the stops, raise included):\n"
           "  untracked program: malloc %ld (%ld), free %ld (%ld)\n"
           "  tracked program:   malloc %ld (%ld), free %ld (%ld)\n"
           "  switched off:      malloc %ld (%ld), free %ld (%ld)\n"
           "  without preload:   malloc %ld (%ld), free %ld (%ld)\n",
           inert.malloc_ours, inert.malloc_all, inert.free_ours, inert.free_all,
           tracked.malloc_ours, tracked.malloc_all, tracked.free_ours, tracked.free_all,
           off.malloc_ours, off.malloc_all, off.free_ours, off.free_all, glibc.malloc_ours,
           glibc.malloc_all, glibc.free_ours, glibc.free_all);
    /* malloc: load the gate word, test it, branch, jump to libc.  free: the
     * same, plus the lock-free filter probe that lets a block recorded before
     * tracking was switched off still be forgotten (a shift, a mask, one byte load). */
    CHECK(inert.malloc_ours >= 1 && inert.malloc_ours <= 8);
    CHECK(inert.free_ours >= 1 && inert.free_ours <= 24);
    CHECK(tracked.malloc_ours > inert.malloc_ours); /* the counter can see the difference */
    /* Switched off (MTRACE_ENABLED=0) with nothing recorded: no filter probe. */
    CHECK(off.malloc_ours <= inert.malloc_ours && off.free_ours <= inert.free_ours);
    CHECK_EQ(glibc.malloc_ours + glibc.free_ours, 0);
}

int main(int argc, char **argv) {
    self_argv = argv;
    if (argc > 1 && !strcmp(argv[1], "--probe"))
        return probe_child();
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_inert_cost();
    return check_summary();
}
