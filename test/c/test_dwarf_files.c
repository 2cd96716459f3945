/*
 * Where the DWARF of a loaded object comes from (c_src/nif/dwarf_lines.c).
 * Run as test_dwarf_files BUILD, where BUILD holds names_v1.so,
 * names_v2.so (names_fixture.c), dwz_fixture.so and dwz_other.so
 * (dwz_fixture.c) and split_fixture.so (split_fixture.c).
 *   - A stripped library's debug file is found by its build id, and used
 *     only if it has that build id: one of another build at that path (an
 *     older package's, left behind) gave the other build's names and lines.
 *   - dwz's shared DWARF named by a relative .gnu_debugaltlink (dwz -r)
 *     is found relative to the file, and only with the build id named.
 *   - Split DWARF (-gsplit-dwarf): an inlined call has a frame of its own,
 *     read from the split unit; it was lost, and the function it was
 *     inlined into was given the inlined code's line.
 */
#define _GNU_SOURCE
#include "dwarf_lines.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#ifdef MT_HAVE_LIBDW
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <libelf.h>
#include <unistd.h>

static char dir[] = "/tmp/mtrace_dwarf_XXXXXX";

static int run(const char *cmd) {
    int ok = system(cmd) == 0;
    if (!ok)
        fprintf(stderr, "failed: %s\n", cmd);
    return ok;
}

/* Where the debug file of the object at path is looked for under
 * dir/debug, its directory made. */
static int build_id_path(const char *path, char *out, size_t len) {
    elf_version(EV_CURRENT);
    int fd = open(path, O_RDONLY);
    Elf *elf = fd >= 0 ? elf_begin(fd, ELF_C_READ, NULL) : NULL;
    const void *id = NULL;
    ssize_t n = elf ? dwelf_elf_gnu_build_id(elf, &id) : -1;
    const unsigned char *b = id;
    int ok = n > 1;
    if (ok) {
        char mk[600];
        int p = snprintf(out, len, "%s/debug/.build-id/%02x", dir, b[0]);
        snprintf(mk, sizeof mk, "mkdir -p '%s'", out);
        ok = run(mk);
        p += snprintf(out + p, len - (size_t)p, "/");
        for (ssize_t i = 1; i < n; i++)
            p += snprintf(out + p, len - (size_t)p, "%02x", b[i]);
        snprintf(out + p, len - (size_t)p, ".debug");
    }
    if (elf)
        elf_end(elf);
    if (fd >= 0)
        close(fd);
    return ok;
}

/* The link-time address of a function of a loaded object, just past its start. */
static uintptr_t link_pc(void *fn) {
    Dl_info info;
    if (!fn || !dladdr(fn, &info))
        return 0;
    return (uintptr_t)fn - (uintptr_t)info.dli_fbase + 1;
}

static void test_build_id_must_match(const char *build) {
    char v1[512], v2[512], lib[512], dbg[512], cmd[2048];
    snprintf(v1, sizeof v1, "%s/names_v1.so", build);
    snprintf(v2, sizeof v2, "%s/names_v2.so", build);
    snprintf(lib, sizeof lib, "%s/libnames.so", dir);
    void *h = dlopen(v1, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    uintptr_t pc = link_pc(h ? dlsym(h, "names_version_1") : NULL);
    CHECK(pc != 0);
    snprintf(cmd, sizeof cmd, "objcopy --strip-debug '%s' '%s'", v1, lib);
    CHECK(run(cmd));
    int found = build_id_path(lib, dbg, sizeof dbg);
    CHECK(found);
    if (!found) {
        if (h)
            dlclose(h);
        return;
    }

    /* another build's debug file at the path: not used */
    snprintf(cmd, sizeof cmd, "objcopy --only-keep-debug '%s' '%s'", v2, dbg);
    CHECK(run(cmd));
    char root[300];
    snprintf(root, sizeof root, "%s/debug", dir);
    mt_dwarf_set_debug_root(root);
    struct mt_dwarf *d = mt_dwarf_open(lib);
    CHECK(d == NULL);
    mt_dwarf_close(d);

    /* its own: names and lines */
    snprintf(cmd, sizeof cmd, "objcopy --only-keep-debug '%s' '%s'", v1, dbg);
    CHECK(run(cmd));
    d = mt_dwarf_open(lib);
    CHECK(d != NULL);
    struct mt_dw_frame f[4];
    int n = d ? mt_dwarf_frames(d, pc, f, 4) : 0;
    CHECK_EQ(n, 1);
    if (n == 1) {
        CHECK(f[0].name && !strcmp(f[0].name, "names_version_1"));
        CHECK(f[0].file && strstr(f[0].file, "names_fixture.c"));
        CHECK(f[0].line > 0);
    }
    mt_dwarf_close(d);
    mt_dwarf_set_debug_root(NULL);
    if (h)
        dlclose(h);
}

/* The name of the function at pc in the DWARF of path, "" for none. */
static const char *name_at(const char *path, uintptr_t pc, char *out, size_t len) {
    struct mt_dwarf *d = mt_dwarf_open(path);
    struct mt_dw_frame f[4];
    int n = d ? mt_dwarf_frames(d, pc, f, 4) : 0;
    snprintf(out, len, "%s", n == 1 && f[0].name ? f[0].name : "");
    CHECK(n == 1 && f[0].line > 0); /* lines stay in the file itself */
    mt_dwarf_close(d);
    return out;
}

/* Copies of lib as x.so and y.so in dir/sub (and dir/sub/shared made),
 * their DWARF shared through dwz with the options opts. */
static int dwz_pair(const char *sub, const char *lib, const char *x, const char *y,
                    const char *opts) {
    char cmd[4 * PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && mkdir -p '%s/shared' && cd '%s' && cp '%s' %s && cp '%s' %s && "
             "dwz %s %s %s",
             dir, sub, sub, lib, x, lib, y, opts, x, y);
    return run(cmd);
}

/* dwz -r: what two copies of a library share goes to a file of its own,
 * which each copy's .gnu_debugaltlink names relative to its directory; the
 * function's name is read from there (it was missing). */
static void test_dwz_relative_alt(const char *build) {
    char lib[PATH_MAX], other[PATH_MAX], cmd[3 * PATH_MAX], a[600], name[64];
    snprintf(cmd, sizeof cmd, "%s/dwz_fixture.so", build);
    CHECK(realpath(cmd, lib) != NULL);
    snprintf(cmd, sizeof cmd, "%s/dwz_other.so", build);
    CHECK(realpath(cmd, other) != NULL);
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    uintptr_t pc = link_pc(h ? dlsym(h, "dwz_fixture_leaf") : NULL);
    CHECK(pc != 0);
    CHECK(dwz_pair("dwz", lib, "a.so", "b.so", "-m shared/common.debug -r"));
    snprintf(a, sizeof a, "%s/dwz/a.so", dir);
    CHECK(!strcmp(name_at(a, pc, name, sizeof name), "dwz_fixture_leaf"));
    /* through a link from elsewhere: relative to where the file is */
    snprintf(cmd, sizeof cmd, "ln -s '%s' '%s/a_link.so'", a, dir);
    CHECK(run(cmd));
    snprintf(cmd, sizeof cmd, "%s/a_link.so", dir);
    CHECK(!strcmp(name_at(cmd, pc, name, sizeof name), "dwz_fixture_leaf"));
    /* deleted while open (read through a descriptor or map_files, whose
     * link reads "/its/path (deleted)"): relative to where it was */
    snprintf(a, sizeof a, "%s/dwz/a.so", dir);
    int fd = open(a, O_RDONLY);
    CHECK(fd >= 0 && unlink(a) == 0);
    snprintf(cmd, sizeof cmd, "/proc/self/fd/%d", fd);
    CHECK(!strcmp(name_at(cmd, pc, name, sizeof name), "dwz_fixture_leaf"));
    /* the shared file of other libraries at that path: not used */
    snprintf(cmd, sizeof cmd, "rm '%s/dwz/shared/common.debug'", dir);
    CHECK(run(cmd));
    CHECK(dwz_pair("dwz", other, "c.so", "d.so", "-m shared/common.debug -r"));
    snprintf(a, sizeof a, "%s/dwz/b.so", dir);
    CHECK(!strcmp(name_at(a, pc, name, sizeof name), "")); /* without it: lines, no name */
    if (fd >= 0)
        close(fd);

    /* an absolute path, which libdw follows itself: its file is used only
     * with the build id named, the other pair's taken as no file at all */
    snprintf(cmd, sizeof cmd, "-m '%s/abs/common.debug'", dir);
    CHECK(dwz_pair("abs", lib, "a.so", "b.so", cmd));
    snprintf(a, sizeof a, "%s/abs/a.so", dir);
    CHECK(!strcmp(name_at(a, pc, name, sizeof name), "dwz_fixture_leaf"));
    snprintf(cmd, sizeof cmd, "cp '%s/dwz/shared/common.debug' '%s/abs/common.debug'", dir, dir);
    CHECK(run(cmd));
    CHECK(!strcmp(name_at(a, pc, name, sizeof name), ""));
    if (h)
        dlclose(h);
}

static void test_split_dwarf_inlined(const char *build) {
    char path[512];
    snprintf(path, sizeof path, "%s/split_fixture.so", build);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    void *(*entry)(void) = h ? (void *(*)(void))dlsym(h, "split_entry") : NULL;
    CHECK(entry != NULL);
    if (!entry)
        return;
    /* the call in split_inner, inlined into split_entry */
    uintptr_t pc = link_pc(entry()) - 2;
    struct mt_dwarf *d = mt_dwarf_open(path);
    CHECK(d != NULL);
    struct mt_dw_frame f[4];
    int n = d ? mt_dwarf_frames(d, pc, f, 4) : 0;
    CHECK_EQ(n, 2);
    if (n == 2) {
        CHECK(f[0].inlined == 1 && f[0].name && !strcmp(f[0].name, "split_inner"));
        CHECK(f[1].inlined == 0 && f[1].name && !strcmp(f[1].name, "split_entry"));
        CHECK(f[0].line > 0 && f[1].line > f[0].line);
    }
    mt_dwarf_close(d);
    dlclose(h);
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "_build/c";
    CHECK(mkdtemp(dir) != NULL);
    if (check_emulator()) /* the host's objcopy may not read the target's objects */
        printf("skipped under an emulator: debug files by build id\n");
    else if (system("command -v objcopy > /dev/null") != 0)
        printf("skipped without objcopy (binutils): debug files by build id\n");
    else
        test_build_id_must_match(build);
    if (check_emulator())
        printf("skipped under an emulator: dwz's shared DWARF\n");
    else if (system("command -v dwz > /dev/null") != 0)
        printf("skipped without dwz: dwz's shared DWARF\n");
    else
        test_dwz_relative_alt(build);
    test_split_dwarf_inlined(build);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    run(cmd);
    return check_summary();
}

#else

int main(void) {
    printf("skipped: built without libdw\n");
    return check_summary();
}

#endif
