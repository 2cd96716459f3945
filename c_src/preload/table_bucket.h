/*
 * The table's bucket (table.c): 15 slots behind 16 bytes of tags, one a
 * slot, so that a lookup compares all the tags at once and reads the one
 * slot they point to.  Which bucket an address goes to is the table's
 * business; what happens inside one is here.
 */
#ifndef MT_TABLE_BUCKET_H
#define MT_TABLE_BUCKET_H

#include <stddef.h>
#include <stdint.h>

#include "hash.h"
#include "table_slot.h"

#define SLOTS 15          /* per bucket, after its tags */
#define SLOT_MASK 0x7fffu /* a bit a slot, in the masks below */
#define TAG_SHIFT 32      /* a slot's tag is hash bits 32-38, its directory index the top bits */
/* The steps of an insert or a removal, each used in a few places: GCC keeps
 * them out of line, and their calls cost a lossless pair about 2%. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The time the table's times are kept from (table.c); read under a
 * shard's lock, so that a first entry's is seen. */
uint64_t mt_table_epoch(void);

struct bucket {
    /* Byte i < 15: slot i's tag, 0x80 | 7 hash bits (0 = empty); byte 15:
     * the hash bits its entries share (its depth, below 0x80). */
    _Alignas(16) uint8_t tag[16];
    struct mt_slot s[SLOTS];
};

/* Fibonacci hashing of the whole address: top bits pick the bucket, middle
 * bits tag the slot. */
static inline uint64_t hash_addr(uint64_t addr) { return addr * MT_HASH_GOLDEN; }

static inline size_t dir_index(uint64_t h, uint32_t depth) {
    return (size_t)(h >> 1 >> (63 - depth)); /* depth 0 included, without a branch */
}

static inline uint64_t tag_of(uint64_t h) { return 0x80 | ((h >> TAG_SHIFT) & 0x7f); }
static inline uint32_t depth_of(const struct bucket *b) { return b->tag[SLOTS]; }

/* The questions a lookup asks of the tags, each as a mask of slots: one
 * compare of all 16 bytes at once where the processor has one (SSE2, part
 * of every x86-64), else a word at a time.  (The word-at-a-time match cost
 * a lossless malloc/free pair 59 more instructions, callgrind on the
 * churn.) */
#if defined(__SSE2__)
#include <emmintrin.h>

static inline __m128i tags_of(const struct bucket *b) {
    return _mm_load_si128((const __m128i *)b->tag);
}

/* Slots whose tag is tag (the depth byte, below 0x80, never is). */
static inline unsigned matching(const struct bucket *b, uint64_t tag) {
    return (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(tags_of(b), _mm_set1_epi8((char)tag)));
}

/* Slots that hold an entry: their tags' high bits. */
static inline unsigned taken(const struct bucket *b) {
    return (unsigned)_mm_movemask_epi8(tags_of(b)) & SLOT_MASK;
}
#else
#define ONES 0x0101010101010101ull  /* one per byte */
#define HIGHS 0x8080808080808080ull /* the high bit of each byte */

static inline uint64_t tag_word(const struct bucket *b, unsigned w) {
    uint64_t x;
    __builtin_memcpy(&x, b->tag + 8 * w, 8);
    return x;
}

/* The high bits of x's bytes, a bit each: the products land in distinct
 * bits, with no carries, and the top byte collects one from each byte. */
static inline unsigned highs(uint64_t x) {
    return (unsigned)((((x & HIGHS) >> 7) * 0x0102040810204080ull) >> 56);
}

/* High bit of each byte of x that is zero, and perhaps of bytes above one
 * (a borrow carries on through them): a match is confirmed by its key. */
static inline uint64_t zero_bytes(uint64_t x) { return (x - ONES) & ~x & HIGHS; }

static inline unsigned matching(const struct bucket *b, uint64_t tag) {
    return (highs(zero_bytes(tag_word(b, 0) ^ tag * ONES)) |
            highs(zero_bytes(tag_word(b, 1) ^ tag * ONES)) << 8) &
           SLOT_MASK;
}

static inline unsigned taken(const struct bucket *b) {
    return (highs(tag_word(b, 0)) | highs(tag_word(b, 1)) << 8) & SLOT_MASK;
}
#endif

static inline int full(const struct bucket *b) { return taken(b) == SLOT_MASK; }

/* 1 when slot i holds an entry (its tag's high bit), without a branch. */
static inline unsigned occupied(const struct bucket *b, unsigned i) { return b->tag[i] >> 7; }

/* How many directory entries of a directory of depth dir_depth point to b:
 * a bucket of depth l fills a run of 2^(dir_depth - l) of them.  A walk
 * over a shard's buckets steps by this to visit each once. */
static inline size_t run_of(const struct bucket *b, uint32_t dir_depth) {
    return (size_t)1 << (dir_depth - depth_of(b));
}

/* The first of the slots in m (a mask from above) holding key, or SLOTS.
 * A tag is shared by two entries 1 in 128 a slot, so the first is almost
 * always it. */
ALWAYS_INLINE unsigned find_in(const struct bucket *b, unsigned m, uint64_t key) {
    for (; m; m &= m - 1) {
        unsigned i = (unsigned)__builtin_ctz(m);
        if (__builtin_expect((b->s[i].lo & MT_SLOT_KEY_MASK) == key, 1))
            return i;
    }
    return SLOTS;
}

/* The slot holding key, or SLOTS. */
ALWAYS_INLINE unsigned find(const struct bucket *b, uint64_t key, uint64_t tag) {
    return find_in(b, matching(b, tag), key);
}

/* Puts a slot into the first of b's empty slots in mask empty (not 0). */
ALWAYS_INLINE void place_in(struct bucket *b, unsigned empty, const struct mt_slot *s,
                            uint64_t tag) {
    unsigned i = (unsigned)__builtin_ctz(empty);
    b->s[i] = *s;
    b->tag[i] = (uint8_t)tag;
}

/* Puts a slot into the first empty one of b (there is one). */
ALWAYS_INLINE void place(struct bucket *b, const struct mt_slot *s, uint64_t tag) {
    place_in(b, ~taken(b) & SLOT_MASK, s, tag);
}

ALWAYS_INLINE void delete_at(struct bucket *b, unsigned i) {
    b->tag[i] = 0;
    b->s[i].lo = 0;
}

#endif
