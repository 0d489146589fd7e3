/* What the checkpoint tests under model parallelism (test_tp_ckpt.c,
 * test_pp_ckpt.c) share: a case (model keys, the layout that saves, the
 * one that resumes) and the runner that checks every case against one
 * worker; the safetensors header reader; and a save that runs out of
 * memory: each forked rank builds
 * the trainer of oc->cfg, takes one step, and saves (and waits for an
 * asynchronous save) with its fail_rank-th
 * rank's fail_after-th allocation failing; every rank writes its status,
 * whether the error is shared, and its message to the MAP_SHARED results,
 * which the test compares (every rank must return the same, shared, and
 * none may hang). Include after parallel/parity_harness.h and
 * <cjson/cJSON.h>; the helpers a test may not use are inline (no unused
 * warnings). */
#ifndef PT_TEST_CKPT_H
#define PT_TEST_CKPT_H

#define SAVE_AT 10 /* the step a case saves at */

/* A case: the model keys, the layout that saves, the one that resumes. */
typedef struct {
    const char *model, *from, *to;
} ckpt_case;

/* layout without its "parallel." and "model." prefixes, for the report */
static void shorten(const char *layout, char *out, size_t n) {
    size_t k = 0;
    for (const char *p = layout; *p && k + 1 < n;) {
        if (!strncmp(p, "parallel.", 9))
            p += 9;
        else if (!strncmp(p, "model.", 6))
            p += 6;
        else
            out[k++] = *p++;
    }
    out[k] = 0;
}

/* Variant v's config on one worker with the model keys and a layout. */
static void case_config(job *j, parity_variant v, const char *model, const char *layout,
                        const char *dir) {
    memset(j, 0, sizeof *j);
    parity_base(&j->cfg, v);
    if (v == PARITY_SGD) j->cfg.train.momentum = 0.9;
    CHECK_OK(parity_apply(&j->cfg, model));
    CHECK_OK(parity_apply(&j->cfg, layout));
    snprintf(j->cfg.checkpoint.dir, sizeof j->cfg.checkpoint.dir, "%s", tmp_path(dir));
}

/* Each case saved at SAVE_AT under its `from` layout and resumed under
 * `to`, against the uninterrupted one-worker run of its model, under both
 * variants (parity_expect_same from SAVE_AT on). */
static void ckpt_cross_layout(const ckpt_case *cases, size_t ncases) {
    for (int v = 0; v < PARITY_NVARIANTS; v++) {
        const char *last_model = NULL;
        result straight = {0};
        for (size_t k = 0; k < ncases; k++) {
            const ckpt_case *c = &cases[k];
            job j;
            if (!last_model || strcmp(last_model, c->model) != 0) {
                result_free(&straight);
                case_config(&j, (parity_variant)v, c->model, "", "unused");
                j.cfg.checkpoint.dir[0] = 0;
                CHECK_OK(run_dp(&j, &straight));
                last_model = c->model;
            }
            char dir[64];
            snprintf(dir, sizeof dir, "ckpt_%s_%zu", parity_variant_name[v], k);
            result first = {0}, resumed = {0};
            case_config(&j, (parity_variant)v, c->model, c->from, dir);
            j.stop_at = SAVE_AT;
            CHECK_OK(run_dp(&j, &first));
            case_config(&j, (parity_variant)v, c->model, c->to, dir);
            j.resume = 1;
            CHECK_OK(run_dp(&j, &resumed));
            char from[100], to[100], model[32], what[140];
            shorten(c->model, model, sizeof model);
            shorten(c->from, from, sizeof from);
            shorten(c->to, to, sizeof to);
            snprintf(what, sizeof what, "%.20s%.60s-> %.50s", model, from, to);
            parity_expect_same(&straight, &resumed, (parity_variant)v, SAVE_AT, what);
            result_free(&first);
            result_free(&resumed);
        }
        result_free(&straight);
    }
}

/* The safetensors header of path (malloc'd JSON), or NULL. */
static inline cJSON *read_header(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint64_t len = 0;
    char *text = NULL;
    if (fread(&len, sizeof len, 1, f) == 1 && len < (1u << 24) && (text = malloc(len + 1)) &&
        fread(text, 1, len, f) == len)
        text[len] = 0;
    else {
        free(text);
        text = NULL;
    }
    fclose(f);
    cJSON *h = text ? cJSON_Parse(text) : NULL;
    free(text);
    return h;
}

#define OOM_RANKS 4

typedef struct {
    int status[OOM_RANKS], shared[OOM_RANKS];
    char msg[OOM_RANKS][256];
} oom_results;

static oom_results *oom; /* MAP_SHARED: the ranks write here */

typedef struct {
    pt_config cfg;
    int fail_rank;
    long fail_after; /* that rank's n-th allocation in the save fails */
} oom_case;

static inline int rank_oom_save(void *arg) {
    const oom_case *oc = arg;
    pt_comm *w = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_new(&w, &o) != PT_OK) return 2;
    int me = pt_comm_rank(w), n = oc->cfg.train.batch_size * oc->cfg.model.seq_len;
    int *in = malloc((size_t)n * sizeof(int)), *tg = malloc((size_t)n * sizeof(int));
    step_tokens(&oc->cfg, 0, in, tg);
    pt_trainer *t = NULL;
    pt_status st = pt_trainer_new_dist(&t, &oc->cfg, w);
    if (st == PT_OK) st = pt_trainer_step_batch(t, in, tg, NULL);
    if (st == PT_OK) {
        if (me == oc->fail_rank) pt_mem_fail_after(oc->fail_after);
        st = pt_trainer_save(t);
        pt_status e = pt_trainer_save_wait(t);
        if (st == PT_OK) st = e;
        pt_mem_fail_after(0);
    }
    oom->status[me] = st;
    oom->shared[me] = st != PT_OK && pt_error_is_shared();
    snprintf(oom->msg[me], sizeof oom->msg[me], "%s", st == PT_OK ? "" : pt_error_message());
    pt_trainer_free(t);
    free(in);
    free(tg);
    pt_comm_free(w);
    return 0;
}

#endif
