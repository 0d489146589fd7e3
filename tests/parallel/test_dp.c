/* Data-parallel tests, with the single-worker run as the oracle (DESIGN
 * principle 1). Ranks are real processes: pt_launch forks them on shm; with
 * --mpi the executable is itself one rank under mpirun. Rank 0 writes its
 * results (per-step loss and comm bytes, final parameters, validation loss)
 * to a file that the test (the parent, or rank 0 under mpi) compares with
 * the one-worker run of the same config.
 *
 * Equivalence goes through the parity harness (parity_harness.h): loss and
 * gradient norm per step and the final parameters, under AdamW and under
 * SGD without clipping. Tiny model (2 blocks, C 32, T 16, V 64), 1 thread
 * per rank, 20+ steps, so that each case takes well under a second. */
#include "parallel/parity_harness.h"

/* Every data-parallel layout: dp 2 and 4, one or two micro-batches,
 * buckets launched during backward or after it, whole or split modules,
 * micro-batches one after another or all forwards first (gpipe's order). */
static void test_equivalence(void) {
    static const char *const layouts[] = {
        "parallel.dp=2",
        "parallel.dp=4",
        "parallel.dp=2 parallel.microbatches=2 parallel.overlap=false",
        "parallel.dp=4 parallel.microbatches=2 parallel.overlap=false",
        "parallel.dp=2 parallel.microbatches=2 parallel.bucket_mb=0.004",
        "parallel.dp=4 parallel.microbatches=2 parallel.bucket_mb=0.004",
        /* the step's driver under another schedule: every forward first,
         * each micro-batch in its own slot */
        "parallel.microbatches=4 parallel.schedule=gpipe",
        "parallel.dp=2 parallel.microbatches=2 parallel.schedule=gpipe",
        "parallel.dp=2 parallel.microbatches=4 parallel.schedule=gpipe parallel.bucket_mb=0.004",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
}

/* ---- resume ---- */

/* dp 2 resumed from its own checkpoint is bitwise the straight run, and its
 * checkpoint continues the same trajectory under one worker; under both
 * optimizer variants (sgd: no optimizer state at all). */
static void test_resume(void) {
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        job j;
        memset(&j, 0, sizeof j);
        parity_base(&j.cfg, (parity_variant)v);
        j.cfg.parallel.dp = 2;
        char dir[64];
        snprintf(dir, sizeof dir, "ckpt_%s", parity_variant_name[v]);
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
        result straight, single;
        parity_resume_bitwise(&j, &straight);
        /* the dp=2 checkpoint loads under one worker and continues the same run */
        j.cfg.parallel.dp = 1;
        CHECK_OK(run_dp(&j, &single));
        parity_expect_same(&straight, &single, (parity_variant)v, 10,
                           "dp2 checkpoint at 10 resumed under dp1");
        result_free(&straight);
        result_free(&single);
    }
}

/* The optimizer's state in a checkpoint is what its rule keeps: AdamW m and
 * v, sgd with momentum its buffer (optim_m.safetensors), sgd without none;
 * resuming under another rule (or with / without momentum) is one error. */
static void test_resume_other_optimizer(void) {
    static const struct {
        const char *opt;
        double momentum;
        int m, v; /* files expected */
    } rules[] = {{"adamw", 0, 1, 1}, {"sgd", 0, 0, 0}, {"sgd", 0.9, 1, 0}};
    for (int a = 0; a < 3; a++) {
        job j;
        memset(&j, 0, sizeof j);
        tiny_config(&j.cfg, 1);
        j.cfg.train.steps = 2;
        snprintf(j.cfg.train.optimizer, sizeof j.cfg.train.optimizer, "%s", rules[a].opt);
        j.cfg.train.momentum = rules[a].momentum;
        char dir[64], path[PT_CONFIG_STR_MAX + 64];
        snprintf(dir, sizeof dir, "ckpt_rule%d", a);
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
        j.stop_at = 1;
        result r;
        CHECK_OK(run_dp(&j, &r));
        result_free(&r);
        snprintf(path, sizeof path, "%s/step_00000001/optim_m.safetensors", j.cfg.checkpoint.dir);
        CHECK_EQ(access(path, F_OK) == 0, rules[a].m);
        snprintf(path, sizeof path, "%s/step_00000001/optim_v.safetensors", j.cfg.checkpoint.dir);
        CHECK_EQ(access(path, F_OK) == 0, rules[a].v);
        for (int b = 0; b < 3; b++) {
            snprintf(j.cfg.train.optimizer, sizeof j.cfg.train.optimizer, "%s", rules[b].opt);
            j.cfg.train.momentum = rules[b].momentum;
            pt_trainer *t = NULL;
            CHECK_OK(pt_trainer_new(&t, &j.cfg));
            pt_status st = pt_trainer_resume(t);
            if (a == b) {
                CHECK_OK(st);
            } else {
                CHECK(st == PT_ERR_INVALID && strstr(pt_error_message(), "train.optimizer"));
                if (a == 0 && b == 1)
                    printf("  adamw checkpoint under sgd: %s\n", pt_error_message());
            }
            pt_trainer_free(t);
        }
    }
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
    parity_expect_same(&ref, &dga, PARITY_ADAMW, 0, "dp2 stale dga, same data on both ranks");
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

/* ---- validation ---- */

/* Validation loss is the same float under every layout for the same
 * parameters (trainer_run.c, pt_trainer_validate): one window per forward,
 * ranks' sums in double. Before the first step every layout holds the same
 * initial parameters, so the loss must be bitwise one worker's, for each of
 * several initializations (train.seed: a float sum across ranks rounds the
 * same way by chance for some of them; across these seeds, not for all).
 * 58 windows of a short file (val_batches asks for more): 4 ranks get
 * uneven shares. After 2 steps the parameters differ by the summation order
 * of their gradients (parity), and so may the loss, within the step
 * tolerance. */
#define VAL_SEEDS 6
static void test_val_loss_layouts(void) {
    static const char *const layouts[] = {"parallel.dp=1", "parallel.dp=2", "parallel.dp=4",
                                          "parallel.dp=2 parallel.microbatches=2",
                                          "parallel.dp=4 parallel.zero=3"};
    float ref0[VAL_SEEDS], ref[VAL_SEEDS];
    write_text(tmp_path("val_small.txt"), 1000, 3); /* 58 windows of 17 bytes */
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        int same = 0;
        double worst = 0;
        for (int seed = 0; seed < VAL_SEEDS; seed++) {
            job j;
            memset(&j, 0, sizeof j);
            parity_base(&j.cfg, PARITY_ADAMW);
            j.cfg.model.vocab_size = 256;
            j.cfg.train.seed = 1 + seed;
            j.cfg.train.steps = 2;
            j.cfg.train.val_batches = 10;
            j.use_data = 1;
            snprintf(j.cfg.data.train, sizeof j.cfg.data.train, "%s", tmp_path("train.txt"));
            snprintf(j.cfg.data.val, sizeof j.cfg.data.val, "%s", tmp_path("val_small.txt"));
            CHECK_OK(parity_apply(&j.cfg, layouts[k]));
            result r;
            CHECK_OK(run_dp(&j, &r));
            if (k == 0) {
                ref0[seed] = r.val_loss0;
                ref[seed] = r.val_loss;
            } else {
                same += r.val_loss0 == ref0[seed];
                CHECK_NEAR(r.val_loss, ref[seed], 0, PARITY_RTOL_STEP);
                double d = fabs((double)r.val_loss0 - ref0[seed]) / ref0[seed];
                if (d > worst) worst = d;
            }
            result_free(&r);
        }
        if (k == 0) continue;
        CHECK_EQ(same, VAL_SEEDS);
        printf("  %-40s val loss at step 0 bitwise one worker's for %d of %d seeds (worst rel "
               "diff %.1e)\n",
               layouts[k], same, VAL_SEEDS, worst);
    }
}

/* ---- bad input ---- */

static int rank_bad_dp(void *arg) {
    (void)arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_new(&world, &o) != PT_OK) return 1;
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
    /* the optimizer keys: a rule of the list, momentum only for sgd */
    c.parallel.microbatches = 1;
    CHECK(pt_config_set(&c, "train.optimizer=adam") == PT_ERR_INVALID &&
          strstr(pt_error_message(), "adamw|sgd"));
    CHECK(pt_config_set(&c, "train.momentum=1") == PT_ERR_INVALID);
    CHECK_OK(pt_config_set(&c, "train.momentum=0.9"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && strstr(pt_error_message(), "train.momentum"));
    CHECK_OK(pt_config_set(&c, "train.optimizer=sgd"));
    CHECK_OK(pt_config_validate(&c));
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
    if (parity_init(argc, argv, "test-dp")) return 1;
    RUN(test_equivalence);
    if (!use_mpi) {
        RUN(test_resume);
        RUN(test_resume_other_optimizer);
        RUN(test_async_modes);
        RUN(test_dga_uses_previous_average);
        RUN(test_val_loss_layouts);
    }
    RUN(test_bad_input);
    return parity_done();
}
