/*
 * The table's memory (see table_mem.h): chunks mapped one after another,
 * blocks bump-allocated from them, given-back blocks on free lists by size.
 *
 * Chunks are mapped with MAP_POPULATE: the table writes all over them soon
 * anyway (a node's boot touched 195 pages of the first one), and one
 * populating call costs about a twentieth of faulting the same pages in one
 * by one.  The first is 1 MiB; each later one as large as the table so far,
 * up to 4 MiB, so that populating one never stalls the malloc that asked
 * for it by more than about a millisecond.
 */
#define _GNU_SOURCE
#include "table_mem.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

#include "spinlock.h"
#include "state.h"
#include "table.h"

#define FIRST_CHUNK ((size_t)1 << 20)
#define MAX_CHUNK ((size_t)1 << 22)
#define MIN_SHIFT 6 /* 64-byte blocks: a cache line */
#define HEADER 64   /* a chunk starts with its link, then its blocks */

struct chunk {
    struct chunk *next;
    size_t bytes;
};

void *(*mt_table_map_hook)(size_t bytes);

static mt_spinlock lock;     /* shards take and give blocks at once */
static struct chunk *chunks; /* newest first */
static char *next_free, *chunk_end;
static void *free_lists[MT_MEM_MAX_SHIFT + 1]; /* a given-back block's first word links */
static _Atomic uint64_t mapped;
static char *unforked; /* from here to chunk_end: left out of a fork child */

static unsigned shift_of(size_t bytes) {
    unsigned s = MIN_SHIFT;
    while (((size_t)1 << s) < bytes)
        s++;
    return s;
}

static struct chunk *map_chunk(size_t bytes) {
    void *p;
    if (mt_table_map_hook)
        p = mt_table_map_hook(bytes);
    else
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
    if (p == MAP_FAILED || !p)
        return NULL;
    atomic_fetch_add_explicit(&mapped, bytes, memory_order_relaxed);
    struct chunk *c = p;
    c->next = chunks;
    c->bytes = bytes;
    chunks = c;
    return c;
}

static void *take(size_t bytes) {
    unsigned s = shift_of(bytes);
    if (s > MT_MEM_MAX_SHIFT)
        return NULL;
    bytes = (size_t)1 << s;
    void *p = free_lists[s];
    if (p) {
        memcpy(&free_lists[s], p, sizeof p);
        memset(p, 0, bytes);
        return p;
    }
    /* Blocks are aligned to their size up to a cache line. */
    size_t align = bytes < 64 ? bytes : 64;
    char *at =
        next_free ? (char *)(((uintptr_t)next_free + align - 1) & ~(uintptr_t)(align - 1)) : NULL;
    if (!at || (size_t)(chunk_end - at) < bytes) {
        /* Each chunk as large as the table so far, within the bounds; the
         * rest of the old one is left unused (at most one block's worth). */
        size_t want = atomic_load_explicit(&mapped, memory_order_relaxed);
        if (want < FIRST_CHUNK)
            want = FIRST_CHUNK;
        if (want > MAX_CHUNK)
            want = MAX_CHUNK;
        while (want < HEADER + bytes) /* a block as large as a chunk needs the next size */
            want *= 2;
        struct chunk *c = map_chunk(want);
        if (!c)
            return NULL;
        at = (char *)c + HEADER;
        chunk_end = (char *)c + c->bytes;
    }
    next_free = at + bytes;
    return at; /* fresh mapped memory is zero */
}

/* These two wait as the shard locks do (spinlock.h): a fork child
 * orphaned by a signal handler's fork (fork.c) finds this lock held for
 * ever by a thread that did not come along, and the work the handler
 * interrupted, finishing there, must get on without it. */
void *mt_mem_take(size_t bytes) {
    if (!mt_lock_unless(&lock, &mt_state.fork))
        return NULL; /* as if nothing could be mapped: the entry is dropped */
    void *p = take(bytes);
    mt_unlock(&lock);
    return p;
}

void mt_mem_give(void *p, size_t bytes) {
    if (!p)
        return;
    unsigned s = shift_of(bytes);
    if (!mt_lock_unless(&lock, &mt_state.fork))
        return; /* not reused, that is all */
    memcpy(p, &free_lists[s], sizeof p);
    free_lists[s] = p;
    mt_unlock(&lock);
}

void mt_mem_release_all(void) {
    mt_lock(&lock);
    while (chunks) {
        struct chunk *c = chunks;
        chunks = c->next;
        size_t bytes = c->bytes;
        munmap(c, bytes);
        atomic_fetch_sub_explicit(&mapped, bytes, memory_order_relaxed);
    }
    next_free = chunk_end = NULL;
    memset(free_lists, 0, sizeof free_lists);
    mt_unlock(&lock);
}

/* A fork child gets the table's memory as it is, except the untouched tail
 * of the current chunk.  Populated before the fork, each page of that tail
 * would be shared copy on write, and the parent's first write to it would
 * fault once more (~12 us a page on a virtual machine; the VM forks its
 * child-setup program early in its boot, when most of the first chunk is
 * still unused).  The child maps a chunk of its own when it needs one. */
#define FORK_ALIGN ((uintptr_t)1 << 16) /* a page boundary for any page size */

void mt_mem_fork_prepare(void) {
    mt_lock(&lock);
    unforked = NULL;
    if (!next_free || mt_table_map_hook)
        return;
    char *from = (char *)(((uintptr_t)next_free + FORK_ALIGN - 1) & ~(FORK_ALIGN - 1));
    if (from < chunk_end && madvise(from, (size_t)(chunk_end - from), MADV_DONTFORK) == 0)
        unforked = from;
}

void mt_mem_fork_parent(void) {
    if (unforked)
        madvise(unforked, (size_t)(chunk_end - unforked), MADV_DOFORK);
    mt_unlock(&lock);
}

void mt_mem_fork_child(void) {
    if (unforked) { /* not mapped here: the chunk ends where it does */
        size_t gone = (size_t)(chunk_end - unforked);
        chunks->bytes -= gone;
        atomic_fetch_sub_explicit(&mapped, gone, memory_order_relaxed);
        chunk_end = unforked;
    }
    mt_unlock(&lock);
}

uint64_t mt_mem_mapped(void) { return atomic_load_explicit(&mapped, memory_order_relaxed); }
