/*
 * What the two halves of the NIF share: the preload's API as found at load
 * time, the atoms, and small term builders.  nif.c registers the functions
 * and answers the cheap calls; nif_query.c answers the queries that scan the
 * table and name stacks.
 */
#ifndef MT_NIF_H
#define MT_NIF_H

#include <stdbool.h>
#include <stddef.h>

#include <erl_nif.h>

#include "mtrace_api.h"

/* NULL when the preload is absent, or of another release: every call then
 * answers mt_nif_no_preload. */
extern const struct mtrace_api *mt_api;

struct mt_atoms {
    ERL_NIF_TERM ok, true_, false_, nil, error, not_preloaded, preload_mismatch, enomem;
    ERL_NIF_TERM seed, maps; /* the forms of olds */
    ERL_NIF_TERM bytes, count, oldest;
    /* keys of frame, site and old maps */
    ERL_NIF_TERM lib, symbol, file, line, addr, inlined, offset;
    ERL_NIF_TERM newest, frames, age, size, ns, est_count, est_bytes;
    /* keys of Erlang frame maps, and the lib of Erlang frames in the seed's pairs */
    ERL_NIF_TERM module, function, arity, erlang;
};
extern struct mt_atoms mt_atoms;

ERL_NIF_TERM mt_nif_binary(ErlNifEnv *env, const char *s);

/* bool, not int: a 64-bit count given as a truth value (sample_bytes of
 * 2^32) must not be cut to its low 32 bits, which may all be 0. */
static inline ERL_NIF_TERM mt_nif_boolean(bool on) { return on ? mt_atoms.true_ : mt_atoms.false_; }
ERL_NIF_TERM mt_nif_error(ErlNifEnv *env, ERL_NIF_TERM reason);
/* {error, not_preloaded}, or {error, preload_mismatch} for a preload of another release. */
ERL_NIF_TERM mt_nif_no_preload(ErlNifEnv *env);

ERL_NIF_TERM mt_nif_olds(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM mt_nif_sites(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]);

/* nif_erlang.c: the checks that turn Erlang frames on, and their terms. */
ERL_NIF_TERM mt_nif_erlang_layout(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]);
ERL_NIF_TERM mt_nif_erlang_layout_dirty(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]);
/* Why Erlang frames are off ("" when on), copied into out. */
#define MT_ERLANG_REASON_MAX 200
void mt_erlang_reason(char *out, size_t len);
/* #{module, function, arity, file, line, addr, ...} */
ERL_NIF_TERM mt_erlang_frame_map(ErlNifEnv *env, const struct mtrace_erl_frame *f);
/* The seed's pair form: {erlang, {M, F, A}} ({erlang, nil} when unnamed). */
ERL_NIF_TERM mt_erlang_frame_pair(ErlNifEnv *env, const struct mtrace_erl_frame *f);

#endif
