/*
 * libunwind, for the stacks the fast walker (unwind.h) gives up on: loaded
 * with dlopen into traced processes only, so that the programs a traced
 * node starts (its shell scripts, erl_child_setup, port programs) do not
 * pay for loading it and liblzma, and its symbols (it exports the whole
 * _Unwind_* ABI and backtrace) stay out of every process's global scope.
 */
#ifndef MT_UNWIND_FALLBACK_H
#define MT_UNWIND_FALLBACK_H

/* Loads libunwind; once, from this library's constructor in a traced
 * process (dlopen is not safe inside a malloc hook). */
void mt_fallback_load(void);

/* unw_backtrace, under a lock that fork also holds; -1 when libunwind is
 * not loaded (not yet, not installed, or a build without it). */
int mt_fallback_backtrace(void **buf, int max);

/* Around fork (see tracker.c). */
void mt_fallback_lock(void);
void mt_fallback_unlock(void);

#endif
