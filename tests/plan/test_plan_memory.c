/* The memory model (src/plan/memory.c) against the runtime and against the
 * published formulas:
 *   fp32  for a matrix of layouts of a tiny model on 1, 2 and 4 ranks (41:
 *         data, ZeRO, HSDP, tensor, sequence, every pipeline schedule under
 *         every recompute mode, and their products), the
 *         real trainer runs two steps and each rank's PT_MEM_* peaks of
 *         the second (pt_mem_peak: the trainer resets them when a step
 *         starts) are compared per pipeline stage with pt_plan_memory's:
 *         within 5% each (they are equal to the byte: the worst error per
 *         category is printed); and then a checkpoint save, whose scratch
 *         (pt_plan_mem_rank.save, per stage) must be the model's to the
 *         byte;
 *   bf16  the ZeRO paper's bytes per parameter by stage and Korthikanti et
 *         al.'s activations per layer, computed here from the formulas'
 *         text, for GPT-3 175B shapes;
 *   per part: model.stage_recompute changes only that stage's activations;
 *         parallel.zero_whole takes a module's parameters out of the
 *         sharded share.
 * shm: the ranks are forked. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/comm.h"
#include "partrain/parallel.h"
#include "partrain/plan.h"
#include "pt_test.h"
#include "pt_test_files.h"

static double worst[PT_MEM_NCAT]; /* the largest relative error per category */

static void tiny(pt_config *c) {
    pt_config_defaults(c);
    c->model = (pt_model_config){4, 32, 4, 64, 16}; /* L, C, NH, V, T */
    c->train.steps = 2;
    c->train.batch_size = 8;
    c->train.threads = 1;
    c->train.warmup_steps = 1;
    c->train.val_every = 0;
}

/* Two steps, then a checkpoint save; this rank's peaks of the second
 * step into tmpdir/mem.<rank>, and last the scratch the save added. */
static int run_rank(const pt_config *cfg, pt_comm *world) {
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, cfg, world);
    int n = cfg->train.batch_size * cfg->model.seq_len;
    int *in = calloc((size_t)n, sizeof(int)), *tg = calloc((size_t)n, sizeof(int));
    for (int i = 0; i < n; i++) {
        in[i] = (i * 7) % cfg->model.vocab_size;
        tg[i] = (i * 3 + 1) % cfg->model.vocab_size;
    }
    pt_step_info info;
    for (int s = 0; st == PT_OK && s < cfg->train.steps; s++)
        st = pt_trainer_step_batch(t, in, tg, &info);
    double peak[PT_MEM_NCAT + 1];
    for (int k = 0; k < PT_MEM_NCAT; k++) peak[k] = (double)pt_mem_peak((pt_mem_cat)k);
    pt_mem_reset_peak();
    size_t before = pt_mem_current(PT_MEM_SCRATCH);
    if (st == PT_OK) st = pt_trainer_save(t);
    peak[PT_MEM_NCAT] = (double)(pt_mem_peak(PT_MEM_SCRATCH) - before);
    if (st != PT_OK) fprintf(stderr, "%s\n", pt_error_message());
    char name[32];
    snprintf(name, sizeof name, "mem.%d", world ? pt_comm_rank(world) : 0);
    if (st == PT_OK) write_bytes(tmp_path(name), peak, sizeof peak);
    free(in);
    free(tg);
    pt_trainer_free(t);
    return st == PT_OK ? 0 : 1;
}

static int rank_main(void *arg) {
    pt_comm *world = NULL;
    pt_comm_options opt = {"shm", 20};
    if (pt_comm_new(&world, &opt) != PT_OK) return 1;
    int rc = run_rank(arg, world);
    pt_comm_free(world);
    return rc;
}

/* Run layout `keys` (--set assignments, ';'-separated) and compare. */
static void check(const char *keys) {
    pt_config c;
    tiny(&c);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", keys);
    for (char *k = strtok(buf, ";"); k; k = strtok(NULL, ";")) CHECK_OK(pt_config_set(&c, k));
    snprintf(c.checkpoint.dir, sizeof c.checkpoint.dir, "%s", tmp_path("ckpt"));
    CHECK_OK(pt_config_validate(&c));
    pt_plan_layout l;
    pt_plan_layout_from_config(&l, &c);
    pt_plan_mem pm;
    CHECK_OK(pt_plan_memory(&c, &l, NULL, &pm));
    int W = c.parallel.dp * c.parallel.tp * c.parallel.pp;
    if (W == 1) {
        CHECK_EQ(pt_mem_current_total(), 0); /* nothing else counted in this process */
        CHECK_EQ(run_rank(&c, NULL), 0);
    } else {
        int code = -1;
        pt_comm_options o = {"shm", 20};
        CHECK_OK(pt_launch(W, rank_main, &c, &o, &code));
        CHECK_EQ(code, 0);
    }
    /* the measured max per stage and category */
    double got[PT_PLAN_MAX_STAGES][PT_MEM_NCAT + 1] = {{0}};
    for (int r = 0; r < W; r++) {
        char name[32];
        snprintf(name, sizeof name, "mem.%d", r);
        double peak[PT_MEM_NCAT + 1] = {0};
        FILE *f = fopen(tmp_path(name), "rb");
        CHECK(f && fread(peak, 1, sizeof peak, f) == sizeof peak);
        if (f) fclose(f);
        remove(tmp_path(name));
        int pp_i, dp_i, tp_i;
        pt_mesh_coords_of(r, c.parallel.dp, c.parallel.tp, c.parallel.pp, &pp_i, &dp_i, &tp_i);
        for (int k = 0; k <= PT_MEM_NCAT; k++)
            if (peak[k] > got[pp_i][k]) got[pp_i][k] = peak[k];
    }
    /* a save's scratch: exactly the model's, on each stage's largest */
    for (int r = 0; r < c.parallel.pp; r++) {
        if (got[r][PT_MEM_NCAT] != pm.stage[r].save)
            printf("  %-60s stage %d save    measured %.0f B, model %.0f B\n", keys, r,
                   got[r][PT_MEM_NCAT], pm.stage[r].save);
        CHECK(got[r][PT_MEM_NCAT] == pm.stage[r].save);
    }
    CHECK_EQ(pm.n_stage, c.parallel.pp);
    for (int r = 0; r < c.parallel.pp; r++)
        for (int k = 0; k < PT_MEM_NCAT; k++) {
            double want = pm.stage[r].cat[k], rel = want ? (got[r][k] - want) / want : got[r][k];
            if (fabs(rel) > worst[k]) worst[k] = fabs(rel);
            if (fabs(rel) > 1e-12)
                printf("  %-60s stage %d %-7s measured %.0f B, model %.0f B (%+.2f%%)\n", keys, r,
                       pt_mem_cat_name((pt_mem_cat)k), got[r][k], want, 100 * rel);
            CHECK(fabs(rel) <= 0.05);
        }
}

static void test_fp32_runtime(void) {
    static const char *const layouts[] = {
        "parallel.dp=1",
        "parallel.microbatches=2;parallel.schedule=gpipe",
        "model.recompute=selective",
        "model.recompute=full;parallel.microbatches=2",
        "train.optimizer=sgd;train.momentum=0.9",
        "parallel.dp=2",
        "parallel.dp=2;parallel.zero=1",
        "parallel.dp=2;parallel.zero=2",
        "parallel.dp=2;parallel.zero=3",
        "parallel.dp=2;parallel.zero=3;parallel.zero_keep_params=true",
        "parallel.dp=2;parallel.sync=stale",
        "parallel.tp=2",
        "parallel.tp=2;parallel.sequence_parallel=true",
        "parallel.pp=2;parallel.microbatches=2;parallel.schedule=zbv",
        "parallel.dp=4;parallel.zero=3;parallel.zero_group=2",
        "parallel.dp=4;parallel.zero=2;parallel.zero_group=2",
        "parallel.dp=2;parallel.pp=2;parallel.microbatches=2;parallel.zero=1",
        "parallel.dp=2;parallel.pp=2;parallel.microbatches=2;parallel.zero=3",
        "parallel.tp=2;parallel.pp=2;parallel.microbatches=4",
        "parallel.dp=2;parallel.tp=2;parallel.zero=2;parallel.sequence_parallel=true",
        "parallel.tp=4;parallel.sequence_parallel=true",
        "parallel.dp=4;parallel.zero=1;parallel.zero_group=2",
        "parallel.dp=2;parallel.sync=local_sgd;parallel.outer=nesterov",
        "parallel.dp=2;parallel.sync=stale;parallel.stale_mode=delayed",
        "parallel.pp=4;parallel.microbatches=4",
        "parallel.dp=2;parallel.tp=2",
    };
    /* the per-part keys (model.stage_recompute, parallel.zero_whole) */
    static const char *const perpart[] = {
        "parallel.pp=2;parallel.microbatches=4;model.stage_recompute=full,none",
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=zb1;"
        "model.stage_recompute=none,selective",
        "parallel.dp=2;parallel.zero=3;parallel.zero_whole=embedding",
        "parallel.dp=2;parallel.zero=3;parallel.zero_whole=head,h.0,h.2",
        "parallel.dp=2;parallel.zero=3;parallel.zero_whole=h.0,h.1,h.2;"
        "parallel.zero_keep_params=true",
        "parallel.dp=4;parallel.zero=3;parallel.zero_group=2;parallel.zero_whole=embedding,h.1",
        "parallel.dp=2;parallel.pp=2;parallel.microbatches=2;parallel.zero=3;"
        "parallel.zero_whole=embedding,head,h.3",
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) check(layouts[i]);
    pt_config probe;
    pt_config_defaults(&probe);
    int have = pt_config_set(&probe, "parallel.zero_whole=") == PT_OK &&
               pt_config_set(&probe, "model.stage_recompute=") == PT_OK;
    for (size_t i = 0; i < sizeof perpart / sizeof perpart[0]; i++)
        if (have)
            check(perpart[i]);
        else
            printf("  skipped (needs the per-part keys of the perpart branch): %s\n", perpart[i]);
    /* every pipeline schedule under every recompute mode */
    static const char *const scheds[] = {"gpipe", "1f1b", "interleaved", "zb1", "zbv"};
    static const char *const modes[] = {"none", "selective", "full"};
    for (int k = 0; k < 5; k++)
        for (int r = 0; r < 3; r++) {
            char keys[256];
            snprintf(keys, sizeof keys,
                     "parallel.pp=2;parallel.microbatches=4;parallel.schedule=%s;"
                     "parallel.virtual_stages=%d;model.recompute=%s",
                     scheds[k], !strcmp(scheds[k], "interleaved") ? 2 : 0, modes[r]);
            check(keys);
        }
    printf("  fp32 worst relative error per category:");
    for (int k = 0; k < PT_MEM_NCAT; k++)
        printf(" %s %.2g%%", pt_mem_cat_name((pt_mem_cat)k), 100 * worst[k]);
    printf("\n");
}

/* ---- bf16: the published formulas ---- */

/* GPT-3 175B (Brown et al. 2020): L 96, h 12288, a 96, s 2048; GPT-2's
 * vocabulary. One sequence a micro-batch. */
static void gpt3(pt_config *c, int dp, int tp, int pp, int m) {
    pt_config_defaults(c);
    c->model = (pt_model_config){96, 12288, 96, 50257, 2048};
    snprintf(c->train.precision, sizeof c->train.precision, "bf16");
    c->parallel.dp = dp;
    c->parallel.tp = tp;
    c->parallel.pp = pp;
    c->parallel.microbatches = m;
    c->train.batch_size = dp * m;
}

static pt_plan_mem plan(const pt_config *c, const pt_plan_layout *l) {
    pt_plan_mem pm;
    CHECK_OK(pt_plan_memory(c, l, NULL, &pm));
    return pm;
}

/* Psi: the parameters of one tensor-parallel slice of the whole model */
static double psi_of(const pt_config *c) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new_slice(&m, &c->model, 0, c->parallel.tp, 0));
    double n = m ? (double)pt_model_num_params(m) : 0;
    pt_model_free(m);
    return n;
}

/* Rajbhandari et al. 2020, Fig. 1: with K = 12 (fp32 master copy, Adam's
 * m and v) bytes of model states per rank: stage 0 (2 + 2 + K) Psi, 1 2Psi
 * + 2Psi + K Psi / Nd, 2 2Psi + (2 + K) Psi / Nd, 3 (2 + 2 + K) Psi / Nd. */
static void test_bf16_zero(void) {
    pt_config c;
    gpt3(&c, 8, 8, 1, 1);
    double psi = psi_of(&c), Nd = 8;
    CHECK_OK(pt_config_validate_layout(&c));
    for (int stage = 0; stage <= 3; stage++) {
        c.parallel.zero = stage;
        pt_plan_layout l;
        pt_plan_layout_from_config(&l, &c);
        pt_plan_mem pm = plan(&c, &l);
        double want[4] = {16 * psi, 4 * psi + 12 * psi / Nd, 2 * psi + 14 * psi / Nd,
                          16 * psi / Nd};
        double got =
            pm.max.cat[PT_MEM_PARAMS] + pm.max.cat[PT_MEM_GRADS] + pm.max.cat[PT_MEM_OPTIM];
        printf("  bf16 zero %d: model states %.4g GB a rank (Psi %.4g)\n", stage, got / 1e9, psi);
        CHECK_NEAR(got, want[stage], 0, 1e-12);
        CHECK_NEAR(pm.max.cat[PT_MEM_PARAMS], stage == 3 ? 2 * psi / Nd : 2 * psi, 0, 1e-12);
        /* the slack is stated and in the total */
        CHECK(pm.max.slack > 0);
        double sum = pm.max.slack;
        for (int k = 0; k < PT_MEM_NCAT; k++) sum += pm.max.cat[k];
        CHECK_NEAR(pm.max.total, sum, 0, 1e-12);
    }
    /* HSDP: Nd is the shard group */
    c.parallel.zero = 3;
    c.parallel.zero_group = 2;
    pt_plan_layout l;
    pt_plan_layout_from_config(&l, &c);
    pt_plan_mem pm = plan(&c, &l);
    CHECK_NEAR(pm.max.cat[PT_MEM_OPTIM], 12 * psi / 2, 0, 1e-12);
}

/* Korthikanti et al. 2022, Table 2, bytes per layer: no parallelism
 * sbh(34 + 5as/h); tensor parallel sbh(10 + 24/t + 5as/(ht)); with
 * sequence parallelism sbh(34/t + 5as/(ht)); selective recomputation with
 * it sbh 34/t; full recomputation 2sbh (the layer's input). */
static void test_bf16_acts(void) {
    const double s = 2048, b = 1, h = 12288, a = 96, V = 50257, L = 96;
    static const struct {
        int tp, sp, rc;
    } cases[] = {{1, 0, 0}, {8, 0, 0}, {8, 1, 0}, {8, 1, 1}, {8, 0, 2}, {1, 0, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double t = cases[i].tp;
        pt_config c;
        gpt3(&c, 1, cases[i].tp, 1, 1);
        c.parallel.sequence_parallel = cases[i].sp;
        pt_plan_layout l;
        pt_plan_layout_from_config(&l, &c);
        l.recompute = cases[i].rc;
        pt_plan_mem pm = plan(&c, &l);
        double none = t == 1        ? s * b * h * (34 + 5 * a * s / h)
                      : cases[i].sp ? s * b * h * (34 / t + 5 * a * s / (h * t))
                                    : s * b * h * (10 + 24 / t + 5 * a * s / (h * t));
        double layer = cases[i].rc == 0   ? none
                       : cases[i].rc == 1 ? s * b * h * 34 / t
                                          : 2 * s * b * h;
        /* every layer, the head's fp32 logits for the loss, and under full
         * recomputation one layer's whole set while its backward runs */
        double want = L * layer + 4 * s * b * V / t + (cases[i].rc == 2 ? none : 0);
        printf("  bf16 tp %d sp %d recompute %d: activations %.4g GB a rank\n", cases[i].tp,
               cases[i].sp, cases[i].rc, pm.max.cat[PT_MEM_ACTS] / 1e9);
        CHECK_NEAR(pm.max.cat[PT_MEM_ACTS], want, 0, 1e-12);
    }
    /* the paper's Table 2 headline (t 8, sp, selective): 34 sbh / t a layer */
    CHECK_NEAR(s * b * h * 34 / 8 / 1e6, 106.954752, 0, 1e-9);
}

/* A pipeline holds the schedule's micro-batches (Narayanan et al. 2021):
 * 1F1B's first stage p of them, the last one. */
static void test_bf16_pipeline(void) {
    const double s = 2048, b = 1, h = 12288, a = 96, t = 8, V = 50257;
    pt_config c;
    gpt3(&c, 1, 8, 8, 16);
    c.parallel.sequence_parallel = 1;
    snprintf(c.parallel.stage_layers, sizeof c.parallel.stage_layers, "12,12,12,12,12,12,12,12");
    pt_plan_layout l;
    pt_plan_layout_from_config(&l, &c);
    pt_plan_mem pm = plan(&c, &l);
    double layer = s * b * h * (34 / t + 5 * a * s / (h * t));
    CHECK_EQ(pm.n_stage, 8);
    CHECK_NEAR(pm.stage[0].cat[PT_MEM_ACTS], 8 * 12 * layer, 0, 1e-12);
    CHECK_NEAR(pm.stage[3].cat[PT_MEM_ACTS], 5 * 12 * layer, 0, 1e-12);
    CHECK_NEAR(pm.stage[7].cat[PT_MEM_ACTS], 12 * layer + 4 * s * b * V / t, 0, 1e-12);
    /* per part: full recomputation on the first stage changes only its
     * activations */
    snprintf(l.stage_recompute, sizeof l.stage_recompute,
             "full,none,none,none,none,none,none,none");
    pt_plan_mem pr = plan(&c, &l);
    CHECK_NEAR(pr.stage[0].cat[PT_MEM_ACTS], 8 * 12 * 2 * s * b * h / t + layer, 0, 1e-12);
    for (int r = 1; r < 8; r++)
        for (int k = 0; k < PT_MEM_NCAT; k++) CHECK(pr.stage[r].cat[k] == pm.stage[r].cat[k]);
    for (int k = 0; k < PT_MEM_NCAT; k++)
        if (k != PT_MEM_ACTS) CHECK(pr.stage[0].cat[k] == pm.stage[0].cat[k]);
    /* chunks of different sizes (interleaved, v 2: 4 layers in each rank's
     * first chunk, 8 in its second): each chunk's micro-batches held at
     * once times its own layers, where that is less than all of them in
     * flight times the larger chunk's, as the trainer carves them */
    gpt3(&c, 1, 8, 8, 16);
    c.parallel.sequence_parallel = 1;
    snprintf(c.parallel.schedule, sizeof c.parallel.schedule, "interleaved");
    c.parallel.virtual_stages = 2;
    snprintf(c.parallel.stage_layers, sizeof c.parallel.stage_layers,
             "4,4,4,4,4,4,4,4,8,8,8,8,8,8,8,8");
    pt_plan_layout_from_config(&l, &c);
    pt_plan_mem pi = plan(&c, &l);
    for (int r = 0; r < 7; r++) { /* the last holds the head's logits too */
        pt_schedule sc;
        CHECK_OK(pt_schedule_build_stage(&sc, "interleaved", 16, 8, r, 2));
        double shared = sc.in_flight * 8.0,
               own = sc.chunk_in_flight[0] * 4.0 + sc.chunk_in_flight[1] * 8.0;
        if (r == 0) CHECK(own < shared); /* the per-chunk case, on this rank at least */
        CHECK_NEAR(pi.stage[r].cat[PT_MEM_ACTS], (own < shared ? own : shared) * layer, 0, 1e-12);
        pt_schedule_free(&sc);
    }
}

/* parallel.zero_whole: a module kept whole under ZeRO-3 holds all of its
 * bf16 parameters on every rank; nothing else moves. */
static void test_zero_whole(void) {
    pt_config c;
    gpt3(&c, 8, 8, 1, 1);
    c.parallel.zero = 3;
    pt_plan_layout l;
    pt_plan_layout_from_config(&l, &c);
    pt_plan_mem a = plan(&c, &l);
    snprintf(l.zero_whole, sizeof l.zero_whole, "embedding");
    pt_plan_mem w = plan(&c, &l);
    pt_model *m = NULL;
    CHECK_OK(pt_model_new_slice(&m, &c.model, 0, 8, 0));
    size_t off, emb = 0;
    if (m) pt_model_module_region(m, 0, &off, &emb);
    pt_model_free(m);
    CHECK_NEAR(w.max.cat[PT_MEM_PARAMS] - a.max.cat[PT_MEM_PARAMS], 2.0 * emb * (1 - 1.0 / 8), 0,
               1e-9);
    for (int k = 0; k < PT_MEM_NCAT; k++)
        if (k != PT_MEM_PARAMS) CHECK(w.max.cat[k] == a.max.cat[k]);
}

/* fp32 per part: model.stage_recompute on one pipeline rank of the runtime's
 * layout changes that rank's activations only. */
static void test_fp32_stage_recompute(void) {
    pt_config c;
    tiny(&c);
    c.parallel.pp = 2;
    c.parallel.microbatches = 4;
    pt_plan_layout l;
    pt_plan_layout_from_config(&l, &c);
    pt_plan_mem a = plan(&c, &l);
    snprintf(l.stage_recompute, sizeof l.stage_recompute, "none,full");
    pt_plan_mem f = plan(&c, &l);
    CHECK(f.stage[1].cat[PT_MEM_ACTS] < a.stage[1].cat[PT_MEM_ACTS]);
    for (int k = 0; k < PT_MEM_NCAT; k++) {
        CHECK(f.stage[0].cat[k] == a.stage[0].cat[k]);
        if (k != PT_MEM_ACTS) CHECK(f.stage[1].cat[k] == a.stage[1].cat[k]);
    }
}

static void test_precision_and_overflow(void) {
    pt_config c;
    tiny(&c);
    snprintf(c.train.precision, sizeof c.train.precision, "bf16");
    CHECK_OK(pt_config_validate(&c)); /* the runtime trains in bf16 too */
    CHECK_OK(pt_config_validate_layout(&c));
    pt_config odd = c; /* but all-gathers bf16 rows as floats under sequence parallelism */
    odd.model.n_embd = 33;
    odd.model.n_head = 1;
    odd.parallel.tp = 1;
    odd.parallel.sequence_parallel = 1;
    CHECK(pt_config_validate(&odd) != PT_OK);
    CHECK(strstr(pt_error_message(), "needs an even model.n_embd (got 33)") != NULL);
    pt_config bad = c;
    bad.parallel.tp = 3; /* the layout rules still hold under bf16 */
    CHECK(pt_config_validate_layout(&bad) != PT_OK);
    pt_plan_layout l;
    pt_plan_layout_from_config(&l, &bad);
    pt_plan_mem pm;
    CHECK(pt_plan_memory(&c, &l, NULL, &pm) != PT_OK);
    /* a cluster without bf16 cannot plan a bf16 run */
    pt_cluster cl;
    memset(&cl, 0, sizeof cl);
    cl.device.peak_flops_fp32 = 1e12;
    pt_plan_layout_from_config(&l, &c);
    CHECK(pt_plan_memory(&c, &l, &cl, &pm) != PT_OK);
    CHECK(strstr(pt_error_message(), "device.peak_flops.bf16") != NULL);

    pt_plan_mem_rank r;
    memset(&r, 0, sizeof r);
    r.cat[PT_MEM_OPTIM] = 61.2e9;
    r.cat[PT_MEM_PARAMS] = 15.3e9;
    r.cat[PT_MEM_ACTS] = 14.6e9;
    r.slack = 2e9;
    r.total = 93.1e9;
    char why[256];
    pt_plan_capacity dev = {80e9, 1, "the device has 80.0 GB"};
    CHECK_EQ(pt_plan_mem_overflow(&r, &dev, why, sizeof why), 1);
    CHECK(!strcmp(why, "needs 93.1 GB a rank (optim 61.2 GB, params 15.3 GB, acts 14.6 GB, slack "
                       "2.0 GB), the device has 80.0 GB"));
    pt_plan_capacity big = {100e9, 1, "the device has 100.0 GB"};
    CHECK_EQ(pt_plan_mem_overflow(&r, &big, why, sizeof why), 0);
    CHECK(why[0] == '\0');
    /* a checkpoint save's scratch counts, over the ranks sharing the pool */
    r.save = 8e9;
    CHECK_EQ(pt_plan_mem_overflow(&r, &big, why, sizeof why), 1);
    CHECK(strstr(why, "slack 2.0 GB; a checkpoint save 8.0 GB more), the device has 100.0 GB"));
    pt_plan_capacity shared = {100e9, 2, "a rank has 100.0 GB (the node's 200.0 GB over 2 ranks)"};
    CHECK_NEAR(pt_plan_mem_need(&r, &shared), 97.1e9, 1, 0);
    CHECK_EQ(pt_plan_mem_overflow(&r, &shared, why, sizeof why), 0);
    r.save = 0;
    char tiny_buf[8]; /* truncated, still terminated */
    CHECK_EQ(pt_plan_mem_overflow(&r, &dev, tiny_buf, sizeof tiny_buf), 1);
    CHECK(strlen(tiny_buf) == 7);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    pt_log_set_level(PT_LOG_WARN);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-plan-memory-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_fp32_runtime);
    RUN(test_fp32_stage_recompute);
    RUN(test_bf16_zero);
    RUN(test_bf16_acts);
    RUN(test_bf16_pipeline);
    RUN(test_zero_whole);
    RUN(test_precision_and_overflow);
    rmdir(tmpdir);
    return TEST_DONE();
}
