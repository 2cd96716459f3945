/*
 * The symbolizer reads the file that is mapped, not whatever its path names
 * now (c_src/nif/symbols.c, proc_maps.c), and cuts long names at a
 * character's start.  Run as test_symbols_files BUILD, where BUILD holds
 * names_v1.so and names_v2.so (names_fixture.c): each case copies them to a
 * directory of its own.
 *   - A library replaced on disk while loaded (as a package upgrade
 *     replaces it), first named after that: its own names, from the mapped
 *     file (or none where /proc/self/map_files cannot be read), never the
 *     new file's; also when the loaded objects were listed before it was
 *     replaced.
 *   - The same build copied over a loaded library (reinstalled), named in
 *     a process that may not open /proc/self/map_files (not privileged, as
 *     a node run as a user or in a container): its names, from the path,
 *     the file there holding the mapped file's build id.
 *   - A library unloaded, rebuilt and loaded again under the same path,
 *     perhaps at the same address: the new file's names.
 *   - A name longer than a frame's text: cut whole characters, valid UTF-8.
 */
#define _GNU_SOURCE
#include "objects_api.h"
#include "symbols.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static struct mt_frame_info fr[MT_SYM_MAX_FRAMES];
static char dir[] = "/tmp/mtrace_names_XXXXXX";

static const char *resolved(void *addr, int demangle) {
    int n = mt_symbols_resolve((uintptr_t)addr + 1, demangle, fr, MT_SYM_MAX_FRAMES);
    return n > 0 ? fr[n - 1].symbol : "";
}

static int copy(const char *from, const char *to) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd) == 0;
}

/* Version 1 at dir/NAME.so, loaded, with version 2 beside it at
 * dir/NAME.so.new to take its place; the handle, or NULL. */
static void *load_v1(const char *name, const char *v1, const char *v2, char *path, char *next,
                     size_t len) {
    snprintf(path, len, "%s/%s.so", dir, name);
    snprintf(next, len, "%s/%s.so.new", dir, name);
    CHECK(copy(v1, path) && copy(v2, next));
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    return h;
}

/* Replaced while loaded, the symbolizer's list of objects read after (the
 * file is deleted in it) or, with listed_first, before (any earlier query
 * reads it): the list then says the file is not deleted, so the symbolizer
 * must see for itself when it reads the file. */
static void test_replaced_while_loaded(const char *v1, const char *v2, int listed_first) {
    char path[256], next[256];
    void *h = load_v1(listed_first ? "listed" : "replaced", v1, v2, path, next, sizeof path);
    if (!h)
        return;
    void *f = dlsym(h, "names_version_1");
    if (listed_first) {
        mt_symbols_flush();
        CHECK(resolved((void *)copy, 0)[0] != '\0'); /* lists the objects, reads the program */
    }
    CHECK(rename(next, path) == 0); /* the loaded file is now deleted */
    if (!listed_first)
        mt_symbols_flush();
    const char *name = resolved(f, 0);
    printf("replaced while loaded (objects listed %s), named after: '%s'\n",
           listed_first ? "before" : "after", name);
    CHECK(strcmp(name, "names_version_1") == 0 || name[0] == '\0');
    dlclose(h);
}

/* In a child: as nobody when run as root (dumpable again, so that its own
 * /proc files are its), privileged no more. */
static int unprivileged_child(void) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid != 0) {
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        return 0;
    }
    if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
        _exit(2);
    prctl(PR_SET_DUMPABLE, 1);
    return 1;
}

static void test_reinstalled(const char *v1) {
    char path[256], next[256];
    void *h = load_v1("reinstalled", v1, v1, path, next, sizeof path);
    if (!h)
        return;
    void *f = dlsym(h, "names_version_1");
    CHECK(rename(next, path) == 0); /* the same build, another file: the loaded one is deleted */
    CHECK(chmod(dir, 0755) == 0);
    if (!unprivileged_child())
        return;
    mt_symbols_flush();
    const char *name = resolved(f, 0);
    printf("reinstalled, named as uid %d: '%s'\n", (int)getuid(), name);
    CHECK(strcmp(name, "names_version_1") == 0);
    int failed = check_summary();
    fflush(stdout);
    _exit(failed ? 1 : 0);
}

static void test_reloaded(const char *v1, const char *v2) {
    char path[256], next[256];
    void *h = load_v1("reloaded", v1, v2, path, next, sizeof path);
    if (!h)
        return;
    void *f1 = dlsym(h, "names_version_1");
    CHECK(strcmp(resolved(f1, 0), "names_version_1") == 0);
    dlclose(h);
    CHECK(rename(next, path) == 0); /* rebuilt: a new file at the same path */
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    if (!h)
        return;
    void *f2 = dlsym(h, "names_version_2");
    void *base1 = (void *)((uintptr_t)f1 & ~(uintptr_t)0xfff);
    void *base2 = (void *)((uintptr_t)f2 & ~(uintptr_t)0xfff);
    printf("reloaded at the same address: %s\n", base1 == base2 ? "yes" : "no");
    CHECK(strcmp(resolved(f2, 0), "names_version_2") == 0);
    dlclose(h);
}

/* Whether s is whole UTF-8 characters. */
static int utf8_whole(const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int more = *p < 0x80 ? 0 : (*p & 0xE0) == 0xC0 ? 1 : (*p & 0xF0) == 0xE0 ? 2 : 3;
        for (p++; more > 0; more--, p++)
            if ((*p & 0xC0) != 0x80)
                return 0;
    }
    return 1;
}

static void test_long_name(const char *v1) {
    void *h = dlopen(v1, RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    if (!h)
        return;
    char long_name[2 + 600 + 1] = "xx";
    for (int i = 0; i < 300; i++)
        memcpy(long_name + 2 + 2 * i, "\xc3\xa9", 3); /* é */
    void *f = dlsym(h, long_name);
    CHECK(f != NULL);
    for (int demangle = 0; f && demangle < 2; demangle++) {
        const char *name = resolved(f, demangle);
        size_t len = strlen(name);
        printf("a name of 602 bytes: %zu kept (demangle %d)\n", len, demangle);
        CHECK(len > 400 && len < MT_SYM_TEXT);
        CHECK(!strncmp(name, "xx", 2) && utf8_whole(name));
    }
    dlclose(h);
}

int main(int argc, char **argv) {
    const char *build = argc > 1 ? argv[1] : "_build/c";
    char v1[512], v2[512];
    snprintf(v1, sizeof v1, "%s/names_v1.so", build);
    snprintf(v2, sizeof v2, "%s/names_v2.so", build);
    CHECK(access(v1, R_OK) == 0 && access(v2, R_OK) == 0);
    CHECK(mkdtemp(dir) != NULL);
    mt_symbols_use(&objects_only);
    test_replaced_while_loaded(v1, v2, 0);
    test_replaced_while_loaded(v1, v2, 1);
    test_reloaded(v1, v2);
    test_reinstalled(v1);
    test_long_name(v1);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return check_summary();
}
