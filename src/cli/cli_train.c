/* partrain train: build the config (defaults < --config FILE < --set, in
 * order), then run the trainer, optionally resuming from
 * checkpoint.dir/latest: one worker, or data parallel with --nproc N (the
 * shm launcher forks N ranks) or --backend mpi (under mpirun, each process a
 * rank). Errors: one line "partrain: ..." (with the rank) and exit 1. */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/comm.h"
#include "partrain/plan.h"
#include "partrain/train.h"

static void usage(FILE *f) {
    fprintf(f, "usage: partrain train [--config FILE | --plan FILE] [--set key=value ...]\n"
               "                      [--layout auto [--cluster FILE]] [--resume]\n"
               "                      [--nproc N | --backend shm|mpi]\n\n"
               "  --config FILE    JSON config (see configs/default.json)\n"
               "  --plan FILE      a plan file (partrain plan --write): its config, as planned;\n"
               "                   --set still applies on top\n"
               "  --layout auto    the planner picks the layout for the --nproc ranks (default\n"
               "                   1) and says why: the layout keys given by --set stay fixed,\n"
               "                   the config file's are replaced (docs/plan.md)\n"
               "  --cluster FILE   with --layout auto: plan on this cluster description instead\n"
               "                   of this machine's profile (partrain calibrate, measured once\n"
               "                   and cached)\n"
               "  --set key=value  override one key (repeatable, applied after --config)\n"
               "  --resume         continue from checkpoint.dir/latest (bitwise the same run)\n"
               "  --nproc N        fork N ranks on this machine (shm); parallel.dp x tp x pp\n"
               "                   must be N\n"
               "  --backend B      communication backend of this process's world (mpi: under\n"
               "                   mpirun -np N, each process a rank)\n\n"
               "Outputs are checked before any work: log.metrics and log.trace must be regular\n"
               "files or not exist yet (log.trace's folder must exist; log.metrics' is made),\n"
               "checkpoint.dir a directory or not exist yet; a FIFO, device, socket, or a\n"
               "directory where a file goes (a file where a directory goes), is refused.\n"
               "log.trace and checkpoint files are replaced whole or not at all; log.metrics\n"
               "is written line by line, each write checked.\n\n");
    pt_config_print_help(f);
}

typedef struct {
    const pt_config *cfg;
    int resume;
    pt_comm_options opt;
    const char *plan; /* the run record's plan (NULL: none) */
} run_args;

/* One rank (or the single worker when world is NULL); plan: what the run
 * was planned to be, for its run record (NULL: nothing). */
static int run(const pt_config *cfg, int resume, const char *plan, pt_comm *world) {
    int rank = world ? pt_comm_rank(world) : 0, size = pt_comm_size(world);
    pt_trainer *t = NULL;
    /* what the config alone decides is the same on every rank (under
     * --nproc the launcher checked it before forking; this is for mpirun) */
    pt_status st = pt_trainer_check(cfg, size, resume);
    if (st != PT_OK) pt_error_mark_shared();
    if (st == PT_OK) st = pt_trainer_new_dist(&t, cfg, world);
    if (st == PT_OK && plan) st = pt_trainer_set_plan(t, plan);
    if (st == PT_OK && resume) st = pt_trainer_resume(t);
    if (st == PT_OK) st = pt_trainer_run(t);
    int rc = 0;
    if (st != PT_OK) {
        /* One line for the job. A job fault (a rank died, stalled or
         * stopped taking part) is said by the launcher or the rank that
         * noticed it, naming the rank at fault; an error the ranks share
         * by rank 0; any other by the first rank to claim the job's error
         * line (the others hit the same, or stopped because of it). */
        int shared = pt_error_is_shared();
        if (!pt_comm_fault_reported(world, st) && (!shared || rank == 0) &&
            pt_comm_claim_error_line(world)) {
            if (size > 1 && !shared)
                fprintf(stderr, "partrain: rank %d: %s\n", rank, pt_error_message());
            else
                fprintf(stderr, "partrain: %s\n", pt_error_message());
        }
        pt_cli_error_trail();
        rc = 1;
    }
    pt_trainer_free(t);
    return rc;
}

static int run_with_world(const pt_config *cfg, int resume, const char *plan,
                          const pt_comm_options *opt) {
    pt_comm *world = NULL;
    if (pt_comm_new(&world, opt) != PT_OK) return pt_cli_fail(pt_error_message());
    if (pt_comm_size(world) > 1) pt_log_set_rank(pt_comm_rank(world));
    int rc = run(cfg, resume, plan, world);
    pt_comm_free(world);
    return rc;
}

static int rank_main(void *arg) {
    const run_args *a = arg;
    return run_with_world(a->cfg, a->resume, a->plan, &a->opt);
}

/* --nproc N: what the config alone decides, said once in this process;
 * then the shm launcher forks the N ranks. */
static int launch(const pt_config *cfg, int nproc, int resume, const char *plan) {
    /* the mesh dp x tp x pp is the world, in --nproc's words (pt_trainer_check
     * says it for mpirun) */
    long long mesh_n = (long long)cfg->parallel.dp * cfg->parallel.tp * cfg->parallel.pp;
    if (mesh_n != nproc) {
        char msg[256];
        int mp = cfg->parallel.tp * cfg->parallel.pp;
        if (nproc % mp != 0) /* no dp makes it: say what does not divide */
            snprintf(msg, sizeof msg,
                     "--nproc %d is not a multiple of parallel.tp x parallel.pp (%d x %d = "
                     "%d): parallel.dp x parallel.tp x parallel.pp must be the number of "
                     "ranks",
                     nproc, cfg->parallel.tp, cfg->parallel.pp, mp);
        else
            snprintf(msg, sizeof msg,
                     "parallel.dp = %d but --nproc %d: parallel.dp x parallel.tp x "
                     "parallel.pp (%d x %d x %d = %lld) must be the number of ranks (set "
                     "parallel.dp=%d)",
                     cfg->parallel.dp, nproc, cfg->parallel.dp, cfg->parallel.tp, cfg->parallel.pp,
                     mesh_n, nproc / mp);
        return pt_cli_fail(msg);
    }
    /* the rest of what the ranks would refuse without a file or a peer
     * (trainer_new.c), before any rank starts */
    if (pt_trainer_check(cfg, nproc, resume) != PT_OK) return pt_cli_fail(pt_error_message());
    run_args a = {cfg, resume, {"shm", cfg->comm.timeout}, plan};
    int code = 0;
    if (pt_launch(nproc, rank_main, &a, &a.opt, &code) != PT_OK)
        return pt_cli_fail(pt_error_message());
    return code == 0 ? 0 : 1;
}

/* The run, once its config is known: on --nproc ranks, on the --backend's
 * world, or one worker. */
static int start(const pt_config *cfg, int nproc, int resume, const char *backend,
                 const char *plan) {
    /* log.metrics, log.trace, checkpoint.dir: said once, before any rank is
     * forked or any step taken (the trainer checks them again, for mpirun) */
    if (pt_trainer_check_outputs(cfg) != PT_OK) return pt_cli_fail(pt_error_message());
    if (!cfg->data.train[0])
        return pt_cli_fail("data.train is not set (in the config, or --set data.train=FILE)");
    if (nproc > 0) {
        if (backend && strcmp(backend, "shm") && strcmp(backend, "auto"))
            return pt_cli_fail("--nproc forks ranks with the shm backend; for mpi run under "
                               "mpirun -np N without --nproc");
        return launch(cfg, nproc, resume, plan);
    }
    if (backend) {
        pt_comm_options o = {backend, cfg->comm.timeout};
        return run_with_world(cfg, resume, plan, &o);
    }
    return run(cfg, resume, plan, NULL);
}

int pt_cli_train(int argc, char **argv) {
    const char *backend = NULL, *plan = NULL, *layout = NULL, *cluster = NULL;
    int resume = 0, nproc = 0;
    pt_cli_config_args ca;
    if (pt_cli_config_args_init(&ca, argc) != 0) return 1;
    int rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            pt_cli_config_args_deinit(&ca);
            return 0;
        } else if ((r = pt_cli_config_arg(&ca, argc, argv, &i, "train")) != 0) {
            if (r < 0) rc = 2; /* applied below, after the walk: file first, then each --set */
        } else if ((r = pt_cli_option(argc, argv, &i, "--plan", "train", &v)) != 0) {
            if (r < 0) rc = 2;
            plan = v;
        } else if ((r = pt_cli_option(argc, argv, &i, "--layout", "train", &v)) != 0) {
            if (r < 0) rc = 2;
            layout = v;
            if (r > 0 && strcmp(layout, "auto")) {
                fprintf(stderr,
                        "partrain: --layout must be auto (got '%s'); a layout by hand is "
                        "the parallel.* keys\n",
                        layout);
                rc = 2;
            }
        } else if ((r = pt_cli_option(argc, argv, &i, "--cluster", "train", &v)) != 0) {
            if (r < 0) rc = 2;
            cluster = v;
        } else if (!strcmp(a, "--resume")) {
            resume = 1;
        } else if ((r = pt_cli_option(argc, argv, &i, "--nproc", "train", &v)) != 0) {
            if (r < 0 || !pt_cli_parse_int("--nproc", v, 1, 1024, &nproc)) rc = 2;
        } else if ((r = pt_cli_option(argc, argv, &i, "--backend", "train", &v)) != 0) {
            backend = v;
            if (r < 0) {
                rc = 2;
            } else if (strcmp(backend, "shm") && strcmp(backend, "mpi") &&
                       strcmp(backend, "auto")) {
                fprintf(stderr, "partrain: --backend must be shm, mpi or auto (got '%s')\n",
                        backend);
                rc = 2;
            }
        } else {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain train --help)\n", a);
            rc = 2;
        }
    }
    if (rc == 0 && plan && ca.config) {
        fprintf(stderr, "partrain: train takes --config or --plan, not both (a plan file holds "
                        "its whole config)\n");
        rc = 2;
    }
    if (rc == 0 && cluster && !layout) {
        fprintf(stderr, "partrain: --cluster is for --layout auto\n");
        rc = 2;
    }
    if (rc == 0 && layout && plan) {
        fprintf(stderr, "partrain: --layout auto plans the layout, a plan file holds one: "
                        "give one of them\n");
        rc = 2;
    }
    if (rc == 0 && layout && backend && strcmp(backend, "shm") && strcmp(backend, "auto")) {
        fprintf(stderr, "partrain: --layout auto plans for this machine's --nproc ranks; under "
                        "mpirun, plan with partrain plan --write FILE and run train --plan FILE\n");
        rc = 2;
    }
    pt_config cfg;
    char *plan_json = NULL; /* the run record's plan */
    if (rc == 0 && plan) {
        /* the plan's config in place of --config; each --set on top */
        pt_config_defaults(&cfg);
        pt_status st = pt_plan_file_load(plan, &cfg);
        for (int k = 0; st == PT_OK && k < ca.nsets; k++) st = pt_config_set(&cfg, ca.sets[k]);
        if (st == PT_OK) st = pt_config_validate(&cfg);
        if (st != PT_OK) rc = pt_cli_fail(pt_error_message());
        if (rc == 0) plan_json = pt_cli_plan_file_json(plan);
    } else if (rc == 0 && layout) {
        /* the file and each --set, then the planned layout over them */
        pt_config_defaults(&cfg);
        pt_status st = ca.config ? pt_config_load_file(&cfg, ca.config) : PT_OK;
        for (int k = 0; st == PT_OK && k < ca.nsets; k++) st = pt_config_set(&cfg, ca.sets[k]);
        if (st == PT_OK) st = pt_model_config_validate(&cfg.model);
        if (st == PT_OK)
            st = pt_cli_layout_auto(&cfg, &ca, nproc > 0 ? nproc : 1, cluster, &plan_json);
        if (st != PT_OK) rc = pt_cli_fail(pt_error_message());
    } else if (rc == 0 && pt_cli_config_build(&ca, &cfg) != PT_OK) {
        rc = pt_cli_fail(pt_error_message());
    }
    pt_cli_config_args_deinit(&ca);
    if (rc == 0) rc = start(&cfg, nproc, resume, backend, plan_json);
    free(plan_json);
    return rc;
}
