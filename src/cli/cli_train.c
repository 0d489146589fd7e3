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
#include "partrain/train.h"

static void usage(FILE *f) {
    fprintf(f, "usage: partrain train [--config FILE] [--set key=value ...] [--resume]\n"
               "                      [--nproc N | --backend shm|mpi]\n\n"
               "  --config FILE    JSON config (see configs/default.json)\n"
               "  --set key=value  override one key (repeatable, applied after --config)\n"
               "  --resume         continue from checkpoint.dir/latest (bitwise the same run)\n"
               "  --nproc N        fork N ranks on this machine (shm); parallel.dp x tp x pp\n"
               "                   must be N\n"
               "  --backend B      communication backend of this process's world (mpi: under\n"
               "                   mpirun -np N, each process a rank)\n\n");
    pt_config_print_help(f);
}

static int fail(const char *msg) {
    fprintf(stderr, "partrain: %s\n", msg);
    return 1;
}

typedef struct {
    const pt_config *cfg;
    int resume;
    pt_comm_options opt;
} run_args;

/* One rank (or the single worker when world is NULL). */
static int run(const pt_config *cfg, int resume, pt_comm *world) {
    int rank = world ? pt_comm_rank(world) : 0;
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, cfg, world);
    if (st == PT_OK && resume) st = pt_trainer_resume(t);
    if (st == PT_OK) st = pt_trainer_run(t);
    int rc = 0;
    if (st != PT_OK) {
        /* An error the ranks agreed on is printed once, by rank 0; a job
         * fault (a rank died, stalled or stopped taking part) once, by the
         * launcher or the rank that noticed it, naming the rank at fault. */
        int quiet = pt_comm_fault_reported(world, st);
        if (!quiet && world && pt_comm_size(world) > 1 && !pt_error_is_shared())
            fprintf(stderr, "partrain: rank %d: %s\n", rank, pt_error_message());
        else if (!quiet && rank == 0)
            fprintf(stderr, "partrain: %s\n", pt_error_message());
        rc = 1;
    }
    pt_trainer_free(t);
    return rc;
}

static int run_with_world(const pt_config *cfg, int resume, const pt_comm_options *opt) {
    pt_comm *world = NULL;
    if (pt_comm_init(&world, opt) != PT_OK) return fail(pt_error_message());
    if (pt_comm_size(world) > 1) pt_log_set_rank(pt_comm_rank(world));
    int rc = run(cfg, resume, world);
    pt_comm_free(world);
    return rc;
}

static int rank_main(void *arg) {
    const run_args *a = arg;
    return run_with_world(a->cfg, a->resume, &a->opt);
}

int pt_cli_train(int argc, char **argv) {
    const char *config = NULL, *backend = NULL;
    int resume = 0, nproc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--config") || !strcmp(a, "--set")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "partrain: %s needs a value (see partrain train --help)\n", a);
                return 2;
            }
            if (!strcmp(a, "--config"))
                config = argv[++i];
            else
                i++; /* applied below, after the file */
        } else if (!strncmp(a, "--config=", 9)) {
            config = a + 9;
        } else if (!strncmp(a, "--set=", 6)) {
            /* applied below */
        } else if (!strcmp(a, "--resume")) {
            resume = 1;
        } else if (!strcmp(a, "--nproc") || !strncmp(a, "--nproc=", 8)) {
            const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || end == v || *end || n < 1 || n > 1024) {
                fprintf(stderr,
                        "partrain: --nproc needs a number of ranks in [1, 1024] (got "
                        "'%s')\n",
                        v ? v : "");
                return 2;
            }
            nproc = (int)n;
        } else if (!strcmp(a, "--backend") || !strncmp(a, "--backend=", 10)) {
            backend = a[9] == '=' ? a + 10 : (i + 1 < argc ? argv[++i] : NULL);
            if (!backend ||
                (strcmp(backend, "shm") && strcmp(backend, "mpi") && strcmp(backend, "auto"))) {
                fprintf(stderr, "partrain: --backend must be shm, mpi or auto (got '%s')\n",
                        backend ? backend : "");
                return 2;
            }
        } else {
            fprintf(stderr, "partrain: unknown option '%s' (see partrain train --help)\n", a);
            return 2;
        }
    }
    pt_config cfg;
    pt_config_defaults(&cfg);
    if (config && pt_config_load_file(&cfg, config) != PT_OK) return fail(pt_error_message());
    for (int i = 1; i < argc; i++) {
        const char *set = NULL;
        if (!strcmp(argv[i], "--set"))
            set = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6))
            set = argv[i] + 6;
        else if (!strcmp(argv[i], "--config"))
            i++;
        if (set && pt_config_set(&cfg, set) != PT_OK) return fail(pt_error_message());
    }
    if (pt_config_validate(&cfg) != PT_OK) return fail(pt_error_message());
    if (!cfg.data.train[0])
        return fail("data.train is not set (in the config, or --set data.train=FILE)");
    if (nproc > 0) {
        if (backend && strcmp(backend, "shm") && strcmp(backend, "auto"))
            return fail("--nproc forks ranks with the shm backend; for mpi run under "
                        "mpirun -np N without --nproc");
        /* the mesh dp x tp x pp is the world (trainer_new.c checks it too,
         * for mpirun): said here once, before any rank is forked */
        long long mesh_n = (long long)cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp;
        if (mesh_n != nproc) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "parallel.dp = %d but --nproc %d: parallel.dp x parallel.tp x parallel.pp "
                     "(%d x %d x %d = %lld) must be the number of ranks (set parallel.dp=%d)",
                     cfg.parallel.dp, nproc, cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp,
                     mesh_n,
                     nproc / (cfg.parallel.tp * cfg.parallel.pp) > 0
                         ? nproc / (cfg.parallel.tp * cfg.parallel.pp)
                         : 1);
            return fail(msg);
        }
        run_args a = {&cfg, resume, {"shm", cfg.comm.timeout}};
        int code = 0;
        if (pt_launch(nproc, rank_main, &a, &a.opt, &code) != PT_OK)
            return fail(pt_error_message());
        return code == 0 ? 0 : 1;
    }
    if (backend) {
        pt_comm_options o = {backend, cfg.comm.timeout};
        return run_with_world(&cfg, resume, &o);
    }
    return run(&cfg, resume, NULL);
}
