/* The preload's one state (see state.h). */
#include "state.h"

struct mt_state mt_state = {
    .gate = MT_GATE_SETUP,
    .mode = MT_MODE_UNCONFIGURED,
    .fast_unwind = 1,
    .cfg = {.erlang = 1}, /* the defaults a reader may ask about before any call */
};

void mt_state_configure(void) {
    struct mt_config c;
    mt_config_load(&c);
    mt_state.cfg = c;
    mt_state.sample_mean = c.active ? c.sample_bytes : 0;
#ifdef MT_NO_LIBUNWIND
    mt_state.fast_unwind = 1; /* the walker is all there is (MTRACE_UNWIND=libunwind ignored) */
#else
    mt_state.fast_unwind = c.fast_unwind;
#endif
    atomic_store(&mt_state.enabled, c.enabled);
}
