/*
 * Whether a signal interrupted the C library itself.  A test's handler that
 * allocates must not when it did: neither glibc's malloc nor musl's is
 * async-signal-safe (single-threaded, both skip their locks), so a handler's
 * malloc inside an interrupted libc malloc corrupts the libc's own heap, with
 * or without the preload.  The tests exercise the tracker's reentry, not the
 * libc's, so such a handler returns and waits for the next signal.
 */
#ifndef MT_TEST_INTERRUPTED_H
#define MT_TEST_INTERRUPTED_H

#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

static uintptr_t libc_text_lo, libc_text_hi;

static int find_libc_text(struct dl_phdr_info *info, size_t size, void *unused) {
    (void)size;
    (void)unused;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    if (!strstr(name, "libc.so") && !strstr(name, "ld-musl"))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (!libc_text_lo || lo < libc_text_lo)
            libc_text_lo = lo;
        if (hi > libc_text_hi)
            libc_text_hi = hi;
    }
    return 1;
}

/* Finds the libc's code, before any handler runs; 0 if it cannot. */
static int interrupted_init(void) {
    dl_iterate_phdr(find_libc_text, NULL);
    return libc_text_hi != 0;
}

/* Whether the signal whose ucontext is uc interrupted the libc's code (an
 * unknown architecture: never, the handler's former behaviour). */
static int interrupted_libc(const void *uc) {
    const ucontext_t *u = uc;
#if defined(__x86_64__)
    uintptr_t pc = (uintptr_t)u->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    uintptr_t pc = (uintptr_t)u->uc_mcontext.pc;
#else
    uintptr_t pc = 0;
    (void)u;
#endif
    return pc >= libc_text_lo && pc < libc_text_hi;
}

#endif
