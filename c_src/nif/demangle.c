/*
 * C++ demangling in-process (see demangle.h), with the C++ runtime's own
 * __cxa_demangle: found in the process, else in a libstdc++ loaded for it.
 * It runs on a thread of its own, for its stack (below).  A name longer than a symbol's
 * text is shortened (name_fit.h).
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

/* libstdc++'s demangler recurses once a nesting level (some 330 bytes of
 * stack each, up to 2048 levels) above arrays sized by the name (some 72 KiB
 * for the 1024 bytes it accepts): up to 750 KiB, where a dirty scheduler's
 * thread has 320 KiB (160 KiB at the least, +sssdcpu 20), and a name of
 * 1,000 nested pointers overflowed it, taking the node down.  So a longer
 * name runs on a thread of its own with a stack to spare (some 50 us,
 * against 0.7 us in place; answers are cached in symbols.c, so that is once
 * a frame), and no thread to be had leaves it as it is.  Names of up to
 * DIRECT_MAX bytes, the most, are demangled in place: nested as deep as
 * they can be (pointers, arrays, templates, function types), each took
 * under 128 KiB. */
#define OWN_STACK ((size_t)2 << 20)
#define DIRECT_MAX 256

struct call {
    const char *name;
    char *out;
    int status;
};

static void *call_on_own_stack(void *arg) {
    struct call *c = arg;
    c->out = g_cxa_demangle(c->name, NULL, NULL, &c->status);
    return NULL;
}

static char *cxa_demangle_on_own_stack(const char *name, int *status) {
    struct call c = {name, NULL, -1};
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) == 0) {
        if (pthread_attr_setstacksize(&attr, OWN_STACK) == 0 &&
            pthread_create(&t, &attr, call_on_own_stack, &c) == 0)
            pthread_join(t, NULL);
        pthread_attr_destroy(&attr);
    }
    *status = c.status;
    return c.out;
}

char *mt_demangle_dup(const char *name) {
    if (!name || strncmp(name, "_Z", 2) != 0)
        return NULL;
    mt_demangle_prepare();
    if (!g_cxa_demangle)
        return NULL;
    int status = -1;
    char *r = strnlen(name, DIRECT_MAX + 1) <= DIRECT_MAX
                  ? g_cxa_demangle(name, NULL, NULL, &status)
                  : cxa_demangle_on_own_stack(name, &status);
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
