/*
 * DWARF call frame instructions and pointer encodings (DWARF 4, section
 * 6.4.2; the LSB's .eh_frame encodings) under the names the specifications
 * use, and the bounded readers of their operands: what eh_frame.c reads.
 * Defined here rather than taken from elfutils' <dwarf.h>, so that the
 * preload needs no elfutils headers.
 */
#ifndef MT_DWARF_CFI_H
#define MT_DWARF_CFI_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    DW_CFA_nop = 0x00,
    DW_CFA_set_loc = 0x01,
    DW_CFA_advance_loc1 = 0x02,
    DW_CFA_advance_loc2 = 0x03,
    DW_CFA_advance_loc4 = 0x04,
    DW_CFA_offset_extended = 0x05,
    DW_CFA_restore_extended = 0x06,
    DW_CFA_undefined = 0x07,
    DW_CFA_same_value = 0x08,
    DW_CFA_register = 0x09,
    DW_CFA_remember_state = 0x0a,
    DW_CFA_restore_state = 0x0b,
    DW_CFA_def_cfa = 0x0c,
    DW_CFA_def_cfa_register = 0x0d,
    DW_CFA_def_cfa_offset = 0x0e,
    DW_CFA_def_cfa_expression = 0x0f,
    DW_CFA_expression = 0x10,
    DW_CFA_offset_extended_sf = 0x11,
    DW_CFA_def_cfa_sf = 0x12,
    DW_CFA_def_cfa_offset_sf = 0x13,
    DW_CFA_val_offset = 0x14,
    DW_CFA_val_offset_sf = 0x15,
    DW_CFA_val_expression = 0x16,
    DW_CFA_GNU_args_size = 0x2e,
    DW_CFA_GNU_negative_offset_extended = 0x2f,
    DW_CFA_AARCH64_negate_ra_state = 0x2d, /* aarch64 only (elsewhere 0x2d is GNU_window_save) */
    /* the three with their operand in the low 6 bits */
    DW_CFA_advance_loc = 0x40,
    DW_CFA_offset = 0x80,
    DW_CFA_restore = 0xc0,
    DW_CFA_HIGH_MASK = 0xc0,
    DW_CFA_LOW_MASK = 0x3f,
};
enum {
    DW_EH_PE_absptr = 0x00,
    DW_EH_PE_uleb128 = 0x01,
    DW_EH_PE_udata2 = 0x02,
    DW_EH_PE_udata4 = 0x03,
    DW_EH_PE_udata8 = 0x04,
    DW_EH_PE_sleb128 = 0x09,
    DW_EH_PE_sdata2 = 0x0a,
    DW_EH_PE_sdata4 = 0x0b,
    DW_EH_PE_sdata8 = 0x0c,
    DW_EH_PE_pcrel = 0x10,
    DW_EH_PE_datarel = 0x30,
    DW_EH_PE_indirect = 0x80,
    DW_EH_PE_omit = 0xff,
    DW_EH_PE_FORMAT_MASK = 0x0f,
    DW_EH_PE_APPL_MASK = 0x70,
};

/* A read position in .eh_frame that never runs past end; a read that
 * would sets bad and yields 0. */
struct cursor {
    const uint8_t *p, *end;
    int bad;
};

static inline uint64_t uleb(struct cursor *c) {
    uint64_t v = 0;
    for (unsigned shift = 0; c->p < c->end; shift += 7) {
        uint8_t b = *c->p++;
        if (shift < 64)
            v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    c->bad = 1;
    return 0;
}

static inline int64_t sleb(struct cursor *c) {
    int64_t v = 0;
    unsigned shift = 0;
    uint8_t b = 0x80;
    while (c->p < c->end && (b & 0x80)) {
        b = *c->p++;
        if (shift < 64)
            v |= (int64_t)((uint64_t)(b & 0x7f) << shift);
        shift += 7;
    }
    if (b & 0x80)
        c->bad = 1;
    else if (shift < 64 && (b & 0x40))
        v |= -(int64_t)((uint64_t)1 << shift);
    return v;
}

static inline uint64_t fixed(struct cursor *c, size_t n) {
    if ((size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, c->p, n); /* little-endian */
    c->p += n;
    return v;
}

/* A pointer in DW_EH_PE encoding; datarel is relative to base. */
static inline uint64_t encoded(struct cursor *c, uint8_t enc, uintptr_t base) {
    if (enc == DW_EH_PE_omit)
        return 0;
    uintptr_t at = (uintptr_t)c->p;
    uint64_t v;
    switch (enc & DW_EH_PE_FORMAT_MASK) {
    case DW_EH_PE_absptr:
        v = fixed(c, 8);
        break;
    case DW_EH_PE_uleb128:
        v = uleb(c);
        break;
    case DW_EH_PE_udata2:
        v = fixed(c, 2);
        break;
    case DW_EH_PE_udata4:
        v = fixed(c, 4);
        break;
    case DW_EH_PE_udata8:
        v = fixed(c, 8);
        break;
    case DW_EH_PE_sleb128:
        v = (uint64_t)sleb(c);
        break;
    case DW_EH_PE_sdata2:
        v = (uint64_t)(int64_t)(int16_t)fixed(c, 2);
        break;
    case DW_EH_PE_sdata4:
        v = (uint64_t)(int64_t)(int32_t)fixed(c, 4);
        break;
    case DW_EH_PE_sdata8:
        v = fixed(c, 8);
        break;
    default:
        c->bad = 1;
        return 0;
    }
    switch (enc & DW_EH_PE_APPL_MASK) {
    case DW_EH_PE_absptr:
        break;
    case DW_EH_PE_pcrel:
        v += at;
        break;
    case DW_EH_PE_datarel:
        v += base;
        break;
    default:
        c->bad = 1;
        return 0;
    }
    if (enc & DW_EH_PE_indirect) /* never used for code addresses */
        c->bad = 1;
    return v;
}

#endif
