/*
 * The table's clock (clock.h), read through the kernel's vDSO directly.
 *
 * The C library's clock_gettime calls the same vDSO function, through a
 * wrapper that on glibc 2.36 doubled the cost of a coarse read (4.8-6.9
 * against 8.7-10.0 ns, 10M reads in a loop, x86-64 VM), and every recorded
 * block reads the clock.  The vDSO is an ELF image the kernel maps into
 * every process (its address in the auxiliary vector): its dynamic symbol
 * table, found through its DT_HASH, names the function.  No vDSO, no hash
 * table or no such symbol: the C library's function is used, as it is
 * before mt_clock_init.
 */
#define _GNU_SOURCE
#include "clock.h"

#include <elf.h>
#include <link.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>

typedef int (*clock_fn)(clockid_t, struct timespec *);
static _Atomic(clock_fn) vdso_clock;

#if defined(__x86_64__)
#define VDSO_CLOCK "__vdso_clock_gettime"
#elif defined(__aarch64__)
#define VDSO_CLOCK "__kernel_clock_gettime"
#endif

#ifdef VDSO_CLOCK
/* The vDSO's function of that name, or NULL. */
static clock_fn vdso_lookup(const char *name) {
    uintptr_t base = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    if (!base)
        return NULL;
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)base;
    const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(base + eh->e_phoff);
    uintptr_t bias = 0; /* link-time addresses to where it is mapped */
    const ElfW(Dyn) *dyn = NULL;
    int loaded = 0;
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type == PT_LOAD && !loaded) {
            bias = base + ph[i].p_offset - ph[i].p_vaddr;
            loaded = 1;
        } else if (ph[i].p_type == PT_DYNAMIC) {
            dyn = (const ElfW(Dyn) *)(base + ph[i].p_offset);
        }
    }
    if (!loaded || !dyn)
        return NULL;
    const ElfW(Sym) *sym = NULL;
    const char *str = NULL;
    const Elf32_Word *hash = NULL; /* nbucket, nchain: nchain symbols */
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB)
            sym = (const ElfW(Sym) *)(dyn->d_un.d_ptr + bias);
        else if (dyn->d_tag == DT_STRTAB)
            str = (const char *)(dyn->d_un.d_ptr + bias);
        else if (dyn->d_tag == DT_HASH)
            hash = (const Elf32_Word *)(dyn->d_un.d_ptr + bias);
    }
    if (!sym || !str || !hash)
        return NULL;
    for (Elf32_Word i = 0; i < hash[1]; i++)
        if (ELF64_ST_TYPE(sym[i].st_info) == STT_FUNC && sym[i].st_shndx != SHN_UNDEF &&
            !strcmp(str + sym[i].st_name, name))
            return (clock_fn)(sym[i].st_value + bias);
    return NULL;
}
#endif

void mt_clock_init(void) {
#ifdef VDSO_CLOCK
    clock_fn f = vdso_lookup(VDSO_CLOCK);
    struct timespec ts;
    /* Used only if it answers for this clock (a kernel may not). */
    if (f && f(CLOCK_MONOTONIC_COARSE, &ts) == 0)
        atomic_store_explicit(&vdso_clock, f, memory_order_relaxed);
#endif
}

/* The coarse clock is the monotonic clock at tick resolution (1-4 ms): a
 * few ns per read instead of ~20, and allocation ages are what matter. */
uint64_t mt_now_ms(void) {
    struct timespec ts;
    clock_fn f = atomic_load_explicit(&vdso_clock, memory_order_relaxed);
    if (!f || f(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int mt_clock_from_vdso(void) {
    return atomic_load_explicit(&vdso_clock, memory_order_relaxed) != NULL;
}
