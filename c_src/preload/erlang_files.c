/* Source file names of Erlang frames, read and kept (see erlang_files.h). */
#include "erlang_files.h"

#include <string.h>
#include <sys/mman.h>

#include "spinlock.h"

#define ARENA_BYTES (64u << 10)
#define FIRST_SLOTS 4096
#define MAX_CHARS (1u << 16) /* a name longer is not a file name */

static mt_spinlock files_lock;
static const char **files; /* open addressing, at most 3/4 full */
static uint32_t n_slots, n_files;
static char *arena, *arena_end;

/* One character code as UTF-8 into out (4 bytes of room); its length, 0 if
 * it is none. */
static size_t utf8(uint64_t c, char *out) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | c >> 6);
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | c >> 12);
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    if (c < 0x110000) {
        out[0] = (char)(0xF0 | c >> 18);
        out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[3] = (char)(0x80 | (c & 0x3F));
        return 4;
    }
    return 0;
}

/* tags: list 01, small integer 1111, [] 111011.  Two passes: the length
 * first, then the bytes from where the kept end starts. */
size_t mt_erl_list_text(uint64_t t, char *out, size_t len) {
    char ch[4];
    size_t total = 0, chars = 0;
    uint64_t u = t;
    for (; (u & 3) == 1 && chars < MAX_CHARS; u = ((const uint64_t *)(u - 1))[1], chars++) {
        uint64_t c = ((const uint64_t *)(u - 1))[0];
        size_t k = (c & 0xF) == 0xF && c >> 4 ? utf8(c >> 4, ch) : 0;
        if (!k)
            return 0;
        total += k;
    }
    if ((u & 0x3F) != 0x3B || len < 16) /* an improper list, or too long */
        return 0;
    size_t skip = total < len ? 0 : total - (len - 1 - 3), at = 0, n = 0;
    if (skip) {
        memcpy(out, "...", 3);
        n = 3;
    }
    for (u = t; (u & 3) == 1; u = ((const uint64_t *)(u - 1))[1]) {
        size_t k = utf8(((const uint64_t *)(u - 1))[0] >> 4, ch);
        if (at >= skip) {
            memcpy(out + n, ch, k);
            n += k;
        }
        at += k;
    }
    out[n] = 0;
    char *slash = skip ? strchr(out + 3, '/') : NULL;
    if (slash && slash[1]) { /* ".../dir/file.erl", not "...ir/file.erl" */
        memmove(out + 3, slash, strlen(slash) + 1);
        n = strlen(out);
    }
    return n;
}

static uint32_t hash(const char *text, size_t len) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)text[i]) * 16777619u;
    return h;
}

/* Twice the slots, every name moved (the names stay where they are). */
static int grow(void) {
    uint32_t n = n_slots ? 2 * n_slots : FIRST_SLOTS;
    const char **bigger =
        mmap(NULL, n * sizeof *bigger, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bigger == MAP_FAILED)
        return 0;
    for (uint32_t i = 0; i < n_slots; i++) {
        if (!files[i])
            continue;
        uint32_t at = hash(files[i], strlen(files[i])) % n;
        while (bigger[at])
            at = (at + 1) % n;
        bigger[at] = files[i];
    }
    if (files)
        munmap(files, n_slots * sizeof *files);
    files = bigger;
    n_slots = n;
    return 1;
}

const char *mt_erl_keep_file(const char *text, size_t len) {
    const char *kept = NULL;
    mt_lock(&files_lock);
    if (4 * (n_files + 1) > 3 * n_slots && !grow() && n_files + 1 >= n_slots) {
        mt_unlock(&files_lock);
        return NULL;
    }
    for (uint32_t at = hash(text, len) % n_slots;; at = (at + 1) % n_slots) {
        if (files[at] && !strcmp(files[at], text)) {
            kept = files[at];
            break;
        }
        if (files[at])
            continue;
        if ((size_t)(arena_end - arena) <= len) {
            void *m =
                mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED)
                break;
            arena = m;
            arena_end = arena + ARENA_BYTES;
        }
        memcpy(arena, text, len + 1);
        kept = files[at] = arena;
        arena += len + 1;
        n_files++;
        break;
    }
    mt_unlock(&files_lock);
    return kept;
}
