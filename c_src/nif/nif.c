/*
 * mtrace_nif: the Erlang face of the preloaded tracer.
 *
 * It finds the preload's API with dlsym at load time and never fails to load:
 * without the preload every call answers `not_preloaded` and the Elixir side
 * raises an error that names the LD_PRELOAD line to use.  Calls that scan the
 * table or symbolize run on dirty CPU schedulers; the calling thread is
 * ignored by the tracer meanwhile, so the NIF's own work is never reported.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stddef.h>
#include <string.h>

#include <erl_nif.h>

#include "nif.h"
#include "symbols.h"

const struct mtrace_api *mt_api;
struct mt_atoms mt_atoms;

static void make_atoms(ErlNifEnv *env) {
    struct {
        ERL_NIF_TERM *term;
        const char *name;
    } all[] = {
        {&mt_atoms.ok, "ok"},
        {&mt_atoms.true_, "true"},
        {&mt_atoms.false_, "false"},
        {&mt_atoms.nil, "nil"},
        {&mt_atoms.error, "error"},
        {&mt_atoms.not_preloaded, "not_preloaded"},
        {&mt_atoms.preload_mismatch, "preload_mismatch"},
        {&mt_atoms.seed, "seed"},
        {&mt_atoms.maps, "maps"},
        {&mt_atoms.enomem, "enomem"},
        {&mt_atoms.bytes, "bytes"},
        {&mt_atoms.count, "count"},
        {&mt_atoms.oldest, "oldest"},
        {&mt_atoms.lib, "lib"},
        {&mt_atoms.symbol, "symbol"},
        {&mt_atoms.file, "file"},
        {&mt_atoms.line, "line"},
        {&mt_atoms.addr, "addr"},
        {&mt_atoms.inlined, "inlined"},
        {&mt_atoms.offset, "offset"},
        {&mt_atoms.newest, "newest"},
        {&mt_atoms.frames, "frames"},
        {&mt_atoms.age, "age"},
        {&mt_atoms.size, "size"},
        {&mt_atoms.ns, "ns"},
        {&mt_atoms.est_count, "est_count"},
        {&mt_atoms.est_bytes, "est_bytes"},
        {&mt_atoms.module, "module"},
        {&mt_atoms.function, "function"},
        {&mt_atoms.arity, "arity"},
        {&mt_atoms.erlang, "erlang"},
    };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        *all[i].term = enif_make_atom(env, all[i].name);
}

/* A preload of another release exports its contract under another name
 * (or is too short): the NIF then answers every call with an error that
 * says so, instead of misreading it. */
static int other_preload;

static int load(ErlNifEnv *env, void **priv, ERL_NIF_TERM info) {
    (void)priv, (void)info;
    const struct mtrace_api *found = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    if (found && found->version == MTRACE_API_VERSION && found->size >= sizeof *found)
        mt_api = found;
    else
        other_preload = found || dlsym(RTLD_DEFAULT, MTRACE_VERSION_SYMBOL) ||
                        dlsym(RTLD_DEFAULT, "mtrace_api_v1"); /* before that symbol */
    mt_symbols_use(mt_api);
    make_atoms(env);
    return 0;
}

static int upgrade(ErlNifEnv *env, void **priv, void **old, ERL_NIF_TERM info) {
    (void)old;
    return load(env, priv, info);
}

/* The module's code is purged.  The library may be unloaded with it, and
 * the symbol tables, answers and mapped debug files with it for good (about
 * 19 MB each time in a node with debug files installed); a new instance
 * sharing the library reads them again as it needs them. */
static void unload(ErlNifEnv *env, void *priv) {
    (void)env, (void)priv;
    mt_symbols_flush();
}

ERL_NIF_TERM mt_nif_error(ErlNifEnv *env, ERL_NIF_TERM reason) {
    return enif_make_tuple2(env, mt_atoms.error, reason);
}

ERL_NIF_TERM mt_nif_no_preload(ErlNifEnv *env) {
    return mt_nif_error(env, other_preload ? mt_atoms.preload_mismatch : mt_atoms.not_preloaded);
}

ERL_NIF_TERM mt_nif_binary(ErlNifEnv *env, const char *s) {
    ERL_NIF_TERM t;
    size_t len = strlen(s);
    memcpy(enif_make_new_binary(env, len, &t), s, len);
    return t;
}

static ERL_NIF_TERM nif_preloaded(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)env, (void)argc, (void)argv;
    return mt_nif_boolean(mt_api != NULL);
}

/* The table's clock, for marks: allocations at or after a mark's time came after it. */
static ERL_NIF_TERM nif_now_ms(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc, (void)argv;
    if (!mt_api)
        return mt_nif_no_preload(env);
    return enif_make_uint64(env, mt_api->now_ms());
}

static void put(ErlNifEnv *env, ERL_NIF_TERM *map, const char *key, ERL_NIF_TERM value) {
    enif_make_map_put(env, *map, enif_make_atom(env, key), value, map);
}

static void put_u64(ErlNifEnv *env, ERL_NIF_TERM *map, const char *key, uint64_t v) {
    put(env, map, key, enif_make_uint64(env, v));
}

/* The MTRACE_ variables whose value was not understood, by name. */
static ERL_NIF_TERM config_errors(ErlNifEnv *env, uint32_t garbage) {
    static const char *const vars[] = {
        "MTRACE_DEPTH",
        "MTRACE_ENABLED",
        "MTRACE_SAMPLE_BYTES",
        "MTRACE_UNWIND",
        "MTRACE_ERLANG",
        "MTRACE_UNWIND=libunwind (libunwind.so.8 could not be loaded: the "
        "own stack walker walks)"};
    ERL_NIF_TERM bad = enif_make_list(env, 0);
    for (int i = (int)(sizeof vars / sizeof *vars) - 1; i >= 0; i--)
        if (garbage & (1u << i))
            bad = enif_make_list_cell(env, mt_nif_binary(env, vars[i]), bad);
    return bad;
}

/* stats/0, and stats/1 whose false leaves out glibc's view of the heap (its
 * figures nil): callers that read the table every few seconds (top, Watch,
 * a diagnosis's window) do not need it, and it locks each arena in turn. */
static ERL_NIF_TERM nif_stats(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    int heap = argc == 0 || !enif_is_identical(argv[0], mt_atoms.false_);
    if (argc == 1 && heap && !enif_is_identical(argv[0], mt_atoms.true_))
        return enif_make_badarg(env);
    if (!mt_api)
        return mt_nif_no_preload(env);
    static const char *const names[MT_FN_COUNT] = MTRACE_FN_NAMES;
    struct mtrace_stats s;
    memset(&s, 0, sizeof s);
    mt_api->stats(&s, sizeof s);
    ERL_NIF_TERM m = enif_make_new_map(env);
    char key[64];
    for (int f = 0; f < MT_FN_COUNT; f++) {
        snprintf(key, sizeof key, "%s_cnt", names[f]);
        put_u64(env, &m, key, s.calls[f]);
    }
    put_u64(env, &m, "live_count", s.live_count);
    put_u64(env, &m, "live_bytes", s.live_bytes);
    put_u64(env, &m, "dropped", s.dropped);
    put_u64(env, &m, "replaced", s.replaced);
    put_u64(env, &m, "table_bytes", s.table_bytes);
    put_u64(env, &m, "stacks", s.stacks);
    put_u64(env, &m, "stack_bytes", s.stack_bytes);
    put_u64(env, &m, "stacks_dropped", s.stacks_dropped);
    put_u64(env, &m, "depth", s.depth);
    put_u64(env, &m, "shards", s.shards);
    put(env, &m, "enabled", mt_nif_boolean(s.enabled));
    put(env, &m, "active", mt_nif_boolean(s.active));
    put_u64(env, &m, "sample_bytes", s.sample_bytes);
    put(env, &m, "sampled", mt_nif_boolean(s.sample_bytes));
    put_u64(env, &m, "est_live_count", s.est_live_count);
    put_u64(env, &m, "est_live_bytes", s.est_live_bytes);
    put(env, &m, "fast_unwind", mt_nif_boolean(s.fast_unwind));
    put_u64(env, &m, "unwind_fallbacks", s.unwind_fallbacks);
    put(env, &m, "config_errors", config_errors(env, s.config_garbage));
    /* Erlang frames: on, or off and why (the NIF's checks know why). */
    char reason[MT_ERLANG_REASON_MAX] = "";
    if (!s.erlang_frames)
        mt_erlang_reason(reason, sizeof reason);
    const char *why = reason;
    if (!s.erlang_allowed)
        why = "off: MTRACE_ERLANG=0";
    put(env, &m, "erlang_frames", mt_nif_boolean(s.erlang_frames));
    put(env, &m, "erlang_frames_off", *why ? mt_nif_binary(env, why) : mt_atoms.nil);
    put_u64(env, &m, "erlang_stacks", s.erlang_stacks);
    put_u64(env, &m, "reset_ms", s.reset_ms);
    put_u64(env, &m, "unwind_cut", s.unwind_cut);
    put(env, &m, "libunwind",
        s.libunwind_loaded == 2 ? mt_atoms.nil : mt_nif_boolean(s.libunwind_loaded));
    /* glibc's own view of the heap, as the seed reported it; other C
     * libraries do not report theirs (nil).  Its time grows with the heap's
     * free chunks, hence a dirty scheduler (funcs below). */
#if defined(__GLIBC__)
    if (heap) {
        struct mallinfo2 mi = mallinfo2();
        put_u64(env, &m, "allocated_bytes", mi.arena);
        put_u64(env, &m, "used_bytes", mi.uordblks);
        put_u64(env, &m, "free_bytes", mi.fordblks);
        put_u64(env, &m, "mmap_chunks", mi.hblks);
        put_u64(env, &m, "mmap_bytes", mi.hblkhd);
        return m;
    }
#endif
    static const char *const heap_keys[] = {"allocated_bytes", "used_bytes", "free_bytes",
                                            "mmap_chunks", "mmap_bytes"};
    for (size_t i = 0; i < sizeof heap_keys / sizeof *heap_keys; i++)
        put(env, &m, heap_keys[i], mt_atoms.nil);
    return m;
}

static ERL_NIF_TERM nif_reset(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc, (void)argv;
    if (!mt_api)
        return mt_nif_no_preload(env);
    return enif_make_uint64(env, mt_api->reset());
}

static ERL_NIF_TERM nif_set_enabled(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    if (!enif_is_identical(argv[0], mt_atoms.true_) && !enif_is_identical(argv[0], mt_atoms.false_))
        return enif_make_badarg(env);
    if (!mt_api)
        return mt_nif_no_preload(env);
    mt_api->set_enabled(enif_is_identical(argv[0], mt_atoms.true_));
    return mt_atoms.ok;
}

static ErlNifFunc funcs[] = {
    {"preloaded", 0, nif_preloaded, 0},
    {"now_ms", 0, nif_now_ms, 0},
    {"olds", 5, mt_nif_olds, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"sites", 5, mt_nif_sites, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    /* mallinfo2 takes every arena's lock and walks its free chunks: 140 ms
     * for a heap left with 1M free chunks. */
    {"stats", 0, nif_stats, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"stats", 1, nif_stats, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"reset", 0, nif_reset, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"set_enabled", 1, nif_set_enabled, ERL_NIF_DIRTY_JOB_CPU_BOUND}, /* off rebuilds the filter */
    {"erlang_layout", 1, mt_nif_erlang_layout, 0},
    {"erlang_layout_dirty", 1, mt_nif_erlang_layout_dirty, ERL_NIF_DIRTY_JOB_CPU_BOUND},
};

ERL_NIF_INIT(Elixir.Mtrace.Native, funcs, load, NULL, upgrade, unload)
