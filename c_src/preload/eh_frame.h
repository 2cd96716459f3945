/*
 * Frame rules from .eh_frame, for the stack walker (unwind.c).
 *
 * A rule is what one instruction address needs to step to its caller on
 * x86-64: where the CFA is (RSP or RBP plus an offset), that the return
 * address sits at CFA - 8, and where RBP was saved, if it was.  Anything
 * else the call-frame instructions may say (signal frames, DWARF
 * expressions, realigned stacks) is reported as unsupported.
 */
#ifndef MT_EH_FRAME_H
#define MT_EH_FRAME_H

#include <stdint.h>

enum {
    MT_RULE_UNSUPPORTED, /* give up: let libunwind walk this stack */
    MT_RULE_FRAME,       /* an ordinary frame */
    MT_RULE_LAST,        /* the outermost frame (return address undefined) */
    MT_RULE_NO_INFO      /* no unwind information (JIT code): the stack ends here */
};

struct mt_frame_rule {
    int32_t cfa_off;
    int16_t bp_off; /* RBP saved at CFA + bp_off, when bp_saved (a multiple of 8) */
    uint8_t cfa_bp; /* CFA = RBP + cfa_off, else RSP + cfa_off */
    uint8_t bp_saved;
    uint8_t kind; /* MT_RULE_* */
};

/* The rule for the instruction at target (a return address minus one).
 * Allocates nothing.  *loads receives mt_objects_generation as it was when
 * the object was looked up: it changes with every load and unload, whoever
 * made it. */
void mt_eh_frame_rule(uintptr_t target, struct mt_frame_rule *out, uint64_t *loads);

#endif
