/*
 * Function symbols of an ELF file on disk (see elf_symtab.h): .symtab, else
 * .dynsym, read from the file (never from process memory), sorted by address.
 */
#define _GNU_SOURCE
#include "elf_symtab.h"

#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "symbols.h"

#if UINTPTR_MAX > 0xffffffffu
#define MT_ELFCLASS ELFCLASS64
#else
#define MT_ELFCLASS ELFCLASS32
#endif

typedef ElfW(Ehdr) Ehdr;
typedef ElfW(Shdr) Shdr;
typedef ElfW(Sym) Sym;

#define NEAR_SCAN 8 /* preceding symbols tried when the nearest one does not contain pc */

/* Section header i; the caller has checked that the table lies within the file. */
static Shdr shdr_at(const unsigned char *img, const Ehdr *eh, size_t i) {
    Shdr sh;
    memcpy(&sh, img + eh->e_shoff + i * sizeof sh, sizeof sh);
    return sh;
}

static int in_file(size_t size, uint64_t off, uint64_t len) {
    return off <= size && len <= size - off;
}

static int sym_cmp(const void *pa, const void *pb) {
    const struct sym *a = pa, *b = pb;
    if (a->value != b->value)
        return a->value < b->value ? -1 : 1;
    if (a->rank != b->rank)
        return a->rank < b->rank ? -1 : 1;
    size_t la = strlen(a->name), lb = strlen(b->name);
    return la != lb ? (la < lb ? -1 : 1) : strcmp(a->name, b->name);
}

/* Prefer, among aliases: a size over none, global over weak over local, fewer leading '_'
 * ("malloc" over "__libc_malloc"), then the shorter name ("free" over "cfree"). */
static unsigned sym_rank(const Sym *s, const char *name) {
    unsigned bind = ELF64_ST_BIND(s->st_info) /* same in both classes */;
    unsigned r = s->st_size ? 0 : 1u << 16;
    r += (bind == STB_GLOBAL ? 0u : bind == STB_WEAK ? 1u : 2u) << 8;
    size_t under = strspn(name, "_");
    return r + (unsigned)(under < 255 ? under : 255);
}

static int load_section(const unsigned char *img, size_t size, const Ehdr *eh, const Shdr *sh,
                        struct symtab *st) {
    if (sh->sh_entsize != sizeof(Sym) || !in_file(size, sh->sh_offset, sh->sh_size) ||
        sh->sh_link == 0 || sh->sh_link >= eh->e_shnum)
        return -1;
    Shdr str = shdr_at(img, eh, sh->sh_link);
    if (str.sh_type != SHT_STRTAB || !in_file(size, str.sh_offset, str.sh_size))
        return -1;
    const char *strs = (const char *)img + str.sh_offset;
    size_t nsym = sh->sh_size / sizeof(Sym), count = 0, bytes = 0, used = 0;

    /* Pass 0 sizes the arrays, pass 1 fills them. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nsym; i++) {
            Sym s;
            memcpy(&s, img + sh->sh_offset + i * sizeof s, sizeof s);
            unsigned type = ELF64_ST_TYPE(s.st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s.st_shndx == SHN_UNDEF ||
                s.st_value == 0 || s.st_name == 0 || s.st_name >= str.sh_size)
                continue;
            const char *name = strs + s.st_name;
            const char *end = memchr(name, '\0', str.sh_size - s.st_name);
            if (!end || end == name)
                continue;
            size_t len = (size_t)(end - name) + 1;
            if (pass == 0) {
                count++;
                bytes += len;
                continue;
            }
            /* The file may have been rewritten in place since pass 0 (the mapping
             * shows it): no more than pass 0 counted. */
            if (st->n == count || len > bytes - used)
                continue;
            struct sym *o = &st->syms[st->n++];
            o->value = s.st_value;
            o->size = s.st_size;
            o->name = memcpy(st->names + used, name, len);
            o->rank = sym_rank(&s, name);
            used += len;
        }
        if (pass == 0) {
            if (count == 0)
                return -1;
            st->syms = malloc(count * sizeof *st->syms);
            st->names = malloc(bytes);
            if (!st->syms || !st->names) {
                free(st->syms);
                free(st->names);
                *st = (struct symtab){0};
                return -1;
            }
        }
    }
    qsort(st->syms, st->n, sizeof *st->syms, sym_cmp);
    size_t keep = 0;
    for (size_t i = 0; i < st->n; i++)
        if (keep == 0 || st->syms[keep - 1].value != st->syms[i].value)
            st->syms[keep++] = st->syms[i];
    st->n = keep;
    return 0;
}

static int read_symtab(const unsigned char *img, size_t size, struct symtab *st) {
    Ehdr eh;
    if (size < sizeof eh)
        return -1;
    memcpy(&eh, img, sizeof eh);
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != MT_ELFCLASS ||
        eh.e_shentsize != sizeof(Shdr) ||
        !in_file(size, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Shdr)))
        return -1;
    /* .symtab has the static functions; a stripped file only has .dynsym. */
    static const uint32_t kinds[] = {SHT_SYMTAB, SHT_DYNSYM};
    for (size_t k = 0; k < 2; k++)
        for (size_t i = 0; i < eh.e_shnum; i++) {
            Shdr sh = shdr_at(img, &eh, i);
            if (sh.sh_type == kinds[k] && load_section(img, size, &eh, &sh, st) == 0)
                return 0;
        }
    return -1;
}

int mt_symtab_read_file(const char *path, struct symtab *st) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat sb;
    void *img = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0)
        img = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (img == MAP_FAILED)
        return -1;
    /* Names are copied out, so the mapping is short-lived: a file rewritten in place later on
     * cannot fault us through it. */
    int rc = read_symtab(img, (size_t)sb.st_size, st);
    munmap(img, (size_t)sb.st_size);
    return rc;
}

const struct sym *mt_symtab_find(const struct symtab *st, uintptr_t pc) {
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (st->syms[mid].value <= pc)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    const struct sym *s = &st->syms[lo - 1];
    if (s->size == 0) /* assembly without .size: the nearest preceding symbol is all we have */
        return s;
    for (size_t k = 0; k < NEAR_SCAN && k < lo; k++, s--)
        if (s->size && pc - s->value < s->size)
            return s;
    return NULL; /* past the end of every sized symbol: a function the table does not name */
}

int mt_symbols_file_symbol(const char *path, uintptr_t vaddr, char *buf, size_t len) {
    struct symtab st = {0};
    if (!path || !buf || len == 0 || mt_symtab_read_file(path, &st) != 0)
        return -1;
    const struct sym *s = mt_symtab_find(&st, vaddr);
    if (s)
        snprintf(buf, len, "%s", s->name);
    int found = s != NULL;
    mt_symtab_free(&st);
    return found ? 0 : -1;
}

void mt_symtab_free(struct symtab *st) {
    free(st->syms);
    free(st->names);
    st->syms = NULL;
    st->names = NULL;
    st->n = 0;
}
