/* Bytes per step on the tensor-parallel group (pt_step_info.tp_comm_bytes,
 * the metrics' `tp_comm_bytes`) equal, to the byte, the formula derived
 * from src/model/modules_tp.c and the comm layer's byte counting, on every
 * rank of tp 2 and tp 4, alone and at dp 2, with micro-batches, ZeRO and a
 * padded vocabulary; a validation pass between steps adds nothing to the
 * next step; the metrics lines of pt_trainer_run carry the same figure; and
 * the dp figure (`comm_bytes`) carries none of it.
 *
 * The formula. N = micro-batch tokens (batch_size / dp / microbatches x T),
 * C = n_embd, L = n_layer, S = PT_VOCAB_XENT_STATS, M = micro-batches, t =
 * tp. Per micro-batch the modules issue (float32, so 4 bytes an element):
 *   forward   embedding: 1 all-reduce of N C   (the masked lookup)
 *             each block: 2 all-reduces of N C (attn.c_proj, mlp.c_proj)
 *             head: 1 all-gather of the whole t N buffer (rows' maxima),
 *                   1 all-reduce of N S         (sums of exponentials, targets)
 *   backward  each block: 2 all-reduces of N C (c_fc's, c_attn's input gradient)
 *             head: 1 all-reduce of N C         (the LM head's input gradient)
 * and per step the gradient norm's split part: 1 all-reduce of 2 floats
 * (a double as a float pair, gradnorm.c).
 * Under sequence parallelism each all-reduce of N C becomes an all-gather
 * or a reduce-scatter of the whole N C buffer (each half an all-reduce's
 * bytes), and LayerNorm outputs are gathered again in backward:
 *   forward   embedding: 1 reduce-scatter; each block: 2 all-gathers
 *             (ln_1, ln_2) + 2 reduce-scatters (c_proj's); head: 1
 *             all-gather (ln_f), then the same cross-entropy collectives
 *   backward  each block: 4 all-gathers (the two output gradients, ln_2 and
 *             ln_1 again) + 2 reduce-scatters (c_fc's, c_attn's input
 *             gradient) + 2 all-reduces of 2C (the LayerNorms' parameter
 *             gradients, partial over the rows held); head: 1 all-gather
 *             (ln_f again) + 1 reduce-scatter + 1 all-reduce of 2C;
 *             embedding: 1 all-gather (its output gradient)
 * What a rank SENDS per operation
 * is what comm.c counts, whatever the backend's algorithm: nccl-tests'
 * bus volumes on a buffer of b bytes, in integer arithmetic,
 *   all-reduce  floor(2 (t - 1) b / t),
 *   all-gather, reduce-scatter  floor((t - 1) b / t).
 * So bytes per step =
 *   M [ (4L + 2) AR(4NC) + AR(4NS) + AG(4tN) ] + AR(8)
 * and with sequence parallelism
 *   M [ (10L + 5) AG(4NC) + (2L + 1) AR(8C) + AR(4NS) + AG(4tN) ] + AR(8).
 * For a block alone that is the 4 all-reduces of 2 (t - 1)/t x N C
 * elements of Korthikanti et al. 2022 (docs/parallel.md).
 *
 * Ranks are forked by the shm launcher; each writes its per-step figures to
 * a file and the parent checks them. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "partrain/comm.h"
#include "partrain/kernels.h"
#include "partrain/train.h"
#include "pt_test.h"
#include "pt_test_files.h"

#define STEPS 3

/* Learnable-enough text for the validation pass (byte tokens, vocab 256). */
static void write_text(const char *path, size_t n) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    uint32_t x = 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        fputc("abcdefgh ."[(x >> 24) % 10], f);
    }
    if (fclose(f) != 0) exit(1);
}

typedef struct {
    pt_config cfg;
    int validate; /* run pt_trainer_validate before the last step */
    int run;      /* pt_trainer_run instead: metrics to log.metrics, validation every step */
} job;

/* One rank's figures per step. */
typedef struct {
    uint64_t tp[STEPS], dp[STEPS];
    size_t local_params; /* this rank's slice */
} rank_out;

static void base_config(pt_config *c) {
    pt_config_defaults(c);
    c->model = (pt_model_config){2, 32, 4, 256, 16}; /* L, C, NH, V, T */
    c->train.steps = STEPS;
    c->train.batch_size = 8;
    c->train.threads = 1;
    c->train.warmup_steps = 1;
    c->train.val_every = 0;
    c->train.val_batches = 2;
}

/* The tokens of step s, the same on every rank. */
static void step_tokens(const pt_config *c, int s, int *in, int *tg) {
    int n = c->train.batch_size * c->model.seq_len, V = c->model.vocab_size;
    for (int i = 0; i < n; i++) {
        in[i] = (s * 131 + i * 7) % V;
        tg[i] = (in[i] * 3 + 1) % V;
    }
}

static pt_status run_rank(const job *j, pt_comm *world, rank_out *o) {
    pt_trainer *t = NULL;
    PT_CHECK(pt_trainer_new_dist(&t, &j->cfg, world));
    int n = j->cfg.train.batch_size * j->cfg.model.seq_len;
    int *in = malloc((size_t)n * sizeof(int)), *tg = malloc((size_t)n * sizeof(int));
    pt_status st = in && tg ? PT_OK : pt_error_set(PT_ERR_NOMEM, "tokens");
    if (st == PT_OK && j->run) st = pt_trainer_run(t);
    for (int s = 0; st == PT_OK && !j->run && s < STEPS; s++) {
        if (j->validate && s == STEPS - 1) {
            float vl;
            st = pt_trainer_validate(t, &vl);
            if (st != PT_OK) break;
        }
        pt_step_info info;
        step_tokens(&j->cfg, s, in, tg);
        st = pt_trainer_step_batch(t, in, tg, &info);
        o->tp[s] = info.tp_comm_bytes;
        o->dp[s] = info.comm_bytes;
    }
    o->local_params = pt_model_num_params(pt_trainer_model(t));
    free(in);
    free(tg);
    pt_trainer_free(t);
    return st;
}

static int rank_main(void *arg) {
    const job *j = arg;
    pt_comm *world = NULL;
    pt_comm_options opt = {"shm", 20};
    if (pt_comm_new(&world, &opt) != PT_OK) {
        fprintf(stderr, "rank: %s\n", pt_error_message());
        return 1;
    }
    rank_out o;
    memset(&o, 0, sizeof o);
    int rank = pt_comm_rank(world), rc = 0;
    if (run_rank(j, world, &o) != PT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, pt_error_message());
        rc = 1;
    } else {
        char name[32];
        snprintf(name, sizeof name, "bytes.r%d", rank);
        write_bytes(tmp_path(name), &o, sizeof o);
    }
    pt_comm_free(world);
    return rc;
}

/* What comm.c counts as sent for an operation on b bytes over t ranks. */
static uint64_t ar(uint64_t b, uint64_t t) {
    return 2 * (t - 1) * b / t;
}
static uint64_t ag(uint64_t b, uint64_t t) {
    return (t - 1) * b / t;
}

/* The formula of the file's comment. */
static uint64_t tp_bytes_formula(const pt_config *c) {
    uint64_t t = (uint64_t)c->parallel.tp, M = (uint64_t)c->parallel.microbatches;
    uint64_t L = (uint64_t)c->model.n_layer, C = (uint64_t)c->model.n_embd;
    uint64_t N = (uint64_t)(c->train.batch_size / c->parallel.dp / c->parallel.microbatches) *
                 (uint64_t)c->model.seq_len;
    if (t == 1) return 0;
    uint64_t xent = ar(4 * N * PT_VOCAB_XENT_STATS, t) + ag(4 * t * N, t);
    uint64_t per_micro = c->parallel.sequence_parallel
                             ? (10 * L + 5) * ag(4 * N * C, t) + (2 * L + 1) * ar(8 * C, t) + xent
                             : (4 * L + 2) * ar(4 * N * C, t) + xent;
    return M * per_micro + ar(8, t);
}

/* *j := the base config with `layout` (--set assignments) applied. */
static void layout_job(job *j, const char *layout) {
    memset(j, 0, sizeof *j);
    base_config(&j->cfg);
    char buf[256], *save = NULL;
    snprintf(buf, sizeof buf, "%s", layout);
    for (char *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save))
        CHECK_OK(pt_config_set(&j->cfg, kv));
}

/* Run `layout` and check every rank's every step. */
static void check_layout(const char *layout, int validate) {
    job j;
    layout_job(&j, layout);
    j.validate = validate;
    if (validate) snprintf(j.cfg.data.val, sizeof j.cfg.data.val, "%s", tmp_path("val.txt"));
    int world = j.cfg.parallel.dp * j.cfg.parallel.tp, code = -1;
    for (int r = 0; r < world; r++) {
        char name[32];
        snprintf(name, sizeof name, "bytes.r%d", r);
        remove(tmp_path(name));
    }
    pt_comm_options opt = {"shm", 20};
    CHECK_OK(pt_launch(world, rank_main, &j, &opt, &code));
    CHECK_EQ(code, 0);
    if (code != 0) return;
    uint64_t want = tp_bytes_formula(&j.cfg);
    int ok = 1;
    rank_out o0;
    memset(&o0, 0, sizeof o0);
    for (int r = 0; r < world; r++) {
        char name[32];
        snprintf(name, sizeof name, "bytes.r%d", r);
        rank_out o;
        memset(&o, 0, sizeof o);
        FILE *f = fopen(tmp_path(name), "rb");
        CHECK(f != NULL);
        if (!f) return;
        CHECK(fread(&o, sizeof o, 1, f) == 1);
        fclose(f);
        if (r == 0) o0 = o;
        for (int s = 0; s < STEPS; s++) {
            CHECK_EQ(o.tp[s], want);
            ok = ok && o.tp[s] == want;
            /* the dp figure: nothing at dp 1; under plain sync at dp 2 the
             * buckets' all-reduce of this rank's slice, 2 (2 - 1)/2 x 4 P
             * bytes, and no tp traffic */
            if (j.cfg.parallel.dp == 1) CHECK_EQ(o.dp[s], 0);
            if (j.cfg.parallel.dp == 2 && j.cfg.parallel.zero == 0)
                CHECK_EQ(o.dp[s], 4 * o.local_params);
        }
    }
    printf("  %-58s tp_comm_bytes %llu per step (formula %llu)%s, comm_bytes %llu\n", layout,
           (unsigned long long)o0.tp[0], (unsigned long long)want, ok ? "" : " MISMATCH",
           (unsigned long long)o0.dp[0]);
}

static void test_tp_alone(void) {
    check_layout("parallel.tp=2", 1);
    check_layout("parallel.tp=4", 1);
    check_layout("parallel.tp=2 parallel.microbatches=2", 0);
    check_layout("parallel.tp=4 parallel.microbatches=4 parallel.schedule=gpipe", 0);
    /* 62 rows: padded to 64 at t 4; the traffic does not depend on V */
    check_layout("model.vocab_size=62 parallel.tp=4", 0);
}

static void test_sequence_parallel(void) {
    check_layout("parallel.tp=2 parallel.sequence_parallel=true", 1);
    check_layout("parallel.tp=4 parallel.sequence_parallel=true", 0);
    check_layout("parallel.tp=2 parallel.sequence_parallel=true parallel.microbatches=2", 0);
    check_layout("parallel.dp=2 parallel.tp=2 parallel.sequence_parallel=true", 0);
    check_layout("parallel.dp=2 parallel.tp=2 parallel.sequence_parallel=true parallel.zero=3", 0);
}

static void test_dp_tp(void) {
    check_layout("parallel.dp=2 parallel.tp=2", 1);
    check_layout("parallel.dp=2 parallel.tp=4", 0);
    check_layout("parallel.dp=2 parallel.tp=2 parallel.microbatches=2", 0);
    check_layout("parallel.dp=2 parallel.tp=2 parallel.zero=1", 0);
    check_layout("parallel.dp=2 parallel.tp=2 parallel.zero=3", 0);
}

/* The metrics' step lines (rank 0's) of a pt_trainer_run with validation
 * after every step: `tp_comm_bytes` is the formula on each. */
static void check_metrics(const char *layout) {
    job j;
    layout_job(&j, layout);
    j.run = 1;
    j.cfg.train.val_every = 1;
    j.cfg.log.every = 1;
    snprintf(j.cfg.data.train, sizeof j.cfg.data.train, "%s", tmp_path("val.txt"));
    snprintf(j.cfg.data.val, sizeof j.cfg.data.val, "%s", tmp_path("val.txt"));
    snprintf(j.cfg.log.metrics, sizeof j.cfg.log.metrics, "%s", tmp_path("metrics.jsonl"));
    remove(j.cfg.log.metrics);
    int code = -1;
    pt_comm_options opt = {"shm", 20};
    CHECK_OK(pt_launch(j.cfg.parallel.dp * j.cfg.parallel.tp, rank_main, &j, &opt, &code));
    CHECK_EQ(code, 0);
    FILE *f = fopen(j.cfg.log.metrics, "r");
    CHECK(f != NULL);
    if (!f) return;
    uint64_t want = tp_bytes_formula(&j.cfg);
    char line[4096];
    int steps = 0, vals = 0;
    while (fgets(line, sizeof line, f)) {
        const char *k = strstr(line, "\"tp_comm_bytes\":");
        if (!k) {
            vals += strstr(line, "\"val_loss\":") != NULL;
            continue;
        }
        CHECK_EQ(strtoull(k + strlen("\"tp_comm_bytes\":"), NULL, 10), want);
        steps++;
    }
    fclose(f);
    CHECK_EQ(steps, STEPS);
    CHECK(vals >= STEPS); /* validation ran between the steps */
    printf("  %-58s metrics: %d step lines, tp_comm_bytes %llu each, %d validations\n", layout,
           steps, (unsigned long long)want, vals);
}

static void test_metrics(void) {
    check_metrics("parallel.tp=2");
    check_metrics("parallel.dp=2 parallel.tp=2");
    check_metrics("parallel.tp=2 parallel.sequence_parallel=true");
}

/* tp 1: no tp group, nothing counted. */
static void test_no_tp(void) {
    check_layout("parallel.dp=2", 0);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    pt_log_set_level(PT_LOG_WARN);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-tp-bytes-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    write_text(tmp_path("val.txt"), 4000);
    RUN(test_tp_alone);
    RUN(test_dp_tp);
    RUN(test_sequence_parallel);
    RUN(test_metrics);
    RUN(test_no_tp);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_DONE();
}
