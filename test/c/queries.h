/*
 * Queries through the contract, in the short form the tests use: olds and
 * sites of at most n results, bounded by size.
 */
#ifndef MT_TEST_QUERIES_H
#define MT_TEST_QUERIES_H

#include <stdint.h>

#include "mtrace_api.h"

/* Every allocation whose size is within [min_size, max_size]. */
static inline struct mtrace_query sized_query(uint64_t min_size, uint64_t max_size) {
    struct mtrace_query q = MTRACE_QUERY_ALL(MTRACE_BY_OLDEST, 0);
    q.min_size = min_size;
    q.max_size = max_size;
    return q;
}

/* The n oldest allocations q considers (NULL = all); 0 on any error. */
static inline size_t query_olds(const struct mtrace_api *api, const struct mtrace_query *q,
                                struct mtrace_alloc *out, size_t n) {
    struct mtrace_query k = q ? *q : MTRACE_QUERY_ALL(MTRACE_BY_OLDEST, 0);
    k.order = MTRACE_BY_OLDEST;
    k.limit = n;
    size_t written = 0;
    return api->olds(&k, out, &written) == MTRACE_OK ? written : 0;
}

/* The live block p of exactly size bytes, looked for among the oldest n
 * such blocks (buf has room for n): 1 with its entry in *found (when not
 * NULL), 0 when it is not among them. */
static inline int query_block(const struct mtrace_api *api, const void *p, uint64_t size,
                              struct mtrace_alloc *buf, size_t n, struct mtrace_alloc *found) {
    struct mtrace_query q = sized_query(size, size);
    size_t k = query_olds(api, &q, buf, n);
    for (size_t i = 0; i < k; i++)
        if (buf[i].addr == (uintptr_t)p) {
            if (found)
                *found = buf[i];
            return 1;
        }
    return 0;
}

/* How many frames the stack of live block p (size bytes, among the oldest
 * 4 of that size) has, up to max; -1 when the block is not found. */
static inline int block_depth(const struct mtrace_api *api, const void *p, uint64_t size, int max) {
    struct mtrace_alloc buf[4], a = {0, 0, 0, 0, 0};
    uintptr_t ips[64];
    if (max > 64 || !query_block(api, p, size, buf, 4, &a))
        return -1;
    return (int)api->stack(a.stack_id, ips, (uint32_t)max);
}

/* The n top sites by order among the allocations q considers (NULL = all);
 * 0 for bad arguments, SIZE_MAX when out of memory. */
static inline size_t query_sites(const struct mtrace_api *api, const struct mtrace_query *q,
                                 struct mtrace_site *out, size_t n, int order,
                                 struct mtrace_site *total) {
    struct mtrace_query k = q ? *q : MTRACE_QUERY_ALL(MTRACE_BY_BYTES, 0);
    k.order = (uint32_t)order;
    k.limit = n;
    size_t written = 0;
    enum mtrace_result r = api->sites(&k, out, &written, total);
    return r == MTRACE_OK ? written : r == MTRACE_ERR_NO_MEMORY ? SIZE_MAX : 0;
}

#endif
