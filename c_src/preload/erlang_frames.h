/*
 * Erlang frames: the Erlang call chain of the process whose NIF is calling
 * malloc, read from the VM's own structures at the offsets a reader found
 * and checked (struct mtrace_erlang_layout).  Off until a layout is given.
 */
#ifndef MT_ERLANG_FRAMES_H
#define MT_ERLANG_FRAMES_H

#include <stdint.h>

#include "mtrace_api.h"

/* In a fork() child: Erlang frames off. */
void mt_erl_forked(void);

/* api->erlang_frames: see mtrace_api.h.  MTRACE_ERLANG (mt_state.cfg.erlang)
 * says whether a layout may be accepted at all. */
enum mtrace_result mt_erl_setup(const struct mtrace_erlang_layout *layout);

/* 1 while frames are captured; *allowed says whether MTRACE_ERLANG permits them. */
int mt_erl_active(int *allowed);

/* Whether the calling thread is running a NIF while frames are captured
 * (mt_erl_capture would then take some). */
int mt_erl_in_nif(void);

/* The calling thread's Erlang frames if it is running a NIF: the NIF's own
 * frame, then the return addresses on its process's stack, innermost first,
 * at most max.  Returns 0 elsewhere.  *unchanged says they are those of
 * this thread's previous capture (which therefore took Erlang frames too).
 * Reads memory only; never calls malloc. */
uint32_t mt_erl_capture(uintptr_t *pcs, uint32_t max, int *unchanged);

/* Names a captured frame (module, function, arity, file, line). */
void mt_erl_name(uintptr_t pc, struct mtrace_erl_frame *out);
/* Whether the code at each of n pcs is still what mt_erl_name named (the
 * function, line and file): once a module is purged, the JIT may load
 * other code, or another version of it, at the same addresses.  A lookup
 * each in the VM's code index, no lock taken. */
int mt_erl_names_hold(const uintptr_t *pcs, const struct mtrace_erl_frame *names, uint32_t n);
/* The same for the NIF frames among them only (a NIF's {M, F, A} read
 * where its pc points): no lookup. */
int mt_erl_nifs_named(const uintptr_t *pcs, const struct mtrace_erl_frame *names, uint32_t n);
/* A value that moves before code at a purged module's addresses can run
 * (the VM's thread progress): while it stands still, names checked since
 * still hold.  0 = not known (without the VM's counter): check. */
uint64_t mt_erl_progress(void);

#endif
