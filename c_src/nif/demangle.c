/*
 * C++ demangling in-process (see demangle.h), with the C++ runtime's own
 * __cxa_demangle: found in the process, else in a libstdc++ loaded for it.
 * A name longer than a symbol's text is shortened (name_fit.h).
 */
#define _GNU_SOURCE
#include "demangle.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "name_fit.h"
#include "symbols.h"

typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);
static cxa_demangle_fn g_cxa_demangle;
static pthread_once_t g_demangle_once = PTHREAD_ONCE_INIT;

static void demangle_init(void) {
    void *f = dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (!f) {
        /* Never closed: the function must stay mapped for as long as it may be called. */
        void *h = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
        if (h)
            f = dlsym(h, "__cxa_demangle");
    }
    _Static_assert(sizeof f == sizeof g_cxa_demangle, "function pointers fit in void *");
    memcpy(&g_cxa_demangle, &f, sizeof f);
}

void mt_demangle_prepare(void) { pthread_once(&g_demangle_once, demangle_init); }

char *mt_demangle_dup(const char *name) {
    if (!name || strncmp(name, "_Z", 2) != 0)
        return NULL;
    mt_demangle_prepare();
    if (!g_cxa_demangle)
        return NULL;
    int status = -1;
    char *r = g_cxa_demangle(name, NULL, NULL, &status);
    if (status != 0) {
        free(r);
        return NULL;
    }
    mt_name_fit(r, MT_SYM_TEXT - 1); /* a symbol's text holds no more */
    return r;
}

int mt_demangle(const char *name, char *buf, size_t len) {
    if (!buf || len == 0)
        return -1;
    char *d = mt_demangle_dup(name);
    int rc = d ? 0 : -1;
    snprintf(buf, len, "%s", d ? d : name ? name : "");
    free(d);
    return rc;
}
