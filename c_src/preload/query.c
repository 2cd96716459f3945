/*
 * olds: the live allocations a query considers, oldest (or largest) first.
 *
 * The table is reduced in place by a bounded heap of the limit's size in
 * the caller's buffer, so the answer is as large as asked for, never as
 * large as the table, and nothing is allocated.
 */
#include "query.h"
#include "topn.h"

/* Oldest first; ties broken by address so results are stable. */
static int younger(const void *pa, const void *pb) {
    const struct mtrace_alloc *a = pa, *b = pb;
    return a->t_ms != b->t_ms ? a->t_ms > b->t_ms : a->addr > b->addr;
}

/* Largest first, then oldest first. */
static int smaller(const void *pa, const void *pb) {
    const struct mtrace_alloc *a = pa, *b = pb;
    return a->size != b->size ? a->size < b->size : younger(a, b);
}

struct olds_scan {
    struct mt_topn top;
    const struct mtrace_query *q;
};

static void olds_entries(void *ctx, const struct mt_entry *e, size_t n) {
    struct olds_scan *o = ctx;
    for (size_t i = 0; i < n; i++) {
        if (!mt_query_matches(&e[i], o->q))
            continue;
        struct mtrace_alloc a = {e[i].addr, e[i].size, e[i].t_ms, e[i].stack, 0};
        mt_topn_offer(&o->top, &a);
    }
}

enum mtrace_result mt_olds(const struct mtrace_query *q, struct mtrace_alloc *out,
                           size_t *written) {
    if (written)
        *written = 0;
    if (!q || !written || (q->limit && !out) ||
        (q->order != MTRACE_BY_OLDEST && q->order != MTRACE_BY_BYTES))
        return MTRACE_ERR_ARGUMENT;
    if (!q->limit)
        return MTRACE_OK;
    mt_worse_fn worse = q->order == MTRACE_BY_OLDEST ? younger : smaller;
    struct olds_scan o = {{(char *)out, 0, (size_t)q->limit, sizeof *out, worse}, q};
    mt_table_scan(olds_entries, &o);
    *written = mt_topn_sort(&o.top);
    return MTRACE_OK;
}
