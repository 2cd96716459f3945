/*
 * NIF half of the VM-level benchmark (bench/vm.sh, bench/vm_churn.erl):
 * mtrace_bench_churn:churn(Pairs) runs on a dirty CPU scheduler and does
 * Pairs malloc/free pairs the way a native library inside a node would, so
 * the preload's cost shows up in beam.smp itself, next to ordinary Erlang
 * work, rather than in a standalone C program (bench/churn.c).
 * A live window of 4096 blocks; each step frees a random one and mallocs a
 * replacement of 16..1040 bytes.  Returns ok.  churn_enif(Pairs) does the
 * same with enif_alloc/enif_free.
 */
#include <stdint.h>
#include <stdlib.h>

#include <erl_nif.h>

#define WINDOW 4096

static inline uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The same churn through malloc/free, or through enif_alloc/enif_free (the
 * VM's driver_alloc, or malloc with +MRe false). */
static ERL_NIF_TERM churn_with(ErlNifEnv *env, const ERL_NIF_TERM argv[], void *(*alloc)(size_t),
                               void (*release)(void *)) {
    ErlNifUInt64 pairs;
    if (!enif_get_uint64(env, argv[0], &pairs))
        return enif_make_badarg(env);
    /* Heap, not stack: dirty scheduler stacks are small and configurable. */
    void **window = calloc(WINDOW, sizeof *window);
    if (!window)
        return enif_raise_exception(env, enif_make_atom(env, "enomem"));
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (ErlNifUInt64 i = 0; i < pairs; i++) {
        uint64_t r = next(&rng);
        size_t k = r & (WINDOW - 1);
        if (window[k])
            release(window[k]);
        char *p = alloc(16 + (r >> 16) % 1025);
        if (p)
            p[0] = (char)r; /* touch it, as a real user would */
        window[k] = p;
    }
    for (size_t k = 0; k < WINDOW; k++)
        if (window[k])
            release(window[k]);
    free(window);
    return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM churn(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    return churn_with(env, argv, malloc, free);
}

static ERL_NIF_TERM churn_enif(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
    return churn_with(env, argv, enif_alloc, enif_free);
}

/* Dirty: a multi-second NIF must not block a normal scheduler. */
static ErlNifFunc funcs[] = {{"churn", 1, churn, ERL_NIF_DIRTY_JOB_CPU_BOUND},
                             {"churn_enif", 1, churn_enif, ERL_NIF_DIRTY_JOB_CPU_BOUND}};

ERL_NIF_INIT(mtrace_bench_churn, funcs, NULL, NULL, NULL, NULL)
