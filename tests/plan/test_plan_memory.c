/* The memory model (src/plan/memory.c) against the runtime and against the
 * published formulas:
 *   fp32  for a matrix of layouts of a tiny model on 1, 2 and 4 ranks, the
 *         real trainer runs two steps and each rank's PT_MEM_* peaks of
 *         the second (pt_mem_peak: the trainer resets them when a step
 *         starts) are compared per pipeline stage with pt_plan_memory's:
 *         within 5% each (they are equal to the byte: the worst error per
 *         category is printed);
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

/* Two steps; this rank's peaks of the second into tmpdir/mem.<rank>. */
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
    if (st != PT_OK) fprintf(stderr, "%s\n", pt_error_message());
    double peak[PT_MEM_NCAT];
    for (int k = 0; k < PT_MEM_NCAT; k++) peak[k] = (double)pt_mem_peak((pt_mem_cat)k);
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
    if (pt_comm_init(&world, &opt) != PT_OK) return 1;
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
    double got[PT_PLAN_MAX_STAGES][PT_MEM_NCAT] = {{0}};
    for (int r = 0; r < W; r++) {
        char name[32];
        snprintf(name, sizeof name, "mem.%d", r);
        double peak[PT_MEM_NCAT] = {0};
        FILE *f = fopen(tmp_path(name), "rb");
        CHECK(f && fread(peak, 1, sizeof peak, f) == sizeof peak);
        if (f) fclose(f);
        remove(tmp_path(name));
        int pp_i, dp_i, tp_i;
        pt_mesh_coords_of(r, c.parallel.dp, c.parallel.tp, c.parallel.pp, &pp_i, &dp_i, &tp_i);
        for (int k = 0; k < PT_MEM_NCAT; k++)
            if (peak[k] > got[pp_i][k]) got[pp_i][k] = peak[k];
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
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=gpipe",
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=1f1b",
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=1f1b;model.recompute=selective",
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=1f1b;model.recompute=full",
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=interleaved;"
        "parallel.virtual_stages=2",
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=zb1",
        "parallel.pp=2;parallel.microbatches=4;parallel.schedule=zbv;model.recompute=full",
        "parallel.pp=2;parallel.microbatches=2;parallel.schedule=zbv;parallel.dp=1",
        "parallel.dp=4;parallel.zero=3;parallel.zero_group=2",
        "parallel.dp=4;parallel.zero=2;parallel.zero_group=2",
        "parallel.dp=2;parallel.pp=2;parallel.microbatches=2;parallel.zero=1",
        "parallel.dp=2;parallel.pp=2;parallel.microbatches=2;parallel.zero=3",
        "parallel.tp=2;parallel.pp=2;parallel.microbatches=4",
        "parallel.dp=2;parallel.tp=2;parallel.zero=2;parallel.sequence_parallel=true",
        "parallel.tp=4;parallel.sequence_parallel=true",
    };
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) check(layouts[i]);
    printf("  fp32 worst relative error per category:");
    for (int k = 0; k < PT_MEM_NCAT; k++)
        printf(" %s %.2g%%", pt_mem_cat_name((pt_mem_cat)k), 100 * worst[k]);
    printf("\n");
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
    rmdir(tmpdir);
    return TEST_DONE();
}
