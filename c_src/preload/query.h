/*
 * What the read side shares between its queries (query.c, sites.c): which
 * table entries a query considers.
 */
#ifndef MT_QUERY_H
#define MT_QUERY_H

#include "mtrace_api.h"
#include "table.h"

static inline int mt_query_keeps_stack(const struct mtrace_query *q, uint32_t id) {
    return !q->stack_set || (id < q->stack_set_bits && ((q->stack_set[id / 64] >> (id % 64)) & 1u));
}

/* Whether a non-empty slot matches q (NULL = everything). */
static inline int mt_query_matches(const struct mt_slot *s, const struct mtrace_query *q) {
    if (!q)
        return 1;
    const struct mtrace_filter *f = &q->filter;
    uint64_t t = mt_slot_time(s);
    return (!f->min_t_ms || t >= f->min_t_ms) && (!f->max_t_ms || t <= f->max_t_ms) &&
           (!f->min_size || s->size >= f->min_size) && (!f->max_size || s->size <= f->max_size) &&
           mt_query_keeps_stack(q, mt_slot_stack(s));
}

/* The n top sites (see mtrace_api.h, sites). */
size_t mt_sites(struct mtrace_site *out, size_t n, const struct mtrace_query *q, int order,
                struct mtrace_site *total);

#endif
