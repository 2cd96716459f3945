/*
 * Terms one query answer builds once and uses many times (a stack its
 * entries share, a frame its stacks share), by a 64-bit key: an open-
 * addressing table in the NIF's memory for the length of one call.
 */
#ifndef MT_TERM_MEMO_H
#define MT_TERM_MEMO_H

#include <stdint.h>

#include <erl_nif.h>

struct mt_term_memo {
    uint64_t *keys; /* key + 1; 0 = free */
    ERL_NIF_TERM *terms;
    size_t mask, used, most; /* most: used stops there, so probes stay short */
    uint64_t tag;            /* what its terms were built under (mt_term_memo_retag) */
};

/* Room for up to `want` keys (at most `cap` slots, a power of two); with no
 * memory for it the memo stays empty and every lookup misses. */
void mt_term_memo_init(struct mt_term_memo *m, uint64_t want, size_t cap);
void mt_term_memo_free(struct mt_term_memo *m);
/* 1 and the term in *t when key is there. */
int mt_term_memo_get(const struct mt_term_memo *m, uint64_t key, ERL_NIF_TERM *t);
/* Keeps t for key, unless the memo is full (then the caller's term is
 * simply not shared). */
void mt_term_memo_put(struct mt_term_memo *m, uint64_t key, ERL_NIF_TERM t);
/* Forgets every term if they were built under another tag than this one
 * (frames named before a library was unloaded or loaded). */
void mt_term_memo_retag(struct mt_term_memo *m, uint64_t tag);

#endif
