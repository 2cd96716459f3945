/* Environment parsing for the preload (see config.h). */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "mtrace_api.h"

uint32_t mt_parse_depth(const char *s) {
    if (!s || !*s)
        return MT_DEFAULT_DEPTH;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return MT_DEFAULT_DEPTH; /* "abc", "-1", "3x": not a depth */
        if (v <= MTRACE_MAX_DEPTH)
            v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v < 1)
        return 1;
    return v > MTRACE_MAX_DEPTH ? MTRACE_MAX_DEPTH : (uint32_t)v;
}

int mt_parse_enabled(const char *s) {
    /* Only an explicit "off" turns tracking off; anything else keeps it on. */
    return !(s &&
             (!strcmp(s, "0") || !strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off")));
}

uint64_t mt_parse_sample_bytes(const char *s, int *garbage) {
    *garbage = 0;
    if (!s || !*s)
        return 0;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') {
            *garbage = 1; /* "1M", "-5", "1e6": lossless, and said in stats */
            return 0;
        }
        if (v <= MT_MAX_SAMPLE_BYTES)
            v = v * 10 + (uint64_t)(*p - '0');
    }
    return v > MT_MAX_SAMPLE_BYTES ? MT_MAX_SAMPLE_BYTES : v; /* out of range: clamped */
}

static int all_digits(const char *s) {
    for (; *s; s++)
        if (*s < '0' || *s > '9')
            return 0;
    return 1;
}

static int known_switch(const char *s) {
    static const char *const words[] = {"0", "1", "false", "true", "no", "yes", "off", "on"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (!strcmp(s, words[i]))
            return 1;
    return 0;
}

int mt_program_listed(const char *list, const char *exe_name) {
    size_t want = strlen(exe_name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && *p == ' ')
            p++, len--;
        while (len && p[len - 1] == ' ')
            len--;
        if ((len == 1 && *p == '*') || (len == want && len && !memcmp(p, exe_name, len)))
            return 1;
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

/* Base name of the running executable.  Without /proc (a chroot, a
 * sandbox), the path execve was given, which the kernel passes in the
 * auxiliary vector: "" only when neither is there. */
static void exe_name(char *out, size_t len) {
    char path[4096];
    const char *full = path;
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    out[0] = 0;
    if (n > 0)
        path[n] = 0;
    else if (!(full = (const char *)getauxval(AT_EXECFN)))
        return;
    const char *base = strrchr(full, '/');
    base = base ? base + 1 : full;
    size_t n_base = strlen(base) < len - 1 ? strlen(base) : len - 1;
    memcpy(out, base, n_base);
    out[n_base] = 0;
}

void mt_config_load(struct mt_config *c) {
    char exe[256];
    const char *programs = getenv("MTRACE_PROGRAMS");
    exe_name(exe, sizeof exe);
    c->active = mt_program_listed(programs && *programs ? programs : MT_DEFAULT_PROGRAMS, exe);
    const char *enabled = getenv("MTRACE_ENABLED"), *depth = getenv("MTRACE_DEPTH");
    const char *unwind = getenv("MTRACE_UNWIND"), *erlang = getenv("MTRACE_ERLANG");
    int bad_sample;
    c->enabled = mt_parse_enabled(enabled);
    c->depth = mt_parse_depth(depth);
    c->sample_bytes = mt_parse_sample_bytes(getenv("MTRACE_SAMPLE_BYTES"), &bad_sample);
    c->garbage = (depth && *depth && !all_digits(depth) ? MT_GARBAGE_DEPTH : 0) |
                 (enabled && *enabled && !known_switch(enabled) ? MT_GARBAGE_ENABLED : 0) |
                 (bad_sample ? MT_GARBAGE_SAMPLE : 0) |
                 (erlang && *erlang && !known_switch(erlang) ? MT_GARBAGE_ERLANG : 0);
    c->erlang = mt_parse_enabled(erlang); /* on unless explicitly off, like MTRACE_ENABLED */
    c->fast_unwind = !(unwind && !strcmp(unwind, "libunwind"));
    if (unwind && *unwind && strcmp(unwind, "libunwind") && strcmp(unwind, "fast"))
        c->garbage |= MT_GARBAGE_UNWIND;
}
