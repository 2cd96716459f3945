/*
 * Shared object for test_symbols_files, built twice: NAMES_VERSION 1 and 2
 * name their one function apart, at the same offset.  Version 1 also has a
 * function whose name, 2 + 600 bytes of UTF-8, is longer than a frame's
 * text field.
 */
#ifndef NAMES_VERSION
#define NAMES_VERSION 1
#endif

#define NAME_(v) names_version_##v
#define NAME(v) NAME_(v)

/* The address of the function, read by the test (the same symbol in both). */
__attribute__((noinline)) void *NAME(NAMES_VERSION)(void) { return __builtin_return_address(0); }

void *names_entry(void) {
    void *ra = NAME(NAMES_VERSION)();
    __asm__ volatile("" ::: "memory");
    return ra;
}

#if NAMES_VERSION == 1
/* 300 times U+00E9 (two bytes each): a cut at 511 bytes falls inside one. */
#define E10 éééééééééé
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define E50 CAT(CAT(CAT(CAT(E10, E10), E10), E10), E10)
#define E300 CAT(CAT(CAT(CAT(CAT(E50, E50), E50), E50), E50), E50)
__attribute__((noinline)) void *CAT(xx, E300)(void) { return __builtin_return_address(0); }
void *names_long(void) {
    void *ra = CAT(xx, E300)();
    __asm__ volatile("" ::: "memory");
    return ra;
}
#endif
