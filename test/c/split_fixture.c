/*
 * Shared object for test_dwarf_files, built with split DWARF
 * (-gsplit-dwarf): a function inlined into another, whose call out gives
 * an address inside the inlined code.
 */

/* The address it returns to, inside its caller. */
__attribute__((noinline)) void *split_sink(void) { return __builtin_return_address(0); }

static inline __attribute__((always_inline)) void *split_inner(void) {
    void *ra = split_sink();
    __asm__ volatile("" ::: "memory");
    return ra;
}

void *split_entry(void) {
    void *ra = split_inner();
    __asm__ volatile("" ::: "memory");
    return ra;
}
