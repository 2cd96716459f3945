/*
 * Shared object that test_interpose_dlopen loads and unloads while the
 * preload traces.  Built twice, with frames of different sizes (FIXTURE_FRAME)
 * but the same code layout, so that one is mapped where the other was: an
 * unwind rule kept from the first would misread the second's frames.
 *
 *   cc -shared -fPIC -O2 -DFIXTURE_FRAME=200 -o dl_fixture_a.so dl_fixture.c
 */
#include <stddef.h>
#include <stdlib.h>

#ifndef FIXTURE_FRAME
#define FIXTURE_FRAME 200
#endif
#define FIXTURE_CTOR_SIZE 7321

static void *ctor_block;

/* Allocates while dlopen runs constructors, frees while dlclose runs destructors. */
__attribute__((constructor)) static void fixture_init(void) {
    ctor_block = malloc(FIXTURE_CTOR_SIZE);
}
static void (*on_fini)(void);
__attribute__((destructor)) static void fixture_fini(void) {
    free(ctor_block);
    if (on_fini)
        on_fini();
}

/* fn is called by the destructor, inside the dlclose that unloads this. */
void fixture_set_fini(void (*fn)(void)) { on_fini = fn; }

/* Calls back into the program from a frame of FIXTURE_FRAME bytes, zeroed: a
 * walk that used the wrong frame size would read a zero return address here. */
__attribute__((noinline)) void *fixture_call(void *(*cb)(size_t), size_t n) {
    volatile char frame[FIXTURE_FRAME];
    for (size_t i = 0; i < FIXTURE_FRAME; i++)
        frame[i] = 0;
    void *p = cb(n);
    __asm__ volatile("" : : "r"(frame) : "memory"); /* keeps the frame, and the call a call */
    return p;
}

/* malloc called from this library itself. */
__attribute__((noinline)) void *fixture_malloc(size_t n) {
    volatile char frame[FIXTURE_FRAME];
    for (size_t i = 0; i < FIXTURE_FRAME; i++)
        frame[i] = 0;
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(frame) : "memory"); /* keeps the frame, and the call a call */
    return p;
}
