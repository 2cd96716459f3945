/*
 * The C++ demangler's call (c_src/nif/demangle.c) on a thread with a dirty
 * scheduler's stack (320 KiB): libstdc++'s demangler recurses once a
 * nesting level, and a name of 1,000 nested pointers (1,006 bytes, under
 * the 1,024 it accepts) needed more stack than that.  Before it ran on a
 * stack of its own, the thread overflowed its stack and the node died of
 * SIGSEGV.  Names short enough to be demangled in place, nested as deep as
 * they can be, fit the smallest dirty scheduler stack (160 KiB).  Skipped
 * where no libstdc++ can be loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "demangle.h"

#define DIRTY_STACK ((size_t)320 << 10)
#define SMALLEST_DIRTY_STACK ((size_t)160 << 10)
#define NESTED 1000

static char deep[NESTED + 16];

static void *demangle_deep(void *out) {
    *(char **)out = mt_demangle_dup(deep);
    return NULL;
}

/* deep demangled on a thread with a stack of the given size. */
static char *demangle_on(size_t stack) {
    char *got = NULL;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, stack);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, &attr, demangle_deep, &got), 0);
    pthread_join(t, NULL);
    pthread_attr_destroy(&attr);
    return got;
}

/* Names of at most 256 bytes (demangle.c's DIRECT_MAX), each nested as deep
 * as its kind allows in that length: "P" pointers, "A1_" arrays, "1XI"
 * templates, "PF" function types. */
static void test_short_in_place(void) {
    static const struct {
        const char *open, *inner, *close;
    } kinds[] = {{"P", "i", ""}, {"A1_", "i", ""}, {"1XI", "i", "E"}, {"PF", "v", "E"}};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        size_t per = strlen(kinds[k].open) + strlen(kinds[k].close), n = (256 - 8) / per;
        char *p = deep + sprintf(deep, "_Z1f");
        for (size_t i = 0; i < n; i++)
            p += sprintf(p, "%s", kinds[k].open);
        p += sprintf(p, "%s", kinds[k].inner);
        for (size_t i = 0; i < n; i++)
            p += sprintf(p, "%s", kinds[k].close);
        CHECK(strlen(deep) <= 256);
        free(demangle_on(SMALLEST_DIRTY_STACK)); /* returns: the stack sufficed */
    }
    printf("names of up to 256 bytes, nested as deep as they go, in place on %zu KiB\n",
           SMALLEST_DIRTY_STACK >> 10);
}

int main(void) {
    void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (!dlsym(RTLD_DEFAULT, "__cxa_demangle") && !(h && dlsym(h, "__cxa_demangle"))) {
        printf("skipped: no __cxa_demangle (libstdc++ not loadable)\n");
        return check_summary();
    }
    mt_demangle_prepare();
    test_short_in_place();

    strcpy(deep, "_Z1f");
    memset(deep + 4, 'P', NESTED);
    strcpy(deep + 4 + NESTED, "i");
    char *got = demangle_on(DIRTY_STACK);
    CHECK(got != NULL);
    CHECK(got && strncmp(got, "f(", 2) == 0); /* its parameters fit to a short text */
    printf("%zu nested pointers demangled on a %zu KiB stack: %.24s...\n", (size_t)NESTED,
           DIRTY_STACK >> 10, got ? got : "(none)");
    free(got);

    /* An ordinary name still reads as before, from any thread. */
    got = mt_demangle_dup("_ZN3foo3barEv");
    CHECK(got && strcmp(got, "foo::bar()") == 0);
    free(got);
    CHECK(mt_demangle_dup("malloc") == NULL);
    return check_summary();
}
