/*
 * The table's clock: CLOCK_MONOTONIC_COARSE in milliseconds, read once for
 * every recorded block.
 */
#ifndef MT_CLOCK_H
#define MT_CLOCK_H

#include <stdint.h>

/* Finds the kernel's own clock_gettime in its vDSO; until then, and where
 * there is none, the C library's is used.  Called as a traced process
 * configures. */
void mt_clock_init(void);

uint64_t mt_now_ms(void);

/* 1 when mt_now_ms reads the vDSO's function, 0 the C library's. */
int mt_clock_from_vdso(void);

#endif
