/*
 * Fast stack walker (see unwind.h): .eh_frame rules, cached per address.
 *
 * The cache is a fixed open-addressing table in its own mapping.  Writers
 * store the rule word, then claim the key with a compare-and-swap; a key
 * never changes once set, so readers need no lock.  Each rule word carries
 * the generation it was computed in; dlclose bumps the generation, which
 * turns every cached rule into a miss without touching the table.
 */
#define _GNU_SOURCE
#include "unwind.h"

#include <stdatomic.h>

static _Atomic uint64_t fallbacks;

uint64_t mt_unwind_fallbacks(void) {
    return atomic_load_explicit(&fallbacks, memory_order_relaxed);
}
void mt_unwind_count_fallback(void) {
    atomic_fetch_add_explicit(&fallbacks, 1, memory_order_relaxed);
}

#if defined(__x86_64__) && defined(__linux__)

#include <link.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

enum { REG_RBP = 6, REG_RSP = 7, REG_RA = 16 };
enum { KIND_FRAME = 1, KIND_LAST, KIND_NO_INFO };

/* What one instruction address needs to step to its caller. */
struct rule {
    int32_t cfa_off;
    int16_t bp_off; /* RBP saved at CFA + bp_off, when bp_saved (a multiple of 8) */
    uint8_t cfa_bp; /* CFA = RBP + cfa_off, else RSP + cfa_off */
    uint8_t bp_saved;
    uint8_t kind; /* KIND_*, or 0: unsupported, give up */
};

/* ---- the cache ---------------------------------------------------------- */

#define CACHE_BITS 15 /* 32768 addresses, 512 KiB */
#define CACHE_PROBES 8
#define GEN_SHIFT 44

struct entry {
    _Atomic uint64_t key; /* return address; 0 = free */
    _Atomic uint64_t val; /* packed rule | generation << GEN_SHIFT */
};

static struct entry *_Atomic cache;
static _Atomic uint64_t generation = 1;

void mt_unwind_forget(void) { atomic_fetch_add(&generation, 1); }

/* cfa_off in bits 0-31, bp_off / 8 in 32-39, flags in 40-43, generation above. */
static uint64_t pack(const struct rule *r, uint64_t gen) {
    return (uint64_t)(uint32_t)r->cfa_off | (uint64_t)(uint8_t)(int8_t)(r->bp_off / 8) << 32 |
           (uint64_t)r->cfa_bp << 40 | (uint64_t)r->bp_saved << 41 | (uint64_t)(r->kind & 3) << 42 |
           gen << GEN_SHIFT;
}

static void unpack(uint64_t v, struct rule *r) {
    r->cfa_off = (int32_t)(uint32_t)v;
    r->bp_off = (int16_t)((int8_t)(uint8_t)(v >> 32) * 8);
    r->cfa_bp = (v >> 40) & 1;
    r->bp_saved = (v >> 41) & 1;
    r->kind = (v >> 42) & 3;
}

static struct entry *cache_table(void) {
    struct entry *c = atomic_load_explicit(&cache, memory_order_acquire);
    if (c)
        return c;
    void *m = mmap(NULL, sizeof(struct entry) << CACHE_BITS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    struct entry *none = NULL;
    if (!atomic_compare_exchange_strong(&cache, &none, (struct entry *)m)) {
        munmap(m, sizeof(struct entry) << CACHE_BITS); /* another thread won */
        return none;
    }
    return m;
}

static inline size_t slot_of(uintptr_t ra) {
    return (size_t)((ra * 0x9E3779B97F4A7C15ull) >> (64 - CACHE_BITS));
}

/* ---- reading .eh_frame -------------------------------------------------- */

struct cursor {
    const uint8_t *p, *end;
    int bad;
};

static uint64_t uleb(struct cursor *c) {
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

static int64_t sleb(struct cursor *c) {
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

static uint64_t fixed(struct cursor *c, size_t n) {
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
static uint64_t encoded(struct cursor *c, uint8_t enc, uintptr_t base) {
    if (enc == 0xff) /* omit */
        return 0;
    uintptr_t at = (uintptr_t)c->p;
    uint64_t v;
    switch (enc & 0x0f) {
    case 0x00:
        v = fixed(c, 8);
        break;
    case 0x01:
        v = uleb(c);
        break;
    case 0x02:
        v = fixed(c, 2);
        break;
    case 0x03:
        v = fixed(c, 4);
        break;
    case 0x04:
        v = fixed(c, 8);
        break;
    case 0x09:
        v = (uint64_t)sleb(c);
        break;
    case 0x0a:
        v = (uint64_t)(int64_t)(int16_t)fixed(c, 2);
        break;
    case 0x0b:
        v = (uint64_t)(int64_t)(int32_t)fixed(c, 4);
        break;
    case 0x0c:
        v = fixed(c, 8);
        break;
    default:
        c->bad = 1;
        return 0;
    }
    switch (enc & 0x70) {
    case 0x00:
        break;
    case 0x10:
        v += at;
        break; /* pcrel */
    case 0x30:
        v += base;
        break; /* datarel */
    default:
        c->bad = 1;
        return 0;
    }
    if (enc & 0x80) /* indirect: never used for code addresses */
        c->bad = 1;
    return v;
}

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

static int parse_cie(const uint8_t *at, struct cie *cie) {
    struct cursor c = {at, at + 4, 0};
    uint64_t len = fixed(&c, 4);
    if (len == 0 || len == 0xffffffff)
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
                encoded(&a, (uint8_t)(fixed(&a, 1) & 0x7f), 0); /* personality: skipped */
            else if (*k == 'S')
                return 0; /* signal frame: libunwind knows how */
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
    if (reg == REG_RBP) {
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
        switch (op & 0xc0) {
        case 0x40:
            delta = (op & 0x3f) * cie->code_align;
            goto advance;
        case 0x80:
            set_rule(s, op & 0x3f, R_OFFSET, (int64_t)uleb(c) * cie->data_align);
            continue;
        case 0xc0:
            reg = op & 0x3f;
            set_rule(s, reg, reg == REG_RBP ? init->bp : init->ra,
                     reg == REG_RBP ? init->bp_off : init->ra_off);
            continue;
        }
        switch (op) {
        case 0x00:
            continue; /* nop */
        case 0x01:
            *loc = encoded(c, cie->fde_enc, 0);
            if (*loc > target)
                return 1;
            continue;
        case 0x02:
            delta = fixed(c, 1) * cie->code_align;
            goto advance;
        case 0x03:
            delta = fixed(c, 2) * cie->code_align;
            goto advance;
        case 0x04:
            delta = fixed(c, 4) * cie->code_align;
            goto advance;
        case 0x05:
            reg = uleb(c);
            set_rule(s, reg, R_OFFSET, (int64_t)uleb(c) * cie->data_align);
            continue;
        case 0x06:
            reg = uleb(c);
            set_rule(s, reg, reg == REG_RBP ? init->bp : init->ra,
                     reg == REG_RBP ? init->bp_off : init->ra_off);
            continue;
        case 0x07:
            set_rule(s, uleb(c), R_UNDEF, 0);
            continue;
        case 0x08:
            set_rule(s, uleb(c), R_SAME, 0);
            continue;
        case 0x09: /* register: only harmless for registers we do not follow */
            reg = uleb(c);
            uleb(c);
            if (reg == REG_RBP || reg == REG_RA)
                return 0;
            continue;
        case 0x0a:
            if (depth == 8)
                return 0;
            stack[depth++] = *s;
            continue;
        case 0x0b:
            if (depth == 0)
                return 0;
            *s = stack[--depth];
            continue;
        case 0x0c:
            s->cfa_reg = uleb(c);
            s->cfa_off = (int64_t)uleb(c);
            continue;
        case 0x0d:
            s->cfa_reg = uleb(c);
            continue;
        case 0x0e:
            s->cfa_off = (int64_t)uleb(c);
            continue;
        case 0x10: /* expression */
        case 0x16: /* val_expression */
            reg = uleb(c);
            c->p += uleb(c);
            if (reg == REG_RBP || reg == REG_RA || reg == REG_RSP || c->p > c->end)
                return 0;
            continue;
        case 0x11:
            reg = uleb(c);
            set_rule(s, reg, R_OFFSET, sleb(c) * cie->data_align);
            continue;
        case 0x12:
            s->cfa_reg = uleb(c);
            s->cfa_off = sleb(c) * cie->data_align;
            continue;
        case 0x13:
            s->cfa_off = sleb(c) * cie->data_align;
            continue;
        case 0x14: /* val_offset */
        case 0x15: /* val_offset_sf */
            reg = uleb(c);
            if (op == 0x14)
                uleb(c);
            else
                sleb(c);
            if (reg == REG_RBP || reg == REG_RA)
                return 0;
            continue;
        case 0x2e:
            uleb(c);
            continue; /* GNU_args_size */
        case 0x2f:
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

struct find {
    uintptr_t ip;
    const uint8_t *hdr;
    int in_object;
};

static int find_object(struct dl_phdr_info *info, size_t size, void *arg) {
    struct find *f = arg;
    (void)size;
    const uint8_t *hdr = NULL;
    int hit = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && f->ip >= start && f->ip < start + ph->p_memsz)
            hit = 1;
        else if (ph->p_type == PT_GNU_EH_FRAME)
            hdr = (const uint8_t *)start;
    }
    if (!hit)
        return 0;
    f->in_object = 1;
    f->hdr = hdr;
    return 1;
}

/* The rule for the instruction at target (a return address minus one). */
static void compute(uintptr_t target, struct rule *out) {
    memset(out, 0, sizeof *out);
    struct find f = {target, NULL, 0};
    dl_iterate_phdr(find_object, &f);
    if (!f.in_object || !f.hdr) {
        out->kind = KIND_NO_INFO; /* JIT code or an object without unwind tables */
        return;
    }
    /* .eh_frame_hdr: version, three encodings, then a sorted search table. */
    const uint8_t *h = f.hdr;
    if (h[0] != 1 || h[3] != 0x3b) /* table of datarel sdata4 pairs */
        return;
    struct cursor c = {h + 4, h + 4 + 16, 0};
    encoded(&c, h[1], (uintptr_t)h); /* eh_frame_ptr: not needed */
    uint64_t count = encoded(&c, h[2], (uintptr_t)h);
    if (c.bad || count == 0)
        return;
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
        out->kind = KIND_NO_INFO;
        return;
    }
    const uint8_t *fde = h + table[2 * lo + 1];
    struct cursor d = {fde, fde + 8, 0};
    uint64_t len = fixed(&d, 4);
    if (len == 0 || len == 0xffffffff)
        return;
    d.end = fde + 4 + len;
    const uint8_t *id_at = d.p;
    uint32_t cie_off = (uint32_t)fixed(&d, 4);
    struct cie cie;
    if (!parse_cie(id_at - cie_off, &cie))
        return;
    uintptr_t begin = (uintptr_t)encoded(&d, cie.fde_enc, 0);
    uintptr_t range = (uintptr_t)encoded(&d, cie.fde_enc & 0x0f, 0);
    if (d.bad)
        return;
    if (target < begin || target >= begin + range) {
        out->kind = KIND_NO_INFO;
        return;
    }
    if (cie.has_z)
        d.p += uleb(&d);
    struct state s = {REG_RSP, 8, R_UNSET, R_UNSET, 0, 0}, init;
    uintptr_t loc = begin;
    if (!run(&cie.insns, &cie, &s, &s, &loc, ~(uintptr_t)0))
        return;
    init = s;
    loc = begin;
    if (!run(&d, &cie, &s, &init, &loc, target))
        return;

    if (s.cfa_reg != REG_RSP && s.cfa_reg != REG_RBP)
        return;
    if (s.cfa_off < INT32_MIN || s.cfa_off > INT32_MAX)
        return;
    if (s.ra == R_UNDEF) {
        out->kind = KIND_LAST;
        return;
    }
    if (s.ra != R_OFFSET || s.ra_off != -8)
        return;
    if (s.bp == R_OFFSET) {
        if (s.bp_off % 8 || s.bp_off < -1024 || s.bp_off > 1016) /* packed as a slot index */
            return;
        out->bp_saved = 1;
        out->bp_off = (int16_t)s.bp_off;
    } else if (s.bp != R_UNSET && s.bp != R_SAME) {
        return;
    }
    out->cfa_off = (int32_t)s.cfa_off;
    out->cfa_bp = s.cfa_reg == REG_RBP;
    out->kind = KIND_FRAME;
}

static void rule_for(uintptr_t ra, struct rule *r) {
    uint64_t gen = atomic_load_explicit(&generation, memory_order_relaxed) & ((1ull << 20) - 1);
    struct entry *t = cache_table();
    size_t mask = ((size_t)1 << CACHE_BITS) - 1, i = slot_of(ra);
    if (t) {
        for (int k = 0; k < CACHE_PROBES; k++, i = (i + 1) & mask) {
            uint64_t key = atomic_load_explicit(&t[i].key, memory_order_acquire);
            if (key == ra) {
                uint64_t v = atomic_load_explicit(&t[i].val, memory_order_relaxed);
                if (v >> GEN_SHIFT == gen) {
                    unpack(v, r);
                    return;
                }
                break; /* stale: recompute into this slot */
            }
            if (!key)
                break;
        }
    }
    compute(ra - 1, r);
    if (!t)
        return;
    uint64_t v = pack(r, gen);
    i = slot_of(ra);
    for (int k = 0; k < CACHE_PROBES; k++, i = (i + 1) & mask) {
        uint64_t key = atomic_load_explicit(&t[i].key, memory_order_acquire);
        if (key == ra) {
            atomic_store_explicit(&t[i].val, v, memory_order_relaxed);
            return;
        }
        if (key)
            continue;
        /* The value goes in first; a reader only trusts it once the key is there,
         * and whatever value it then reads carries its own generation. */
        atomic_store_explicit(&t[i].val, v, memory_order_relaxed);
        uint64_t none = 0;
        if (atomic_compare_exchange_strong_explicit(&t[i].key, &none, ra, memory_order_release,
                                                    memory_order_relaxed))
            return;
        if (none == ra) {
            atomic_store_explicit(&t[i].val, v, memory_order_relaxed);
            return;
        }
    }
}

/* ---- reusing this thread's previous walk ------------------------------- *
 *
 * Allocations come in bursts from the same place, so the outer part of a
 * stack is usually the one walked last time.  A walk is a pure function of
 * (ip, sp, bp) at a frame and of the stack words it reads from there on, so
 * when a frame matches a frame of the previous walk, re-reading those words
 * (independent loads, no hash probes) and finding them unchanged proves the
 * rest of the stack is the same.  bp only matters if a later frame uses it
 * before restoring it from the stack.  The previous walk lives in TLS
 * (1.7 KiB a thread); new frames above the match point are collected on the
 * C stack first, so the common case (same frames, same depth) copies none. */
#define WALK_MAX 64
#define PREFIX_MAX 16
#define F_BP_SAVED 1
#define F_NEEDS_BP 2 /* the walk from here on reads the incoming bp */
#define F_CFA_BP 4

struct frames {
    uintptr_t ip[WALK_MAX], sp[WALK_MAX], bp[WALK_MAX];
    int16_t bp_off[WALK_MAX];
    uint8_t flags[WALK_MAX];
};

/* The same columns, wherever they are stored (TLS or the C stack). */
struct cols {
    uintptr_t *ip, *sp, *bp;
    int16_t *bp_off;
    uint8_t *flags;
};

static __thread struct frames last __attribute__((tls_model("initial-exec")));
static __thread int last_n __attribute__((tls_model("initial-exec"))); /* 0 = none */
static __thread uint64_t last_gen __attribute__((tls_model("initial-exec")));
static __thread int last_max __attribute__((tls_model("initial-exec")));

/* The walker reads other frames' stack words on purpose. */
#define READS_STACK __attribute__((no_sanitize_address))

/* From which frame on does the previous walk still describe this stack?
 * Checks every step from frame c outwards: the return address slot, and
 * the saved-bp slot where a later frame uses that bp.  Returns the first
 * frame after the outermost step that changed (c when nothing changed). */
static READS_STACK int valid_from(int c) {
    int from = c;
    for (int j = c; j + 1 < last_n; j++) {
        int same = *(const uintptr_t *)(last.sp[j + 1] - 8) == last.ip[j + 1];
        if ((last.flags[j] & F_BP_SAVED) && (last.flags[j + 1] & F_NEEDS_BP))
            same &=
                *(const uintptr_t *)(last.sp[j + 1] + (intptr_t)last.bp_off[j]) == last.bp[j + 1];
        if (!same)
            from = j + 1;
    }
    return from;
}

/* F_NEEDS_BP for frames [0, upto), given the flags of frame upto. */
static void mark_needs(struct cols *f, int upto, int n) {
    uint8_t needs = upto < n ? (f->flags[upto] & F_NEEDS_BP) != 0 : 0;
    for (int j = upto - 1; j >= 0; j--) {
        uint8_t x = f->flags[j] & (F_BP_SAVED | F_CFA_BP);
        needs = (x & F_CFA_BP) ? 1 : (x & F_BP_SAVED) ? 0 : needs;
        f->flags[j] = x | (needs ? F_NEEDS_BP : 0);
    }
}

static void put(struct cols *f, int i, uintptr_t ip, uintptr_t sp, uintptr_t bp) {
    f->ip[i] = ip;
    f->sp[i] = sp;
    f->bp[i] = bp;
    f->flags[i] = 0;
    f->bp_off[i] = 0;
}

static void copy_frames(struct cols *to, const struct cols *from, int n) {
    for (int i = 0; i < n; i++) {
        to->ip[i] = from->ip[i];
        to->sp[i] = from->sp[i];
        to->bp[i] = from->bp[i];
        to->bp_off[i] = from->bp_off[i];
        to->flags[i] = from->flags[i];
    }
}

static struct cols last_cols(void) {
    return (struct cols){last.ip, last.sp, last.bp, last.bp_off, last.flags};
}

/* Frames [0, n) of pre replace the previous walk's frames above c. */
static void splice(const struct cols *pre, int n, int c) {
    int tail = last_n - c;
    if (n + tail > WALK_MAX)
        tail = WALK_MAX - n;
    if (n != c) {
        memmove(last.ip + n, last.ip + c, (size_t)tail * sizeof(uintptr_t));
        memmove(last.sp + n, last.sp + c, (size_t)tail * sizeof(uintptr_t));
        memmove(last.bp + n, last.bp + c, (size_t)tail * sizeof(uintptr_t));
        memmove(last.bp_off + n, last.bp_off + c, (size_t)tail * sizeof(int16_t));
        memmove(last.flags + n, last.flags + c, (size_t)tail);
    }
    struct cols l = last_cols();
    copy_frames(&l, pre, n);
    last_n = n + tail;
    mark_needs(&l, n, last_n);
}

READS_STACK __attribute__((noinline)) int mt_unwind(uintptr_t *out, int max, int *same) {
    uintptr_t ip, sp, bp;
    __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2"
                     : "=r"(ip), "=r"(sp), "=r"(bp));
    uint64_t gen = atomic_load_explicit(&generation, memory_order_relaxed);
    uintptr_t pre_ip[PREFIX_MAX], pre_sp[PREFIX_MAX], pre_bp[PREFIX_MAX];
    int16_t pre_bp_off[PREFIX_MAX];
    uint8_t pre_flags[PREFIX_MAX];
    /* While a match is possible, frames go to pre (the C stack), else to last. */
    struct cols pre = {pre_ip, pre_sp, pre_bp, pre_bp_off, pre_flags}, in_last = last_cols();
    struct cols *f = &pre;
    int c = (last_n && last_gen == gen) ? 0 : WALK_MAX;
    if (c) { /* nothing to reuse: write straight into last */
        f = &in_last;
        last_n = 0;
        last_gen = gen;
    }
    if (max > WALK_MAX)
        max = WALK_MAX;
    *same = 0;
    last_max = max;
    int n = 0, natural = 0, valid = -1; /* valid: frames from here on checked */
    while (n < max) {
        while (c < last_n && last.sp[c] < sp)
            c++;
        if (c < last_n && last.sp[c] == sp && last.ip[c] == ip &&
            (!(last.flags[c] & F_NEEDS_BP) || last.bp[c] == bp)) {
            if (valid < 0)
                valid = valid_from(c); /* once: the stack does not change meanwhile */
            if (c >= valid) {
                *same = n == 0 && c == 0 && max == last_max;
                last_max = max;
                splice(f, n, c);
                int give = last_n < max ? last_n : max;
                memcpy(out, last.ip, (size_t)give * sizeof(uintptr_t));
                return give;
            }
        }
        if (f == &pre && (c >= last_n || n == PREFIX_MAX)) {
            /* No reuse after all: move what pre holds into last and go on there. */
            copy_frames(&in_last, &pre, n);
            f = &in_last;
            c = WALK_MAX;
            last_n = 0;
            last_gen = gen;
        }
        out[n] = ip;
        put(f, n, ip, sp, bp);
        n++;
        struct rule r;
        rule_for(ip, &r);
        if (r.kind == KIND_LAST || r.kind == KIND_NO_INFO) {
            natural = 1;
            break;
        }
        if (r.kind != KIND_FRAME)
            goto give_up;
        uintptr_t cfa = (r.cfa_bp ? bp : sp) + (intptr_t)r.cfa_off;
        if (cfa <= sp || cfa - sp > ((uintptr_t)1 << 30))
            goto give_up; /* stacks grow down: a rule that says otherwise is not trusted */
        f->flags[n - 1] = (r.cfa_bp ? F_CFA_BP : 0) | (r.bp_saved ? F_BP_SAVED : 0);
        f->bp_off[n - 1] = r.bp_off;
        if (r.bp_saved)
            bp = *(const uintptr_t *)(cfa + (intptr_t)r.bp_off);
        ip = *(const uintptr_t *)(cfa - 8);
        sp = cfa;
        if (!ip) {
            natural = 1;
            break;
        }
    }
    if (f == &in_last) {
        last_n = natural ? n : 0; /* a walk cut short by max cannot stand for a longer one */
        mark_needs(&in_last, last_n, last_n);
    } else { /* a short stack that ended before any match: keep it */
        copy_frames(&in_last, &pre, n);
        last_n = natural ? n : 0;
        last_gen = gen;
        mark_needs(&in_last, last_n, last_n);
    }
    return n;
give_up:
    last_n = 0;
    return -1;
}

#else /* not x86-64 Linux */

int mt_unwind(uintptr_t *out, int max, int *same) {
    (void)out;
    (void)max;
    *same = 0;
    return -1;
}

void mt_unwind_forget(void) {}

#endif
