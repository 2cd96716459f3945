/*
 * Handing the Erlang frames layout to the preload, across builds of one
 * version: a preload built before the tracing stubs were added knows only
 * the layout without them (see mtrace_api.h).
 */
#ifndef MT_ERLANG_LAYOUT_H
#define MT_ERLANG_LAYOUT_H

#include <stddef.h>

#include "mtrace_api.h"

typedef enum mtrace_result (*mt_layout_fn)(const struct mtrace_erlang_layout *layout);

/* Gives l to the preload's erlang_frames, and, when that preload refuses
 * its size, the shorter layout it knows (the stubs then go unused). */
static inline enum mtrace_result mt_give_layout(mt_layout_fn give,
                                                const struct mtrace_erlang_layout *l) {
    enum mtrace_result r = give(l);
    if (r == MTRACE_ERR_ARGUMENT) {
        struct mtrace_erlang_layout older = *l;
        older.size = MTRACE_ERLANG_LAYOUT_NO_STUBS;
        r = give(&older);
    }
    return r;
}

#endif
