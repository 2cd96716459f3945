/*
 * libunwind, for the stacks the fast walker (unwind.h) gives up on: loaded
 * with dlopen into traced processes only, so that the programs a traced
 * node starts (its shell scripts, erl_child_setup, port programs) do not
 * pay for loading it and liblzma, and its symbols (it exports the whole
 * _Unwind_* ABI and backtrace) stay out of every process's global scope.
 */
#ifndef MT_UNWIND_FALLBACK_H
#define MT_UNWIND_FALLBACK_H

#include <stdint.h>

/* Loads libunwind; once, from this library's constructor in a traced
 * process (dlopen is not safe inside a malloc hook). */
void mt_fallback_load(void);
/* Whether it was (libunwind.so.8 found and usable). */
int mt_fallback_loaded(void);

/* unw_backtrace; -1 when libunwind is not loaded (not yet, not installed,
 * or a build without it), when another walk stayed inside it too long or
 * a fork is under way (these two counted by mt_fallback_cut). */
int mt_fallback_backtrace(void **buf, int max);
uint64_t mt_fallback_cut(void);

/* Whether libunwind has walked on the calling thread before.  Its first
 * walk there allocates (its thread-local storage, through the loader's
 * malloc), which a signal handler must not do: stacks.c asks first. */
int mt_fallback_warm(void);
/* A walk kept cut short instead of asking libunwind (mt_fallback_cut). */
void mt_fallback_count_cut(void);

/* 1 while the calling thread's walk is inside libunwind. */
int mt_fallback_running(void);

/* Around fork (see tracker.c): close waits for the walks inside libunwind
 * to end and turns new ones away until open (the child's: _child). */
void mt_fallback_close(void);
void mt_fallback_open(void);
void mt_fallback_open_child(void);

#endif
