/*
 * Code unloaded by dlclose, for stacks recorded before it: once another
 * library is loaded at its addresses, their frames would read as that
 * library's.  Each dlclose that unmaps code starts a new epoch and logs the
 * address ranges it unmapped; an interned stack keeps the epoch as of which
 * its frames were last known to be the code they were walked in (stacks.c),
 * and a reader asks whether a frame's address was unloaded since.  Unloads
 * the interposed dlclose does not see (the C library's own), or makes in a
 * fork child, are not logged; where it could not tell what a dlclose
 * unloaded (no memory for its snapshot) the whole address space is.
 */
#ifndef MT_UNLOADS_H
#define MT_UNLOADS_H

#include <stdint.h>

/* real(handle), dlclose itself, noting which objects' code it unmapped. */
int mt_unloads_dlclose(int (*real)(void *), void *handle);

/* The loader's count of loads and unloads, moved on by each dlclose once
 * its unload is logged too, times two; plus one while a dlclose is under
 * way (its unload not logged yet).  The API's objects_generation. */
uint64_t mt_unloads_generation(void);

/* Dlcloses that unmapped code so far. */
uint32_t mt_unloads_epoch(void);

/* Notes the code that is never unloaded (the program's, the C
 * library's); by the constructor, once. */
void mt_unloads_started(void);

/* Whether addr lay in code unloaded after epoch; 1 also when the log no
 * longer reaches back to epoch (a name then is not given rather than a
 * wrong one), but never for the program's or the C library's code. */
int mt_unloaded_since(uint32_t epoch, uintptr_t addr);

#endif
