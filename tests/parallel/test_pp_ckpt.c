/* Checkpoints under pipeline parallelism (trainer_ckpt.c, tp_full.c,
 * ckpt_slice.c): every pipeline rank holds its stage's modules only, and
 * the main files still hold GPT-2's full tensors (gathered over tp x pp),
 * so a checkpoint saved at one layout resumes at another on the single
 * worker's trajectory. Each case runs the source layout for SAVE_AT steps
 * and saves, then the destination layout resumes and runs to the end; its
 * loss and gradient norm per step from SAVE_AT on and its final parameters
 * are compared with the uninterrupted one-worker run through the parity
 * harness's bounds (parity_compare), under AdamW and SGD with momentum 0.9.
 * Also: the same layout resumes bitwise (pp 2 1f1b, dp 2 x pp 2 ZeRO 2);
 * the files of pipeline runs (pp 2, 4, with tp, ZeRO 3, interleaved) have
 * GPT-2's tensors, each exactly once (the head stage's copy of the tied wte
 * is not written again), and load into a one-worker model equal to the
 * run's gathered parameters.
 *
 * And a rank that runs out of memory anywhere in a save of pp 2 or of
 * dp 2 x pp 2 with ZeRO 1 (every allocation point of every rank, injected
 * with pt_mem_fail_after) leaves nobody waiting: every rank returns the
 * same status, shared.
 *
 * shm only: the layouts of a case differ in their world sizes. */
#include <cjson/cJSON.h>
#include <sys/mman.h>

#include "parallel/parity_harness.h"
#include "parallel/ckpt_test.h"

#define L3  "model.n_layer=3 "
#define L5  "model.n_layer=5 "
#define PP2 "parallel.pp=2 parallel.microbatches=2 "
#define PP4 "parallel.pp=4 parallel.microbatches=2 "

static const ckpt_case cases[] = {
    {L3, PP2, "parallel.pp=1"},
    {L5, PP2, PP4},
    {L3, "parallel.pp=1", PP2},
    {L5, PP4, PP2},
    {L3, PP2 "parallel.schedule=1f1b", PP2 "parallel.schedule=zb1"},
    {L3, PP2, PP2 "parallel.dp=2 parallel.zero=1"},
    {L3, PP2 "parallel.dp=2 parallel.zero=3", "parallel.pp=1"},
    {L3, PP2 "parallel.tp=2", "parallel.pp=1"},
    {L3, PP2, "parallel.tp=2"},
    {L3, PP2 "parallel.schedule=interleaved parallel.virtual_stages=2", "parallel.pp=1"},
    {L3, PP2 "parallel.schedule=zbv", PP2 "parallel.schedule=1f1b"},
    {L3, PP2 "parallel.stage_layers=1,2", PP2},
    /* beyond the list: into ZeRO 3's shards of stages, into stages of tp slices */
    {L3, "parallel.pp=1", PP2 "parallel.dp=2 parallel.zero=3"},
    {L3, PP2, PP2 "parallel.tp=2"},
};

static void test_cross_layout(void) {
    ckpt_cross_layout(cases, sizeof cases / sizeof cases[0]);
}

/* A layout resumed from its own checkpoint is bitwise the straight run. */
static void test_same_layout(void) {
    static const char *const layouts[] = {PP2 "parallel.schedule=1f1b",
                                          PP2 "parallel.dp=2 parallel.zero=2"};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        job j;
        result straight = {0}, first = {0}, resumed = {0};
        case_config(&j, PARITY_ADAMW, L3, layouts[k], k ? "same_z" : "same");
        CHECK_OK(run_dp(&j, &straight));
        j.stop_at = SAVE_AT;
        CHECK_OK(run_dp(&j, &first));
        j.stop_at = 0;
        j.resume = 1;
        CHECK_OK(run_dp(&j, &resumed));
        int same = resumed.nparams == straight.nparams && resumed.params && straight.params &&
                   !memcmp(resumed.params, straight.params, straight.nparams * sizeof(float));
        CHECK(same);
        CHECK_EQ(resumed.nsteps, straight.nsteps);
        for (int s = SAVE_AT; s < straight.nsteps; s++) {
            CHECK(resumed.loss[s] == straight.loss[s] &&
                  resumed.grad_norm[s] == straight.grad_norm[s]);
            if (resumed.loss[s] != straight.loss[s] ||
                resumed.grad_norm[s] != straight.grad_norm[s]) {
                printf("  step %d: loss %.9g vs %.9g, norm %.9g vs %.9g\n", s + 1, resumed.loss[s],
                       straight.loss[s], resumed.grad_norm[s], straight.grad_norm[s]);
                same = 0;
            }
        }
        printf("  %-52s %s\n", layouts[k], same ? "bitwise" : "DIFFERS");
        result_free(&straight);
        result_free(&first);
        result_free(&resumed);
    }
}

/* A pipeline checkpoint: GPT-2's tensors in the header, each exactly once
 * with the one-worker model's shape (no entry beyond them: wte once, not
 * once per stage that uses it), in the model file and both moments' files,
 * and the model file loads into a one-worker model (what `partrain eval`
 * and `sample` do) equal to the run's gathered parameters. pp 2 first, then
 * the layouts whose gathers differ: stages of tp slices, ZeRO's shards of
 * stages, two chunks per rank, four stages. */
static void test_file_shapes(void) {
    static const ckpt_case layouts[] = {
        {L3, PP2, NULL},
        {L3, PP2 "parallel.tp=2", NULL},
        {L3, PP2 "parallel.dp=2 parallel.zero=3", NULL},
        {L3, PP2 "parallel.schedule=interleaved parallel.virtual_stages=2", NULL},
        {L5, PP4, NULL},
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        job j;
        result first = {0};
        char dir[32];
        snprintf(dir, sizeof dir, "shapes%zu", k);
        case_config(&j, PARITY_ADAMW, layouts[k].model, layouts[k].from, dir);
        j.stop_at = SAVE_AT;
        CHECK_OK(run_dp(&j, &first));
        char stepdir[600], path[700];
        CHECK_OK(pt_checkpoint_resolve(j.cfg.checkpoint.dir, stepdir, sizeof stepdir));
        pt_config saved;
        CHECK_OK(pt_checkpoint_read_config(stepdir, &saved));
        CHECK(saved.parallel.pp == j.cfg.parallel.pp && saved.model.n_layer == j.cfg.model.n_layer);
        pt_model *m = NULL;
        CHECK_OK(pt_model_new(&m, &saved.model, 1));
        const char *files[] = {"model", "optim_m", "optim_v"};
        int bad = 0;
        for (int f = 0; f < 3 && m; f++) {
            snprintf(path, sizeof path, "%s/%s.safetensors", stepdir, files[f]);
            cJSON *h = read_header(path);
            CHECK(h != NULL);
            int entries = 0, wte = 0;
            for (cJSON *e = h ? h->child : NULL; e; e = e->next) {
                if (!strcmp(e->string, "__metadata__")) continue;
                entries++;
                if (!strcmp(e->string, "wte.weight")) wte++;
                if (!pt_model_find(m, e->string)) {
                    printf("  %s: tensor %s is not GPT-2's\n", files[f], e->string);
                    bad++;
                }
            }
            for (int i = 0; h && i < pt_model_num_tensors(m); i++) {
                const pt_param_info *p = pt_model_tensor(m, i);
                cJSON *e = cJSON_GetObjectItemCaseSensitive(h, p->name);
                cJSON *shape = e ? cJSON_GetObjectItemCaseSensitive(e, "shape") : NULL;
                int ok = cJSON_IsArray(shape) && cJSON_GetArraySize(shape) == p->ndim;
                for (int d = 0; ok && d < p->ndim; d++)
                    ok = cJSON_GetArrayItem(shape, d)->valuedouble == p->shape[d];
                if (!ok) {
                    printf("  %s: tensor %s missing or not GPT-2's shape\n", files[f], p->name);
                    bad++;
                }
            }
            CHECK_EQ(entries, pt_model_num_tensors(m));
            CHECK_EQ(wte, 1);
            if (entries != pt_model_num_tensors(m) || wte != 1) bad++;
            cJSON_Delete(h);
        }
        CHECK_EQ(bad, 0);
        snprintf(path, sizeof path, "%s/model.safetensors", stepdir);
        CHECK_OK(pt_safetensors_load(path, m, pt_model_params(m)));
        int same = first.params && first.nparams == pt_model_num_params(m) &&
                   !memcmp(first.params, pt_model_params(m), first.nparams * sizeof(float));
        CHECK(same);
        char what[100];
        shorten(layouts[k].from, what, sizeof what);
        printf("  %-52s %s\n", what,
               !bad && same ? "GPT-2 tensors once each, loads at pp 1 bitwise" : "DIFFERS");
        pt_model_free(m);
        result_free(&first);
    }
}

/* ---- out of memory inside a save ---- */

/* C 256: a stage's buffer (MBs) does not fit the shm ring, so that a send
 * waits for its receiver: a rank 0 that skipped its receives would leave
 * the others blocked. Every allocation point of each rank: k counts up
 * until the save succeeds on every rank (the k-th allocation is past the
 * save's last). pp 2, then dp 2 x pp 2 with ZeRO 1 (the shards' gather
 * before the stages'). */
static void test_save_out_of_memory(void) {
    static const struct { int dp, zero; } layouts[] = {{1, 0}, {2, 1}};
    oom = mmap(NULL, sizeof *oom, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(oom != MAP_FAILED);
    if (oom == MAP_FAILED) return;
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
        oom_case oc;
        memset(&oc, 0, sizeof oc);
        tiny_config(&oc.cfg, layouts[l].dp);
        oc.cfg.model.n_layer = 3;
        oc.cfg.model.n_embd = 256;
        oc.cfg.train.batch_size = 4;
        oc.cfg.parallel.pp = 2;
        oc.cfg.parallel.microbatches = 2;
        oc.cfg.parallel.zero = layouts[l].zero;
        snprintf(oc.cfg.checkpoint.dir, sizeof oc.cfg.checkpoint.dir, "%s", tmp_path("oom"));
        /* a synchronous save allocates nothing counted; an asynchronous
         * one its staging buffer */
        oc.cfg.checkpoint.async = 1;
        /* a synchronous save allocates nothing counted; an asynchronous one its
         * staging buffer */
        oc.cfg.checkpoint.async = 1;
        int world = oc.cfg.parallel.dp * oc.cfg.parallel.pp;
        int failed = 0, cases = 0;
        for (int r = 0; r < world; r++) {
            int reached_end = 0;
            for (long k = 1; k <= 64 && !reached_end; k++) {
                memset(oom, 0, sizeof *oom);
                oc.fail_rank = r;
                oc.fail_after = k;
                int code = -1;
                pt_comm_options o = {"shm", 20};
                CHECK_OK(pt_launch(world, rank_oom_save, &oc, &o, &code));
                CHECK_EQ(code, 0);
                int alike = 1;
                for (int q = 1; q < world; q++) {
                    CHECK_EQ(oom->status[q], oom->status[0]);
                    alike = alike && oom->status[q] == oom->status[0];
                }
                CHECK(oom->status[0] == PT_OK || oom->status[0] == PT_ERR_NOMEM);
                if (oom->status[0] != PT_OK) {
                    for (int q = 0; q < world; q++)
                        CHECK(oom->shared[q] && !strcmp(oom->msg[q], oom->msg[0]));
                    failed++;
                }
                cases++;
                if (!alike || oom->status[0] != PT_OK)
                    printf("  dp %d rank %d allocation %ld fails: %s / %s\n", layouts[l].dp, r, k,
                           pt_status_name((pt_status)oom->status[0]), oom->msg[0]);
                reached_end = alike && oom->status[0] == PT_OK;
            }
            CHECK(reached_end); /* the save's allocations are finite and all were tried */
        }
        CHECK(failed > 0); /* the injection reached the save */
        char what[64];
        snprintf(what, sizeof what, "%s save out of memory",
                 layouts[l].dp > 1 ? "dp2 x pp2 zero1" : "pp2");
        printf("  %-52s %d of %d failed alike on every rank\n", what, failed, cases);
    }
    munmap(oom, sizeof *oom);
}

int main(int argc, char **argv) {
    if (parity_init(argc, argv, "test-pp-ckpt")) return 1;
    if (use_mpi) {
        fprintf(stderr, "test_pp_ckpt: shm only (a case's layouts differ in world size)\n");
        return 1;
    }
    RUN(test_file_shapes);
    RUN(test_same_layout);
    RUN(test_save_out_of_memory);
    RUN(test_cross_layout);
    return parity_done();
}
