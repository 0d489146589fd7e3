/* The trainer's checkpoints: rank 0 writes the main files (GPT-2 names) and
 * the per-rank files of the asynchronous modes it gathers; every rank
 * resumes from them, bitwise at the same layout (see trainer_run.c's opening
 * comment for what makes that hold, docs/parallel.md for the files).
 *
 * Not here: the file formats and the directory protocol (checkpoint.c,
 * rank_state.c). */
#include "trainer_impl.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- checkpoints ----
 * The main files (model.safetensors, optim_m/v.safetensors, state.json) hold
 * the parameters and moments of dp index 0 (world rank 0's tp group), full
 * tensors with GPT-2's shapes under every layout (tp > 1: assembled from
 * the slices, read back by slice). Under stale and local_sgd with dp > 1,
 * rank<r>.safetensors add what world rank r needs to continue exactly
 * (rank_groups, slice-shaped); state.json's "rank_state" says they are
 * there. */

/* Whether this run's checkpoints carry per-rank state: only data
 * parallelism makes ranks' state differ (tp ranks of one dp index hold
 * slices of the same model, which the main files carry). */
static int has_rank_state(const pt_trainer *t) {
    return t->dp && (t->mode == MODE_STALE || t->mode == MODE_LOCAL);
}

/* stale: the first step whose round is launched and not yet applied; the
 * rounds in flight are those of [first, t->step). */
static int stale_first_inflight(const pt_trainer *t) {
    if (!t->dps) return t->step;
    int first = t->step - t->cfg.parallel.staleness;
    int start = pt_dp_sync_start(t->dps);
    return first > start ? first : start;
}

static void add_group(pt_ckpt_group *g, int *ng, float *buf, const char *fmt, int step) {
    PT_ASSERT(*ng < PT_CKPT_GROUP_MAX);
    snprintf(g[*ng].prefix, sizeof g[*ng].prefix, fmt, step);
    g[*ng].buf = buf;
    (*ng)++;
}

/* What rank<r>.safetensors holds for this rank, as groups over the live
 * buffers (so that saving reads them and resuming fills them):
 *   params, optim_m, optim_v   dp index > 0 under dga and local_sgd, whose
 *                              parameters and moments differ from the
 *                              main files' (dp index 0's, every tp slice)
 *   stale.step_S.sum           stale: the all-reduced sum of each step S in
 *                              flight (waited for before saving)
 *   stale.step_S.local         dga: this rank's own gradient of step S
 *   outer.anchor, .momentum    local_sgd nesterov: the outer state
 * Returns the count. */
static int rank_groups(pt_trainer *t, pt_ckpt_group *g) {
    int ng = 0, k = t->cfg.parallel.staleness;
    if (t->dp_rank > 0 && (t->dga || t->mode == MODE_LOCAL)) {
        add_group(g, &ng, pt_model_params(t->model), "params", 0);
        /* the optimizer's state only (sgd: the momentum buffer, or none) */
        if (pt_adamw_m(t->opt)) add_group(g, &ng, pt_adamw_m(t->opt), "optim_m", 0);
        if (pt_adamw_v(t->opt)) add_group(g, &ng, pt_adamw_v(t->opt), "optim_v", 0);
    }
    for (int s = stale_first_inflight(t); t->mode == MODE_STALE && s < t->step; s++) {
        int slot = s % (k + 1);
        add_group(g, &ng, pt_ddp_slot_grads(pt_dp_sync_ddp(t->dps), slot), "stale.step_%d.sum", s);
        if (t->dga) add_group(g, &ng, pt_dp_sync_dga_local(t->dps, slot), "stale.step_%d.local", s);
    }
    if (t->lsgd && pt_local_sgd_anchor(t->lsgd)) {
        add_group(g, &ng, pt_local_sgd_anchor(t->lsgd), "outer.anchor", 0);
        add_group(g, &ng, pt_local_sgd_momentum(t->lsgd), "outer.momentum", 0);
    }
    return ng;
}

/* stale: complete the rounds in flight (their sums are saved). Waiting
 * early changes no value: a later pt_ddp_wait of the slot returns at once. */
static pt_status finish_inflight(pt_trainer *t) {
    if (t->mode != MODE_STALE || !t->dps) return PT_OK;
    int k = t->cfg.parallel.staleness;
    for (int s = stale_first_inflight(t); s < t->step; s++)
        PT_CHECK(pt_ddp_wait(pt_dp_sync_ddp(t->dps), s % (k + 1)));
    return PT_OK;
}

/* state.json's text (malloc'd; NULL when out of memory). */
static char *state_json(const pt_trainer *t) {
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
    cJSON_AddNumberToObject(root, "optim_t", t->opt ? pt_adamw_t(t->opt) : t->step);
    cJSON *rng = cJSON_AddObjectToObject(root, "data_rng");
    cJSON_AddStringToObject(rng, "key", key);
    cJSON_AddStringToObject(rng, "counter", counter);
    cJSON_AddNumberToObject(root, "data_position", (double)t->data_rng.counter);
    if (has_rank_state(t)) {
        cJSON *rs = cJSON_AddObjectToObject(root, "rank_state");
        cJSON_AddNumberToObject(rs, "ranks", t->nranks);
        cJSON_AddStringToObject(rs, "files", "rank<r>.safetensors");
        cJSON_AddNumberToObject(rs, "pipeline_start", t->dps ? pt_dp_sync_start(t->dps) : 0);
    }
    cJSON_AddItemToObject(root, "config", cfg);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

/* Rank 0, the tensor files written: state.json into tmp, then the
 * directory into place. */
static pt_status finish_main(pt_trainer *t, const char *tmp) {
    char *state = state_json(t);
    pt_status st =
        state ? pt_ckpt_write_state(tmp, state) : pt_error_set(PT_ERR_NOMEM, "checkpoint state");
    free(state);
    if (st != PT_OK) {
        pt_ckpt_abort(tmp);
        return st;
    }
    PT_CHECK(pt_ckpt_commit(t->cfg.checkpoint.dir, t->step, tmp)); /* removes tmp on failure */
    pt_ckpt_prune(t->cfg.checkpoint.dir, t->cfg.checkpoint.keep);
    return PT_OK;
}

/* Flat buffers of optimizer state the config's rule keeps (optim.h). */
static int optim_state_count(const pt_config *c) {
    pt_adamw_hparams hp = {0};
    hp.kind = !strcmp(c->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    hp.momentum = (float)c->train.momentum;
    return pt_optim_state_count(&hp);
}

/* The tensors a save writes: params, then the optimizer's m and v (NULL
 * when the rule keeps none). */
enum { CK_P, CK_M, CK_V, CK_N };

/* Whether this rank's tp group assembles full tensors for the writer: the
 * group of world rank 0 (dp index 0; every rank of a group alike). */
static int tp_writes(const pt_trainer *t) {
    return t->mp && t->dp_rank == 0;
}

/* A tensor set from ZeRO's shards, module by module (pt_zero_gather_module):
 * dp rank 0 receives the module of the tensor asked for into one buffer of
 * its largest module, its peers send theirs. Every module is gathered,
 * in order, whether the writer pulls it or not (shards_rest). */
typedef struct {
    pt_trainer *t;
    pt_zero_state what;
    float *buf;   /* dp rank 0: the module gathered; NULL elsewhere */
    int next;     /* the next module to gather */
    pt_status st; /* the first failed gather: no more are tried */
} shards;

static pt_status shards_new(shards *g, pt_trainer *t, pt_zero_state what) {
    *g = (shards){.t = t, .what = what};
    if (!pt_zero_is_root(t->zero)) return PT_OK;
    size_t most = 0;
    for (int i = 0; i < pt_model_num_modules(t->model); i++) {
        size_t off, count;
        pt_model_module_region(t->model, i, &off, &count);
        if (count > most) most = count;
    }
    if (!(g->buf = pt_mem_alloc(PT_MEM_SCRATCH, most * sizeof(float))))
        return pt_error_set(PT_ERR_NOMEM, "checkpoint: a module from the shards");
    return PT_OK;
}

static pt_status shards_to(shards *g, int module) {
    while (g->st == PT_OK && g->next <= module)
        g->st = pt_zero_gather_module(g->t->zero, g->what, g->next++, g->buf);
    return g->st;
}

static pt_status shards_tensor(void *arg, int k, const float **data) {
    shards *g = arg;
    const pt_param_info *p = pt_model_tensor(g->t->model, k);
    PT_CHECK(shards_to(g, p->module));
    PT_ASSERT(g->next == p->module + 1); /* tensors come module by module, in order */
    size_t off, count;
    pt_model_module_region(g->t->model, p->module, &off, &count);
    *data = g->buf + (p->offset - off);
    return PT_OK;
}

/* The modules the writer did not pull (all of them on the other dp ranks),
 * so that no peer stays in its send. */
static pt_status shards_rest(shards *g) {
    return shards_to(g, pt_model_num_modules(g->t->model) - 1);
}

/* pt_mp_stream_full's sink: one main file of the whole model. */
typedef struct {
    const char *tmp;
    pt_ckpt_file which;
    const pt_model *full;
} main_file;

static pt_status write_streamed(void *arg, pt_st_tensor_source src, void *src_arg) {
    const main_file *w = arg;
    return pt_ckpt_write_main(w->tmp, w->which, w->full, NULL, src, src_arg);
}

/* Tensor set k of the main files: this rank's slices (its own buffer, or
 * ZeRO's shards, gathered a module at a time to dp rank 0, the only rank
 * that needs them whole), then, tp or pp > 1, streamed from every
 * model-parallel member to world rank 0 one tensor at a time, assembled
 * into GPT-2's full tensors (padding removed) as the file is written; else
 * world rank 0 writes them as they come. Every rank enters every
 * collective whatever failed before it (st on entry: this rank's status
 * so far). */
static pt_status save_tensor(pt_trainer *t, int k, const float *own, const char *tmp,
                             pt_status st) {
    static const pt_zero_state what[CK_N] = {PT_ZERO_PARAMS, PT_ZERO_M, PT_ZERO_V};
    int sharded = t->zero && (k != CK_P || t->cfg.parallel.zero == 3); /* ZeRO 1, 2: params whole */
    shards g = {0};
    if (st == PT_OK && sharded) st = shards_new(&g, t, what[k]);
    /* all or none enter the gathers: a rank out of memory (or rank 0
     * unable to write) must not leave the others waiting in them */
    if (t->aux && (t->zero || t->mp)) st = pt_comm_agree(t->aux, st);
    int gathering = sharded && st == PT_OK;
    if (st == PT_OK && tp_writes(t)) {
        PT_ASSERT((pt_comm_rank(t->mp) == 0) == (t->rank == 0));
        main_file w = {tmp, (pt_ckpt_file)k, t->full};
        st = sharded ? pt_mp_stream_full(t, shards_tensor, &g, write_streamed, &w)
                     : pt_mp_stream_flat(t, own, write_streamed, &w);
    } else if (st == PT_OK && t->rank == 0) {
        st = pt_ckpt_write_main(tmp, (pt_ckpt_file)k, t->model, sharded ? NULL : own, shards_tensor,
                                &g);
    }
    if (gathering) {
        pt_status e = shards_rest(&g);
        if (st == PT_OK) st = e;
    }
    pt_mem_free(g.buf);
    return st;
}

/* Rank 0 writes every file (the main files tensor by tensor, save_tensor;
 * per-rank state is sent to it); the others wait for it, so that a resume
 * right after finds the files, and learn its status. */
static pt_status save(pt_trainer *t) {
    if (!t->cfg.checkpoint.dir[0]) return pt_error_set(PT_ERR_INVALID, "checkpoint.dir is not set");
    PT_ASSERT(!t->zero || pt_zero_is_root(t->zero) == (t->dp_rank == 0));
    const float *own[CK_N] = {pt_model_params(t->model), t->opt ? pt_adamw_m(t->opt) : NULL,
                              t->opt ? pt_adamw_v(t->opt) : NULL};
    int nstate = optim_state_count(&t->cfg); /* sgd: m = momentum or none, no v */
    /* state the entries keep apart (the tied wte's split update) into the
     * buffers written below */
    pt_status st = pt_stack_state(&t->stack, 0);
    if (st == PT_OK) st = finish_inflight(t);
    char tmp[PT_CONFIG_STR_MAX + 64];
    int have_tmp = 0;
    if (st == PT_OK && t->rank == 0) {
        st = pt_ckpt_begin(t->cfg.checkpoint.dir, t->step, tmp, sizeof tmp);
        have_tmp = st == PT_OK;
    }
    for (int k = 0; k < CK_N; k++) /* the tensors the rule keeps, alike on every rank */
        if (t->zero ? k < 1 + nstate : own[k] != NULL) st = save_tensor(t, k, own[k], tmp, st);
    if (has_rank_state(t)) { /* every rank takes part, whatever happened so far */
        pt_ckpt_group g[PT_CKPT_GROUP_MAX];
        int ng = rank_groups(t, g);
        pt_status e = pt_ckpt_gather_rank_files(t->aux, st == PT_OK && have_tmp ? tmp : NULL,
                                                t->model, t->step, g, ng);
        if (st == PT_OK) st = e;
    }
    if (st == PT_OK && t->rank == 0)
        st = finish_main(t, tmp);
    else if (have_tmp)
        pt_ckpt_abort(tmp);
    return pt_ckpt_agree(t->aux, st);
}

/* What state.json says beyond the config. */
static pt_status read_state_fields(const char *stepdir, pt_ckpt_state *s) {
    cJSON *root = NULL;
    PT_CHECK(pt_ckpt_read_state(stepdir, &root));
    char what[PT_CONFIG_STR_MAX + 80]; /* stepdir's size, and the name */
    snprintf(what, sizeof what, "%s/state.json", stepdir);
    pt_status st = pt_ckpt_state_fields(root, what, s);
    cJSON_Delete(root);
    return st;
}

/* "dp2 stale dga k=1", "dp2 tp2 local_sgd nesterov", "dp1 sync" */
static void async_desc(const pt_config *c, char *buf, size_t n) {
    char mesh[32];
    snprintf(mesh, sizeof mesh, "dp%d", c->parallel.dp);
    if (c->parallel.tp > 1)
        snprintf(mesh + strlen(mesh), sizeof mesh - strlen(mesh), " tp%d", c->parallel.tp);
    if (!strcmp(c->parallel.sync, "stale"))
        snprintf(buf, n, "%s stale %s k=%d", mesh, c->parallel.stale_mode, c->parallel.staleness);
    else if (!strcmp(c->parallel.sync, "local_sgd"))
        snprintf(buf, n, "%s local_sgd %s", mesh, c->parallel.outer);
    else
        snprintf(buf, n, "%s %s", mesh, c->parallel.sync);
}

/* Whether the per-rank state saved under `saved` continues this run
 * exactly: the same ranks in the same mesh (dp, tp, pp: rank<r>.safetensors
 * holds world rank r's slices), mode, and (stale) the same kind and
 * staleness or (local_sgd) the same outer step. sync_every, learning rates
 * and the like may differ: they act on the future only. */
static int continues_exactly(const pt_trainer *t, const pt_config *saved, const pt_ckpt_state *s) {
    const pt_config *c = &t->cfg;
    if (!s->rank_state || !has_rank_state(t) || s->ranks != t->nranks ||
        saved->parallel.dp != c->parallel.dp || saved->parallel.tp != c->parallel.tp ||
        saved->parallel.pp != c->parallel.pp || strcmp(saved->parallel.sync, c->parallel.sync) != 0)
        return 0;
    if (t->mode == MODE_STALE)
        return !strcmp(saved->parallel.stale_mode, c->parallel.stale_mode) &&
               saved->parallel.staleness == c->parallel.staleness;
    return !strcmp(saved->parallel.outer, c->parallel.outer);
}

/* One main file into buf, laid out like this rank's model: tp > 1 reads
 * this rank's slice of the full tensors (the file is checked against the
 * whole model), tp = 1 the file as it is. */
static pt_status load_file(pt_trainer *t, const char *path, float *buf) {
    return t->mp ? pt_safetensors_load_slice(path, t->model, buf)
                 : pt_safetensors_load(path, t->model, buf);
}

/* Model and AdamW state from the main files (ZeRO: this rank's shards). */
static pt_status load_main(pt_trainer *t, const char *stepdir, int optim_t) {
    char path[PT_CONFIG_STR_MAX + 128];
    size_t n = pt_model_num_params(t->model);
    snprintf(path, sizeof path, "%s/model.safetensors", stepdir);
    if (t->zero) { /* this rank's slices in, its shards kept */
        float *fp = pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float));
        if (!fp) return pt_error_set(PT_ERR_NOMEM, "resume: parameters");
        pt_status st = load_file(t, path, fp);
        if (st == PT_OK) pt_zero_load_params(t->zero, fp);
        pt_mem_free(fp);
        PT_CHECK(st);
    } else {
        PT_CHECK(load_file(t, path, pt_model_params(t->model)));
    }
    /* the state the rule keeps: AdamW m and v, sgd's momentum buffer as m */
    if (t->opt) {
        snprintf(path, sizeof path, "%s/optim_m.safetensors", stepdir);
        if (pt_adamw_m(t->opt)) PT_CHECK(load_file(t, path, pt_adamw_m(t->opt)));
        snprintf(path, sizeof path, "%s/optim_v.safetensors", stepdir);
        if (pt_adamw_v(t->opt)) PT_CHECK(load_file(t, path, pt_adamw_v(t->opt)));
        pt_adamw_set_t(t->opt, optim_t);
        return PT_OK;
    }
    /* ZeRO: read this rank's slices of the state, keep its shard */
    int nstate = optim_state_count(&t->cfg);
    float *fm = nstate >= 1 ? pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float)) : NULL;
    float *fv = nstate >= 2 ? pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float)) : NULL;
    pt_status st = (nstate < 1 || fm) && (nstate < 2 || fv)
                       ? PT_OK
                       : pt_error_set(PT_ERR_NOMEM, "resume: optimizer state");
    snprintf(path, sizeof path, "%s/optim_m.safetensors", stepdir);
    if (st == PT_OK && fm) st = load_file(t, path, fm);
    snprintf(path, sizeof path, "%s/optim_v.safetensors", stepdir);
    if (st == PT_OK && fv) st = load_file(t, path, fv);
    if (st == PT_OK) pt_zero_load_optim(t->zero, fm, fv, optim_t);
    pt_mem_free(fv);
    pt_mem_free(fm);
    return st;
}

/* Not an exact continuation: every rank starts from rank 0's model and
 * moments, the stale pipeline from empty (pipe_start), the outer Nesterov
 * step from the loaded parameters with zero momentum. One line says so when
 * per-rank state is lost or missing. */
static void restart_pipeline(pt_trainer *t, const char *stepdir, const pt_config *saved,
                             const pt_ckpt_state *s) {
    if (t->dps) pt_dp_sync_set_start(t->dps, t->step);
    if (t->lsgd && pt_local_sgd_anchor(t->lsgd)) {
        size_t n = pt_model_num_params(t->model);
        memcpy(pt_local_sgd_anchor(t->lsgd), pt_model_params(t->model), n * sizeof(float));
        memset(pt_local_sgd_momentum(t->lsgd), 0, n * sizeof(float));
    }
    if (t->rank != 0 || (!s->rank_state && !has_rank_state(t))) return;
    char was[64], now[64];
    async_desc(saved, was, sizeof was);
    async_desc(&t->cfg, now, sizeof now);
    PT_WARN("resume: %s was saved under %s%s and this run is %s: every rank continues from rank "
            "0's model and moments, pipeline restarted (not bitwise the uninterrupted run)",
            stepdir, was, s->rank_state ? "" : " (no per-rank state)", now);
}

static pt_status resume_local(pt_trainer *t) {
    const char *dir = t->cfg.checkpoint.dir;
    if (!dir[0]) return pt_error_set(PT_ERR_INVALID, "--resume needs checkpoint.dir");
    char stepdir[PT_CONFIG_STR_MAX + 64];
    PT_CHECK(pt_checkpoint_resolve(dir, stepdir, sizeof stepdir));
    pt_config saved;
    PT_CHECK(pt_checkpoint_read_config(stepdir, &saved));
    const struct {
        const char *name;
        int have, want;
    } shape[] = {{"model.n_layer", saved.model.n_layer, t->cfg.model.n_layer},
                 {"model.n_embd", saved.model.n_embd, t->cfg.model.n_embd},
                 {"model.n_head", saved.model.n_head, t->cfg.model.n_head},
                 {"model.vocab_size", saved.model.vocab_size, t->cfg.model.vocab_size},
                 {"model.seq_len", saved.model.seq_len, t->cfg.model.seq_len}};
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].have != shape[i].want)
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: checkpoint has %s = %d but the config says %d (a checkpoint "
                                "of another model shape)",
                                stepdir, shape[i].name, shape[i].have, shape[i].want);
    /* optimizer state is the rule's own: AdamW's moments are no momentum
     * buffer, and a buffer cannot be made up (checkpoints before
     * train.optimizer existed read as adamw) */
    if (strcmp(saved.train.optimizer, t->cfg.train.optimizer) != 0 ||
        (optim_state_count(&saved) > 0) != (optim_state_count(&t->cfg) > 0))
        return pt_error_set(PT_ERR_INVALID,
                            "%s: checkpoint was trained with train.optimizer = %s (momentum %g) "
                            "but this run has %s (momentum %g): its optimizer state does not carry "
                            "over",
                            stepdir, saved.train.optimizer, saved.train.momentum,
                            t->cfg.train.optimizer, t->cfg.train.momentum);
    pt_ckpt_state s;
    PT_CHECK(read_state_fields(stepdir, &s));
    PT_CHECK(load_main(t, stepdir, s.optim_t));
    t->step = s.step;
    if (continues_exactly(t, &saved, &s)) {
        /* before rank_groups: it names the steps in flight */
        if (t->dps) pt_dp_sync_set_start(t->dps, s.pipe_start);
        pt_ckpt_group g[PT_CKPT_GROUP_MAX];
        int ng = rank_groups(t, g);
        PT_CHECK(pt_ckpt_read_rank_file(stepdir, t->model, t->rank, t->nranks, s.step, g, ng));
    } else {
        restart_pipeline(t, stepdir, &saved, &s);
    }
    t->data_rng.key = s.key;
    t->data_rng.counter = s.counter;
    PT_INFO("resumed from %s at step %d", stepdir, s.step);
    return PT_OK;
}

/* Every rank loads (its own rank file too), then all agree: a rank that
 * failed makes every rank fail with its one-line message. */
static pt_status resume(pt_trainer *t) {
    PT_CHECK(pt_ckpt_agree(t->aux, resume_local(t)));
    /* then, every rank loaded, the entries' own state from the buffers */
    return pt_ckpt_agree(t->aux, pt_stack_state(&t->stack, 1));
}

/* While rank 0 writes (or a slow disk reads) a checkpoint the other ranks
 * wait on aux, for as long as a large model's files take: the progress
 * timeout (comm.timeout, seconds) would fail a healthy save (gpt2: 1.5 GB of
 * files). Only progress is relaxed: a rank that dies meanwhile is reported
 * at once, and one that stalls (no heartbeat: SIGSTOP, a frozen host)
 * within comm.timeout, as everywhere (docs/comm.md). */
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

pt_status pt_trainer_save(pt_trainer *t) {
    return with_ckpt_timeout(t, save);
}

pt_status pt_trainer_resume(pt_trainer *t) {
    return with_ckpt_timeout(t, resume);
}
