/*
 * The read side of the preload: what the NIF (or any reader) may ask, exported
 * as one versioned struct of function pointers (see mtrace_api.h).
 *
 * Queries reduce the table in place (a bounded heap for "oldest n"), so the
 * result is as large as the answer, never as large as the table.  They run
 * with the calling thread ignored, so their own work is not recorded.
 */
#include <string.h>

#include "interpose.h"
#include "mtrace_api.h"
#include "stacks.h"
#include "sampling.h"
#include "table.h"
#include "unwind.h"

static int matches(const struct mt_slot *s, const struct mtrace_filter *f) {
    if (!f)
        return 1;
    uint64_t t = mt_slot_time(s);
    return (!f->min_t_ms || t >= f->min_t_ms) && (!f->max_t_ms || t <= f->max_t_ms) &&
           (!f->min_size || s->size >= f->min_size) && (!f->max_size || s->size <= f->max_size);
}

/* Orders by age, oldest first; ties broken by address so results are stable. */
static int younger(const struct mtrace_alloc *a, const struct mtrace_alloc *b) {
    return a->t_ms != b->t_ms ? a->t_ms > b->t_ms : a->addr > b->addr;
}

/* A max-heap on youngest: its root is the entry to evict for an older one. */
struct olds_heap {
    struct mtrace_alloc *h;
    size_t len, cap;
    const struct mtrace_filter *f;
};

static void sift_down(struct mtrace_alloc *h, size_t len, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < len && younger(&h[l], &h[top]))
            top = l;
        if (r < len && younger(&h[r], &h[top]))
            top = r;
        if (top == i)
            return;
        struct mtrace_alloc t = h[i];
        h[i] = h[top];
        h[top] = t;
        i = top;
    }
}

static void sift_up(struct mtrace_alloc *h, size_t i) {
    while (i && younger(&h[i], &h[(i - 1) / 2])) {
        struct mtrace_alloc t = h[i];
        h[i] = h[(i - 1) / 2];
        h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static void olds_shard(void *ctx, const struct mt_slot *slots, size_t cap) {
    struct olds_heap *q = ctx;
    for (size_t i = 0; i < cap; i++) {
        const struct mt_slot *s = &slots[i];
        if (!s->addr || !matches(s, q->f))
            continue;
        struct mtrace_alloc a = {s->addr, s->size, mt_slot_time(s), mt_slot_stack(s), 0};
        if (q->len < q->cap) {
            q->h[q->len] = a;
            sift_up(q->h, q->len++);
        } else if (younger(&q->h[0], &a)) {
            q->h[0] = a;
            sift_down(q->h, q->len, 0);
        }
    }
}

static size_t api_olds(struct mtrace_alloc *out, size_t n, const struct mtrace_filter *f) {
    if (!n || !out)
        return 0;
    struct olds_heap q = {out, 0, n, f};
    int was = mt_thread_ignore(1);
    mt_table_scan(olds_shard, &q);
    mt_thread_ignore(was);
    /* Heap sort in place: repeatedly move the youngest to the end. */
    for (size_t len = q.len; len > 1; len--) {
        struct mtrace_alloc t = out[0];
        out[0] = out[len - 1];
        out[len - 1] = t;
        sift_down(out, len - 1, 0);
    }
    return q.len;
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
    memcpy(out, &m, size < sizeof m ? size : sizeof m);
}

static uint64_t api_reset(void) { return mt_table_reset(); }

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
};
