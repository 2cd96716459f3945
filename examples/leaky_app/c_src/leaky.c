/*
 * leaky_nif: a NIF that leaks on purpose, so that mtrace has something to find.
 *
 * leaky_app_cache_entry() mallocs 4096 bytes and forgets them.  It is static
 * and never inlined (and built with -O1 -g -fno-inline
 * -fno-optimize-sibling-calls), so it stays a real frame of its own: mtrace
 * reports it as frame 0, the function that called malloc.
 */
#include <stdlib.h>
#include <string.h>

#include <erl_nif.h>

#define ENTRY_SIZE 4096

static void *volatile last_entry; /* keeps the compiler from dropping the malloc */

static __attribute__((noinline)) void *leaky_app_cache_entry(unsigned long i) {
    char *p = malloc(ENTRY_SIZE);
    __asm__ __volatile__("" ::: "memory");
    if (p)
        memset(p, (int)(i & 0xff), ENTRY_SIZE);
    return p;
}

/* leak(count) -> number of 4096-byte blocks leaked (never freed). */
static ERL_NIF_TERM leak(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[]) {
    unsigned long count, done = 0;
    (void)argc;
    if (!enif_get_ulong(env, argv[0], &count))
        return enif_make_badarg(env);
    for (unsigned long i = 0; i < count; i++) {
        void *p = leaky_app_cache_entry(i);
        if (!p)
            break;
        last_entry = p;
        done++;
    }
    return enif_make_ulong(env, done);
}

static ErlNifFunc funcs[] = {{"leak", 1, leak, 0}};

ERL_NIF_INIT(Elixir.LeakyApp.Native, funcs, NULL, NULL, NULL, NULL)
