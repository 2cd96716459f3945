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
#include <malloc.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <erl_nif.h>

#include "mtrace_api.h"
#include "symbols.h"

#define MAX_INLINE 8

static const struct mtrace_api *api;
static ERL_NIF_TERM atom_ok, atom_true, atom_false, atom_nil, atom_not_preloaded;

static int load(ErlNifEnv *env, void **priv, ERL_NIF_TERM info) {
    (void)priv, (void)info;
    const struct mtrace_api *found = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    if (found && found->version == MTRACE_API_VERSION && found->size >= sizeof(*found))
        api = found;
    atom_ok = enif_make_atom(env, "ok");
    atom_true = enif_make_atom(env, "true");
    atom_false = enif_make_atom(env, "false");
    atom_nil = enif_make_atom(env, "nil");
    atom_not_preloaded = enif_make_atom(env, "not_preloaded");
    return 0;
}

static int upgrade(ErlNifEnv *env, void **priv, void **old, ERL_NIF_TERM info) {
    (void)old;
    return load(env, priv, info);
}

static ERL_NIF_TERM not_preloaded(ErlNifEnv *env) {
    return enif_make_tuple2(env, enif_make_atom(env, "error"), atom_not_preloaded);
}

static ERL_NIF_TERM binary(ErlNifEnv *env, const char *s) {
    ERL_NIF_TERM t;
    size_t len = strlen(s);
    memcpy(enif_make_new_binary(env, len, &t), s, len);
    return t;
}

static ERL_NIF_TERM binary_or_nil(ErlNifEnv *env, const char *s) {
    return *s ? binary(env, s) : atom_nil;
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static ERL_NIF_TERM nif_preloaded(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)env, (void)argc, (void)argv;
    return api ? atom_true : atom_false;
}

/* [{lib, symbol}] for one stack; symbol is the ELF function containing the
 * address (the outermost of any inlined chain), as the seed reported it. */
static ERL_NIF_TERM stack_term(ErlNifEnv *env, uint32_t stack_id, int demangle) {
    uintptr_t ips[MTRACE_MAX_DEPTH];
    uint32_t depth = api->stack(stack_id, ips, MTRACE_MAX_DEPTH);
    ERL_NIF_TERM list = enif_make_list(env, 0);
    struct mt_frame_info info[MAX_INLINE];
    for (uint32_t i = depth; i-- > 0;) {
        int n = mt_symbols_resolve(ips[i], demangle, info, MAX_INLINE);
        const struct mt_frame_info *f = &info[n > 0 ? n - 1 : 0];
        ERL_NIF_TERM frame =
            n > 0 ? enif_make_tuple2(env, binary_or_nil(env, f->lib), binary_or_nil(env, f->symbol))
                  : enif_make_tuple2(env, atom_nil, atom_nil);
        list = enif_make_list_cell(env, frame, list);
    }
    return list;
}

/* Reads {MinT, MaxT, MinSize, MaxSize} (0 = unbounded) into f. */
static int get_filter(ErlNifEnv *env, ERL_NIF_TERM t, struct mtrace_filter *f) {
    int arity;
    const ERL_NIF_TERM *e;
    return enif_get_tuple(env, t, &arity, &e) && arity == 4 &&
           enif_get_uint64(env, e[0], (ErlNifUInt64 *)&f->min_t_ms) &&
           enif_get_uint64(env, e[1], (ErlNifUInt64 *)&f->max_t_ms) &&
           enif_get_uint64(env, e[2], (ErlNifUInt64 *)&f->min_size) &&
           enif_get_uint64(env, e[3], (ErlNifUInt64 *)&f->max_size);
}

/* olds(N, Demangle, Filter) -> [{AgeSeconds, Size, Addr, Ns, Stack}] */
static ERL_NIF_TERM nif_olds(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    ErlNifUInt64 want;
    struct mtrace_filter filter = {0, 0, 0, 0};
    if (!enif_get_uint64(env, argv[0], &want) || !enif_is_atom(env, argv[1]) ||
        !get_filter(env, argv[2], &filter))
        return enif_make_badarg(env);
    if (!api)
        return not_preloaded(env);
    int demangle = enif_is_identical(argv[1], atom_true);
    int was = api->thread_ignore(1);

    struct mtrace_stats s;
    api->stats(&s);
    size_t cap = want < s.live_count + 4096 ? (size_t)want : (size_t)(s.live_count + 4096);
    struct mtrace_alloc *buf = cap ? enif_alloc(cap * sizeof(*buf)) : NULL;
    if (cap && !buf) {
        api->thread_ignore(was);
        return enif_raise_exception(env, enif_make_atom(env, "enomem"));
    }
    size_t n = cap ? api->olds(buf, cap, &filter) : 0;
    uint64_t now = api->now_ms();
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (size_t i = n; i-- > 0;) {
        uint64_t t0 = mono_ns();
        ERL_NIF_TERM stack = stack_term(env, buf[i].stack_id, demangle);
        uint64_t spent = mono_ns() - t0;
        uint64_t age = now > buf[i].t_ms ? (now - buf[i].t_ms) / 1000 : 0;
        ERL_NIF_TERM entry = enif_make_tuple5(
            env, enif_make_uint64(env, age), enif_make_uint64(env, buf[i].size),
            enif_make_uint64(env, buf[i].addr), enif_make_uint64(env, spent), stack);
        list = enif_make_list_cell(env, entry, list);
    }
    enif_free(buf);
    api->thread_ignore(was);
    return list;
}

static void put(ErlNifEnv *env, ERL_NIF_TERM *map, const char *key, ERL_NIF_TERM value) {
    enif_make_map_put(env, *map, enif_make_atom(env, key), value, map);
}

static void put_u64(ErlNifEnv *env, ERL_NIF_TERM *map, const char *key, uint64_t v) {
    put(env, map, key, enif_make_uint64(env, v));
}

/* Figures of later preload versions; an older preload has none of them. */
static void put_more_stats(ErlNifEnv *env, ERL_NIF_TERM *m) {
    struct mtrace_more_stats x;
    memset(&x, 0, sizeof x);
    if (api->size >= offsetof(struct mtrace_api, more_stats) + sizeof api->more_stats &&
        api->more_stats)
        api->more_stats(&x, sizeof x);
    else
        return;
    put_u64(env, m, "sample_bytes", x.sample_bytes);
    put(env, m, "sampled", x.sample_bytes ? atom_true : atom_false);
    put_u64(env, m, "est_live_count", x.est_live_count);
    put_u64(env, m, "est_live_bytes", x.est_live_bytes);
    put(env, m, "fast_unwind", x.fast_unwind ? atom_true : atom_false);
    put_u64(env, m, "unwind_fallbacks", x.unwind_fallbacks);
    static const char *const vars[] = {"MTRACE_DEPTH", "MTRACE_ENABLED", "MTRACE_SAMPLE_BYTES",
                                       "MTRACE_UNWIND"};
    ERL_NIF_TERM bad = enif_make_list(env, 0);
    for (int i = (int)(sizeof vars / sizeof *vars) - 1; i >= 0; i--)
        if (x.config_garbage & (1u << i))
            bad = enif_make_list_cell(env, binary(env, vars[i]), bad);
    put(env, m, "config_errors", bad);
}

static ERL_NIF_TERM nif_stats(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc, (void)argv;
    if (!api)
        return not_preloaded(env);
    static const char *const names[MT_FN_COUNT] = MTRACE_FN_NAMES;
    struct mtrace_stats s;
    api->stats(&s);
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
    put(env, &m, "enabled", s.enabled ? atom_true : atom_false);
    put(env, &m, "active", s.active ? atom_true : atom_false);
    put_more_stats(env, &m);
    /* glibc's own view of the heap, as the seed reported it. */
    struct mallinfo2 mi = mallinfo2();
    put_u64(env, &m, "allocated_bytes", mi.arena);
    put_u64(env, &m, "used_bytes", mi.uordblks);
    put_u64(env, &m, "free_bytes", mi.fordblks);
    put_u64(env, &m, "mmap_chunks", mi.hblks);
    put_u64(env, &m, "mmap_bytes", mi.hblkhd);
    return m;
}

static ERL_NIF_TERM nif_reset(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc, (void)argv;
    if (!api)
        return not_preloaded(env);
    return enif_make_uint64(env, api->reset());
}

static ERL_NIF_TERM nif_set_enabled(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    if (!enif_is_identical(argv[0], atom_true) && !enif_is_identical(argv[0], atom_false))
        return enif_make_badarg(env);
    if (!api)
        return not_preloaded(env);
    api->set_enabled(enif_is_identical(argv[0], atom_true));
    return atom_ok;
}

static ErlNifFunc funcs[] = {
    {"preloaded", 0, nif_preloaded, 0},
    {"olds", 3, nif_olds, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"stats", 0, nif_stats, 0},
    {"reset", 0, nif_reset, ERL_NIF_DIRTY_JOB_CPU_BOUND},
    {"set_enabled", 1, nif_set_enabled, 0},
};

ERL_NIF_INIT(Elixir.Mtrace.Native, funcs, load, NULL, upgrade, NULL)
