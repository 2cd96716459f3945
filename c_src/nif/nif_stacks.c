/*
 * Stacks as terms, for the NIF's answers: native frames named by the
 * symbolizer (a frame in code unloaded since its stack was walked has no
 * name), the VM's own frames where a NIF's stack leaves it left out, the
 * Erlang frames after them, each distinct frame built once per answer.
 */
#define _GNU_SOURCE
#include "nif_stacks.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "symbols.h"

#define MAX_INLINE 8

static ERL_NIF_TERM binary_or_nil(ErlNifEnv *env, const char *s) {
    return *s ? mt_nif_binary(env, s) : mt_atoms.nil;
}

static ERL_NIF_TERM frame_map(ErlNifEnv *env, const struct mt_frame_info *f) {
    ERL_NIF_TERM keys[] = {mt_atoms.lib,  mt_atoms.symbol,  mt_atoms.file,  mt_atoms.line,
                           mt_atoms.addr, mt_atoms.inlined, mt_atoms.offset};
    ERL_NIF_TERM values[] = {
        binary_or_nil(env, f->lib),       binary_or_nil(env, f->symbol),
        binary_or_nil(env, f->file),      f->line > 0 ? enif_make_int(env, f->line) : mt_atoms.nil,
        enif_make_uint64(env, f->addr),   mt_nif_boolean(f->inlined),
        enif_make_uint64(env, f->offset),
    };
    ERL_NIF_TERM map;
    enif_make_map_from_arrays(env, keys, values, sizeof keys / sizeof *keys, &map);
    return map;
}

/* Whether addr is in mapped memory: JIT code is, the code of a library
 * unloaded since is not (mincore fails with ENOMEM on an unmapped page). */
static int mapped(uintptr_t addr) {
    unsigned char resident;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    return mincore((void *)(addr & ~(page - 1)), 1, &resident) == 0 || errno != ENOMEM;
}

/* Where a stack with Erlang frames leaves the NIF: the first frame of the
 * VM's NIF trampoline, or of JIT code (in no object, but mapped: a NIF
 * library unloaded since is in no object either, and its frames, shown as
 * ?? with their addresses, are what tell its stacks apart).  The frames
 * from there outwards are the scheduler's, and the Erlang frames stand in
 * for them. */
static int vm_boundary(const struct mt_frame_info *f) {
    return (!*f->lib && mapped(f->addr)) || strstr(f->symbol, "beam_jit_call_nif") ||
           strstr(f->symbol, "erts_call_dirty_nif");
}

/* The running executable (beam.smp), as the symbolizer names objects. */
static char vm_path[MT_SYM_TEXT];
static void read_vm_path(void) {
    ssize_t n = readlink("/proc/self/exe", vm_path, sizeof vm_path - 1);
    vm_path[n > 0 ? n : 0] = 0;
}
static const char *vm_executable(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT; /* dirty schedulers ask at once */
    pthread_once(&once, read_vm_path);
    return vm_path;
}

/* A frame of the VM's allocators or of the API a NIF or driver allocates
 * through (enif_alloc_resource, driver_alloc, ...): with +MRe false or
 * +MBe false they reach malloc, and the frame worth showing first is the
 * NIF's own, below them. */
static int vm_allocator(const struct mt_frame_info *f) {
    static const char *const prefixes[] = {"erts_sys_alloc", "erts_sys_realloc", "erts_alloc",
                                           "erts_realloc",   "erts_alcu_",       "erts_bin_",
                                           "enif_",          "driver_",          "sys_alloc",
                                           "sys_realloc"};
    if (!*f->lib || strcmp(f->lib, vm_executable()))
        return 0;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(f->symbol, prefixes[i], strlen(prefixes[i])))
            return 1;
    return 0;
}

/* The frame terms of the native frame at ip: with maps, a tuple of a map
 * per level of inlined code, innermost first; else the seed's {lib,
 * symbol} pair.  Built once per answer through `frames` (NULL: no memo):
 * thousands of stacks share their outer frames. */
static ERL_NIF_TERM frame_terms(ErlNifEnv *env, struct mt_term_memo *frames, uintptr_t ip, int gone,
                                int demangle, int maps) {
    ERL_NIF_TERM t;
    /* unloaded since its stack was walked: another library may be mapped
     * there now, so the address alone is not the key */
    uint64_t key = gone ? ip | 1ull << 62 : ip;
    if (frames && mt_term_memo_get(frames, key, &t))
        return t;
    struct mt_frame_info info[MAX_INLINE];
    int n = 1;
    if (gone)
        info[0] = (struct mt_frame_info){.addr = ip};
    else
        n = mt_symbols_resolve(ip, demangle, info, MAX_INLINE);
    if (maps) {
        ERL_NIF_TERM levels[MAX_INLINE];
        for (int k = 0; k < n; k++)
            levels[k] = frame_map(env, &info[k]);
        t = enif_make_tuple_from_array(env, levels, n > 0 ? (unsigned)n : 0);
    } else {
        const struct mt_frame_info *f = &info[n > 0 ? n - 1 : 0];
        t = n > 0 ? enif_make_tuple2(env, binary_or_nil(env, f->lib), binary_or_nil(env, f->symbol))
                  : enif_make_tuple2(env, mt_atoms.nil, mt_atoms.nil);
    }
    if (frames)
        mt_term_memo_put(frames, key, t);
    return t;
}

/* An Erlang frame's term, shared through `frames` as the native ones are:
 * the outer frames of a NIF's stacks are its Erlang callers.  Keyed by all
 * it names, not its pc alone (other code may have been loaded at that
 * address since), mixed to 63 bits with the top bit set: apart from the
 * native frames' keys, which are addresses. */
static ERL_NIF_TERM erl_frame_term(ErlNifEnv *env, struct mt_term_memo *frames,
                                   const struct mtrace_erl_frame *f, int maps) {
    uint64_t parts[] = {f->pc, f->module, f->function, (uint64_t)f->arity << 32 | f->line,
                        (uint64_t)(uintptr_t)f->file};
    uint64_t key = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        key = (key ^ parts[i]) * 0xBF58476D1CE4E5B9ull;
        key ^= key >> 31;
    }
    key |= 1ull << 63;
    ERL_NIF_TERM t;
    if (frames && mt_term_memo_get(frames, key, &t))
        return t;
    t = maps ? mt_erlang_frame_map(env, f) : mt_erlang_frame_pair(env, f);
    if (frames)
        mt_term_memo_put(frames, key, t);
    return t;
}

/* mt_nif_stack_term's work, under one generation of the loaded objects. */
static ERL_NIF_TERM stack_term(ErlNifEnv *env, struct mt_term_memo *frames, uint32_t stack_id,
                               int demangle, int maps) {
    uintptr_t ips[MTRACE_MAX_DEPTH];
    struct mtrace_erl_frame erl[MTRACE_MAX_DEPTH];
    uint32_t depth = mt_api->stack(stack_id, ips, MTRACE_MAX_DEPTH);
    uint32_t n_erl = mt_api->erlang_stack(stack_id, erl, MTRACE_MAX_DEPTH);
    uint32_t epoch = mt_api->stack_epoch(stack_id);
    unsigned char gone[MTRACE_MAX_DEPTH];
    for (uint32_t i = 0; i < depth; i++)
        gone[i] = (unsigned char)mt_api->unloaded_since(epoch, ips[i]);
    ERL_NIF_TERM list = enif_make_list(env, 0);
    for (uint32_t i = n_erl; i-- > 0;)
        list = enif_make_list_cell(env, erl_frame_term(env, frames, &erl[i], maps), list);
    struct mt_frame_info info[MAX_INLINE];
    uint32_t first = 0, shown = depth;
    for (uint32_t i = 0; n_erl && i < depth; i++) {
        int n = gone[i] ? 0 : mt_symbols_resolve(ips[i], 0, info, MAX_INLINE);
        if (n > 0 && vm_boundary(&info[n - 1])) {
            shown = i;
            break;
        }
    }
    while (first + 1 < shown && !gone[first] &&
           mt_symbols_resolve(ips[first], 0, info, MAX_INLINE) > 0 && vm_allocator(&info[0]))
        first++;
    for (uint32_t i = shown; i-- > first;) {
        ERL_NIF_TERM t = frame_terms(env, frames, ips[i], gone[i], demangle, maps);
        if (!maps) {
            list = enif_make_list_cell(env, t, list);
            continue;
        }
        int n;
        const ERL_NIF_TERM *levels;
        if (enif_get_tuple(env, t, &n, &levels))
            for (int k = n; k-- > 0;)
                list = enif_make_list_cell(env, levels[k], list);
    }
    return list;
}

/* A dlclose under way (an odd generation) has unmapped code it has not
 * logged yet: wait for it, 1 ms at a time on the dirty scheduler that asks,
 * at most SETTLE_WAITS ms in one answer, then go on (a dlclose can wait
 * long, for the loader's lock or in a destructor). */
#define SETTLE_WAITS 20
static __thread int waits_left;

void mt_nif_naming_begin(void) { waits_left = SETTLE_WAITS; }

uint64_t mt_nif_settled_generation(void) {
    uint64_t g = mt_api->objects_generation();
    for (; (g & 1) && waits_left > 0; waits_left--) {
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        g = mt_api->objects_generation();
    }
    return g;
}

/* Whether a frame was unloaded is asked before it is named: a library
 * unloaded and another loaded at its address in between would lend the
 * frame its name.  So a stack is named again when the loaded objects
 * changed meanwhile, and the frames named before a change are forgotten. */
ERL_NIF_TERM mt_nif_stack_term(ErlNifEnv *env, struct mt_term_memo *frames, uint32_t stack_id,
                               int demangle, int maps) {
    for (int tries = 1;; tries++) {
        uint64_t g = mt_nif_settled_generation();
        if (frames)
            mt_term_memo_retag(frames, g);
        ERL_NIF_TERM list = stack_term(env, frames, stack_id, demangle, maps);
        if (tries == MT_NAMING_TRIES || mt_api->objects_generation() == g)
            return list;
    }
}
