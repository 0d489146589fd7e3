/* The trainer's construction: builds model, optimizer, data, the
 * data-parallel machinery (pt_ddp buckets, pt_local_sgd, pt_zero) and the
 * trace from a config, installs the model's hooks (trace events per module,
 * bucket launches, ZeRO's gathers), and frees it all; plus the small
 * accessors.
 *
 * The strategies run on the dp group of the device mesh (pt_mesh,
 * parallel.h), never on the world, which stays for job-level things. A
 * second communicator split from the world (aux) carries the per-step
 * statistics to rank 0, the validation sums and the trace merge, so that the
 * dp group's byte counters hold gradient and parameter traffic only.
 *
 * Not here: the step (trainer_step.c), the loop with metrics, validation and
 * the trace file (trainer_run.c), checkpoints (trainer_ckpt.c), the bucket
 * and averaging machinery (parallel/), tensor and pipeline parallelism. */
#include "trainer_impl.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/model_test.h" /* pt_model_test_skip_f: PT_TEST_PLANT's tp_skip_f */
#include "partrain/kernels.h"
#include "partrain/parallel.h"

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
    pt_ckpt_dir_close(t->ckpt_lock);
    pt_ddp_free(t->ddp);
    pt_zero_free(t->zero);
    pt_mem_free(t->dga_local);
    pt_local_sgd_free(t->lsgd);
    pt_trace_free(t->trace);
    free(t->mod_name);
    pt_comm_free(t->aux);
    pt_pipe_free(t->pipe);
    pt_mesh_free(t->mesh); /* after the strategies that run on its groups */
    pt_mem_free(t->targets);
    pt_mem_free(t->inputs);
    pt_data_free(t->val);
    pt_data_free(t->train);
    pt_adamw_free(t->opt);
    if (t->slots)
        for (int k = 1; k < t->sched.in_flight; k++) pt_model_slot_free(t->slots[k]);
    free(t->slots);
    pt_schedule_free(&t->sched);
    free(t->stages);
    free(t->owned);
    pt_model_free(t->full);
    pt_model_free(t->model);
    free(t);
}

/* ---- hooks: trace events per module, bucket launches ---- */

static void hook_before(pt_trainer *t) {
    if (t->trace) t->hook_t0 = pt_time_ns();
}
/* ZeRO-3 gathers a module's parameters before it runs (not timed as the
 * module's compute), releases them after */
static pt_status hook_before_forward(void *arg, const pt_hook_point *p) {
    pt_trainer *t = arg;
    if (t->zero) pt_zero_before_forward(t->zero, p->module);
    if (t->pipe) pt_pipe_before_forward(t->pipe, t->model, p->module); /* the tied wte */
    hook_before(t);
    return PT_OK;
}
static pt_status hook_before_backward(void *arg, const pt_hook_point *p) {
    pt_trainer *t = arg;
    if (t->zero) pt_zero_before_backward(t->zero, p->module);
    hook_before(t);
    return PT_OK;
}
static void trace_pass(pt_trainer *t, const char *pass, const char *cat, const pt_hook_point *p) {
    char name[40];
    if (t->cfg.parallel.microbatches > 1)
        snprintf(name, sizeof name, "%s %s mb%d", pass, t->mod_name[p->module], p->micro);
    else
        snprintf(name, sizeof name, "%s %s", pass, t->mod_name[p->module]);
    pt_trace_add(t->trace, name, cat, PT_TRACE_MAIN, t->hook_t0, pt_time_ns(), t->step + 1);
}
static pt_status hook_after_forward(void *arg, const pt_hook_point *p) {
    pt_trainer *t = arg;
    if (t->pipe) pt_pipe_after_forward(t->pipe, p->module); /* before ZeRO-3 releases wte */
    if (t->zero) pt_zero_after_forward(t->zero, p->module);
    if (t->trace) trace_pass(t, "fwd", "forward", p);
    return PT_OK;
}
/* Module p->module's gradients of this micro-batch are complete: after its
 * backward, or after its weight-gradient pass when the backward is split. */
static void grads_done(pt_trainer *t, const pt_hook_point *p) {
    /* the tied wte's two halves meet before the module's gradient is final */
    if (t->pipe && p->last) pt_pipe_grads_final(t->pipe, t->model, p->module);
    /* a bucket launches once its modules' gradients are final: after the
     * step's last backward of each */
    if (t->ddp && p->last) pt_ddp_module_done(t->ddp, p->module);
    if (t->zero) pt_zero_module_done(t->zero, p->module, p->last);
}
static pt_status hook_after_backward(void *arg, const pt_hook_point *p) {
    pt_trainer *t = arg;
    if (t->trace) trace_pass(t, t->sched.split ? "B" : "bwd", "backward", p);
    if (!t->sched.split) grads_done(t, p);
    return PT_OK;
}
static pt_status hook_before_weight_grad(void *arg, const pt_hook_point *p) {
    (void)p;
    hook_before(arg);
    return PT_OK;
}
static pt_status hook_after_weight_grad(void *arg, const pt_hook_point *p) {
    pt_trainer *t = arg;
    if (t->trace) trace_pass(t, "W", "backward", p);
    grads_done(t, p);
    return PT_OK;
}
/* The model's one plug point (pt_model_set_hook): each kind's hook above. */
static pt_status trainer_hook(void *arg, pt_hook_kind k, const pt_hook_point *p) {
    switch (k) {
    case PT_HOOK_BEFORE_FORWARD:
        return hook_before_forward(arg, p);
    case PT_HOOK_AFTER_FORWARD:
        return hook_after_forward(arg, p);
    case PT_HOOK_BEFORE_BACKWARD:
        return hook_before_backward(arg, p);
    case PT_HOOK_AFTER_BACKWARD:
        return hook_after_backward(arg, p);
    case PT_HOOK_BEFORE_WEIGHT:
        return hook_before_weight_grad(arg, p);
    case PT_HOOK_AFTER_WEIGHT:
        return hook_after_weight_grad(arg, p);
    }
    return PT_OK;
}

/* The test hook PT_TEST_PLANT (parallel.h, pt_plant): a bug planted on
 * purpose so that the parity tests can show they catch it. Unset or empty:
 * none; an unknown name is an error, so that a typo cannot make a self-check
 * pass. */
static pt_status read_plant(pt_plant *out) {
    static const struct {
        const char *name;
        pt_plant plant;
    } names[] = {{"double_bucket", PT_PLANT_DOUBLE_BUCKET},
                 {"no_avg", PT_PLANT_NO_AVG},
                 {"skip_module", PT_PLANT_SKIP_MODULE},
                 {"tp_skip_f", PT_PLANT_TP_SKIP_F},
                 {"tp_norm", PT_PLANT_TP_NORM},
                 {"pp_tied", PT_PLANT_PP_TIED},
                 {"pp_norm", PT_PLANT_PP_NORM}};
    *out = PT_PLANT_NONE;
    const char *e = getenv("PT_TEST_PLANT");
    if (!e || !*e) return PT_OK;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(e, names[i].name)) {
            *out = names[i].plant;
            PT_WARN("PT_TEST_PLANT=%s: a bug is planted on purpose (test hook)", e);
            return PT_OK;
        }
    return pt_error_set(PT_ERR_INVALID,
                        "PT_TEST_PLANT=%s: unknown (double_bucket, no_avg, skip_module, tp_skip_f, "
                        "tp_norm, pp_tied or pp_norm)",
                        e);
}

/* The pipeline's cut: pp x v virtual stages of contiguous modules, and
 * which modules each rank holds (its chunks'); rank 0 prints it. */
static pt_status cut_stages(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    int p = t->pp_size, v = t->sched.virtual_stages, G = p * v, nmod = cfg->model.n_layer + 2;
    t->stages = malloc((size_t)G * sizeof *t->stages);
    t->owned = calloc((size_t)p * (size_t)nmod, 1);
    if (!t->stages || !t->owned) return pt_error_set(PT_ERR_NOMEM, "pipeline stages");
    PT_CHECK(pt_stage_split_for(&cfg->model, t->sched.name, p, v, t->sched.microbatches,
                                cfg->parallel.stage_layers, t->stages));
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

static int default_threads(int nranks) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long n = cores > 0 ? cores / (nranks > 0 ? nranks : 1) : 1;
    return n < 1 ? 1 : (int)n;
}

pt_status pt_trainer_new(pt_trainer **out, const pt_config *cfg) {
    return pt_trainer_new_dist(out, cfg, NULL);
}

pt_status pt_trainer_new_dist(pt_trainer **out, const pt_config *cfg, pt_comm *world) {
    *out = NULL;
    PT_CHECK(pt_config_validate(cfg));
    int nranks = world ? pt_comm_size(world) : 1;
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
    if (t->cfg.train.threads == 0) t->cfg.train.threads = default_threads(nranks);
    PT_CHECK_GOTO(st, read_plant(&t->plant), fail);
    /* first, while every rank is sure to get here: the groups are
     * collectives over the world */
    PT_CHECK_GOTO(
        st, pt_mesh_new(&t->mesh, world, cfg->parallel.dp, cfg->parallel.tp, cfg->parallel.pp),
        fail);
    t->dp = pt_mesh_comm(t->mesh, PT_MESH_DP);
    t->dp_rank = pt_mesh_index(t->mesh, PT_MESH_DP);
    t->dp_size = pt_mesh_size(t->mesh, PT_MESH_DP);
    t->tp = pt_mesh_comm(t->mesh, PT_MESH_TP);
    t->pp = pt_mesh_comm(t->mesh, PT_MESH_PP);
    t->mp = pt_mesh_comm(t->mesh, PT_MESH_MP);
    t->pp_rank = pt_mesh_index(t->mesh, PT_MESH_PP);
    t->pp_size = pt_mesh_size(t->mesh, PT_MESH_PP);
    const pt_model_config *mc = &cfg->model;
    t->local_B = cfg->train.batch_size / t->dp_size;
    t->micro_B = t->local_B / cfg->parallel.microbatches;
    pt_config_layout(cfg, t->layout, sizeof t->layout);
    pt_kernels_set_threads(t->cfg.train.threads);

    if (cfg->data.train[0])
        PT_CHECK_GOTO(
            st, open_data(&t->train, "data.train", cfg->data.train, mc->vocab_size, mc->seq_len),
            fail);
    if (cfg->data.val[0])
        PT_CHECK_GOTO(
            st, open_data(&t->val, "data.val", cfg->data.val, mc->vocab_size, mc->seq_len), fail);

    /* the step's passes (a pipeline: this stage's) */
    const char *sched = pt_config_schedule(cfg);
    int M = cfg->parallel.microbatches, nmod = mc->n_layer + 2;
    PT_CHECK_GOTO(st,
                  t->pp ? pt_schedule_build_stage(&t->sched, sched, M, t->pp_size, t->pp_rank,
                                                  pt_config_virtual_stages(cfg))
                        : pt_schedule_build(&t->sched, sched, M),
                  fail);
    if (t->pp) PT_CHECK_GOTO(st, cut_stages(t), fail);

    /* tensor parallelism: this rank's slices, run with the tp group; a
     * pipeline stage: its modules only */
    t->tp_rank = pt_mesh_index(t->mesh, PT_MESH_TP);
    /* the rank's own recompute mode (model.stage_recompute), for all its
     * chunks: the slots the pipeline sizes from this model follow it */
    pt_model_options mo = {.tp = cfg->parallel.tp,
                           .tp_rank = t->tp_rank,
                           .sp = cfg->parallel.sequence_parallel,
                           .owned = t->owned ? t->owned + (size_t)t->pp_rank * (size_t)nmod : NULL,
                           .recompute = pt_config_stage_recompute(cfg, t->pp_rank)};
    PT_CHECK_GOTO(st, pt_model_new_opts(&t->model, mc, t->micro_B, &mo), fail);
    pt_model_set_tp_comm(t->model, t->tp);
    if (t->mp) PT_CHECK_GOTO(st, pt_model_new_slice(&t->full, mc, 0, 1, 0), fail);
    pt_model_draw_weights(t->model, (uint64_t)cfg->train.seed);
    if (t->pp) {
        PT_CHECK_GOTO(st, pt_pipe_new(&t->pipe, t->model, t->pp, &t->sched, t->stages), fail);
    } else {
        /* a schedule that holds several micro-batches' activations gets a
         * slot for each (the first is the model's own) */
        t->slots = calloc((size_t)t->sched.in_flight, sizeof *t->slots);
        if (!t->slots) {
            st = pt_error_set(PT_ERR_NOMEM, "model slots");
            goto fail;
        }
        t->slots[0] = pt_model_own_slot(t->model);
        for (int k = 1; k < t->sched.in_flight; k++)
            PT_CHECK_GOTO(st, pt_model_slot_new(&t->slots[k], t->model), fail);
    }

    int ntens = pt_model_num_tensors(t->model);
    pt_optim_segment *segs = malloc((size_t)ntens * sizeof *segs);
    if (!segs) {
        st = pt_error_set(PT_ERR_NOMEM, "optimizer segments");
        goto fail;
    }
    for (int i = 0; i < ntens; i++) {
        const pt_param_info *p = pt_model_tensor(t->model, i);
        segs[i] = (pt_optim_segment){p->offset, p->numel, p->decay};
    }
    pt_adamw_hparams hp = {(float)cfg->train.beta1,
                           (float)cfg->train.beta2,
                           1e-8f,
                           (float)cfg->train.weight_decay,
                           !strcmp(cfg->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW,
                           (float)cfg->train.momentum};
    /* ZeRO: each rank holds AdamW state for its shard only (pt_zero) */
    int sharded = t->dp && cfg->parallel.zero > 0;
    st = sharded ? PT_OK : pt_adamw_new(&t->opt, pt_model_num_params(t->model), segs, ntens, &hp);
    free(segs);
    if (st != PT_OK) goto fail;
    if (sharded) {
        unsigned char *whole = malloc((size_t)nmod);
        st = whole ? pt_config_zero_whole(cfg, whole) : pt_error_set(PT_ERR_NOMEM, "zero_whole");
        pt_zero_options zo = {cfg->parallel.zero,
                              cfg->parallel.zero_group,
                              cfg->parallel.overlap,
                              cfg->parallel.zero_keep_params,
                              t->tp,
                              t->pp,
                              t->pp || t->sched.split,
                              whole};
        if (st == PT_OK) st = pt_zero_new(&t->zero, t->model, t->dp, &zo, &hp);
        free(whole);
        if (st != PT_OK) goto fail;
    }

    size_t ntok = (size_t)cfg->train.batch_size * (size_t)mc->seq_len;
    t->inputs = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    t->targets = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    if (!t->inputs || !t->targets) {
        st = PT_ERR_NOMEM;
        goto fail;
    }
    pt_rng_init(&t->data_rng, (uint64_t)cfg->train.seed, "data.train");

    t->mod_name = calloc((size_t)nmod, sizeof *t->mod_name);
    if (!t->mod_name) {
        st = pt_error_set(PT_ERR_NOMEM, "module names");
        goto fail;
    }
    for (int i = 0; i < nmod; i++) {
        if (i == 0)
            snprintf(t->mod_name[i], sizeof t->mod_name[i], "embedding");
        else if (i == nmod - 1)
            snprintf(t->mod_name[i], sizeof t->mod_name[i], "head");
        else
            snprintf(t->mod_name[i], sizeof t->mod_name[i], "h.%d", i - 1);
    }
    if (t->world) {
        PT_CHECK_GOTO(st, pt_comm_split(t->world, 0, t->rank, &t->aux), fail);
    }
    if (t->dp) {
        if (t->zero && cfg->parallel.zero >= 2) {
            /* stage 2: pt_zero reduce-scatters; no all-reduce buckets */
        } else if (t->mode != MODE_LOCAL) {
            pt_ddp_options o = {(size_t)(cfg->parallel.bucket_mb * 1048576.0),
                                t->mode == MODE_STALE ? cfg->parallel.staleness + 1 : 1,
                                t->mode == MODE_SYNC, t->plant};
            PT_CHECK_GOTO(st, pt_ddp_new(&t->ddp, t->model, t->dp, &o), fail);
            t->dga = t->mode == MODE_STALE && !strcmp(cfg->parallel.stale_mode, "dga");
            if (t->dga) {
                t->dga_local = pt_mem_alloc(
                    PT_MEM_COMM, (size_t)o.nslots * pt_model_num_params(t->model) * sizeof(float));
                if (!t->dga_local) {
                    st = pt_error_set(PT_ERR_NOMEM, "dga local gradients");
                    goto fail;
                }
            }
        } else {
            PT_CHECK_GOTO(st,
                          pt_local_sgd_new(
                              &t->lsgd, pt_model_params(t->model), pt_model_num_params(t->model),
                              !strcmp(cfg->parallel.outer, "nesterov"),
                              (float)cfg->parallel.outer_lr, (float)cfg->parallel.outer_momentum),
                          fail);
        }
    }
    if (cfg->checkpoint.dir[0]) {
        /* before step 1, not at the first save after the whole run: a
         * checkpoint.dir that cannot be written, or that another job holds;
         * rank 0 (the writer) keeps its lock until the trainer is freed */
        pt_status ck = PT_OK;
        if (t->rank == 0 && (ck = pt_ckpt_dir_open(cfg->checkpoint.dir, &t->ckpt_lock)) != PT_OK)
            ck = pt_trainer_prefix_error(ck, "checkpoint.dir");
        PT_CHECK_GOTO(st, pt_ckpt_agree(t->aux, ck), fail);
    }
    if (cfg->log.trace[0]) {
        size_t per_step = (size_t)(3 * nmod * cfg->parallel.microbatches + 8) +
                          (size_t)t->sched.npass +
                          (t->ddp ? 2 * (size_t)pt_ddp_num_buckets(t->ddp) : 0) +
                          (t->zero ? (size_t)(8 * nmod * cfg->parallel.microbatches) : 0);
        size_t max_ev = per_step * (size_t)(cfg->train.steps + 2);
        if (max_ev > 2000000) max_ev = 2000000;
        PT_CHECK_GOTO(st, pt_trace_new(&t->trace, max_ev), fail);
        t->trace_t0 = pt_time_ns();
        if (t->aux) /* one time origin: rank 0's (same host: one monotonic clock) */
            PT_CHECK_GOTO(st, pt_comm_broadcast(t->aux, &t->trace_t0, sizeof t->trace_t0, 0), fail);
        if (t->ddp) pt_ddp_set_trace(t->ddp, t->trace);
        if (t->zero) pt_zero_set_trace(t->zero, t->trace);
    }
    pt_model_set_hook(t->model, trainer_hook, t);
    if ((t->plant == PT_PLANT_TP_SKIP_F || t->plant == PT_PLANT_TP_NORM) && !t->tp) {
        st = pt_error_set(PT_ERR_INVALID, "PT_TEST_PLANT: this layout has no tensor parallelism");
        goto fail;
    }
    pt_model_test_skip_f(t->model, t->plant == PT_PLANT_TP_SKIP_F);
    if ((t->plant == PT_PLANT_PP_TIED || t->plant == PT_PLANT_PP_NORM) && !t->pipe) {
        st = pt_error_set(PT_ERR_INVALID, "PT_TEST_PLANT: this layout has no pipeline");
        goto fail;
    }
    if (t->pipe) pt_pipe_test_plant(t->pipe, t->plant);
    if ((t->plant == PT_PLANT_DOUBLE_BUCKET || t->plant == PT_PLANT_SKIP_MODULE) && !t->ddp) {
        st = pt_error_set(PT_ERR_INVALID,
                          "PT_TEST_PLANT: this layout has no gradient buckets to plant it in");
        goto fail;
    }
    *out = t;
    return PT_OK;
fail:
    pt_trainer_free(t);
    return st;
}

pt_model *pt_trainer_model(pt_trainer *t) {
    return t->model;
}
size_t pt_trainer_num_params(const pt_trainer *t) {
    return pt_model_config_num_params(&t->cfg.model);
}
pt_status pt_trainer_gather_params(pt_trainer *t, float *out) {
    if (!t->mp) {
        if (t->zero) return pt_zero_gather_params(t->zero, out);
        memcpy(out, pt_model_params(t->model), pt_model_num_params(t->model) * sizeof(float));
        return PT_OK;
    }
    /* this rank's slices (ZeRO: from the dp group's shards), then every
     * model-parallel member's to its rank 0 */
    size_t n = pt_model_num_params(t->model);
    float *local =
        t->zero ? pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float)) : pt_model_params(t->model);
    pt_status st = local ? PT_OK : pt_error_set(PT_ERR_NOMEM, "gather: parameters");
    if (t->aux) st = pt_comm_agree(t->aux, st);
    if (st == PT_OK && t->zero) st = pt_zero_gather_params(t->zero, local);
    if (st == PT_OK) st = pt_mp_gather_full(t, local, out);
    if (t->zero) pt_mem_free(local);
    return st;
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
