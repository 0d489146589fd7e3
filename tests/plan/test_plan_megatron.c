/* The time model against published large runs: Narayanan et al., "Efficient
 * Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
 * (SC'21), Table 1 (weak scaling on DGX A100 80GB nodes: sequence 2048,
 * vocabulary 51,200, micro-batch 1, full activation recomputation, the
 * rows' tensor and pipeline degrees, mixed precision). For each row the
 * planner predicts the step with clusters/dgx-a100-80gb.json -- datasheet
 * figures and the default efficiencies, no overrides -- grown to the
 * row's GPUs, and the TFLOP/s per GPU is the paper's own count,
 *   96 B s l h^2 (1 + s / 6h + V / 16 l h) per iteration (recompute included),
 * over the predicted step and the GPUs. Each row must be within 15% of the
 * published figure. Deterministic arithmetic: nothing is timed. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "partrain/plan.h"
#include "pt_test.h"

static const struct {
    const char *name;
    int heads, hidden, layers, tp, pp, gpus, batch;
    double tflops; /* achieved teraFLOP/s per GPU, published */
} rows[] = {
    {"1.7B", 24, 2304, 24, 1, 1, 32, 512, 137},
    {"3.6B", 32, 3072, 30, 2, 1, 64, 512, 138},
    {"7.5B", 32, 4096, 36, 4, 1, 128, 512, 142},
    {"18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135},
    {"39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138},
    {"76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140},
    {"145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148},
    {"310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155},
    {"529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163},
    {"1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163},
};

static void test_table1(void) {
    pt_cluster *cl = NULL;
    CHECK_OK(pt_cluster_load_file(&cl, PT_CLUSTERS_DIR "/dgx-a100-80gb.json"));
    if (!cl) return;
    printf("| model | GPUs | t | p | published TFLOP/s | predicted | error |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        pt_config c;
        pt_config_defaults(&c);
        c.model = (pt_model_config){.n_layer = rows[i].layers,
                                    .n_embd = rows[i].hidden,
                                    .n_head = rows[i].heads,
                                    .vocab_size = 51200,
                                    .seq_len = 2048};
        c.train.batch_size = rows[i].batch;
        snprintf(c.train.precision, sizeof c.train.precision, "bf16");
        c.parallel.overlap = 0; /* Megatron's all-reduce followed the backward */
        cl->nodes = rows[i].gpus / cl->devices_per_node;
        pt_plan_layout l;
        memset(&l, 0, sizeof l);
        l.tp = rows[i].tp, l.pp = rows[i].pp, l.dp = rows[i].gpus / (l.tp * l.pp);
        l.microbatches = rows[i].batch / l.dp; /* micro-batch 1 */
        l.virtual_stages = 1;
        snprintf(l.schedule, sizeof l.schedule, "%s", l.pp > 1 ? "1f1b" : "none");
        l.recompute = PT_RECOMPUTE_FULL;
        /* the paper's even split of the blocks */
        size_t n = 0;
        for (int k = 0; k < l.pp && l.pp > 1; k++)
            n += (size_t)snprintf(l.stage_layers + n, sizeof l.stage_layers - n, "%s%d",
                                  k ? "," : "", rows[i].layers / l.pp);
        pt_plan_time t;
        CHECK_OK(pt_plan_time_predict(&c, &l, cl, &t));
        double B = rows[i].batch, s = 2048, L = rows[i].layers, h = rows[i].hidden, V = 51200;
        double flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
        double tf = flops / t.step_s / rows[i].gpus / 1e12;
        double err = (tf - rows[i].tflops) / rows[i].tflops;
        printf("| %s | %d | %d | %d | %.0f | %.1f | %+.1f%% |\n", rows[i].name, rows[i].gpus,
               rows[i].tp, rows[i].pp, rows[i].tflops, tf, 100 * err);
        CHECK(fabs(err) <= 0.15);
    }
    pt_cluster_free(cl);
}

int main(void) {
    RUN(test_table1);
    return TEST_DONE();
}
