/*
 * The contract (mtrace_api.h) as this library implements it: one exported,
 * versioned struct of function pointers, and stats, which gathers every
 * part's figures.  The only file that knows all the parts.
 */
#include <string.h>

#include "counters.h"
#include "erlang_frames.h"
#include "estimate.h"
#include "mtrace_api.h"
#include "objects.h"
#include "query.h"
#include "stacks.h"
#include "unloads.h"
#include "state.h"
#include "table.h"
#include "tracker.h"
#include "unwind.h"
#include "unwind_fallback.h"

/* The calls that take the tracker's locks run with the calling thread
 * marked busy (as reset and the switch do): a signal handler's malloc or
 * free on this thread meanwhile goes straight to libc instead of waiting
 * for a lock that its own thread holds.  (A recorded block such a handler
 * frees then stays in the table, as one freed by a handler that
 * interrupts a record.) */
static enum mtrace_result api_olds(const struct mtrace_query *q, struct mtrace_alloc *out,
                                   size_t *written) {
    unsigned char was = mt_tracker_enter();
    enum mtrace_result r = mt_olds(q, out, written);
    mt_tracker_leave(was);
    return r;
}

static enum mtrace_result api_sites(const struct mtrace_query *q, struct mtrace_site *out,
                                    size_t *written, struct mtrace_site *total) {
    unsigned char was = mt_tracker_enter();
    enum mtrace_result r = mt_sites(q, out, written, total);
    mt_tracker_leave(was);
    return r;
}

static enum mtrace_result api_stats(struct mtrace_stats *out, size_t size) {
    if (!out)
        return MTRACE_ERR_ARGUMENT;
    struct mtrace_stats s;
    struct mt_table_figures t;
    struct mt_stack_figures k;
    memset(&s, 0, sizeof s);
    unsigned char was = mt_tracker_enter(); /* the counters' lock, as above */
    mt_counts_sum(s.calls);
    mt_tracker_leave(was);
    mt_table_figures(&t);
    mt_stack_figures(&k);
    s.live_count = t.live_count;
    s.live_bytes = t.live_bytes;
    s.dropped = t.dropped + mt_tracker_dropped();
    s.replaced = t.replaced;
    s.table_bytes = t.table_bytes;
    s.stacks = k.stacks;
    s.stack_bytes = k.bytes;
    s.stacks_dropped = k.dropped;
    s.now_ms = mt_now_ms();
    s.active = (uint32_t)mt_tracker_active();
    s.depth = mt_state.cfg.depth;
    s.enabled = s.active && atomic_load(&mt_state.enabled);
    s.shards = MT_SHARDS;
    s.sample_bytes = mt_state.sample_mean;
    s.est_live_count = s.sample_bytes ? mt_estimate_count(t.est_count) : t.live_count;
    s.est_live_bytes = s.sample_bytes ? t.est_bytes : t.live_bytes;
    s.config_garbage = mt_state.cfg.garbage;
    s.fast_unwind = (uint32_t)mt_state.fast_unwind;
    s.unwind_fallbacks = mt_unwind_fallbacks();
    int allowed;
    s.erlang_frames = (uint32_t)mt_erl_active(&allowed);
    s.erlang_allowed = (uint32_t)allowed;
    s.erlang_stacks = k.erl_stacks;
    s.reset_ms = atomic_load(&mt_state.reset_ms);
    s.unwind_cut = mt_fallback_cut() + mt_unwind_cut();
#ifdef MT_NO_LIBUNWIND
    s.libunwind_loaded = 2; /* a build without it (musl) */
#else
    s.libunwind_loaded = (uint32_t)mt_fallback_loaded();
#endif
    memcpy(out, &s, size < sizeof s ? size : sizeof s);
    return MTRACE_OK;
}

__attribute__((visibility("default"))) const uint32_t mtrace_api_version = MTRACE_API_VERSION;

__attribute__((visibility("default"))) const struct mtrace_api mtrace_api_v2 = {
    .version = MTRACE_API_VERSION,
    .size = sizeof(struct mtrace_api),
    .stats = api_stats,
    .olds = api_olds,
    .sites = api_sites,
    .reset = mt_tracker_reset,
    .stack = mt_stack_get,
    .erlang_stack = mt_stack_erl,
    .set_enabled = mt_tracker_set_enabled,
    .thread_ignore = mt_thread_ignore,
    .now_ms = mt_now_ms,
    .erlang_frames = mt_erl_setup,
    .objects = mt_objects_each,
    .object_at = mt_object_at,
    .objects_generation = mt_unloads_generation,
    .stack_epoch = mt_stack_epoch,
    .unloaded_since = mt_unloaded_since,
};
