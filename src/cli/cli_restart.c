/* partrain train --max-restarts K [--elastic]: when a rank of a --nproc job
 * dies (killed, crashed, stalled or stopped taking part: a job fault, as the
 * launcher tells it), the launcher has already ended the job; this starts
 * it again from the newest checkpoint (or from the start when there is none
 * yet), up to K times, one line each. With --elastic the restarted job has
 * one rank fewer, the rank that failed (a lost machine), on the layout the
 * planner picks for the ranks that are left (train --layout auto's
 * planner, holding the user's --set layout keys fixed except the three
 * that depend on the number of ranks, parallel.dp, tp and pp); the
 * checkpoint, saved under the old layout, loads under the new one.
 *
 * Not restarted: an error a rank reports itself (a bad file: it would
 * happen again), operations out of order (comm.check_order: a bug),
 * Ctrl-C. The fault-injection knob PT_FAULT acts in the first run only.
 *
 * Not here: the launch itself (cli_train.c), the planner's choice
 * (cli_layout.c), resuming (the trainer). Under mpirun the same is
 * scripts/mpirun-restart.sh (docs/mpi.md). */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/comm.h"

int pt_cli_checkpoint_exists(const pt_config *cfg, char *stepdir, size_t n) {
    if (!cfg->checkpoint.dir[0]) return 0;
    char saved[512];
    snprintf(saved, sizeof saved, "%s", pt_error_message());
    int ok = pt_checkpoint_resolve(cfg->checkpoint.dir, stepdir, n) == PT_OK;
    if (!ok) pt_error_set(PT_OK, "%s", saved); /* "no checkpoint yet" is no error here */
    return ok;
}

/* The --set layout keys the elastic planner holds fixed: all but the
 * three the number of ranks decides. */
static pt_status elastic_args(const pt_cli_config_args *a, pt_cli_config_args *out) {
    out->config = a->config;
    out->nsets = 0;
    out->sets = malloc(sizeof *out->sets * (size_t)(a->nsets + 1));
    if (!out->sets) return pt_error_set(PT_ERR_NOMEM, "out of memory");
    for (int k = 0; k < a->nsets; k++) {
        const char *s = a->sets[k];
        if (!strncmp(s, "parallel.dp=", 12) || !strncmp(s, "parallel.tp=", 12) ||
            !strncmp(s, "parallel.pp=", 12))
            continue;
        out->sets[out->nsets++] = s;
    }
    return PT_OK;
}

/* cfg's layout for `world` ranks, as the planner picks it; *plan: the run
 * record's new plan (replaced). */
static pt_status replan(pt_config *cfg, const pt_cli_config_args *a, int world, const char *cluster,
                        char **plan) {
    pt_cli_config_args ea = {0};
    PT_CHECK(elastic_args(a, &ea));
    /* the layout keys return to one worker's, so that the planner's
     * choice is not checked against the old world */
    cfg->parallel.dp = world;
    cfg->parallel.tp = cfg->parallel.pp = 1;
    char *fresh = NULL;
    pt_status st = pt_cli_layout_auto(cfg, &ea, world, cluster, &fresh);
    free(ea.sets);
    if (st == PT_OK) {
        free(*plan);
        *plan = fresh;
    }
    return st;
}

int pt_cli_train_restarts(pt_config *cfg, int nproc, int resume, char **plan,
                          const pt_cli_restart *r) {
    int attempt = 0;
    for (;;) {
        pt_launch_result res;
        int rc = pt_cli_launch(cfg, nproc, resume, *plan, &res);
        if (rc == 0 || rc == 2) return rc != 0; /* done, or could not start at all */
        if (!res.fault || attempt >= r->max_restarts) return 1;
        attempt++;
        pt_comm_faults_off(); /* the fault knob acts in the first run only */
        if (r->elastic) {
            nproc--;
            if (nproc < 1) return pt_cli_fail("--elastic: no rank is left to restart the job with");
            if (replan(cfg, r->args, nproc, r->cluster, plan) != PT_OK)
                return pt_cli_fail(pt_error_message());
        }
        char stepdir[PT_CONFIG_STR_MAX + 64], layout[160];
        resume = pt_cli_checkpoint_exists(cfg, stepdir, sizeof stepdir);
        snprintf(layout, sizeof layout, "dp %d x tp %d x pp %d", cfg->parallel.dp, cfg->parallel.tp,
                 cfg->parallel.pp);
        fprintf(stderr,
                "partrain: restart %d of %d after rank %d's failure: %s%s, %d rank%s (%s)\n",
                attempt, r->max_restarts, res.culprit, resume ? "resuming from " : "from the start",
                resume ? stepdir : " (no checkpoint yet)", nproc, nproc > 1 ? "s" : "", layout);
    }
}
