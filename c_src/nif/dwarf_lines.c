/*
 * DWARF lookups for symbols.c: source file and line, and the chain of inlined calls at an
 * address.  Uses libdw only (not libdwfl), which never contacts debuginfod.
 */
#define _GNU_SOURCE
#include "dwarf_lines.h"

#ifdef MT_HAVE_LIBDW

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <libelf.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct mt_dwarf {
    Elf *elf;
    Dwarf *dw;
    Elf *alt_elf; /* dwz's shared DWARF, when found here (attach_alt) */
    Dwarf *alt;
    int lines_only; /* the shared DWARF libdw found is another build's */
};

static pthread_once_t elf_once = PTHREAD_ONCE_INIT;

static void elf_init(void) { elf_version(EV_CURRENT); }

static Elf *elf_open(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    /* The whole file is mapped read-only; after FDDONE libelf never needs the descriptor. */
    Elf *elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
    if (elf)
        elf_cntl(elf, ELF_C_FDDONE);
    close(fd);
    return elf;
}

static const char *debug_root = "/usr/lib/debug";

void mt_dwarf_set_debug_root(const char *dir) { debug_root = dir ? dir : "/usr/lib/debug"; }

/* The ELF file named by a build id under the debug root (its path in dbg,
 * PATH_MAX bytes), whatever build id it has. */
static Elf *open_by_build_id(const void *id, ssize_t n, char *dbg) {
    if (n < 2 || n > 64)
        return NULL;
    const unsigned char *b = id;
    int p = snprintf(dbg, PATH_MAX, "%s/.build-id/%02x/", debug_root, b[0]);
    for (ssize_t i = 1; i < n && p > 0 && p < PATH_MAX; i++)
        p += snprintf(dbg + p, PATH_MAX - (size_t)p, "%02x", b[i]);
    if (p <= 0 || (size_t)p >= PATH_MAX - sizeof ".debug")
        return NULL;
    snprintf(dbg + p, PATH_MAX - (size_t)p, ".debug");
    return elf_open(dbg);
}

static int has_build_id(Elf *elf, const void *id, ssize_t n) {
    const void *its;
    return elf && dwelf_elf_gnu_build_id(elf, &its) == n && memcmp(its, id, (size_t)n) == 0;
}

/* The directory of the file at path, links followed (out: PATH_MAX bytes);
 * 0 if unknown.  A deleted file, read through /proc/self/map_files, links
 * to "/its/path (deleted)": its directory may still be there. */
static int file_dir(const char *path, char *out) {
    char *real = realpath(path, NULL);
    if (real) {
        snprintf(out, PATH_MAX, "%s", real);
        free(real);
    } else {
        ssize_t n = readlink(path, out, PATH_MAX - 1);
        if (n <= 0)
            return 0;
        out[n] = 0;
    }
    char *slash = strrchr(out, '/');
    if (out[0] != '/' || !slash)
        return 0;
    *slash = 0;
    return 1;
}

/* dwz's shared file, by the build id it is named with under the debug
 * root, else at the path the link names (relative: to the directory of the
 * file at path), if it has that build id (out: PATH_MAX bytes). */
static Elf *open_alt(const char *name, const void *id, ssize_t n, const char *path, char *out) {
    Elf *alt = open_by_build_id(id, n, out);
    if (has_build_id(alt, id, n))
        return alt;
    elf_end(alt);
    char dir[PATH_MAX];
    int len = name[0] == '/'        ? snprintf(out, PATH_MAX, "%s", name)
              : file_dir(path, dir) ? snprintf(out, PATH_MAX, "%s/%s", dir, name)
                                    : -1;
    alt = len > 0 && len < PATH_MAX ? elf_open(out) : NULL;
    if (has_build_id(alt, id, n))
        return alt;
    elf_end(alt);
    return NULL;
}

/* dwz moves what several files share (strings, types, inlined functions)
 * to one file that .gnu_debugaltlink names with its build id.  libdw looks
 * for it itself under /usr/lib/debug/.build-id and at an absolute path
 * (Debian's /usr/lib/debug/.dwz/...), without checking its build id; a
 * relative path (dwz -r), relative to the debug file's directory, it
 * cannot follow here (it reads the directory from a descriptor elf_open has
 * closed).  So the file libdw found is kept only if it has the build id,
 * else one that has is looked for here; with none, what the DWARF reaches
 * through another build's file would be wrong, and only lines are read. */
static void attach_alt(struct mt_dwarf *d, const char *path) {
    const char *name;
    const void *id;
    ssize_t n = dwelf_dwarf_gnu_debugaltlink(d->dw, &name, &id);
    if (n <= 0)
        return;
    Dwarf *found = dwarf_getalt(d->dw);
    if (found && has_build_id(dwarf_getelf(found), id, n))
        return;
    char file[PATH_MAX];
    Elf *alt = open_alt(name, id, n, path, file);
    Dwarf *dw = alt ? dwarf_begin_elf(alt, DWARF_C_READ, NULL) : NULL;
    if (dw) {
        dwarf_setalt(d->dw, dw); /* ends libdw's own, if it found one */
        d->alt_elf = alt, d->alt = dw;
    } else {
        elf_end(alt);
        d->lines_only = found != NULL;
    }
}

static struct mt_dwarf *dwarf_of(Elf *elf, const char *path) {
    Dwarf *dw = elf ? dwarf_begin_elf(elf, DWARF_C_READ, NULL) : NULL;
    struct mt_dwarf *d = dw ? malloc(sizeof *d) : NULL;
    if (!d) {
        dwarf_end(dw);
        return NULL;
    }
    *d = (struct mt_dwarf){elf, dw, NULL, NULL, 0};
    attach_alt(d, path);
    return d;
}

/* The separate debug file named by the build id of elf, if it has that build id. */
static struct mt_dwarf *by_build_id(Elf *elf) {
    const void *id;
    char dbg[PATH_MAX];
    ssize_t n = dwelf_elf_gnu_build_id(elf, &id);
    Elf *sep = open_by_build_id(id, n, dbg);
    struct mt_dwarf *d = NULL;
    if (has_build_id(sep, id, n))
        d = dwarf_of(sep, dbg);
    if (!d)
        elf_end(sep);
    return d;
}

struct mt_dwarf *mt_dwarf_open(const char *path) {
    pthread_once(&elf_once, elf_init);
    Elf *elf = elf_open(path);
    struct mt_dwarf *d = dwarf_of(elf, path);
    if (d || !elf)
        return d;
    /* Distributions ship the DWARF of stripped files separately, named by build id. */
    d = by_build_id(elf);
    elf_end(elf);
    return d;
}

void mt_dwarf_close(struct mt_dwarf *d) {
    if (!d)
        return;
    dwarf_end(d->dw); /* first: it refers to the alt */
    dwarf_end(d->alt);
    elf_end(d->alt_elf);
    elf_end(d->elf);
    free(d);
}

static const char *die_name(Dwarf_Die *die) {
    /* The linkage name demangles to the qualified C++ name; _integrate follows the abstract
     * origin of inlined and out-of-line instances to where the names are. */
    static const unsigned attrs[] = {DW_AT_linkage_name, DW_AT_MIPS_linkage_name, DW_AT_name};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        Dwarf_Attribute a;
        const char *s = dwarf_formstring(dwarf_attr_integrate(die, attrs[i], &a));
        if (s)
            return s;
    }
    return NULL;
}

int mt_dwarf_frames(struct mt_dwarf *d, uintptr_t pc, struct mt_dw_frame *out, int max) {
    Dwarf_Die cu, *scopes = NULL, *chain = NULL, *sub = NULL;
    if (!d || max < 1 || !dwarf_addrdie(d->dw, pc, &cu))
        return 0;
    const char *file = NULL;
    int line = 0, n = 0, nchain = 0;
    Dwarf_Line *ln = dwarf_getsrc_die(&cu, pc);
    if (ln) {
        file = dwarf_linesrc(ln, NULL, NULL);
        dwarf_lineno(ln, &line);
    }
    /* dwarf_getscopes continues from an inlined instance into its abstract origin, not into
     * the function it was inlined into: keep only the innermost scope from it and walk the
     * concrete parents with dwarf_getscopes_die. */
    /* Split DWARF (-gsplit-dwarf): the functions and their inlined calls are in the split
     * unit (the .dwo), the skeleton in the file holds the lines only. */
    if (d->lines_only) {
        out[0] = (struct mt_dw_frame){NULL, file, line, 0};
        return 1;
    }
    Dwarf_Die scope_cu = cu, split;
    uint8_t unit_type;
    if (dwarf_cu_info(cu.cu, NULL, &unit_type, NULL, &split, NULL, NULL, NULL) == 0 &&
        unit_type == DW_UT_skeleton && dwarf_tag(&split) == DW_TAG_compile_unit)
        scope_cu = split;
    if (dwarf_getscopes(&scope_cu, pc, &scopes) > 0)
        nchain = dwarf_getscopes_die(&scopes[0], &chain);
    free(scopes);
    Dwarf_Files *files = NULL;
    if (dwarf_getsrcfiles(&cu, &files, NULL) != 0)
        files = NULL;
    for (int i = 0; i < nchain && !sub; i++) {
        int tag = dwarf_tag(&chain[i]);
        if (tag == DW_TAG_subprogram) {
            sub = &chain[i];
        } else if (tag == DW_TAG_inlined_subroutine) {
            if (n < max - 1)
                out[n++] = (struct mt_dw_frame){die_name(&chain[i]), file, line, 1};
            /* The next frame out is positioned at this instance's call site. */
            Dwarf_Attribute a;
            Dwarf_Word w;
            file = NULL;
            line = 0;
            if (files && dwarf_formudata(dwarf_attr(&chain[i], DW_AT_call_file, &a), &w) == 0)
                file = dwarf_filesrc(files, w, NULL, NULL);
            if (dwarf_formudata(dwarf_attr(&chain[i], DW_AT_call_line, &a), &w) == 0)
                line = w <= INT_MAX ? (int)w : 0;
        }
    }
    out[n++] = (struct mt_dw_frame){sub ? die_name(sub) : NULL, file, line, 0};
    free(chain);
    return n;
}

#else /* !MT_HAVE_LIBDW */

#include <stddef.h>

struct mt_dwarf *mt_dwarf_open(const char *path) {
    (void)path;
    return NULL;
}

void mt_dwarf_close(struct mt_dwarf *d) { (void)d; }

void mt_dwarf_set_debug_root(const char *dir) { (void)dir; }

int mt_dwarf_frames(struct mt_dwarf *d, uintptr_t pc, struct mt_dw_frame *out, int max) {
    (void)d, (void)pc, (void)out, (void)max;
    return 0;
}

#endif
