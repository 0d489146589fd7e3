/* The parity harness proves itself: bugs planted on purpose in front of the
 * real strategies (test_plants.h: wrappers of their stack entries) must make
 * it FAIL, and the comparison the tests made before it (losses and final
 * parameters under AdamW with clipping, no gradient norm, no SGD) must be
 * shown to miss at least one of them, which is why the harness exists.
 *
 *   double_bucket  the head's all-reduced gradient doubled (4 KiB buckets:
 *                  bucket 0 is a small slice of it)
 *   no_avg         every rank weighs its loss by 1/(its own tokens): the
 *                  summed gradient is dp x the mean (item 2's class of bug)
 *   skip_module    h.0's gradient left out of the all-reduce
 *   tp_skip_f      tensor parallelism without Megatron's f in attention:
 *                  c_attn's input gradient not summed over the tp group
 *   tp_norm        the tensors every tp rank holds whole counted once per
 *                  rank in the gradient norm
 *   pp_tied        the pipeline's tied wte: the head's half of its
 *                  gradient never reaches the embedding's stage
 *   pp_norm        each stage's gradient norm its own, not summed over
 *                  the pipeline
 *
 * Each runs on the layouts where it applies (buckets: plain DDP and ZeRO-1;
 * the loss weight: any layout, ZeRO-3 included). For each, the test prints
 * which checks caught it. shm only: the plant is set in this process and
 * inherited by the forked ranks. */
#include "parallel/parity_harness.h"

typedef struct {
    const char *plant;
    const char *layouts[2];
} planted;

static const planted plants[] = {
    {"double_bucket",
     {"parallel.dp=2 parallel.bucket_mb=0.004",
      "parallel.dp=4 parallel.zero=1 parallel.zero_group=2"}},
    {"no_avg", {"parallel.dp=2 parallel.bucket_mb=0.004", "parallel.dp=2 parallel.zero=3"}},
    {"skip_module", {"parallel.dp=2 parallel.bucket_mb=0.004", "parallel.dp=4 parallel.zero=1"}},
    {"tp_skip_f", {"parallel.tp=2", "parallel.dp=2 parallel.tp=2 parallel.sequence_parallel=true"}},
    {"tp_norm", {"parallel.tp=2", "parallel.dp=2 parallel.tp=2"}},
    {"pp_tied",
     {"model.n_layer=3 parallel.pp=2 parallel.microbatches=2",
      "model.n_layer=3 parallel.pp=2 parallel.dp=2 parallel.microbatches=2 parallel.zero=3"}},
    {"pp_norm",
     {"model.n_layer=3 parallel.pp=2 parallel.microbatches=2",
      "model.n_layer=5 parallel.pp=4 parallel.microbatches=4 parallel.schedule=zb1"}},
};

/* "loss norm params" for what caught it (failed), "-" for nothing. */
static void caught_by(const parity_verdict *v, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s", v->ok_loss ? "" : "loss ", v->ok_norm ? "" : "norm ",
             v->ok_params ? "" : "params ");
    if (!buf[0]) snprintf(buf, n, "-");
}

static void test_planted_bugs_fail(void) {
    /* the oracles first: one worker, nothing planted */
    for (int v = 0; v < PARITY_NVARIANTS; v++) CHECK(parity_oracle((parity_variant)v) != NULL);
    int legacy_missed = 0;
    for (size_t p = 0; p < sizeof plants / sizeof plants[0]; p++) {
        for (int l = 0; l < 2; l++) {
            const char *layout = plants[p].layouts[l];
            /* the layout's oracle (its model keys) before anything is planted */
            for (int v = 0; v < PARITY_NVARIANTS; v++)
                CHECK(parity_oracle_for((parity_variant)v, layout) != NULL);
            parity_plant = plants[p].plant;
            parity_verdict verdict[PARITY_NVARIANTS];
            int all_ok = 1;
            for (int v = 0; v < PARITY_NVARIANTS; v++) {
                result r;
                pt_status st = parity_run(layout, (parity_variant)v, NULL, &r, &verdict[v]);
                CHECK_OK(st);
                result_free(&r);
                if (st != PT_OK) memset(&verdict[v], 0, sizeof verdict[v]);
                all_ok = all_ok && parity_ok(&verdict[v]);
            }
            parity_plant = NULL;
            /* the harness must fail on every planted bug */
            CHECK(!all_ok);
            int legacy = parity_legacy_ok(&verdict[PARITY_ADAMW]);
            legacy_missed += legacy;
            char a[40], s[40];
            caught_by(&verdict[PARITY_ADAMW], a, sizeof a);
            caught_by(&verdict[PARITY_SGD], s, sizeof s);
            printf("  %-13s %-52s caught by adamw: %-18s sgd: %-18s old loss+params check: %s\n",
                   plants[p].plant, layout, a, s, legacy ? "MISSED" : "caught");
            printf("  %-13s %-52s adamw loss %.1e norm %.1e |param| %.1e; sgd loss %.1e norm "
                   "%.1e |param| %.1e\n",
                   "", "", verdict[0].loss_rel, verdict[0].norm_rel, verdict[0].param_abs,
                   verdict[1].loss_rel, verdict[1].norm_rel, verdict[1].param_abs);
        }
    }
    /* why the harness exists: the old comparison let at least one through */
    CHECK(legacy_missed >= 1);
}

/* And nothing planted: the same layouts pass (the failures above are the
 * plants', not the layouts'). */
static void test_clean_layouts_pass(void) {
    size_t np = sizeof plants / sizeof plants[0];
    for (size_t k = 0; k < 2 * np; k++) {
        const char *layout = plants[k / 2].layouts[k % 2];
        int seen = 0;
        for (size_t e = 0; e < k; e++) seen |= !strcmp(plants[e / 2].layouts[e % 2], layout);
        if (!seen) parity_check(layout);
    }
}

/* A misspelt plant is an error, not a silent pass; so is a plant on a
 * layout without its strategy. */
static void test_unknown_plant(void) {
    pt_config c;
    parity_base(&c, PARITY_ADAMW);
    pt_trainer *t = NULL;
    CHECK(pt_trainer_new_wrapped(&t, &c, NULL, plant_wrap, "double_buckets") == PT_ERR_INVALID &&
          t == NULL && strstr(pt_error_message(), "double_buckets: unknown"));
    CHECK(pt_trainer_new_wrapped(&t, &c, NULL, plant_wrap, "double_bucket") == PT_ERR_INVALID &&
          t == NULL && strstr(pt_error_message(), "no ddp entry"));
}

int main(int argc, char **argv) {
    if (parity_init(argc, argv, "test-parity-selfcheck")) return 1;
    pt_log_set_level(PT_LOG_ERROR); /* the planted runs warn on every rank */
    RUN(test_planted_bugs_fail);
    RUN(test_clean_layouts_pass);
    RUN(test_unknown_plant);
    return parity_done();
}
