/* The stack of a block allocated in a signal handler (run with LD_PRELOAD
 * and MTRACE_PROGRAMS=test_interpose_signal_stack): cut at the signal
 * frame on a thread libunwind has not walked, whole through it on one it
 * has, in the fast mode and, started again, with MTRACE_UNWIND=libunwind. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"
#include "queries.h"

static const struct mtrace_api *api;

static int lookup(void *p, uint64_t size, struct mtrace_alloc *found) {
    static struct mtrace_alloc buf[4096];
    return query_block(api, p, size, buf, 4096, found);
}

static __attribute__((noinline)) void *leak_here(size_t n) {
    void *p = malloc(n);
    __asm__ __volatile__("" ::: "memory"); /* keep the call a call, not a jump */
    return p;
}

/* A block allocated in a signal handler: the walker gives up at the signal
 * frame, and the stats say so.  Where libunwind has walked on the thread
 * before (glibc), the stack goes on through the signal frame to the code
 * the signal interrupted; on a thread it has not walked (its first walk
 * there allocates, which a handler must not) or without libunwind (musl),
 * the stack is the frames walked until then, the handler's and the
 * trampoline's, counted as cut. */
static void *in_handler;
static int trampoline_known;
static __attribute__((noinline)) void on_signal(int sig) {
    (void)sig;
    Dl_info info;
    trampoline_known = dladdr(__builtin_return_address(0), &info) != 0;
    in_handler = leak_here(4321);
}

/* Raises the signal; the depth of its block's stack, and whether that
 * reached this function (*here). */
static __attribute__((noinline)) int signal_here(int *here) {
    raise(SIGUSR1);
    struct mtrace_alloc a;
    *here = 0;
    if (!trampoline_known || !lookup(in_handler, 4321, &a))
        return -1;
    uintptr_t ips[MTRACE_MAX_DEPTH];
    uint32_t depth = api->stack(a.stack_id, ips, MTRACE_MAX_DEPTH);
    CHECK(depth >= 3 && ips[1] > (uintptr_t)on_signal && ips[1] < (uintptr_t)on_signal + 64);
    for (uint32_t i = 2; i < depth; i++)
        *here |= ips[i] > (uintptr_t)signal_here && ips[i] < (uintptr_t)signal_here + 256;
    free(in_handler);
    return (int)depth;
}

static void *cold_thread(void *arg) { return (void *)(intptr_t)signal_here((int *)arg); }

#if defined(__x86_64__) && defined(__GLIBC__)
/* odd_frame_call(f, n) calls f(n) from a frame whose CFA is kept in r12, a
 * rule the walker does not model: the walk gives up there, and libunwind
 * walks on. */
void *odd_frame_call(void *(*f)(size_t), size_t n);
__asm__(".text\n.globl odd_frame_call\n.type odd_frame_call, @function\n"
        "odd_frame_call:\n.cfi_startproc\n"
        "push %r12\n.cfi_adjust_cfa_offset 8\n.cfi_rel_offset %r12, 0\n"
        "mov %rsp, %r12\n.cfi_def_cfa_register %r12\n"
        "mov %rdi, %rax\nmov %rsi, %rdi\ncall *%rax\n"
        "mov %r12, %rsp\n.cfi_def_cfa_register %rsp\n"
        "pop %r12\n.cfi_adjust_cfa_offset -8\n.cfi_restore %r12\nret\n"
        ".cfi_endproc\n.size odd_frame_call, .-odd_frame_call\n");
#endif

/* Also run with MTRACE_UNWIND=libunwind (main starts itself again so), in
 * which every stack is libunwind's but the first on a thread, which the
 * walker looks at first for such a signal frame. */
static void test_signal_stack(void) {
    int fast = !getenv("MTRACE_UNWIND");
    struct mtrace_stats before, after;
    signal(SIGUSR1, on_signal);
    api->stats(&before, sizeof before);
    pthread_t t;
    int here = 0;
    void *depth;
    pthread_create(&t, NULL, cold_thread, &here);
    pthread_join(t, &depth);
    api->stats(&after, sizeof after);
    if (!trampoline_known) { /* qemu-user before 8.0 on aarch64: no vDSO, no unwind info */
        printf("skipped: signal stack (the handler returns to code outside every object, as "
               "under qemu-user without a vDSO)\n");
        return;
    }
    CHECK_EQ(after.fast_unwind, (uint32_t)fast);
    CHECK(!fast || after.unwind_fallbacks > before.unwind_fallbacks);
    CHECK(after.unwind_cut > before.unwind_cut);
    CHECK(!here && (intptr_t)depth == 3);
#if defined(__x86_64__) && defined(__GLIBC__)
    /* This thread, once libunwind has walked on it: the whole stack. */
    api->stats(&before, sizeof before);
    free(odd_frame_call(leak_here, 77));
    api->stats(&after, sizeof after);
    CHECK(!fast || after.unwind_fallbacks > before.unwind_fallbacks);
    CHECK(signal_here(&here) > 3 && here);
#endif
}

/* test_signal_stack again, in a process of its own with
 * MTRACE_UNWIND=libunwind (glibc only: musl has no libunwind). */
static void test_signal_stack_libunwind(char *argv0) {
#ifdef __GLIBC__
    pid_t pid = fork();
    if (pid == 0) {
        setenv("MTRACE_UNWIND", "libunwind", 1);
        check_restart(argv0, "libunwind", 1, 1);
    }
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
#else
    (void)argv0;
#endif
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    if (argc > 1) /* started again by test_signal_stack_libunwind */
        printf("with MTRACE_UNWIND=libunwind: ");
    test_signal_stack();
    if (argc == 1)
        test_signal_stack_libunwind(argv[0]);
    return check_summary();
}
