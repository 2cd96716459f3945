/*
 * The table's bucket (table.c): 15 slots behind a word pair of tags, one
 * byte a slot, so that a lookup compares all the tags at once and reads the
 * one slot they point to.  Which bucket an address goes to is the table's
 * business; what happens inside one is here.
 */
#ifndef MT_TABLE_BUCKET_H
#define MT_TABLE_BUCKET_H

#include <stddef.h>
#include <stdint.h>

#include "hash.h"
#include "table_slot.h"

#define SLOTS 15     /* per bucket, after its tags */
#define TAG_SHIFT 32 /* a slot's tag is hash bits 32-38, its directory index the top bits */
#define ONES 0x0101010101010101ull  /* one per byte */
#define HIGHS 0x8080808080808080ull /* the high bit of each byte */
#define DEPTH_BYTE (0xffull << 56)  /* tags[1]'s last byte holds the depth */
/* The steps of an insert or a removal, each used in a few places: GCC keeps
 * them out of line, and their calls cost a lossless pair about 2%. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

struct bucket {
    uint64_t tags[2]; /* byte i < 15: slot i's tag, 0x80 | 7 hash bits (0 = empty);
                       * byte 15: the hash bits its entries share (its depth) */
    struct mt_slot s[SLOTS];
};

/* Fibonacci hashing of the whole address: top bits pick the bucket, middle
 * bits tag the slot. */
static inline uint64_t hash_addr(uint64_t addr) { return addr * MT_HASH_GOLDEN; }

static inline size_t dir_index(uint64_t h, uint32_t depth) {
    return (size_t)(h >> 1 >> (63 - depth)); /* depth 0 included, without a branch */
}

static inline uint64_t tag_of(uint64_t h) { return 0x80 | ((h >> TAG_SHIFT) & 0x7f); }
static inline uint32_t depth_of(const struct bucket *b) { return (uint32_t)(b->tags[1] >> 56); }

/* High bits of the empty slots' tag bytes, in tag word w. */
static inline uint64_t empties(const struct bucket *b, unsigned w) {
    return ~b->tags[w] & (w ? HIGHS & ~DEPTH_BYTE : HIGHS);
}

static inline int full(const struct bucket *b) { return !(empties(b, 0) | empties(b, 1)); }

/* 1 when slot i holds an entry (its tag's high bit), without a branch. */
static inline unsigned occupied(const struct bucket *b, unsigned i) {
    return (unsigned)(b->tags[i >> 3] >> (8 * (i & 7) + 7)) & 1;
}

/* How many directory entries of a directory of depth dir_depth point to b:
 * a bucket of depth l fills a run of 2^(dir_depth - l) of them.  A walk
 * over a shard's buckets steps by this to visit each once. */
static inline size_t run_of(const struct bucket *b, uint32_t dir_depth) {
    return (size_t)1 << (dir_depth - depth_of(b));
}

/* High bit of each byte of x that is zero, and perhaps of bytes above one
 * (a borrow carries on through them); the lowest is always a true zero. */
static inline uint64_t zero_bytes(uint64_t x) { return (x - ONES) & ~x & HIGHS; }

/* The slot holding key, or SLOTS.  The tag bytes equal to tag are found in
 * both words at once, and the first of them, a true match, decides without
 * a branch on which word it is in (a removal finds its key in either, at
 * random: that branch was mispredicted half the time); only when its key
 * differs (a tag shared by two entries, 1 in 128 a slot) are the others
 * tried, flagged or not. */
ALWAYS_INLINE unsigned find(const struct bucket *b, uint64_t key, uint64_t tag) {
    uint64_t m0 = zero_bytes(b->tags[0] ^ tag * ONES),
             m1 = zero_bytes(b->tags[1] ^ tag * ONES) & ~DEPTH_BYTE;
    if (!(m0 | m1))
        return SLOTS;
    uint64_t m = m0 ? m0 : m1;
    unsigned i = (m0 ? 0 : 8) + ((unsigned)__builtin_ctzll(m) >> 3);
    if (__builtin_expect((b->s[i].lo & MT_SLOT_KEY_MASK) == key, 1))
        return i;
    for (unsigned w = 0; w < 2; w++)
        for (m = w ? m1 : m0; m; m &= m - 1) {
            i = 8 * w + ((unsigned)__builtin_ctzll(m) >> 3);
            if ((b->s[i].lo & MT_SLOT_KEY_MASK) == key)
                return i;
        }
    return SLOTS;
}

/* Puts a slot into the first empty one of b (there is one). */
ALWAYS_INLINE void place(struct bucket *b, const struct mt_slot *s, uint64_t tag) {
    unsigned w = !empties(b, 0), i = 8 * w + ((unsigned)__builtin_ctzll(empties(b, w)) >> 3);
    b->s[i] = *s;
    b->tags[w] |= tag << (8 * (i & 7));
}

ALWAYS_INLINE void delete_at(struct bucket *b, unsigned i) {
    b->tags[i >> 3] &= ~(0xffull << (8 * (i & 7)));
    b->s[i].lo = 0;
}

#endif
