/*
 * The unwind rule of each return address the walker (unwind.c) steps
 * through, computed from .eh_frame once (eh_frame.c) and then cached, so a
 * warm step is one hash probe.
 */
#ifndef MT_UNWIND_RULES_H
#define MT_UNWIND_RULES_H

#include <stdatomic.h>
#include <stdint.h>

#include "eh_frame.h"

/* Bumped when code may have been unloaded: rules and walks of an older
 * generation are not used again. */
extern _Atomic uint64_t mt_rules_generation;

/* The rule for return address ra (kind MT_RULE_UNSUPPORTED when the
 * walker cannot apply it). */
void mt_rule_for(uintptr_t ra, struct mt_frame_rule *r);

#endif
