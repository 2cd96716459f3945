/*
 * NIF half of the VM-level benchmark (bench/vm.sh, bench/vm_churn.erl):
 * mtrace_bench_churn:churn(Pairs) runs on a dirty CPU scheduler and does
 * Pairs malloc/free pairs the way a native library inside a node would, so
 * the preload's cost shows up in beam.smp itself, next to ordinary Erlang
 * work, rather than in a standalone C program (bench/churn.c).
 * A live window of 4096 blocks; each step frees a random one and mallocs a
 * replacement of 16..1040 bytes.  Returns ok.
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

static ERL_NIF_TERM churn(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    (void)argc;
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
        free(window[k]);
        char *p = malloc(16 + (r >> 16) % 1025);
        if (p)
            p[0] = (char)r; /* touch it, as a real user would */
        window[k] = p;
    }
    for (size_t k = 0; k < WINDOW; k++)
        free(window[k]);
    free(window);
    return enif_make_atom(env, "ok");
}

/* Dirty: a multi-second NIF must not block a normal scheduler. */
static ErlNifFunc funcs[] = {{"churn", 1, churn, ERL_NIF_DIRTY_JOB_CPU_BOUND}};

ERL_NIF_INIT(mtrace_bench_churn, funcs, NULL, NULL, NULL, NULL)
