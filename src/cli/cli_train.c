/* partrain train: build the config (defaults < --config FILE < --set, in
 * order), then run the trainer, optionally resuming from
 * checkpoint.dir/latest: one worker, or data parallel with --nproc N (the
 * shm launcher forks N ranks, and restarts a failed job with
 * --max-restarts: cli_restart.c) or --backend mpi (under mpirun, each
 * process a rank). Errors: one line "partrain: ..." (with the rank) and
 * exit 1. */
#include "cli_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "partrain/comm.h"
#include "partrain/plan.h"
#include "partrain/train.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: partrain train [--config FILE | --plan FILE] [--set key=value ...]\n"
        "                      [--layout auto [--cluster FILE]] [--resume[=auto]]\n"
        "                      [--nproc N [--max-restarts K [--elastic]] | --backend shm|mpi]\n\n"
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
        "  --resume=auto    the same when checkpoint.dir holds a checkpoint, else start\n"
        "                   from the beginning (what a restart does: mpirun-restart.sh)\n"
        "  --nproc N        fork N ranks on this machine (shm); parallel.dp x tp x pp\n"
        "                   must be N\n"
        "  --max-restarts K with --nproc: when a rank dies, stalls or stops taking part,\n"
        "                   start the job again from the newest checkpoint (needs\n"
        "                   checkpoint.dir), at most K times, one line each; an error a\n"
        "                   rank reports itself is not restarted (docs/comm.md)\n"
        "  --elastic        with --max-restarts: restart with the ranks that are left (one\n"
        "                   fewer each time) on the layout the planner picks for them\n"
        "                   (--layout auto's; --cluster FILE, else this machine's\n"
        "                   profile), the --set layout keys held but parallel.dp, tp, pp\n"
        "  --backend B      communication backend of this process's world (mpi: under\n"
        "                   mpirun -np N, each process a rank)\n\n"
        "Outputs are checked before any work: log.metrics and log.trace must be regular\n"
        "files or not exist yet (log.trace's folder must exist; log.metrics' is made),\n"
        "checkpoint.dir a directory or not exist yet, log.flight a directory (DIR/) or a\n"
        "prefix in an existing folder; a FIFO, device, socket, or a directory where a\n"
        "file goes (a file where a directory goes), is refused. log.trace, flight dumps\n"
        "and checkpoint files are replaced whole or not at all; log.metrics is written\n"
        "line by line, each write checked.\n\n"
        "A rank that dies, stalls or stops taking part ends the job with one line that\n"
        "names it and, from the flight recorder, the group, the operation and its number\n"
        "the others wait in and who never arrived (docs/comm.md); with log.flight every\n"
        "surviving rank writes its recorder, `partrain flight DIR` merges them.\n"
        "Exit status: 0 done, 1 an error, 2 a bad command line, 3 (a rank under mpirun)\n"
        "the job failed because a rank died, stalled or did not take part: a restart\n"
        "may help (scripts/mpirun-restart.sh restarts on it, docs/mpi.md).\n\n");
    pt_config_print_help(f);
}

typedef struct {
    const pt_config *cfg;
    int resume;
    pt_comm_options opt;
    const char *plan; /* the run record's plan (NULL: none) */
} run_args;

/* log.flight, checked as every output is, before any work: a directory
 * (ending in '/', or one that exists; made when missing) or a prefix whose
 * first file must be writable. */
static pt_status check_flight(const char *f) {
    if (!f[0]) return PT_OK;
    size_t n = strlen(f);
    struct stat sb;
    pt_status st;
    char first[PT_CONFIG_STR_MAX + 32];
    if (f[n - 1] == '/' || (stat(f, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        st = pt_dir_check_output(f);
    } else {
        snprintf(first, sizeof first, "%s-rank0.json", f);
        st = pt_file_check_output(first, 0);
    }
    if (st == PT_OK) return PT_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "log.flight: %s", msg);
}

/* The comm layer's part of the config, on this process's world. */
static pt_status comm_settings(const pt_config *cfg, pt_comm *world) {
    pt_comm_set_flight(world, cfg->log.flight);
    return pt_comm_set_check_order(world, cfg->comm.check_order);
}

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
        rc = pt_comm_fault_restartable(st) ? 3 : 1; /* 3: a restart may help (mpirun) */
    }
    pt_trainer_free(t);
    return rc;
}

static int run_with_world(const pt_config *cfg, int resume, const char *plan,
                          const pt_comm_options *opt) {
    pt_comm *world = NULL;
    if (pt_comm_new(&world, opt) != PT_OK) return pt_cli_fail(pt_error_message());
    if (pt_comm_size(world) > 1) pt_log_set_rank(pt_comm_rank(world));
    if (comm_settings(cfg, world) != PT_OK) {
        int rc = pt_cli_fail(pt_error_message());
        pt_comm_free(world);
        return rc;
    }
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
int pt_cli_launch(const pt_config *cfg, int nproc, int resume, const char *plan,
                  pt_launch_result *res) {
    *res = (pt_launch_result){1, 0, -1};
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
        pt_cli_fail(msg);
        return 2;
    }
    /* the rest of what the ranks would refuse without a file or a peer
     * (trainer_new.c), before any rank starts */
    if (pt_trainer_check(cfg, nproc, resume) != PT_OK) {
        pt_cli_fail(pt_error_message());
        return 2;
    }
    run_args a = {cfg, resume, {"shm", cfg->comm.timeout}, plan};
    if (pt_launch_job(nproc, rank_main, &a, &a.opt, res) != PT_OK) {
        pt_cli_fail(pt_error_message());
        return 2;
    }
    return res->exit_code == 0 ? 0 : 1;
}

/* The command line of train. */
typedef struct {
    const char *backend, *plan, *layout, *cluster;
    int resume; /* 0, 1 (--resume), 2 (--resume=auto) */
    int nproc, max_restarts, elastic;
    pt_cli_config_args ca;
} train_args;

/* One option of argv at *i into t: 0 when fine, 2 after a line saying
 * what is wrong, 3 for --help. */
static int parse_one(train_args *t, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = NULL;
    int r;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) return 3;
    if (!strcmp(a, "--help=markdown")) return 4; /* hidden: docs/reference.md's key table */
    if ((r = pt_cli_config_arg(&t->ca, argc, argv, i, "train")) != 0)
        return r < 0 ? 2 : 0; /* applied after the walk: file first, then each --set */
    if ((r = pt_cli_option(argc, argv, i, "--plan", "train", &t->plan)) != 0) return r < 0 ? 2 : 0;
    if ((r = pt_cli_option(argc, argv, i, "--cluster", "train", &t->cluster)) != 0)
        return r < 0 ? 2 : 0;
    if ((r = pt_cli_option(argc, argv, i, "--layout", "train", &t->layout)) != 0) {
        if (r > 0 && strcmp(t->layout, "auto")) {
            fprintf(stderr,
                    "partrain: --layout must be auto (got '%s'); a layout by hand is the "
                    "parallel.* keys\n",
                    t->layout);
            return 2;
        }
        return r < 0 ? 2 : 0;
    }
    if (!strcmp(a, "--resume") || !strcmp(a, "--resume=auto")) {
        t->resume = a[8] ? 2 : 1;
        return 0;
    }
    if (!strcmp(a, "--elastic")) {
        t->elastic = 1;
        return 0;
    }
    if ((r = pt_cli_option(argc, argv, i, "--nproc", "train", &v)) != 0)
        return r < 0 || !pt_cli_parse_int("--nproc", v, 1, 1024, &t->nproc) ? 2 : 0;
    if ((r = pt_cli_option(argc, argv, i, "--max-restarts", "train", &v)) != 0)
        return r < 0 || !pt_cli_parse_int("--max-restarts", v, 0, 1000, &t->max_restarts) ? 2 : 0;
    if ((r = pt_cli_option(argc, argv, i, "--backend", "train", &t->backend)) != 0) {
        if (r > 0 && strcmp(t->backend, "shm") && strcmp(t->backend, "mpi") &&
            strcmp(t->backend, "auto")) {
            fprintf(stderr, "partrain: --backend must be shm, mpi or auto (got '%s')\n",
                    t->backend);
            return 2;
        }
        return r < 0 ? 2 : 0;
    }
    fprintf(stderr, "partrain: unknown option '%s' (see partrain train --help)\n", a);
    return 2;
}

/* Options that do not go together: 2 after a line saying which. */
static int check_combos(const train_args *t) {
    const char *why = NULL;
    int mpi = t->backend && strcmp(t->backend, "shm") && strcmp(t->backend, "auto");
    if (t->plan && t->ca.config)
        why = "train takes --config or --plan, not both (a plan file holds its whole config)";
    else if (t->cluster && !t->layout && !t->elastic)
        why = "--cluster is for --layout auto and --elastic";
    else if (t->layout && t->plan)
        why = "--layout auto plans the layout, a plan file holds one: give one of them";
    else if (t->layout && mpi)
        why = "--layout auto plans for this machine's --nproc ranks; under mpirun, plan with "
              "partrain plan --write FILE and run train --plan FILE";
    else if (t->elastic && !t->max_restarts)
        why = "--elastic is a way to restart: give --max-restarts K too";
    else if (t->max_restarts && !t->nproc)
        why = "--max-restarts restarts the ranks that --nproc forks; under mpirun, "
              "scripts/mpirun-restart.sh restarts the job (docs/mpi.md)";
    if (!why) return 0;
    fprintf(stderr, "partrain: %s\n", why);
    return 2;
}

/* The config: a plan file's, or the file's and each --set, planned with
 * --layout auto; *plan: the run record's plan (malloc'd; NULL: none). */
static pt_status build_config(const train_args *t, pt_config *cfg, char **plan) {
    const pt_cli_config_args *ca = &t->ca;
    *plan = NULL;
    if (!t->plan && !t->layout) return pt_cli_config_build(ca, cfg);
    pt_config_defaults(cfg);
    pt_status st = t->plan      ? pt_plan_file_load(t->plan, cfg)
                   : ca->config ? pt_config_load_file(cfg, ca->config)
                                : PT_OK;
    for (int k = 0; st == PT_OK && k < ca->nsets; k++) st = pt_config_set(cfg, ca->sets[k]);
    if (st != PT_OK) return st;
    if (t->plan) { /* the plan's config, each --set on top */
        PT_CHECK(pt_config_validate(cfg));
        *plan = pt_cli_plan_file_json(t->plan);
        return PT_OK;
    }
    PT_CHECK(pt_model_config_validate(&cfg->model));
    return pt_cli_layout_auto(cfg, ca, t->nproc > 0 ? t->nproc : 1, t->cluster, plan);
}

/* What runs: --nproc ranks (restarted as asked), a world of mpirun, or one
 * worker. */
static int start(const train_args *t, pt_config *cfg, char **plan) {
    int resume = t->resume;
    if (resume == 2) { /* --resume=auto */
        char stepdir[PT_CONFIG_STR_MAX + 64];
        if (!cfg->checkpoint.dir[0]) return pt_cli_fail("--resume=auto needs checkpoint.dir");
        resume = pt_cli_checkpoint_exists(cfg, stepdir, sizeof stepdir);
    }
    if (t->max_restarts && !cfg->checkpoint.dir[0])
        return pt_cli_fail("--max-restarts needs checkpoint.dir: a restart resumes from its "
                           "newest checkpoint");
    if (t->nproc > 0) {
        if (t->backend && strcmp(t->backend, "shm") && strcmp(t->backend, "auto"))
            return pt_cli_fail("--nproc forks ranks with the shm backend; for mpi run under "
                               "mpirun -np N without --nproc");
        pt_cli_restart r = {t->max_restarts, t->elastic, t->cluster, &t->ca};
        return pt_cli_train_restarts(cfg, t->nproc, resume, plan, &r);
    }
    if (t->backend) {
        pt_comm_options o = {t->backend, cfg->comm.timeout};
        return run_with_world(cfg, resume, *plan, &o);
    }
    return run(cfg, resume, *plan, NULL);
}

int pt_cli_train(int argc, char **argv) {
    train_args t = {0};
    if (pt_cli_config_args_init(&t.ca, argc) != 0) return 1;
    int rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) rc = parse_one(&t, argc, argv, &i);
    if (rc == 4) {
        pt_config_print_markdown(stdout);
        pt_cli_config_args_deinit(&t.ca);
        return 0;
    }
    if (rc == 3) {
        usage(stdout);
        pt_cli_config_args_deinit(&t.ca);
        return 0;
    }
    if (rc == 0) rc = check_combos(&t);
    pt_config cfg;
    char *plan = NULL; /* the run record's plan */
    if (rc == 0 && build_config(&t, &cfg, &plan) != PT_OK) rc = pt_cli_fail(pt_error_message());
    if (rc != 0) {
        pt_cli_config_args_deinit(&t.ca);
        free(plan);
        return rc;
    }
    /* log.metrics, log.trace, checkpoint.dir, log.flight: said once, before
     * any rank is forked or any step taken (the trainer checks them again,
     * for mpirun) */
    if (pt_trainer_check_outputs(&cfg) != PT_OK || check_flight(cfg.log.flight) != PT_OK)
        rc = pt_cli_fail(pt_error_message());
    else if (!cfg.data.train[0])
        rc = pt_cli_fail("data.train is not set (in the config, or --set data.train=FILE)");
    else
        rc = start(&t, &cfg, &plan);
    pt_cli_config_args_deinit(&t.ca); /* after: the restarts plan with its --set */
    free(plan);
    return rc;
}
