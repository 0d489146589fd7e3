/* Checkpoints under tensor parallelism (trainer_ckpt.c): the main files hold
 * GPT-2's full tensors whatever tp is, so a checkpoint saved at one layout
 * resumes at another on the single worker's trajectory. Each case runs the
 * source layout for SAVE_AT steps and saves, then the destination layout
 * resumes and runs to the end; its loss and gradient norm per step from
 * SAVE_AT on and its final parameters are compared with the uninterrupted
 * one-worker run through the parity harness's bounds (parity_compare), under
 * AdamW and SGD with momentum 0.9 (its buffer is the state to carry).
 * Also: the same layout resumes bitwise; the file of a tp 2 run on a
 * vocabulary that 2 does not divide has GPT-2's shapes (wte V rows, no
 * padding) and loads into a tp = 1 model as `partrain eval` loads it, equal
 * to the run's gathered parameters; per-rank state files of stale and
 * local_sgd at dp 2 x tp 2 resume bitwise (every rank's slices dumped and
 * compared).
 *
 * And a rank that runs out of memory anywhere in a tp 2 save (every
 * allocation point of either rank, injected with pt_mem_fail_after) leaves
 * nobody waiting: every rank returns the same status, shared.
 *
 * shm only: the layouts of a case differ in their world sizes. */
#include <cjson/cJSON.h>
#include <sys/mman.h>

#include "parallel/parity_harness.h"
#include "parallel/ckpt_test.h"

#define HEADS4 "model.n_head=4 "

static const ckpt_case cases[] = {
    {"", "parallel.tp=2", "parallel.tp=1"},
    {"", "parallel.tp=2", "parallel.dp=2 parallel.tp=2"},
    {"", "parallel.tp=1", "parallel.tp=2"},
    {"", "parallel.tp=1", "parallel.dp=2 parallel.tp=2"},
    {"", "parallel.dp=2 parallel.tp=2", "parallel.tp=1"},
    {HEADS4, "parallel.tp=4", "parallel.tp=2"},
    {HEADS4, "parallel.tp=2", "parallel.tp=4"},
    /* padding rows: 61 rows padded to 62 at t 2 */
    {"model.vocab_size=61 ", "parallel.tp=2", "parallel.tp=1"},
    {"model.vocab_size=61 ", "parallel.tp=1", "parallel.dp=2 parallel.tp=2"},
    /* ZeRO's shards of tp slices, both ways */
    {"", "parallel.dp=2 parallel.tp=2 parallel.zero=3", "parallel.tp=1"},
    {"", "parallel.tp=2", "parallel.dp=2 parallel.tp=2 parallel.zero=1"},
    {"", "parallel.tp=1", "parallel.dp=2 parallel.tp=2 parallel.zero=2"},
};

static void test_cross_layout(void) {
    ckpt_cross_layout(cases, sizeof cases / sizeof cases[0]);
}

/* A layout resumed from its own checkpoint is bitwise the straight run. */
static void test_same_layout(void) {
    static const char *const layouts[] = {"parallel.tp=2",
                                          "parallel.dp=2 parallel.tp=2 parallel.zero=3"};
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        job j;
        result straight, first, resumed;
        case_config(&j, PARITY_ADAMW, "", layouts[k], k ? "same_z" : "same");
        CHECK_OK(run_dp(&j, &straight));
        j.stop_at = SAVE_AT;
        CHECK_OK(run_dp(&j, &first));
        j.stop_at = 0;
        j.resume = 1;
        CHECK_OK(run_dp(&j, &resumed));
        CHECK(resumed.nparams == straight.nparams && resumed.params && straight.params &&
              !memcmp(resumed.params, straight.params, straight.nparams * sizeof(float)));
        for (int s = SAVE_AT; s < straight.nsteps; s++)
            CHECK(resumed.loss[s] == straight.loss[s] &&
                  resumed.grad_norm[s] == straight.grad_norm[s]);
        printf("  %-52s bitwise\n", layouts[k]);
        result_free(&straight);
        result_free(&first);
        result_free(&resumed);
    }
}

/* A tp 2 checkpoint of a padded vocabulary: GPT-2's shapes in the header
 * (every tensor as the tp = 1 model has it; wte V rows), and the file loads
 * into a tp = 1 model (what `partrain eval` and `sample` do) equal to the
 * run's gathered parameters. */
static void test_file_shapes(void) {
    job j;
    result first;
    case_config(&j, PARITY_ADAMW, "model.vocab_size=61 ", "parallel.tp=2", "shapes");
    j.stop_at = SAVE_AT;
    CHECK_OK(run_dp(&j, &first));
    char stepdir[600], path[700];
    CHECK_OK(pt_checkpoint_resolve(j.cfg.checkpoint.dir, stepdir, sizeof stepdir));
    pt_config saved;
    CHECK_OK(pt_checkpoint_read_config(stepdir, &saved));
    CHECK(saved.parallel.tp == 2 && saved.model.vocab_size == 61);
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &saved.model, 1));
    const char *files[] = {"model", "optim_m", "optim_v"};
    for (int f = 0; f < 3 && m; f++) {
        snprintf(path, sizeof path, "%s/%s.safetensors", stepdir, files[f]);
        cJSON *h = read_header(path);
        CHECK(h != NULL);
        int bad = 0;
        for (int i = 0; h && i < pt_model_num_tensors(m); i++) {
            const pt_param_info *p = pt_model_tensor(m, i);
            cJSON *e = cJSON_GetObjectItemCaseSensitive(h, p->name);
            cJSON *shape = e ? cJSON_GetObjectItemCaseSensitive(e, "shape") : NULL;
            int ok = cJSON_IsArray(shape) && cJSON_GetArraySize(shape) == p->ndim;
            for (int d = 0; ok && d < p->ndim; d++)
                ok = cJSON_GetArrayItem(shape, d)->valuedouble == p->shape[d];
            if (!ok) {
                printf("  %s: tensor %s has not GPT-2's shape\n", files[f], p->name);
                bad++;
            }
            if (!strcmp(p->name, "wte.weight")) CHECK(ok && p->shape[0] == 61);
        }
        CHECK(bad == 0);
        cJSON_Delete(h);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", stepdir);
    CHECK_OK(pt_safetensors_load(path, m, pt_model_params(m)));
    CHECK(first.params && first.nparams == pt_model_num_params(m) &&
          !memcmp(first.params, pt_model_params(m), first.nparams * sizeof(float)));
    printf("  %-52s GPT-2 shapes, loads at tp 1 bitwise\n", "vocab 61 tp2 checkpoint");
    pt_model_free(m);
    result_free(&first);
}

/* stale and local_sgd at dp 2 x tp 2: rank<r>.safetensors hold each world
 * rank's slices, so the same layout continues exactly: every rank's
 * parameters and optimizer state at the end, and the losses, bitwise. At
 * dp 1 x tp 2 there is no per-rank state (tp ranks hold slices of one
 * model, which the main files carry). */
static void test_rank_state(void) {
    static const char *const layouts[] = {
        "parallel.tp=2 parallel.sync=stale parallel.stale_mode=dga",
        "parallel.dp=2 parallel.tp=2 parallel.sync=stale parallel.stale_mode=dga",
        "parallel.dp=2 parallel.tp=2 parallel.sync=stale parallel.stale_mode=delayed "
        "parallel.staleness=2",
        "parallel.dp=2 parallel.tp=2 parallel.sync=local_sgd parallel.outer=nesterov "
        "parallel.sync_every=4",
    };
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        job j;
        result straight, first, resumed;
        char dir[32];
        snprintf(dir, sizeof dir, "rs%zu", k);
        case_config(&j, PARITY_ADAMW, "", layouts[k], dir);
        snprintf(j.dump, sizeof j.dump, "straight%zu", k);
        CHECK_OK(run_dp(&j, &straight));
        j.dump[0] = 0;
        j.stop_at = SAVE_AT;
        CHECK_OK(run_dp(&j, &first));
        j.stop_at = 0;
        j.resume = 1;
        snprintf(j.dump, sizeof j.dump, "resumed%zu", k);
        CHECK_OK(run_dp(&j, &resumed));
        for (int s = SAVE_AT; s < straight.nsteps; s++)
            CHECK(resumed.loss[s] == straight.loss[s] &&
                  resumed.grad_norm[s] == straight.grad_norm[s]);
        int same = 1;
        for (int r = 0; r < job_world(&j); r++) {
            size_t na, nb;
            char a[32], b[32];
            snprintf(a, sizeof a, "straight%zu", k);
            snprintf(b, sizeof b, "resumed%zu", k);
            float *x = read_dump(a, straight.nsteps, r, &na);
            float *y = read_dump(b, straight.nsteps, r, &nb);
            int ok = x && y && na == nb && na > 0 && !memcmp(x, y, na * sizeof(float));
            CHECK(ok);
            same = same && ok;
            free(x);
            free(y);
        }
        printf("  %-52s %s\n", layouts[k], same ? "every rank bitwise" : "DIFFERS");
        result_free(&straight);
        result_free(&first);
        result_free(&resumed);
    }
    /* another mesh cannot use the rank files: it restarts the pipeline
     * from the main files (a warning), and runs */
    job j;
    result first, resumed;
    case_config(&j, PARITY_ADAMW, "", layouts[1], "rs_mesh");
    j.stop_at = SAVE_AT;
    CHECK_OK(run_dp(&j, &first));
    case_config(&j, PARITY_ADAMW, "", "parallel.dp=2 parallel.sync=stale parallel.stale_mode=dga",
                "rs_mesh");
    j.resume = 1;
    CHECK_OK(run_dp(&j, &resumed));
    CHECK(resumed.nsteps == j.cfg.train.steps && resumed.params);
    result_free(&first);
    result_free(&resumed);
}

/* ---- out of memory inside a save ---- */

/* C 256: a tp slice (about 3 MB) does not fit the shm ring, so that a send
 * waits for its receiver: a rank 0 that skipped its receives would leave
 * rank 1 blocked (for the checkpoint's relaxed timeout: the test's limit). */
static void test_save_out_of_memory(void) {
    oom = mmap(NULL, sizeof *oom, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(oom != MAP_FAILED);
    if (oom == MAP_FAILED) return;
    oom_case oc;
    memset(&oc, 0, sizeof oc);
    tiny_config(&oc.cfg, 1);
    oc.cfg.model.n_embd = 256;
    oc.cfg.train.batch_size = 2;
    oc.cfg.parallel.tp = 2;
    snprintf(oc.cfg.checkpoint.dir, sizeof oc.cfg.checkpoint.dir, "%s", tmp_path("oom"));
    /* a synchronous save allocates nothing counted; an asynchronous one its
     * staging buffer */
    oc.cfg.checkpoint.async = 1;
    int failed = 0, cases = 0;
    for (int r = 0; r < 2; r++)
        for (long k = 1; k <= 8; k++) {
            memset(oom, 0, sizeof *oom);
            oc.fail_rank = r;
            oc.fail_after = k;
            int code = -1;
            pt_comm_options o = {"shm", 20};
            CHECK_OK(pt_launch(2, rank_oom_save, &oc, &o, &code));
            CHECK_EQ(code, 0);
            CHECK_EQ(oom->status[0], oom->status[1]);
            CHECK(oom->status[0] == PT_OK || oom->status[0] == PT_ERR_NOMEM);
            if (oom->status[0] != PT_OK) {
                CHECK(oom->shared[0] && oom->shared[1] && !strcmp(oom->msg[0], oom->msg[1]));
                failed++;
            }
            cases++;
            if (oom->status[0] != oom->status[1] || oom->status[0] != PT_OK)
                printf("  rank %d allocation %ld fails: %s / %s\n", r, k,
                       pt_status_name((pt_status)oom->status[0]), oom->msg[0]);
        }
    CHECK(failed > 0); /* the injection reached the save */
    printf("  %-52s %d of %d failed alike on both ranks\n", "tp2 save out of memory", failed,
           cases);
    munmap(oom, sizeof *oom);
}

int main(int argc, char **argv) {
    if (parity_init(argc, argv, "test-tp-ckpt")) return 1;
    if (use_mpi) {
        fprintf(stderr, "test_tp_ckpt: shm only (a case's layouts differ in world size)\n");
        return 1;
    }
    RUN(test_file_shapes);
    RUN(test_same_layout);
    RUN(test_rank_state);
    RUN(test_cross_layout);
    RUN(test_save_out_of_memory);
    return parity_done();
}
