/*
 * Stacks as terms (nif_stacks.c): the one way the NIF's answers name them.
 */
#ifndef MT_NIF_STACKS_H
#define MT_NIF_STACKS_H

#include <stdint.h>

#include "nif.h"
#include "term_memo.h"

/* A stack as a list, innermost first: its native frames, then its Erlang
 * frames (if any) from the NIF itself outwards.  With maps: a frame map per
 * level of inlined code at each address, then one for the function that
 * holds them.  Without: the seed's {lib, symbol}, symbol being the ELF
 * function that contains the address (the outermost of any inlined chain).
 * Frames are shared through `frames` (NULL: no memo), and named again if
 * objects were loaded or unloaded meanwhile. */
ERL_NIF_TERM mt_nif_stack_term(ErlNifEnv *env, struct mt_term_memo *frames, uint32_t stack_id,
                               int demangle, int maps);

/* How many times a stack is named at most while objects keep changing. */
#define MT_NAMING_TRIES 4

/* The loaded objects' generation (mtrace_api.h) once no dlclose is under
 * way; an answer waits for that some 20 ms in all, from its
 * mt_nif_naming_begin on. */
void mt_nif_naming_begin(void);
uint64_t mt_nif_settled_generation(void);

#endif
