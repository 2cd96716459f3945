/* A program built without -fPIE that takes the address of malloc and free
 * (as Debian's node does): its dynamic symbols then give the addresses of
 * its PLT stubs for them, which lead back to the preload's hooks.  The
 * preload must not take those for the program's own definitions: the
 * program's calls reach glibc through the preload, are recorded, and
 * return.  (Taken for definitions, the stubs sent the first malloc, before
 * main, round in circles for good: run.sh's timeout fails the test.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "queries.h"
#include "mtrace_api.h"

void *(*volatile taken_malloc)(size_t);
void (*volatile taken_free)(void *);

int main(void) {
    taken_malloc = malloc; /* taken in code: an absolute address, the PLT stub's */
    taken_free = free;
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    if (!api)
        return check_summary();
    void *p = taken_malloc(6001);
    char *s = strndup("a string of the program's", 6002);
    CHECK(p != NULL && s != NULL);
    struct mtrace_alloc a[8];
    struct mtrace_query q = sized_query(6001, 6001);
    CHECK_EQ(query_olds(api, &q, a, 8), 1);
    CHECK_EQ(a[0].addr, (uintptr_t)p);
    taken_free(p);
    free(s);
    CHECK_EQ(query_olds(api, &q, a, 8), 0);
    return check_summary();
}
