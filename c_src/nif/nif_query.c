/*
 * The NIF's queries: olds and sites, with their filters (stacks are turned
 * into terms by nif_stacks.c).  They run on dirty CPU schedulers (a scan of millions of
 * entries, symbolization of cold addresses) with the calling thread ignored
 * by the tracer, so their own allocations are never reported.
 *
 * A filter arrives as {SinceMs, MinAgeMs, MaxAgeMs, MinSize, MaxSize,
 * BeforeMs} where each is a non-negative integer or nil (BeforeMs: allocated
 * before that time, for report/1's boot figure); ages are turned into times
 * here, on the table's clock, right before the scan.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nif.h"
#include "nif_stacks.h"
#include "symbols.h"
#include "term_memo.h"

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t age_s(uint64_t now, uint64_t t_ms) { return now > t_ms ? (now - t_ms) / 1000 : 0; }

/* ---- filters ----------------------------------------------------------- */

/* The preload's figures now (sizes answers: live allocations, stacks). */
static struct mtrace_stats figures(void) {
    struct mtrace_stats s;
    memset(&s, 0, sizeof s);
    mt_api->stats(&s, sizeof s);
    return s;
}

/* nil or a non-negative integer; *present says which. */
static int get_opt(ErlNifEnv *env, ERL_NIF_TERM t, uint64_t *v, int *present) {
    *present = !enif_is_identical(t, mt_atoms.nil);
    *v = 0;
    return !*present || enif_get_uint64(env, t, (ErlNifUInt64 *)v);
}

/* Narrows q by the filter term; returns 0 for a malformed term, -1 when
 * nothing can match. */
static int get_filter(ErlNifEnv *env, ERL_NIF_TERM t, struct mtrace_query *q) {
    int arity, has[6];
    const ERL_NIF_TERM *e;
    uint64_t v[6];
    if (!enif_get_tuple(env, t, &arity, &e) || arity != 6)
        return 0;
    for (int i = 0; i < 6; i++)
        if (!get_opt(env, e[i], &v[i], &has[i]))
            return 0;
    uint64_t now = mt_api->now_ms();
    if (has[0]) /* since a mark: at or after its time */
        q->min_t_ms = v[0];
    if (has[1] && v[1]) { /* min_age: allocated at or before now - age */
        if (v[1] > now)
            return -1;
        q->max_t_ms = now - v[1];
    }
    if (has[2] && v[2] < now && now - v[2] > q->min_t_ms) /* max_age: at or after now - age */
        q->min_t_ms = now - v[2];
    if (has[5]) { /* before: allocated before that time */
        if (v[5] == 0)
            return -1;
        if (v[5] - 1 < q->max_t_ms)
            q->max_t_ms = v[5] - 1;
    }
    if (has[3])
        q->min_size = v[3];
    if (has[4])
        q->max_size = v[4];
    return 1;
}

/* The stacks passing through an object whose path contains the binary lib,
 * as a bit set over stack ids; *bits is 0 when no lib filter was given. */
static int stack_set_for(ErlNifEnv *env, ERL_NIF_TERM lib, struct mtrace_query *q, uint64_t **set) {
    ErlNifBinary b;
    *set = NULL;
    if (enif_is_identical(lib, mt_atoms.nil))
        return 1;
    if (!enif_inspect_binary(env, lib, &b) || memchr(b.data, 0, b.size))
        return 0;
    char needle[MT_SYM_TEXT];
    if (b.size >= sizeof needle)
        return 0;
    memcpy(needle, b.data, b.size);
    needle[b.size] = '\0';

    uint64_t bits = figures().stacks + 1;
    uintptr_t kept[MTRACE_MAX_DEPTH];
    size_t bytes = (size_t)((bits + 63) / 64) * sizeof(uint64_t);
    uint64_t *words = enif_alloc(bytes);
    if (!words)
        return -1;
    uintptr_t ips[MTRACE_MAX_DEPTH];
    /* the whole pass again if objects were loaded or unloaded meanwhile, as
     * stacks are named (mt_nif_stack_term) */
    for (int tries = 1;; tries++) {
        uint64_t g = mt_nif_settled_generation();
        memset(words, 0, bytes);
        for (uint64_t id = 1; id < bits; id++) {
            uint32_t depth = mt_api->stack((uint32_t)id, ips, MTRACE_MAX_DEPTH), n = 0;
            uint32_t epoch = mt_api->stack_epoch((uint32_t)id);
            for (uint32_t i = 0; i < depth; i++) /* unloaded code is in no library */
                if (!mt_api->unloaded_since(epoch, ips[i]))
                    kept[n++] = ips[i];
            if (mt_symbols_any_lib(kept, n, needle))
                words[id / 64] |= 1ull << (id % 64);
        }
        if (tries == MT_NAMING_TRIES || mt_api->objects_generation() == g)
            break;
    }
    q->stack_set = words;
    q->stack_set_bits = bits;
    *set = words;
    return 1;
}

/* ---- olds -------------------------------------------------------------- */

/* Most distinct frames one answer keeps for sharing (4 MiB of memo). */
#define FRAME_MEMO_MAX (1u << 18)

/* One answer's stacks by id and frames by address: the entries of one stack
 * share one term, and the stacks their common frames, so a million blocks
 * from a few thousand stacks hold a few thousand stacks' frames, not a
 * million (tens of GB of them). */
struct answer_memo {
    struct mt_term_memo stacks, frames;
};

static void answer_memo_init(struct answer_memo *m, uint64_t n_stacks) {
    mt_term_memo_init(&m->stacks, n_stacks, (size_t)1 << 22);
    mt_term_memo_init(&m->frames, n_stacks * MTRACE_MAX_DEPTH, FRAME_MEMO_MAX);
}

static void answer_memo_free(struct answer_memo *m) {
    mt_term_memo_free(&m->stacks);
    mt_term_memo_free(&m->frames);
}

static ERL_NIF_TERM memo_stack(ErlNifEnv *env, struct answer_memo *m, uint32_t id, int demangle,
                               int maps) {
    ERL_NIF_TERM t;
    if (!mt_term_memo_get(&m->stacks, id, &t)) {
        t = mt_nif_stack_term(env, &m->frames, id, demangle, maps);
        mt_term_memo_put(&m->stacks, id, t);
    }
    return t;
}

/* Allocations as terms, in buf's order, each with the ns spent naming its
 * stack: the seed's {AgeS, Size, Addr, Ns, [{Lib, Sym}]} tuples, or with
 * maps #{age, size, addr, ns, frames}; each as {StackId, Entry}, so that the
 * caller can finish each stack's names once per stack (by id: hashing the
 * shared stack terms would cost more than naming them). */
static ERL_NIF_TERM olds_terms(ErlNifEnv *env, const struct mtrace_alloc *buf, size_t n,
                               int demangle, int maps) {
    uint64_t now = mt_api->now_ms();
    ERL_NIF_TERM keys[] = {mt_atoms.age, mt_atoms.size, mt_atoms.addr, mt_atoms.ns,
                           mt_atoms.frames};
    ERL_NIF_TERM list = enif_make_list(env, 0);
    uint64_t ids = figures().stacks + 1; /* distinct ids an answer can hold */
    struct answer_memo memo;
    answer_memo_init(&memo, n < ids ? n : ids);
    for (size_t i = n; i-- > 0;) {
        uint64_t t0 = mono_ns();
        ERL_NIF_TERM stack = memo_stack(env, &memo, buf[i].stack_id, demangle, maps);
        ERL_NIF_TERM v[] = {enif_make_uint64(env, age_s(now, buf[i].t_ms)),
                            enif_make_uint64(env, buf[i].size), enif_make_uint64(env, buf[i].addr),
                            enif_make_uint64(env, mono_ns() - t0), stack};
        ERL_NIF_TERM entry;
        if (maps)
            enif_make_map_from_arrays(env, keys, v, 5, &entry);
        else
            entry = enif_make_tuple5(env, v[0], v[1], v[2], v[3], v[4]);
        entry = enif_make_tuple2(env, enif_make_uint(env, buf[i].stack_id), entry);
        list = enif_make_list_cell(env, entry, list);
    }
    answer_memo_free(&memo);
    return list;
}

/* Parses (Demangle, Filter, Lib) of a query into q; returns 1, 0 for
 * badarg, -1 when nothing can match, MTRACE_ERR_NO_MEMORY. */
static int get_query(ErlNifEnv *env, const ERL_NIF_TERM argv[], struct mtrace_query *q,
                     int *demangle, uint64_t **set) {
    *set = NULL;
    mt_nif_naming_begin();
    if (!enif_is_identical(argv[0], mt_atoms.true_) && !enif_is_identical(argv[0], mt_atoms.false_))
        return 0;
    *demangle = enif_is_identical(argv[0], mt_atoms.true_);
    int ok = get_filter(env, argv[1], q);
    if (ok != 1)
        return ok;
    ok = stack_set_for(env, argv[2], q, set);
    return ok < 0 ? MTRACE_ERR_NO_MEMORY : ok;
}

/* The answer, or the error met while parsing (0) or running (< -1) the query. */
static ERL_NIF_TERM query_result(ErlNifEnv *env, int ok, ERL_NIF_TERM answer) {
    if (ok == 0)
        return enif_make_badarg(env);
    return ok < -1 ? enif_raise_exception(env, mt_atoms.enomem) : answer;
}

/* olds(N, Demangle, Filter, Lib, Form) -> the N oldest live allocations, as
 * {StackId, Entry}: the seed's tuples (Form = seed) or maps (Form = maps). */
ERL_NIF_TERM mt_nif_olds(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    ErlNifUInt64 want;
    struct mtrace_query q = MTRACE_QUERY_ALL(MTRACE_BY_OLDEST, 0);
    int maps = enif_is_identical(argv[4], mt_atoms.maps);
    if (!enif_get_uint64(env, argv[0], &want) ||
        (!maps && !enif_is_identical(argv[4], mt_atoms.seed)))
        return enif_make_badarg(env);
    if (!mt_api)
        return mt_nif_no_preload(env);
    int was = mt_api->thread_ignore(1), demangle = 0;
    uint64_t *set;
    int ok = get_query(env, argv + 1, &q, &demangle, &set);
    size_t n = 0;
    uint64_t most = figures().live_count + 4096; /* no larger than the table could fill */
    q.limit = ok == 1 ? (want < most ? want : most) : 0;
    struct mtrace_alloc *buf = q.limit ? enif_alloc((size_t)q.limit * sizeof *buf) : NULL;
    if (q.limit && !buf)
        ok = MTRACE_ERR_NO_MEMORY;
    if (ok == 1)
        ok = mt_api->olds(&q, buf, &n) == MTRACE_OK ? 1 : 0;
    enif_free(set);
    ERL_NIF_TERM list = olds_terms(env, buf, n, demangle, maps);
    enif_free(buf);
    mt_api->thread_ignore(was);
    return query_result(env, ok, list);
}

/* ---- sites ------------------------------------------------------------- */

static ERL_NIF_TERM site_map(ErlNifEnv *env, const struct mtrace_site *s, uint64_t now,
                             ERL_NIF_TERM frames) {
    ERL_NIF_TERM keys[] = {mt_atoms.count,  mt_atoms.bytes,     mt_atoms.oldest,   mt_atoms.newest,
                           mt_atoms.frames, mt_atoms.est_count, mt_atoms.est_bytes};
    ERL_NIF_TERM values[] = {enif_make_uint64(env, s->count),
                             enif_make_uint64(env, s->bytes),
                             enif_make_uint64(env, age_s(now, s->oldest_t_ms)),
                             enif_make_uint64(env, age_s(now, s->newest_t_ms)),
                             frames,
                             enif_make_uint64(env, s->est_count),
                             enif_make_uint64(env, s->est_bytes)};
    ERL_NIF_TERM map;
    enif_make_map_from_arrays(env, keys, values, sizeof keys / sizeof *keys, &map);
    return map;
}

static int get_order(ErlNifEnv *env, ERL_NIF_TERM t, int *order) {
    (void)env;
    if (enif_is_identical(t, mt_atoms.bytes))
        *order = MTRACE_BY_BYTES;
    else if (enif_is_identical(t, mt_atoms.count))
        *order = MTRACE_BY_COUNT;
    else if (enif_is_identical(t, mt_atoms.oldest))
        *order = MTRACE_BY_OLDEST;
    else
        return 0;
    return 1;
}

/* sites(Limit, Order, Demangle, Filter, Lib) ->
 *     {Total, [#{count, bytes, oldest, newest, est_count, est_bytes, frames}]}
 * where Total is the same map, frames [], summed over every matching allocation. */
ERL_NIF_TERM mt_nif_sites(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    ErlNifUInt64 want;
    int order;
    struct mtrace_query q = MTRACE_QUERY_ALL(MTRACE_BY_BYTES, 0);
    if (!enif_get_uint64(env, argv[0], &want) || !get_order(env, argv[1], &order))
        return enif_make_badarg(env);
    if (!mt_api)
        return mt_nif_no_preload(env);
    int was = mt_api->thread_ignore(1), demangle = 0;
    uint64_t *set;
    int ok = get_query(env, argv + 2, &q, &demangle, &set);
    uint64_t ids = figures().stacks + 1;
    q.order = (uint32_t)order;
    q.limit = ok == 1 ? (want < ids ? want : ids) : 0;
    size_t n = 0;
    struct mtrace_site *buf = q.limit ? enif_alloc((size_t)q.limit * sizeof *buf) : NULL;
    struct mtrace_site total = {0, 0, 0, 0, 0, 0, 0, 0};
    if (q.limit && !buf)
        ok = MTRACE_ERR_NO_MEMORY;
    if (ok == 1) {
        int r = mt_api->sites(&q, buf, &n, &total);
        ok = r == MTRACE_OK ? 1 : r == MTRACE_ERR_NO_MEMORY ? r : 0;
    }
    enif_free(set);
    uint64_t now = mt_api->now_ms();
    ERL_NIF_TERM list = enif_make_list(env, 0);
    struct mt_term_memo frames; /* the sites' common frames, built once */
    mt_term_memo_init(&frames, (uint64_t)n * MTRACE_MAX_DEPTH, FRAME_MEMO_MAX);
    for (size_t i = n; i-- > 0;)
        list = enif_make_list_cell(
            env,
            site_map(env, &buf[i], now,
                     mt_nif_stack_term(env, &frames, buf[i].stack_id, demangle, 1)),
            list);
    mt_term_memo_free(&frames);
    enif_free(buf);
    mt_api->thread_ignore(was);
    return query_result(
        env, ok, enif_make_tuple2(env, site_map(env, &total, now, enif_make_list(env, 0)), list));
}
