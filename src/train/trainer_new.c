/* The trainer's construction: from a config, the mesh and its groups, this
 * rank's model, schedule, cut and executor (pt_pipeline), the optimizer,
 * and the strategy stack -- one constructor per entry, in the stack's
 * order (STACK below), each deciding from the config whether it applies --
 * then the model's hooks pointed at the stack; and freeing it all.
 *
 * The strategies run on the groups of the device mesh (pt_mesh,
 * parallel.h), never on the world, which stays for job-level things. A
 * split of the world (aux) carries the per-step statistics to rank 0, the
 * validation sums and the trace merge, so that the groups' byte counters
 * hold their own traffic only.
 *
 * Not here: the step (trainer_step.c), the loop with metrics, validation and
 * the trace file (trainer_run.c), checkpoints (trainer_ckpt.c), the
 * strategies themselves (parallel/). */
#include "trainer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/kernels.h"
#include "partrain/parallel.h"
#include "trainer_test.h"

/* Prefix the last error message (copied first: it is the buffer being set). */
pt_status pt_trainer_prefix_error(pt_status st, const char *prefix) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "%s: %s", prefix, msg);
}

static pt_status open_data(pt_data **out, const char *key, const char *path, int V, int T) {
    pt_status st = pt_data_open(out, path, V);
    if (st != PT_OK) return pt_trainer_prefix_error(st, key);
    if (pt_data_num_tokens(*out) < (size_t)T + 1) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: %s is shorter than one sequence (%zu tokens, need seq_len+1 = %d)",
                          key, path, pt_data_num_tokens(*out), T + 1);
        pt_data_free(*out);
        *out = NULL;
    }
    return st;
}

void pt_trainer_free(pt_trainer *t) {
    if (!t) return;
    if (t->metrics) fclose(t->metrics);
    pt_trainer_ckpt_close(t); /* waits for a save in flight */
    pt_ckpt_dir_close(t->ckpt_lock);
    pt_stack_free(&t->stack);
    pt_pipeline_free(t->pipe);
    pt_trace_free(t->trace);
    pt_comm_free(t->aux);
    pt_mesh_free(t->mesh); /* after the strategies that run on its groups */
    pt_mem_free(t->targets);
    pt_mem_free(t->inputs);
    pt_data_free(t->val);
    pt_data_free(t->train);
    pt_adamw_free(t->opt);
    pt_schedule_free(&t->sched);
    free(t->stages);
    free(t->owned);
    pt_model_free(t->full);
    pt_model_free(t->model);
    free(t->plan_json);
    free(t);
}

/* ---- the stack ---- */

/* The model's hook points, forwarded to the stack; a module's gradient of
 * a micro-batch is complete after its whole backward, or its W. */
static pt_status on_hook(void *arg, pt_hook_kind k, const pt_hook_point *p) {
    static const pt_point point[] = {
        [PT_HOOK_BEFORE_FORWARD] = PT_POINT_BEFORE_FORWARD,
        [PT_HOOK_AFTER_FORWARD] = PT_POINT_AFTER_FORWARD,
        [PT_HOOK_BEFORE_BACKWARD] = PT_POINT_BEFORE_BACKWARD,
        [PT_HOOK_AFTER_BACKWARD] = PT_POINT_AFTER_BACKWARD,
        [PT_HOOK_BEFORE_WEIGHT] = PT_POINT_BEFORE_WEIGHT,
        [PT_HOOK_AFTER_WEIGHT] = PT_POINT_AFTER_WEIGHT,
    };
    pt_trainer *t = arg;
    PT_CHECK(pt_stack_point(&t->stack, point[k], p));
    if (k == PT_HOOK_AFTER_WEIGHT || (k == PT_HOOK_AFTER_BACKWARD && !t->sched.split))
        PT_CHECK(pt_stack_point(&t->stack, PT_POINT_GRADS, p));
    return PT_OK;
}

static pt_adamw_hparams hparams(const pt_config *c) {
    return (pt_adamw_hparams){(float)c->train.beta1,
                              (float)c->train.beta2,
                              1e-8f,
                              (float)c->train.weight_decay,
                              !strcmp(c->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW,
                              (float)c->train.momentum};
}

/* Data parallel buckets: sync or stale; ZeRO-1 reduces with them too. */
static pt_status dp_entry(pt_trainer *t, pt_strategy *out) {
    const pt_config *c = &t->cfg;
    *out = (pt_strategy){0};
    if (!t->dp || t->mode == MODE_LOCAL || (c->parallel.zero >= 2)) return PT_OK;
    pt_dp_sync_options o = {(size_t)(c->parallel.bucket_mb * 1048576.0),
                            c->parallel.overlap,
                            c->parallel.microbatches,
                            t->mode == MODE_STALE ? c->parallel.staleness : 0,
                            t->dga,
                            !strcmp(c->comm.grad_dtype, "bf16")};
    return pt_dp_sync_strategy(out, &t->dps, t->model, t->dp, &o, t->trace);
}

static pt_status zero_entry(pt_trainer *t, pt_strategy *out) {
    const pt_config *c = &t->cfg;
    *out = (pt_strategy){0};
    if (!t->dp || c->parallel.zero == 0) return PT_OK;
    int nmod = c->model.n_layer + 2;
    unsigned char *whole = malloc((size_t)nmod);
    pt_status st =
        whole ? pt_config_zero_whole(c, whole) : pt_error_set(PT_ERR_NOMEM, "zero_whole");
    pt_zero_options zo = {c->parallel.zero,        c->parallel.zero_group,
                          c->parallel.overlap,     c->parallel.zero_keep_params,
                          t->pp || t->sched.split, whole};
    pt_adamw_hparams hp = hparams(c);
    if (st == PT_OK) st = pt_zero_strategy(out, &t->zero, t->model, t->dp, &zo, &hp, t->trace);
    free(whole);
    return st;
}

/* The optimizer over the whole buffer, for every layout but ZeRO's. */
static pt_status optimizer_entry(pt_trainer *t, pt_strategy *out) {
    *out = (pt_strategy){0};
    if (t->zero) return PT_OK;
    int ntens = pt_model_num_tensors(t->model);
    pt_optim_segment *segs = malloc((size_t)ntens * sizeof *segs);
    if (!segs) return pt_error_set(PT_ERR_NOMEM, "optimizer segments");
    for (int i = 0; i < ntens; i++) {
        const pt_param_info *p = pt_model_tensor(t->model, i);
        segs[i] = (pt_optim_segment){p->offset, p->numel, p->decay};
    }
    pt_adamw_hparams hp = hparams(&t->cfg);
    pt_status st = pt_adamw_new(&t->opt, pt_model_num_params(t->model), segs, ntens, &hp);
    free(segs);
    /* each rank's own model under local SGD and dga; else the dp group's one */
    pt_state_share share = {-1, t->dp_rank, t->dp_size};
    if (t->mode == MODE_LOCAL || t->dga) share = (pt_state_share){t->dp_rank, 0, 1};
    return st == PT_OK ? pt_optimizer_strategy(out, t->opt, t->model, t->trace, share) : st;
}

static pt_status local_entry(pt_trainer *t, pt_strategy *out) {
    const pt_config *c = &t->cfg;
    *out = (pt_strategy){0};
    if (!t->dp || t->mode != MODE_LOCAL) return PT_OK;
    pt_local_sgd_options o = {c->parallel.sync_every, !strcmp(c->parallel.outer, "nesterov"),
                              (float)c->parallel.outer_lr, (float)c->parallel.outer_momentum};
    return pt_local_sgd_strategy(out, NULL, t->model, t->dp, &o, t->trace);
}

static pt_status tied_entry(pt_trainer *t, pt_strategy *out) {
    int G = t->sched.stages * t->sched.virtual_stages, c;
    int emb = pt_schedule_locate(t->sched.name, t->sched.stages, t->sched.virtual_stages, 0, &c);
    int head =
        pt_schedule_locate(t->sched.name, t->sched.stages, t->sched.virtual_stages, G - 1, &c);
    /* the update split between the two stages where each stage's
     * optimizer is its own whole buffer (tied_split.c) */
    pt_adamw_hparams hp = hparams(&t->cfg);
    return pt_tied_strategy(out, t->model, t->pp, emb, head, t->dp ? NULL : t->opt, &hp);
}

static pt_status tp_norm_entry(pt_trainer *t, pt_strategy *out) {
    return pt_tp_norm_strategy(out, t->tp);
}
static pt_status pp_norm_entry(pt_trainer *t, pt_strategy *out) {
    return pt_pp_norm_strategy(out, t->pp);
}
static pt_status trace_entry(pt_trainer *t, pt_strategy *out) {
    return pt_trace_strategy(out, t->trace, t->model, t->cfg.parallel.microbatches, t->sched.split);
}

/* The stack, in order: BEFORE points run top to bottom, AFTER points
 * bottom to top (parallel.h). ZeRO gathers before the tied stage sends wte
 * and releases after; the tied stage adds the head's wte gradient before
 * the buckets or ZeRO reduce it; the optimizer steps before local SGD
 * averages; the norm entries sum over tp, then the stages; the trace's
 * clock starts last and stops first. */
typedef pt_status (*entry_fn)(pt_trainer *t, pt_strategy *out);
static const entry_fn STACK[] = {dp_entry,   zero_entry,    optimizer_entry, local_entry,
                                 tied_entry, tp_norm_entry, pp_norm_entry,   trace_entry};

static pt_status build_stack(pt_trainer *t) {
    for (size_t i = 0; i < sizeof STACK / sizeof STACK[0]; i++) {
        pt_strategy e;
        PT_CHECK(STACK[i](t, &e));
        PT_CHECK(pt_stack_push(&t->stack, e));
    }
    pt_model_set_hook(t->model, on_hook, t);
    return PT_OK;
}

/* ---- the model and its passes ---- */

/* The pipeline's cut: pp x v virtual stages of contiguous modules (one
 * stage of all of them with pp = 1), and which modules each rank holds
 * (its chunks'); rank 0 prints it. */
static pt_status cut_stages(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    int p = t->pp_size, v = t->sched.virtual_stages, G = p * v, nmod = cfg->model.n_layer + 2;
    t->stages = malloc((size_t)G * sizeof *t->stages);
    if (!t->stages) return pt_error_set(PT_ERR_NOMEM, "pipeline stages");
    /* balanced by each stage's whole step: its passes and its update */
    pt_stage_step step = pt_config_stage_step(cfg, t->dp_size);
    PT_CHECK(pt_stage_split_step(&cfg->model, &step, t->sched.name, p, v, t->sched.microbatches,
                                 cfg->parallel.stage_layers, t->stages));
    if (p == 1) return PT_OK;
    t->owned = calloc((size_t)p * (size_t)nmod, 1);
    if (!t->owned) return pt_error_set(PT_ERR_NOMEM, "pipeline stages");
    for (int g = 0; g < G; g++) {
        int c, r = pt_schedule_locate(t->sched.name, p, v, g, &c);
        for (int i = t->stages[g].first; i <= t->stages[g].last; i++)
            t->owned[(size_t)r * (size_t)nmod + (size_t)i] = 1;
    }
    if (t->rank == 0) {
        char buf[512];
        pt_stage_describe(&cfg->model, G, t->stages, buf, sizeof buf);
        PT_INFO("pipeline: %d stages x %d chunk%s, %s (%s, %d micro-batches)", p, v,
                v > 1 ? "s" : "", buf, t->sched.name, t->sched.microbatches);
    }
    return PT_OK;
}

/* This rank's schedule, cut, model (its tp slice of its stage's modules,
 * no slot of its own: the executor's blocks hold the activations) and
 * executor. */
static pt_status build_passes(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    const pt_model_config *mc = &cfg->model;
    int nmod = mc->n_layer + 2;
    PT_CHECK(pt_schedule_build_stage(&t->sched, pt_config_schedule(cfg), cfg->parallel.microbatches,
                                     t->pp_size, t->pp_rank, pt_config_virtual_stages(cfg)));
    PT_CHECK(cut_stages(t));
    pt_model_options mo = {.tp = cfg->parallel.tp,
                           .tp_rank = t->tp_rank,
                           .sp = cfg->parallel.sequence_parallel,
                           .owned = t->owned ? t->owned + (size_t)t->pp_rank * (size_t)nmod : NULL,
                           .recompute = pt_config_stage_recompute(cfg, t->pp_rank),
                           .no_slot = 1,
                           .bf16 = !strcmp(cfg->train.precision, "bf16")};
    PT_CHECK(pt_model_new_opts(&t->model, mc, t->micro_B, &mo));
    pt_model_set_tp_comm(t->model, t->tp);
    if (t->mp) PT_CHECK(pt_model_new_slice(&t->full, mc, 0, 1, 0));
    pt_model_draw_weights(t->model, (uint64_t)cfg->train.seed);
    return pt_pipeline_new(&t->pipe, t->model, &t->sched, t->stages, t->pp);
}

/* ---- the rest ---- */

static int default_threads(int nranks) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long n = cores > 0 ? cores / (nranks > 0 ? nranks : 1) : 1;
    return n < 1 ? 1 : (int)n;
}

/* The mesh first, while every rank is sure to get here: the groups are
 * collectives over the world. */
static pt_status build_mesh(pt_trainer *t, pt_comm *world) {
    const pt_config *cfg = &t->cfg;
    PT_CHECK(pt_mesh_new(&t->mesh, world, cfg->parallel.dp, cfg->parallel.tp, cfg->parallel.pp));
    t->dp = pt_mesh_comm(t->mesh, PT_MESH_DP);
    t->tp = pt_mesh_comm(t->mesh, PT_MESH_TP);
    t->pp = pt_mesh_comm(t->mesh, PT_MESH_PP);
    t->mp = pt_mesh_comm(t->mesh, PT_MESH_MP);
    t->dp_rank = pt_mesh_index(t->mesh, PT_MESH_DP);
    t->dp_size = pt_mesh_size(t->mesh, PT_MESH_DP);
    t->tp_rank = pt_mesh_index(t->mesh, PT_MESH_TP);
    t->pp_rank = pt_mesh_index(t->mesh, PT_MESH_PP);
    t->pp_size = pt_mesh_size(t->mesh, PT_MESH_PP);
    t->local_B = cfg->train.batch_size / t->dp_size;
    t->micro_B = t->local_B / cfg->parallel.microbatches;
    if (!t->world) return PT_OK;
    PT_CHECK(pt_comm_split(t->world, 0, t->rank, &t->aux));
    pt_comm_set_name(t->aux, "aux", -1); /* the flight recorder's name */
    return PT_OK;
}

static pt_status open_inputs(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    const pt_model_config *mc = &cfg->model;
    if (cfg->data.train[0])
        PT_CHECK(open_data(&t->train, "data.train", cfg->data.train, mc->vocab_size, mc->seq_len));
    if (cfg->data.val[0])
        PT_CHECK(open_data(&t->val, "data.val", cfg->data.val, mc->vocab_size, mc->seq_len));
    size_t ntok = (size_t)cfg->train.batch_size * (size_t)mc->seq_len;
    t->inputs = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    t->targets = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    if (!t->inputs || !t->targets) return pt_error_set(PT_ERR_NOMEM, "the batch's tokens");
    pt_rng_init(&t->data_rng, (uint64_t)cfg->train.seed, "data.train");
    return PT_OK;
}

/* The trace recorder, sized for the run (one time origin: rank 0's; same
 * host, one monotonic clock). */
static pt_status open_trace(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    if (!cfg->log.trace[0]) return PT_OK;
    size_t nmod = (size_t)cfg->model.n_layer + 2, M = (size_t)cfg->parallel.microbatches;
    size_t per_step = 3 * nmod * M + 8 + 2 * (size_t)t->sched.npass + 2 * nmod + 8 * nmod * M;
    size_t max_ev = per_step * (size_t)(cfg->train.steps + 2);
    if (max_ev > 2000000) max_ev = 2000000;
    PT_CHECK(pt_trace_new(&t->trace, max_ev));
    t->trace_t0 = pt_time_ns();
    if (t->aux) PT_CHECK(pt_comm_broadcast(t->aux, &t->trace_t0, sizeof t->trace_t0, 0));
    pt_pipeline_set_trace(t->pipe, t->trace);
    return PT_OK;
}

/* Before step 1, not at the first save after the whole run: a
 * checkpoint.dir that cannot be written, or that another job holds; rank 0
 * (the writer) keeps its lock until the trainer is freed. */
static pt_status lock_checkpoints(pt_trainer *t) {
    if (!t->cfg.checkpoint.dir[0]) return PT_OK;
    pt_status ck = PT_OK;
    if (t->rank == 0 && (ck = pt_ckpt_dir_open(t->cfg.checkpoint.dir, &t->ckpt_lock)) != PT_OK)
        ck = pt_trainer_prefix_error(ck, "checkpoint.dir");
    return pt_ckpt_agree(t->aux, ck);
}

pt_status pt_trainer_check_outputs(const pt_config *cfg) {
    const char *metrics = cfg->log.metrics, *trace = cfg->log.trace, *ck = cfg->checkpoint.dir;
    pt_status st = PT_OK;
    if (metrics[0] && (st = pt_file_check_output(metrics, 1)) != PT_OK)
        return pt_trainer_prefix_error(st, "log.metrics");
    if (trace[0] && (st = pt_file_check_output(trace, 0)) != PT_OK)
        return pt_trainer_prefix_error(st, "log.trace");
    if (metrics[0] && !strcmp(metrics, trace))
        return pt_error_set(PT_ERR_INVALID, "log.metrics and log.trace are both %s", trace);
    if (ck[0] && (st = pt_dir_check_output(ck)) != PT_OK)
        return pt_trainer_prefix_error(st, "checkpoint.dir");
    return PT_OK;
}

pt_status pt_trainer_check(const pt_config *cfg, int nranks, int resume) {
    PT_CHECK(pt_config_validate(cfg));
    /* the mesh: dp x tp x pp is the world (validation bounds each by 2^20) */
    long long mesh_n = (long long)cfg->parallel.dp * cfg->parallel.tp * cfg->parallel.pp;
    if (mesh_n != nranks)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.dp = %d, parallel.tp = %d, parallel.pp = %d: their product "
                            "%lld must be the world size, but there %s %d rank%s (run with "
                            "--nproc %lld, or mpirun -np %lld ... --backend mpi)",
                            cfg->parallel.dp, cfg->parallel.tp, cfg->parallel.pp, mesh_n,
                            nranks == 1 ? "is" : "are", nranks, nranks == 1 ? "" : "s", mesh_n,
                            mesh_n);
    /* pt_trainer_resume's first refusal (trainer_ckpt.c), in its words */
    if (resume && !cfg->checkpoint.dir[0])
        return pt_error_set(PT_ERR_INVALID, "--resume needs checkpoint.dir");
    return PT_OK;
}

pt_status pt_trainer_new_wrapped(pt_trainer **out, const pt_config *cfg, pt_comm *world,
                                 pt_trainer_wrap_fn wrap, void *arg) {
    *out = NULL;
    int nranks = world ? pt_comm_size(world) : 1;
    PT_CHECK(pt_trainer_check(cfg, nranks, 0));
    /* the outputs before anything is built. Every rank checks the same
     * paths (no collective: the world is left to job-level things), as each
     * opens data.train itself below */
    PT_CHECK(pt_trainer_check_outputs(cfg));
    pt_status st = PT_OK;
    pt_trainer *t = calloc(1, sizeof *t);
    if (!t) return pt_error_set(PT_ERR_NOMEM, "trainer");
    t->ckpt_lock = -1;
    t->cfg = *cfg;
    t->world = nranks > 1 ? world : NULL;
    t->rank = world ? pt_comm_rank(world) : 0;
    t->nranks = nranks;
    t->mode = !strcmp(cfg->parallel.sync, "stale")       ? MODE_STALE
              : !strcmp(cfg->parallel.sync, "local_sgd") ? MODE_LOCAL
                                                         : MODE_SYNC;
    t->dga = t->mode == MODE_STALE && !strcmp(cfg->parallel.stale_mode, "dga");
    if (t->cfg.train.threads == 0) t->cfg.train.threads = default_threads(nranks);
    pt_config_layout(cfg, t->layout, sizeof t->layout);
    pt_kernels_set_threads(t->cfg.train.threads);
    PT_CHECK_GOTO(st, build_mesh(t, world), fail);
    PT_CHECK_GOTO(st, open_inputs(t), fail);
    PT_CHECK_GOTO(st, build_passes(t), fail);
    PT_CHECK_GOTO(st, open_trace(t), fail);
    PT_CHECK_GOTO(st, build_stack(t), fail);
    if (wrap) PT_CHECK_GOTO(st, wrap(t, &t->stack, arg), fail);
    PT_CHECK_GOTO(st, lock_checkpoints(t), fail);
    PT_CHECK_GOTO(st, pt_trainer_ckpt_open(t), fail);
    *out = t;
    return PT_OK;
fail:
    pt_trainer_free(t);
    return st;
}

pt_status pt_trainer_new_dist(pt_trainer **out, const pt_config *cfg, pt_comm *world) {
    return pt_trainer_new_wrapped(out, cfg, world, NULL, NULL);
}

pt_status pt_trainer_new(pt_trainer **out, const pt_config *cfg) {
    return pt_trainer_new_dist(out, cfg, NULL);
}

pt_model *pt_trainer_model(pt_trainer *t) {
    return t->model;
}
size_t pt_trainer_num_params(const pt_trainer *t) {
    return pt_model_config_num_params(&t->cfg.model);
}
pt_adamw *pt_trainer_optim(pt_trainer *t) {
    return t->opt;
}
const pt_config *pt_trainer_config(const pt_trainer *t) {
    return &t->cfg;
}
int pt_trainer_step_count(const pt_trainer *t) {
    return t->step;
}
