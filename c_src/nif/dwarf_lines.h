/*
 * Source lines and inlined frames from DWARF, for symbols.c.
 *
 * Built on elfutils libdw when MT_HAVE_LIBDW is defined (link with -ldw -lelf); otherwise every
 * function here finds nothing and only symbol names are available.
 */
#ifndef MT_DWARF_LINES_H
#define MT_DWARF_LINES_H

#include <stdint.h>

struct mt_dwarf;

struct mt_dw_frame {
    const char *name; /* linkage (mangled) name if there is one, else the plain name; or NULL */
    const char *file; /* NULL if unknown */
    int line;         /* 0 if unknown */
    int inlined;      /* 1 if inlined into the next frame */
};

/* The DWARF of the ELF file at path, else of /usr/lib/debug/.build-id/xx/yyyy.debug named by
 * the file's build id, if that file has the same build id (one of other code would give wrong
 * lines); NULL if neither has any.  dwz's shared file (.gnu_debugaltlink) is found likewise by
 * its build id, or at the path it names (relative: to the file's directory), if it has that build
 * id (with only another build's there, only lines are read).  Nothing else is searched, nothing
 * is fetched. */
struct mt_dwarf *mt_dwarf_open(const char *path);

/* For tests: the directory searched instead of /usr/lib/debug (not copied; NULL restores it). */
void mt_dwarf_set_debug_root(const char *dir);

void mt_dwarf_close(struct mt_dwarf *d);

/* Frames at the link-time address pc, innermost first; the last one is the function containing
 * pc (inlined 0) and is always written.  Writes at most max (>= 1) frames, leaving out the
 * outermost inlined levels if needed, and returns the count; 0 if the DWARF does not cover pc.
 * Strings live until mt_dwarf_close.  One mt_dwarf must not be used by two threads at once. */
int mt_dwarf_frames(struct mt_dwarf *d, uintptr_t pc, struct mt_dw_frame *out, int max);

#endif
