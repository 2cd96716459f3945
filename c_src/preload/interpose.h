/*
 * What the interposer shares with the query side of the same library:
 * counters, configuration and the switches readers may flip.
 */
#ifndef MT_INTERPOSE_H
#define MT_INTERPOSE_H

#include <stdint.h>

#include "mtrace_api.h"

/* Sums the per-thread call counters into out[MT_FN_COUNT]. */
void mt_sum_calls(uint64_t *out);

uint32_t mt_depth(void);
int mt_is_active(void);
int mt_is_enabled(void);
void mt_set_enabled(int on);
int mt_thread_ignore(int on);
uint64_t mt_now_ms(void);

uint64_t mt_sample_bytes(void);   /* MTRACE_SAMPLE_BYTES in effect, 0 = lossless */
uint32_t mt_config_garbage(void); /* MT_GARBAGE_* bits of config.h */

#endif
