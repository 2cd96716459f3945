/*
 * Run-time configuration of the preload, read from the environment.
 *
 * Parsed without malloc (it runs inside the first malloc call of a process)
 * and forgiving: a garbage value falls back to its default, an out-of-range
 * one is clamped; the effective values are reported by stats.
 */
#ifndef MT_CONFIG_H
#define MT_CONFIG_H

#include <stdint.h>

#include "mtrace_api.h"

#define MT_DEFAULT_DEPTH 32
#define MT_DEFAULT_PROGRAMS "beam.smp"
/* The largest mean sample interval, 1 TiB: past some 2^48 the weight of a
 * sampled byte (1/p) no longer fits the estimates' 64 bits. */
#define MT_MAX_SAMPLE_BYTES (1ull << 40)

struct mt_config {
    int active;            /* this executable is one MTRACE_PROGRAMS names */
    int enabled;           /* MTRACE_ENABLED: track from the start */
    uint32_t depth;        /* MTRACE_DEPTH: frames kept per stack */
    uint64_t sample_bytes; /* MTRACE_SAMPLE_BYTES: mean bytes between samples, 0 = lossless */
    uint32_t garbage;      /* MT_GARBAGE_* bits: variables whose value was not understood */
    int fast_unwind;       /* MTRACE_UNWIND: "fast" (default) or "libunwind" */
    int erlang;            /* MTRACE_ERLANG: capture Erlang frames (default 1) */
};

#define MT_GARBAGE_DEPTH 1u
#define MT_GARBAGE_ENABLED 2u
#define MT_GARBAGE_SAMPLE 4u
#define MT_GARBAGE_UNWIND 8u
#define MT_GARBAGE_ERLANG 16u
#define MT_GARBAGE_NO_LIBUNWIND MTRACE_GARBAGE_NO_LIBUNWIND

/* Reads MTRACE_PROGRAMS, MTRACE_ENABLED, MTRACE_DEPTH, MTRACE_SAMPLE_BYTES,
 * MTRACE_UNWIND, MTRACE_ERLANG and /proc/self/exe. */
void mt_config_load(struct mt_config *c);

/* Pure helpers, exposed for tests. */
uint32_t mt_parse_depth(const char *s);
int mt_parse_enabled(const char *s);
/* Digits only; anything else (or overflow) is garbage and means 0. */
uint64_t mt_parse_sample_bytes(const char *s, int *garbage);
int mt_program_listed(const char *list, const char *exe_name);

#endif
