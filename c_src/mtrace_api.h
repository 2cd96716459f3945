/*
 * The contract between the preloaded tracer (priv/mtrace.so) and its readers
 * (the NIF, C tests, benchmarks).
 *
 * The preload exports one versioned symbol, MTRACE_API_SYMBOL, a pointer to
 * a struct mtrace_api.  Readers find it with dlsym(RTLD_DEFAULT, ...), so the
 * preload never links against erl_nif and can be loaded into any program.
 * Fields are only ever appended: a reader checks `size` before using a field
 * added after version 1.
 */
#ifndef MTRACE_API_H
#define MTRACE_API_H

#include <stddef.h>
#include <stdint.h>

#define MTRACE_API_SYMBOL "mtrace_api_v1"
#define MTRACE_API_VERSION 1

/* Interposed functions, in the order of mtrace_stats.calls[]. */
enum mtrace_fn {
    MT_FN_MALLOC,
    MT_FN_CALLOC,
    MT_FN_REALLOC,
    MT_FN_REALLOCARRAY,
    MT_FN_FREE,
    MT_FN_POSIX_MEMALIGN,
    MT_FN_ALIGNED_ALLOC,
    MT_FN_MEMALIGN,
    MT_FN_VALLOC,
    MT_FN_PVALLOC,
    MT_FN_STRDUP,
    MT_FN_STRNDUP,
    MT_FN_COUNT
};

/* Names used for the counters in stats, e.g. "malloc" -> malloc_cnt. */
#define MTRACE_FN_NAMES                                                                            \
    {                                                                                              \
        "malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign", "aligned_alloc",  \
            "memalign", "valloc", "pvalloc", "strdup", "strndup"                                   \
    }

/* Stack id 0 means "no stack": the stack store was full or unwinding failed. */
#define MTRACE_NO_STACK 0u

/* Largest MTRACE_DEPTH accepted; larger values are clamped. */
#define MTRACE_MAX_DEPTH 128

/* One live allocation, as a query reports it. */
struct mtrace_alloc {
    uint64_t addr;
    uint64_t size;
    uint64_t t_ms; /* allocation time, ms on CLOCK_MONOTONIC_COARSE (1-4 ms ticks) */
    uint32_t stack_id;
    uint32_t reserved;
};

/* Which allocations a query considers; zero-initialised means "all". */
struct mtrace_filter {
    uint64_t min_t_ms; /* allocated at or after (0 = no bound) */
    uint64_t max_t_ms; /* allocated at or before (0 = no bound) */
    uint64_t min_size; /* 0 = no bound */
    uint64_t max_size; /* 0 = no bound */
};

struct mtrace_stats {
    uint64_t calls[MT_FN_COUNT]; /* interposed calls seen while tracking */
    uint64_t live_count;         /* allocations in the table */
    uint64_t live_bytes;         /* their requested sizes, summed */
    uint64_t dropped;            /* allocations that could not be recorded */
    uint64_t replaced;           /* entries overwritten by a re-used address (missed free) */
    uint64_t table_bytes;        /* memory mapped for the allocation table */
    uint64_t stacks;             /* distinct call stacks interned */
    uint64_t stack_bytes;        /* memory mapped for the stack store */
    uint64_t stacks_dropped;     /* allocations recorded without a stack (store full) */
    uint64_t now_ms;             /* CLOCK_MONOTONIC_COARSE, same clock as t_ms */
    uint32_t depth;              /* effective MTRACE_DEPTH */
    uint32_t enabled;            /* tracking currently on */
    uint32_t active;             /* this process tracks at all (MTRACE_PROGRAMS) */
    uint32_t shards;             /* table shards (locks) */
};

/* Figures added after the first release, read through api->more_stats.
 * Fields are only appended; the preload writes at most the size it is given,
 * and a reader zeroes the struct first. */
struct mtrace_more_stats {
    uint64_t sample_bytes;   /* MTRACE_SAMPLE_BYTES in effect; 0 = lossless */
    uint64_t est_live_count; /* live allocations estimated from the samples (exact if lossless) */
    uint64_t est_live_bytes; /* their bytes, estimated likewise */
    /* MTRACE_ variables whose value was not understood (and fell back to the
     * default): 1 DEPTH, 2 ENABLED, 4 SAMPLE_BYTES, 8 UNWIND, 16 ERLANG. */
    uint32_t config_garbage;
    uint32_t fast_unwind;      /* 1 = own stack walker, 0 = libunwind only (MTRACE_UNWIND) */
    uint64_t unwind_fallbacks; /* stacks the fast walker handed to libunwind */
    uint32_t erlang_frames;    /* 1 = Erlang frames are captured (see erlang_frames below) */
    uint32_t erlang_allowed;   /* 0 = MTRACE_ERLANG=0 turned them off */
    uint64_t erlang_stacks;    /* interned stacks that carry Erlang frames */
};

/*
 * Erlang frames: where, in the VM's own structures, the Erlang call chain of
 * the process running a NIF is.  These are ERTS internals that move between
 * OTP releases, so the preload knows none of them: a reader (the NIF) finds
 * and checks them at run time and hands them over; the preload only reads
 * words at these offsets, and only on a thread that is running a NIF.
 */
struct mtrace_erlang_layout {
    uint32_t size; /* sizeof(struct mtrace_erlang_layout) of the reader */
    /* Byte offsets in ErtsSchedulerData. */
    uint32_t sched_current_process; /* Process *: the process being run */
    uint32_t sched_current_nif;     /* non-NULL while a NIF runs */
    /* Byte offsets in Process. */
    uint32_t proc_stop;    /* Eterm *: top of the process stack */
    uint32_t proc_hend;    /* Eterm *: end of the heap block = bottom of the stack */
    uint32_t proc_current; /* const ErtsCodeMFA *: the NIF's own {M, F, A} while it runs */
    /* Byte offsets in FunctionInfo (its mfa pointer is at 0) of the location
     * (0 = no lines) and of the file name table, whose entries are the
     * names as lists of characters (0 = no file names). */
    uint32_t info_loc;
    uint32_t info_fname;
    /* erts_get_scheduler_data and erts_lookup_function_info of beam.smp. */
    void *(*scheduler_data)(void);
    void (*function_info)(void *info, const void *pc, int full_info);
};

/* One Erlang frame of a stack, named when its stack was first seen (atoms
 * are never freed, so names stay right after the code is purged). */
struct mtrace_erl_frame {
    uint64_t pc;     /* return address into the Erlang code; the NIF's own frame has its MFA | 1 */
    uint64_t module; /* atom terms (Eterm); 0 = the address named no loaded function */
    uint64_t function;
    const char *file; /* source file, kept by the preload for good; NULL = unknown */
    uint32_t arity;
    uint32_t line; /* 0 = unknown */
};

/* A filter plus a set of stacks, for the queries added after version 1. */
struct mtrace_query {
    struct mtrace_filter filter;
    const uint64_t *stack_set; /* bit i (word i / 64, bit i % 64) keeps stack id i; NULL = all */
    uint64_t stack_set_bits;   /* ids at or beyond this many bits are not kept */
};

/* Live allocations grouped by their stack: a leak site. */
struct mtrace_site {
    uint32_t stack_id;
    uint32_t reserved;
    uint64_t count;       /* live allocations made by this stack */
    uint64_t bytes;       /* their sizes, summed */
    uint64_t oldest_t_ms; /* time of the oldest of them */
    uint64_t newest_t_ms; /* time of the newest */
    /* All live allocations of this stack, estimated from the samples when
     * sampling (MTRACE_SAMPLE_BYTES); equal to count and bytes otherwise.
     * Sites are ranked by these. */
    uint64_t est_count;
    uint64_t est_bytes;
};

/* How sites are ranked: most bytes, most blocks, or oldest allocation first. */
enum mtrace_site_order { MTRACE_BY_BYTES = 0, MTRACE_BY_COUNT = 1, MTRACE_BY_OLDEST = 2 };

struct mtrace_api {
    uint32_t version; /* MTRACE_API_VERSION */
    uint32_t size;    /* sizeof(struct mtrace_api) of the preload */

    /* Counters and table figures; cheap (no table scan). */
    void (*stats)(struct mtrace_stats *out);

    /* The n oldest live allocations matching f (NULL = all), oldest first.
     * Writes at most n entries to out and returns how many it wrote. */
    size_t (*olds)(struct mtrace_alloc *out, size_t n, const struct mtrace_filter *f);

    /* Forgets every recorded allocation; returns how many were forgotten. */
    uint64_t (*reset)(void);

    /* Copies the frames (return addresses, frame 0 = caller of malloc) of an
     * interned stack into ips; returns the depth, 0 for an unknown id. */
    uint32_t (*stack)(uint32_t stack_id, uintptr_t *ips, uint32_t max);

    /* Turns tracking on or off at run time (no effect where inactive). */
    void (*set_enabled)(int on);

    /* While on, the calling thread's allocations are not recorded (its frees
     * still are), so a reader's own work does not show up as a leak.
     * Returns the previous setting. */
    int (*thread_ignore)(int on);

    /* Current time on the table's clock. */
    uint64_t (*now_ms)(void);

    /* Added after version 1 (check size): fills at most size bytes of out. */
    void (*more_stats)(struct mtrace_more_stats *out, size_t size);

    /* Added after version 1 (check size).  The n top sites among the
     * allocations matching q (NULL = all), best first by order; fills *total
     * (unless NULL) with the sum over every matching allocation, stack_id 0.
     * Allocations whose stack was interned after the call began are left
     * out, like any allocation made after the scan passed its shard.  Returns
     * the number written, or SIZE_MAX when no scratch memory could be mapped. */
    size_t (*sites)(struct mtrace_site *out, size_t n, const struct mtrace_query *q, int order,
                    struct mtrace_site *total);

    /* Added after version 1 (check size): olds() with a stack set. */
    size_t (*olds_where)(struct mtrace_alloc *out, size_t n, const struct mtrace_query *q);

    /* Added after version 1 (check size).  Starts capturing Erlang frames
     * with this layout (NULL stops).  The first layout given is kept for the
     * life of the process; a different one later is refused.  Returns 1 when
     * frames are captured from now on, 0 when refused (MTRACE_ERLANG=0, an
     * unknown layout size, or a layout differing from the kept one). */
    int (*erlang_frames)(const struct mtrace_erlang_layout *layout);

    /* Added after version 1 (check size).  The Erlang frames of an interned
     * stack, innermost (the NIF itself) first, outside its native frames;
     * returns how many were written (0 for a stack without any). */
    uint32_t (*erlang_stack)(uint32_t stack_id, struct mtrace_erl_frame *out, uint32_t max);
};

#endif
