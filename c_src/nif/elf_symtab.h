/*
 * The function symbols of an ELF file on disk, sorted by address, for the
 * symbolizer (symbols.c): .symtab when the file has one (static functions
 * included), else .dynsym.
 */
#ifndef MT_ELF_SYMTAB_H
#define MT_ELF_SYMTAB_H

#include <stddef.h>
#include <stdint.h>

struct sym {
    uintptr_t value, size;
    const char *name;
    unsigned rank; /* among aliases at one address, the lowest rank is kept */
};

struct symtab {
    struct sym *syms;
    size_t n;
    char *names;
};

/* Reads path's function symbols into st; 0 on success, -1 when the file is
 * unreadable or holds none (st is then empty). */
int mt_symtab_read_file(const char *path, struct symtab *st);

/* The symbol containing the link-time address pc, or NULL. */
const struct sym *mt_symtab_find(const struct symtab *st, uintptr_t pc);

void mt_symtab_free(struct symtab *st);

#endif
