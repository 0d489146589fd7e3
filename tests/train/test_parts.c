/* The step-time parts of the metrics (docs/report.md): on every rank of
 * real multi-rank runs, the disjoint parts (compute, exposed dp / tp / pp /
 * ZeRO communication, optimizer, other) add up to the rank's own step time,
 * measured apart from them, within 2%; none is negative; the min, max and
 * slowest rank of each part are those of its per-rank list; the layout's
 * groups are there with their traffic; a pipeline's stages each report
 * their idle time outside the passes, within their step. Layouts: dp 2 x pp 2 (the
 * acceptance's), dp 2 x tp 2, and dp 2 under ZeRO-3 (a part each for its
 * pipeline waits, tp collectives and gathers). The oracle: each rank's step
 * time is its own clock from the step's start to its update's end, the
 * parts are attributed interval by interval; "other" is what is left, so
 * an over-count (a blocked interval counted twice, or inside compute) makes
 * the sum exceed the step. Ranks are forked by the shm launcher with
 * pt_trainer_run writing log.metrics; the parent reads the lines. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "partrain/comm.h"
#include "partrain/train.h"
#include "pt_test.h"
#include "pt_test_files.h"

#define STEPS  6
#define NRANKS 4

static const char *const PARTS[] = {"compute", "dp", "tp", "pp", "zero", "optimizer", "other"};
#define NPARTS 7

static void write_text(const char *path, size_t n) {
    char *buf = malloc(n);
    if (!buf) exit(1);
    uint32_t x = 7;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        buf[i] = "abcdefgh ."[(x >> 24) % 10];
    }
    write_bytes(path, buf, n);
    free(buf);
}

static int rank_main(void *arg) {
    const pt_config *cfg = arg;
    pt_comm *world = NULL;
    pt_trainer *t = NULL;
    pt_comm_options o = {"shm", 30};
    pt_status st = pt_comm_new(&world, &o);
    if (st == PT_OK) st = pt_trainer_new_dist(&t, cfg, world);
    if (st == PT_OK) st = pt_trainer_run(t);
    if (st != PT_OK) fprintf(stderr, "rank: %s\n", pt_error_message());
    pt_trainer_free(t);
    pt_comm_free(world);
    return st == PT_OK ? 0 : 1;
}

/* o[key] as a number (NaN when it is not one: the checks then fail) */
static double num(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* The spread of part `name`: its per-rank list into v (NRANKS); min, max
 * and max_rank checked against it (the lines print 4 decimals). 0 when
 * there is no list of NRANKS. */
static int spread_ranks(const cJSON *o, const char *name, int step, double *v) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, name);
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(s, "ranks");
    if (!cJSON_IsArray(ranks) || cJSON_GetArraySize(ranks) != NRANKS) {
        fprintf(stderr, "step %d: %s has no list of %d ranks\n", step, name, NRANKS);
        CHECK(0);
        return 0;
    }
    double lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < NRANKS; r++) {
        v[r] = cJSON_GetArrayItem(ranks, r)->valuedouble;
        CHECK(v[r] >= 0);
        if (v[r] < lo) lo = v[r];
        if (v[r] > hi) hi = v[r];
    }
    CHECK_NEAR(num(s, "min"), lo, 1e-3, 0);
    CHECK_NEAR(num(s, "max"), hi, 1e-3, 0);
    int at = (int)num(s, "max_rank");
    CHECK(at >= 0 && at < NRANKS);
    if (at >= 0 && at < NRANKS) CHECK_NEAR(v[at], hi, 1e-3, 0);
    return 1;
}

/* Every step line of the file: the parts add up per rank; returns the
 * largest share of "other" in a rank's time over the steps after the
 * first (the first touches memory: it is all "other", printed, not
 * asserted: a preempted rank can have more), and the sum over the steps of
 * each part (all ranks) in sums. */
static double check_file(const char *path, const char *want_group, double *sums) {
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return 1;
    char line[1 << 16];
    int steps = 0, record = 0;
    double other[NRANKS] = {0}, wall_sum[NRANKS] = {0};
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        CHECK(o != NULL);
        if (cJSON_GetObjectItemCaseSensitive(o, "run")) record++;
        const cJSON *parts = cJSON_GetObjectItemCaseSensitive(o, "parts_ms");
        if (!parts) {
            cJSON_Delete(o);
            continue;
        }
        int step = (int)num(o, "step"), ok = 1;
        double wall[NRANKS], v[NRANKS], sum[NRANKS] = {0};
        ok = spread_ranks(cJSON_GetObjectItemCaseSensitive(o, "rank_step_ms"), "step", step, wall);
        for (int k = 0; k < NPARTS && ok; k++) {
            ok = spread_ranks(parts, PARTS[k], step, v);
            for (int r = 0; r < NRANKS; r++) sum[r] += v[r], sums[k] += v[r];
            if (k == NPARTS - 1 && step > 1)
                for (int r = 0; r < NRANKS; r++) other[r] += v[r];
        }
        for (int r = 0; r < NRANKS && ok; r++) {
            double d = fabs(sum[r] - wall[r]) / wall[r];
            if (!(d <= 0.02))
                fprintf(stderr,
                        "%s step %d rank %d: the parts add up to %.4f ms, the step took %.4f ms "
                        "(%.2f%% off)\n",
                        path, step, r, sum[r], wall[r], 100 * d);
            CHECK(d <= 0.02);
            if (step > 1) wall_sum[r] += wall[r];
        }
        /* pipeline runs: each stage's idle time outside its passes, within
         * the step of its slowest rank (ranks r and r + 1 at dp 2) and not
         * negative; the last stage waits for its first input every step */
        const cJSON *idle = cJSON_GetObjectItemCaseSensitive(o, "stage_idle_ms");
        CHECK((idle != NULL) == (cJSON_GetObjectItemCaseSensitive(o, "bubble") != NULL));
        for (int k = 0; idle && k < cJSON_GetArraySize(idle); k++) {
            double x = cJSON_GetArrayItem(idle, k)->valuedouble;
            double most = fmax(wall[2 * k], wall[2 * k + 1]);
            CHECK(x >= 0 && x <= most * 1.001);
            if (k == cJSON_GetArraySize(idle) - 1) CHECK(x > 0);
        }
        /* rank 0's own step time is the line's step_ms */
        CHECK_NEAR(num(o, "step_ms"), wall[0], 1e-3, 0);
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "groups");
        const cJSON *grp = cJSON_GetObjectItemCaseSensitive(g, want_group);
        CHECK(num(grp, "bytes") > 0);
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "mem_ranks");
        CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(mem, "total")), NRANKS);
        steps++;
        cJSON_Delete(o);
    }
    fclose(f);
    CHECK_EQ(record, 1);
    CHECK_EQ(steps, STEPS);
    double worst = 0;
    for (int r = 0; r < NRANKS; r++)
        if (other[r] / wall_sum[r] > worst) worst = other[r] / wall_sum[r];
    return worst;
}

static void run_layout(const char *dir, const char *name, const char *const *sets, int nsets,
                       const char *group, int part_positive) {
    pt_config cfg;
    pt_config_defaults(&cfg);
    char path[512], metrics[600], set[700];
    snprintf(path, sizeof path, "%s/text.txt", dir);
    snprintf(metrics, sizeof metrics, "%s/%s.jsonl", dir, name);
    const char *base[] = {"model.n_layer=2",   "model.n_embd=32",    "model.n_head=4",
                          "model.seq_len=16",  "train.batch_size=8", "train.threads=1",
                          "train.val_every=0", "parallel.dp=2",      "log.every=100"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        CHECK_OK(pt_config_set(&cfg, base[i]));
    snprintf(set, sizeof set, "train.steps=%d", STEPS);
    CHECK_OK(pt_config_set(&cfg, set));
    snprintf(set, sizeof set, "data.train=%s", path);
    CHECK_OK(pt_config_set(&cfg, set));
    snprintf(set, sizeof set, "log.metrics=%s", metrics);
    CHECK_OK(pt_config_set(&cfg, set));
    for (int i = 0; i < nsets; i++) CHECK_OK(pt_config_set(&cfg, sets[i]));
    int code = 0;
    pt_comm_options o = {"shm", 30};
    CHECK_OK(pt_launch(NRANKS, rank_main, &cfg, &o, &code));
    CHECK_EQ(code, 0);
    if (code != 0) return;
    double sums[NPARTS] = {0};
    double other = check_file(metrics, group, sums);
    printf("  %-14s parts add up on every rank of every step; summed over ranks and steps:", name);
    for (int k = 0; k < NPARTS; k++) printf(" %s %.1f", PARTS[k], sums[k]);
    printf(" ms; after step 1 the most 'other' on a rank: %.1f%%\n", 100 * other);
    CHECK(sums[0] > 0);             /* compute */
    CHECK(sums[part_positive] > 0); /* the layout's own part */
}

static void test_dp2_pp2(void) {
    const char *sets[] = {"parallel.pp=2", "parallel.microbatches=2"};
    run_layout(tmpdir, "dp2-pp2", sets, 2, "pp", 3);
}
static void test_dp2_tp2(void) {
    const char *sets[] = {"parallel.tp=2"};
    run_layout(tmpdir, "dp2-tp2", sets, 1, "tp", 2);
}
static void test_dp4_zero3(void) {
    const char *sets[] = {"parallel.dp=4", "parallel.zero=3"};
    run_layout(tmpdir, "dp4-zero3", sets, 2, "zero", 4);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-parts-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    write_text(tmp_path("text.txt"), 20000);
    RUN(test_dp2_pp2);
    RUN(test_dp2_tp2);
    RUN(test_dp4_zero3);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_DONE();
}
