/* The number of the process's mappings (lines of /proc/self/maps), -1
 * without /proc: what a thread that keeps its memory leaves growing. */
#ifndef MT_TEST_MAPPINGS_H
#define MT_TEST_MAPPINGS_H

#include <stdio.h>

static inline int count_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    int n = 0;
    for (int c; (c = getc(f)) != EOF;)
        n += c == '\n';
    fclose(f);
    return n;
}

#endif
