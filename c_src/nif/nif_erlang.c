/*
 * Erlang frames, the NIF's half: finds where the VM keeps the Erlang call
 * chain of a process running a NIF, checks every finding, hands the layout
 * to the preload, and turns captured Erlang frames into terms.
 *
 * Nothing here is taken from a table of OTP releases.  Inside a NIF call of
 * its own, mtrace knows the values the VM's fields must hold: the NIF's env
 * (ErtsSchedulerData.current_nif), its process (found by its pid), that
 * process's stack (whose top return address must name the calling Elixir
 * function, at the line it passed in when line numbers can be trusted
 * (lines_check), and whose bottom holds the VM's
 * beam_normal_exit), and the running NIF's own {M, F, A}.  Each field is
 * searched for by value within a bounded window, reading memory only through
 * process_vm_readv (an unmapped address fails, never faults), and must be
 * found exactly once.  A dirty NIF call then checks the same layout on a
 * dirty scheduler.  Any failure leaves the feature off, with the reason.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "erlang_layout.h"
#include "nif.h"

#define SCHED_WINDOW 1024 /* bytes of ErtsSchedulerData searched */
#define PROC_WINDOW 2048  /* bytes of Process searched */
#define TOP_WORDS 2       /* the caller's return address is one of the top words */
#define INFO_LOC 16       /* FunctionInfo {mfa, needed, loc, fname_ptr}, checked below */
#define INFO_FNAME 24

/* The checks' state, one check at a time (check_lock): a check on a
 * normal scheduler and one on a dirty scheduler may run at once, and a
 * stats call reads the reason meanwhile. */
static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER;
static char reason[MT_ERLANG_REASON_MAX] =
    "not checked: the Mtrace.Native module has not finished loading";
static struct mtrace_erlang_layout layout;

void mt_erlang_reason(char *out, size_t len) {
    pthread_mutex_lock(&check_lock);
    snprintf(out, len, "%s", reason);
    pthread_mutex_unlock(&check_lock);
}

static ERL_NIF_TERM fail(ErlNifEnv *env, const char *why) {
    snprintf(reason, sizeof reason, "%s", why);
    return mt_nif_error(env, mt_nif_binary(env, reason));
}

/* A pipe for peek() where process_vm_readv is not allowed (seccomp). */
static int probe_pipe[2] = {-1, -1};

/* Reads n bytes (n <= 64: within a pipe's capacity) at addr without
 * faulting; 1 on success.  Both ways fail with EFAULT on an unmapped address. */
static int peek(const void *addr, void *out, size_t n) {
    if (!addr)
        return 0;
    struct iovec local = {out, n}, remote = {(void *)addr, n};
    ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (got == (ssize_t)n)
        return 1;
    if (got >= 0 || (errno != EPERM && errno != ENOSYS))
        return 0;
    if (probe_pipe[0] < 0 && pipe2(probe_pipe, O_CLOEXEC | O_NONBLOCK))
        return 0;
    ssize_t put = write(probe_pipe[1], addr, n); /* a fault midway writes a part */
    return put > 0 && read(probe_pipe[0], out, (size_t)put) == put && put == (ssize_t)n;
}

/* Up to max bytes at base, as far as they are readable; returns the count. */
static size_t peek_window(const char *base, uint64_t *words, size_t max) {
    size_t got = 0;
    while (got < max && peek(base + got, (char *)words + got, 64))
        got += 64;
    return got;
}

typedef void (*function_info_fn)(void *info, const void *pc, int full_info);

/* The Erlang function a return address is in, and its line if asked. */
static const uint64_t *name_pc(function_info_fn fi, uintptr_t pc, uint32_t *loc) {
    _Alignas(16) char info[128];
    const uint64_t *mfa;
    memset(info, 0, sizeof info);
    fi(info, (const void *)pc, loc != NULL);
    memcpy(&mfa, info, sizeof mfa);
    if (loc)
        memcpy(loc, info + INFO_LOC, sizeof *loc);
    return mfa;
}

static int is_mfa(const void *p, ERL_NIF_TERM module, ERL_NIF_TERM function, uint64_t arity) {
    uint64_t m[3];
    return peek(p, m, sizeof m) && m[0] == module && m[1] == function && m[2] == arity;
}

struct expect {
    ErlNifEnv *env;
    ERL_NIF_TERM pid, module, nif_name, caller;
    uint64_t line, nif_arity;
    function_info_fn fi;
    uintptr_t normal_exit; /* the VM's beam_normal_exit: the bottom word of every stack */
};

/* Whether stop looks like the top of our stack: one of its top words is a
 * return address into the caller.  The line it passed is checked afterwards
 * (lines_check), and decides only whether line numbers are used. */
static int is_stop(const struct expect *x, uintptr_t stop) {
    uint64_t top[TOP_WORDS];
    if (stop & 7 || !peek((void *)stop, top, sizeof top))
        return 0;
    for (int i = 0; i < TOP_WORDS; i++) {
        if (!top[i] || top[i] & 3 || (top[i] >= stop && top[i] < stop + (1u << 20)))
            continue;
        const uint64_t *mfa = x->fi ? name_pc(x->fi, top[i], NULL) : NULL;
        return mfa && is_mfa(mfa, x->module, x->caller, 0);
    }
    return 0;
}

/* The first offset in words[0..n) whose value passes test, or -1; with
 * unique set, -2 when a second one does too. */
#define FIND(result, words, n, unique, test)                                                       \
    do {                                                                                           \
        result = -1;                                                                               \
        for (size_t i_ = 0; i_ < (n); i_++) {                                                      \
            uint64_t v = (words)[i_];                                                              \
            if (test) {                                                                            \
                if (result >= 0) {                                                                 \
                    result = -2;                                                                   \
                    break;                                                                         \
                }                                                                                  \
                result = (long)(i_ * 8);                                                           \
                if (!(unique))                                                                     \
                    break;                                                                         \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Finds every field on a normal scheduler; 0 and a reason on failure. */
static int find_layout(const struct expect *x, const char *esdp, const char **why) {
    uint64_t w[PROC_WINDOW / 8];
    size_t n = peek_window(esdp, w, SCHED_WINDOW) / 8;
    long nif, proc;
    uint64_t id;
    FIND(nif, w, n, 1, v == (uintptr_t)x->env);
    FIND(proc, w, n, 1, v && !(v & 7) && peek((void *)v, &id, 8) && id == x->pid);
    if (nif < 0 || proc < 0) {
        *why = "the running NIF or its process was not found exactly once in the scheduler data";
        return 0;
    }
    /* The window may reach past the end of Process into whatever follows
     * it, so each field is the first match: the struct comes first. */
    const char *p = (const char *)w[proc / 8];
    n = peek_window(p, w, PROC_WINDOW) / 8;
    long stop, hend, current;
    FIND(stop, w, n, 0, is_stop(x, v));
    if (stop < 0) {
        *why = "the process's stack top was not found";
        return 0;
    }
    uint64_t s = w[stop / 8], bottom;
    FIND(hend, w, n, 0,
         v > s && !(v & 7) && v - s < (1u << 30) && peek((void *)(v - 8), &bottom, 8) &&
             bottom == x->normal_exit);
    FIND(current, w, n, 0, v && !(v & 7) && is_mfa((void *)v, x->module, x->nif_name, 1));
    if (hend < 0 || current < 0) {
        *why = "the process's stack bottom or its current function was not found";
        return 0;
    }
    layout = (struct mtrace_erlang_layout){
        .size = sizeof layout,
        .sched_current_process = (uint32_t)proc,
        .sched_current_nif = (uint32_t)nif,
        .proc_stop = (uint32_t)stop,
        .proc_hend = (uint32_t)hend,
        .proc_current = (uint32_t)current,
    };
    return 1;
}

/* Whether list is a proper list of small integers of fewer than max cells,
 * every cell read through peek: only then may the VM decode it (a word
 * taken for a file name where the layout differs may point anywhere). */
#define LIST_TAG 0x1  /* a list cell's pointer, tagged */
#define SMALL_TAG 0xF /* an immediate small integer */
#define NIL 0x3B      /* [] */
static int list_readable(uint64_t list, int max) {
    for (int i = 0; i < max; i++) {
        uint64_t cell[2];
        if (list == NIL)
            return 1;
        if ((list & 3) != LIST_TAG || !peek((void *)(list - LIST_TAG), cell, sizeof cell) ||
            (cell[0] & 0xF) != SMALL_TAG)
            return 0;
        list = cell[1];
    }
    return 0;
}

/* Whether FunctionInfo has its loc and fname_ptr where INFO_* say: the
 * caller's return address must give the line it passed (1), and a file name
 * list ending in native.ex (2, with files). */
static int lines_check(const struct expect *x, uintptr_t stop) {
    uint64_t top[TOP_WORDS];
    if (!peek((void *)stop, top, sizeof top))
        return 0;
    for (int i = 0; i < TOP_WORDS; i++) {
        uint32_t loc = 0;
        if (!top[i] || top[i] & 3 || !name_pc(x->fi, top[i], &loc))
            continue;
        if (!loc || (loc & 0xFFFFFF) != x->line)
            return 0;
        _Alignas(16) char info[128];
        const uint64_t *fnames;
        uint64_t file;
        char text[256];
        memset(info, 0, sizeof info);
        x->fi(info, (const void *)top[i], 1);
        memcpy(&fnames, info + INFO_FNAME, sizeof fnames);
        int n = peek(fnames + (loc >> 24), &file, 8) && list_readable(file, (int)sizeof text)
                    ? enif_get_string(x->env, (ERL_NIF_TERM)file, text, sizeof text, ERL_NIF_LATIN1)
                    : 0;
        size_t len = n > 0 ? (size_t)n - 1 : 0;
        return len >= 9 && !strcmp(text + len - 9, "native.ex") ? 2 : 1;
    }
    return 0;
}

/* Whether the layout reads this very call right, on whichever scheduler. */
static int layout_reads(const struct expect *x, const char *esdp) {
    uint64_t env, proc, id, stop, hend, current, bottom;
    return peek(esdp + layout.sched_current_nif, &env, 8) && env == (uintptr_t)x->env &&
           peek(esdp + layout.sched_current_process, &proc, 8) && peek((void *)proc, &id, 8) &&
           id == x->pid && peek((char *)proc + layout.proc_stop, &stop, 8) && is_stop(x, stop) &&
           peek((char *)proc + layout.proc_hend, &hend, 8) && hend > stop &&
           peek((void *)(hend - 8), &bottom, 8) && bottom == x->normal_exit &&
           peek((char *)proc + layout.proc_current, &current, 8) &&
           is_mfa((void *)current, x->module, x->nif_name, 1);
}

/* The value of one of the VM's code pointer variables (ErtsCodePtr
 * beam_return_trace, ...), 0 if it is not exported. */
static uintptr_t code_pointer(const char *name) {
    const uintptr_t *p = dlsym(RTLD_DEFAULT, name);
    return p ? *p : 0;
}

/* erlang_layout(Line) on a normal scheduler, then erlang_layout_dirty(Line)
 * on a dirty one, each called (not tail-called) from
 * Mtrace.Native.check_erlang_frames/0 at line Line.  The second hands the
 * layout to the preload.  -> ok | {error, Reason} */
static ERL_NIF_TERM check_locked(ErlNifEnv *env, const ERL_NIF_TERM argv[], const char *nif_name,
                                 int dirty) {
    struct expect x = {.env = env, .nif_arity = 1};
    ErlNifPid self;
    if (!enif_get_uint64(env, argv[0], (ErlNifUInt64 *)&x.line) || !enif_self(env, &self))
        return enif_make_badarg(env);
    if (!mt_api)
        return fail(env, "off: mtrace.so is not preloaded (or is of another release)");
    struct mtrace_stats ms;
    memset(&ms, 0, sizeof ms);
    mt_api->stats(&ms, sizeof ms);
    if (!ms.erlang_allowed)
        return fail(env, "off: MTRACE_ERLANG=0");
    void *(*scheduler_data)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "erts_get_scheduler_data");
    x.fi = (function_info_fn)dlsym(RTLD_DEFAULT, "erts_lookup_function_info");
    const uintptr_t *normal_exit = dlsym(RTLD_DEFAULT, "beam_normal_exit");
    if (!scheduler_data || !x.fi || !normal_exit)
        return fail(env, "off: this VM does not export erts_get_scheduler_data, "
                         "erts_lookup_function_info and beam_normal_exit");
    x.normal_exit = *normal_exit;
    x.pid = self.pid;
    x.module = enif_make_atom(env, "Elixir.Mtrace.Native");
    x.nif_name = enif_make_atom(env, nif_name);
    x.caller = enif_make_atom(env, "check_erlang_frames");
    const char *esdp = scheduler_data(), *why = NULL;
    if (!esdp)
        return fail(env, "off: no scheduler data in a NIF call");
    if (!dirty) {
        if (!find_layout(&x, esdp, &why)) {
            char text[sizeof reason];
            snprintf(text, sizeof text, "off: unknown VM layout (%s)", why);
            return fail(env, text);
        }
        uint64_t proc, stop;
        int lines = peek(esdp + layout.sched_current_process, &proc, 8) &&
                            peek((char *)proc + layout.proc_stop, &stop, 8)
                        ? lines_check(&x, stop)
                        : 0;
        layout.scheduler_data = scheduler_data;
        layout.function_info = (void (*)(void *, const void *, int))x.fi;
        layout.info_loc = lines ? INFO_LOC : 0;
        layout.info_fname = lines == 2 ? INFO_FNAME : 0;
        /* ErtsThrPrgr is {erts_atomic64_t current}: its first word. */
        layout.thread_progress = dlsym(RTLD_DEFAULT, "erts_thr_prgr__");
        layout.return_trace = code_pointer("beam_return_trace");
        layout.exception_trace = code_pointer("beam_exception_trace");
        layout.return_to_trace = code_pointer("beam_return_to_trace");
        layout.return_time_trace = code_pointer("beam_return_time_trace");
        return mt_atoms.ok;
    }
    if (!layout.size)
        return fail(env, "off: the normal-scheduler check did not run");
    if (!layout_reads(&x, esdp))
        return fail(env,
                    "off: the layout found on a normal scheduler does not hold on a dirty one");
    enum mtrace_result r = mt_give_layout(mt_api->erlang_frames, &layout);
    if (r == MTRACE_ERR_ARGUMENT)
        return fail(env, "off: the preloaded mtrace.so and the NIF are different builds of "
                         "mtrace (preload the mtrace.so built with this NIF)");
    if (r != MTRACE_OK)
        return fail(env, "off: the preload refused the layout (a different VM layout was given "
                         "before, or MTRACE_ERLANG=0)");
    reason[0] = 0;
    return mt_atoms.ok;
}

static ERL_NIF_TERM check(ErlNifEnv *env, const ERL_NIF_TERM argv[], const char *nif_name,
                          int dirty) {
    pthread_mutex_lock(&check_lock);
    ERL_NIF_TERM r = check_locked(env, argv, nif_name, dirty);
    pthread_mutex_unlock(&check_lock);
    return r;
}

ERL_NIF_TERM mt_nif_erlang_layout(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    return check(env, argv, "erlang_layout", 0);
}

ERL_NIF_TERM mt_nif_erlang_layout_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    return check(env, argv, "erlang_layout_dirty", 1);
}

/* An atom term the preload read from the VM, or nil where it found none.
 * The tag is checked so that no other word can ever become a term. */
static ERL_NIF_TERM atom_or_nil(uint64_t t) {
    return t && (t & 0x3F) == 0x0B ? (ERL_NIF_TERM)t : mt_atoms.nil;
}

ERL_NIF_TERM mt_erlang_frame_map(ErlNifEnv *env, const struct mtrace_erl_frame *f) {
    ERL_NIF_TERM keys[] = {mt_atoms.module,  mt_atoms.function, mt_atoms.arity, mt_atoms.file,
                           mt_atoms.line,    mt_atoms.addr,     mt_atoms.lib,   mt_atoms.symbol,
                           mt_atoms.inlined, mt_atoms.offset};
    ERL_NIF_TERM module = atom_or_nil(f->module);
    ERL_NIF_TERM values[] = {
        module,
        atom_or_nil(f->function),
        enif_is_identical(module, mt_atoms.nil) ? mt_atoms.nil : enif_make_uint(env, f->arity),
        f->file ? mt_nif_binary(env, f->file) : mt_atoms.nil,
        f->line ? enif_make_uint(env, f->line) : mt_atoms.nil,
        enif_make_uint64(env, f->pc & ~(uint64_t)1),
        mt_atoms.nil,
        mt_atoms.nil,
        mt_atoms.false_,
        enif_make_uint(env, 0),
    };
    ERL_NIF_TERM map;
    enif_make_map_from_arrays(env, keys, values, sizeof keys / sizeof *keys, &map);
    return map;
}

ERL_NIF_TERM mt_erlang_frame_pair(ErlNifEnv *env, const struct mtrace_erl_frame *f) {
    ERL_NIF_TERM module = atom_or_nil(f->module);
    ERL_NIF_TERM mfa = enif_is_identical(module, mt_atoms.nil)
                           ? mt_atoms.nil
                           : enif_make_tuple3(env, module, atom_or_nil(f->function),
                                              enif_make_uint(env, f->arity));
    return enif_make_tuple2(env, mt_atoms.erlang, mfa);
}
