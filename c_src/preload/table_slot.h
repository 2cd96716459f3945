/*
 * The table's slot (table.c): one live entry in 16 bytes, where a plain
 * struct mt_entry takes 32:
 *   lo: addr >> 3 (45 bits) | size bits 0-18 << 45
 *   hi: stack id (24 bits) | size bits 19-26 << 24 | time << 32
 * Blocks are 8-byte aligned at least: glibc's are 16-byte aligned, but
 * jemalloc's and tcmalloc's smallest classes are 8 bytes apart.
 * Time is in milliseconds since an hour before the table's first entry,
 * exact for 2^31 ms (24.8 days) and in 1.024-second steps after that (for
 * 70 years), never later than the true time (a time before that epoch,
 * which a monotonic clock cannot give, is kept as the epoch).
 */
#ifndef MT_TABLE_SLOT_H
#define MT_TABLE_SLOT_H

#include <stdint.h>

#include "mtrace_api.h"
#include "table.h"

struct mt_slot {
    uint64_t lo, hi; /* lo 0 = empty */
};

#define MT_SLOT_KEY_BITS 45
#define MT_SLOT_KEY_MASK ((1ull << MT_SLOT_KEY_BITS) - 1)
#define MT_SLOT_ADDR_SHIFT 3 /* the key is addr >> 3 */
#define SIZE_LO_BITS 19
#define SIZE_BITS 27
#define TIME_EXACT (1ull << 31)
#define TIME_STEP_SHIFT 10

/* Can a slot hold this block?  (Else it goes to the spill.) */
static inline int mt_slot_fits(uint64_t addr, uint64_t size) {
    return addr && !(addr & 7) && !(addr >> (MT_SLOT_KEY_BITS + MT_SLOT_ADDR_SHIFT)) &&
           !(size >> SIZE_BITS);
}

static inline uint64_t time_code(uint64_t t_ms, uint64_t epoch) {
    uint64_t d = t_ms - epoch; /* huge if t_ms is before the epoch */
    if (__builtin_expect(d < TIME_EXACT, 1))
        return d;
    if (t_ms < epoch)
        return 0;
    d = TIME_EXACT + ((d - TIME_EXACT) >> TIME_STEP_SHIFT);
    return d > UINT32_MAX ? UINT32_MAX : d;
}

static inline uint64_t time_of(uint64_t code, uint64_t epoch) {
    return epoch +
           (code < TIME_EXACT ? code : TIME_EXACT + ((code - TIME_EXACT) << TIME_STEP_SHIFT));
}

static inline struct mt_slot mt_slot_pack(const struct mt_entry *e, uint64_t epoch) {
    return (struct mt_slot){
        e->addr >> MT_SLOT_ADDR_SHIFT | (e->size & ((1u << SIZE_LO_BITS) - 1)) << MT_SLOT_KEY_BITS,
        (e->stack & MTRACE_MAX_STACK_ID) | (e->size >> SIZE_LO_BITS) << MTRACE_STACK_ID_BITS |
            time_code(e->t_ms, epoch) << 32};
}

static inline uint64_t mt_slot_addr(const struct mt_slot *s) {
    return (s->lo & MT_SLOT_KEY_MASK) << MT_SLOT_ADDR_SHIFT;
}

static inline uint64_t mt_slot_size(const struct mt_slot *s) {
    return s->lo >> MT_SLOT_KEY_BITS | (s->hi >> MTRACE_STACK_ID_BITS & 0xff) << SIZE_LO_BITS;
}

static inline struct mt_entry mt_slot_unpack(const struct mt_slot *s, uint64_t epoch) {
    return (struct mt_entry){mt_slot_addr(s), mt_slot_size(s), time_of(s->hi >> 32, epoch),
                             (uint32_t)(s->hi & MTRACE_MAX_STACK_ID)};
}

#endif
