/*
 * The preload's multiplicative hashes: a 64-bit constant spreads a key's
 * low bits into the high bits, which index a table of 2^bits entries.
 */
#ifndef MT_HASH_H
#define MT_HASH_H

#include <stdint.h>

/* 2^64 / golden ratio (Fibonacci hashing); odd, so multiplying is a bijection. */
#define MT_HASH_GOLDEN 0x9E3779B97F4A7C15ull
/* MurmurHash3's 64-bit finaliser constant: a second, independent mix. */
#define MT_HASH_MIX 0xff51afd7ed558ccdull

/* The top bits of key * MT_HASH_GOLDEN: an index below 2^bits (0 < bits < 64). */
static inline uint64_t mt_hash_index(uint64_t key, unsigned bits) {
    return (key * MT_HASH_GOLDEN) >> (64 - bits);
}

#endif
