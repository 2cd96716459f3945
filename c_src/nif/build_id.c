/* An object's build id, from memory or from a file (see build_id.h). */
#define _GNU_SOURCE
#include "build_id.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <string.h>
#include <unistd.h>

typedef ElfW(Ehdr) Ehdr;
typedef ElfW(Phdr) Phdr;
typedef ElfW(Nhdr) Nhdr;

#define NOTES_MAX 4096 /* bytes of a file's note segment read: the id comes first or early */
#define PHNUM_MAX 64

static size_t padded(size_t n, size_t align) { return (n + align - 1) & ~(align - 1); }

/* The build id among len bytes of notes, each aligned to align. */
static size_t from_notes(const unsigned char *p, size_t len, size_t align, unsigned char *out) {
    for (size_t at = 0; len - at >= sizeof(Nhdr);) {
        Nhdr h;
        memcpy(&h, p + at, sizeof h);
        at += sizeof h;
        size_t name = padded(h.n_namesz, align), desc = padded(h.n_descsz, align);
        if (name > len - at || desc > len - at - name)
            return 0;
        if (h.n_type == NT_GNU_BUILD_ID && h.n_namesz == 4 && !memcmp(p + at, "GNU", 4) &&
            h.n_descsz > 0 && h.n_descsz <= MT_BUILD_ID_MAX) {
            memcpy(out, p + at + name, h.n_descsz);
            return h.n_descsz;
        }
        at += name + desc;
    }
    return 0;
}

static size_t note_align(const Phdr *ph) { return ph->p_align == 8 ? 8 : 4; }

/* Whether [vaddr, vaddr + len) lies in the file-backed, readable part of a
 * loadable segment: the notes outside one are not mapped. */
static int mapped(const Phdr *ph, size_t phnum, uintptr_t vaddr, size_t len) {
    for (size_t i = 0; i < phnum; i++)
        if (ph[i].p_type == PT_LOAD && (ph[i].p_flags & PF_R) && vaddr >= ph[i].p_vaddr &&
            len <= ph[i].p_filesz && vaddr - ph[i].p_vaddr <= ph[i].p_filesz - len)
            return 1;
    return 0;
}

size_t mt_build_id_mapped(const void *phdr, size_t phnum, uintptr_t base, unsigned char *out) {
    const Phdr *ph = phdr;
    for (size_t i = 0; ph && i < phnum; i++) {
        if (ph[i].p_type != PT_NOTE || !mapped(ph, phnum, ph[i].p_vaddr, ph[i].p_filesz))
            continue;
        size_t n = from_notes((const unsigned char *)(base + ph[i].p_vaddr), ph[i].p_filesz,
                              note_align(&ph[i]), out);
        if (n)
            return n;
    }
    return 0;
}

static int read_at(int fd, void *buf, size_t len, uint64_t off) {
    return pread(fd, buf, len, (off_t)off) == (ssize_t)len;
}

size_t mt_build_id_file(const char *path, unsigned char *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    Ehdr eh;
    Phdr ph[PHNUM_MAX];
    size_t n = 0;
    if (read_at(fd, &eh, sizeof eh, 0) && !memcmp(eh.e_ident, ELFMAG, SELFMAG) &&
        eh.e_phentsize == sizeof(Phdr) && eh.e_phnum <= PHNUM_MAX &&
        read_at(fd, ph, eh.e_phnum * sizeof(Phdr), eh.e_phoff)) {
        unsigned char notes[NOTES_MAX];
        for (size_t i = 0; i < eh.e_phnum && !n; i++) {
            if (ph[i].p_type != PT_NOTE)
                continue;
            size_t len = ph[i].p_filesz < NOTES_MAX ? ph[i].p_filesz : NOTES_MAX;
            if (read_at(fd, notes, len, ph[i].p_offset))
                n = from_notes(notes, len, note_align(&ph[i]), out);
        }
    }
    close(fd);
    return n;
}
