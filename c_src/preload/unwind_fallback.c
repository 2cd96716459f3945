/* libunwind loaded on demand (see unwind_fallback.h). */
#define _GNU_SOURCE
#include "unwind_fallback.h"

#include <stdatomic.h>

#include "spinlock.h"

/* libunwind takes a global lock of its own (Debian's ignores the per-thread
 * cache setting) and blocks signals meanwhile: a fork while another thread
 * holds it would leave the child's first fallback waiting for ever.  fork
 * holds this lock too. */
static mt_spinlock lock;

void mt_fallback_lock(void) { mt_lock(&lock); }
void mt_fallback_unlock(void) { mt_unlock(&lock); }

#ifdef MT_NO_LIBUNWIND

void mt_fallback_load(void) {}
int mt_fallback_backtrace(void **buf, int max) {
    (void)buf;
    (void)max;
    return -1;
}

#else

#define UNW_LOCAL_ONLY
#include <dlfcn.h>
#include <libunwind.h>

#ifndef MT_LIBUNWIND_SONAME
#define MT_LIBUNWIND_SONAME "libunwind.so.8"
#endif
/* libunwind's local-only names carry the target (_ULx86_64_...): the
 * header's own macros spell them. */
#define NAME_(x) #x
#define NAME(x) NAME_(x)

typedef int (*backtrace_fn)(void **, int);
typedef int (*policy_fn)(unw_addr_space_t, unw_caching_policy_t);
static backtrace_fn _Atomic backtrace_of;

void mt_fallback_load(void) {
    if (atomic_load(&backtrace_of))
        return;
    void *h = dlopen(MT_LIBUNWIND_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen("libunwind.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    backtrace_fn bt = (backtrace_fn)dlsym(h, "unw_backtrace");
    policy_fn policy = (policy_fn)dlsym(h, NAME(unw_set_caching_policy));
    unw_addr_space_t *local = dlsym(h, NAME(unw_local_addr_space));
    if (!bt)
        return; /* never unloaded: a handle is cheap, a dlclose here is not */
    /* Per-thread caches keep libunwind off its global lock while unwinding. */
    if (policy && local)
        policy(*local, UNW_CACHE_PER_THREAD);
    atomic_store(&backtrace_of, bt);
}

int mt_fallback_backtrace(void **buf, int max) {
    backtrace_fn bt = atomic_load_explicit(&backtrace_of, memory_order_acquire);
    if (!bt)
        return -1;
    mt_lock(&lock);
    int n = bt(buf, max);
    mt_unlock(&lock);
    return n;
}

#endif
