/* Erlang frames against a VM made up here: scheduler data, a process, its
 * stack and a code index, laid out as a layout describes them.  Checks what
 * the capture takes from a stack and what it leaves, the cache that spares
 * a rescan, the naming of frames (file names as the VM's character lists),
 * and every way the feature stays off. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "erlang_files.h"
#include "erlang_layout.h"
#include "erlang_frames.h"
#include "state.h"

#define ATOM(i) (((uint64_t)(i) << 6) | 0x0B)
#define SMALL(i) (((uint64_t)(i) << 4) | 0xF)
#define NIL ((~(uint64_t)0 << 6) | 0x3B)

static char sched_data[256], process[256];
static uint64_t stack[64];
/* The code index: two functions, code at [code, code + 100) and [code + 100, +200). */
static _Alignas(8) char code[200]; /* return addresses have their low two bits clear */
static uint64_t mfas[2][3] = {{ATOM(1), ATOM(2), 1}, {ATOM(3), ATOM(4), 2}};
/* More NIFs than the preload keeps (4,096): the rest keyed by the VM's address. */
#define MANY_NIFS 4200
static uint64_t many[MANY_NIFS][3];
static uint64_t cells[32], fnames[2];
struct fake_info {
    const uint64_t *mfa;
    uint64_t needed;
    uint32_t loc, pad;
    const uint64_t *fname_ptr;
};

static void *scheduler_data(void) { return sched_data; }

static void function_info(void *out, const void *pc, int full) {
    struct fake_info *fi = out;
    const char *p = pc;
    fi->mfa = NULL;
    fi->loc = 0;
    if (p >= code && p < code + 200) {
        int k = p >= code + 100;
        fi->mfa = mfas[k];
        if (full) {
            fi->loc = (uint32_t)(k << 24) | (uint32_t)(10 + (p - code) % 100);
            fi->fname_ptr = fnames;
        }
    }
}

/* "lib/é.ex" as a list of character codes. */
static uint64_t char_list(void) {
    const unsigned codes[] = {'l', 'i', 'b', '/', 0xE9, '.', 'e', 'x'};
    uint64_t t = NIL;
    for (int i = 7; i >= 0; i--) {
        cells[2 * i] = SMALL(codes[i]);
        cells[2 * i + 1] = t;
        t = (uint64_t)(uintptr_t)&cells[2 * i] | 1;
    }
    return t;
}

static void put(char *base, uint32_t off, const void *v) { memcpy(base + off, &v, sizeof v); }

static struct mtrace_erlang_layout layout = {
    .size = sizeof(struct mtrace_erlang_layout),
    .sched_current_process = 8,
    .sched_current_nif = 16,
    .proc_stop = 24,
    .proc_hend = 40,
    .proc_current = 64,
    .info_loc = 16,
    .info_fname = 24,
    .scheduler_data = scheduler_data,
    .function_info = function_info,
};

/* text as a list of character codes (bytes < 0x80, and 0xE9 for 'é'). */
static uint64_t long_cells[2 * 1024];
static uint64_t list_of(const unsigned *codes, int n) {
    uint64_t t = NIL;
    for (int i = n - 1; i >= 0; i--) {
        long_cells[2 * i] = SMALL(codes[i]);
        long_cells[2 * i + 1] = t;
        t = (uint64_t)(uintptr_t)&long_cells[2 * i] | 1;
    }
    return t;
}

/* A name longer than the text kept keeps its end, from a directory on (it
 * was none at all); a store of names that grows (it was full at 4,096,
 * then every other file named none). */
static void test_file_names(void) {
    unsigned codes[1024];
    int n = 0;
    codes[n++] = '/';
    for (int d = 0; d < 30; d++) {
        for (int i = 0; i < 8; i++)
            codes[n++] = d == 29 && i == 7 ? 0xE9 : (unsigned)('a' + i);
        codes[n++] = '/';
    }
    const char *file = "file.ex";
    for (const char *c = file; *c; c++)
        codes[n++] = (unsigned char)*c;
    char text[256];
    size_t len = mt_erl_list_text(list_of(codes, n), text, sizeof text);
    CHECK(len > 100 && len < sizeof text && strlen(text) == len);
    CHECK(!strncmp(text, ".../", 4));
    CHECK(len >= 17 && !strcmp(text + len - 17, "abcdefg\xC3\xA9/file.ex"));
    /* short enough: whole */
    CHECK_EQ(mt_erl_list_text(list_of(codes + n - 7, 7), text, sizeof text), 7);
    CHECK(!strcmp(text, file));

    const char *first = NULL;
    int kept = 0;
    for (int i = 0; i < 10000; i++) {
        char name[32];
        int k = snprintf(name, sizeof name, "lib/m%d.ex", i);
        const char *p = mt_erl_keep_file(name, (size_t)k);
        kept += p && !strcmp(p, name);
        if (i == 0)
            first = p;
    }
    CHECK_EQ(kept, 10000);
    CHECK(first && mt_erl_keep_file("lib/m0.ex", 9) == first); /* one copy per file */
}

/* The layout with words where its tracing stubs are. */
static struct mtrace_erlang_layout with_stub_words(const struct mtrace_erlang_layout *l) {
    struct mtrace_erlang_layout w = *l;
    w.return_trace = w.exception_trace = 0x1234;
    w.return_to_trace = w.return_time_trace = 0x5678;
    return w;
}

/* A preload of this version built before the tracing stubs: it takes the
 * shorter layout only. */
static int old_preload_calls;
static enum mtrace_result old_preload(const struct mtrace_erlang_layout *l) {
    old_preload_calls++;
    return l->size == MTRACE_ERLANG_LAYOUT_NO_STUBS ? mt_erl_setup(l) : MTRACE_ERR_ARGUMENT;
}

/* In a process of its own, as the first layout: a NIF built with the
 * stubs hands such a preload the shorter layout, whose stubs are kept as 0. */
static int older_first(void) {
    struct mtrace_erlang_layout full = with_stub_words(&layout);
    CHECK_EQ(mt_give_layout(old_preload, &full), MTRACE_OK);
    CHECK_EQ(old_preload_calls, 2);
    CHECK_EQ(mt_erl_setup(&layout), MTRACE_OK);        /* the same as kept: stubs 0 */
    CHECK_EQ(mt_erl_setup(&full), MTRACE_ERR_REFUSED); /* not the stubs' words */
    CHECK_EQ(mt_give_layout(mt_erl_setup, &full), MTRACE_ERR_REFUSED); /* refused, not retried */
    return check_summary();
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "older-first"))
        return older_first();
    uintptr_t pcs[MTRACE_MAX_DEPTH];
    test_file_names();
    int same, allowed;
    fnames[0] = NIL; /* a file the VM does not name */
    fnames[1] = char_list();

    /* off until a layout is given */
    put(sched_data, 16, (void *)1);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 0);
    CHECK_EQ(mt_erl_in_nif(), 0);
    CHECK_EQ(mt_erl_active(&allowed), 0);
    CHECK_EQ(allowed, 1);

    /* refused: wrong size, then MTRACE_ERLANG=0 */
    struct mtrace_erlang_layout bad = layout;
    bad.size = 8;
    CHECK_EQ(mt_erl_setup(&bad), MTRACE_ERR_ARGUMENT);
    mt_state.cfg.erlang = 0; /* MTRACE_ERLANG=0 */
    CHECK_EQ(mt_erl_setup(&layout), MTRACE_ERR_REFUSED);
    CHECK_EQ(mt_erl_active(&allowed), 0);
    CHECK_EQ(allowed, 0);
    mt_state.cfg.erlang = 1;
    CHECK_EQ(mt_erl_setup(&layout), MTRACE_OK);
    CHECK_EQ(mt_erl_active(&allowed), 1);
    bad = layout;
    bad.proc_stop = 32;
    CHECK_EQ(mt_erl_setup(&bad), MTRACE_ERR_REFUSED); /* the first layout is kept */
    /* a reader of this version built before the tracing stubs: shorter,
     * the stubs read as 0 (the words past its size are not its own) */
    struct mtrace_erlang_layout older = with_stub_words(&layout);
    older.size = MTRACE_ERLANG_LAYOUT_NO_STUBS;
    CHECK_EQ(mt_erl_setup(&older), MTRACE_OK);
    older.size = sizeof older + 8; /* a later, longer one: not this version's */
    CHECK_EQ(mt_erl_setup(&older), MTRACE_ERR_ARGUMENT);
    older.size = MTRACE_ERLANG_LAYOUT_NO_STUBS + 8; /* half of the stubs: no build's */
    CHECK_EQ(mt_erl_setup(&older), MTRACE_ERR_ARGUMENT);
    CHECK(check_child(argv[0], "older-first"));

    /* a process stack: stop at stack[4], hend = &stack[12] */
    uint64_t *stop = &stack[4], *hend = &stack[12];
    put(sched_data, 8, process);
    put(process, 24, stop);
    put(process, 40, hend);
    put(process, 64, &mfas[0][0]);             /* the NIF's own MFA */
    stop[0] = (uint64_t)(uintptr_t)&stack[6];  /* a saved frame pointer: skipped */
    stop[1] = (uint64_t)(uintptr_t)(code + 4); /* return address into function 0 */
    stop[2] = SMALL(42);                       /* terms: skipped */
    stop[3] = ATOM(7);
    stop[4] = 0;                                     /* skipped */
    stop[5] = (uint64_t)(uintptr_t)(code + 120);     /* into function 1 */
    stop[6] = (uint64_t)(uintptr_t)(code + 150) | 2; /* a boxed term: skipped */
    stop[7] = (uint64_t)(uintptr_t)(code + 196);     /* bottom word (beam_normal_exit): skipped */

    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(same, 0);
    /* the NIF frame: the preload's own copy of its {M, F, A}, tagged */
    CHECK_EQ(pcs[0] & 1, 1);
    CHECK(pcs[0] != ((uintptr_t)&mfas[0][0] | 1));
    CHECK(!memcmp((const void *)(pcs[0] & ~(uintptr_t)1), mfas[0], 3 * sizeof(uint64_t)));
    uintptr_t nif_frame = pcs[0];
    CHECK_EQ(pcs[1], (uintptr_t)(code + 4));
    CHECK_EQ(pcs[2], (uintptr_t)(code + 120));
    /* the same stack again: from the cache */
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(same, 1);
    /* a dirty NIF's record rewritten in place for another NIF: not the
     * cache's, and another key; back again, the first key */
    uint64_t kept_mfa[3];
    memcpy(kept_mfa, mfas[0], sizeof kept_mfa);
    memcpy(mfas[0], mfas[1], sizeof kept_mfa);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(same, 0);
    CHECK(pcs[0] != nif_frame && (pcs[0] & 1));
    memcpy(mfas[0], kept_mfa, sizeof kept_mfa);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(pcs[0], nif_frame);
    /* the same {M, F, A} in another process's record: the same key */
    put(process, 64, kept_mfa);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(pcs[0], nif_frame);
    put(process, 64, &mfas[0][0]);
    /* past the preload's table: the VM's own address, readable as long as
     * the VM keeps it */
    int ours = 0, vms = 0;
    for (int i = 0; i < MANY_NIFS; i++) {
        many[i][0] = ATOM(1000 + i), many[i][1] = ATOM(2), many[i][2] = 3;
        put(process, 64, many[i]);
        CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
        if (pcs[0] == ((uintptr_t)many[i] | 1))
            vms++;
        else
            ours++;
        CHECK(!memcmp((const void *)(pcs[0] & ~(uintptr_t)1), many[i], sizeof many[i]));
    }
    CHECK(ours > 0 && vms > 0 && ours + vms == MANY_NIFS);
    put(process, 64, &mfas[0][0]);
    /* a changed word is seen */
    stop[5] = (uint64_t)(uintptr_t)(code + 132);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(same, 0);
    CHECK_EQ(pcs[2], (uintptr_t)(code + 132));
    /* at most max frames */
    CHECK_EQ(mt_erl_capture(pcs, 2, &same), 2);
    CHECK_EQ(same, 0);

    /* names */
    struct mtrace_erl_frame f;
    mt_erl_name(pcs[0], &f);
    CHECK(f.module == ATOM(1) && f.function == ATOM(2) && f.arity == 1 && f.line == 0);
    CHECK(f.file == NULL);
    mt_erl_name((uintptr_t)(code + 120), &f);
    CHECK(f.module == ATOM(3) && f.function == ATOM(4) && f.arity == 2);
    CHECK_EQ(f.line, 30);
    CHECK(f.file && !strcmp(f.file, "lib/\xC3\xA9.ex"));
    const char *kept = f.file;
    mt_erl_name((uintptr_t)(code + 124), &f);
    CHECK(f.file == kept); /* one copy per file */
    mt_erl_name((uintptr_t)(code + 4), &f);
    CHECK_EQ(f.line, 14);
    CHECK(f.file == NULL);                  /* [] names no file */
    mt_erl_name((uintptr_t)code + 300, &f); /* in no function */
    CHECK(f.module == 0 && f.function == 0 && f.line == 0);

    /* not in a NIF, an implausible stack: nothing */
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(mt_erl_in_nif(), 1);
    put(sched_data, 16, NULL);
    CHECK_EQ(mt_erl_in_nif(), 0);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 0);
    put(sched_data, 16, (void *)1);
    /* the same frames again, but a capture without any came between: they
     * are not the previous capture's */
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(same, 0);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    CHECK_EQ(same, 1);
    put(process, 24, hend);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 0);
    put(process, 24, stop);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);

    /* turned off, and in a fork child */
    CHECK_EQ(mt_erl_setup(NULL), MTRACE_OK);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 0);
    CHECK_EQ(mt_erl_setup(&layout), MTRACE_OK);
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 3);
    mt_erl_forked();
    CHECK_EQ(mt_erl_capture(pcs, 32, &same), 0);
    CHECK_EQ(mt_erl_in_nif(), 0);
    return check_summary();
}
