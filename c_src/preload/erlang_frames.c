/*
 * Erlang frames (see erlang_frames.h).
 *
 * The x86 JIT runs C code on the scheduler's own stack, so a NIF's native
 * stack ends in the VM's trampoline: the Erlang code that called the NIF is
 * only on the process's stack, between its stop and hend pointers.  There,
 * return addresses are the only untagged words (low two bits clear) that do
 * not point into the stack itself (saved frame pointers do); every other
 * word is a tagged term.  Naming a return address needs the VM's code index,
 * so it is done once per new stack, not per allocation.
 */
#include "erlang_frames.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#include "erlang_files.h"
#include "spinlock.h"
#include "state.h"

#define TLS __thread __attribute__((tls_model("initial-exec")))

/* Bounds on one capture: stack words read, and the largest stack believed. */
#define SCAN_WORDS 8192
#define MAX_STACK_WORDS (1ull << 28)

/* The longest source file name kept whole (erlang_files.c keeps the end
 * of a longer one). */
#define FILE_TEXT 256

enum { ERL_NONE, ERL_SETTING, ERL_ON, ERL_OFF };

static struct mtrace_erlang_layout layout;
static _Atomic int state = ERL_NONE;

/* This thread's ErtsSchedulerData once seen non-NULL: a scheduler thread
 * keeps its own for life.  Other threads ask each time (a TSD read). */
static TLS const char *sched;

/* The previous capture of a scheduler thread, when it took Erlang frames:
 * while a NIF runs, its process's stack does not change, so the next
 * allocation compares the stack words the scan read (one memcmp) instead of
 * scanning them again, and can reuse the interned stack.  Mapped on a
 * thread's first capture in a NIF (scheduler threads live as long as the VM). */
#define CACHE_WORDS 256
struct capture_cache {
    int valid;
    uint32_t turned_on; /* the turns_on it was filled in */
    uint32_t n, max, scanned;
    const uintptr_t *stop, *hend;
    uintptr_t current;
    uint64_t mfa[3]; /* what current held: rewritten in place for a dirty NIF */
    uintptr_t pcs[MTRACE_MAX_DEPTH];
    uintptr_t words[CACHE_WORDS];
};
static TLS struct capture_cache *cache;
/* Times Erlang frames were turned on: a cache filled before they were last
 * turned off is not the previous capture (those while off took none). */
static _Atomic uint32_t turns_on;

/* The NIFs seen, by {M, F, A}: a key's NIF frame is the address of the
 * copy kept here, not of the VM's, since a dirty or rescheduled NIF's
 * {M, F, A} is in its process's own native function record: one code path
 * would make a stack per process, and the record is rewritten in place for
 * the process's next such NIF.  Filled under nifs_lock, read without. */
#define NIF_SLOTS 4096
struct nif_mfa {
    _Atomic uint64_t module; /* 0 = free: an atom is never 0 */
    uint64_t function, arity;
};
static struct nif_mfa *nif_mfas;
static mt_spinlock nifs_lock;

/* A fork() child is no longer the VM: it takes no Erlang frames (and so
 * never needs the file store's lock, which another thread may have held). */
void mt_erl_forked(void) { atomic_store(&state, ERL_OFF); }

int mt_erl_active(int *allowed_out) {
    *allowed_out = mt_state.cfg.erlang;
    return atomic_load_explicit(&state, memory_order_acquire) == ERL_ON;
}

enum mtrace_result mt_erl_setup(const struct mtrace_erlang_layout *l) {
    if (!l) {
        int on = ERL_ON;
        atomic_compare_exchange_strong(&state, &on, ERL_OFF);
        return MTRACE_OK;
    }
    /* A reader of this version built before the tracing stubs were added
     * gives a shorter layout: without them, as 0. */
    if ((l->size != MTRACE_ERLANG_LAYOUT_NO_STUBS && l->size != sizeof layout) ||
        !l->scheduler_data || !l->function_info)
        return MTRACE_ERR_ARGUMENT;
    if (!mt_state.cfg.erlang)
        return MTRACE_ERR_REFUSED;
    struct mtrace_erlang_layout given;
    memset(&given, 0, sizeof given);
    memcpy(&given, l, l->size);
    given.size = sizeof given;
    int s = ERL_NONE;
    if (atomic_compare_exchange_strong(&state, &s, ERL_SETTING)) {
        layout = given; /* written once, before any reader can see ERL_ON */
    } else if (s == ERL_SETTING || memcmp(&given, &layout, sizeof layout)) {
        return MTRACE_ERR_REFUSED; /* readers may be using the kept layout: it never changes */
    }
    if (!nif_mfas) { /* without it, NIF frames are keyed by the VM's address */
        void *m = mmap(NULL, NIF_SLOTS * sizeof *nif_mfas, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m != MAP_FAILED)
            nif_mfas = m;
    }
    atomic_fetch_add_explicit(&turns_on, 1, memory_order_relaxed);
    atomic_store_explicit(&state, ERL_ON, memory_order_release);
    return MTRACE_OK;
}

/* The kept copy of {m, f, a}, or with fill the free slot it is then put
 * in; NULL when neither is found. */
static struct nif_mfa *nif_slot(uint64_t m, uint64_t f, uint64_t a, int fill) {
    uint64_t h = (m * 0x9E3779B97F4A7C15ull ^ f * 0xC2B2AE3D27D4EB4Full ^ a) >> 40;
    for (uint32_t probe = 0; probe < NIF_SLOTS; probe++) {
        struct nif_mfa *slot = &nif_mfas[(h + probe) & (NIF_SLOTS - 1)];
        uint64_t held = atomic_load_explicit(&slot->module, memory_order_acquire);
        if (held == m && slot->function == f && slot->arity == a)
            return slot;
        if (!held) {
            if (!fill)
                return NULL;
            slot->function = f;
            slot->arity = a;
            atomic_store_explicit(&slot->module, m, memory_order_release);
            return slot;
        }
    }
    return NULL;
}

/* The key of the NIF frame whose {M, F, A} (read into mfa) is at current
 * in the VM: the kept copy's address | 1, or (no room) the VM's. */
static uintptr_t nif_key(const uint64_t *mfa, uintptr_t current) {
    struct nif_mfa *slot = nif_mfas ? nif_slot(mfa[0], mfa[1], mfa[2], 0) : NULL;
    if (!slot && nif_mfas) {
        mt_lock(&nifs_lock);
        slot = nif_slot(mfa[0], mfa[1], mfa[2], 1);
        mt_unlock(&nifs_lock);
    }
    return slot ? (uintptr_t)slot | 1 : current | 1;
}

static inline const char *field(const char *base, uint32_t offset) {
    return *(const char *const *)(base + offset);
}

static struct capture_cache *thread_cache(void) {
    if (!cache) {
        /* Populated, as recent_stacks.c's: read before written. */
        void *m = mmap(NULL, sizeof *cache, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        cache = m == MAP_FAILED ? NULL : m;
    }
    return cache;
}

/* -1 for a return address; for one of the VM's tracing stubs, the words
 * of the trace after it, which are no caller either: return_trace and
 * exception_trace keep the traced function's {M, F, A} pointer and the
 * tracer, return_time_trace its code info, return_to_trace nothing. */
static int trace_words(uintptr_t v) {
    if (v == layout.return_trace || v == layout.exception_trace)
        return 2;
    if (v == layout.return_time_trace)
        return 1;
    return v == layout.return_to_trace ? 0 : -1;
}

/* This thread's scheduler data, or NULL on a thread that is no scheduler. */
static inline const char *scheduler(void) {
    if (!sched)
        sched = layout.scheduler_data();
    return sched;
}

int mt_erl_in_nif(void) {
    if (atomic_load_explicit(&state, memory_order_acquire) != ERL_ON)
        return 0;
    const char *esdp = scheduler();
    return esdp && field(esdp, layout.sched_current_nif);
}

uint32_t mt_erl_capture(uintptr_t *pcs, uint32_t max, int *unchanged) {
    *unchanged = 0;
    /* Off, the common case, costs one load: the cache is left alone, and
     * told apart later by turns_on. */
    if (atomic_load_explicit(&state, memory_order_acquire) != ERL_ON || !max)
        return 0;
    /* Whether the cache holds the previous capture; from here on it holds
     * this one, or none. */
    uint32_t on = atomic_load_explicit(&turns_on, memory_order_relaxed);
    int was_previous = cache && cache->valid && cache->turned_on == on;
    if (cache)
        cache->valid = 0;
    const char *esdp = scheduler();
    if (!esdp || !field(esdp, layout.sched_current_nif))
        return 0;
    const char *proc = field(esdp, layout.sched_current_process);
    if (!proc)
        return 0;
    /* A process running a NIF is not garbage collected meanwhile (the NIF
     * holds terms on its heap), so its stack stays where it is. */
    const uintptr_t *stop = (const uintptr_t *)field(proc, layout.proc_stop);
    const uintptr_t *hend = (const uintptr_t *)field(proc, layout.proc_hend);
    if (!stop || stop >= hend || (uintptr_t)(hend - stop) > MAX_STACK_WORDS)
        return 0;
    uintptr_t current = (uintptr_t)field(proc, layout.proc_current);
    uint64_t mfa[3] = {0, 0, 0};
    if (current)
        memcpy(mfa, (const void *)current, sizeof mfa);
    struct capture_cache *c = thread_cache();
    if (c && c->stop == stop && c->hend == hend && c->current == current && c->max == max &&
        !memcmp(mfa, c->mfa, sizeof mfa) && !memcmp(stop, c->words, c->scanned * sizeof *stop)) {
        /* The words scanned are the same, so are the frames; they are the
         * previous capture's only if no capture without frames came between. */
        memcpy(pcs, c->pcs, c->n * sizeof *pcs);
        *unchanged = was_previous;
        c->valid = 1;
        c->turned_on = on;
        return c->n;
    }
    uint32_t n = 0;
    if (current)
        pcs[n++] = nif_key(mfa, current); /* an MFA pointer | 1, told apart from return addresses */
    /* The bottom word is the VM's beam_normal_exit, which names nothing. */
    const uintptr_t *end = hend - stop > SCAN_WORDS ? stop + SCAN_WORDS : hend - 1, *w = stop;
    for (; w < end && n < max; w++) {
        uintptr_t v = *w;
        if (!v || (v & 3) || (v >= (uintptr_t)stop && v < (uintptr_t)hend))
            continue;
        int skip = trace_words(v);
        if (skip < 0)
            pcs[n++] = v;
        else
            w += skip;
    }
    uint32_t scanned = (uint32_t)(w - stop); /* the words the result depends on */
    if (c && scanned <= CACHE_WORDS) {
        *c = (struct capture_cache){1, on, n, max, scanned, stop, hend, current, {0}, {0}, {0}};
        memcpy(c->mfa, mfa, sizeof mfa);
        memcpy(c->pcs, pcs, n * sizeof *pcs);
        memcpy(c->words, stop, scanned * sizeof *stop);
    }
    return n;
}

/* What the VM says of pc now: its function's {module, function, arity}
 * (NULL when in no loaded function), and its LOC_FILE / LOC_LINE location
 * with the module's file name table (0 and NULL when unknown). */
static const uint64_t *look_up(uintptr_t pc, uint32_t *loc, const uint64_t **fnames) {
    *loc = 0;
    *fnames = NULL;
    if (pc & 1) /* the NIF's own frame: its MFA pointer */
        return (const uint64_t *)(pc & ~(uintptr_t)1);
    /* FunctionInfo, larger than the VM's own so that no layout can overrun it. */
    _Alignas(16) char info[128];
    memset(info, 0, sizeof info);
    layout.function_info(info, (const void *)pc, layout.info_loc != 0);
    const uint64_t *mfa;
    memcpy(&mfa, info, sizeof mfa);
    if (mfa && layout.info_loc)
        memcpy(loc, info + layout.info_loc, sizeof *loc);
    if (*loc && layout.info_fname)
        memcpy(fnames, info + layout.info_fname, sizeof *fnames);
    return mfa;
}

void mt_erl_name(uintptr_t pc, struct mtrace_erl_frame *out) {
    memset(out, 0, sizeof *out);
    out->pc = pc;
    uint32_t loc;
    const uint64_t *fnames;
    const uint64_t *mfa = look_up(pc, &loc, &fnames);
    if (loc) {
        out->line = loc & 0xFFFFFF;
        char text[FILE_TEXT];
        size_t len = fnames ? mt_erl_list_text(fnames[loc >> 24], text, sizeof text) : 0;
        out->file = len ? mt_erl_keep_file(text, len) : NULL;
    }
    if (mfa) {
        out->module = mfa[0];
        out->function = mfa[1];
        out->arity = (uint32_t)mfa[2];
    }
}

uint64_t mt_erl_progress(void) { return layout.thread_progress ? *layout.thread_progress : 0; }

/* The file names a check has found equal, by where the VM keeps them: a
 * module's functions share one table, so a stack's frames in one module
 * compare its text once. */
struct seen_file {
    const uint64_t *table;
    uint32_t index;
    const char *named;
};

static int named_as(uintptr_t pc, const struct mtrace_erl_frame *named, struct seen_file *seen) {
    uint32_t loc;
    const uint64_t *fnames;
    const uint64_t *mfa = look_up(pc, &loc, &fnames);
    if (!mfa)
        return !named->module;
    if (named->module != mfa[0] || named->function != mfa[1] || named->arity != (uint32_t)mfa[2] ||
        named->line != (loc & 0xFFFFFF))
        return 0;
    /* The next version may come from another file.  A name that could not
     * be kept (no memory for it) is not compared, else it would never hold. */
    if (!named->file)
        return 1;
    if (!loc || !fnames)
        return 0;
    if (seen->table == fnames && seen->index == loc >> 24 && seen->named == named->file)
        return 1;
    char text[FILE_TEXT];
    size_t len = mt_erl_list_text(fnames[loc >> 24], text, sizeof text);
    if (!len || strcmp(text, named->file))
        return 0;
    *seen = (struct seen_file){fnames, loc >> 24, named->file};
    return 1;
}

int mt_erl_nifs_named(const uintptr_t *pcs, const struct mtrace_erl_frame *names, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t *mfa = (const uint64_t *)(pcs[i] & ~(uintptr_t)1);
        if ((pcs[i] & 1) && (names[i].module != mfa[0] || names[i].function != mfa[1] ||
                             names[i].arity != (uint32_t)mfa[2]))
            return 0;
    }
    return 1;
}

int mt_erl_names_hold(const uintptr_t *pcs, const struct mtrace_erl_frame *names, uint32_t n) {
    struct seen_file seen = {0};
    for (uint32_t i = 0; i < n; i++)
        if (!named_as(pcs[i], &names[i], &seen))
            return 0;
    return 1;
}
