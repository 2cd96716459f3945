/*
 * The ELF symbol reader (c_src/nif/elf_symtab.c) on its own: a static
 * function of this program is named from the file on disk, and truncated or
 * corrupted copies of the file, missing files, empty ones and directories
 * never crash it, nor a file rewritten in place between the reader's two
 * passes over its symbols (elf_symtab.c is built with -Dmalloc=test_malloc
 * for that: its one malloc between them).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "symbols.h"

/* Named only by .symtab: static, never inlined or cloned. */
static __attribute__((noinline, noclone)) int static_target(void) {
    __asm__ volatile("" ::: "memory");
    return 7;
}

static int first_object(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    *(uintptr_t *)arg = (uintptr_t)info->dlpi_addr;
    return 1; /* the main program comes first */
}

/* This program's load bias: run-time address = bias + link-time address. */
static uintptr_t main_bias(void) {
    uintptr_t bias = 0;
    dl_iterate_phdr(first_object, &bias);
    return bias;
}

/* Every symbol of the ELF file at path made a global function, in place. */
static void every_symbol_a_function(const char *path) {
    int fd = open(path, O_RDWR);
    ElfW(Ehdr) eh;
    if (fd < 0 || pread(fd, &eh, sizeof eh, 0) != sizeof eh) {
        if (fd >= 0)
            close(fd);
        return;
    }
    for (int i = 0; i < eh.e_shnum; i++) {
        ElfW(Shdr) sh;
        if (pread(fd, &sh, sizeof sh, (off_t)(eh.e_shoff + (size_t)i * sizeof sh)) != sizeof sh)
            break;
        if (sh.sh_type != SHT_SYMTAB)
            continue;
        for (size_t k = 1; k < sh.sh_size / sizeof(ElfW(Sym)); k++) {
            unsigned char info = (unsigned char)(STB_GLOBAL << 4 | STT_FUNC);
            off_t at = (off_t)(sh.sh_offset + k * sizeof(ElfW(Sym)) + offsetof(ElfW(Sym), st_info));
            if (pwrite(fd, &info, 1, at) != 1)
                break;
        }
    }
    close(fd);
}

/* elf_symtab.c's malloc: when armed, the file is rewritten first, as a
 * writer might between the two passes. */
static const char *rewrite_path;
void *test_malloc(size_t n);
void *test_malloc(size_t n) {
    const char *path = rewrite_path;
    rewrite_path = NULL;
    if (path)
        every_symbol_a_function(path);
    return malloc(n);
}

/* Truncated and corrupted copies of this executable must never crash the ELF reader. */
static void test_corrupt_elf(void) {
    uintptr_t vaddr = (uintptr_t)static_target - main_bias() + 1;

    FILE *in = fopen("/proc/self/exe", "rb");
    CHECK(in != NULL);
    if (!in)
        return;
    size_t cap = 1 << 20, size = 0, got;
    unsigned char *img = malloc(cap);
    while (img && (got = fread(img + size, 1, cap - size, in)) > 0)
        if ((size += got) == cap)
            img = realloc(img, cap *= 2);
    fclose(in);
    CHECK(img != NULL && size > 64);
    if (!img)
        return;

    char path[] = "/tmp/mt_elf_symtab_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) {
        free(img);
        return;
    }
    close(fd);
    unsigned char *copy = malloc(size);
    char name[MT_SYM_TEXT];
    unsigned long long seed = 42;
    int intact = -1, survived = 0;
    for (int round = 0; round < 400; round++) {
        size_t len = size;
        memcpy(copy, img, size);
        if (round >= 1 && round < 40) { /* truncations, from nothing to all but the last byte */
            static const size_t fixed[] = {0, 1, 4, 16, 63, 64, 65, 100, 4096};
            len = round - 1 < 9 ? fixed[round - 1] : size - size / (size_t)(round - 8);
        } else if (round >= 40) { /* random bytes: header, section headers, tail of the file */
            for (int k = 0; k < 16; k++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                size_t where = (seed >> 33) % 3 == 0   ? (seed >> 17) % 64
                               : (seed >> 33) % 3 == 1 ? size - 1 - (seed >> 17) % 4096
                                                       : size - 1 - (seed >> 17) % (size / 4);
                copy[where] = (unsigned char)(seed >> 8);
            }
        }
        FILE *out = fopen(path, "wb");
        if (!out || fwrite(copy, 1, len, out) != len) {
            if (out)
                fclose(out);
            break;
        }
        fclose(out);
        int rc = mt_symbols_file_symbol(path, vaddr, name, sizeof name);
        if (round == 0)
            intact = rc == 0 && strcmp(name, "static_target") == 0;
        survived++;
    }
    /* More functions, whose names are longer in all, than the first pass
     * counted: before, the second pass wrote past both arrays (ASan:
     * heap-buffer-overflow in load_section). */
    FILE *out = fopen(path, "wb");
    CHECK(out && fwrite(img, 1, size, out) == size);
    if (out)
        fclose(out);
    rewrite_path = path;
    mt_symbols_file_symbol(path, vaddr, name, sizeof name);
    CHECK(rewrite_path == NULL); /* the rewrite was made */

    unlink(path);
    free(copy);
    free(img);
    CHECK_EQ(intact, 1); /* the intact copy names static_target */
    CHECK_EQ(survived, 400);
    CHECK_EQ(mt_symbols_file_symbol("/nonexistent", 0x1000, name, sizeof name), -1);
    CHECK_EQ(mt_symbols_file_symbol("/dev/null", 0x1000, name, sizeof name), -1);
    CHECK_EQ(mt_symbols_file_symbol("/proc/self", 0x1000, name, sizeof name), -1);
}

int main(void) {
    test_corrupt_elf();
    return check_summary();
}
