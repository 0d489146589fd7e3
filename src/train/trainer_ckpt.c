/* The trainer's checkpoints: every rank saves the state its strategies
 * hold (their `state` slots on the stack, parallel.h) as slices of GPT-2's
 * full tensors, written in place by the rank that holds them, and every
 * rank resumes by reading only what it keeps, under any layout; bitwise at
 * the same layout (see trainer_run.c's opening comment for what makes that
 * hold, docs/parallel.md for the files).
 *
 * The files: model.safetensors, optim_m / optim_v.safetensors (GPT-2's
 * names and shapes: the parameters and the moments the rule keeps, of the
 * dp group's one model, or of dp index 0 where each rank has its own),
 * state.json; and under stale and local_sgd (dp > 1) the state the main
 * files lack, also in full-tensor terms: sync.safetensors (what every rank
 * holds alike: the stale rounds in flight, the outer Nesterov step's
 * anchor and momentum) and replica<d>.safetensors (what dp index d holds
 * alone: its parameters and moments, dga's local gradients), listed in
 * state.json's rank_state. Which of it carries over to another layout:
 * the model and the moments always; a stale round's sum is the global
 * gradient of its step, so `delayed` continues exactly at any layout; what
 * is a dp index's own continues exactly at any tp and pp of the same dp,
 * and is refused at another dp (checkpoint.drop_rank_state restarts it).
 *
 * Not here: the slicing and the files (ckpt_plan.c, ckpt_write.c,
 * ckpt_read.c), the writer thread (ckpt_async.c), the directory protocol
 * (ckpt_dir.c), the file formats (checkpoint.c). */
#include "ckpt_impl.h"
#include "trainer_impl.h"
#include "trainer_test.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Whether a run of config c holds per-rank state: only data parallelism
 * makes ranks' state differ or adds state the main files lack. */
static int cfg_rank_state(const pt_config *c) {
    return c->parallel.dp > 1 && strcmp(c->parallel.sync, "sync") != 0;
}

/* The whole model's tensor table: the layout of the files. */
static const pt_model *full_table(const pt_trainer *t) {
    return t->full ? t->full : t->model;
}

/* ---- saving ---- */

/* A save in the making: what this rank writes, and on rank 0 the
 * state.json it commits with (handed to the writer thread when async). */
typedef struct {
    pt_ckpt_set set;
    cJSON *state; /* rank 0: state.json but rank_state.files */
    char dir[PT_CONFIG_STR_MAX];
    int step, keep, rank_state;
    double t0;
    uint64_t file_bytes; /* rank 0: the files' data, for the log line */
} save_job;

static void save_job_free(void *arg) {
    save_job *s = arg;
    if (!s) return;
    pt_ckpt_set_deinit(&s->set);
    cJSON_Delete(s->state);
    free(s);
}

/* state.json but its rank_state.files (NULL when out of memory). */
static cJSON *state_json(const pt_trainer *t, int optim_t, int pipeline_start) {
    char *cfg_json = pt_config_to_json(&t->cfg);
    cJSON *root = cJSON_CreateObject();
    cJSON *cfg = cfg_json ? cJSON_Parse(cfg_json) : NULL;
    free(cfg_json);
    if (!root || !cfg) {
        cJSON_Delete(root);
        cJSON_Delete(cfg);
        return NULL;
    }
    char key[32], counter[32];
    snprintf(key, sizeof key, "%016" PRIx64, t->data_rng.key);
    snprintf(counter, sizeof counter, "%016" PRIx64, t->data_rng.counter);
    cJSON_AddNumberToObject(root, "step", t->step);
    cJSON_AddNumberToObject(root, "optim_t", optim_t);
    cJSON *rng = cJSON_AddObjectToObject(root, "data_rng");
    cJSON_AddStringToObject(rng, "key", key);
    cJSON_AddStringToObject(rng, "counter", counter);
    cJSON_AddNumberToObject(root, "data_position", (double)t->data_rng.counter);
    if (cfg_rank_state(&t->cfg)) {
        cJSON *rs = cJSON_AddObjectToObject(root, "rank_state");
        cJSON_AddNumberToObject(rs, "ranks", t->nranks);
        cJSON_AddNumberToObject(rs, "pipeline_start", pipeline_start);
    }
    cJSON_AddItemToObject(root, "config", cfg);
    return root;
}

/* Rank 0, every rank's slices written and synced: rank_state.files,
 * state.json into tmp, the directory into place, old steps pruned. */
static pt_status commit(void *arg, const char *tmp, const pt_ckpt_files *files) {
    save_job *s = arg;
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(s->state, "rank_state");
    cJSON *list = rs ? cJSON_AddObjectToObject(rs, "files") : NULL;
    for (int i = 0; list && i < files->nf; i++) {
        if (pt_ckpt_is_main(files->f[i].name)) continue;
        cJSON *g = cJSON_AddArrayToObject(list, files->f[i].name);
        for (int k = 0; g && k < files->f[i].ng; k++)
            cJSON_AddItemToArray(g, cJSON_CreateString(files->f[i].group[k]));
    }
    for (int i = 0; i < files->nf; i++)
        s->file_bytes += (uint64_t)files->f[i].ng * pt_model_num_params(s->set.full) * 4;
    char *text = cJSON_Print(s->state);
    pt_status st = text && (!rs || list) ? pt_ckpt_write_state(tmp, text)
                                         : pt_error_set(PT_ERR_NOMEM, "checkpoint state");
    free(text);
    if (st != PT_OK) {
        pt_ckpt_abort(tmp);
        return st;
    }
    PT_CHECK(pt_ckpt_commit(s->dir, s->step, tmp)); /* removes tmp on failure */
    pt_ckpt_prune(s->dir, s->keep);
    double sec = pt_time_s() - s->t0, mib = (double)s->file_bytes / 1048576.0;
    PT_INFO("saved %s/step_%08d: %.1f MiB in %.3f s (%.0f MiB/s)", s->dir, s->step, mib, sec,
            sec > 0 ? mib / sec : 0.0);
    return PT_OK;
}

/* What this rank writes: its strategies' regions (the stale rounds in
 * flight completed first); rank 0's state.json. */
static pt_status snapshot(pt_trainer *t, save_job *s) {
    snprintf(s->dir, sizeof s->dir, "%s", t->cfg.checkpoint.dir);
    s->step = t->step;
    s->keep = t->cfg.checkpoint.keep;
    s->t0 = pt_time_s();
    PT_CHECK(pt_ckpt_set_init(&s->set, t->model, full_table(t), t->cfg.parallel.tp, t->tp_rank, 1));
    pt_state_visit v = {.mode = PT_STATE_SAVE,
                        .step = t->step,
                        .optim_t = t->step,
                        .region = pt_ckpt_set_add,
                        .arg = &s->set};
    PT_CHECK(pt_stack_state(&t->stack, &v));
    if (t->rank == 0 && !(s->state = state_json(t, v.optim_t, v.pipeline_start)))
        return pt_error_set(PT_ERR_NOMEM, "checkpoint state");
    return PT_OK;
}

static pt_ckpt_write_job write_job(pt_trainer *t, save_job *s, const char *staging,
                                   pt_status entry) {
    return (pt_ckpt_write_job){.comm = t->aux,
                               .entry = entry,
                               .dir = s->dir,
                               .step = s->step,
                               .full = full_table(t),
                               .set = &s->set,
                               .staging = staging,
                               .commit = commit,
                               .commit_arg = s,
                               .written = &t->ckpt_written};
}

/* A rank without memory for its job still takes part, with this one:
 * nothing to write, its failure agreed on. */
static save_job no_job;

/* The synchronous save: every rank's pieces from its live buffers. */
static pt_status save_now(pt_trainer *t) {
    save_job *s = calloc(1, sizeof *s);
    pt_status st = s ? snapshot(t, s) : pt_error_set(PT_ERR_NOMEM, "checkpoint");
    pt_ckpt_write_job j = write_job(t, s ? s : &no_job, NULL, st);
    st = pt_ckpt_write(&j);
    save_job_free(s);
    return st;
}

/* The asynchronous save: the previous one waited for, this rank's pieces
 * copied into the staging buffer, the rest on the writer thread. A
 * failure here travels with the job: the writers agree on it, and the next
 * wait returns it on every rank. */
static pt_status save_async(pt_trainer *t) {
    PT_CHECK(pt_ckpt_async_wait(t->ckpt_async));
    save_job *s = calloc(1, sizeof *s);
    pt_status st = s ? snapshot(t, s) : pt_error_set(PT_ERR_NOMEM, "checkpoint");
    char *staging = NULL;
    uint64_t bytes = st == PT_OK ? pt_ckpt_share_bytes(&s->set, NULL) : 0;
    if (st == PT_OK && !(staging = pt_ckpt_async_staging(t->ckpt_async, bytes)))
        st = pt_error_set(PT_ERR_NOMEM, "checkpoint.async: staging buffer (%" PRIu64 " bytes)",
                          bytes);
    if (st == PT_OK) pt_ckpt_stage(&s->set, staging);
    pt_ckpt_write_job j = write_job(t, s ? s : &no_job, staging, st);
    return pt_ckpt_async_start(t->ckpt_async, &j, s ? save_job_free : NULL, s);
}

/* ---- resuming ---- */

/* "dp2 stale dga k=1", "dp2 local_sgd nesterov", "dp1 sync" */
static void async_desc(const pt_config *c, char *buf, size_t n) {
    if (!strcmp(c->parallel.sync, "stale"))
        snprintf(buf, n, "dp%d stale %s k=%d", c->parallel.dp, c->parallel.stale_mode,
                 c->parallel.staleness);
    else if (!strcmp(c->parallel.sync, "local_sgd"))
        snprintf(buf, n, "dp%d local_sgd %s", c->parallel.dp, c->parallel.outer);
    else
        snprintf(buf, n, "dp%d %s", c->parallel.dp, c->parallel.sync);
}

/* Whether the per-rank state saved under `saved` continues this run
 * exactly: the same mode and kind (stale: mode and staleness; local_sgd:
 * the outer step), and, for what is a dp index's own (dga, local_sgd), the
 * same dp; tp and pp are free (the files hold full tensors). sync_every,
 * learning rates and the like act on the future only. */
static int continues_exactly(const pt_config *c, const pt_config *saved) {
    if (strcmp(saved->parallel.sync, c->parallel.sync) != 0) return 0;
    if (!strcmp(c->parallel.sync, "stale")) {
        if (strcmp(saved->parallel.stale_mode, c->parallel.stale_mode) != 0 ||
            saved->parallel.staleness != c->parallel.staleness)
            return 0;
        if (!strcmp(c->parallel.stale_mode, "delayed")) return 1; /* the global sums only */
    } else if (strcmp(saved->parallel.outer, c->parallel.outer) != 0) {
        return 0;
    }
    return saved->parallel.dp == c->parallel.dp;
}

/* How the per-rank state is resumed: 1 exactly from the checkpoint's, 0
 * restarted from the main files (one line says so), or an error naming
 * the state that cannot carry over. */
static pt_status rank_state_mode(const pt_trainer *t, const char *stepdir, const pt_config *saved,
                                 const pt_ckpt_state *s, int legacy, int *exact) {
    *exact = 0;
    if (!cfg_rank_state(&t->cfg)) return PT_OK; /* nothing to put it in: the main files */
    char was[64], now[64];
    async_desc(saved, was, sizeof was);
    async_desc(&t->cfg, now, sizeof now);
    if (s->rank_state && !legacy && continues_exactly(&t->cfg, saved)) {
        *exact = 1;
        return PT_OK;
    }
    if (s->rank_state && !t->cfg.checkpoint.drop_rank_state)
        return pt_error_set(
            PT_ERR_INVALID,
            "resume: %s holds the per-rank state of %s%s, which does not carry "
            "over to this run's %s (resume under %s, or set "
            "checkpoint.drop_rank_state = true to continue from dp index 0's "
            "model with it restarted)",
            stepdir, was,
            legacy ? " in rank<r>.safetensors, written before sliced checkpoints" : "", now, was);
    if (t->rank == 0)
        PT_WARN("resume: %s was saved under %s%s and this run is %s: every rank continues from "
                "dp index 0's model and moments, its per-rank state restarted (not the "
                "uninterrupted run)",
                stepdir, was, s->rank_state ? "" : " (no per-rank state)", now);
    return PT_OK;
}

/* The config's checks before anything is read: the model's shape and the
 * optimizer rule (its state is the rule's own: AdamW's moments are no
 * momentum buffer, and a buffer cannot be made up). */
static pt_status check_saved(const pt_trainer *t, const char *stepdir, const pt_config *saved) {
    const struct {
        const char *name;
        int have, want;
    } shape[] = {{"model.n_layer", saved->model.n_layer, t->cfg.model.n_layer},
                 {"model.n_embd", saved->model.n_embd, t->cfg.model.n_embd},
                 {"model.n_head", saved->model.n_head, t->cfg.model.n_head},
                 {"model.vocab_size", saved->model.vocab_size, t->cfg.model.vocab_size},
                 {"model.seq_len", saved->model.seq_len, t->cfg.model.seq_len}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].have != shape[i].want)
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: checkpoint has %s = %d but the config says %d (a checkpoint "
                                "of another model shape)",
                                stepdir, shape[i].name, shape[i].have, shape[i].want);
    pt_adamw_hparams a = {0}, b = {0};
    a.kind = !strcmp(saved->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    a.momentum = (float)saved->train.momentum;
    b.kind = !strcmp(t->cfg.train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    b.momentum = (float)t->cfg.train.momentum;
    if (a.kind != b.kind || (pt_optim_state_count(&a) > 0) != (pt_optim_state_count(&b) > 0))
        return pt_error_set(PT_ERR_INVALID,
                            "%s: checkpoint was trained with train.optimizer = %s (momentum %g) "
                            "but this run has %s (momentum %g): its optimizer state does not carry "
                            "over",
                            stepdir, saved->train.optimizer, saved->train.momentum,
                            t->cfg.train.optimizer, t->cfg.train.momentum);
    return PT_OK;
}

static pt_status read_state(const char *stepdir, pt_ckpt_state *s, pt_ckpt_files *files,
                            int *legacy) {
    cJSON *root = NULL;
    PT_CHECK(pt_ckpt_read_state(stepdir, &root));
    char what[PT_CONFIG_STR_MAX + 80];
    snprintf(what, sizeof what, "%s/state.json", stepdir);
    pt_status st = pt_ckpt_state_fields(root, what, s);
    if (st == PT_OK) st = pt_ckpt_state_files(root, what, files, legacy);
    cJSON_Delete(root);
    return st;
}

/* Every region the strategies hold, read from the checkpoint: exactly, or
 * the main files only and the rest restarted. */
static pt_status load_state(pt_trainer *t, const char *stepdir, const pt_ckpt_state *s,
                            const pt_ckpt_files *files, int exact, uint64_t *bytes) {
    pt_ckpt_set set;
    PT_CHECK(
        pt_ckpt_set_init(&set, t->model, full_table(t), t->cfg.parallel.tp, t->tp_rank, exact));
    pt_state_visit v = {.mode = PT_STATE_LOAD,
                        .step = s->step,
                        .optim_t = s->optim_t,
                        .pipeline_start = s->pipe_start,
                        .region = pt_ckpt_set_add,
                        .arg = &set};
    pt_status st = pt_stack_state(&t->stack, &v);
    if (st == PT_OK) st = pt_ckpt_read(stepdir, &set, files, s->step, bytes);
    pt_ckpt_set_deinit(&set);
    if (st != PT_OK || exact) return st;
    pt_state_visit r = {.mode = PT_STATE_RESTART, .step = s->step, .region = pt_ckpt_set_add};
    return pt_stack_state(&t->stack, &r);
}

static pt_status resume_local(pt_trainer *t) {
    const char *dir = t->cfg.checkpoint.dir;
    if (!dir[0]) return pt_error_set(PT_ERR_INVALID, "--resume needs checkpoint.dir");
    double t0 = pt_time_s();
    char stepdir[PT_CONFIG_STR_MAX + 64];
    PT_CHECK(pt_checkpoint_resolve(dir, stepdir, sizeof stepdir));
    pt_config saved;
    PT_CHECK(pt_checkpoint_read_config(stepdir, &saved));
    PT_CHECK(check_saved(t, stepdir, &saved));
    pt_ckpt_state s;
    pt_ckpt_files files = {0};
    int legacy = 0, exact = 0;
    uint64_t bytes = 0;
    pt_status st = read_state(stepdir, &s, &files, &legacy);
    if (st == PT_OK) st = rank_state_mode(t, stepdir, &saved, &s, legacy, &exact);
    if (st == PT_OK) st = load_state(t, stepdir, &s, &files, exact, &bytes);
    pt_ckpt_files_deinit(&files);
    PT_CHECK(st);
    t->step = s.step;
    t->data_rng.key = s.key;
    t->data_rng.counter = s.counter;
    double sec = pt_time_s() - t0;
    PT_INFO("resumed from %s at step %d (this rank read %.1f MiB in %.3f s)", stepdir, s.step,
            (double)bytes / 1048576.0, sec);
    return PT_OK;
}

/* Every rank loads, then all agree: a rank that failed makes every rank
 * fail with its one-line message. */
static pt_status resume(pt_trainer *t) {
    return pt_ckpt_agree(t->aux, resume_local(t));
}

/* While the ranks write (or a slow disk reads) a checkpoint, one may wait
 * on aux for another for as long as a large model's files take: the
 * progress timeout (comm.timeout, seconds) would fail a healthy save.
 * Only progress is relaxed: a rank that dies meanwhile is reported at
 * once, and one that stalls (no heartbeat: SIGSTOP, a frozen host) within
 * comm.timeout, as everywhere (docs/comm.md). The asynchronous writers'
 * lane has this timeout from its start. */
#define CKPT_TIMEOUT_S 1800.0

static pt_status with_ckpt_timeout(pt_trainer *t, pt_status (*fn)(pt_trainer *)) {
    double old = 0;
    if (t->aux) PT_CHECK(pt_comm_set_timeout(t->aux, CKPT_TIMEOUT_S, &old));
    pt_status st = fn(t);
    if (t->aux && old > 0) {
        pt_status e = pt_comm_set_timeout(t->aux, old, NULL);
        if (st == PT_OK) st = e;
    }
    return st;
}

pt_status pt_trainer_ckpt_open(pt_trainer *t) {
    if (!t->cfg.checkpoint.dir[0] || !t->cfg.checkpoint.async) return PT_OK;
    pt_comm *lane = NULL;
    if (t->world) {
        PT_CHECK(pt_comm_split(t->world, 0, t->rank, &lane));
        pt_status st = pt_comm_set_timeout(lane, CKPT_TIMEOUT_S, NULL);
        if (st != PT_OK) {
            pt_comm_free(lane);
            return st;
        }
    }
    return pt_ckpt_async_new(&t->ckpt_async, lane);
}

pt_status pt_trainer_save(pt_trainer *t) {
    if (!t->cfg.checkpoint.dir[0]) return pt_error_set(PT_ERR_INVALID, "checkpoint.dir is not set");
    if (t->ckpt_async) return save_async(t);
    return with_ckpt_timeout(t, save_now);
}

void pt_trainer_ckpt_close(pt_trainer *t) {
    pt_ckpt_async_free(t->ckpt_async);
    t->ckpt_async = NULL;
}

pt_status pt_trainer_save_wait(pt_trainer *t) {
    return pt_ckpt_async_wait(t->ckpt_async);
}

pt_status pt_trainer_resume(pt_trainer *t) {
    return with_ckpt_timeout(t, resume);
}

uint64_t pt_trainer_ckpt_written(const pt_trainer *t) {
    return t->ckpt_written;
}
