/*
 * Keeping the n best of a stream without sorting it: a binary heap whose root
 * is the worst entry kept, so a newcomer costs one comparison unless it beats
 * that root.  Shared by the queries that answer "top n" (olds, sites), which
 * see millions of candidates and keep a handful.  Generic over the element
 * type through its size and a "ranks after" predicate; elements are at most
 * MT_TOPN_MAX_ELEM bytes.
 */
#ifndef MT_TOPN_H
#define MT_TOPN_H

#include <stddef.h>
#include <string.h>

#define MT_TOPN_MAX_ELEM 64

/* Nonzero when a ranks after b (a is worse). */
typedef int (*mt_worse_fn)(const void *a, const void *b);

struct mt_topn {
    char *h; /* caller's array of cap elements */
    size_t len, cap, size;
    mt_worse_fn worse;
};

static inline char *mt_topn_at(const struct mt_topn *t, size_t i) { return t->h + i * t->size; }

static inline void mt_topn_swap(struct mt_topn *t, size_t i, size_t j) {
    char tmp[MT_TOPN_MAX_ELEM];
    memcpy(tmp, mt_topn_at(t, i), t->size);
    memcpy(mt_topn_at(t, i), mt_topn_at(t, j), t->size);
    memcpy(mt_topn_at(t, j), tmp, t->size);
}

/* Restores the heap below i, among the first len elements. */
static inline void mt_topn_down(struct mt_topn *t, size_t len, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, top = i;
        if (l < len && t->worse(mt_topn_at(t, l), mt_topn_at(t, top)))
            top = l;
        if (r < len && t->worse(mt_topn_at(t, r), mt_topn_at(t, top)))
            top = r;
        if (top == i)
            return;
        mt_topn_swap(t, i, top);
        i = top;
    }
}

/* Offers one candidate; it is copied in if it is among the best cap so far. */
static inline void mt_topn_offer(struct mt_topn *t, const void *e) {
    if (t->len < t->cap) {
        size_t i = t->len++;
        memcpy(mt_topn_at(t, i), e, t->size);
        while (i && t->worse(mt_topn_at(t, i), mt_topn_at(t, (i - 1) / 2))) {
            mt_topn_swap(t, i, (i - 1) / 2);
            i = (i - 1) / 2;
        }
    } else if (t->cap && t->worse(mt_topn_at(t, 0), e)) {
        memcpy(mt_topn_at(t, 0), e, t->size);
        mt_topn_down(t, t->len, 0);
    }
}

/* Sorts the kept entries in place, best first; returns how many there are. */
static inline size_t mt_topn_sort(struct mt_topn *t) {
    for (size_t len = t->len; len > 1; len--) {
        mt_topn_swap(t, 0, len - 1); /* the worst goes to the end */
        mt_topn_down(t, len - 1, 0);
    }
    return t->len;
}

#endif
