/*
 * The read side of the preload: what the NIF (or any reader) may ask, exported
 * as one versioned struct of function pointers (see mtrace_api.h).
 *
 * Queries reduce the table in place (a bounded heap for "oldest n"), so the
 * result is as large as the answer, never as large as the table.  They run
 * with the calling thread ignored, so their own work is not recorded.
 */
#include <string.h>

#include "erlang_frames.h"
#include "interpose.h"
#include "mtrace_api.h"
#include "query.h"
#include "stacks.h"
#include "sampling.h"
#include "table.h"
#include "topn.h"
#include "unwind.h"

/* Oldest first; ties broken by address so results are stable. */
static int younger(const void *pa, const void *pb) {
    const struct mtrace_alloc *a = pa, *b = pb;
    return a->t_ms != b->t_ms ? a->t_ms > b->t_ms : a->addr > b->addr;
}

struct olds_scan {
    struct mt_topn top;
    const struct mtrace_query *q;
};

static void olds_shard(void *ctx, const struct mt_slot *slots, size_t cap) {
    struct olds_scan *o = ctx;
    for (size_t i = 0; i < cap; i++) {
        const struct mt_slot *s = &slots[i];
        if (!s->addr || !mt_query_matches(s, o->q))
            continue;
        struct mtrace_alloc a = {s->addr, s->size, mt_slot_time(s), mt_slot_stack(s), 0};
        mt_topn_offer(&o->top, &a);
    }
}

static size_t api_olds_where(struct mtrace_alloc *out, size_t n, const struct mtrace_query *q) {
    if (!n || !out)
        return 0;
    struct olds_scan o = {{(char *)out, 0, n, sizeof *out, younger}, q};
    int was = mt_thread_ignore(1);
    mt_table_scan(olds_shard, &o);
    mt_thread_ignore(was);
    return mt_topn_sort(&o.top);
}

static size_t api_olds(struct mtrace_alloc *out, size_t n, const struct mtrace_filter *f) {
    struct mtrace_query q = {f ? *f : (struct mtrace_filter){0, 0, 0, 0}, NULL, 0};
    return api_olds_where(out, n, &q);
}

static void api_stats(struct mtrace_stats *out) {
    struct mt_table_figures t;
    struct mt_stack_figures s;
    memset(out, 0, sizeof *out);
    mt_sum_calls(out->calls);
    mt_table_figures(&t);
    mt_stack_figures(&s);
    out->live_count = t.live_count;
    out->live_bytes = t.live_bytes;
    out->dropped = t.dropped;
    out->replaced = t.replaced;
    out->table_bytes = t.table_bytes;
    out->stacks = s.stacks;
    out->stack_bytes = s.bytes;
    out->stacks_dropped = s.dropped;
    out->now_ms = mt_now_ms();
    out->depth = mt_depth();
    out->enabled = (uint32_t)mt_is_enabled();
    out->active = (uint32_t)mt_is_active();
    out->shards = MT_SHARDS;
}

static void api_more_stats(struct mtrace_more_stats *out, size_t size) {
    struct mt_table_figures t;
    struct mtrace_more_stats m;
    memset(&m, 0, sizeof m);
    mt_table_figures(&t);
    m.sample_bytes = mt_sample_bytes();
    m.est_live_count = (t.est_count + MT_WEIGHT_ONE / 2) / MT_WEIGHT_ONE;
    m.est_live_bytes = t.est_bytes;
    if (!m.sample_bytes) { /* lossless: the estimates are the exact figures */
        m.est_live_count = t.live_count;
        m.est_live_bytes = t.live_bytes;
    }
    m.config_garbage = mt_config_garbage();
    m.fast_unwind = (uint32_t)mt_stacks_fast_unwind;
    m.unwind_fallbacks = mt_unwind_fallbacks();
    int allowed;
    m.erlang_frames = (uint32_t)mt_erl_active(&allowed);
    m.erlang_allowed = (uint32_t)allowed;
    struct mt_stack_figures s;
    mt_stack_figures(&s);
    m.erlang_stacks = s.erl_stacks;
    memcpy(out, &m, size < sizeof m ? size : sizeof m);
}

static uint64_t api_reset(void) { return mt_table_reset(); }

static size_t api_sites(struct mtrace_site *out, size_t n, const struct mtrace_query *q, int order,
                        struct mtrace_site *total) {
    int was = mt_thread_ignore(1);
    size_t got = mt_sites(out, n, q, order, total);
    mt_thread_ignore(was);
    return got;
}

__attribute__((visibility("default"))) const struct mtrace_api mtrace_api_v1 = {
    .version = MTRACE_API_VERSION,
    .size = sizeof(struct mtrace_api),
    .stats = api_stats,
    .olds = api_olds,
    .reset = api_reset,
    .stack = mt_stack_get,
    .set_enabled = mt_set_enabled,
    .thread_ignore = mt_thread_ignore,
    .now_ms = mt_now_ms,
    .more_stats = api_more_stats,
    .sites = api_sites,
    .olds_where = api_olds_where,
    .erlang_frames = mt_erl_setup,
    .erlang_stack = mt_stack_erl,
};
