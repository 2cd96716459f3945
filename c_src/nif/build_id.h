/*
 * An object's GNU build id (its NT_GNU_BUILD_ID note), read from the notes
 * its program headers name: in the memory of a loaded object, or in a file.
 * Two files with the same build id hold the same code and symbols.
 */
#ifndef MT_BUILD_ID_H
#define MT_BUILD_ID_H

#include <stddef.h>
#include <stdint.h>

#define MT_BUILD_ID_MAX 64 /* bytes; linkers write 16 (md5, uuid) or 20 (sha1) */

/* The build id of a loaded object (its ElfW(Phdr)[phnum] and load bias)
 * into out (MT_BUILD_ID_MAX bytes); its length, 0 when it has none.  Reads
 * the object's memory: only while the object cannot be unloaded (in a
 * callback of the loader's list of objects, its lock held). */
size_t mt_build_id_mapped(const void *phdr, size_t phnum, uintptr_t base, unsigned char *out);

/* The same for the ELF file at path; 0 when it has none or cannot be read. */
size_t mt_build_id_file(const char *path, unsigned char *out);

#endif
