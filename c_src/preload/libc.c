/* The C library's own allocator (see libc.h). */
#define _GNU_SOURCE
#include "libc.h"

#include <dlfcn.h>
#include <errno.h>

struct mt_libc mt_libc;

void mt_libc_resolve(void) {
    mt_libc.posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    mt_libc.aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    mt_libc.dlclose = dlsym(RTLD_NEXT, "dlclose");
}

int mt_libc_posix_memalign_early(void **memptr, size_t al, size_t n) {
    if (al % sizeof(void *) != 0 || al == 0 || (al & (al - 1)) != 0)
        return EINVAL;
    void *p = libc_memalign(al, n);
    if (!p)
        return ENOMEM;
    *memptr = p;
    return 0;
}
