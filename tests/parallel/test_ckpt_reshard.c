/* The reshard matrix (issue 39): a checkpoint saved under each of
 *   dp 4 | tp 2 x pp 2 | dp 2 x tp 2 with ZeRO-3 | pp 4 interleaved | one worker
 * resumes under each of the others, every rank reading only what it keeps
 * (trainer_ckpt.c, ckpt_read.c), and its next 10 steps follow the straight
 * one-worker run: loss and gradient norm per step within 1e-5 relative,
 * final parameters within the parity harness's bounds (parity_compare),
 * under AdamW (its moments carried) and SGD with momentum 0.9 (its buffer).
 *
 * The runs train on the data stream (pt_trainer_step on data.train), so
 * every pair also shows that the data position and the RNG travel in
 * state.json and need no resharding: the control moves the saved stream's
 * counter by one batch and the same resume then leaves the straight run
 * (it must fail the bound, or the check could not see a lost position).
 *
 * Each layout saves once per variant (at step 10 of 20) and every other
 * layout resumes from that one directory (a resume writes nothing here):
 * the 20 pairs of the five under both variants (about 5 s); --full adds
 * sequence parallelism, HSDP (ZeRO-2 in groups of 2), dp 2 x pp 2 with
 * ZeRO-1, zbv and tp 4 (90 pairs). shm only: the layouts differ in world
 * size. */
#include <cjson/cJSON.h>

#include "parallel/parity_harness.h"

#define SAVE_AT 10
#define NQUICK  5 /* the five; --full adds the rest */

/* 6 blocks: pp 4 with 2 chunks a rank needs 8 modules */
#define MODEL "model.n_layer=6 model.n_head=4 model.vocab_size=256"

static const struct {
    const char *name, *keys;
} layouts[] = {
    {"dp4", "parallel.dp=4"},
    {"tp2 x pp2", "parallel.tp=2 parallel.pp=2 parallel.microbatches=2"},
    {"dp2 x tp2 zero3", "parallel.dp=2 parallel.tp=2 parallel.zero=3"},
    {"pp4 interleaved", "parallel.pp=4 parallel.microbatches=4 parallel.schedule=interleaved "
                        "parallel.virtual_stages=2"},
    {"one worker", ""},
    /* --full */
    {"tp2 sp", "parallel.tp=2 parallel.sequence_parallel=true"},
    {"dp4 zero2 g2", "parallel.dp=4 parallel.zero=2 parallel.zero_group=2"},
    {"dp2 x pp2 zero1", "parallel.dp=2 parallel.pp=2 parallel.microbatches=2 parallel.zero=1"},
    {"pp2 zbv", "parallel.pp=2 parallel.microbatches=4 parallel.schedule=zbv"},
    {"tp4", "parallel.tp=4"},
};
#define NLAYOUT (int)(sizeof layouts / sizeof layouts[0])

static int full;

static void config(job *j, parity_variant v, const char *keys, const char *dir) {
    memset(j, 0, sizeof *j);
    parity_base(&j->cfg, v);
    if (v == PARITY_SGD) j->cfg.train.momentum = 0.9;
    CHECK_OK(parity_apply(&j->cfg, MODEL));
    CHECK_OK(parity_apply(&j->cfg, keys));
    j->use_data = 1;
    snprintf(j->cfg.data.train, sizeof j->cfg.data.train, "%s", tmp_path("train.txt"));
    snprintf(j->cfg.checkpoint.dir, sizeof j->cfg.checkpoint.dir, "%s", tmp_path(dir));
}

static void save_dir(char *out, size_t n, parity_variant v, int from) {
    snprintf(out, n, "reshard_%s_%d", parity_variant_name[v], from);
}

/* Resume layout `to` from layout `from`'s checkpoint and compare. */
static void resume_pair(const result *straight, parity_variant v, int from, int to) {
    char dir[64], what[120];
    save_dir(dir, sizeof dir, v, from);
    job j;
    result r = {0};
    config(&j, v, layouts[to].keys, dir);
    j.resume = 1;
    CHECK_OK(run_dp(&j, &r));
    snprintf(what, sizeof what, "%-16s -> %-16s", layouts[from].name, layouts[to].name);
    parity_expect_same(straight, &r, v, SAVE_AT, what);
    result_free(&r);
}

static void test_matrix(void) {
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        job j;
        result straight = {0};
        config(&j, (parity_variant)v, "", "unused");
        j.cfg.checkpoint.dir[0] = 0;
        CHECK_OK(run_dp(&j, &straight));
        int n = full ? NLAYOUT : NQUICK;
        for (int from = 0; from < n; from++) {
            char dir[64];
            result first = {0};
            save_dir(dir, sizeof dir, (parity_variant)v, from);
            config(&j, (parity_variant)v, layouts[from].keys, dir);
            j.stop_at = SAVE_AT;
            CHECK_OK(run_dp(&j, &first));
            result_free(&first);
        }
        for (int from = 0; from < n; from++)
            for (int to = 0; to < n; to++)
                if (to != from) resume_pair(&straight, (parity_variant)v, from, to);
        result_free(&straight);
    }
}

/* The control: with the data stream's saved counter moved on (other
 * windows drawn), the dp 2 x tp 2 ZeRO-3 checkpoint resumed at pp 4
 * leaves the straight run. */
static void test_position_matters(void) {
    job j;
    result straight = {0}, r = {0};
    config(&j, PARITY_ADAMW, "", "unused");
    j.cfg.checkpoint.dir[0] = 0;
    CHECK_OK(run_dp(&j, &straight));
    char src[64], cmd[1400], path[700];
    save_dir(src, sizeof src, PARITY_ADAMW, 2);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", tmp_path("moved"), tmp_path(src),
             tmp_path("moved"));
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/step_%08d/state.json", tmp_path("moved"), SAVE_AT);
    FILE *f = fopen(path, "rb");
    char text[65536] = {0};
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f) fclose(f);
    cJSON *root = cJSON_Parse(text), *rng = cJSON_GetObjectItem(root, "data_rng");
    cJSON *counter = cJSON_GetObjectItem(rng, "counter");
    CHECK(cJSON_IsString(counter));
    char moved[32];
    snprintf(moved, sizeof moved, "%016llx", strtoull(counter->valuestring, NULL, 16) + 8);
    cJSON_SetValuestring(counter, moved);
    char *out = cJSON_Print(root);
    f = fopen(path, "wb");
    CHECK(f && fputs(out, f) >= 0);
    if (f) fclose(f);
    free(out);
    cJSON_Delete(root);
    config(&j, PARITY_ADAMW, layouts[3].keys, "moved");
    j.resume = 1;
    CHECK_OK(run_dp(&j, &r));
    parity_verdict verdict;
    parity_compare(&straight, &r, PARITY_ADAMW, SAVE_AT, &verdict);
    CHECK(!verdict.ok_loss);
    printf("  data position moved: the resume leaves the straight run (loss %.1e relative)\n",
           verdict.loss_rel);
    result_free(&straight);
    result_free(&r);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--full")) full = 1;
    if (parity_init(argc, argv, "test-ckpt-reshard")) return 1;
    if (use_mpi) {
        fprintf(stderr, "test_ckpt_reshard: shm only (the layouts differ in world size)\n");
        return 1;
    }
    RUN(test_matrix);
    RUN(test_position_matters);
    return parity_done();
}
