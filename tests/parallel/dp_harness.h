/* The rank-running harness shared by the data-parallel and ZeRO tests
 * (tests/parallel/test_dp.c, tests/zero/test_zero.c): a job (config plus
 * what to do), run on dp ranks as real processes (pt_launch on shm, or this
 * process as one rank under mpirun with --mpi), and its result from rank 0
 * (per-step loss, comm bytes, per-rank memory peaks, final parameters) to
 * compare with the one-worker run of the same config, the oracle.
 *
 * Header-only and static: each test executable includes it once. */
#ifndef PT_DP_HARNESS_H
#define PT_DP_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/comm.h"
#include "partrain/train.h"
#include "pt_test.h"

static char tmpdir[256];
static int use_mpi;
static pt_comm *mpi_world;

static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

/* Learnable text: sentences of words picked by a fixed generator. */
static void write_text(const char *path, size_t n, uint32_t seed) {
    static const char *words[] = {"the ",  "quick ", "brown ", "fox ", "jumps ", "over ",
                                  "lazy ", "dog ",   "and ",   "cat ", "runs ",  ". "};
    FILE *f = fopen(path, "w");
    uint32_t x = seed;
    size_t written = 0;
    while (written < n) {
        x = x * 1664525u + 1013904223u;
        const char *w = words[(x >> 24) % 12];
        fputs(w, f);
        written += strlen(w);
    }
    fclose(f);
}

static void tiny_config(pt_config *c, int dp) {
    pt_config_defaults(c);
    c->model = (pt_model_config){2, 32, 2, 64, 16};
    c->train.steps = 20;
    c->train.batch_size = 8;
    c->train.threads = 1;
    c->train.warmup_steps = 5;
    c->train.lr = 3e-3;
    c->train.min_lr = 3e-4;
    c->train.val_every = 0;
    c->parallel.dp = dp;
}

typedef struct {
    pt_config cfg;
    int use_data;  /* 1: pt_trainer_step on data.train (vocab must be 256) */
    int stop_at;   /* > 0: save a checkpoint after this step and stop */
    int resume;    /* resume from checkpoint.dir first */
    int mirror;    /* 1: the global batch's second half repeats its first (dp 2: both ranks
                      compute the same gradient) */
    char dump[32]; /* non-empty: every rank writes its parameters and AdamW moments after
                      step dump_at and after its last step (dump_state) */
    int dump_at;
    char out[512];
} job;

#define MAX_STEPS 64
typedef struct {
    int nsteps;
    size_t nparams;
    float loss[MAX_STEPS];
    uint64_t bytes[MAX_STEPS];
    int applied[MAX_STEPS];
    float val_loss;
    size_t mem[4][3]; /* per rank (up to 4): peak params, grads, optim bytes over the steps */
    float *params;
} result;

static void result_free(result *r) {
    free(r->params);
    r->params = NULL;
}

/* Tokens of step s (the global batch), the same on every rank. */
static void step_tokens(const pt_config *c, int s, int *in, int *tg) {
    int n = c->train.batch_size * c->model.seq_len;
    uint64_t key = pt_rng_key(7, "test_dp.tokens");
    for (int i = 0; i < n; i++) {
        int v = (int)(pt_rng_uniform_at(key, (uint64_t)s * 4096 + (uint64_t)i) * 16);
        in[i] = v;
        tg[i] = (v * 3 + 1) % c->model.vocab_size; /* learnable: a function of the input */
    }
}

/* This rank's parameters, then AdamW m and v, as raw floats to
 * tmp_path("<dump>.s<step>.r<rank>"), for bitwise comparison of every
 * rank's state (the result carries rank 0's parameters only). */
static pt_status dump_state(const job *j, pt_trainer *t, pt_comm *world) {
    char name[96];
    snprintf(name, sizeof name, "%s.s%d.r%d", j->dump, pt_trainer_step_count(t),
             world ? pt_comm_rank(world) : 0);
    const char *path = tmp_path(name);
    pt_model *m = pt_trainer_model(t);
    pt_adamw *o = pt_trainer_optim(t);
    size_t n = pt_model_num_params(m);
    FILE *f = fopen(path, "wb");
    if (!f) return pt_error_set(PT_ERR_IO, "%s: cannot write", path);
    int ok = fwrite(pt_model_params(m), sizeof(float), n, f) == n;
    if (o)
        ok = ok && fwrite(pt_adamw_m(o), sizeof(float), n, f) == n &&
             fwrite(pt_adamw_v(o), sizeof(float), n, f) == n;
    if (fclose(f) != 0) ok = 0;
    return ok ? PT_OK : pt_error_set(PT_ERR_IO, "%s: write failed", path);
}

static pt_status run_job(const job *j, pt_comm *world, result *r) {
    memset(r, 0, sizeof *r);
    pt_trainer *t = NULL;
    PT_CHECK(pt_trainer_new_dist(&t, &j->cfg, world));
    pt_status st = PT_OK;
    int n = j->cfg.train.batch_size * j->cfg.model.seq_len;
    int *in = malloc((size_t)n * sizeof(int)), *tg = malloc((size_t)n * sizeof(int));
    if (j->resume) PT_CHECK_GOTO(st, pt_trainer_resume(t), done);
    for (int s = pt_trainer_step_count(t); s < j->cfg.train.steps; s++) {
        pt_step_info info;
        if (j->use_data) {
            PT_CHECK_GOTO(st, pt_trainer_step(t, &info), done);
        } else {
            step_tokens(&j->cfg, s, in, tg);
            if (j->mirror) {
                memcpy(in + n / 2, in, (size_t)(n / 2) * sizeof(int));
                memcpy(tg + n / 2, tg, (size_t)(n / 2) * sizeof(int));
            }
            PT_CHECK_GOTO(st, pt_trainer_step_batch(t, in, tg, &info), done);
        }
        size_t cats[3] = {pt_mem_peak(PT_MEM_PARAMS), pt_mem_peak(PT_MEM_GRADS),
                          pt_mem_peak(PT_MEM_OPTIM)};
        for (int k = 0; k < 3; k++)
            if (cats[k] > r->mem[0][k]) r->mem[0][k] = cats[k];
        r->loss[s] = info.loss;
        r->bytes[s] = info.comm_bytes;
        r->applied[s] = info.applied;
        r->nsteps = s + 1;
        if (j->dump[0] && j->dump_at == s + 1) PT_CHECK_GOTO(st, dump_state(j, t, world), done);
        if (j->stop_at == s + 1) {
            PT_CHECK_GOTO(st, pt_trainer_save(t), done);
            break;
        }
    }
    if (j->dump[0]) PT_CHECK_GOTO(st, dump_state(j, t, world), done);
    if (world && pt_comm_size(world) <= 4) {
        /* every rank's peaks to every rank (floats: exact below 2^24 bytes) */
        int me = pt_comm_rank(world), W = pt_comm_size(world);
        float v[12] = {0};
        for (int k = 0; k < 3; k++) v[me * 3 + k] = (float)r->mem[0][k];
        PT_CHECK_GOTO(st, pt_comm_allreduce(world, v, (size_t)W * 3, PT_REDUCE_SUM), done);
        for (int q = 0; q < W; q++)
            for (int k = 0; k < 3; k++) r->mem[q][k] = (size_t)v[q * 3 + k];
    }
    if (j->cfg.data.val[0]) PT_CHECK_GOTO(st, pt_trainer_validate(t, &r->val_loss), done);
    r->nparams = pt_model_num_params(pt_trainer_model(t));
    r->params = malloc(r->nparams * sizeof(float));
    PT_CHECK_GOTO(st, pt_trainer_gather_params(t, r->params), done);
done:
    free(in);
    free(tg);
    pt_trainer_free(t);
    return st;
}

static int write_result(const char *path, const result *r) {
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    fwrite(r, sizeof *r, 1, f);
    fwrite(r->params, sizeof(float), r->nparams, f);
    return fclose(f) != 0;
}

static int read_result(const char *path, result *r) {
    FILE *f = fopen(path, "rb");
    if (!f) return 1;
    int ok = fread(r, sizeof *r, 1, f) == 1;
    r->params = ok ? malloc(r->nparams * sizeof(float)) : NULL;
    ok = ok && fread(r->params, sizeof(float), r->nparams, f) == r->nparams;
    fclose(f);
    return !ok;
}

static int rank_main(void *arg) {
    const job *j = arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_init(&world, &o) != PT_OK) {
        fprintf(stderr, "rank: %s\n", pt_error_message());
        return 1;
    }
    result r;
    pt_status st = run_job(j, world, &r);
    int rc = 0;
    if (st != PT_OK) {
        fprintf(stderr, "rank %d: %s\n", pt_comm_rank(world), pt_error_message());
        rc = 1;
    } else if (pt_comm_rank(world) == 0) {
        rc = write_result(j->out, &r);
    }
    result_free(&r);
    pt_comm_free(world);
    return rc;
}

/* Run j on dp ranks (dp 1 with no communicator: the oracle). */
static pt_status run_dp(job *j, result *r) {
    int dp = j->cfg.parallel.dp;
    if (use_mpi) {
        pt_status st = run_job(j, j->cfg.parallel.dp > 1 ? mpi_world : NULL, r);
        return st;
    }
    if (dp == 1) return run_job(j, NULL, r);
    snprintf(j->out, sizeof j->out, "%s", tmp_path("result.bin"));
    remove(j->out);
    int code = -1;
    pt_comm_options o = {"shm", 20};
    PT_CHECK(pt_launch(dp, rank_main, j, &o, &code));
    if (code != 0) return pt_error_set(PT_ERR_INTERNAL, "ranks exited with %d", code);
    if (read_result(j->out, r)) return pt_error_set(PT_ERR_IO, "%s: no result from rank 0", j->out);
    return PT_OK;
}

static int is_root(void) {
    return !use_mpi || pt_comm_rank(mpi_world) == 0;
}

/* ---- equivalence ---- */

/* Parameter tolerance, derived. The dp run and the one-worker run differ
 * only in the order in which float32 partial gradients are summed (per rank,
 * then across ranks): for an element whose K terms sum to g, the difference
 * is about sqrt(K) * 2^-24 * sum|terms|, i.e. a relative error rho ~ 1e-7
 * times kappa = sum|terms| / |g| (cancellation). AdamW's update
 * lr * m/(sqrt(v)+eps) is scale-free, so it inherits that relative error,
 * and the parameter difference after the run is at most about
 * sum_t lr_t * rho * kappa; here sum_t lr_t = 0.034 (5 warm-up steps to
 * 3e-3, cosine to 3e-4 over 15), so 3.4e-9 * kappa. Measured worst over all
 * cases: 4e-6 (kappa ~ 1e3 for the most cancelled of the 35k elements).
 * The bound 2e-5 allows kappa up to ~6000; a real bug (a missing or doubled
 * bucket, a wrong share, a wrong loss weight) changes gradients by O(1)
 * relative and parameters by O(sum lr) = 3e-2, three orders above it. */
#define PARAM_ATOL 2e-5

/* Losses of steps [from, nsteps) and the final parameters. */
static inline void check_equivalent(const result *ref, const result *r, int from,
                                    const char *what) {
    CHECK_EQ(r->nsteps, ref->nsteps);
    double worst = 0, pmax = 0;
    for (int s = from; s < ref->nsteps && s < r->nsteps; s++) {
        double rel = fabs((double)r->loss[s] - ref->loss[s]) / fabs((double)ref->loss[s]);
        if (rel > worst) worst = rel;
        CHECK_NEAR(r->loss[s], ref->loss[s], 0, 1e-5);
    }
    CHECK_EQ(r->nparams, ref->nparams);
    for (size_t i = 0; r->params && i < ref->nparams && i < r->nparams; i++) {
        double d = fabs((double)r->params[i] - ref->params[i]);
        if (d > pmax) pmax = d;
    }
    CHECK(pmax <= PARAM_ATOL);
    printf("  %-40s max loss rel diff %.2e, max |param diff| %.2e\n", what, worst, pmax);
}

/* Parse --mpi, join the MPI world or make a temporary directory with text
 * data (train.txt, val.txt). Returns non-zero on failure. */
static int dp_harness_init(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mpi")) use_mpi = 1;
    pt_log_set_level(PT_LOG_WARN);
    if (use_mpi) {
        pt_comm_options o = {"mpi", 30};
        if (pt_comm_init(&mpi_world, &o) != PT_OK) {
            fprintf(stderr, "%s --mpi: %s\n", name, pt_error_message());
            return 1;
        }
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-%s-mpi", name);
        return 0;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-%s-XXXXXX", name);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    write_text(tmp_path("train.txt"), 60000, 1);
    write_text(tmp_path("val.txt"), 4000, 2);
    return 0;
}

/* Remove the temporary directory, print the closing line (root only) and
 * return the exit status. */
static int dp_harness_done(void) {
    if (!use_mpi) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    int root = is_root();
    int rc = TEST_DONE();
    if (use_mpi) pt_comm_free(mpi_world);
    return root ? rc : 0;
}

#endif
