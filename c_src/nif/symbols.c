/*
 * Return addresses of this process -> object, function, source line, inlined frames.
 *
 *   - The module list comes from the preload's list of loaded objects (api->objects): one
 *     entry per object, its PT_LOAD segments in one sorted array for a binary search.  It is
 *     rebuilt when api->objects_generation moves (the walker sees loads and unloads by the
 *     same counter); modules still loaded keep their caches.
 *   - Per module, on first use: the function symbols of the file on disk (.symtab, else .dynsym)
 *     in a sorted array, and with libdw its DWARF.
 *   - Per module, a 4-way set-associative cache of finished answers: a DWARF scope walk costs
 *     tens of microseconds on a large compilation unit, and leak reports repeat the same
 *     addresses.
 *
 * Only files are read, never the memory of the objects (but for their build id, read while the
 * loader lists them), so an address inside a library that has been unloaded since it was
 * recorded cannot fault.
 */
#define _GNU_SOURCE
#include "symbols.h"

#include "build_id.h"
#include "demangle.h"
#include "dwarf_lines.h"
#include "elf_symtab.h"
#include "name_fit.h"
#include "proc_maps.h"

#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

typedef ElfW(Phdr) Phdr;

#define CACHE_SLOTS 4096 /* answers cached per module; a power of two */
#define CACHE_WAYS 4 /* set-associative: a few colliding hot addresses do not evict each other */

/* A finished answer; its strings follow the frames in the same allocation. */
struct answer {
    uintptr_t pc;
    int demangle, n;
    struct mt_dw_frame f[];
};

struct module {
    uintptr_t bias;
    char *path;
    int is_exe;
    struct mt_map file; /* the mapping of its first segment: which file it is */
    unsigned char build_id[MT_BUILD_ID_MAX]; /* of the object mapped; build_id_len 0: none */
    size_t build_id_len;
    pthread_mutex_t mu; /* guards everything below: loading, libdw (not thread-safe), cache */
    int loaded;
    struct symtab st;
    struct mt_dwarf *dwarf;
    struct answer **cache;
};

struct seg {
    uintptr_t lo, hi;
    struct module *mod;
};

/* The symbolizer's one state.  Readers hold lock shared for a whole lookup,
 * so modules outlive any use of them. */
static struct {
    pthread_rwlock_t lock;
    struct module **mods;
    size_t nmods;
    struct seg *segs; /* every module's loadable segments, sorted by address */
    size_t nsegs;
    int valid;                    /* the lists match the loaded objects of generation */
    uint64_t generation;          /* api->objects_generation when they were read */
    const struct mtrace_api *api; /* where the loaded objects are listed */
} sym = {.lock = PTHREAD_RWLOCK_INITIALIZER};

static void put_text(char *dst, size_t cap, const char *src) {
    size_t n = mt_text_cut(src, cap - 1);
    if (n)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---- modules ----------------------------------------------------------- */

static void module_free(struct module *m) {
    if (!m)
        return;
    mt_symtab_free(&m->st);
    mt_dwarf_close(m->dwarf);
    if (m->cache)
        for (size_t i = 0; i < CACHE_SLOTS; i++)
            free(m->cache[i]);
    free(m->cache);
    pthread_mutex_destroy(&m->mu);
    free(m->path);
    free(m);
}

/* Whether the path names another file than the one mapped, or none: the
 * list of mappings may be older than a package upgrade that replaced it. */
static int replaced(const struct module *m) {
    if (m->file.deleted)
        return 1;
    struct stat st;
    if (!m->file.ino || stat(m->path, &st) != 0)
        return !m->file.ino ? 0 : 1;
    unsigned long dev = ((unsigned long)major(st.st_dev) << 20) | minor(st.st_dev);
    return (uint64_t)st.st_ino != m->file.ino || dev != m->file.dev;
}

/* Whether the file at the path is the build that is mapped, though not the
 * file mapped (reinstalled), or though stat names its device otherwise than
 * the list of mappings does (btrfs subvolumes, overlayfs): then the path
 * is read, for the mapped file's /proc/self/map_files link opens only in a
 * privileged process (CAP_SYS_ADMIN), not a node run as a user or in a
 * container. */
static int same_build(const struct module *m) {
    unsigned char id[MT_BUILD_ID_MAX];
    size_t n = m->build_id_len ? mt_build_id_file(m->path, id) : 0;
    return n && n == m->build_id_len && !memcmp(id, m->build_id, n);
}

static void module_load(struct module *m) {
    m->loaded = 1;
    char mapped[64];
    const char *path = m->is_exe ? "/proc/self/exe" : m->path;
    /* the path names another file now, or none */
    if (!m->is_exe && replaced(m) && !same_build(m)) {
        mt_maps_file(&m->file, mapped, sizeof mapped);
        path = mapped;
    }
    mt_symtab_read_file(path, &m->st);
    m->dwarf = mt_dwarf_open(path);
}

struct scan {
    struct module **old, **mods;
    size_t nold, nmods, modcap;
    struct seg *segs;
    size_t nsegs, segcap;
    int failed;
    char exe[PATH_MAX];
    struct mt_map *maps; /* which file each mapping is */
    size_t nmaps;
};

/* The array grown to hold need elements, or NULL (the old one left as it was). */
static void *grow(void *arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return arr;
    size_t ncap = *cap ? *cap * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(arr, ncap * elem);
    if (p)
        *cap = ncap;
    return p;
}

static int scan_cb(void *arg, const struct mtrace_object *o) {
    struct scan *s = arg;
    /* The main program comes first, nameless (glibc) or named as it was started,
     * perhaps relative (musl); other nameless entries have no file. */
    const char *name = o->path;
    int is_exe = o->index == 0;
    const char *path = is_exe ? s->exe : name;
    if (!path[0])
        return 0;
    void *mods = grow(s->mods, &s->modcap, s->nmods + 1, sizeof *s->mods);
    if (mods)
        s->mods = mods;
    void *segs = grow(s->segs, &s->segcap, s->nsegs + o->phnum, sizeof *s->segs);
    if (segs)
        s->segs = segs;
    if (!mods || !segs) {
        s->failed = 1;
        return 0;
    }
    const Phdr *phdr = o->phdr;
    const struct mt_map *file = NULL;
    for (size_t i = 0; i < o->phnum && !file; i++)
        if (phdr[i].p_type == PT_LOAD && phdr[i].p_memsz > 0)
            file = mt_maps_find(s->maps, s->nmaps, o->base + phdr[i].p_vaddr);
    struct mt_map none = {0};
    if (!file)
        file = &none;
    /* The same object only if the same file: one rebuilt and loaded again at
     * the same address under the same path is another. */
    struct module *m = NULL;
    for (size_t i = 0; i < s->nold && !m; i++)
        if (s->old[i] && s->old[i]->bias == o->base && !strcmp(s->old[i]->path, path) &&
            s->old[i]->file.ino == file->ino && s->old[i]->file.dev == file->dev) {
            m = s->old[i];
            s->old[i] = NULL;
        }
    if (!m && (m = calloc(1, sizeof *m))) {
        m->bias = o->base;
        m->is_exe = is_exe;
        m->file = *file;
        m->build_id_len = mt_build_id_mapped(o->phdr, o->phnum, o->base, m->build_id);
        pthread_mutex_init(&m->mu, NULL);
        if (!(m->path = strdup(path))) {
            module_free(m);
            m = NULL;
        }
    }
    if (!m) {
        s->failed = 1;
        return 0;
    }
    s->mods[s->nmods++] = m;
    for (size_t i = 0; i < o->phnum; i++) {
        const Phdr *ph = &phdr[i];
        if (ph->p_type == PT_LOAD && ph->p_memsz > 0)
            s->segs[s->nsegs++] =
                (struct seg){m->bias + ph->p_vaddr, m->bias + ph->p_vaddr + ph->p_memsz, m};
    }
    return 0;
}

static int seg_cmp(const void *pa, const void *pb) {
    const struct seg *a = pa, *b = pb;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Called with sym.lock held exclusively. */
static void rebuild(void) {
    struct scan *s = calloc(1, sizeof *s);
    if (!s)
        return;
    ssize_t n = readlink("/proc/self/exe", s->exe, sizeof s->exe - 1);
    if (n > 0)
        s->exe[n] = '\0';
    else
        strcpy(s->exe, "/proc/self/exe");
    s->old = sym.mods;
    s->nold = sym.nmods;
    uint64_t generation =
        sym.api->objects_generation(); /* before: a later change shows next time */
    mt_maps_read(&s->maps, &s->nmaps); /* none: objects are told by path alone */
    sym.api->objects(scan_cb, s);
    free(s->maps);
    for (size_t i = 0; i < s->nold; i++)
        module_free(s->old[i]);
    free(s->old);
    free(sym.segs);
    qsort(s->segs, s->nsegs, sizeof *s->segs, seg_cmp);
    sym.mods = s->mods;
    sym.nmods = s->nmods;
    sym.segs = s->segs;
    sym.nsegs = s->nsegs;
    sym.generation = generation;
    sym.valid = !s->failed; /* after running out of memory, try again next time */
    free(s);
}

void mt_symbols_use(const struct mtrace_api *api) {
    pthread_rwlock_wrlock(&sym.lock);
    sym.api = api;
    sym.valid = 0;
    pthread_rwlock_unlock(&sym.lock);
}

void mt_symbols_flush(void) {
    pthread_rwlock_wrlock(&sym.lock);
    for (size_t i = 0; i < sym.nmods; i++)
        module_free(sym.mods[i]);
    free(sym.mods);
    free(sym.segs);
    sym.mods = NULL;
    sym.segs = NULL;
    sym.nmods = sym.nsegs = 0;
    sym.valid = 0;
    pthread_rwlock_unlock(&sym.lock);
}

static struct module *module_find(uintptr_t pc) {
    size_t lo = 0, hi = sym.nsegs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sym.segs[mid].lo <= pc)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && pc < sym.segs[lo - 1].hi ? sym.segs[lo - 1].mod : NULL;
}

/* ---- answers ----------------------------------------------------------- */

static size_t text_len(const char *s) { return mt_text_cut(s, MT_SYM_TEXT - 1); }

static char *put_copy(char *p, const char *s) {
    size_t n = text_len(s);
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p + n + 1;
}

/* Copies the frames and their strings (demangled if asked) into one allocation. */
static struct answer *answer_make(const struct mt_dw_frame *f, int n, uintptr_t pc, int demangle) {
    char *dm[MT_SYM_MAX_FRAMES] = {0};
    size_t bytes = sizeof(struct answer) + (size_t)n * sizeof(struct mt_dw_frame);
    for (int i = 0; i < n; i++) {
        if (demangle)
            dm[i] = mt_demangle_dup(f[i].name);
        bytes += text_len(dm[i] ? dm[i] : f[i].name) + text_len(f[i].file) + 2;
    }
    struct answer *a = malloc(bytes);
    if (a) {
        *a = (struct answer){pc, demangle, n};
        char *p = (char *)&a->f[n];
        for (int i = 0; i < n; i++) {
            a->f[i] = f[i];
            a->f[i].name = p;
            p = put_copy(p, dm[i] ? dm[i] : f[i].name);
            a->f[i].file = p;
            p = put_copy(p, f[i].file);
        }
    }
    for (int i = 0; i < n; i++)
        free(dm[i]);
    return a;
}

/* First slot of the set that may hold pc's answer. */
static size_t set_of(uintptr_t pc, int demangle) {
    uint64_t h = ((uint64_t)pc ^ (uint64_t)(demangle != 0)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (CACHE_SLOTS - 1) & ~(size_t)(CACHE_WAYS - 1);
}

/* Writes min(n, max) entries; when some must go, the last written is still the real function. */
static int emit(uintptr_t addr, const struct module *m, const struct mt_dw_frame *f, int n,
                struct mt_frame_info *out, int max) {
    int k = n < max ? n : max;
    for (int i = 0; i < k; i++) {
        const struct mt_dw_frame *src = &f[i == k - 1 ? n - 1 : i];
        struct mt_frame_info *o = &out[i];
        o->addr = addr;
        put_text(o->lib, sizeof o->lib, m ? m->path : NULL);
        put_text(o->symbol, sizeof o->symbol, src->name);
        put_text(o->file, sizeof o->file, src->file);
        o->line = src->line;
        o->inlined = src->inlined;
        o->offset = m ? addr - m->bias : 0;
    }
    return k;
}

/* Called with m->mu held. */
static int resolve_in(struct module *m, uintptr_t addr, uintptr_t pc, int demangle,
                      struct mt_frame_info *out, int max) {
    if (!m->loaded)
        module_load(m);
    if (!m->cache)
        m->cache = calloc(CACHE_SLOTS, sizeof *m->cache);
    size_t set = set_of(pc, demangle), slot = set + CACHE_WAYS - 1;
    for (size_t w = 0; m->cache && w < CACHE_WAYS; w++) {
        struct answer *a = m->cache[set + w];
        if (a && a->pc == pc && a->demangle == demangle)
            return emit(addr, m, a->f, a->n, out, max);
        if (!a && slot == set + CACHE_WAYS - 1)
            slot = set + w; /* the first free way, else the last one is replaced */
    }

    struct mt_dw_frame f[MT_SYM_MAX_FRAMES];
    const struct sym *s = mt_symtab_find(&m->st, pc - m->bias);
    int n = mt_dwarf_frames(m->dwarf, pc - m->bias, f, MT_SYM_MAX_FRAMES);
    if (n == 0)
        f[n++] = (struct mt_dw_frame){NULL, NULL, 0, 0};
    /* The symbol table names the function (DWARF would say "foo" for "foo.cold"), unless all
     * it has is a nearest preceding symbol without a size. */
    if (s && (s->size || !f[n - 1].name))
        f[n - 1].name = s->name;
    struct answer *a = answer_make(f, n, pc, demangle);
    if (!a)
        return emit(addr, m, f, n, out, max); /* out of memory: undemangled, uncached */
    if (m->cache) {
        free(m->cache[slot]);
        m->cache[slot] = a;
    }
    int k = emit(addr, m, a->f, a->n, out, max);
    if (!m->cache)
        free(a);
    return k;
}

/* Takes sym.lock shared, with the module list up to date with the loaded objects. */
static void modules_lock(void) {
    uint64_t now = sym.api ? sym.api->objects_generation() : 0;
    pthread_rwlock_rdlock(&sym.lock);
    /* Retried because a flush may slip in between the rebuild and the shared lock; bounded
     * because a rebuild that ran out of memory leaves the list invalid. */
    for (int tries = 0; sym.api && tries < 3 && (!sym.valid || now != sym.generation); tries++) {
        pthread_rwlock_unlock(&sym.lock);
        pthread_rwlock_wrlock(&sym.lock);
        now = sym.api->objects_generation();
        if (!sym.valid || now != sym.generation)
            rebuild();
        pthread_rwlock_unlock(&sym.lock);
        pthread_rwlock_rdlock(&sym.lock);
    }
}

int mt_symbols_resolve(uintptr_t ret_addr, int demangle, struct mt_frame_info *out, int max) {
    if (!out || max < 1)
        return 0;
    demangle = demangle != 0;
    if (demangle) /* may dlopen libstdc++: do it before taking locks and reading counters */
        mt_demangle_prepare();
    /* A return address points after the call; the call itself is one byte earlier. */
    uintptr_t pc = ret_addr ? ret_addr - 1 : 0;
    modules_lock();
    struct module *m = module_find(pc);
    int n;
    if (m) {
        pthread_mutex_lock(&m->mu);
        n = resolve_in(m, ret_addr, pc, demangle, out, max);
        pthread_mutex_unlock(&m->mu);
    } else {
        n = emit(ret_addr, NULL, &(struct mt_dw_frame){0}, 1, out, max);
    }
    pthread_rwlock_unlock(&sym.lock);
    return n;
}

int mt_symbols_any_lib(const uintptr_t *ret_addrs, size_t n, const char *needle) {
    int found = 0;
    modules_lock();
    for (size_t i = 0; i < n && !found; i++) {
        const struct module *m = module_find(ret_addrs[i] ? ret_addrs[i] - 1 : 0);
        found = m && strstr(m->path, needle) != NULL;
    }
    pthread_rwlock_unlock(&sym.lock);
    return found;
}
