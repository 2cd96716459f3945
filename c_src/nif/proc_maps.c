/* Which file each mapping of this process is (see proc_maps.h). */
#define _GNU_SOURCE
#include "proc_maps.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* /proc/self/maps whole, NUL-terminated, in a malloc'ed buffer; NULL on failure. */
static char *read_all(void) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 64 * 1024, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 == cap) {
            char *more = realloc(buf, cap * 2);
            if (!more) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = more;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + len, cap - 1 - len);
        if (got < 0) {
            free(buf);
            buf = NULL;
        } else if (got == 0) {
            buf[len] = '\0';
            break;
        } else {
            len += (size_t)got;
        }
    }
    close(fd);
    return buf;
}

int mt_maps_read(struct mt_map **out, size_t *n) {
    *out = NULL;
    *n = 0;
    char *text = read_all();
    if (!text)
        return 0;
    size_t cap = 0, count = 0;
    struct mt_map *maps = NULL;
    for (char *line = text, *end; *line; line = end) {
        end = strchr(line, '\n');
        end = end ? (*end = '\0', end + 1) : line + strlen(line);
        unsigned long lo, hi, offset, ino;
        unsigned major, minor;
        if (sscanf(line, "%lx-%lx %*s %lx %x:%x %lu", &lo, &hi, &offset, &major, &minor, &ino) !=
                6 ||
            ino == 0)
            continue;
        if (count == cap) {
            size_t ncap = cap ? cap * 2 : 256;
            struct mt_map *more = realloc(maps, ncap * sizeof *maps);
            if (!more) {
                free(maps);
                free(text);
                return 0;
            }
            maps = more;
            cap = ncap;
        }
        size_t len = strlen(line), tail = sizeof " (deleted)" - 1;
        maps[count++] = (struct mt_map){
            .lo = lo,
            .hi = hi,
            .ino = ino,
            .dev = (unsigned long)major << 20 | minor,
            .deleted = len > tail && !strcmp(line + len - tail, " (deleted)"),
        };
    }
    free(text);
    *out = maps;
    *n = count;
    return 1;
}

const struct mt_map *mt_maps_find(const struct mt_map *maps, size_t n, uintptr_t addr) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (maps[mid].lo <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && addr < maps[lo - 1].hi ? &maps[lo - 1] : NULL;
}

void mt_maps_file(const struct mt_map *m, char *buf, size_t len) {
    snprintf(buf, len, "/proc/self/map_files/%lx-%lx", (unsigned long)m->lo, (unsigned long)m->hi);
}
