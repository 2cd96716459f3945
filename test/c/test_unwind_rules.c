/* The unwind rules' cache (unwind_rules.c) on its own, its rules made up by
 * a stub of eh_frame.c: a rule is kept under its own return address even
 * when two threads race for one slot, and a generation's stored bits
 * wrapping around never brings a stale rule back. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "check.h"
#include "hash.h"
#include "unwind.h"
#include "unwind_rules.h"

/* What the stub says each return address's rule is: its CFA offset, made
 * from the address, or `current` when set. */
static int32_t current;
static int32_t rule_of(uintptr_t ra) {
    return current ? current : (int32_t)(8 * ((ra >> 4) % 1000 + 1));
}

/* When set, the frame pointer's slot in the stub's rule: far below the CFA,
 * as in a function with 600 KiB of locals on aarch64 (x29 saved at the
 * frame's bottom). */
static int32_t far_bp;

/* Both racing threads wait here inside the computation, so that both find
 * the slot free before either claims it. */
static atomic_int arrived;
static int racing;

/* The loader's count of loads and unloads, as objects.c would give it: it
 * never moves here (the stub's *loads is always 1). */
uint64_t mt_objects_generation_walking(void) { return 1; }

void mt_eh_frame_rule(uintptr_t target, struct mt_frame_rule *out, uint64_t *loads) {
    *out = (struct mt_frame_rule){rule_of(target + 1), -8, 0, 0, 0, MT_RULE_FRAME};
    if (far_bp)
        *out = (struct mt_frame_rule){16 - far_bp, -8, far_bp, 0, 1, MT_RULE_FRAME};
    *loads = 1;
    if (racing) {
        atomic_fetch_add(&arrived, 1);
        while (atomic_load(&arrived) < 2)
            ;
        static __thread unsigned seed;
        seed = seed * 1103515245u + 12345u + (unsigned)target;
        for (volatile unsigned d = (seed >> 16) % 64; d; d--)
            ;
    }
}

static void *look(void *ra) {
    struct mt_frame_rule r;
    mt_rule_for((uintptr_t)ra, &r);
    return NULL;
}

/* One round in a fork child (a fresh, empty cache): two threads ask for two
 * return addresses of the same home slot at once; then each must read back
 * its own rule.  Exit status 1 when one reads another's. */
static int race_round(uintptr_t a, uintptr_t b) {
    pid_t pid = fork();
    if (pid == 0) {
        racing = 1;
        pthread_t ta, tb;
        pthread_create(&ta, NULL, look, (void *)a);
        pthread_create(&tb, NULL, look, (void *)b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        racing = 0;
        struct mt_frame_rule ra, rb;
        mt_rule_for(a, &ra);
        mt_rule_for(b, &rb);
        _exit(ra.cfa_off != rule_of(a) || rb.cfa_off != rule_of(b));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

static void test_race(void) {
    uintptr_t a = 0x400010, b;
    for (b = a + 16; mt_hash_index(b, 15) != mt_hash_index(a, 15); b += 16)
        ;
    CHECK(rule_of(a) != rule_of(b));
    int rounds = check_emulator() ? 200 : 4000, wrong = 0, failed = 0;
    for (int i = 0; i < rounds; i++) {
        int r = race_round(a, b);
        wrong += r == 1;
        failed += r == 2;
    }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(failed, 0);
}

/* Rules kept under generations 1 to 5, for code replaced since: when the
 * generation's 15 stored bits come round to theirs again (after 2^15 - 1
 * bumps: dlcloses, or loader changes seen), each must be a miss.  The code
 * is replaced again at each wrap, so that a rule kept in one round and
 * trusted in the next would show (twice natively; once under an emulator
 * or ASan, where each bump past the wrap scans the cache slowly). */
static void test_generation_wrap(void) {
    enum { KEYS = 5 };
    struct mt_frame_rule r;
    uintptr_t key[KEYS];
    uint64_t bits[KEYS];
#ifdef __SANITIZE_ADDRESS__
    int rounds = 1;
#else
    int rounds = check_emulator() ? 1 : 2;
#endif
    current = 16;
    for (int j = 0; j < KEYS; j++) {
        key[j] = 0x401000 + 0x1000 * (uintptr_t)j;
        bits[j] = atomic_load(&mt_rules_generation) & 0x7fff;
        mt_rule_for(key[j], &r);
        CHECK_EQ(r.cfa_off, 16);
        mt_unwind_forget();
    }
    int stale = 0, asked = 0, zero = 0;
    for (int round = 1; round <= rounds; round++) {
        current = 4096 * round; /* the code at those addresses now */
        for (int i = 0; i < 32767; i++) {
            mt_unwind_forget();
            uint64_t now = atomic_load(&mt_rules_generation) & 0x7fff;
            zero += now == 0; /* the stored bits are never 0 */
            for (int j = 0; j < KEYS; j++)
                if (now == bits[j]) {
                    mt_rule_for(key[j], &r); /* kept again, under this generation */
                    stale += r.cfa_off != current;
                    asked++;
                }
        }
    }
    CHECK_EQ(zero, 0);
    CHECK_EQ(asked, rounds * KEYS);
    CHECK_EQ(stale, 0);
    current = 0;
}

/* A rule whose offsets do not fit the cache's bits is given up on, and so
 * it stays: asked again, the cache must not answer with the bits it would
 * have spilled into the flags, the kind and the generation. */
static void test_unpackable(void) {
    struct mt_frame_rule r;
    int32_t offsets[] = {-614416, -(8 << 16), -(8 << 20) - 8, -(8 << 27)};
    for (size_t i = 0; i < sizeof offsets / sizeof *offsets; i++) {
        uintptr_t ra = 0x500000 + 0x100 * (uintptr_t)i;
        far_bp = offsets[i];
        for (int ask = 0; ask < 2; ask++) {
            mt_rule_for(ra, &r);
            CHECK_EQ(r.kind, MT_RULE_UNSUPPORTED);
            CHECK_EQ(r.cfa_off, 0);
            CHECK_EQ(r.bp_off, 0);
        }
        far_bp = 0;
        mt_rule_for(ra + 0x10, &r); /* a neighbour that fits still does */
        CHECK_EQ(r.kind, MT_RULE_FRAME);
        CHECK_EQ(r.cfa_off, rule_of(ra + 0x10));
    }
}

int main(void) {
    test_unpackable();
    test_race();
    test_generation_wrap();
    printf("%d passed, %d failed\n", checks_passed, checks_failed);
    return checks_failed != 0;
}
