/* Per-call counters (see counters.h). */
#include "counters.h"

#include "spinlock.h"
#include "state.h"

#define SLOTS 1024

/* 128 KiB of zeroed memory, of which only the pages of structs in use are
 * touched. */
static struct mt_counts slots[SLOTS];
static unsigned char used[SLOTS];     /* under lock */
static uint64_t retired[MT_FN_COUNT]; /* under lock */
static _Atomic uint64_t shared[MT_FN_COUNT];
static mt_spinlock lock;

struct mt_counts *mt_counts_register(int *later) {
    struct mt_counts *c = NULL;
    *later = !mt_lock_unless(&lock, &mt_state.fork); /* a fork held it too long */
    if (*later)
        return NULL;
    for (int i = 0; i < SLOTS; i++)
        if (!used[i]) {
            used[i] = 1;
            c = &slots[i]; /* zeroed when it was given back */
            break;
        }
    mt_unlock(&lock);
    return c;
}

static void fold(struct mt_counts *c) { /* under lock */
    for (int f = 0; f < MT_FN_COUNT; f++) {
        retired[f] += atomic_load_explicit(&c->calls[f], memory_order_relaxed);
        atomic_store_explicit(&c->calls[f], 0, memory_order_relaxed);
    }
    used[c - slots] = 0;
}

/* retire and sum wait as register does: for an orphaned fork child
 * (fork.c), whose lock another thread may hold for ever, and beside a fork
 * found stuck, which holds it.  Giving up, retire keeps c in use (its counts
 * are still summed), and sum reads without the lock: whoever holds it then
 * (the stuck fork, or nobody left) writes nothing meanwhile, as register
 * and retire give up too. */
void mt_counts_retire(struct mt_counts *c) {
    if (!mt_lock_unless(&lock, &mt_state.fork))
        return;
    fold(c);
    mt_unlock(&lock);
}

void mt_counts_shared_add(enum mtrace_fn fn) {
    atomic_fetch_add_explicit(&shared[fn], 1, memory_order_relaxed);
}

void mt_counts_sum(uint64_t *out) {
    int locked = mt_lock_unless(&lock, &mt_state.fork);
    for (int f = 0; f < MT_FN_COUNT; f++)
        out[f] = retired[f] + atomic_load_explicit(&shared[f], memory_order_relaxed);
    for (int i = 0; i < SLOTS; i++)
        if (used[i])
            for (int f = 0; f < MT_FN_COUNT; f++)
                out[f] += atomic_load_explicit(&slots[i].calls[f], memory_order_relaxed);
    if (locked)
        mt_unlock(&lock);
}

void mt_counts_lock(void) { mt_lock(&lock); }
void mt_counts_unlock(void) { mt_unlock(&lock); }

/* In the child of fork, called with the lock held: the other threads are
 * gone, and their counts are folded one last time. */
void mt_counts_child(const struct mt_counts *mine) {
    for (int i = 0; i < SLOTS; i++)
        if (used[i] && &slots[i] != mine)
            fold(&slots[i]);
}
