/* The loaded objects (see objects.h). */
#define _GNU_SOURCE
#include "objects.h"

#include <link.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>

#include "fork_gate.h"

/* dl_iterate_phdr holds the loader's object list lock meanwhile, which a
 * fork child does not get back (glibc resets only its load lock): a fork
 * while a lookup was under way here would leave the child's first walks
 * (its rule cache starts empty) waiting for it for ever.  So a fork first
 * closes the way in and waits for the lookups under way to end
 * (mt_objects_close, before it takes any other lock of the tracer), and
 * until it is done a walk's lookup gives up (mt_object_at_walking) and
 * other lookups wait.  Lookups never wait for each other: a lock here
 * would hang a thread whose dl_iterate_phdr callback (other code's)
 * allocates, and so walks, while another lookup waits for the loader's
 * lock that thread holds. */
static struct mt_fork_gate gate;
/* In a fork child: glibc does not give back the loader's list lock there
 * either, and a thread of the parent other than the forking one may have
 * held it, in dl_iterate_phdr called by other code (libunwind, libgcc's
 * unwinder before glibc 2.35, the program): the child's first walk would
 * wait for it for ever. */
static _Atomic int forked;
/* This thread's lookups under way: one inside another's callback enters
 * at once (a fork still waits for the outer one). */
static __thread int mine __attribute__((tls_model("initial-exec")));

static int enter(int wait) {
    for (;;) {
        /* seq_cst: a fork sees this lookup, or this lookup sees the fork */
        atomic_fetch_add(&gate.inside, 1);
        if (mine || !atomic_load(&gate.closing)) {
            mine++;
            return 1;
        }
        atomic_fetch_sub(&gate.inside, 1);
        if (!wait)
            return 0;
        unsigned yields = 0;
        while (atomic_load_explicit(&gate.closing, memory_order_relaxed))
            mt_backoff(&yields);
    }
}

static void leave(void) {
    mine--;
    atomic_fetch_sub_explicit(&gate.inside, 1, memory_order_release);
}

void mt_objects_close(void) { mt_fork_gate_close(&gate); }
void mt_objects_open(void) { mt_fork_gate_open(&gate); }
void mt_objects_open_child(void) {
    atomic_store(&forked, 1);
    mt_fork_gate_open_child(&gate);
}

int mt_objects_mine(void) { return mine != 0; }

int mt_objects_forked(void) { return atomic_load_explicit(&forked, memory_order_relaxed); }

static int iterate(int (*fn)(struct dl_phdr_info *, size_t, void *), void *arg, int wait) {
    if (!enter(wait))
        return 0;
    dl_iterate_phdr(fn, arg);
    leave();
    return 1;
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
        iterate(visit, &w, 1);
}

static int look_up(uintptr_t addr, struct mtrace_object *out, int wait) {
    struct walk w = {NULL, NULL, addr ? addr : 1, 0, 0, 0, out};
    if (!out)
        return MTRACE_ERR_ARGUMENT;
    if (!iterate(visit, &w, wait)) /* one pass: the generation comes with the lookup */
        return MT_OBJECTS_CLOSED;
    out->generation = w.generation;
    return w.found && addr ? MTRACE_OK : MTRACE_ERR_ARGUMENT;
}

enum mtrace_result mt_object_at(uintptr_t addr, struct mtrace_object *out) {
    return (enum mtrace_result)look_up(addr, out, 1);
}

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
#define HAVE_DL_FIND_OBJECT 1
#include <dlfcn.h>
#include <string.h>

/* Looked up, not linked: a library built against glibc 2.35 must still
 * load where an older glibc runs (its children's stacks are then cut). */
typedef int (*find_object_fn)(void *, struct dl_find_object *);
static _Atomic(find_object_fn) find_object;

void mt_objects_init(void) {
    void *sym = dlsym(RTLD_DEFAULT, "_dl_find_object");
    if (!sym) /* before glibc 2.35: not the program's failure to tell */
        dlerror();
    find_object_fn f;
    memcpy(&f, &sym, sizeof f); /* a data pointer to a function pointer, as POSIX allows */
    atomic_store(&find_object, f);
}

/* A fork child's lookup: _dl_find_object takes no lock (and is
 * async-signal-safe).  Only what the walker needs is filled in.  Nothing
 * found is cached (generation 0): each frame not walked before costs a
 * lookup and a parse of its FDE, for as long as the child runs. */
static int find_in_child(uintptr_t addr, struct mtrace_object *out, const uint8_t **hdr) {
    struct dl_find_object f;
    find_object_fn find = atomic_load_explicit(&find_object, memory_order_relaxed);
    out->generation = 0;
    if (!find)
        return MT_OBJECTS_CLOSED;
    if (find((void *)addr, &f) != 0)
        return MTRACE_ERR_ARGUMENT;
    out->path = "";
    out->base = f.dlfo_link_map ? (uintptr_t)f.dlfo_link_map->l_addr : 0;
    out->lo = (uintptr_t)f.dlfo_map_start;
    out->hi = (uintptr_t)f.dlfo_map_end;
    out->phdr = NULL;
    out->phnum = 0;
    out->index = 0;
    *hdr = f.dlfo_eh_frame;
    return MTRACE_OK;
}
#else
void mt_objects_init(void) {}
#endif

int mt_object_at_walking(uintptr_t addr, struct mtrace_object *out, const uint8_t **hdr) {
    *hdr = NULL;
#ifdef __GLIBC__
    if (mt_objects_forked()) {
#ifdef HAVE_DL_FIND_OBJECT
        return find_in_child(addr, out, hdr);
#else
        out->generation = 0;
        return MT_OBJECTS_CLOSED;
#endif
    }
#endif
    int found = look_up(addr, out, 0);
    if (found == MTRACE_OK)
        *hdr = mt_object_eh_frame_hdr(out);
    return found;
}

static int generation_of(struct dl_phdr_info *info, size_t size, void *arg) {
    struct mtrace_object o;
    describe(info, size, 0, &o);
    *(uint64_t *)arg = o.generation;
    return 1; /* the counters are the same in every entry: stop after the first */
}

uint64_t mt_objects_generation(void) {
    uint64_t g = 0;
    iterate(generation_of, &g, 1);
    return g;
}

uint64_t mt_objects_generation_walking(void) {
    uint64_t g = 0;
    if (!mt_objects_forked())
        iterate(generation_of, &g, 0);
    return g;
}

const uint8_t *mt_object_eh_frame_hdr(const struct mtrace_object *o) {
    const ElfW(Phdr) *ph = o->phdr;
    for (uint32_t i = 0; i < o->phnum; i++)
        if (ph[i].p_type == PT_GNU_EH_FRAME)
            return (const uint8_t *)(o->base + ph[i].p_vaddr);
    return NULL;
}
