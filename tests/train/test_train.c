/* Train-layer tests: the config table (parse, --set, types, unknown keys,
 * ranges, round trip), safetensors
 * (round trip, truncated, corrupt, another shape, GPT-2 buffers ignored), and
 * the trainer (loss goes down, determinism, micro-batches, bitwise resume,
 * no allocation per step) and the checkpoint directory protocol (a kill at
 * every point of a save, then eval's view and a resume; checkpoint.dir
 * checked before step 1; the lock; checkpoint.keep). */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../src/train/train_impl.h" /* pt_ckpt_test_hooks, pt_ckpt_read_state */
#include "partrain/train.h"
#include "pt_test.h"
#include "pt_test_files.h"

static void write_text(const char *path, size_t n) {
    static const char pattern[] = "the quick brown fox jumps over the lazy dog. ";
    char *s = malloc(n);
    for (size_t i = 0; i < n; i++) s[i] = pattern[i % (sizeof pattern - 1)];
    write_bytes(path, s, n);
    free(s);
}

static void tiny_config(pt_config *c) {
    pt_config_defaults(c);
    c->model = (pt_model_config){2, 32, 4, 256, 16};
    c->train.batch_size = 4;
    c->train.steps = 20;
    c->train.warmup_steps = 2;
    c->train.lr = 3e-3;
    c->train.min_lr = 3e-4;
    c->train.threads = 1;
    c->train.val_batches = 2;
    snprintf(c->data.train, sizeof c->data.train, "%s", tmp_path("train.txt"));
    snprintf(c->data.val, sizeof c->data.val, "%s", tmp_path("val.txt"));
}

static int msg_has(const char *s) {
    int ok = strstr(pt_error_message(), s) != NULL;
    if (!ok) fprintf(stderr, "  message '%s' lacks '%s'\n", pt_error_message(), s);
    return ok;
}

/* ---- config ---- */

/* Each of values for key is rejected by validation: one line naming the
 * key and the value, and holding `also`. */
static void expect_rejected(pt_config *c, const char *key, const char *const *values, size_t n,
                            const char *also) {
    for (size_t k = 0; k < n; k++) {
        char kv[160];
        snprintf(kv, sizeof kv, "%s=%s", key, values[k]);
        CHECK_OK(pt_config_set(c, kv));
        int ok = pt_config_validate(c) == PT_ERR_INVALID && msg_has(key) && msg_has(values[k]) &&
                 msg_has(also);
        CHECK(ok);
        if (!ok) printf("  %s: %s\n", kv, pt_error_message());
    }
}

static void test_config(void) {
    pt_config c, d;
    pt_config_defaults(&c);
    CHECK_OK(pt_config_validate(&c));
    CHECK_OK(pt_config_load_string(
        &c, "{\"model\": {\"n_layer\": 3, \"n_head\": 2}, \"train.lr\": 0.01}", "cfg.json"));
    CHECK_EQ(c.model.n_layer, 3);
    CHECK_EQ(c.model.n_head, 2);
    CHECK_NEAR(c.train.lr, 0.01, 0, 0);
    CHECK_OK(pt_config_set(&c, "data.train=foo.txt"));
    CHECK(!strcmp(c.data.train, "foo.txt"));
    CHECK_OK(pt_config_set(&c, "train.steps=7"));
    CHECK_EQ(c.train.steps, 7);

    pt_config_defaults(&c);
    CHECK(pt_config_load_string(&c, "{\"model\": {\"n_layers\": 3}}", "cfg.json") ==
          PT_ERR_INVALID);
    CHECK(msg_has("cfg.json") && msg_has("model.n_layers"));
    CHECK(pt_config_load_string(&c, "{\"modle\": {\"n_layer\": 3}}", "cfg.json") == PT_ERR_INVALID);
    CHECK(msg_has("modle"));
    CHECK(pt_config_load_string(&c, "{\"model\": {\"n_layer\": \"3\"}}", "cfg.json") ==
          PT_ERR_INVALID);
    CHECK(msg_has("model.n_layer") && msg_has("integer"));
    CHECK(pt_config_load_string(&c, "{\"model\": {\"n_layer\": 2.5}}", "cfg.json") ==
          PT_ERR_INVALID);
    CHECK(pt_config_load_string(&c, "{\"data\": {\"train\": 3}}", "cfg.json") == PT_ERR_INVALID);
    CHECK(msg_has("data.train") && msg_has("string"));
    CHECK(pt_config_load_string(&c, "{\"model\": {\"n_layer\": -1}}", "cfg.json") ==
          PT_ERR_INVALID);
    CHECK(msg_has("model.n_layer"));
    CHECK(pt_config_load_string(&c, "{\"train\": {\"batch_size\": 0}}", "cfg.json") ==
          PT_ERR_INVALID);
    CHECK(msg_has("train.batch_size"));
    CHECK(pt_config_load_string(&c, "{\"model\": {\"n_layer\": 3,}", "cfg.json") == PT_ERR_FORMAT);
    CHECK(msg_has("cfg.json") && msg_has("invalid JSON"));
    CHECK(pt_config_load_string(&c, "[1, 2]", "cfg.json") == PT_ERR_FORMAT);
    CHECK(pt_config_load_string(&c, "{\"model\": 3}", "cfg.json") == PT_ERR_INVALID &&
          msg_has("model must be an object"));
    CHECK(pt_config_set(&c, "train.nope=1") == PT_ERR_INVALID && msg_has("train.nope"));
    CHECK(pt_config_set(&c, "train.steps=abc") == PT_ERR_INVALID && msg_has("train.steps"));
    CHECK(pt_config_set(&c, "train.steps") == PT_ERR_INVALID);
    /* integer keys' limits and values print as integers, not %g (issue 37,
     * item 10): from --set, from a file, and from a struct filled by code */
    CHECK(pt_config_set(&c, "parallel.pp=0") == PT_ERR_INVALID &&
          msg_has("--set: parallel.pp must be in [1, 1048576] (got 0)"));
    CHECK(pt_config_set(&c, "parallel.pp=1e11") == PT_ERR_INVALID &&
          msg_has("parallel.pp must be in [1, 1048576] (got 100000000000)"));
    CHECK(pt_config_set(&c, "train.steps=2000000000") == PT_ERR_INVALID &&
          msg_has("train.steps must be in [1, 1000000000] (got 2000000000)"));
    CHECK(pt_config_load_string(&c, "{\"model\": {\"seq_len\": 2097152}}", "cfg.json") ==
              PT_ERR_INVALID &&
          msg_has("cfg.json: model.seq_len must be in [1, 1048576] (got 2097152)"));
    CHECK(pt_config_set(&c, "comm.timeout=0") == PT_ERR_INVALID &&
          msg_has("comm.timeout must be in [0.1, 1e+06] (got 0)"));
    pt_config_defaults(&c);
    c.parallel.zero_group = -3;
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID &&
          msg_has("parallel.zero_group must be in [0, 1048576] (got -3)"));
    pt_config_defaults(&c);
    CHECK(pt_config_set(&c, "parallel.schedule=zigzag") == PT_ERR_INVALID &&
          msg_has("parallel.schedule"));
    CHECK(pt_config_load_file(&c, tmp_path("no-such.json")) == PT_ERR_IO &&
          msg_has("no-such.json"));

    pt_config_defaults(&c);
    c.model.n_embd = 100;
    c.model.n_head = 3;
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("n_head"));
    pt_config_defaults(&c);
    CHECK_OK(pt_config_set(&c, "parallel.tp=3")); /* 4 heads */
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.tp (3)") &&
          msg_has("model.n_head (4)"));
    CHECK_OK(pt_config_set(&c, "parallel.tp=2"));
    CHECK_OK(pt_config_validate(&c));
    CHECK_OK(pt_config_set(&c, "parallel.sequence_parallel=true"));
    CHECK_OK(pt_config_validate(&c));
    CHECK_OK(pt_config_set(&c, "parallel.tp=1"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.sequence_parallel") &&
          msg_has("parallel.tp > 1"));
    CHECK_OK(pt_config_set(&c, "parallel.tp=2"));
    CHECK_OK(pt_config_set(&c, "model.seq_len=127"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("model.seq_len (127)") &&
          msg_has("divisible by parallel.tp (2)"));
    /* pipelines (issue 13, item 8): the default schedule is none (1f1b at
     * pp > 1); a pipeline schedule needs pp > 1; the schedule's rules on
     * micro-batches and chunks, and the stage cut, one line each */
    pt_config_defaults(&c);
    CHECK(!strcmp(c.parallel.schedule, "none"));
    CHECK_OK(pt_config_validate(&c));
    CHECK_OK(pt_config_set(&c, "parallel.schedule=1f1b"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.schedule = 1f1b") &&
          msg_has("parallel.pp > 1"));
    CHECK_OK(pt_config_set(&c, "parallel.pp=2"));
    CHECK_OK(pt_config_validate(&c));
    CHECK(!strcmp(pt_config_schedule(&c), "1f1b"));
    CHECK_OK(pt_config_set(&c, "parallel.schedule=none"));
    CHECK(!strcmp(pt_config_schedule(&c), "1f1b"));
    CHECK_OK(pt_config_set(&c, "parallel.pp=7")); /* the default model has 6 modules */
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.pp"));
    CHECK_OK(pt_config_set(&c, "parallel.pp=2"));
    CHECK_OK(pt_config_set(&c, "parallel.schedule=interleaved"));
    CHECK_OK(pt_config_set(&c, "parallel.virtual_stages=2"));
    CHECK_OK(pt_config_set(&c, "parallel.microbatches=3"));
    CHECK_OK(pt_config_set(&c, "train.batch_size=6"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.microbatches") &&
          msg_has("3"));
    CHECK_OK(pt_config_set(&c, "parallel.microbatches=2"));
    CHECK_OK(pt_config_validate(&c));
    /* virtual_stages 0 is the schedule's own, as documented: interleaved
     * runs with 2 (issue 37, item 8: it was refused as "got 1") */
    CHECK_OK(pt_config_set(&c, "parallel.virtual_stages=0"));
    CHECK_OK(pt_config_validate(&c));
    CHECK_EQ(pt_config_virtual_stages(&c), 2);
    CHECK_OK(pt_config_set(&c, "parallel.virtual_stages=1"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("virtual_stages >= 2 (got 1)"));
    CHECK_OK(pt_config_set(&c, "parallel.virtual_stages=2"));
    CHECK_OK(pt_config_set(&c, "parallel.schedule=1f1b"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.virtual_stages"));
    CHECK_OK(pt_config_set(&c, "parallel.virtual_stages=0"));
    CHECK_OK(pt_config_set(&c, "parallel.stage_layers=3,3"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.stage_layers"));
    CHECK_OK(pt_config_set(&c, "parallel.stage_layers=3,1"));
    CHECK_OK(pt_config_validate(&c));
    CHECK_OK(pt_config_set(&c, "parallel.pp=1"));
    CHECK_OK(pt_config_set(&c, "parallel.schedule=none"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.stage_layers") &&
          msg_has("pp > 1"));
    CHECK_OK(pt_config_set(&c, "parallel.stage_layers="));
    CHECK_OK(pt_config_set(&c, "parallel.pp=2"));
    CHECK_OK(pt_config_set(&c, "parallel.sync=local_sgd"));
    CHECK_OK(pt_config_validate(&c));
    /* the asynchronous modes under a pipeline checkpoint too (their
     * per-rank state in full-tensor terms) */
    CHECK_OK(pt_config_set(&c, "train.batch_size=8"));
    CHECK_OK(pt_config_set(&c, "parallel.dp=2"));
    CHECK_OK(pt_config_set(&c, "checkpoint.dir=/tmp/x"));
    CHECK_OK(pt_config_validate(&c));
    pt_config_defaults(&c);
    c.train.batch_size = 6;
    c.parallel.microbatches = 4;
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("microbatches"));
    /* per-part choices (issue 14, item 5): one recompute mode per pipeline
     * rank; ZeRO-3 modules kept whole, by GPT-2's names (4 blocks here) */
    pt_config_defaults(&c);
    CHECK_OK(pt_config_set(&c, "model.recompute=selective"));
    CHECK_OK(pt_config_set(&c, "parallel.pp=2"));
    CHECK(pt_config_stage_recompute(&c, 1) == PT_RECOMPUTE_SELECTIVE); /* empty: recompute */
    CHECK_OK(pt_config_set(&c, "model.stage_recompute=full,none"));
    CHECK_OK(pt_config_validate(&c));
    CHECK(pt_config_stage_recompute(&c, 0) == PT_RECOMPUTE_FULL);
    CHECK(pt_config_stage_recompute(&c, 1) == PT_RECOMPUTE_NONE);
    static const char *const bad_rc[] = {"full", "full,none,none", "full,fast", "full,Selective"};
    expect_rejected(&c, "model.stage_recompute", bad_rc, sizeof bad_rc / sizeof bad_rc[0], "");
    /* the comma-list grammar (core.h; issue 37, items 7 and 9): an empty
     * entry is refused where the value is given, blaming that entry (not
     * the valid one before it); blanks around an entry are fine */
    static const struct {
        const char *value, *says;
    } empty_rc[] = {
        {"full,none,", "--set: model.stage_recompute = \"full,none,\": entry 3 is empty"},
        {",none", "entry 1 is empty"},
        {"full,,none", "entry 2 is empty"},
        {" ", "entry 1 is empty"}};
    for (size_t k = 0; k < sizeof empty_rc / sizeof empty_rc[0]; k++) {
        char kv[160];
        snprintf(kv, sizeof kv, "model.stage_recompute=%s", empty_rc[k].value);
        CHECK(pt_config_set(&c, kv) == PT_ERR_INVALID && msg_has(empty_rc[k].says));
    }
    CHECK(pt_config_load_string(&c, "{\"parallel.stage_layers\": \"2,2,\"}", "cfg.json") ==
              PT_ERR_INVALID &&
          msg_has("cfg.json: parallel.stage_layers = \"2,2,\": entry 3 is empty"));
    /* a struct filled by code is held to the same grammar by validation */
    snprintf(c.train.stage_recompute, sizeof c.train.stage_recompute, "full,none,");
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("entry 3 is empty"));
    CHECK_OK(pt_config_set(&c, "model.stage_recompute= full , none"));
    CHECK(!strcmp(c.train.stage_recompute, "full,none")); /* one spelling, for every reader */
    CHECK_OK(pt_config_validate(&c));
    CHECK(pt_config_stage_recompute(&c, 0) == PT_RECOMPUTE_FULL);
    CHECK(pt_config_stage_recompute(&c, 1) == PT_RECOMPUTE_NONE);
    CHECK_OK(pt_config_set(&c, "model.stage_recompute=full"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.pp is 2"));
    CHECK_OK(pt_config_set(&c, "parallel.pp=1")); /* one entry at pp 1 */
    CHECK_OK(pt_config_validate(&c));
    CHECK(pt_config_stage_recompute(&c, 0) == PT_RECOMPUTE_FULL);
    char longv[200] = "model.stage_recompute=";
    while (strlen(longv) < sizeof longv - 6) strcat(longv, "none,");
    CHECK(pt_config_set(&c, longv) == PT_ERR_INVALID && msg_has("model.stage_recompute") &&
          msg_has("too long"));
    pt_config_defaults(&c);
    CHECK_OK(pt_config_set(&c, "parallel.zero=2"));
    CHECK_OK(pt_config_set(&c, "parallel.zero_whole=head"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("parallel.zero_whole") &&
          msg_has("parallel.zero = 3 (got 2)"));
    CHECK_OK(pt_config_set(&c, "parallel.zero=3"));
    CHECK_OK(pt_config_set(&c, "parallel.zero_whole=h.3,embedding,head,h.0"));
    CHECK_OK(pt_config_validate(&c));
    unsigned char whole[6];
    CHECK_OK(pt_config_zero_whole(&c, whole));
    CHECK(whole[0] && whole[1] && !whole[2] && !whole[3] && whole[4] && whole[5]);
    static const char *const bad_zw[] = {"h.4", "h.01", "h.-1", "h.", "h.1x", "wte", "h.+1"};
    expect_rejected(&c, "parallel.zero_whole", bad_zw, sizeof bad_zw / sizeof bad_zw[0],
                    "is not a module (embedding, head, or h.0 .. h.3)");
    static const char *const empty_zw[] = {"embedding,", "head,,h.0", ",head"};
    for (size_t k = 0; k < sizeof empty_zw / sizeof empty_zw[0]; k++) {
        char kv[160];
        snprintf(kv, sizeof kv, "parallel.zero_whole=%s", empty_zw[k]);
        CHECK(pt_config_set(&c, kv) == PT_ERR_INVALID && msg_has("parallel.zero_whole") &&
              msg_has("is empty"));
    }
    CHECK_OK(pt_config_set(&c, "parallel.zero_whole=head,h.1,head"));
    CHECK(pt_config_validate(&c) == PT_ERR_INVALID && msg_has("entry 3 ('head') is named twice"));
    CHECK_OK(pt_config_set(&c, "parallel.zero_whole= head ,\th.1"));
    CHECK_OK(pt_config_zero_whole(&c, whole));
    CHECK(!whole[0] && !whole[1] && whole[2] && whole[5]);

    /* round trip through JSON */
    tiny_config(&c);
    c.train.lr = 1.2345678901e-3;
    char *json = pt_config_to_json(&c);
    CHECK(json != NULL);
    pt_config_defaults(&d);
    CHECK_OK(pt_config_load_string(&d, json, "roundtrip"));
    CHECK(memcmp(&c, &d, sizeof c) == 0);
    free(json);
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

/* ---- trainer ---- */

static pt_trainer *new_trainer(const pt_config *c) {
    pt_trainer *t = NULL;
    CHECK_OK(pt_trainer_new(&t, c));
    return t;
}

static void run_steps(pt_trainer *t, int n, float *first, float *last) {
    for (int i = 0; i < n; i++) {
        pt_step_info info;
        CHECK_OK(pt_trainer_step(t, &info));
        if (i == 0 && first) *first = info.loss;
        if (last) *last = info.loss;
    }
}

static void test_train_learns(void) {
    pt_config c;
    tiny_config(&c);
    pt_trainer *t = new_trainer(&c);
    if (!t) return;
    float v0 = 0, v1 = 0, first = 0, last = 0;
    CHECK_OK(pt_trainer_validate(t, &v0));
    CHECK_NEAR(v0, 5.545, 0.1, 0); /* ln 256 at init */
    run_steps(t, 30, &first, &last);
    CHECK_OK(pt_trainer_validate(t, &v1));
    fprintf(stderr, "  loss %.3f -> %.3f, val %.3f -> %.3f\n", first, last, v0, v1);
    CHECK(last < first - 1.0f);
    CHECK(v1 < v0 - 1.0f);
    pt_trainer_free(t);
}

static void test_no_alloc_per_step(void) {
    pt_config c;
    tiny_config(&c);
    pt_trainer *t = new_trainer(&c);
    if (!t) return;
    run_steps(t, 1, NULL, NULL); /* warm-up */
    size_t cur = pt_mem_current_total();
    for (int i = 0; i < 3; i++) {
        pt_step_info info;
        CHECK_OK(pt_trainer_step(t, &info));
        CHECK_EQ(pt_mem_peak_total(), cur);
        CHECK_EQ(pt_mem_current_total(), cur);
    }
    CHECK(pt_mem_peak(PT_MEM_OPTIM) == 2 * pt_mem_peak(PT_MEM_PARAMS));
    pt_trainer_free(t);
}

static int same_params(pt_trainer *a, pt_trainer *b) {
    pt_model *ma = pt_trainer_model(a), *mb = pt_trainer_model(b);
    size_t n = pt_model_num_params(ma);
    return n == pt_model_num_params(mb) &&
           !memcmp(pt_model_params(ma), pt_model_params(mb), n * sizeof(float)) &&
           !memcmp(pt_adamw_m(pt_trainer_optim(a)), pt_adamw_m(pt_trainer_optim(b)),
                   n * sizeof(float)) &&
           !memcmp(pt_adamw_v(pt_trainer_optim(a)), pt_adamw_v(pt_trainer_optim(b)),
                   n * sizeof(float));
}

static void test_determinism(void) {
    pt_config c;
    tiny_config(&c);
    pt_trainer *a = new_trainer(&c), *b = new_trainer(&c);
    if (!a || !b) return;
    run_steps(a, 5, NULL, NULL);
    run_steps(b, 5, NULL, NULL);
    CHECK(same_params(a, b));
    pt_trainer_free(b);
    /* a different seed gives a different run */
    c.train.seed = 99;
    b = new_trainer(&c);
    run_steps(b, 5, NULL, NULL);
    CHECK(!same_params(a, b));
    pt_trainer_free(a);
    pt_trainer_free(b);
}

/* Two micro-batches of 2 = one batch of 4 (up to float summation order). */
static void test_microbatches(void) {
    pt_config c;
    tiny_config(&c);
    pt_trainer *a = new_trainer(&c);
    c.parallel.microbatches = 2;
    pt_trainer *b = new_trainer(&c);
    if (!a || !b) return;
    float la = 0, lb = 0;
    run_steps(a, 3, NULL, &la);
    run_steps(b, 3, NULL, &lb);
    CHECK_NEAR(la, lb, 1e-4, 1e-4);
    pt_model *ma = pt_trainer_model(a), *mb = pt_trainer_model(b);
    double maxd = 0;
    for (size_t i = 0; i < pt_model_num_params(ma); i++) {
        double dd = fabs((double)pt_model_params(ma)[i] - pt_model_params(mb)[i]);
        if (dd > maxd) maxd = dd;
    }
    CHECK(maxd < 1e-4);
    pt_trainer_free(a);
    pt_trainer_free(b);
}

/* 20 steps straight == 10 steps, save, new process state, resume, 10 steps:
 * every parameter and moment bit for bit. */
static void test_resume_bitwise(void) {
    pt_config c;
    tiny_config(&c);
    pt_trainer *a = new_trainer(&c);
    if (!a) return;
    run_steps(a, 20, NULL, NULL);

    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path("ckpt"));
    pt_trainer *b = new_trainer(&c);
    run_steps(b, 10, NULL, NULL);
    CHECK_OK(pt_trainer_save(b));
    pt_trainer_free(b);

    /* the checkpoint is in place, named by latest */
    CHECK(access(tmp_path("ckpt/latest"), F_OK) == 0);
    CHECK(access(tmp_path("ckpt/step_00000010/model.safetensors"), F_OK) == 0);
    CHECK(access(tmp_path("ckpt/step_00000010/state.json"), F_OK) == 0);

    /* a save that crashed half-way leaves only a temporary directory, which
     * resume never reads */
    CHECK(mkdir(tmp_path("ckpt/.tmp-step_00000011-1"), 0755) == 0);
    write_bytes(tmp_path("ckpt/.tmp-step_00000011-1/model.safetensors"), "\x10\0\0", 3);

    pt_trainer *r = new_trainer(&c);
    /* ... and the next trainer on the directory removes before step 1 */
    CHECK(access(tmp_path("ckpt/.tmp-step_00000011-1"), F_OK) != 0);
    CHECK_OK(pt_trainer_resume(r));
    CHECK_EQ(pt_trainer_step_count(r), 10);
    run_steps(r, 10, NULL, NULL);
    CHECK_EQ(pt_trainer_step_count(r), 20);
    CHECK(same_params(a, r));
    /* saving the same step again replaces it cleanly */
    CHECK_OK(pt_trainer_save(r));
    CHECK_OK(pt_trainer_save(r));

    /* the saved config reads back */
    pt_config saved;
    CHECK_OK(pt_checkpoint_read_config(tmp_path("ckpt/step_00000020"), &saved));
    CHECK_EQ(saved.model.n_embd, 32);
    char stepdir[1200];
    CHECK_OK(pt_checkpoint_resolve(tmp_path("ckpt"), stepdir, sizeof stepdir));
    CHECK(strstr(stepdir, "step_00000020") != NULL);

    /* while r holds the directory, a second trainer on it is refused,
     * naming the directory and the holder (this process) */
    pt_trainer *o = NULL;
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d", (int)getpid());
    CHECK(pt_trainer_new(&o, &c) == PT_ERR_IO && o == NULL);
    CHECK(msg_has("checkpoint.dir") && msg_has(tmp_path("ckpt")) && msg_has("in use") &&
          msg_has(pid));
    pt_trainer_free(r);

    /* resuming into another shape is refused, naming the key */
    pt_config other = c;
    other.model.n_embd = 64;
    o = new_trainer(&other);
    CHECK(pt_trainer_resume(o) == PT_ERR_FORMAT && msg_has("model.n_embd"));
    pt_trainer_free(o);
    pt_trainer_free(a);
}

/* ---- the checkpoint directory protocol ---- */

static int exists(const char *path) {
    return access(path, F_OK) == 0;
}

/* Entries of dir that the protocol hides (.tmp-*, .old-*, .del-*,
 * .latest.tmp*): what killed saves leave behind. */
static int hidden_leftovers(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            strcmp(e->d_name, ".lock")) {
            fprintf(stderr, "  leftover %s/%s\n", dir, e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

/* Step directories (step_*) in dir. */
static int step_dirs(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += !strncmp(e->d_name, "step_", 5);
    closedir(d);
    return n;
}

static void sh(const char *fmt, const char *a, const char *b) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0) {
        fprintf(stderr, "  failed: %s\n", cmd);
        exit(1);
    }
}

static float *copy_params(pt_trainer *t) {
    size_t n = pt_model_num_params(pt_trainer_model(t));
    float *p = malloc(n * sizeof(float));
    memcpy(p, pt_model_params(pt_trainer_model(t)), n * sizeof(float));
    return p;
}

/* A kill at every point of a save (pt_ckpt_point; the child process
 * _exits there, as a kill would), for a save of a new step and for saving
 * again the step `latest` names (resume at the last step, then save), on
 * the swap path and on the fallback that moves the old copy aside, and on
 * the swap path with checkpoint.async (the writer thread's exit). After
 * each: what eval reads (nothing repaired yet) is a complete checkpoint of
 * the step latest names or of the new one, and a new trainer resumes from it
 * bitwise, with no leftover of the killed save. */
static void test_ckpt_crash_points(void) {
    pt_config c;
    tiny_config(&c);
    c.checkpoint.keep = 0;
    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path("crash-src"));
    pt_trainer *t = new_trainer(&c);
    if (!t) return;
    run_steps(t, 5, NULL, NULL);
    CHECK_OK(pt_trainer_save(t));
    run_steps(t, 5, NULL, NULL);
    CHECK_OK(pt_trainer_save(t)); /* crash-src: step 5, step 10, latest -> 10 */
    float *p10 = copy_params(t);
    run_steps(t, 1, NULL, NULL);
    float *p11 = copy_params(t);
    pt_trainer_free(t);
    size_t n = 0;
    c.checkpoint.keep = 1; /* the save prunes step 5 (and 10 after an 11) */
    int cases = 0, crashed = 0;
    for (int async = 0; async <= 1; async++)
        for (int fallback = 0; fallback <= 1 - async; fallback++)
            for (int resave = 0; resave <= 1; resave++)
                for (int point = PT_CKPT_AT_BEGUN; point < PT_CKPT_AT_COUNT; point++) {
                    /* the points this save passes */
                    int passes =
                        point != PT_CKPT_AT_MOVED_ASIDE && point != PT_CKPT_AT_OLD_HALF_REMOVED;
                    if (resave) passes = point != PT_CKPT_AT_MOVED_ASIDE || fallback;
                    int failures = pt_test_failures_;
                    char dir[64];
                    snprintf(dir, sizeof dir, "crash-%d-%d-%d-%d", async, fallback, resave, point);
                    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path(dir));
                    sh("cp -r '%s' '%s'", tmp_path("crash-src"), c.checkpoint.dir);
                    fflush(NULL);
                    pid_t pid = fork();
                    if (pid == 0) {
                        alarm(60); /* a hang fails the case instead of the suite */
                        pt_ckpt_test_hooks(point, fallback);
                        pt_trainer *k = NULL;
                        pt_config ca = c; /* async: the writer thread dies there */
                        ca.checkpoint.async = async;
                        pt_status st = pt_trainer_new(&k, &ca);
                        if (st == PT_OK) st = pt_trainer_resume(k);
                        pt_step_info info;
                        if (st == PT_OK && !resave) st = pt_trainer_step(k, &info);
                        if (st == PT_OK) st = pt_trainer_save(k);
                        if (st == PT_OK) st = pt_trainer_save_wait(k);
                        if (st != PT_OK) fprintf(stderr, "  child: %s\n", pt_error_message());
                        _exit(st == PT_OK ? 0 : 1);
                    }
                    int ws = 0;
                    CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
                    int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
                    CHECK_EQ(code, passes ? PT_CKPT_CRASH_EXIT : 0);
                    cases++;
                    crashed += code == PT_CKPT_CRASH_EXIT;

                    /* what eval reads: resolve, config, model, before any repair */
                    char stepdir[1200], model[1300];
                    pt_config saved;
                    cJSON *state = NULL;
                    int step = -1;
                    CHECK_OK(pt_checkpoint_resolve(c.checkpoint.dir, stepdir, sizeof stepdir));
                    CHECK_OK(pt_checkpoint_read_config(stepdir, &saved));
                    if (pt_ckpt_read_state(stepdir, &state) == PT_OK) {
                        cJSON *s = cJSON_GetObjectItemCaseSensitive(state, "step");
                        step = cJSON_IsNumber(s) ? s->valueint : -1;
                        cJSON_Delete(state);
                    }
                    CHECK(step == 10 || (step == 11 && !resave));
                    pt_model *m = NULL;
                    CHECK_OK(pt_model_new(&m, &c.model, 1));
                    n = pt_model_num_params(m);
                    snprintf(model, sizeof model, "%s/model.safetensors", stepdir);
                    CHECK_OK(pt_safetensors_load(model, m, pt_model_params(m)));
                    CHECK(!memcmp(pt_model_params(m), step == 11 ? p11 : p10, n * sizeof(float)));
                    pt_model_free(m);

                    /* the next run: repairs, resumes bitwise, leaves nothing hidden */
                    pt_trainer *r = new_trainer(&c);
                    if (!r) {
                        fprintf(stderr, "  ^ fallback %d, resave %d, crash at point %d\n", fallback,
                                resave, point);
                        continue;
                    }
                    CHECK_EQ(hidden_leftovers(c.checkpoint.dir), 0);
                    CHECK_OK(pt_trainer_resume(r));
                    int at = pt_trainer_step_count(r);
                    CHECK(at == 10 || (at == 11 && !resave));
                    CHECK(!memcmp(pt_model_params(pt_trainer_model(r)), at == 11 ? p11 : p10,
                                  n * sizeof(float)));
                    CHECK_OK(pt_trainer_save(r));
                    /* keep = 1, and what latest names: a step 11 that a kill kept
                     * latest from naming is the newest, so it stays beside 10 */
                    char s11[1100];
                    snprintf(s11, sizeof s11, "%s/step_00000011", c.checkpoint.dir);
                    int newer = at == 10 && exists(s11);
                    CHECK_EQ(step_dirs(c.checkpoint.dir), newer ? 2 : 1);
                    CHECK_EQ(hidden_leftovers(c.checkpoint.dir), 0);
                    pt_trainer_free(r);
                    if (pt_test_failures_ != failures)
                        fprintf(stderr, "  ^ async %d, fallback %d, resave %d, crash at point %d\n",
                                async, fallback, resave, point);
                }
    printf("  %d kills at save points, %d cases\n", crashed, cases);
    CHECK(crashed >= 45);
    free(p10);
    free(p11);
}

/* checkpoint.dir is checked before step 1: created when missing; a regular
 * file, or a path under one, is refused at once naming it. */
static void test_ckpt_dir_checked(void) {
    pt_config c;
    pt_trainer *t = NULL;
    tiny_config(&c);
    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path("new/ck"));
    t = new_trainer(&c);
    CHECK(exists(tmp_path("new/ck")) && exists(tmp_path("new/ck/.lock")));
    pt_trainer_free(t);
    write_text(tmp_path("plain"), 10);
    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path("plain"));
    t = (pt_trainer *)1;
    CHECK(pt_trainer_new(&t, &c) == PT_ERR_IO && t == NULL);
    CHECK(msg_has("checkpoint.dir") && msg_has(tmp_path("plain")) && msg_has("not a directory"));
    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path("plain/ck"));
    CHECK(pt_trainer_new(&t, &c) == PT_ERR_IO && t == NULL);
    CHECK(msg_has("checkpoint.dir") && msg_has(tmp_path("plain/ck")) && msg_has("Not a directory"));
    CHECK_EQ(pt_mem_current_total(), 0);
}

/* checkpoint.keep = K keeps the K newest step directories, and the one
 * latest names even when it is older; 0 keeps all. */
static void test_ckpt_keep(void) {
    pt_config c;
    tiny_config(&c);
    c.checkpoint.keep = 2;
    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path("keep"));
    pt_trainer *t = new_trainer(&c);
    if (!t) return;
    for (int s = 0; s < 5; s++) {
        run_steps(t, 1, NULL, NULL);
        CHECK_OK(pt_trainer_save(t));
    }
    pt_trainer_free(t);
    CHECK_EQ(step_dirs(tmp_path("keep")), 2);
    CHECK(exists(tmp_path("keep/step_00000004")) && exists(tmp_path("keep/step_00000005")));
    /* latest at step 4 (an older one, as after resuming from it): saving
     * it again keeps it and the newest, step 5 */
    write_bytes(tmp_path("keep/latest"), "step_00000004\n", 14);
    c.checkpoint.keep = 1;
    t = new_trainer(&c);
    CHECK_OK(pt_trainer_resume(t));
    CHECK_EQ(pt_trainer_step_count(t), 4);
    CHECK_OK(pt_trainer_save(t));
    CHECK(exists(tmp_path("keep/step_00000004")) && exists(tmp_path("keep/step_00000005")));
    /* keep = 0: nothing pruned */
    run_steps(t, 2, NULL, NULL);
    pt_trainer_free(t);
    c.checkpoint.keep = 0;
    t = new_trainer(&c);
    CHECK_OK(pt_trainer_resume(t));
    run_steps(t, 2, NULL, NULL);
    CHECK_OK(pt_trainer_save(t));
    CHECK_EQ(step_dirs(tmp_path("keep")), 3); /* 4, 5, 6 */
    pt_trainer_free(t);
    CHECK_EQ(hidden_leftovers(tmp_path("keep")), 0);
}

/* ---- safetensors ---- */

static void copy_prefix(const char *from, const char *to, long n, long flip_at) {
    FILE *f = fopen(from, "rb");
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (flip_at >= 0) buf[flip_at] = '{';
    write_bytes(to, buf, got);
    free(buf);
}

static void test_safetensors(void) {
    pt_model_config mc = {2, 16, 2, 256, 8};
    pt_model *m = NULL, *m2 = NULL, *big = NULL;
    CHECK_OK(pt_model_new(&m, &mc, 1));
    CHECK_OK(pt_model_new(&m2, &mc, 1));
    if (!m || !m2) return;
    pt_model_draw_weights(m, 5);
    char path[512];
    snprintf(path, sizeof path, "%s", tmp_path("m.safetensors"));
    CHECK_OK(pt_safetensors_save(path, m, pt_model_params(m)));
    CHECK_OK(pt_safetensors_load(path, m2, pt_model_params(m2)));
    CHECK(!memcmp(pt_model_params(m), pt_model_params(m2), pt_model_num_params(m) * 4));

    long n = file_size(path);
    copy_prefix(path, tmp_path("trunc.safetensors"), n - 10, -1);
    CHECK(pt_safetensors_load(tmp_path("trunc.safetensors"), m2, pt_model_params(m2)) ==
              PT_ERR_FORMAT &&
          msg_has("trunc.safetensors"));
    copy_prefix(path, tmp_path("tiny.safetensors"), 5, -1);
    CHECK(pt_safetensors_load(tmp_path("tiny.safetensors"), m2, pt_model_params(m2)) ==
              PT_ERR_FORMAT &&
          msg_has("tiny.safetensors"));
    copy_prefix(path, tmp_path("corrupt.safetensors"), n, 20);
    CHECK(pt_safetensors_load(tmp_path("corrupt.safetensors"), m2, pt_model_params(m2)) ==
              PT_ERR_FORMAT &&
          msg_has("corrupt.safetensors"));
    write_bytes(tmp_path("garbage.safetensors"), "\xff\xff\xff\xff\xff\xff\xff\x7fxxxx", 12);
    CHECK(pt_safetensors_load(tmp_path("garbage.safetensors"), m2, pt_model_params(m2)) ==
          PT_ERR_FORMAT);

    /* another shape: more layers -> unexpected tensors; wider -> shape */
    pt_model_config bc = mc;
    bc.n_layer = 3;
    CHECK_OK(pt_model_new(&big, &bc, 1));
    CHECK_OK(pt_safetensors_save(tmp_path("big.safetensors"), big, pt_model_params(big)));
    CHECK(pt_safetensors_load(tmp_path("big.safetensors"), m2, pt_model_params(m2)) ==
              PT_ERR_FORMAT &&
          msg_has("h.2.") && msg_has("another model shape"));
    CHECK(pt_safetensors_load(path, big, pt_model_params(big)) == PT_ERR_FORMAT &&
          msg_has("missing tensor"));
    pt_model_free(big);
    bc = mc;
    bc.n_embd = 32;
    CHECK_OK(pt_model_new(&big, &bc, 1));
    CHECK(pt_safetensors_load(path, big, pt_model_params(big)) == PT_ERR_FORMAT &&
          msg_has("shape"));
    pt_model_free(big);

    /* a GPT-2 style file: the transformer. prefix and attn.bias buffers */
    {
        char hdr[4096];
        int at = snprintf(hdr, sizeof hdr,
                          "{\"h.0.attn.bias\":{\"dtype\":\"F32\",\"shape\":[1],"
                          "\"data_offsets\":[0,4]}");
        size_t base = 4;
        for (int i = 0; i < pt_model_num_tensors(m); i++) {
            const pt_param_info *t = pt_model_tensor(m, i);
            at += snprintf(hdr + at, sizeof hdr - (size_t)at,
                           ",\"transformer.%s\":{\"dtype\":\"F32\",\"shape\":[%lld%s%.0lld],"
                           "\"data_offsets\":[%zu,%zu]}",
                           t->name, (long long)t->shape[0], t->ndim == 2 ? "," : "",
                           t->ndim == 2 ? (long long)t->shape[1] : 0LL, base + t->offset * 4,
                           base + (t->offset + t->numel) * 4);
        }
        at += snprintf(hdr + at, sizeof hdr - (size_t)at, "}");
        FILE *f = fopen(tmp_path("gpt2.safetensors"), "wb");
        uint64_t hl = (uint64_t)at;
        fwrite(&hl, 8, 1, f);
        fwrite(hdr, 1, (size_t)at, f);
        float zero = 0;
        fwrite(&zero, 4, 1, f);
        fwrite(pt_model_params(m), 4, pt_model_num_params(m), f);
        fclose(f);
        memset(pt_model_params(m2), 0, pt_model_num_params(m2) * 4);
        CHECK_OK(pt_safetensors_load(tmp_path("gpt2.safetensors"), m2, pt_model_params(m2)));
        CHECK(!memcmp(pt_model_params(m), pt_model_params(m2), pt_model_num_params(m) * 4));
        /* without state.json the head count is in no shape: a file that
         * does not state it is refused (test_untrusted: the ones that do) */
        CHECK(mkdir(tmp_path("gpt2"), 0755) == 0);
        CHECK(rename(tmp_path("gpt2.safetensors"), tmp_path("gpt2/model.safetensors")) == 0);
        pt_config ic;
        CHECK(pt_checkpoint_read_config(tmp_path("gpt2"), &ic) == PT_ERR_FORMAT &&
              msg_has("n_head"));
        CHECK(pt_checkpoint_read_config(tmpdir, &ic) != PT_OK);
    }
    pt_model_free(m);
    pt_model_free(m2);
}

static void test_trainer_bad_data(void) {
    pt_config c;
    pt_trainer *t = NULL;
    tiny_config(&c);
    write_text(tmp_path("short.txt"), 10);
    snprintf(c.data.train, sizeof c.data.train, "%s", tmp_path("short.txt"));
    CHECK(pt_trainer_new(&t, &c) == PT_ERR_FORMAT && t == NULL);
    CHECK(msg_has("data.train") && msg_has("short.txt") && msg_has("shorter than one sequence"));
    tiny_config(&c);
    snprintf(c.data.val, sizeof c.data.val, "%s", tmp_path("nope.txt"));
    CHECK(pt_trainer_new(&t, &c) == PT_ERR_IO && t == NULL);
    CHECK(msg_has("data.val") && msg_has("nope.txt"));
    tiny_config(&c);
    c.model.vocab_size = 100;
    CHECK(pt_trainer_new(&t, &c) == PT_ERR_FORMAT && msg_has("vocab_size"));
    CHECK_EQ(pt_mem_current_total(), 0);
}

/* A metrics write that fails (the file size limit: EFBIG, SIGXFSZ ignored
 * as main.c does) ends the run with an error naming the file and the
 * reason, not a success. A device such as /dev/full is no metrics file:
 * refused before anything is built. */
static void test_metrics_write_checked(void) {
    pt_config c;
    tiny_config(&c);
    c.train.steps = 3;
    snprintf(c.log.metrics, sizeof c.log.metrics, "/dev/full");
    pt_trainer *t = (pt_trainer *)1;
    CHECK(pt_trainer_new(&t, &c) == PT_ERR_IO && t == NULL);
    CHECK(msg_has("log.metrics") && msg_has("/dev/full") && msg_has("a character device"));
    snprintf(c.log.metrics, sizeof c.log.metrics, "%s", tmp_path("limited.jsonl"));
    t = new_trainer(&c);
    if (!t) return;
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 1024; /* a line or so: the second step's line goes over */
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    pt_status st = pt_trainer_run(t);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, was);
    CHECK(st == PT_ERR_IO);
    CHECK(msg_has("log.metrics") && msg_has("limited.jsonl") && msg_has("File too large"));
    pt_trainer_free(t);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-train-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    write_text(tmp_path("train.txt"), 20000);
    write_text(tmp_path("val.txt"), 3000);
    RUN(test_config);
    RUN(test_safetensors);
    RUN(test_train_learns);
    RUN(test_no_alloc_per_step);
    RUN(test_determinism);
    RUN(test_microbatches);
    RUN(test_resume_bitwise);
    RUN(test_ckpt_crash_points);
    RUN(test_ckpt_dir_checked);
    RUN(test_ckpt_keep);
    RUN(test_trainer_bad_data);
    RUN(test_metrics_write_checked);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_DONE();
}
