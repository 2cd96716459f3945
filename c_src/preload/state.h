/*
 * The preload's one state: its configuration and the switches derived from
 * it, read by every part (tracker, table, stacks, walker, queries).  Written
 * when the process is configured and by set_enabled; read everywhere else.
 */
#ifndef MT_STATE_H
#define MT_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "clock.h" /* mt_now_ms, the table's clock */
#include "config.h"
#include "spinlock.h" /* struct mt_fork_watch */

/* How far this process got in setting itself up. */
enum mt_mode {
    MT_MODE_UNCONFIGURED, /* no call has been made yet */
    MT_MODE_CONFIGURING,  /* the first call is reading the configuration */
    MT_MODE_INERT,        /* this program is not traced (MTRACE_PROGRAMS) */
    MT_MODE_ACTIVE,       /* traced; tracking may still be switched off */
    MT_MODE_ORPHANED      /* a fork child whose fork interrupted the tracker (tracker.c) */
};

/* The one word every hook reads first, derived from mode, enabled, the
 * sampling mean and, while switched off, whether the table is empty
 * (update_gate and gate_off in tracker.c). */
enum mt_gate {
    MT_GATE_INERT,  /* straight to libc, frees included: the table holds no block */
    MT_GATE_LIBC,   /* straight to libc, but frees ask the table's filter (switched off) */
    MT_GATE_SETUP,  /* the first call must configure the process */
    MT_GATE_TRACK,  /* calls counted, every block recorded */
    MT_GATE_SAMPLE, /* calls counted, MTRACE_SAMPLE_BYTES chooses the blocks */
};

struct mt_state {
    _Atomic int gate;          /* enum mt_gate */
    _Atomic int mode;          /* enum mt_mode */
    _Atomic int enabled;       /* tracking on (set_enabled, MTRACE_ENABLED) */
    int provisional;           /* configured before libc had set up the environment */
    uint64_t sample_mean;      /* MTRACE_SAMPLE_BYTES in effect; 0 = lossless */
    int fast_unwind;           /* 1 = own walker first, 0 = libunwind only */
    struct mt_config cfg;      /* as read from the environment */
    _Atomic uint64_t reset_ms; /* the table's clock at the last reset; 0 = none */
    struct mt_fork_watch fork; /* forks holding the tracker's locks, and done: waits
                                * on those locks give up once a fork stands still
                                * (spinlock.h's mt_lock_unless) */
};

extern struct mt_state mt_state;

/* Reads the environment into mt_state: cfg, enabled, sampling and walker
 * (the tracker sets mode once the parts it needs are ready). */
void mt_state_configure(void);

/* Whether tracking is on in a traced process. */
static inline int mt_state_tracking_on(void) {
    return atomic_load(&mt_state.mode) == MT_MODE_ACTIVE && atomic_load(&mt_state.enabled);
}

#endif
