/*
 * A tracked thread's registration and exit (threads.c): its counters, and
 * a pthread key whose destructor gives back its struct of counters and its
 * stacks' memory.
 */
#ifndef MT_THREADS_H
#define MT_THREADS_H

#include <stdint.h>

#include "tracker.h"

/* Calls of this thread counted in the shared counters (the registry was
 * full, or it exited): thread exit tells a quiet round by them too. */
extern MT_TLS uint64_t mt_shared_calls;

/* On a thread's first counted call: takes its counters, sets the key. */
void mt_thread_register(void);

/* The constructor: the key is made by then; a thread registered before
 * (the main thread, or one a dependency's constructor started) sets it. */
void mt_threads_loaded(void);

/* A fork child: a key its parent was making in another thread is made again. */
void mt_threads_forked(void);

#endif
