/* Call chains for tsan_tracker (built as a .so, outside the program, whose
 * own frames a capture skips): work(f, n, bits, depth) reaches f through
 * depth frames of two functions chosen by bits, so that the tracker interns
 * many distinct stacks. */
#include <stddef.h>

typedef void *(*work_alloc)(size_t);

void *work_b(work_alloc f, size_t n, unsigned bits, int depth);

__attribute__((noinline, visibility("default"))) void *work_a(work_alloc f, size_t n, unsigned bits,
                                                              int depth) {
    void *p = depth <= 0 ? f(n) : (bits & 1 ? work_b : work_a)(f, n, bits >> 1, depth - 1);
    __asm__ volatile("" ::: "memory"); /* no tail call */
    return p;
}

__attribute__((noinline, visibility("default"))) void *work_b(work_alloc f, size_t n, unsigned bits,
                                                              int depth) {
    void *p = depth <= 0 ? f(n) : (bits & 1 ? work_a : work_b)(f, n, bits >> 1, depth - 1);
    __asm__ volatile("" ::: "memory");
    return p;
}
