/*
 * The contract between the preloaded tracer (priv/mtrace.so) and its readers
 * (the NIF, C tests, benchmarks): the only thing they share.
 *
 * The preload exports one versioned symbol, MTRACE_API_SYMBOL, a struct
 * mtrace_api of function pointers.  Readers find it with
 * dlsym(RTLD_DEFAULT, ...), so the preload never links against erl_nif and
 * can be loaded into any program.  A reader built for another version finds
 * no symbol of its name and can say so.  Within a version, structs only grow
 * at their end: a reader checks `size` before using a later member.  The
 * structs a call fills arrays of (mtrace_alloc, mtrace_site,
 * mtrace_erl_frame) never change within a version: the arrays are laid out
 * with the reader's size.
 */
#ifndef MTRACE_API_H
#define MTRACE_API_H

#include <stddef.h>
#include <stdint.h>

#define MTRACE_API_SYMBOL "mtrace_api_v2"
#define MTRACE_API_VERSION 2

/* Exported by every preload from version 2 on under this one name, a
 * uint32_t holding its MTRACE_API_VERSION: a reader of any version that
 * finds no contract of its own name can still tell that an mtrace.so of
 * another release is preloaded, older or newer, rather than none. */
#define MTRACE_VERSION_SYMBOL "mtrace_api_version"

/* A bit of mtrace_stats.config_garbage (see there). */
#define MTRACE_GARBAGE_NO_LIBUNWIND 32u

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

/* Stack id 0 means "no stack": the stack store was full or unwinding failed.
 * Ids are dense (1, 2, 3, ... as stacks are first seen) and fit in 24 bits. */
#define MTRACE_NO_STACK 0u
#define MTRACE_STACK_ID_BITS 24
#define MTRACE_MAX_STACK_ID ((1u << MTRACE_STACK_ID_BITS) - 1)

/* Largest MTRACE_DEPTH accepted; larger values are clamped. */
#define MTRACE_MAX_DEPTH 128

/* What a call that can fail returns. */
enum mtrace_result {
    MTRACE_OK = 0,
    MTRACE_ERR_ARGUMENT = -1,  /* a NULL that must not be, an unknown order, a short struct */
    MTRACE_ERR_NO_MEMORY = -2, /* scratch memory for the query could not be mapped */
    MTRACE_ERR_REFUSED = -3,   /* erlang_frames: MTRACE_ERLANG=0, or another layout is kept */
};

/* One live allocation, as olds reports it. */
struct mtrace_alloc {
    uint64_t addr;
    uint64_t size;
    uint64_t t_ms; /* allocation time, ms on CLOCK_MONOTONIC_COARSE (1-4 ms ticks) */
    uint32_t stack_id;
    uint32_t reserved;
};

/* Live allocations grouped by their stack: a leak site, as sites reports it. */
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

/* How results are ranked.  sites: most bytes, most blocks, or oldest block
 * first.  olds: oldest first, or largest first (MTRACE_BY_BYTES). */
enum mtrace_order { MTRACE_BY_BYTES = 0, MTRACE_BY_COUNT = 1, MTRACE_BY_OLDEST = 2 };

/* A query: which allocations it considers (every bound inclusive), how the
 * answer is ranked and how long it may be.  MTRACE_QUERY_ALL considers every
 * allocation; narrow it by setting members. */
struct mtrace_query {
    uint64_t min_t_ms, max_t_ms; /* allocated within [min, max], on the table's clock */
    uint64_t min_size, max_size; /* requested size within [min, max] */
    const uint64_t *stack_set;   /* bit i (word i / 64, bit i % 64) keeps stack id i; NULL = all */
    uint64_t stack_set_bits;     /* ids at or beyond this many bits are not kept */
    uint64_t limit;              /* at most this many results are written */
    uint32_t order;              /* enum mtrace_order */
    uint32_t reserved;
};
#define MTRACE_QUERY_ALL(order_, limit_)                                                           \
    ((struct mtrace_query){0, UINT64_MAX, 0, UINT64_MAX, NULL, 0, (limit_), (order_), 0})

/* Every figure the preload keeps; cheap to read (no table scan).  dropped:
 * no memory for the table, or a signal handler's block allocated while its
 * thread was inside the tracker (which may hold a lock the record needs). */
struct mtrace_stats {
    uint64_t calls[MT_FN_COUNT]; /* hooked calls seen while tracking */
    uint64_t live_count;         /* allocations in the table */
    uint64_t live_bytes;         /* their requested sizes, summed */
    uint64_t dropped;            /* allocations that could not be recorded (above) */
    uint64_t replaced;           /* entries overwritten by a re-used address (missed free) */
    uint64_t table_bytes;        /* memory mapped for the allocation table */
    uint64_t stacks;             /* distinct call stacks interned */
    uint64_t stack_bytes;        /* memory mapped for the stack store */
    uint64_t stacks_dropped;     /* recorded without a stack: store full, walker gone */
    uint64_t now_ms;             /* CLOCK_MONOTONIC_COARSE, same clock as t_ms */
    uint32_t depth;              /* effective MTRACE_DEPTH */
    uint32_t enabled;            /* tracking currently on */
    uint32_t active;             /* this process tracks at all (MTRACE_PROGRAMS) */
    uint32_t shards;             /* table shards (locks) */
    uint64_t sample_bytes;       /* MTRACE_SAMPLE_BYTES in effect; 0 = lossless */
    uint64_t est_live_count; /* live allocations estimated from the samples (exact if lossless) */
    uint64_t est_live_bytes; /* their bytes, estimated likewise */
    /* MTRACE_ variables whose value was not understood (and fell back to the
     * default): 1 DEPTH, 2 ENABLED, 4 SAMPLE_BYTES, 8 UNWIND, 16 ERLANG;
     * and MTRACE_GARBAGE_NO_LIBUNWIND: MTRACE_UNWIND=libunwind, which
     * without libunwind walks with the own walker. */
    uint32_t config_garbage;
    /* In a build without libunwind (musl) fast_unwind is always 1, and the
     * fallbacks are stacks the walker cut short where it gave up (a signal
     * frame, a rule it does not model). */
    uint32_t fast_unwind;      /* 1 = own stack walker, 0 = libunwind only (MTRACE_UNWIND) */
    uint64_t unwind_fallbacks; /* stacks the fast walker handed to libunwind */
    uint32_t erlang_frames;    /* 1 = Erlang frames are captured (see erlang_frames below) */
    uint32_t erlang_allowed;   /* 0 = MTRACE_ERLANG=0 turned them off */
    uint64_t erlang_stacks;    /* interned stacks that carry Erlang frames */
    uint64_t reset_ms;         /* now_ms of the last reset; 0 = never reset */
    /* Stacks cut at the frames the fast walker found, where libunwind was
     * to take over: another thread's walk stayed in it too long (it may be
     * waiting for the loader's lock this thread holds), a fork was under
     * way, or the stack is not the thread's own (a coroutine's) and the
     * walk reached the end of what was proved readable. */
    uint64_t unwind_cut;
    /* 1 when libunwind (libunwind.so.8) was loaded: the walks the own
     * walker hands over, and every walk under MTRACE_UNWIND=libunwind, go
     * to it.  0 without it: those walks end where the own walker stopped
     * (unwind_cut), and MTRACE_UNWIND=libunwind walks with the own walker
     * (config_garbage says so).  2 in a build without it (musl), whose own
     * walker needs none. */
    uint32_t libunwind_loaded;
};

/* A loaded object (the program, a shared library), as the dynamic loader
 * lists it.  path points into the loader's memory: valid while the object
 * stays loaded. */
struct mtrace_object {
    const char *path; /* "" for the main program */
    uintptr_t base;   /* load bias: run-time address = base + link-time address */
    uintptr_t lo, hi; /* the loadable segment holding the address asked for, [lo, hi) */
    const void *phdr; /* its program headers (ElfW(Phdr)[phnum]) */
    uint32_t phnum;
    uint32_t index;      /* its place in the loader's list; 0 = the main program */
    uint64_t generation; /* the loader's count of loads and unloads when the
                          * list was read (objects_generation moves with it) */
};
typedef int (*mtrace_object_fn)(void *ctx, const struct mtrace_object *o); /* nonzero stops */

/*
 * Erlang frames: where, in the VM's own structures, the Erlang call chain of
 * the process running a NIF is.  These are ERTS internals that move between
 * OTP releases, so the preload knows none of them: a reader (the NIF) finds
 * and checks them at run time and hands them over; the preload only reads
 * words at these offsets, and only on a thread that is running a NIF.
 */
struct mtrace_erlang_layout {
    uint32_t size; /* sizeof(struct mtrace_erlang_layout) of the reader, or
                    * MTRACE_ERLANG_LAYOUT_NO_STUBS from a reader of this
                    * version built before the tracing stubs (read as 0) */
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
    /* The VM's thread progress counter (erts_thr_prgr__.current), NULL if
     * it is not exported.  Code the VM purges can only be followed by other
     * code at its addresses once it has moved (a load is committed after
     * thread progress). */
    const volatile uint64_t *thread_progress;
    /* The VM's tracing stubs (beam_return_trace, beam_exception_trace,
     * beam_return_to_trace, beam_return_time_trace; 0 if not exported):
     * call tracing puts them on a process's stack, with the words of the
     * trace after them, where they are no caller. */
    uintptr_t return_trace, exception_trace, return_to_trace, return_time_trace;
};
/* The size of the layout before the tracing stubs were added. */
#define MTRACE_ERLANG_LAYOUT_NO_STUBS offsetof(struct mtrace_erlang_layout, return_trace)

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

struct mtrace_api {
    uint32_t version; /* MTRACE_API_VERSION */
    uint32_t size;    /* sizeof(struct mtrace_api) of the preload */

    /* Fills at most size bytes of out (a reader zeroes it first and passes
     * its own sizeof).  MTRACE_ERR_ARGUMENT for a NULL out. */
    enum mtrace_result (*stats)(struct mtrace_stats *out, size_t size);

    /* The live allocations q considers, ranked by q->order (MTRACE_BY_OLDEST
     * or MTRACE_BY_BYTES); writes at most q->limit to out and their number
     * to *written. */
    enum mtrace_result (*olds)(const struct mtrace_query *q, struct mtrace_alloc *out,
                               size_t *written);

    /* The top sites among the allocations q considers, by q->order; writes at
     * most q->limit to out and their number to *written, and fills *total
     * (unless NULL) with the sum over every allocation considered, stack_id 0.
     * Allocations whose stack was interned after the call began are left
     * out, like any allocation made after the scan passed its shard.
     * MTRACE_ERR_NO_MEMORY when no scratch memory could be mapped. */
    enum mtrace_result (*sites)(const struct mtrace_query *q, struct mtrace_site *out,
                                size_t *written, struct mtrace_site *total);

    /* Forgets every recorded allocation; returns how many were forgotten. */
    uint64_t (*reset)(void);

    /* Copies the frames (return addresses, frame 0 = caller of malloc) of an
     * interned stack into ips; returns the depth, 0 for an unknown id. */
    uint32_t (*stack)(uint32_t stack_id, uintptr_t *ips, uint32_t max);

    /* The Erlang frames of an interned stack, innermost (the NIF itself)
     * first, outside its native frames; returns how many were written (0 for
     * a stack without any). */
    uint32_t (*erlang_stack)(uint32_t stack_id, struct mtrace_erl_frame *out, uint32_t max);

    /* Turns tracking on or off at run time (no effect where inactive). */
    void (*set_enabled)(int on);

    /* While on, the calling thread's allocations are not recorded (its frees
     * still are), so a reader's own work does not show up as a leak; a
     * reader turns it on around its queries.  Returns the previous setting. */
    int (*thread_ignore)(int on);

    /* Current time on the table's clock. */
    uint64_t (*now_ms)(void);

    /* Starts capturing Erlang frames with this layout (NULL stops).  The
     * first layout given is kept for the life of the process.
     * MTRACE_ERR_REFUSED when MTRACE_ERLANG=0 or a different layout is kept,
     * MTRACE_ERR_ARGUMENT for a layout of a size other than the two above
     * or without functions. */
    enum mtrace_result (*erlang_frames)(const struct mtrace_erlang_layout *layout);

    /* Calls fn for each loaded object, in the loader's order, until fn
     * returns nonzero (lo and hi are 0: no address was asked for). */
    void (*objects)(mtrace_object_fn fn, void *ctx);

    /* Fills *out with the object whose loadable segment holds addr;
     * MTRACE_ERR_ARGUMENT when none does (JIT code, unmapped). */
    enum mtrace_result (*object_at)(uintptr_t addr, struct mtrace_object *out);

    /* Changes whenever an object is loaded or unloaded: a reader that keeps
     * anything per object checks it before trusting what it kept.  Odd
     * while a dlclose is under way, before unloaded_since knows what it
     * unmapped: a reader naming frames waits for it to be even, and names
     * them again if it moved meanwhile (another library may have been
     * loaded where the unloaded one was). */
    uint64_t (*objects_generation)(void);

    /* Code unloaded by dlclose since a stack was walked: another library
     * may be mapped at its addresses now.  stack_epoch gives the epoch as
     * of which a stack's native frames were still the code they were
     * walked in; unloaded_since whether an address was unloaded after an
     * epoch (1 also when that is no longer known): such a frame has no name. */
    uint32_t (*stack_epoch)(uint32_t stack_id);
    int (*unloaded_since)(uint32_t epoch, uintptr_t addr);
};

#endif
