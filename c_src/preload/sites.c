/*
 * Leak sites: live allocations grouped by the stack that made them.
 *
 * Stack ids are dense (1, 2, 3, ... as stacks are interned), so the groups
 * are a flat array indexed by id: one pass over the table adds each entry to
 * its stack's totals, one pass over the array keeps the top n.  The array is
 * mapped for the query and unmapped after it, so a query never calls malloc
 * and leaves nothing behind; it costs 48 bytes per interned stack.
 */
#include <stdint.h>
#include <sys/mman.h>

#include "query.h"
#include "estimate.h"
#include "state.h"
#include "stacks.h"
#include "topn.h"

struct group {
    uint64_t count, bytes, oldest, newest;
    uint64_t est_count, est_bytes; /* est_count in MT_WEIGHT_ONE units; sampling only */
};

struct sites_scan {
    struct group *groups;
    size_t ids; /* ids below this were interned when the query began */
    const struct mtrace_query *q;
};

static void sites_entries(void *ctx, const struct mt_entry *e, size_t n) {
    struct sites_scan *sc = ctx;
    for (size_t i = 0; i < n; i++) {
        const struct mt_entry *s = &e[i];
        uint32_t id = s->stack;
        if (id >= sc->ids || !mt_query_matches(s, sc->q))
            continue;
        struct group *g = &sc->groups[id];
        uint64_t t = s->t_ms;
        if (!g->count || t < g->oldest)
            g->oldest = t;
        if (!g->count || t > g->newest)
            g->newest = t;
        g->count++;
        g->bytes += s->size;
        if (mt_state.sample_mean) {
            struct mt_estimate e = mt_estimate_of(s->size);
            g->est_count += e.weight;
            g->est_bytes += e.bytes;
        }
    }
}

/* Ties fall to the lower stack id, so equal sites keep a stable order. */
static int tie(const struct mtrace_site *a, const struct mtrace_site *b) {
    return a->stack_id > b->stack_id;
}

static int fewer_bytes(const void *pa, const void *pb) {
    const struct mtrace_site *a = pa, *b = pb;
    if (a->est_bytes != b->est_bytes)
        return a->est_bytes < b->est_bytes;
    return a->est_count != b->est_count ? a->est_count < b->est_count : tie(a, b);
}

static int fewer_blocks(const void *pa, const void *pb) {
    const struct mtrace_site *a = pa, *b = pb;
    if (a->est_count != b->est_count)
        return a->est_count < b->est_count;
    return a->est_bytes != b->est_bytes ? a->est_bytes < b->est_bytes : tie(a, b);
}

static int newer(const void *pa, const void *pb) {
    const struct mtrace_site *a = pa, *b = pb;
    if (a->oldest_t_ms != b->oldest_t_ms)
        return a->oldest_t_ms > b->oldest_t_ms;
    return a->est_bytes != b->est_bytes ? a->est_bytes < b->est_bytes : tie(a, b);
}

static void add_to_total(struct mtrace_site *total, const struct mtrace_site *s) {
    if (!total->count || s->oldest_t_ms < total->oldest_t_ms)
        total->oldest_t_ms = s->oldest_t_ms;
    if (!total->count || s->newest_t_ms > total->newest_t_ms)
        total->newest_t_ms = s->newest_t_ms;
    total->count += s->count;
    total->bytes += s->bytes;
    total->est_count += s->est_count;
    total->est_bytes += s->est_bytes;
}

enum mtrace_result mt_sites(const struct mtrace_query *q, struct mtrace_site *out, size_t *written,
                            struct mtrace_site *total) {
    static const mt_worse_fn worse[] = {fewer_bytes, fewer_blocks, newer};
    if (written)
        *written = 0;
    if (!q || !written || q->order > MTRACE_BY_OLDEST || (q->limit && !out))
        return MTRACE_ERR_ARGUMENT;
    struct mt_stack_figures f;
    mt_stack_figures(&f);
    size_t ids = (size_t)f.stacks + 1; /* id 0 groups the allocations without a stack */
    size_t len = ids * sizeof(struct group);
    struct group *groups =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (groups == MAP_FAILED)
        return MTRACE_ERR_NO_MEMORY;
    struct sites_scan sc = {groups, ids, q};
    mt_table_scan(sites_entries, &sc);

    struct mt_topn top = {(char *)out, 0, (size_t)q->limit, sizeof *out, worse[q->order]};
    struct mtrace_site sum = {0, 0, 0, 0, 0, 0, 0, 0};
    uint64_t sum_weights = 0; /* rounded once, not per site */
    for (size_t id = 0; id < ids; id++) {
        const struct group *g = &groups[id];
        if (!g->count)
            continue;
        struct mtrace_site s = {(uint32_t)id, 0,         g->count, g->bytes,
                                g->oldest,    g->newest, g->count, g->bytes};
        if (mt_state.sample_mean) {
            s.est_count = mt_estimate_count(g->est_count);
            s.est_bytes = g->est_bytes;
        }
        add_to_total(&sum, &s);
        sum_weights += g->est_count;
        mt_topn_offer(&top, &s);
    }
    munmap(groups, len);
    if (mt_state.sample_mean)
        sum.est_count = mt_estimate_count(sum_weights);
    if (total)
        *total = sum;
    *written = mt_topn_sort(&top);
    return MTRACE_OK;
}
