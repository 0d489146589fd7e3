/* ZeRO (sharded data parallel) tests, with the single-worker run as the
 * oracle (DESIGN principle 1): stages 0-3 at dp 2 and 4 and hybrid sharding
 * (dp 4 in groups of 2), losses at every step within 1e-5 relative and final
 * parameters within PARAM_ATOL; per-rank memory of the shards; checkpoints
 * of a sharded run hold full tensors and resume under another layout.
 * Ranks are real processes (shm launcher, or mpirun with --mpi). The
 * harness is tests/parallel/parity_harness.h, shared with test_dp.c.
 *
 * Tiny model (2 blocks, C 32, T 16, V 64), 1 thread per rank, 20 steps of
 * AdamW. */
#include "parallel/parity_harness.h"

/* stages covered */
#define MAX_STAGE 3

static void zcfg(job *j, int dp, int zero, int group, int M) {
    memset(j, 0, sizeof *j);
    tiny_config(&j->cfg, dp);
    j->cfg.parallel.zero = zero;
    j->cfg.parallel.zero_group = group;
    j->cfg.parallel.microbatches = M;
}

/* Per-rank optimizer bytes of the shards and bytes sent per step, on top of
 * parity: root only, for a layout parity_check just ran. */
static void zero_extra(const char *layout, parity_variant v, const job *j, const result *r) {
    (void)layout;
    const pt_config *c = &j->cfg;
    int dp = c->parallel.dp, zero = c->parallel.zero, group = c->parallel.zero_group;
    int M = c->parallel.microbatches;
    size_t n = r->nparams;
    /* optimizer state: the full model's 8 bytes per parameter (AdamW m, v;
     * sgd without momentum: none) over the shard group (+ at most one
     * float per module and moment from the uneven split) */
    int g = group ? group : dp;
    size_t per = v == PARITY_SGD ? 0 : 8, full = per * n, nmod = (size_t)c->model.n_layer + 2;
    for (int q = 0; q < dp && q < 4; q++) CHECK(r->mem[q][2] <= full / (size_t)g + per * nmod);
    printf("  %-52s optim bytes per rank %zu (full %zu)\n", "", r->mem[0][2], full);
    /* bytes sent per step (rank 0) against the collectives' volume: one
     * pass over P = 4n bytes costs (N-1)/N P; all-reduce 2 passes, stage 1
     * 3, stage 2 2, stage 3 3 per micro-batch (+ the embedding's third
     * gather: the head reads wte) */
    if (group || M != 1) return;
    double pass = (double)(dp - 1) / dp * 4.0 * (double)n;
    double emb = (double)(dp - 1) / dp * 4.0 * (double)(c->model.vocab_size + c->model.seq_len) *
                 (double)c->model.n_embd;
    double want = zero == 1 || zero == 3 ? 3 * pass : 2 * pass;
    if (zero == 3) want += emb;
    want += 2.0 * (dp - 1) / dp * 8; /* the norm's 2 floats */
    for (int s = 0; s < r->nsteps; s++) CHECK_NEAR((double)r->bytes[s], want, 0.5, 0);
    printf("  %-52s comm bytes per step %llu (theory %.0f, %.2fx all-reduce)\n", "",
           (unsigned long long)r->bytes[0], want, (double)r->bytes[0] / (2 * pass));
}

/* zero 1..3 x dp {2, 4} and HSDP (dp 4 in groups of 2), one or two
 * micro-batches, through the parity harness (stage 0 is test_dp's). */
static void test_equivalence(void) {
    static const char *const shapes[] = {"parallel.dp=2", "parallel.dp=4",
                                         "parallel.dp=4 parallel.zero_group=2"};
    for (int M = 1; M <= 2; M++)
        for (int zero = 1; zero <= MAX_STAGE; zero++)
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
                char layout[160];
                snprintf(layout, sizeof layout, "%s parallel.zero=%d%s", shapes[k], zero,
                         M > 1 ? " parallel.microbatches=2" : "");
                parity_check_extra(layout, zero_extra);
            }
}

/* A sharded run's checkpoint holds full tensors: it resumes under one worker
 * (and a one-worker checkpoint under the sharded layout) on the same
 * trajectory; a sharded run resumed from its own checkpoint is bitwise the
 * straight run. */
static void test_resume(void) {
    for (int zero = 1; zero <= MAX_STAGE; zero++) {
        /* AdamW, and SGD with momentum (its buffer is the state to carry) */
        for (int v = 0; v < PARITY_NVARIANTS; v++) {
            job j;
            memset(&j, 0, sizeof j);
            parity_base(&j.cfg, (parity_variant)v);
            if (v == PARITY_SGD) j.cfg.train.momentum = 0.9;
            pt_config base = j.cfg;
            j.cfg.parallel.dp = 2;
            j.cfg.parallel.zero = zero;
            char dir[64];
            snprintf(dir, sizeof dir, "ckpt_z%d_%s", zero, parity_variant_name[v]);
            snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
            pt_config sharded = j.cfg;
            result straight, single, ref1, back;
            parity_resume_bitwise(&j, &straight);
            /* zero dp2 checkpoint -> one worker */
            j.cfg = base;
            snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
            j.resume = 1;
            CHECK_OK(run_dp(&j, &single));
            char what[96];
            snprintf(what, sizeof what, "zero%d dp2 ckpt at 10 -> dp1%s", zero,
                     v == PARITY_SGD ? " (momentum 0.9)" : "");
            parity_expect_same(&straight, &single, (parity_variant)v, 10, what);
            /* one-worker checkpoint -> zero dp2 */
            snprintf(dir, sizeof dir, "ckpt1_z%d_%s", zero, parity_variant_name[v]);
            j.cfg = base;
            snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
            j.stop_at = 10;
            j.resume = 0;
            CHECK_OK(run_dp(&j, &ref1));
            j.cfg = sharded;
            snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path(dir));
            j.stop_at = 0;
            j.resume = 1;
            CHECK_OK(run_dp(&j, &back));
            snprintf(what, sizeof what, "dp1 ckpt at 10 -> zero%d dp2%s", zero,
                     v == PARITY_SGD ? " (momentum 0.9)" : "");
            parity_expect_same(&straight, &back, (parity_variant)v, 10, what);
            result_free(&straight);
            result_free(&single);
            result_free(&ref1);
            result_free(&back);
        }
    }
}

/* Hybrid sharding's checkpoint (dp 4 in groups of 2, ZeRO-3): the first
 * group's shards alone make the files (the other group holds the same
 * state); the run resumes from them bitwise, and one worker from them on
 * the same trajectory. */
static void test_resume_hsdp(void) {
    job j;
    zcfg(&j, 4, 3, 2, 1);
    snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("ckpt_hsdp"));
    result straight, single;
    parity_resume_bitwise(&j, &straight);
    parity_base(&j.cfg, PARITY_ADAMW); /* one worker, resuming */
    snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("ckpt_hsdp"));
    CHECK_OK(run_dp(&j, &single));
    parity_expect_same(&straight, &single, PARITY_ADAMW, 10, "hsdp dp4 g2 zero3 ckpt at 10 -> dp1");
    result_free(&straight);
    result_free(&single);
}

/* Variants at dp 2: stage 3 keeping parameters from forward to backward,
 * reduce-scatters without overlap, and validation (forward-only passes,
 * collectives under stage 3) on a text file. */
static void test_variants(void) {
    static const char *const layouts[] = {
        "parallel.dp=2 parallel.zero=3 parallel.microbatches=2 parallel.zero_keep_params=true",
        "parallel.dp=2 parallel.zero=2 parallel.microbatches=2 parallel.overlap=false",
        "parallel.dp=2 parallel.zero=3 parallel.microbatches=2 parallel.overlap=false",
        "parallel.dp=2 parallel.zero=2 parallel.microbatches=2 parallel.schedule=gpipe",
        "parallel.dp=2 parallel.zero=3 parallel.microbatches=2 parallel.schedule=gpipe",
        "parallel.dp=2 parallel.zero=1 parallel.microbatches=4 parallel.schedule=gpipe",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) parity_check(layouts[k]);
    job j;
    result ref;
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
            parity_expect_same(&ref, &r, PARITY_ADAMW, 0, what);
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
    if (parity_init(argc, argv, "test-zero")) return 1;
    RUN(test_equivalence);
    RUN(test_memory);
    if (!use_mpi) {
        RUN(test_resume);
        RUN(test_resume_hsdp);
        RUN(test_variants);
    }
    if (is_root()) RUN(test_bad_input);
    return parity_done();
}
