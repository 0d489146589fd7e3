/* Bitwise resume of the asynchronous data-parallel modes (stale dga and
 * delayed, local_sgd avg and nesterov) at dp 2 (two cases at dp 4, one with
 * micro-batches; two at dp 2 x pp 2) on shm: N steps straight against N/2
 * steps, save, a fresh set of ranks that resume, and the rest. Their
 * per-rank state resharded: dga from dp 2 x pp 2 to dp 2 x tp 2, local_sgd
 * from dp 2 x pp 2 to dp 2, delayed from dp 2 to dp 4 follow the straight
 * run of the layout saved (parity bounds).
 * The oracle is the straight run: every step's loss, and every rank's
 * parameters and AdamW moments (dumped by each rank, compared with memcmp)
 * one step before the end, where local_sgd's ranks differ, and at the end.
 * Also the resumes that cannot continue exactly: another dp or mode
 * (refused in one line before step 1; with checkpoint.drop_rank_state,
 * dp index 0's model with the pipeline restarted), a checkpoint without
 * per-rank state, and damaged, missing, swapped or stale rank-state files
 * (one line naming the file, every rank fails).
 *
 * Tiny model (2 blocks, C 32, T 16, V 256 on a text file), 12 steps. */
#include <cjson/cJSON.h>

#include "parallel/parity_harness.h"

#define N_STEPS 12
#define SAVE_AT 6

typedef struct {
    const char *name, *sync, *stale_mode, *outer;
    int k, dp, M; /* staleness, ranks, micro-batches */
    int sgd;      /* 1: train.optimizer = sgd with momentum 0.9 (its buffer is the state) */
    int pp;       /* pipeline stages (0: 1) */
} mode;

static const mode modes[] = {
    {"stale-dga-k1", "stale", "dga", "avg", 1, 2, 1, 0, 0},
    {"stale-dga-k2", "stale", "dga", "avg", 2, 2, 1, 0, 0},
    {"stale-delayed-k1", "stale", "delayed", "avg", 1, 2, 1, 0, 0},
    {"stale-delayed-k2", "stale", "delayed", "avg", 2, 2, 1, 0, 0},
    {"local-avg", "local_sgd", "dga", "avg", 1, 2, 1, 0, 0},
    {"local-nesterov", "local_sgd", "dga", "nesterov", 1, 2, 1, 0, 0},
    /* more ranks (rank 0 gathers three peers' files) and micro-batches */
    {"stale-dga-k2-dp4-M2", "stale", "dga", "avg", 2, 4, 2, 0, 0},
    {"local-nesterov-dp4", "local_sgd", "dga", "nesterov", 1, 4, 1, 0, 0},
    /* SGD with momentum: the per-rank files carry its buffer, not m and v */
    {"stale-dga-k1-sgd", "stale", "dga", "avg", 1, 2, 1, 1, 0},
    {"local-avg-sgd", "local_sgd", "dga", "avg", 1, 2, 1, 1, 0},
    /* under a pipeline: each stage's ranks write their modules of the
     * full-tensor rank-state files */
    {"stale-dga-k1-pp2", "stale", "dga", "avg", 1, 2, 2, 0, 2},
    {"local-nesterov-pp2", "local_sgd", "dga", "nesterov", 1, 2, 2, 0, 2},
};

static void mode_config(job *j, const mode *md, int dp) {
    memset(j, 0, sizeof *j);
    tiny_config(&j->cfg, dp);
    j->cfg.parallel.microbatches = md->M;
    j->cfg.model.vocab_size = 256;
    j->cfg.train.steps = N_STEPS;
    j->use_data = 1;
    snprintf(j->cfg.data.train, sizeof j->cfg.data.train, "%s", tmp_path("train.txt"));
    snprintf(j->cfg.parallel.sync, sizeof j->cfg.parallel.sync, "%s", md->sync);
    snprintf(j->cfg.parallel.stale_mode, sizeof j->cfg.parallel.stale_mode, "%s", md->stale_mode);
    snprintf(j->cfg.parallel.outer, sizeof j->cfg.parallel.outer, "%s", md->outer);
    j->cfg.parallel.staleness = md->k;
    if (md->sgd) {
        snprintf(j->cfg.train.optimizer, sizeof j->cfg.train.optimizer, "sgd");
        j->cfg.train.momentum = 0.9;
        j->cfg.train.lr = 0.05;
    }
    j->cfg.parallel.sync_every = 4; /* averagings after steps 4, 8, 12: the save at 6 is between */
    j->cfg.parallel.pp = md->pp ? md->pp : 1;
    char dir[64];
    snprintf(dir, sizeof dir, "ckpt-%s", md->name);
    snprintf(j->cfg.checkpoint.dir, sizeof j->cfg.checkpoint.dir, "%s", tmp_path(dir));
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > d) d = fabs((double)a[i] - b[i]);
    return d;
}

/* Dumps a and b of step `step` bitwise equal on every rank. Returns rank 0
 * vs rank 1's largest parameter difference in a (how far the ranks are
 * apart). nbuf: buffers per dump (params, then the optimizer's state). */
static double check_same_dumps(const char *a, const char *b, int step, int world, size_t nbuf) {
    float *r0 = NULL;
    size_t n0 = 0;
    double apart = -1;
    for (int r = 0; r < world; r++) {
        size_t na = 0, nb = 0;
        float *x = read_dump(a, step, r, &na), *y = read_dump(b, step, r, &nb);
        CHECK(x && y && na > 0);
        CHECK_EQ(na, nb);
        if (x && y && na == nb) CHECK(!memcmp(x, y, na * sizeof(float)));
        if (r == 0) {
            r0 = x;
            n0 = na;
        } else if (r == 1 && r0 && x && n0 == na) {
            apart = max_abs_diff(r0, x, na / nbuf); /* the parameters (then m, v) */
        }
        if (r > 0) free(x);
        free(y);
    }
    free(r0);
    return apart;
}

static void test_resume_bitwise(void) {
    for (size_t c = 0; c < sizeof modes / sizeof modes[0]; c++) {
        const mode *md = &modes[c];
        job j;
        result straight, first, resumed;
        mode_config(&j, md, md->dp);
        snprintf(j.dump, sizeof j.dump, "straight-%s", md->name);
        j.dump_at = N_STEPS - 1;
        CHECK_OK(run_dp(&j, &straight));
        mode_config(&j, md, md->dp);
        j.stop_at = SAVE_AT;
        CHECK_OK(run_dp(&j, &first));
        mode_config(&j, md, md->dp);
        j.resume = 1;
        snprintf(j.dump, sizeof j.dump, "resumed-%s", md->name);
        j.dump_at = N_STEPS - 1;
        CHECK_OK(run_dp(&j, &resumed));
        CHECK_EQ(resumed.nsteps, N_STEPS);
        int same_loss = 1;
        for (int s = SAVE_AT; s < N_STEPS; s++) same_loss &= resumed.loss[s] == straight.loss[s];
        CHECK(same_loss);
        char a[48], b[48];
        snprintf(a, sizeof a, "straight-%s", md->name);
        snprintf(b, sizeof b, "resumed-%s", md->name);
        size_t nbuf = md->sgd ? 2 : 3;              /* params + (momentum | m, v) */
        int world = md->dp * (md->pp ? md->pp : 1); /* ranks 0, 1: dp 0, 1 of stage 0 */
        double apart = check_same_dumps(a, b, N_STEPS - 1, world, nbuf);
        check_same_dumps(a, b, N_STEPS, world, nbuf);
        /* the per-rank state matters where ranks differ: dga by their last k
         * local terms, local_sgd between averagings; delayed keeps them equal */
        if (!strcmp(md->stale_mode, "delayed") && !strcmp(md->sync, "stale"))
            CHECK(apart == 0.0);
        else
            CHECK(apart > 0.0);
        printf("  %-19s dp%d steps %d-%d compared bitwise (losses, every rank's params + moments); "
               "ranks apart by %.2e at step %d\n",
               md->name, md->dp, SAVE_AT + 1, N_STEPS, apart, N_STEPS - 1);
        result_free(&straight);
        result_free(&first);
        result_free(&resumed);
    }
}

/* ---- per-rank state resharded ----
 * What is alike on every rank (stale's rounds' sums: global gradients; the
 * outer step's anchor and momentum) continues at any layout, what is a dp
 * index's own at any tp and pp of the same dp: each case resumes the
 * checkpoint of `from` under `to` and follows the straight run of `from`
 * (the same mode's trajectory at another layout, within the parity
 * harness's bounds from the save on). */
static void test_resume_resharded(void) {
    static const struct {
        int mode; /* into modes[] */
        const char *to;
    } cases[] = {
        {10,
         "parallel.pp=1 parallel.tp=2 parallel.microbatches=1"}, /* dga dp2 x pp2 -> dp2 x tp2 */
        {11, "parallel.pp=1 parallel.microbatches=1"}, /* local nesterov dp2 x pp2 -> dp2 */
        {2, "parallel.dp=4"},                          /* delayed: the sums at any dp */
        {0, "parallel.tp=2"},                          /* dga dp2 -> dp2 x tp2 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const mode *md = &modes[cases[c].mode];
        job j;
        result straight, first, resumed;
        mode_config(&j, md, md->dp);
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("resharded"));
        CHECK_OK(run_dp(&j, &straight));
        j.stop_at = SAVE_AT;
        CHECK_OK(run_dp(&j, &first));
        j.stop_at = 0;
        j.resume = 1;
        CHECK_OK(parity_apply(&j.cfg, cases[c].to));
        CHECK_OK(run_dp(&j, &resumed));
        char what[100];
        snprintf(what, sizeof what, "%.30s -> %.60s", md->name, cases[c].to);
        parity_expect_same(&straight, &resumed, PARITY_ADAMW, SAVE_AT, what);
        result_free(&straight);
        result_free(&first);
        result_free(&resumed);
    }
}

/* ---- resumes that cannot continue exactly ---- */

static void copy_dir(const char *from, const char *to) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", to, from, to);
    CHECK(system(cmd) == 0);
}

/* Drop "rank_state" from a step directory's state.json: a checkpoint as
 * written before per-rank state existed. */
static void strip_rank_state(const char *stepdir) {
    char path[600];
    snprintf(path, sizeof path, "%s/state.json", stepdir);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) return;
    char text[65536];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    cJSON *root = cJSON_Parse(text);
    CHECK(root && cJSON_GetObjectItemCaseSensitive(root, "rank_state"));
    cJSON_DeleteItemFromObjectCaseSensitive(root, "rank_state");
    char *out = cJSON_Print(root);
    f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(root);
}

typedef struct {
    pt_config cfg;
    int save;         /* 1: two steps, then save (else resume) */
    const char *want; /* in every rank's message */
    const char *file; /* named by it too */
    int replace_dir;  /* 1: rank 0 replaces checkpoint.dir by a file before saving */
} bad_resume;

static int rank_bad_resume(void *arg) {
    const bad_resume *b = arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_new(&world, &o) != PT_OK) return 1;
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, &b->cfg, world);
    for (int s = 0; b->save && st == PT_OK && s < 2; s++) st = pt_trainer_step(t, NULL);
    if (st == PT_OK && b->replace_dir && pt_comm_rank(world) == 0) {
        char lock[PT_CONFIG_STR_MAX + 8];
        snprintf(lock, sizeof lock, "%s/.lock", b->cfg.checkpoint.dir);
        if (unlink(lock) != 0 || rmdir(b->cfg.checkpoint.dir) != 0) st = PT_ERR_IO;
        write_text(b->cfg.checkpoint.dir, 10, 3);
    }
    if (st == PT_OK) st = b->save ? pt_trainer_save(t) : pt_trainer_resume(t);
    const char *msg = pt_error_message();
    /* the failing rank's own error on every rank, not a timeout waiting for it */
    int ok = st != PT_OK && st != PT_ERR_TIMEOUT && st != PT_ERR_COMM && strstr(msg, b->want) &&
             strstr(msg, b->file) && !strchr(msg, '\n');
    fprintf(stderr, "  rank %d: %s%s\n", pt_comm_rank(world), msg, ok ? "" : "  <- unexpected");
    pt_trainer_free(t);
    pt_comm_free(world);
    return ok ? 0 : 1;
}

static void expect_bad_save(const job *base, const char *dir, int replace_dir, const char *want,
                            const char *file) {
    bad_resume b = {base->cfg, 1, want, file, replace_dir};
    snprintf(b.cfg.checkpoint.dir, sizeof b.cfg.checkpoint.dir, "%s", dir);
    int code = -1;
    pt_comm_options o = {"shm", 20};
    CHECK_OK(pt_launch(2, rank_bad_resume, &b, &o, &code));
    CHECK_EQ(code, 0);
}

static void expect_bad(const job *base, int save, const char *dir, const char *want,
                       const char *file) {
    bad_resume b = {base->cfg, save, want, file, 0};
    snprintf(b.cfg.checkpoint.dir, sizeof b.cfg.checkpoint.dir, "%s", dir);
    int code = -1;
    pt_comm_options o = {"shm", 20};
    CHECK_OK(pt_launch(job_world(base), rank_bad_resume, &b, &o, &code));
    CHECK_EQ(code, 0);
}

static void test_resume_fallback_and_errors(void) {
    const mode *dga = &modes[0];
    job j;
    result straight, r;
    mode_config(&j, dga, 2); /* its checkpoint at SAVE_AT is left by test_resume_bitwise */
    char src[PT_CONFIG_STR_MAX];
    snprintf(src, sizeof src, "%s", j.cfg.checkpoint.dir);
    CHECK_OK(run_dp(&j, &straight)); /* saves nothing (no stop_at) */

    /* another dp: one worker has no per-rank state and continues from dp
     * index 0's model; four ranks cannot use two ranks' own state: refused
     * before step 1 in one line naming it, and with
     * checkpoint.drop_rank_state they restart it */
    for (int dp = 1; dp <= 4; dp += 3) {
        mode_config(&j, dga, dp);
        copy_dir(src, tmp_path("other-dp"));
        snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("other-dp"));
        if (dp == 4) {
            expect_bad(&j, 0, j.cfg.checkpoint.dir, "does not carry over to this run's dp4 stale",
                       "step_00000006 holds the per-rank state of dp2 stale dga k=1");
            j.cfg.checkpoint.drop_rank_state = 1;
        }
        j.resume = 1;
        CHECK_OK(run_dp(&j, &r));
        CHECK_EQ(r.nsteps, N_STEPS);
        result_free(&r);
    }

    /* another stale kind at the same dp: refused, or (dropped) the
     * pipeline restarts, so delayed applies nothing in the first step
     * after the resume */
    mode_config(&j, &modes[2], 2);
    copy_dir(src, tmp_path("other-mode"));
    snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("other-mode"));
    expect_bad(&j, 0, j.cfg.checkpoint.dir, "does not carry over to this run's dp2 stale delayed",
               "checkpoint.drop_rank_state");
    j.cfg.checkpoint.drop_rank_state = 1;
    j.resume = 1;
    CHECK_OK(run_dp(&j, &r));
    CHECK(r.applied[SAVE_AT] == 0 && r.applied[SAVE_AT + 1] == 1);
    result_free(&r);

    /* the same layout without per-rank state (an older checkpoint): works,
     * and is NOT the uninterrupted run, which shows what the rank files buy
     * and that the bitwise checks above can fail */
    mode_config(&j, dga, 2);
    copy_dir(src, tmp_path("no-rank-state"));
    strip_rank_state(tmp_path("no-rank-state/step_00000006"));
    snprintf(j.cfg.checkpoint.dir, sizeof j.cfg.checkpoint.dir, "%s", tmp_path("no-rank-state"));
    j.resume = 1;
    CHECK_OK(run_dp(&j, &r));
    double d = max_abs_diff(r.params, straight.params, straight.nparams);
    CHECK(d > 0.0);
    printf("  dga checkpoint without rank files: resumes, final params differ by %.2e\n", d);
    result_free(&r);

    /* damaged, missing or swapped rank-state files: every rank fails with
     * the line naming the file (dp index 1's own state, then the rounds'
     * sums every rank reads) */
    mode_config(&j, dga, 2);
    copy_dir(src, tmp_path("bad"));
    const char *f1 = tmp_path("bad/step_00000006/replica1.safetensors");
    CHECK(truncate(f1, 200) == 0);
    expect_bad(&j, 0, tmp_path("bad"), "truncated", "replica1.safetensors");
    CHECK(remove(f1) == 0);
    expect_bad(&j, 0, tmp_path("bad"), "No such file", "replica1.safetensors");
    copy_dir(tmp_path("bad/step_00000006/replica0.safetensors"), f1);
    expect_bad(&j, 0, tmp_path("bad"), "metadata file is replica0, expected replica1",
               "replica1.safetensors");
    copy_dir(src, tmp_path("bad"));
    job early; /* the same run saved at step 4 */
    mode_config(&early, dga, 2);
    snprintf(early.cfg.checkpoint.dir, sizeof early.cfg.checkpoint.dir, "%s", tmp_path("early"));
    early.stop_at = 4;
    CHECK_OK(run_dp(&early, &r));
    result_free(&r);
    copy_dir(tmp_path("early/step_00000004/sync.safetensors"),
             tmp_path("bad/step_00000006/sync.safetensors"));
    expect_bad(&j, 0, tmp_path("bad"), "metadata step is 4, expected 6", "sync.safetensors");

    /* a checkpoint.dir under a file: every rank fails before step 1 with
     * rank 0's line */
    write_text(tmp_path("a-file"), 10, 3);
    expect_bad_save(&j, tmp_path("a-file/ckpt"), 0, "Not a directory", "a-file/ckpt");
    /* a save that fails on rank 0 (its directory replaced by a file after
     * the start): rank 0 still takes every rank's state, so every rank
     * returns its error */
    expect_bad_save(&j, tmp_path("replaced"), 1, "not a directory", "replaced");
    result_free(&straight);
}

int main(int argc, char **argv) {
    if (parity_init(argc, argv, "test-async-resume")) return 1;
    if (use_mpi) {
        fprintf(stderr, "test_async_resume: shm only\n");
        return 1;
    }
    RUN(test_resume_bitwise);
    RUN(test_resume_resharded);
    RUN(test_resume_fallback_and_errors);
    return parity_done();
}
