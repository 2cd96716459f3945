/*
 * Shared object for test_dwarf_files' dwz case: two copies of it share
 * their DWARF (the struct's type, the strings), which dwz moves to a file
 * of its own.  Built again with DWZ_OTHER, whose shared file differs.
 */
struct dwz_node {
    struct dwz_node *next;
    const char *label;
    long weight;
#ifdef DWZ_OTHER
    long other;
#endif
};

/* The address of the function, read by the test. */
__attribute__((noinline)) void *dwz_fixture_leaf(struct dwz_node *n) {
    __asm__ volatile("" : : "r"(n) : "memory");
    return __builtin_return_address(0);
}

void *dwz_fixture_entry(void) {
    struct dwz_node n = {.label = "node", .weight = 1};
    void *ra = dwz_fixture_leaf(&n);
    __asm__ volatile("" ::: "memory");
    return ra;
}
