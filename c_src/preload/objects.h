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

/* The same for the walker, inside an allocation: 0 while a fork is under
 * way and in a fork child, where it must not wait for the loader's lock. */
uint64_t mt_objects_generation_walking(void);

/* For the walker, inside an allocation: the object holding addr and its
 * .eh_frame_hdr (*hdr, NULL if it has none), MTRACE_OK; else
 * MTRACE_ERR_ARGUMENT.  While a fork is under way it looks nothing up and
 * returns MT_OBJECTS_CLOSED, where the others wait for the fork to end.
 * In a fork child it never asks dl_iterate_phdr, whose lock another thread
 * of the parent may have held at the fork (objects.c): it asks glibc's
 * lock-free _dl_find_object (2.35 and later, where this library was built
 * and runs), with out->generation 0 (so that nothing found is kept), or
 * returns MT_OBJECTS_CLOSED. */
#define MT_OBJECTS_CLOSED 1
int mt_object_at_walking(uintptr_t addr, struct mtrace_object *out, const uint8_t **hdr);

/* 1 in a fork child (until it execs): libunwind, which asks
 * dl_iterate_phdr, must not be called there either. */
int mt_objects_forked(void);
/* Whether the calling thread is inside a lookup (a signal handler's fork
 * must not wait for it: tracker.c). */
int mt_objects_mine(void);

/* Finds _dl_find_object, as a traced process configures (dlsym may
 * allocate: the caller keeps its thread out of the table meanwhile). */
void mt_objects_init(void);

/* Around fork, before the tracer's other locks are taken: no lookup is
 * under way in the loader's list until mt_objects_open (the child's:
 * _child, the other threads did not come along). */
void mt_objects_close(void);
void mt_objects_open(void);
void mt_objects_open_child(void);

/* The address of obj's PT_GNU_EH_FRAME (its .eh_frame_hdr), or NULL. */
const uint8_t *mt_object_eh_frame_hdr(const struct mtrace_object *o);

#endif
