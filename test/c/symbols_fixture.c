/*
 * Shared object loaded and unloaded by test_symbols: a static function inside a library, and an
 * address that must stop resolving once the library is gone.
 *
 *   cc -shared -fPIC -g -O2 -o libsymbols_fixture.so symbols_fixture.c
 */

/* noipa: a real call, so the return address lies inside the caller. */
static __attribute__((noipa)) void *fx_capture(void) { return __builtin_return_address(0); }

static __attribute__((noinline, noclone)) void *fx_hidden(int *line) {
    *line = __LINE__ + 1;
    void *ra = fx_capture();
    __asm__ volatile("" ::: "memory"); /* keeps the call above from becoming a tail call */
    return ra;
}

/* Returns a return address inside fx_hidden and the source line of that call. */
void *mt_fixture_entry(int *line) {
    void *ra = fx_hidden(line);
    __asm__ volatile("" ::: "memory");
    return ra;
}

/* For test_unwind: calls back from a frame inside this library. */
__attribute__((noinline)) void fixture_call_back(void (*fn)(void)) {
    fn();
    __asm__ volatile("" ::: "memory");
}
