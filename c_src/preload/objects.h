/*
 * The loaded objects, as the dynamic loader lists them: which one holds an
 * address, and whether the list changed since a reader last looked.  The
 * walker (eh_frame.c) finds unwind tables through it, the symbolizer (in
 * the NIF, through the contract) its files; both see loads and unloads by
 * the same generation.  Asks dl_iterate_phdr each time: no allocation, and
 * nothing cached that an unload could leave stale.
 */
#ifndef MT_OBJECTS_H
#define MT_OBJECTS_H

#include <stdint.h>

#include "mtrace_api.h"

void mt_objects_each(mtrace_object_fn fn, void *ctx);

/* MTRACE_OK and *out filled, or MTRACE_ERR_ARGUMENT when no loaded segment
 * holds addr (out->generation is filled either way). */
enum mtrace_result mt_object_at(uintptr_t addr, struct mtrace_object *out);

/* Objects loaded plus objects unloaded, ever: changes with every dlopen
 * that maps something and every dlclose that unmaps it. */
uint64_t mt_objects_generation(void);

/* Around fork: no lookup is under way in the loader's list meanwhile. */
void mt_objects_lock(void);
void mt_objects_unlock(void);

/* The address of obj's PT_GNU_EH_FRAME (its .eh_frame_hdr), or NULL. */
const uint8_t *mt_object_eh_frame_hdr(const struct mtrace_object *o);

#endif
