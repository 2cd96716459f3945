/*
 * The read side's queries over the table (query.c: olds, sites.c: sites),
 * and the one test of which entries a query considers.
 */
#ifndef MT_QUERY_H
#define MT_QUERY_H

#include "mtrace_api.h"
#include "table.h"

static inline int mt_query_keeps_stack(const struct mtrace_query *q, uint32_t id) {
    return !q->stack_set || (id < q->stack_set_bits && ((q->stack_set[id / 64] >> (id % 64)) & 1u));
}

/* Whether an entry is one q considers. */
static inline int mt_query_matches(const struct mt_entry *e, const struct mtrace_query *q) {
    return e->t_ms >= q->min_t_ms && e->t_ms <= q->max_t_ms && e->size >= q->min_size &&
           e->size <= q->max_size && mt_query_keeps_stack(q, e->stack);
}

/* api->olds and api->sites (see mtrace_api.h). */
enum mtrace_result mt_olds(const struct mtrace_query *q, struct mtrace_alloc *out, size_t *written);
enum mtrace_result mt_sites(const struct mtrace_query *q, struct mtrace_site *out, size_t *written,
                            struct mtrace_site *total);

#endif
