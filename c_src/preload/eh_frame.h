/*
 * Frame rules from .eh_frame, for the stack walker (unwind.c).
 *
 * A rule is what one instruction address needs to step to its caller: where
 * the CFA is (the stack pointer or the frame pointer plus an offset), where
 * the return address was saved (CFA - 8 on x86-64; on aarch64 wherever the
 * function stored x30), and where the frame pointer (RBP, x29) was saved, if
 * it was.  Anything else the call-frame instructions may say (signal frames,
 * DWARF expressions, realigned stacks) is reported as unsupported.
 */
#ifndef MT_EH_FRAME_H
#define MT_EH_FRAME_H

#include <stdint.h>

enum {
    MT_RULE_UNSUPPORTED, /* give up: let libunwind walk this stack */
    MT_RULE_FRAME,       /* an ordinary frame */
    MT_RULE_LAST,        /* the outermost frame (return address undefined) */
    MT_RULE_NO_INFO,     /* no unwind information (JIT code): the stack ends here */
    MT_RULE_SIGNAL       /* a signal frame: as UNSUPPORTED for the walker, which
                          * the rule cache keeps it as (unwind_rules.c) */
};

struct mt_frame_rule {
    int32_t cfa_off; /* > 0 */
    int32_t ra_off;  /* the return address saved at CFA + ra_off (< 0, a multiple of 8) */
    int32_t bp_off;  /* the frame pointer saved at CFA + bp_off, when bp_saved (likewise) */
    uint8_t cfa_bp;  /* CFA = frame pointer + cfa_off, else stack pointer + cfa_off */
    uint8_t bp_saved;
    uint8_t kind; /* MT_RULE_* */
};

/* The rule for the instruction at target (a return address minus one).
 * Allocates nothing.  *loads receives mt_objects_generation as it was when
 * the object was looked up: it changes with every load and unload, whoever
 * made it; 0 when nothing could be looked up (a fork under way) or the
 * count could not be read (in a fork child: objects.h). */
void mt_eh_frame_rule(uintptr_t target, struct mt_frame_rule *out, uint64_t *loads);

#endif
