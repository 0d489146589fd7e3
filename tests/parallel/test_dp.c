/* Data-parallel tests, with the single-worker run as the oracle (DESIGN
 * principle 1). Ranks are real processes: pt_launch forks them on shm; with
 * --mpi the executable is itself one rank under mpirun. Rank 0 writes its
 * results (per-step loss and comm bytes, final parameters, validation loss)
 * to a file that the test (the parent, or rank 0 under mpi) compares with
 * the one-worker run of the same config.
 *
 * Tiny model (2 blocks, C 32, T 16, V 64), 1 thread per rank, 20+ steps of
 * AdamW, so that each case takes well under a second. */
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
    int use_data; /* 1: pt_trainer_step on data.train (vocab must be 256) */
    int stop_at;  /* > 0: save a checkpoint after this step and stop */
    int resume;   /* resume from checkpoint.dir first */
    int mirror;   /* 1: the global batch's second half repeats its first (dp 2: both ranks
                     compute the same gradient) */
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
        r->loss[s] = info.loss;
        r->bytes[s] = info.comm_bytes;
        r->applied[s] = info.applied;
        r->nsteps = s + 1;
        if (j->stop_at == s + 1) {
            PT_CHECK_GOTO(st, pt_trainer_save(t), done);
            break;
        }
    }
    if (j->cfg.data.val[0]) PT_CHECK_GOTO(st, pt_trainer_validate(t, &r->val_loss), done);
    r->nparams = pt_model_num_params(pt_trainer_model(t));
    r->params = malloc(r->nparams * sizeof(float));
    memcpy(r->params, pt_model_params(pt_trainer_model(t)), r->nparams * sizeof(float));
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
static void check_equivalent(const result *ref, const result *r, int from, const char *what) {
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

static void test_equivalence(void) {
    static const struct {
        int M, overlap;
        double bucket_mb;
        const char *what;
    } cases[] = {
        {1, 1, 4, "M1 overlap on, 4 MiB buckets"},
        {2, 0, 4, "M2 overlap off"},
        {2, 1, 0.004, "M2 overlap on, 4 KiB buckets (split modules)"},
    };
    int dps_shm[] = {2, 4}, ndp = use_mpi ? 1 : 2;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        job j;
        memset(&j, 0, sizeof j);
        tiny_config(&j.cfg, 1);
        j.cfg.parallel.microbatches = cases[k].M;
        result ref;
        if (is_root()) CHECK_OK(run_dp(&j, &ref));
        for (int d = 0; d < ndp; d++) {
            int dp = use_mpi ? pt_comm_size(mpi_world) : dps_shm[d];
            tiny_config(&j.cfg, dp);
            j.cfg.parallel.microbatches = cases[k].M;
            j.cfg.parallel.overlap = cases[k].overlap;
            j.cfg.parallel.bucket_mb = cases[k].bucket_mb;
            result r;
            CHECK_OK(run_dp(&j, &r));
            if (is_root()) {
                char what[96];
                snprintf(what, sizeof what, "dp%d %s", dp, cases[k].what);
                check_equivalent(&ref, &r, 0, what);
            }
            result_free(&r);
        }
        if (is_root()) result_free(&ref);
    }
}

/* ---- resume ---- */

static void test_resume(void) {
    job j;
    memset(&j, 0, sizeof j);
    tiny_config(&j.cfg, 2);
    snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("ckpt"));
    result straight, first, resumed, single;
    CHECK_OK(run_dp(&j, &straight));
    j.stop_at = 10;
    CHECK_OK(run_dp(&j, &first));
    j.stop_at = 0;
    j.resume = 1;
    CHECK_OK(run_dp(&j, &resumed));
    /* bitwise: the same steps on the same data from the same state */
    CHECK(resumed.nparams == straight.nparams &&
          !memcmp(resumed.params, straight.params, straight.nparams * sizeof(float)));
    for (int s = 10; s < 20; s++) CHECK(resumed.loss[s] == straight.loss[s]);
    /* the dp=2 checkpoint loads under one worker and continues the same run */
    tiny_config(&j.cfg, 1);
    snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("ckpt"));
    j.resume = 1;
    CHECK_OK(run_dp(&j, &single));
    check_equivalent(&straight, &single, 10, "dp2 checkpoint at 10 resumed under dp1");
    result_free(&straight);
    result_free(&first);
    result_free(&resumed);
    result_free(&single);
}

/* ---- asynchronous modes ---- */

static void data_config(job *j, int dp, const char *sync) {
    memset(j, 0, sizeof *j);
    tiny_config(&j->cfg, dp);
    j->cfg.model.vocab_size = 256;
    j->cfg.train.steps = 40;
    j->use_data = 1;
    snprintf(j->cfg.data.train, sizeof j->cfg.data.train, "%s", tmp_path("train.txt"));
    snprintf(j->cfg.data.val, sizeof j->cfg.data.val, "%s", tmp_path("val.txt"));
    snprintf(j->cfg.parallel.sync, sizeof j->cfg.parallel.sync, "%s", sync);
}

static void test_async_modes(void) {
    job j;
    data_config(&j, 1, "sync");
    result init;
    j.cfg.train.steps = 1; /* loss of the first step: the untrained model */
    CHECK_OK(run_dp(&j, &init));
    float start = init.loss[0];
    result_free(&init);

    static const struct {
        const char *sync, *outer;
        int every;
        const char *stale_mode;
    } modes[] = {{"sync", "avg", 1, "dga"},
                 {"stale", "avg", 1, "dga"},
                 {"stale", "avg", 1, "delayed"},
                 {"local_sgd", "avg", 4, "dga"},
                 {"local_sgd", "nesterov", 4, "dga"}};
    size_t P = 0;
    uint64_t sync_bytes = 0;
    for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
        data_config(&j, 2, modes[k].sync);
        snprintf(j.cfg.parallel.outer, sizeof j.cfg.parallel.outer, "%s", modes[k].outer);
        j.cfg.parallel.sync_every = modes[k].every;
        snprintf(j.cfg.parallel.stale_mode, sizeof j.cfg.parallel.stale_mode, "%s",
                 modes[k].stale_mode);
        result r;
        CHECK_OK(run_dp(&j, &r));
        P = r.nparams;
        /* every mode learns: validation loss well below the initial loss */
        CHECK(r.val_loss < 0.8f * start);
        /* all-reduce of n floats on 2 ranks: each rank sends 2(n-1)/n x 4n = 4n bytes */
        uint64_t full = 4 * (uint64_t)P;
        if (!strcmp(modes[k].sync, "sync")) {
            for (int s = 0; s < r.nsteps; s++) CHECK_EQ(r.bytes[s], full);
            sync_bytes = full;
        } else if (!strcmp(modes[k].sync, "stale")) {
            /* same volume, waited for one step later; delayed: step 1 applies
             * nothing, dga: step 1 applies the local gradient */
            int dga = !strcmp(modes[k].stale_mode, "dga");
            for (int s = 0; s < r.nsteps; s++) {
                CHECK_EQ(r.bytes[s], s == 0 ? 0 : full);
                CHECK_EQ(r.applied[s], s == 0 && !dga ? 0 : 1);
            }
        } else {
            for (int s = 0; s < r.nsteps; s++)
                CHECK_EQ(r.bytes[s], (s + 1) % 4 == 0 || s + 1 == r.nsteps ? full : 0);
        }
        printf("  %-9s %-8s %-7s val loss %.4f (start %.4f), bytes per step %llu (sync %llu)\n",
               modes[k].sync, modes[k].outer,
               strcmp(modes[k].sync, "stale") ? "" : modes[k].stale_mode, (double)r.val_loss,
               (double)start, (unsigned long long)r.bytes[3], (unsigned long long)sync_bytes);
        result_free(&r);
    }
}

/* dga with staleness 1 applies at step t  N g(t) - N g(t-1) + S(t-1), S(t-1)
 * the all-reduced sum of step t-1. When both ranks see the same data, S(t-1)
 * = N g(t-1), so the update is exactly sync's N g(t) (up to rounding of the
 * cancelling terms) at every step, the first included; using the average of
 * any other step, or skipping the correction, would not cancel. delayed
 * (the sum of step t-1 as is) must NOT match: it shows the check can fail. */
static void test_dga_uses_previous_average(void) {
    job j;
    memset(&j, 0, sizeof j);
    tiny_config(&j.cfg, 2);
    j.mirror = 1;
    result ref, dga, delayed;
    CHECK_OK(run_dp(&j, &ref));
    snprintf(j.cfg.parallel.sync, sizeof j.cfg.parallel.sync, "stale");
    snprintf(j.cfg.parallel.stale_mode, sizeof j.cfg.parallel.stale_mode, "dga");
    CHECK_OK(run_dp(&j, &dga));
    check_equivalent(&ref, &dga, 0, "dp2 stale dga, same data on both ranks");
    snprintf(j.cfg.parallel.stale_mode, sizeof j.cfg.parallel.stale_mode, "delayed");
    CHECK_OK(run_dp(&j, &delayed));
    double worst = 0;
    for (int s = 0; s < delayed.nsteps; s++) {
        double rel = fabs((double)delayed.loss[s] - ref.loss[s]) / fabs((double)ref.loss[s]);
        if (rel > worst) worst = rel;
    }
    CHECK(worst > 1e-3);
    printf("  dp2 stale delayed, same data: max loss rel diff %.2e (must differ)\n", worst);
    result_free(&ref);
    result_free(&dga);
    result_free(&delayed);
}

/* ---- bad input ---- */

static int rank_bad_dp(void *arg) {
    (void)arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_init(&world, &o) != PT_OK) return 1;
    pt_config c;
    tiny_config(&c, 1); /* but 2 ranks */
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, &c, world);
    int ok = st == PT_ERR_INVALID && t == NULL && strstr(pt_error_message(), "parallel.dp = 1") &&
             strstr(pt_error_message(), "2 ranks");
    if (!ok) fprintf(stderr, "unexpected: %d %s\n", (int)st, pt_error_message());
    pt_comm_free(world);
    return ok ? 0 : 1;
}

static void test_bad_input(void) {
    pt_config c;
    tiny_config(&c, 3); /* batch 8 is not divisible by 3 */
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && strstr(pt_error_message(), "parallel.dp"));
    tiny_config(&c, 2);
    c.parallel.microbatches = 8; /* 8 / (2 x 8) */
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && strstr(pt_error_message(), "microbatches"));
    CHECK(pt_config_set(&c, "parallel.sync=async") == PT_ERR_INVALID);
    CHECK(pt_config_set(&c, "parallel.overlap=maybe") == PT_ERR_INVALID);
    CHECK(pt_config_set(&c, "parallel.outer=adam") == PT_ERR_INVALID);
    CHECK(pt_config_set(&c, "parallel.stale_mode=fast") == PT_ERR_INVALID);
    CHECK_OK(pt_config_set(&c, "parallel.overlap=false"));
    CHECK_EQ(c.parallel.overlap, 0);
    /* dp > 1 without a world of that size */
    tiny_config(&c, 2);
    pt_trainer *t = NULL;
    CHECK(pt_trainer_new_dist(&t, &c, NULL) == PT_ERR_INVALID && t == NULL &&
          strstr(pt_error_message(), "--nproc 2"));
    if (!use_mpi) {
        int code = -1;
        pt_comm_options o = {"shm", 20};
        CHECK_OK(pt_launch(2, rank_bad_dp, NULL, &o, &code));
        CHECK_EQ(code, 0);
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mpi")) use_mpi = 1;
    pt_log_set_level(PT_LOG_WARN);
    if (use_mpi) {
        pt_comm_options o = {"mpi", 30};
        if (pt_comm_init(&mpi_world, &o) != PT_OK) {
            fprintf(stderr, "test_dp --mpi: %s\n", pt_error_message());
            return 1;
        }
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-dp-mpi");
    } else {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-dp-XXXXXX");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            return 1;
        }
        write_text(tmp_path("train.txt"), 60000, 1);
        write_text(tmp_path("val.txt"), 4000, 2);
    }
    RUN(test_equivalence);
    if (!use_mpi) {
        RUN(test_resume);
        RUN(test_async_modes);
        RUN(test_dga_uses_previous_average);
    }
    RUN(test_bad_input);
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
