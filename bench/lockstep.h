/*
 * Lockstep: processes that take turns, a slice each, so that what the
 * machine does over seconds falls on all of them alike.
 *
 * Run side by side, whole runs of one benchmark vary by a tenth or more
 * here (the load beside this machine comes and goes), and a ratio of two
 * such runs is no better.  Taking turns a few milliseconds long, process
 * after process, each slice is compared with the others' of the same turn
 * instead.  The order of each turn is another shuffle of the processes
 * (the same in all of them, drawn from the turn's number), so that no
 * process always follows the same other one: the one before leaves the
 * caches, the branch predictors and the processor's clock in a state of
 * its own.
 *
 * The environment says how: CHURN_RING="DIR N I", process I of N, with
 * fifos DIR/0 ... DIR/N-1, one each, on which it is told its turn.  The
 * first turn (-1) is the setup's, in the order 0 ... N-1; whoever starts
 * the ring writes a byte to DIR/0.
 */
#ifndef LOCKSTEP_H
#define LOCKSTEP_H

#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define LOCKSTEP_MAX 64

struct lockstep {
    int n, me;
    int fd[LOCKSTEP_MAX];
};

/* 1 with ls set up from CHURN_RING, 0 when it is not set, -1 on an error
 * (said on stderr). */
static int lockstep_open(struct lockstep *ls) {
    const char *ring = getenv("CHURN_RING");
    if (!ring)
        return 0;
    char dir[4096];
    if (sscanf(ring, "%4095s %d %d", dir, &ls->n, &ls->me) != 3 || ls->n < 1 ||
        ls->n > LOCKSTEP_MAX || ls->me < 0 || ls->me >= ls->n) {
        fprintf(stderr, "lockstep: CHURN_RING is \"DIR N I\", 0 <= I < N <= %d\n", LOCKSTEP_MAX);
        return -1;
    }
    for (int i = 0; i < ls->n; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%d", dir, i);
        /* Read and write: opening never waits for the other end, and a
         * byte handed to a process that has finished finds a reader still. */
        if ((ls->fd[i] = open(path, O_RDWR)) < 0) {
            perror(path);
            return -1;
        }
    }
    return 1;
}

/* The order of turn t: 0 .. n-1 for the setup's (t = -1), else a shuffle
 * of them drawn from t. */
static void lockstep_order(int n, long t, int *order) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(t + 1) | 1;
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = n - 1; t >= 0 && i > 0; i--) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        int j = (int)(s % (uint64_t)(i + 1)), x = order[i];
        order[i] = order[j], order[j] = x;
    }
}

/* A turn that does not come within this long will not come: a process of
 * the ring has died, and the others end too instead of waiting forever. */
#define LOCKSTEP_PATIENCE_MS 120000

static void lockstep_io(int fd, int out) {
    char c = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (!out && poll(&p, 1, LOCKSTEP_PATIENCE_MS) == 0) {
        fprintf(stderr, "lockstep: no turn in %d s; did another process of the ring die?\n",
                LOCKSTEP_PATIENCE_MS / 1000);
        exit(1);
    }
    if ((out ? write(fd, &c, 1) : read(fd, &c, 1)) != 1) {
        perror("lockstep");
        exit(1);
    }
}

/* Waits for this process's turn. */
static void lockstep_wait(const struct lockstep *ls) { lockstep_io(ls->fd[ls->me], 0); }

/* Ends this process's part of turn t: hands on to the next in its order,
 * or to the first of turn t + 1. */
static void lockstep_hand_on(const struct lockstep *ls, long t) {
    int order[LOCKSTEP_MAX], place = 0;
    lockstep_order(ls->n, t, order);
    while (order[place] != ls->me)
        place++;
    int next =
        place + 1 < ls->n ? order[place + 1] : (lockstep_order(ls->n, t + 1, order), order[0]);
    lockstep_io(ls->fd[next], 1);
}

#endif
