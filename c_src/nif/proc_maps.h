/*
 * Which file each mapping of this process is, from /proc/self/maps: the
 * symbolizer tells a library's file by it, not by its path alone, since a
 * path can name another file than the one mapped (a package upgrade
 * replaced the library under a running node; a library rebuilt and loaded
 * again at the address of the old).
 */
#ifndef MT_PROC_MAPS_H
#define MT_PROC_MAPS_H

#include <stddef.h>
#include <stdint.h>

struct mt_map {
    uintptr_t lo, hi;  /* [lo, hi) */
    uint64_t ino;      /* the file's inode, with dev */
    unsigned long dev; /* major << 20 | minor, as maps shows them */
    int deleted;       /* the file was removed (or replaced) since it was mapped */
};

/* The file-backed mappings, sorted by address (as the kernel lists them),
 * into a malloc'ed array; 0 when /proc cannot be read or out of memory
 * (*out NULL, *n 0). */
int mt_maps_read(struct mt_map **out, size_t *n);

/* The mapping holding addr, or NULL. */
const struct mt_map *mt_maps_find(const struct mt_map *maps, size_t n, uintptr_t addr);

/* The path that opens the file mapped at m even if it was removed since
 * (/proc/self/map_files/LO-HI), into buf. */
void mt_maps_file(const struct mt_map *m, char *buf, size_t len);

#endif
