/*
 * Reading .eh_frame into frame rules (see eh_frame.h).
 *
 * The object holding an address is found by objects.c, its FDE by
 * binary search in .eh_frame_hdr, and the CIE's and FDE's call-frame
 * instructions are run up to the address, tracking only what a walk needs:
 * the CFA, the return address and the frame pointer (RBP on x86-64, x29 on
 * aarch64).
 */
#define _GNU_SOURCE
#include "eh_frame.h"

#if !(defined(__x86_64__) || defined(__aarch64__)) || !defined(__linux__)
#error "mtrace's walker supports Linux on x86-64 and aarch64"
#endif

#include <link.h>
#include <stddef.h>
#include <string.h>

#include "dwarf_cfi.h"
#include "objects.h"

/* DWARF register numbers, and the CFA before a function's first instruction. */
#if defined(__x86_64__)
enum { REG_FP = 6 /* RBP */, REG_SP = 7 /* RSP */, REG_RA = 16, INIT_CFA_OFF = 8 };
#else
enum {
    REG_FP = 29 /* x29 */,
    REG_SP = 31,
    REG_RA = 30 /* x30, the link register */,
    INIT_CFA_OFF = 0
};
#endif

/* ---- reading .eh_frame (the readers are in dwarf_cfi.h) ------------------ */

/* Rules of the registers that matter, while running CFA instructions. */
enum { R_UNSET, R_OFFSET, R_UNDEF, R_SAME };
struct state {
    uint64_t cfa_reg;
    int64_t cfa_off;
    uint8_t bp, ra; /* R_* */
    int64_t bp_off, ra_off;
};

struct cie {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;
    int has_z;
    struct cursor insns;
};

/* 1 when parsed, -1 for a signal frame's CIE, 0 for one not understood.
 * end: where the memory holding it ends. */
static int parse_cie(const uint8_t *at, uintptr_t end, struct cie *cie) {
    if (end < (uintptr_t)at + 8) /* end 0 too: not in the object */
        return 0;
    struct cursor c = {at, at + 4, 0};
    uint64_t len = fixed(&c, 4);
    if (len == 0 || len == 0xffffffff || len > end - (uintptr_t)at - 4)
        return 0;
    c.end = at + 4 + len;
    if (fixed(&c, 4) != 0) /* a CIE has id 0 */
        return 0;
    uint8_t version = (uint8_t)fixed(&c, 1);
    const char *aug = (const char *)c.p;
    size_t aug_len = strnlen(aug, (size_t)(c.end - c.p));
    c.p += aug_len + 1;
    if (c.p > c.end || strstr(aug, "eh"))
        return 0;
    cie->code_align = uleb(&c);
    cie->data_align = sleb(&c);
    cie->ra_reg = version == 1 ? fixed(&c, 1) : uleb(&c);
    cie->fde_enc = 0; /* absptr */
    cie->has_z = aug[0] == 'z';
    if (cie->has_z) {
        uint64_t n = uleb(&c);
        struct cursor a = {c.p, c.p + n, 0};
        if (a.end > c.end)
            return 0;
        for (const char *k = aug + 1; *k; k++) {
            if (*k == 'R')
                cie->fde_enc = (uint8_t)fixed(&a, 1);
            else if (*k == 'L')
                fixed(&a, 1);
            else if (*k == 'P')
                encoded(&a, (uint8_t)(fixed(&a, 1) & ~DW_EH_PE_indirect),
                        0); /* personality: skipped */
            else if (*k == 'S')
                return -1; /* signal frame: libunwind knows how */
            else
                break; /* unknown: the length lets us skip the rest */
        }
        if (a.bad)
            return 0;
        c.p += n;
    }
    cie->insns = c;
    return !c.bad && cie->ra_reg == REG_RA;
}

static void set_rule(struct state *s, uint64_t reg, uint8_t how, int64_t off) {
    if (reg == REG_FP) {
        s->bp = how;
        s->bp_off = off;
    } else if (reg == REG_RA) {
        s->ra = how;
        s->ra_off = off;
    }
}

/* Runs CFA instructions up to (and including) the row covering target.
 * Returns 0 for anything this walker does not model. */
static int run(struct cursor *c, const struct cie *cie, struct state *s, const struct state *init,
               uintptr_t *loc, uintptr_t target) {
    struct state stack[8];
    int depth = 0;
    while (c->p < c->end && !c->bad) {
        uint8_t op = *c->p++;
        uint64_t reg, delta = 0;
        switch (op & DW_CFA_HIGH_MASK) {
        case DW_CFA_advance_loc:
            delta = (op & DW_CFA_LOW_MASK) * cie->code_align;
            goto advance;
        case DW_CFA_offset:
            set_rule(s, op & DW_CFA_LOW_MASK, R_OFFSET, (int64_t)uleb(c) * cie->data_align);
            continue;
        case DW_CFA_restore:
            reg = op & DW_CFA_LOW_MASK;
            set_rule(s, reg, reg == REG_FP ? init->bp : init->ra,
                     reg == REG_FP ? init->bp_off : init->ra_off);
            continue;
        }
        switch (op) {
        case DW_CFA_nop:
            continue;
        case DW_CFA_set_loc:
            *loc = encoded(c, cie->fde_enc, 0);
            if (*loc > target)
                return 1;
            continue;
        case DW_CFA_advance_loc1:
            delta = fixed(c, 1) * cie->code_align;
            goto advance;
        case DW_CFA_advance_loc2:
            delta = fixed(c, 2) * cie->code_align;
            goto advance;
        case DW_CFA_advance_loc4:
            delta = fixed(c, 4) * cie->code_align;
            goto advance;
        case DW_CFA_offset_extended:
            reg = uleb(c);
            set_rule(s, reg, R_OFFSET, (int64_t)uleb(c) * cie->data_align);
            continue;
        case DW_CFA_restore_extended:
            reg = uleb(c);
            set_rule(s, reg, reg == REG_FP ? init->bp : init->ra,
                     reg == REG_FP ? init->bp_off : init->ra_off);
            continue;
        case DW_CFA_undefined:
            set_rule(s, uleb(c), R_UNDEF, 0);
            continue;
        case DW_CFA_same_value:
            set_rule(s, uleb(c), R_SAME, 0);
            continue;
        case DW_CFA_register: /* register: only harmless for registers we do not follow */
            reg = uleb(c);
            uleb(c);
            if (reg == REG_FP || reg == REG_RA)
                return 0;
            continue;
        case DW_CFA_remember_state:
            if (depth == 8)
                return 0;
            stack[depth++] = *s;
            continue;
        case DW_CFA_restore_state:
            if (depth == 0)
                return 0;
            *s = stack[--depth];
            continue;
        case DW_CFA_def_cfa:
            s->cfa_reg = uleb(c);
            s->cfa_off = (int64_t)uleb(c);
            continue;
        case DW_CFA_def_cfa_register:
            s->cfa_reg = uleb(c);
            continue;
        case DW_CFA_def_cfa_offset:
            s->cfa_off = (int64_t)uleb(c);
            continue;
        case DW_CFA_expression:
        case DW_CFA_val_expression:
            reg = uleb(c);
            c->p += uleb(c);
            if (reg == REG_FP || reg == REG_RA || reg == REG_SP || c->p > c->end)
                return 0;
            continue;
        case DW_CFA_offset_extended_sf:
            reg = uleb(c);
            set_rule(s, reg, R_OFFSET, sleb(c) * cie->data_align);
            continue;
        case DW_CFA_def_cfa_sf:
            s->cfa_reg = uleb(c);
            s->cfa_off = sleb(c) * cie->data_align;
            continue;
        case DW_CFA_def_cfa_offset_sf:
            s->cfa_off = sleb(c) * cie->data_align;
            continue;
        case DW_CFA_val_offset:
        case DW_CFA_val_offset_sf:
            reg = uleb(c);
            if (op == DW_CFA_val_offset)
                uleb(c);
            else
                sleb(c);
            if (reg == REG_FP || reg == REG_RA)
                return 0;
            continue;
        case DW_CFA_GNU_args_size:
            uleb(c);
            continue; /* GNU_args_size */
#if defined(__aarch64__)
        case DW_CFA_AARCH64_negate_ra_state:
            continue; /* return addresses signed with pointer authentication: the walker strips
                         every return address it reads */
#endif
        case DW_CFA_GNU_negative_offset_extended:
            reg = uleb(c);
            set_rule(s, reg, R_OFFSET, -(int64_t)uleb(c) * cie->data_align);
            continue;
        default:
            return 0; /* def_cfa_expression and anything unknown */
        }
    advance:
        if (*loc + delta > target)
            return 1;
        *loc += delta;
    }
    return !c->bad;
}

/* ---- finding the FDE ----------------------------------------------------- */

/* Where the object's memory holding p ends (its loadable segment; in a fork
 * child, whose lookup gives no program headers, its whole mapping), or 0
 * when p is not in it.  Every offset and length the tables give is checked
 * against it: a corrupt table, which the program itself may never read,
 * must not lead a walk to read past what is mapped. */
static uintptr_t end_of_memory_at(const struct mtrace_object *o, uintptr_t p) {
    if (!o->phdr)
        return p >= o->lo && p < o->hi ? o->hi : 0;
    const ElfW(Phdr) *ph = o->phdr;
    for (uint32_t i = 0; i < o->phnum; i++) {
        uintptr_t lo = o->base + ph[i].p_vaddr;
        if (ph[i].p_type == PT_LOAD && p >= lo && p - lo < ph[i].p_memsz)
            return lo + ph[i].p_memsz;
    }
    return 0;
}

/* musl's signal return trampoline has no FDE (glibc's has one, marked 'S'):
 * it is known by its code, mov $15, %rax; syscall, as libgcc knows it. */
static int is_sigreturn(uintptr_t ra, const struct mtrace_object *o) {
    static const uint8_t code[9] = {0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05};
    return ra >= o->lo && ra + sizeof code <= o->hi && !memcmp((const void *)ra, code, sizeof code);
}

void mt_eh_frame_rule(uintptr_t target, struct mt_frame_rule *out, uint64_t *loads) {
    memset(out, 0, sizeof *out);
    struct mtrace_object o;
    const uint8_t *h = NULL;
    int found = mt_object_at_walking(target, &o, &h);
    if (found == MT_OBJECTS_CLOSED) { /* a fork is under way: kind UNSUPPORTED */
        *loads = 0;
        return;
    }
    *loads = o.generation; /* 0 in a fork child: the rule is used, not kept */
    if (!h) {
        out->kind = MT_RULE_NO_INFO; /* JIT code or an object without unwind tables */
        return;
    }
    /* .eh_frame_hdr: version, three encodings, then a sorted search table. */
    uintptr_t end = end_of_memory_at(&o, (uintptr_t)h);
    if (end < (uintptr_t)h + 12) { /* end 0 too: corrupt, and so the stack ends here */
        out->kind = MT_RULE_NO_INFO;
        return;
    }
    if (h[0] != 1 || h[3] != (DW_EH_PE_datarel | DW_EH_PE_sdata4)) /* a table of such pairs */
        return;
    struct cursor c = {h + 4, end < (uintptr_t)h + 20 ? (const uint8_t *)end : h + 20, 0};
    encoded(&c, h[1], (uintptr_t)h); /* eh_frame_ptr: not needed */
    uint64_t count = encoded(&c, h[2], (uintptr_t)h);
    if (c.bad || count == 0)
        return;
    if (count > (end - (uintptr_t)c.p) / 8) {
        out->kind = MT_RULE_NO_INFO;
        return;
    }
    const int32_t *table = (const int32_t *)c.p;
    int64_t rel = (int64_t)(target - (uintptr_t)h);
    uint64_t lo = 0, hi = count; /* last entry whose start <= target */
    while (hi - lo > 1) {
        uint64_t mid = (lo + hi) / 2;
        if (table[2 * mid] <= rel)
            lo = mid;
        else
            hi = mid;
    }
    if (table[2 * lo] > rel) {
        out->kind = is_sigreturn(target + 1, &o) ? MT_RULE_SIGNAL : MT_RULE_NO_INFO;
        return;
    }
    const uint8_t *fde = h + table[2 * lo + 1];
    uintptr_t fde_end = end_of_memory_at(&o, (uintptr_t)fde);
    struct cursor d = {fde, fde + 8, 0};
    uint64_t len = fde_end < (uintptr_t)fde + 8 ? 0 : fixed(&d, 4);
    if (len == 0xffffffff)
        return;
    if (len == 0 || len > fde_end - (uintptr_t)fde - 4) {
        out->kind = MT_RULE_NO_INFO;
        return;
    }
    d.end = fde + 4 + len;
    const uint8_t *id_at = d.p;
    uint32_t cie_off = (uint32_t)fixed(&d, 4);
    struct cie cie;
    const uint8_t *cie_at = id_at - cie_off;
    int parsed = parse_cie(cie_at, end_of_memory_at(&o, (uintptr_t)cie_at), &cie);
    if (parsed <= 0) {
        out->kind = parsed < 0 ? MT_RULE_SIGNAL : MT_RULE_UNSUPPORTED;
        return;
    }
    uintptr_t begin = (uintptr_t)encoded(&d, cie.fde_enc, 0);
    uintptr_t range = (uintptr_t)encoded(&d, cie.fde_enc & DW_EH_PE_FORMAT_MASK, 0);
    if (d.bad)
        return;
    if (target < begin || target >= begin + range) {
        out->kind = is_sigreturn(target + 1, &o) ? MT_RULE_SIGNAL : MT_RULE_NO_INFO;
        return;
    }
    if (cie.has_z)
        d.p += uleb(&d);
    struct state s = {REG_SP, INIT_CFA_OFF, R_UNSET, R_UNSET, 0, 0}, init;
    uintptr_t loc = begin;
    if (!run(&cie.insns, &cie, &s, &s, &loc, ~(uintptr_t)0))
        return;
    init = s;
    loc = begin;
    if (!run(&d, &cie, &s, &init, &loc, target))
        return;

    if (s.ra == R_UNDEF) { /* whatever the CFA (aarch64's _start and thread start say sp + 0) */
        out->kind = MT_RULE_LAST;
        return;
    }
    if (s.cfa_reg != REG_SP && s.cfa_reg != REG_FP)
        return;
    if (s.cfa_off <= 0 || s.cfa_off > INT32_MAX) /* the CFA lies above the register it is from */
        return;
    /* The return address saved below the CFA: at CFA - 8 on x86-64 (where the
     * call put it), anywhere in the frame on aarch64 (where the function saved
     * x30; a function that did not is a leaf, and only frame 0 can be one). */
    if (s.ra != R_OFFSET || s.ra_off >= 0 || s.ra_off % 8 || s.ra_off < INT32_MIN)
        return;
#if defined(__x86_64__)
    if (s.ra_off != -8)
        return;
#endif
    if (s.bp == R_OFFSET) {
        if (s.bp_off >= 0 || s.bp_off % 8 || s.bp_off < INT32_MIN)
            return;
        out->bp_saved = 1;
        out->bp_off = (int32_t)s.bp_off;
    } else if (s.bp != R_UNSET && s.bp != R_SAME) {
        return;
    }
    out->cfa_off = (int32_t)s.cfa_off;
    out->ra_off = (int32_t)s.ra_off;
    out->cfa_bp = s.cfa_reg == REG_FP;
    out->kind = MT_RULE_FRAME;
}
