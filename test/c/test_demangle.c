/*
 * The C++ demangler's call (c_src/nif/demangle.c) on a thread with a dirty
 * scheduler's stack (320 KiB): libstdc++'s demangler recurses once a
 * nesting level, and a name of 1,000 nested pointers (1,006 bytes, under
 * the 1,024 it accepts) needed more stack than that.  Before it ran on a
 * stack of its own, the thread overflowed its stack and the node died of
 * SIGSEGV.  Skipped where no libstdc++ can be loaded.
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
#define NESTED 1000

static char deep[NESTED + 16];

static void *demangle_deep(void *out) {
    *(char **)out = mt_demangle_dup(deep);
    return NULL;
}

int main(void) {
    void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (!dlsym(RTLD_DEFAULT, "__cxa_demangle") && !(h && dlsym(h, "__cxa_demangle"))) {
        printf("skipped: no __cxa_demangle (libstdc++ not loadable)\n");
        return check_summary();
    }
    strcpy(deep, "_Z1f");
    memset(deep + 4, 'P', NESTED);
    strcpy(deep + 4 + NESTED, "i");
    mt_demangle_prepare();

    char *got = NULL;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, DIRTY_STACK);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, &attr, demangle_deep, &got), 0);
    pthread_join(t, NULL);
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
