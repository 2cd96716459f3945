/* Unwind tables that lie (run with the preload).  A library's
 * .eh_frame_hdr is read only when a stack through it is walked, so a
 * corrupt one can sit in a program that never notices; the walker must not
 * be the first to fault on it.  Copies of dl_fixture_a.so with the search
 * table's entry count made huge, or every entry's FDE pointed 2 GiB away,
 * are loaded, and each allocates through its own frame: the block is
 * recorded and the stack ends at that frame.  Before, the walk read past
 * the object's memory and the program died of SIGSEGV.
 *   test_interpose_corrupt_unwind BUILD */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "mtrace_api.h"
#include "queries.h"

#define MAX_FILE (4 << 20)
static unsigned char image[MAX_FILE];

static long read_file(const char *path) {
    int fd = open(path, O_RDONLY);
    long n = fd < 0 ? -1 : (long)read(fd, image, sizeof image);
    if (fd >= 0)
        close(fd);
    return n > 0 && n < MAX_FILE ? n : -1;
}

static int write_file(const char *path, long n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0700);
    int ok = fd >= 0 && write(fd, image, (size_t)n) == n;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* The file offset of .eh_frame_hdr (PT_GNU_EH_FRAME), if laid out as
 * expected: the eh_frame pointer pc-relative, the count 4 bytes, the table
 * pairs of 4-byte offsets from the header.  0 otherwise. */
static long eh_frame_hdr_at(long n) {
    const ElfW(Ehdr) *e = (const ElfW(Ehdr) *)image;
    if (n < (long)sizeof *e || memcmp(e->e_ident, ELFMAG, SELFMAG))
        return 0;
    for (int i = 0; i < e->e_phnum; i++) {
        const ElfW(Phdr) *ph =
            (const ElfW(Phdr) *)(image + e->e_phoff + (size_t)i * e->e_phentsize);
        if (ph->p_type != PT_GNU_EH_FRAME || (long)(ph->p_offset + 12) > n)
            continue;
        const unsigned char *h = image + ph->p_offset;
        return h[0] == 1 && h[1] == 0x1b && h[2] == 0x03 && h[3] == 0x3b ? (long)ph->p_offset : 0;
    }
    return 0;
}

enum corruption { HUGE_COUNT, FDES_AWAY, CORRUPTIONS };
static const char *const names[] = {"a search table of 2^31 entries", "every FDE 2 GiB away"};

static void corrupt(long hdr, enum corruption how) {
    unsigned char *h = image + hdr;
    uint32_t count;
    memcpy(&count, h + 8, 4);
    if (how == HUGE_COUNT) {
        count = 0x7fffffff;
        memcpy(h + 8, &count, 4);
        return;
    }
    for (uint32_t i = 0; i < count; i++) {
        int32_t away = 0x7ffffff0;
        memcpy(h + 12 + 8 * (size_t)i + 4, &away, 4);
    }
}

int main(int argc, char **argv) {
    const struct mtrace_api *api = dlsym(RTLD_DEFAULT, MTRACE_API_SYMBOL);
    CHECK(api != NULL);
    CHECK(argc > 1);
    if (!api || argc < 2)
        return check_summary();
    char fixture[4096], dir[] = "/tmp/mtrace-corrupt-XXXXXX";
    snprintf(fixture, sizeof fixture, "%s/dl_fixture_a.so", argv[1]);
    CHECK(mkdtemp(dir) != NULL);
    for (int how = 0; how < CORRUPTIONS; how++) {
        long n = read_file(fixture), hdr = n > 0 ? eh_frame_hdr_at(n) : 0;
        CHECK(hdr > 0);
        if (hdr <= 0)
            break;
        corrupt(hdr, (enum corruption)how);
        char path[4200];
        snprintf(path, sizeof path, "%s/corrupt_%d.so", dir, how);
        CHECK(write_file(path, n));
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        unlink(path);
        CHECK(lib != NULL);
        void *(*fixture_malloc)(size_t) =
            lib ? (void *(*)(size_t))dlsym(lib, "fixture_malloc") : NULL;
        CHECK(fixture_malloc != NULL);
        if (!fixture_malloc)
            continue;
        size_t size = 4321 + (size_t)how;
        void *p = fixture_malloc(size); /* the walk goes through the corrupt tables */
        struct mtrace_alloc buf[16], found;
        CHECK(query_block(api, p, size, buf, 16, &found));
        printf("%s: the block recorded\n", names[how]);
        free(p);
    }
    rmdir(dir);
    return check_summary();
}
