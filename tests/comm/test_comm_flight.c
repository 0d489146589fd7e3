/* The flight recorder's job: a loop of collectives on named groups, 4
 * ranks, that the debugging knob PT_FAULT breaks on purpose (one rank
 * skips, defers, dies or stops at one collective). Driven by
 * flight_test.sh, which checks the job's one line, its time and the
 * dumps; this program only runs the job:
 *
 *   test_comm_flight --backend shm --nproc 4 [options]   launches its ranks
 *   mpirun -np 4 test_comm_flight --backend mpi [options] each process a rank
 *   options: --timeout S (comm timeout, default 3)  --flight PATH (dumps)
 *            --check-order  --iters N (default 40)
 *
 * Groups: the world; "dp" groups {0,1} and {2,3} (indices 0 and 1); "tp"
 * groups {0,2} and {1,3}. Iteration i: a 64 KiB all-reduce on dp (dp #2i-1),
 * a barrier on the world, a 4 KiB all-reduce on tp, a 4 KiB all-reduce on
 * dp (dp #2i). So dp #5 is followed on each rank by an operation of
 * another group (a rank that skips or defers it leaves its dp partner
 * waiting while it waits in the world's barrier), and dp #6 by dp #7 (a
 * rank that defers #6 runs #7 first: operations out of order in one
 * group, what comm.check_order stops).
 *
 * Exit: 0 when the loop completed (no fault), 1 on an error (the job's line
 * says which), 2 on bad usage. Each rank sleeps 20 ms an iteration, so
 * that the fault comes while the others are at work. */
#include "partrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *backend, *flight;
    double timeout_s;
    int check_order, iters;
} config;

static pt_status loop(pt_comm *world, pt_comm *dp, pt_comm *tp, int iters) {
    static float big[16384], small[1024], other[1024];
    for (int i = 0; i < iters; i++) {
        pt_comm_note_step(world, i);
        PT_CHECK(pt_comm_allreduce(dp, big, 16384, PT_REDUCE_SUM));
        PT_CHECK(pt_comm_barrier(world));
        PT_CHECK(pt_comm_allreduce(tp, other, 1024, PT_REDUCE_SUM));
        PT_CHECK(pt_comm_allreduce(dp, small, 1024, PT_REDUCE_SUM));
        usleep(20000);
    }
    return PT_OK;
}

static int rank_main(void *arg) {
    const config *cfg = arg;
    pt_comm_options opt = {cfg->backend, cfg->timeout_s};
    pt_comm *world = NULL, *dp = NULL, *tp = NULL;
    if (pt_comm_new(&world, &opt) != PT_OK) {
        fprintf(stderr, "pt_comm_new: %s\n", pt_error_message());
        return 1;
    }
    int r = pt_comm_rank(world);
    pt_comm_set_flight(world, cfg->flight);
    pt_status st = pt_comm_set_check_order(world, cfg->check_order);
    if (st == PT_OK) st = pt_comm_split(world, r / 2, r, &dp);
    if (st == PT_OK) st = pt_comm_split(world, r % 2, r, &tp);
    if (st == PT_OK) {
        pt_comm_set_name(dp, "dp", r / 2);
        pt_comm_set_name(tp, "tp", r % 2);
        st = loop(world, dp, tp, cfg->iters);
    }
    if (st != PT_OK && !pt_comm_fault_reported(world, st) && pt_comm_claim_error_line(world))
        fprintf(stderr, "partrain: rank %d: %s\n", r, pt_error_message());
    pt_comm_free(tp);
    pt_comm_free(dp);
    pt_comm_free(world);
    return st == PT_OK ? 0 : 1;
}

int main(int argc, char **argv) {
    config cfg = {"shm", NULL, 3, 0, 60};
    int nproc = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            cfg.backend = argv[++i];
        else if (!strcmp(argv[i], "--nproc") && i + 1 < argc)
            nproc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            cfg.timeout_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--flight") && i + 1 < argc)
            cfg.flight = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            cfg.iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check-order"))
            cfg.check_order = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--backend shm|mpi] [--nproc N] [--timeout S] [--flight PATH] "
                    "[--check-order] [--iters N]\n",
                    argv[0]);
            return 2;
        }
    }
    if (strcmp(cfg.backend, "shm") != 0) return rank_main(&cfg); /* started by mpirun */
    pt_comm_options opt = {"shm", cfg.timeout_s};
    pt_launch_result res;
    if (pt_launch_job(nproc, rank_main, &cfg, &opt, &res) != PT_OK) {
        fprintf(stderr, "pt_launch: %s\n", pt_error_message());
        return 2;
    }
    return res.exit_code ? 1 : 0;
}
