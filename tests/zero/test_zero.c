/* ZeRO (sharded data parallel) tests, with the single-worker run as the
 * oracle (DESIGN principle 1): stages 0-3 at dp 2 and 4 and hybrid sharding
 * (dp 4 in groups of 2), losses at every step within 1e-5 relative and final
 * parameters within PARAM_ATOL; per-rank memory of the shards; checkpoints
 * of a sharded run hold full tensors and resume under another layout.
 * Ranks are real processes (shm launcher, or mpirun with --mpi). The
 * harness (jobs, results, run_dp) is test_dp.c's, with per-rank memory
 * peaks added.
 *
 * Tiny model (2 blocks, C 32, T 16, V 64), 1 thread per rank, 20 steps of
 * AdamW. */
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
        if (j->stop_at == s + 1) {
            PT_CHECK_GOTO(st, pt_trainer_save(t), done);
            break;
        }
    }
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

/* stages covered */
#define MAX_STAGE 3

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

static void zcfg(job *j, int dp, int zero, int group, int M) {
    memset(j, 0, sizeof *j);
    tiny_config(&j->cfg, dp);
    j->cfg.parallel.zero = zero;
    j->cfg.parallel.zero_group = group;
    j->cfg.parallel.microbatches = M;
}

/* zero 0..3 x dp {2, 4} and HSDP (dp 4 in groups of 2), M 1 and 2, against
 * the one-worker run; also the per-rank optimizer bytes of the shards. */
static void test_equivalence(void) {
    for (int M = 1; M <= 2; M++) {
        job j;
        zcfg(&j, 1, 0, 0, M);
        result ref;
        if (is_root()) CHECK_OK(run_dp(&j, &ref));
        size_t n = 0;
        if (is_root()) n = ref.nparams;
        for (int zero = 0; zero <= MAX_STAGE; zero++) {
            static const int shm_layouts[][2] = {{2, 0}, {4, 0}, {4, 2}};
            int nl = use_mpi ? (pt_comm_size(mpi_world) == 4 ? 2 : 1) : 3;
            for (int l = 0; l < nl; l++) {
                int dp = use_mpi ? pt_comm_size(mpi_world) : shm_layouts[l][0];
                int group = use_mpi ? (l == 1 ? 2 : 0) : shm_layouts[l][1];
                if (zero == 0 && group) continue;
                zcfg(&j, dp, zero, group, M);
                result r;
                CHECK_OK(run_dp(&j, &r));
                if (is_root()) {
                    char what[96];
                    snprintf(what, sizeof what, "zero%d dp%d%s%s M%d", zero, dp,
                             group ? " group " : "", group ? "2" : "", M);
                    check_equivalent(&ref, &r, 0, what);
                    /* optimizer state: the full model's 8 bytes per parameter over the
                     * shard group (+ at most one float per module and moment from the
                     * uneven split) */
                    int g = group ? group : dp;
                    size_t full = 8 * n, nmod = (size_t)j.cfg.model.n_layer + 2;
                    for (int q = 0; q < dp && q < 4; q++) {
                        if (zero >= 1)
                            CHECK(r.mem[q][2] <= full / (size_t)g + 8 * nmod);
                        else
                            CHECK_EQ(r.mem[q][2], full);
                    }
                    if (zero >= 1)
                        printf("  %-40s optim bytes per rank %zu (full %zu)\n", "", r.mem[0][2],
                               full);
                    /* bytes sent per step (rank 0) against the collectives' volume:
                     * one pass over P = 4n bytes costs (N-1)/N P; all-reduce 2 passes,
                     * stage 1 3, stage 2 2, stage 3 3 per micro-batch (+ the
                     * embedding's third gather: the head reads wte) */
                    if (!group && M == 1) {
                        double pass = (double)(dp - 1) / dp * 4.0 * (double)n;
                        double emb = (double)(dp - 1) / dp * 4.0 *
                                     (double)(j.cfg.model.vocab_size + j.cfg.model.seq_len) *
                                     (double)j.cfg.model.n_embd;
                        double want = zero == 1 || zero == 3 ? 3 * pass : 2 * pass;
                        if (zero == 3) want += emb;
                        if (zero >= 1) want += 2.0 * (dp - 1) / dp * 8; /* the norm's 2 floats */
                        for (int s = 0; s < r.nsteps; s++)
                            CHECK_NEAR((double)r.bytes[s], want, 0.5, 0);
                        printf("  %-40s comm bytes per step %llu (theory %.0f, %.2fx all-reduce)\n",
                               "", (unsigned long long)r.bytes[0], want,
                               (double)r.bytes[0] / (2 * pass));
                    }
                }
                result_free(&r);
            }
        }
        if (is_root()) result_free(&ref);
    }
}

/* A sharded run's checkpoint holds full tensors: it resumes under one worker
 * (and a one-worker checkpoint under the sharded layout) on the same
 * trajectory; a sharded run resumed from its own checkpoint is bitwise the
 * straight run. */
static void test_resume(void) {
    for (int zero = 1; zero <= MAX_STAGE; zero++) {
        job j;
        zcfg(&j, 2, zero, 0, 1);
        char dir[64];
        snprintf(dir, sizeof dir, "ckpt_z%d", zero);
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
        result straight, first, resumed, single, ref1, back;
        CHECK_OK(run_dp(&j, &straight));
        j.stop_at = 10;
        CHECK_OK(run_dp(&j, &first));
        j.stop_at = 0;
        j.resume = 1;
        CHECK_OK(run_dp(&j, &resumed));
        CHECK(resumed.nparams == straight.nparams &&
              !memcmp(resumed.params, straight.params, straight.nparams * sizeof(float)));
        for (int s = 10; s < 20; s++) CHECK(resumed.loss[s] == straight.loss[s]);
        /* zero dp2 checkpoint -> one worker */
        zcfg(&j, 1, 0, 0, 1);
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
        j.resume = 1;
        CHECK_OK(run_dp(&j, &single));
        char what[96];
        snprintf(what, sizeof what, "zero%d dp2 ckpt at 10 -> dp1", zero);
        check_equivalent(&straight, &single, 10, what);
        /* one-worker checkpoint -> zero dp2 */
        snprintf(dir, sizeof dir, "ckpt1_z%d", zero);
        zcfg(&j, 1, 0, 0, 1);
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
        j.stop_at = 10;
        CHECK_OK(run_dp(&j, &ref1));
        zcfg(&j, 2, zero, 0, 1);
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
        j.resume = 1;
        CHECK_OK(run_dp(&j, &back));
        snprintf(what, sizeof what, "dp1 ckpt at 10 -> zero%d dp2", zero);
        check_equivalent(&straight, &back, 10, what);
        result_free(&straight);
        result_free(&first);
        result_free(&resumed);
        result_free(&single);
        result_free(&ref1);
        result_free(&back);
    }
}

/* Variants at dp 2: stage 3 keeping parameters from forward to backward,
 * reduce-scatters without overlap, and validation (forward-only passes,
 * collectives under stage 3) on a text file. */
static void test_variants(void) {
    job j;
    zcfg(&j, 1, 0, 0, 2);
    result ref;
    CHECK_OK(run_dp(&j, &ref));
    static const struct {
        int zero, keep, overlap;
        const char *what;
    } v[] = {{3, 1, 1, "zero3 dp2 M2 keep_params"},
             {2, 0, 0, "zero2 dp2 M2 overlap off"},
             {3, 0, 0, "zero3 dp2 M2 overlap off"}};
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        zcfg(&j, 2, v[k].zero, 0, 2);
        j.cfg.parallel.zero_keep_params = v[k].keep;
        j.cfg.parallel.overlap = v[k].overlap;
        result r;
        CHECK_OK(run_dp(&j, &r));
        check_equivalent(&ref, &r, 0, v[k].what);
        result_free(&r);
    }
    result_free(&ref);
    /* validation: 3 ranks' uneven shares of the windows, under every stage */
    for (int zero = 0; zero <= 3; zero++) {
        for (int dp = 1; dp <= 2; dp++) {
            zcfg(&j, dp, dp > 1 ? zero : 0, 0, 1);
            j.cfg.model.vocab_size = 256;
            j.cfg.train.steps = 5;
            j.cfg.train.val_batches = 3;
            j.use_data = 1;
            j.cfg.parallel.zero_keep_params = zero == 3;
            snprintf(j.cfg.data.train, sizeof j.cfg.data.train, "%s", tmp_path("train.txt"));
            snprintf(j.cfg.data.val, sizeof j.cfg.data.val, "%s", tmp_path("val.txt"));
            if (dp == 1) {
                CHECK_OK(run_dp(&j, &ref));
                continue;
            }
            result r;
            CHECK_OK(run_dp(&j, &r));
            char what[64];
            snprintf(what, sizeof what, "zero%d dp2 on data + validation", zero);
            check_equivalent(&ref, &r, 0, what);
            CHECK_NEAR(r.val_loss, ref.val_loss, 0, 1e-5);
            result_free(&r);
            result_free(&ref);
        }
    }
}

/* zero 3, dp N: each rank's peak parameter + gradient + optimizer bytes are
 * at most the full model's (16 bytes per parameter: fp32 params and grads,
 * two AdamW moments) over N, plus the params and grads of the two largest
 * units, plus a stated slack: the params and grads of the smallest of
 * {embedding, block, block} and of the head. Why: the unit pools hold, at
 * once, the block computing, the next one's prefetched parameters (or the
 * previous one's gradients still reduce-scattering), and the embedding
 * (the head reads the tied wte, so its parameters live from the
 * embedding's forward to the head's, and its gradient from the head's
 * backward to its own); the head's buffers are 2C floats. Plus 16 bytes
 * per module for uneven slices. */
static void test_memory(void) {
    int dps[] = {2, 4};
    for (int d = 0; d < (use_mpi ? 1 : 2); d++) {
        int dp = use_mpi ? pt_comm_size(mpi_world) : dps[d];
        job j;
        zcfg(&j, dp, 3, 0, 1);
        j.cfg.model.n_layer = 3;
        j.cfg.train.steps = 3;
        result r;
        CHECK_OK(run_dp(&j, &r));
        if (!is_root()) {
            result_free(&r);
            continue;
        }
        pt_model *m = NULL;
        CHECK_OK(pt_model_new(&m, &j.cfg.model, 1));
        size_t n = pt_model_num_params(m), u[3], off, head;
        int nmod = pt_model_num_modules(m);
        /* the units a rank can hold at once: the embedding, two blocks */
        pt_model_module_region(m, 0, &off, &u[0]);
        pt_model_module_region(m, 1, &off, &u[1]);
        u[2] = u[1];
        pt_model_module_region(m, nmod - 1, &off, &head);
        pt_model_free(m);
        for (int a = 0; a < 3; a++)
            for (int b = a + 1; b < 3; b++)
                if (u[b] > u[a]) {
                    size_t x = u[a];
                    u[a] = u[b];
                    u[b] = x;
                }
        size_t bound = 16 * n / (size_t)dp + 8 * (u[0] + u[1]);
        size_t slack = 8 * (u[2] + head) + 16 * (size_t)nmod;
        for (int q = 0; q < dp && q < 4; q++) {
            size_t pgo = r.mem[q][0] + r.mem[q][1] + r.mem[q][2];
            CHECK(pgo <= bound + slack);
            printf("  zero3 dp%d rank %d: params %zu + grads %zu + optim %zu = %zu <= %zu + slack "
                   "%zu (unsharded %zu)\n",
                   dp, q, r.mem[q][0], r.mem[q][1], r.mem[q][2], pgo, bound, slack, 16 * n);
        }
        result_free(&r);
    }
}

/* Bad settings are one clear error. */
static void test_bad_input(void) {
    pt_config c;
    tiny_config(&c, 4);
    c.parallel.zero = 2;
    c.parallel.zero_group = 3;
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "parallel.zero_group") != NULL);
    c.parallel.zero_group = 2;
    CHECK_OK(pt_config_validate(&c));
    snprintf(c.parallel.sync, sizeof c.parallel.sync, "stale");
    CHECK(pt_config_validate(&c) == PT_ERR_UNSUPPORTED);
    CHECK(strstr(pt_error_message(), "parallel.zero") != NULL);
    char layout[64];
    snprintf(c.parallel.sync, sizeof c.parallel.sync, "sync");
    pt_config_layout(&c, layout, sizeof layout);
    CHECK(!strcmp(layout, "dp4-tp1-pp1-zero2-g2"));
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--mpi")) use_mpi = 1;
    pt_log_set_level(PT_LOG_WARN);
    if (use_mpi) {
        pt_comm_options o = {"mpi", 30};
        if (pt_comm_init(&mpi_world, &o) != PT_OK) {
            fprintf(stderr, "test_zero --mpi: %s\n", pt_error_message());
            return 1;
        }
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-zero-mpi");
    } else {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-zero-XXXXXX");
        if (!mkdtemp(tmpdir)) {
            perror("mkdtemp");
            return 1;
        }
        write_text(tmp_path("train.txt"), 60000, 1);
        write_text(tmp_path("val.txt"), 4000, 2);
    }
    RUN(test_equivalence);
    RUN(test_memory);
    if (!use_mpi) {
        RUN(test_resume);
        RUN(test_variants);
    }
    if (is_root()) RUN(test_bad_input);
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
