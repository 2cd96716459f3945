/* Stacks that are not a thread's own (run with the preload).  A thread's
 * stack is given by the caller; below it, in the same mapping, lie a
 * coroutine's stack and, right above that, a PROT_NONE guard page, as a
 * coroutine library lays them out.  The thread switches to the coroutine's
 * stack inside a C function (inline assembly) and allocates there:
 *   - with the frame pointer left out, that function's unwind rule puts
 *     its caller's frame past the coroutine's top, on the guard page.  The
 *     walker once trusted everything up to the thread pointer, read there
 *     and crashed the program (SIGSEGV); now it stops at the guard, keeps
 *     the frames it found and counts the stack cut short;
 *   - with a frame pointer (x86-64: GCC's rule is then based on it, not
 *     on the stack pointer), the rule leads back to the thread's own
 *     stack, and the walk goes on there to its natural end, nothing cut;
 *   - a makecontext coroutine (glibc) ends at its entry, nothing cut and
 *     nothing handed to libunwind. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <ucontext.h>
#endif

#include "check.h"
#include "mtrace_api.h"

#define KIB 1024
#define CORO (64 * KIB)   /* the coroutine's stack, at the mapping's start */
#define GUARD (4 * KIB)   /* PROT_NONE, right above it */
#define FILLER (60 * KIB) /* readable, between the guard and the thread's stack */
#define STACK (256 * KIB) /* the thread's own stack */

static const struct mtrace_api *api;
static unsigned char *region;
static void *volatile sink[4];

static struct mtrace_stats stats(void) {
    struct mtrace_stats s;
    memset(&s, 0, sizeof s);
    api->stats(&s, sizeof s);
    return s;
}

static __attribute__((noinline)) void alloc_cut(void) { sink[0] = malloc(4001); }
static __attribute__((noinline)) void alloc_chained(void) { sink[1] = malloc(4003); }
static __attribute__((noinline)) void alloc_own(void) { sink[2] = malloc(4007); }
#if defined(__GLIBC__)
static __attribute__((noinline)) void alloc_context(void) { sink[3] = malloc(4013); }
#endif

/* Calls fn with the stack pointer at top, and back. */
#if defined(__x86_64__)
#define SWITCH_AND_CALL(top, fn)                                                                   \
    __asm__ volatile("mov %%rsp, %%rbx\n\tmov %0, %%rsp\n\tcall *%1\n\tmov %%rbx, %%rsp"           \
                     :                                                                             \
                     : "r"(top), "r"(fn)                                                           \
                     : "rbx", "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "xmm0", \
                       "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",     \
                       "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory", "cc")
#elif defined(__aarch64__)
#define SWITCH_AND_CALL(top, fn)                                                                   \
    __asm__ volatile("mov x19, sp\n\tmov sp, %0\n\tblr %1\n\tmov sp, x19"                          \
                     :                                                                             \
                     : "r"(top), "r"(fn)                                                           \
                     : "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11",   \
                       "x12", "x13", "x14", "x15", "x16", "x17", "x18", "x19", "x30", "v0", "v1",  \
                       "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v20",      \
                       "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30",       \
                       "v31", "memory", "cc")
#endif

/* A frame of its own above the switch: the rule for the call's return
 * address is the stack pointer plus that frame. */
static __attribute__((noinline, optimize("omit-frame-pointer"))) void
on_coroutine_without_fp(uintptr_t top, void (*fn)(void)) {
    volatile char pad[96];
    pad[0] = 1;
    SWITCH_AND_CALL(top, fn);
    __asm__ volatile("" : : "r"(pad) : "memory"); /* the frame stays */
}

static __attribute__((noinline, optimize("no-omit-frame-pointer"))) void
on_coroutine_with_fp(uintptr_t top, void (*fn)(void)) {
    volatile char pad[96];
    pad[0] = 1;
    SWITCH_AND_CALL(top, fn);
    __asm__ volatile("" : : "r"(pad) : "memory"); /* the frame stays */
}

#if defined(__GLIBC__)
static void *on_context(void *stack) {
    ucontext_t back, co;
    getcontext(&co);
    co.uc_stack.ss_sp = stack;
    co.uc_stack.ss_size = CORO;
    co.uc_link = &back;
    makecontext(&co, alloc_context, 0);
    swapcontext(&back, &co);
    return NULL;
}
#endif

/* Whether the kernel reads this process's memory for it (not under every
 * emulator or seccomp filter): the walker then trusts a thread's stack to
 * the thread pointer, as before, and the first case would crash. */
static int can_probe(void) {
    uintptr_t word = 1, copy = 0;
    struct iovec local = {&copy, sizeof copy}, remote = {&word, sizeof word};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)sizeof word;
}

static void *on_own_stack(void *arg) {
    (void)arg;
    uintptr_t coroutine_top = (uintptr_t)region + CORO;
    alloc_own(); /* the own stack, proved readable */
    struct mtrace_stats before = stats();
    on_coroutine_without_fp(coroutine_top, alloc_cut);
    struct mtrace_stats after = stats();
    CHECK(after.stacks == before.stacks + 1);
    CHECK(after.unwind_cut == before.unwind_cut + 1);
    CHECK_EQ(after.unwind_fallbacks, before.unwind_fallbacks);
#if defined(__x86_64__)
    before = after;
    on_coroutine_with_fp(coroutine_top, alloc_chained);
    after = stats();
    CHECK(after.stacks == before.stacks + 1);
    CHECK_EQ(after.unwind_cut, before.unwind_cut);
    CHECK_EQ(after.unwind_fallbacks, before.unwind_fallbacks);
#else
    (void)on_coroutine_with_fp;
    (void)alloc_chained;
#endif
    return NULL;
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        goto done;
    size_t total = CORO + GUARD + FILLER + STACK;
    region = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(region != MAP_FAILED);
    if (region == MAP_FAILED)
        goto done;
    CHECK(mprotect(region + CORO, GUARD, PROT_NONE) == 0);

    pthread_attr_t attr;
    pthread_t t;
    int created;
    if (!can_probe()) {
        printf("skipped the switches in C functions: no process_vm_readv here\n");
        goto context;
    }
    pthread_attr_init(&attr);
    CHECK(pthread_attr_setstack(&attr, region + CORO + GUARD + FILLER, STACK) == 0);
    created = pthread_create(&t, &attr, on_own_stack, NULL) == 0;
    CHECK(created);
    if (created)
        pthread_join(t, NULL);
    pthread_attr_destroy(&attr);
context:;

#if defined(__GLIBC__)
    struct mtrace_stats before = stats();
    created = pthread_create(&t, NULL, on_context, region) == 0;
    CHECK(created);
    if (created)
        pthread_join(t, NULL);
    struct mtrace_stats after = stats();
    CHECK(after.stacks > before.stacks); /* the thread's creation allocates too */
    CHECK_EQ(after.unwind_cut, before.unwind_cut);
    CHECK_EQ(after.unwind_fallbacks, before.unwind_fallbacks);
#endif
    for (int i = 0; i < 4; i++)
        free(sink[i]);
    munmap(region, total);
done:
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed != 0;
}
