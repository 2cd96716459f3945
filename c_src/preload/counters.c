/* Per-call counters (see counters.h). */
#include "counters.h"

#include "spinlock.h"

#define SLOTS 1024

static struct mt_counts *slots[SLOTS]; /* under lock */
static uint64_t retired[MT_FN_COUNT];  /* under lock */
static _Atomic uint64_t shared[MT_FN_COUNT];
static mt_spinlock lock;

void mt_counts_register(struct mt_counts *c) {
    mt_lock(&lock);
    c->state = MT_COUNTS_SHARED;
    for (int i = 0; i < SLOTS; i++)
        if (!slots[i]) {
            slots[i] = c;
            c->state = MT_COUNTS_REGISTERED;
            break;
        }
    mt_unlock(&lock);
}

static void fold(struct mt_counts *c) { /* under lock */
    for (int f = 0; f < MT_FN_COUNT; f++)
        retired[f] += atomic_load_explicit(&c->calls[f], memory_order_relaxed);
}

void mt_counts_retire(struct mt_counts *c) {
    mt_lock(&lock);
    for (int i = 0; i < SLOTS; i++)
        if (slots[i] == c) {
            fold(c);
            slots[i] = 0;
            break;
        }
    c->state = MT_COUNTS_SHARED;
    mt_unlock(&lock);
}

void mt_counts_shared_add(enum mtrace_fn fn) {
    atomic_fetch_add_explicit(&shared[fn], 1, memory_order_relaxed);
}

void mt_counts_sum(uint64_t *out) {
    mt_lock(&lock); /* an exiting thread cannot free its counts meanwhile */
    for (int f = 0; f < MT_FN_COUNT; f++)
        out[f] = retired[f] + atomic_load_explicit(&shared[f], memory_order_relaxed);
    for (int i = 0; i < SLOTS; i++)
        if (slots[i])
            for (int f = 0; f < MT_FN_COUNT; f++)
                out[f] += atomic_load_explicit(&slots[i]->calls[f], memory_order_relaxed);
    mt_unlock(&lock);
}

void mt_counts_lock(void) { mt_lock(&lock); }
void mt_counts_unlock(void) { mt_unlock(&lock); }

/* In the child of fork, called with the lock held: the other threads are gone
 * (their memory is still mapped, so their counts can be read one last time). */
void mt_counts_child(struct mt_counts *mine) {
    for (int i = 0; i < SLOTS; i++)
        if (slots[i] && slots[i] != mine) {
            fold(slots[i]);
            slots[i] = 0;
        }
}
