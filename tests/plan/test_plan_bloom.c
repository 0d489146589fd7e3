/* The planner at the vocabularies of real models: BLOOM-176B's shape
 * (configs/bloom-176b.json: vocabulary 250,880, 14,336 channels, 70
 * layers, 112 heads) is accepted, planned on the shipped DGX A100 cluster,
 * and BLOOM's own layout (Le Scao et al. 2022: 384 A100 80GB GPUs, tp 4,
 * pp 12, dp 8, ZeRO-1, micro-batch 2) gets finite memory and time. V x C
 * is 3.6e9 there, past an int: the memory model must count wte in 64 bits,
 * which linearity in V shows (a product wrapped at 2^31 breaks it).
 * Deterministic arithmetic: nothing is timed. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "partrain/plan.h"
#include "pt_test.h"

static void bloom_config(pt_config *c) {
    pt_config_defaults(c);
    CHECK_OK(pt_config_load_file(c, PT_CONFIGS_DIR "/bloom-176b.json"));
}

/* BLOOM's published layout on 384 GPUs. */
static void bloom_layout(pt_plan_layout *l) {
    memset(l, 0, sizeof *l);
    l->tp = 4, l->pp = 12, l->dp = 8, l->zero = 1, l->sequence_parallel = 0;
    l->microbatches = 2048 / 8 / 2; /* micro-batch 2 */
    l->virtual_stages = 1;
    snprintf(l->schedule, sizeof l->schedule, "1f1b");
    l->recompute = PT_RECOMPUTE_FULL;
    l->threads = 1;
    /* fixed: the runtime's cut balances by flops, and would move blocks as
     * the vocabulary grows */
    snprintf(l->stage_layers, sizeof l->stage_layers, "5,6,6,6,6,6,6,6,6,6,6,5");
}

static int finite_rank(const pt_plan_mem_rank *m) {
    for (int k = 0; k < PT_MEM_NCAT; k++)
        if (!isfinite(m->cat[k]) || m->cat[k] < 0) return 0;
    return isfinite(m->total) && m->total > 0;
}

static void test_config_accepted(void) {
    pt_config c;
    bloom_config(&c);
    CHECK_EQ(c.model.vocab_size, 250880);
    CHECK_EQ(c.model.n_embd, 14336);
    CHECK_EQ(c.model.n_layer, 70);
    CHECK_EQ(c.model.n_head, 112);
    pt_plan_layout l;
    bloom_layout(&l);
    pt_plan_layout_apply(&l, &c);
    /* the trainer's rules too (bf16 is for planning only) */
    snprintf(c.train.precision, sizeof c.train.precision, "fp32");
    CHECK_OK(pt_config_validate(&c));
    /* 1,000 times Gemma's is still a vocabulary; past an int32 is not */
    CHECK_OK(pt_config_set(&c, "model.vocab_size=2147483647"));
    CHECK(pt_config_set(&c, "model.vocab_size=2147483648") != PT_OK);
    CHECK(strstr(pt_error_message(), "model.vocab_size") != NULL);
}

static void test_bloom_layout(void) {
    pt_cluster *cl = NULL;
    CHECK_OK(pt_cluster_load_file(&cl, PT_CLUSTERS_DIR "/dgx-a100-80gb.json"));
    if (!cl) return;
    cl->nodes = 384 / cl->devices_per_node;
    pt_config c;
    bloom_config(&c);
    pt_plan_layout l;
    bloom_layout(&l);

    /* params of the first stage (wte's rows, wpe, its blocks) at vocab
     * a, 2a and 3a, a = V/2: equal steps, to the byte. At tp 1 wte alone
     * is 2a C = 3.6e9 elements; at tp 4 BLOOM's own slices. */
    for (int tp = 1; tp <= 4; tp += 3) {
        l.tp = tp, l.dp = 32 / tp, l.microbatches = 2048 / l.dp / 2;
        double p[3];
        for (int i = 0; i < 3; i++) {
            c.model.vocab_size = 125440 * (i + 1);
            pt_plan_mem mem;
            CHECK_OK(pt_plan_memory(&c, &l, cl, &mem));
            CHECK(finite_rank(&mem.max));
            CHECK_EQ(mem.n_stage, 12);
            p[i] = mem.stage[0].cat[PT_MEM_PARAMS];
            /* wte's rows of one tp rank added at each step of a: at least
             * a byte each */
            if (i > 0) CHECK(p[i] - p[i - 1] >= 125440.0 * 14336 / tp);
        }
        CHECK_NEAR(p[2] - p[1], p[1] - p[0], 0, 1e-12);
    }
    bloom_layout(&l);

    c.model.vocab_size = 250880;
    pt_plan_mem mem;
    CHECK_OK(pt_plan_memory(&c, &l, cl, &mem));
    for (int s = 0; s < mem.n_stage; s++) CHECK(finite_rank(&mem.stage[s]));
    fprintf(stderr, "  BLOOM-176B tp4 pp12 dp8 zero1 m128: %.1f GB a rank at most\n",
            mem.max.total / 1e9);
    pt_plan_time t;
    CHECK_OK(pt_plan_time_predict(&c, &l, cl, &t));
    CHECK(isfinite(t.step_s) && t.step_s > 0);
    CHECK(t.mfu > 0 && t.mfu < 1);
    /* tokens a step over the step */
    CHECK_NEAR(t.tokens_per_s, 2048.0 * 2048 / t.step_s, 0, 1e-9);
    fprintf(stderr, "  step %.1f s, MFU %.1f%%\n", t.step_s, 100 * t.mfu);
    pt_cluster_free(cl);
}

/* The search over the shipped cluster as it is (64 GPUs): layouts fit, and
 * every number it returns is finite. */
static void test_bloom_search(void) {
    pt_cluster *cl = NULL;
    CHECK_OK(pt_cluster_load_file(&cl, PT_CLUSTERS_DIR "/dgx-a100-80gb.json"));
    if (!cl) return;
    pt_config c;
    bloom_config(&c);
    pt_plan_result r;
    memset(&r, 0, sizeof r);
    CHECK_OK(pt_plan_search(&c, NULL, 0, cl, cl->nodes * cl->devices_per_node, &r));
    CHECK(r.n_fit > 0);
    for (int i = 0; i < r.n; i++) CHECK(pt_plan_entry_finite(&r.entry[i]));
    if (r.n_fit > 0) {
        char name[256];
        pt_plan_layout_name(&r.entry[0].layout, name, sizeof name);
        fprintf(stderr, "  fastest of %d fitting: %s, %.1f s\n", r.n_fit, name,
                r.entry[0].time.step_s);
        /* the embedding's share: wte's rows of one tp rank, in any format */
        CHECK(r.entry[0].mem.cat[PT_MEM_PARAMS] >= 250880.0 * 14336 / r.entry[0].layout.tp);
    }
    pt_plan_result_free(&r);
    pt_cluster_free(cl);
}

int main(void) {
    RUN(test_config_accepted);
    RUN(test_bloom_layout);
    RUN(test_bloom_search);
    return TEST_DONE();
}
