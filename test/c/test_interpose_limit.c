/* Under an address-space limit (run with the preload): in a child with
 * RLIMIT_AS 32 MiB above what it uses, allocating until malloc fails gives
 * NULL and ENOMEM as glibc does, never a crash; every block was either
 * recorded or counted as dropped (recorded + dropped = allocated, exactly);
 * freeing them all leaves the table as it was, and once the limit is lifted
 * recording goes on. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"

static const struct mtrace_api *api;

struct limited {
    uint64_t allocated, recorded, dropped;
};

#define LIMITED_MAX (8u << 20)

/* realloc(p, 0) out of memory: glibc frees p and returns NULL, its answer
 * to a size of 0; musl (and the BSDs) allocate a smallest block instead,
 * and a NULL is a failure that left p allocated, so p stays recorded.
 * errno is the caller's unless the call failed.  Returns 0 when the table
 * holds what the C library does (p freed here). */
static int realloc_to_zero(char *p) {
    struct mtrace_stats before, after;
    api->stats(&before, sizeof before);
    errno = EDOM; /* the caller's, which only a failure may change */
    void *r = realloc(p, 0);
    int err = errno;
    api->stats(&after, sizeof after);
#ifdef __GLIBC__
    int kept = 0;
#else
    int kept = r == NULL;
#endif
    /* a block kept and re-recorded, or counted as dropped if it could not be */
    uint64_t live = after.live_count + (after.dropped - before.dropped);
    int ok = live == before.live_count - (r == NULL && !kept) && err == (kept ? ENOMEM : EDOM);
    if (r)
        free(r);
    else if (kept)
        free(p);
    return ok ? 0 : 1;
}

static int limited_child(struct limited *out) {
    void **blocks = mmap(NULL, LIMITED_MAX * sizeof *blocks, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (blocks == MAP_FAILED)
        return 29;
    struct mtrace_stats s0, s1;
    char *keep = malloc(4000); /* for realloc(keep, 0) once memory is out */
    if (!keep)
        return 29;
    api->stats(&s0, sizeof s0);
    struct rlimit lim, was;
    long vm = check_status_kib("VmSize");
    if (vm <= 0 || getrlimit(RLIMIT_AS, &was) != 0)
        return 30;
    lim = was;
    lim.rlim_cur = (rlim_t)(vm + 32 * 1024) * 1024;
    if (setrlimit(RLIMIT_AS, &lim) != 0)
        return 31;
    size_t n = 0, wrong_errno = 0;
    while (n < LIMITED_MAX) {
        errno = 0;
        void *p = malloc(16 + n % 8);
        if (!p) {
            wrong_errno += errno != ENOMEM;
            break;
        }
        blocks[n++] = p;
    }
    if (n == LIMITED_MAX)
        return 32; /* the limit never bit */
    errno = 0;
    void *big = malloc(64 << 20);
    if (big || errno != ENOMEM)
        return 33;
    api->stats(&s1, sizeof s1);
    out->allocated = n;
    out->recorded = s1.live_count - s0.live_count;
    out->dropped = s1.dropped - s0.dropped;
    if (out->recorded + out->dropped != n || wrong_errno)
        return 34;
    /* The smallest blocks too, so that realloc(keep, 0) has none left. */
    size_t all = n;
    while (all < LIMITED_MAX && (blocks[all] = malloc(1)) != NULL)
        all++;
    if (realloc_to_zero(keep) != 0)
        return 38;
    s0.live_count--; /* keep is gone */
    for (size_t i = 0; i < all; i++)
        free(blocks[i]);
    api->stats(&s1, sizeof s1);
    if (s1.live_count != s0.live_count)
        return 35;
    /* The limit lifted, recording goes on. */
    if (setrlimit(RLIMIT_AS, &was) != 0)
        return 36;
    void *p = malloc(100);
    api->stats(&s1, sizeof s1);
    free(p);
    return p && s1.live_count == s0.live_count + 1 ? 0 : 37;
}

static void test_address_limit(void) {
    struct limited *figures =
        mmap(NULL, sizeof *figures, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(figures != MAP_FAILED);
    if (figures == MAP_FAILED)
        return;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        _exit(limited_child(figures));
    int status = -1;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status))
        fprintf(stderr, "under RLIMIT_AS the child died of signal %d\n", WTERMSIG(status));
    else if (WEXITSTATUS(status))
        fprintf(stderr, "under RLIMIT_AS the child exited with %d\n", WEXITSTATUS(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("RLIMIT_AS 32 MiB above use: %llu blocks of 16-23 bytes before malloc gave NULL/ENOMEM; "
           "%llu recorded, %llu dropped\n",
           (unsigned long long)figures->allocated, (unsigned long long)figures->recorded,
           (unsigned long long)figures->dropped);
    munmap(figures, sizeof *figures);
}

int main(void) {
    api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    /* qemu-user keeps RLIMIT_AS for itself (the limit would bind its own
     * mappings): the emulated program never meets it. */
    if (check_emulator())
        printf("skipped: address-space limit (%s does not apply RLIMIT_AS to the program)\n",
               check_emulator());
    else
        test_address_limit();
    return check_summary();
}
