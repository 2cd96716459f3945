/* The loaded objects (see objects.h). */
#define _GNU_SOURCE
#include "objects.h"

#include <link.h>
#include <stddef.h>

#include "spinlock.h"

/* dl_iterate_phdr holds the loader's object list lock meanwhile, which a
 * fork child does not get back (glibc resets only its load lock): a fork
 * while a walk here was looking up an object would leave the child's
 * first walks (its rule cache starts empty) waiting for it for ever.  So
 * lookups take turns under a lock of ours, which fork holds too
 * (mt_objects_lock).  mt_objects_each is left out: it calls its caller's
 * function, which may allocate and so walk. */
static mt_spinlock lookups;

void mt_objects_lock(void) { mt_lock(&lookups); }
void mt_objects_unlock(void) { mt_unlock(&lookups); }

static void iterate(int (*fn)(struct dl_phdr_info *, size_t, void *), void *arg) {
    mt_lock(&lookups);
    dl_iterate_phdr(fn, arg);
    mt_unlock(&lookups);
}

struct walk {
    mtrace_object_fn fn;
    void *ctx;
    uintptr_t addr; /* 0 = every object */
    uint32_t index;
    int found;
    uint64_t generation; /* the same in every entry: kept from the first */
    struct mtrace_object *out;
};

static void describe(const struct dl_phdr_info *info, size_t size, uint32_t index,
                     struct mtrace_object *o) {
    o->generation = 0;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        o->generation = (uint64_t)info->dlpi_adds + (uint64_t)info->dlpi_subs;
    o->path = info->dlpi_name ? info->dlpi_name : "";
    o->base = (uintptr_t)info->dlpi_addr;
    o->lo = o->hi = 0;
    o->phdr = info->dlpi_phdr;
    o->phnum = info->dlpi_phnum;
    o->index = index;
}

static int visit(struct dl_phdr_info *info, size_t size, void *arg) {
    struct walk *w = arg;
    struct mtrace_object o;
    describe(info, size, w->index++, &o);
    w->generation = o.generation;
    if (!w->addr)
        return w->fn(w->ctx, &o);
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && w->addr >= lo && w->addr < lo + ph->p_memsz) {
            o.lo = lo;
            o.hi = lo + ph->p_memsz;
            *w->out = o;
            w->found = 1;
            return 1;
        }
    }
    return 0;
}

void mt_objects_each(mtrace_object_fn fn, void *ctx) {
    struct walk w = {fn, ctx, 0, 0, 0, 0, NULL};
    if (fn)
        dl_iterate_phdr(visit, &w);
}

enum mtrace_result mt_object_at(uintptr_t addr, struct mtrace_object *out) {
    struct walk w = {NULL, NULL, addr ? addr : 1, 0, 0, 0, out};
    if (!out)
        return MTRACE_ERR_ARGUMENT;
    iterate(visit, &w); /* one pass: the generation comes with the lookup */
    out->generation = w.generation;
    return w.found && addr ? MTRACE_OK : MTRACE_ERR_ARGUMENT;
}

static int generation_of(struct dl_phdr_info *info, size_t size, void *arg) {
    struct mtrace_object o;
    describe(info, size, 0, &o);
    *(uint64_t *)arg = o.generation;
    return 1; /* the counters are the same in every entry: stop after the first */
}

uint64_t mt_objects_generation(void) {
    uint64_t g = 0;
    iterate(generation_of, &g);
    return g;
}

const uint8_t *mt_object_eh_frame_hdr(const struct mtrace_object *o) {
    const ElfW(Phdr) *ph = o->phdr;
    for (uint32_t i = 0; i < o->phnum; i++)
        if (ph[i].p_type == PT_GNU_EH_FRAME)
            return (const uint8_t *)(o->base + ph[i].p_vaddr);
    return NULL;
}
