/*
 * Turning return addresses of the current process into names.
 *
 * Names come from the ELF symbol tables of the mapped files on disk (so
 * `static` functions are found, unlike with dladdr), source file, line and
 * inlined frames from DWARF when the code is built with MT_HAVE_LIBDW and the
 * object carries debug info.  Process memory is never read: only files are,
 * so an address of an unloaded library is harmless.
 */
#ifndef MT_SYMBOLS_H
#define MT_SYMBOLS_H

#include <stddef.h>
#include <stdint.h>

#include "mtrace_api.h"

#define MT_SYM_TEXT 512

/* Most entries mt_symbols_resolve() produces for one address. */
#define MT_SYM_MAX_FRAMES 16

struct mt_frame_info {
    uintptr_t addr;           /* the address asked about (a return address) */
    char lib[MT_SYM_TEXT];    /* path of the mapped object containing it, "" if none */
    char symbol[MT_SYM_TEXT]; /* function name, "" if unknown (truncated with no crash if long) */
    char file[MT_SYM_TEXT];   /* source file from DWARF, "" if unknown */
    int line;                 /* source line from DWARF, 0 if unknown */
    int inlined;              /* 1 if this entry is an inlined frame inside the next entry */
    uintptr_t offset;         /* addr minus the object's load bias: the link-time address,
                               * for addr2line on another machine; 0 if no object */
};

/* Where the loaded objects are listed: the preload's contract (its objects
 * and objects_generation).  Until it is given, no address is in an object. */
void mt_symbols_use(const struct mtrace_api *api);

/* Resolve one return address.  Writes up to max entries: inlined frames first (innermost first),
 * then the real function that contains the address.  Returns the number written (>= 1 when
 * max >= 1; an address in no mapped object yields one entry with lib "" and symbol "").
 * When there are more inlined levels than max allows, the outermost inlined levels are left out
 * but the last entry written is always the real function.  demangle != 0 demangles C++ names
 * in-process.  Thread-safe; callable concurrently from several threads. */
int mt_symbols_resolve(uintptr_t ret_addr, int demangle, struct mt_frame_info *out, int max);

/* Whether any of n return addresses lies in a mapped object whose path contains needle.
 * Reads only the list of loaded objects (no symbol table, no DWARF): cheap enough to ask of
 * every interned stack. */
int mt_symbols_any_lib(const uintptr_t *ret_addrs, size_t n, const char *needle);

/* Drop all caches (also done automatically when libraries were loaded/unloaded since last call). */
void mt_symbols_flush(void);

/* Demangle a C++ name in-process into buf; returns 0 on success, -1 if not a mangled name (or no
 * demangler is available), in which case buf holds the name unchanged (truncated to len). */
int mt_demangle(const char *name, char *buf, size_t len);

/* Name of the function containing the link-time address vaddr in the ELF file at path, from its
 * symbol table only and without caching: for offline use and for tests of the ELF reader.
 * Returns 0 and fills buf, or -1 when the file is unreadable or has no such symbol. */
int mt_symbols_file_symbol(const char *path, uintptr_t vaddr, char *buf, size_t len);

#endif
