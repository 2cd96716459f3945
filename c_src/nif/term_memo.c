/*
 * A term memo (see term_memo.h).  Keys are stored plus one so that 0 marks
 * a free slot; a table is never more than half full, so a probe ends.
 */
#include "term_memo.h"

#include <string.h>

void mt_term_memo_init(struct mt_term_memo *m, uint64_t want, size_t cap) {
    size_t slots = 16;
    while (slots < cap && slots < 2 * want)
        slots *= 2;
    memset(m, 0, sizeof *m);
    m->keys = enif_alloc(slots * sizeof *m->keys);
    m->terms = enif_alloc(slots * sizeof *m->terms);
    if (!m->keys || !m->terms) {
        mt_term_memo_free(m);
        return;
    }
    memset(m->keys, 0, slots * sizeof *m->keys);
    m->mask = slots - 1;
    m->most = slots / 2;
}

void mt_term_memo_free(struct mt_term_memo *m) {
    enif_free(m->keys);
    enif_free(m->terms);
    memset(m, 0, sizeof *m);
}

/* Where key is, or the free slot where it would go. */
static size_t slot(const struct mt_term_memo *m, uint64_t key) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    while (m->keys[i] && m->keys[i] != key + 1)
        i = (i + 1) & m->mask;
    return i;
}

int mt_term_memo_get(const struct mt_term_memo *m, uint64_t key, ERL_NIF_TERM *t) {
    if (!m->keys)
        return 0;
    size_t i = slot(m, key);
    if (!m->keys[i])
        return 0;
    *t = m->terms[i];
    return 1;
}

void mt_term_memo_put(struct mt_term_memo *m, uint64_t key, ERL_NIF_TERM t) {
    if (!m->keys || m->used >= m->most)
        return;
    size_t i = slot(m, key);
    if (!m->keys[i]) {
        m->keys[i] = key + 1;
        m->used++;
    }
    m->terms[i] = t;
}

void mt_term_memo_retag(struct mt_term_memo *m, uint64_t tag) {
    if (m->tag == tag)
        return;
    m->tag = tag;
    if (m->keys && m->used) {
        memset(m->keys, 0, (m->mask + 1) * sizeof *m->keys);
        m->used = 0;
    }
}
