/* The trainer, one worker or one data-parallel rank: builds model, optimizer
 * and data from a config, takes optimizer steps (micro-batches accumulate
 * into one gradient), validates, writes the progress line and JSON-lines
 * metrics, and saves and resumes checkpoints so that a resumed run is
 * bitwise the same run.
 *
 * Data parallel: every rank draws the same global batch and computes its
 * contiguous share with loss weight 1/(global tokens); the model's hooks
 * (after each module's backward) launch the gradient buckets of pt_ddp
 * (parallel.h), and the step waits for them before clipping and AdamW
 * (sync), or for the round of k steps ago (stale: applied as is, or as the
 * correction of delayed gradient averaging, dga_step); local_sgd averages
 * parameters every sync_every steps instead. A second communicator split
 * from the world (aux) carries the per-step statistics to rank 0, the
 * validation sums and the trace merge, so that the world's byte counters
 * hold gradient and parameter traffic only.
 *
 * What makes resume bitwise: everything a step depends on is either in the
 * checkpoint (parameters, the optimizer's state (AdamW moments and update
 * count, or SGD's momentum buffer), step count, the
 * data RNG's key and counter; under stale and local_sgd also each rank's
 * own parameters and moments, the stale rounds in flight and dga's local
 * gradients, the outer Nesterov state: rank<r>.safetensors) or a pure
 * function of the step (learning rate, which slot a step uses). Validation
 * reads fixed windows and touches no state.
 *
 * Not here: checkpoints (trainer_ckpt.c), the bucket and averaging
 * machinery (parallel/), tensor and pipeline parallelism. */
#include "trainer_impl.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/kernels.h"
#include "partrain/parallel.h"

/* Prefix the last error message (copied first: it is the buffer being set). */
static pt_status prefix_error(pt_status st, const char *prefix) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "%s: %s", prefix, msg);
}

static pt_status open_data(pt_data **out, const char *key, const char *path, int V, int T) {
    pt_status st = pt_data_open(out, path, V);
    if (st != PT_OK) return prefix_error(st, key);
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
    pt_mem_free(t->targets);
    pt_mem_free(t->inputs);
    pt_data_free(t->val);
    pt_data_free(t->train);
    pt_adamw_free(t->opt);
    pt_model_free(t->model);
    free(t);
}

/* ---- hooks: trace events per module, bucket launches ---- */

static void hook_before(void *arg, int i) {
    (void)i;
    pt_trainer *t = arg;
    if (t->trace) t->hook_t0 = pt_time_ns();
}
/* ZeRO-3 gathers a module's parameters before it runs (not timed as the
 * module's compute), releases them after */
static void hook_before_forward(void *arg, int i) {
    pt_trainer *t = arg;
    if (t->zero) pt_zero_before_forward(t->zero, i);
    hook_before(arg, i);
}
static void hook_before_backward(void *arg, int i) {
    pt_trainer *t = arg;
    if (t->zero) pt_zero_before_backward(t->zero, i);
    hook_before(arg, i);
}
static void hook_after_forward(void *arg, int i) {
    pt_trainer *t = arg;
    if (t->zero) pt_zero_after_forward(t->zero, i);
    if (!t->trace) return;
    char name[24];
    snprintf(name, sizeof name, "fwd %s", t->mod_name[i]);
    pt_trace_add(t->trace, name, "forward", PT_TRACE_MAIN, t->hook_t0, pt_time_ns(), t->step + 1);
}
static void hook_after_backward(void *arg, int i) {
    pt_trainer *t = arg;
    if (t->trace) {
        char name[24];
        snprintf(name, sizeof name, "bwd %s", t->mod_name[i]);
        pt_trace_add(t->trace, name, "backward", PT_TRACE_MAIN, t->hook_t0, pt_time_ns(),
                     t->step + 1);
    }
    if (t->ddp) pt_ddp_module_done(t->ddp, i);
    if (t->zero) pt_zero_module_done(t->zero, i);
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
                 {"skip_module", PT_PLANT_SKIP_MODULE}};
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
                        "PT_TEST_PLANT=%s: unknown (double_bucket, no_avg or skip_module)", e);
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
    if (cfg->parallel.dp != nranks)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.dp = %d but there %s %d rank%s (run with --nproc %d, or "
                            "mpirun -np %d ... --backend mpi)",
                            cfg->parallel.dp, nranks == 1 ? "is" : "are", nranks,
                            nranks == 1 ? "" : "s", cfg->parallel.dp, cfg->parallel.dp);
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
    const pt_model_config *mc = &cfg->model;
    t->local_B = cfg->train.batch_size / nranks;
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

    PT_CHECK_GOTO(st, pt_model_new(&t->model, mc, t->micro_B), fail);
    pt_model_init(t->model, (uint64_t)cfg->train.seed);

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
    int sharded = t->world && cfg->parallel.zero > 0;
    st = sharded ? PT_OK : pt_adamw_new(&t->opt, pt_model_num_params(t->model), segs, ntens, &hp);
    free(segs);
    if (st != PT_OK) goto fail;
    if (sharded) {
        pt_zero_options zo = {cfg->parallel.zero, cfg->parallel.zero_group, cfg->parallel.overlap,
                              cfg->parallel.zero_keep_params};
        PT_CHECK_GOTO(st, pt_zero_new(&t->zero, t->model, t->world, &zo, &hp), fail);
    }

    size_t ntok = (size_t)cfg->train.batch_size * (size_t)mc->seq_len;
    t->inputs = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    t->targets = pt_mem_alloc(PT_MEM_ACTS, ntok * sizeof(int));
    if (!t->inputs || !t->targets) {
        st = PT_ERR_NOMEM;
        goto fail;
    }
    pt_rng_init(&t->data_rng, (uint64_t)cfg->train.seed, "data.train");

    int nmod = pt_model_num_modules(t->model);
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
        if (t->zero && cfg->parallel.zero >= 2) {
            /* stage 2: pt_zero reduce-scatters; no all-reduce buckets */
        } else if (t->mode != MODE_LOCAL) {
            pt_ddp_options o = {(size_t)(cfg->parallel.bucket_mb * 1048576.0),
                                t->mode == MODE_STALE ? cfg->parallel.staleness + 1 : 1,
                                t->mode == MODE_SYNC, t->plant};
            PT_CHECK_GOTO(st, pt_ddp_new(&t->ddp, t->model, t->world, &o), fail);
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
            ck = prefix_error(ck, "checkpoint.dir");
        PT_CHECK_GOTO(st, pt_ckpt_agree(t->aux, ck), fail);
    }
    if (cfg->log.trace[0]) {
        size_t per_step = (size_t)(2 * nmod * cfg->parallel.microbatches + 8) +
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
    pt_model_hooks hooks = {hook_before_forward, hook_after_forward, hook_before_backward,
                            hook_after_backward, t};
    pt_model_set_hooks(t->model, &hooks);
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
pt_status pt_trainer_gather_params(pt_trainer *t, float *out) {
    if (t->zero) return pt_zero_gather_params(t->zero, out);
    memcpy(out, pt_model_params(t->model), pt_model_num_params(t->model) * sizeof(float));
    return PT_OK;
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

static uint64_t world_bytes(const pt_trainer *t) {
    if (!t->world) return 0;
    pt_comm_stats s;
    pt_comm_get_stats(t->world, &s);
    uint64_t b = 0;
    for (int k = 0; k < PT_OP_COUNT; k++) b += s.bytes_sent[k];
    return b;
}

/* Clip and step on grads (the whole flat buffer); returns the norm. */
static float apply_update(pt_trainer *t, const float *grads, float lr) {
    uint64_t a = pt_time_ns();
    size_t n = pt_model_num_params(t->model);
    double sumsq;
    if (t->cfg.train.grad_clip <= 0) { /* norm only reported: one pass, not two */
        sumsq = pt_adamw_step_sumsq(t->opt, pt_model_params(t->model), grads, lr);
    } else {
        sumsq = pt_optim_grad_sumsq(grads, n);
        float scale = pt_optim_clip_scale(sumsq, (float)t->cfg.train.grad_clip);
        pt_adamw_step(t->opt, pt_model_params(t->model), grads, lr, scale);
    }
    pt_trace_add(t->trace, "optimizer", "optim", PT_TRACE_MAIN, a, pt_time_ns(), t->step + 1);
    return (float)sqrt(sumsq);
}

/* Delayed gradient averaging (Zhu, Lin, Lu, Han, NeurIPS 2021) for stale
 * with staleness k. The model's gradient buffer holds this rank's share g(t)
 * (weighted by 1/global tokens, so N x g(t) is this rank's own mean
 * gradient), already copied into slot `slot` and launched. The update is
 *     g_eff(t) = N g(t) - N g(t-k) + S(t-k)
 * with S(t-k) the all-reduced sum of step t-k (launched during its backward,
 * waited for only now): the fresh local gradient, corrected once the average
 * of the same step arrives. Over steps the local terms telescope, so a
 * rank's parameters are those of the averaged run plus at most its last k
 * local terms; the first k steps (of the run, or after a resume that
 * restarted the pipeline) apply the local gradient alone. Clipping
 * uses the global norm of g_eff, like the other modes. */
static pt_status dga_step(pt_trainer *t, int slot, int k, float *norm, float lr) {
    size_t n = pt_model_num_params(t->model);
    float N = (float)t->nranks;
    float *g = pt_model_grads(t->model);
    float *mine = t->dga_local + (size_t)slot * n;
    memcpy(mine, g, n * sizeof(float));
    if (t->step - t->pipe_start >= k) {
        int s = (t->step - k) % (k + 1);
        PT_CHECK(pt_ddp_wait(t->ddp, s));
        const float *old = t->dga_local + (size_t)s * n, *sum = pt_ddp_slot_grads(t->ddp, s);
        for (size_t i = 0; i < n; i++) g[i] = N * (g[i] - old[i]) + sum[i];
    } else {
        for (size_t i = 0; i < n; i++) g[i] *= N;
    }
    *norm = apply_update(t, g, lr);
    return PT_OK;
}

pt_status pt_trainer_step_batch(pt_trainer *t, const int *inputs, const int *targets,
                                pt_step_info *info) {
    const pt_config *c = &t->cfg;
    int T = c->model.seq_len, M = c->parallel.microbatches, mB = t->micro_B;
    uint64_t t0 = pt_time_ns();
    uint64_t bytes0 = world_bytes(t);
    uint64_t zero_bytes = 0, zero_ns = 0;
    if (t->zero) pt_zero_note_step(t->zero, t->step + 1);
    uint64_t local_comm_ns = 0, local_wait_ns = 0, local_a = 0, local_z = 0;
    pt_mem_reset_peak();
    pt_model_zero_grads(t->model);
    /* sync / stale: every rank weighs its positions by 1/(global tokens), so
     * that the SUM over ranks is the single-worker gradient; local_sgd:
     * each rank's own mean. */
    float dloss = t->mode == MODE_LOCAL || t->plant == PT_PLANT_NO_AVG
                      ? 1.0f / ((float)t->local_B * (float)T)
                      : 1.0f / ((float)c->train.batch_size * (float)T);
    size_t base = (size_t)t->rank * (size_t)t->local_B * (size_t)T;
    int slot = t->mode == MODE_STALE ? t->step % (c->parallel.staleness + 1) : 0;
    double loss_sum = 0;
    for (int mb = 0; mb < M; mb++) {
        size_t off = base + (size_t)mb * (size_t)mB * (size_t)T;
        pt_batch b = {inputs + off, targets + off, dloss, mB, T};
        float loss = 0;
        /* only the last micro-batch's backward completes gradients */
        if (t->ddp && mb == M - 1) pt_ddp_begin(t->ddp, slot, c->parallel.overlap, t->step + 1);
        pt_model_forward(t->model, &b, &loss);
        pt_model_backward(t->model);
        loss_sum += loss;
    }
    float loss = (float)(loss_sum / M);
    float lr = pt_lr_schedule(t->step, c->train.steps, c->train.warmup_steps, (float)c->train.lr,
                              (float)c->train.min_lr);
    float norm = 0;
    int applied = 1;
    pt_status st = PT_OK;
    if (!t->world) {
        norm = apply_update(t, pt_model_grads(t->model), lr);
    } else if (t->zero) {
        if (t->ddp) PT_CHECK(pt_ddp_wait(t->ddp, 0));
        uint64_t a = pt_time_ns();
        PT_CHECK(pt_zero_step(t->zero, lr, (float)c->train.grad_clip, &norm));
        zero_ns = pt_time_ns() - a;
        zero_bytes = pt_zero_take_bytes(t->zero);
        pt_trace_add(t->trace, "zero step", "optim", PT_TRACE_MAIN, a, a + zero_ns, t->step + 1);
        zero_ns += pt_zero_take_wait_ns(t->zero); /* + the hooks' waits (stages 2, 3) */
    } else if (t->mode == MODE_SYNC) {
        PT_CHECK(pt_ddp_wait(t->ddp, 0));
        norm = apply_update(t, pt_model_grads(t->model), lr);
    } else if (t->mode == MODE_STALE) {
        PT_CHECK(pt_ddp_launch_all(t->ddp));
        int k = c->parallel.staleness;
        if (t->dga) {
            PT_CHECK(dga_step(t, slot, k, &norm, lr));
        } else if (t->step - t->pipe_start >= k) {
            int s = (t->step - k) % (k + 1);
            PT_CHECK(pt_ddp_wait(t->ddp, s));
            norm = apply_update(t, pt_ddp_slot_grads(t->ddp, s), lr);
        } else {
            applied = 0;
        }
    } else {
        norm = apply_update(t, pt_model_grads(t->model), lr);
        if ((t->step + 1) % c->parallel.sync_every == 0 || t->step + 1 == c->train.steps) {
            uint64_t a = pt_time_ns();
            st = pt_local_sgd_sync(t->lsgd, t->world, pt_model_params(t->model));
            uint64_t z = pt_time_ns();
            if (st != PT_OK) return prefix_error(st, "local_sgd parameter averaging");
            local_comm_ns = local_wait_ns = z - a;
            local_a = a;
            local_z = z;
            pt_trace_add(t->trace, "average params", "comm", PT_TRACE_COMM, a, z, t->step + 1);
            pt_trace_add(t->trace, "wait params", "wait", PT_TRACE_MAIN, a, z, t->step + 1);
        }
    }
    t->step++;
    pt_comm_note_step(t->world, t->step);
    double ms = (double)(pt_time_ns() - t0) / 1e6;
    for (int k = 0; k < PT_MEM_NCAT; k++) t->mem_peak[k] = pt_mem_peak((pt_mem_cat)k);
    t->mem_peak_total = pt_mem_peak_total();
    for (int k = 0; k < PT_MEM_NCAT; k++) t->mem_cur[k] = pt_mem_current((pt_mem_cat)k);
    t->mem_cur_total = pt_mem_current_total();
    pt_ddp_stats ds = {0};
    if (t->ddp) pt_ddp_take_stats(t->ddp, &ds);
    ds.comm_ns += local_comm_ns;
    ds.exposed_ns += local_wait_ns;
    ds.comm_ns += zero_ns; /* zero: the blocking step (collectives and the shard's AdamW) */
    ds.exposed_ns += zero_ns;
    if (local_wait_ns) { /* the blocking averaging: launched when its wait starts */
        ds.wait_start_ns = ds.launch_ns = local_a;
        ds.wait_end_ns = ds.end_ns = local_z;
    }
    /* rank 0 splits its wait at the last rank's launch and the first rank's
     * completion of the last bucket (one host: one monotonic clock) */
    double last_launch = (double)ds.launch_ns, first_end = (double)ds.end_ns;
    if (t->aux) {
        /* rank 0 learns the global loss and every rank's peak memory (max
         * per category); on the aux communicator, so that comm_bytes counts
         * gradient traffic only */
        double rs[5 + 2 * PT_MEM_NCAT];
        rs[0] = loss;
        rs[1] = (double)t->mem_peak_total;
        for (int k = 0; k < PT_MEM_NCAT; k++) rs[2 + k] = (double)t->mem_peak[k];
        rs[2 + PT_MEM_NCAT] = (double)ds.launch_ns; /* exact: < 2^53 ns */
        rs[3 + PT_MEM_NCAT] = (double)ds.end_ns;
        rs[4 + PT_MEM_NCAT] = (double)t->mem_cur_total;
        for (int k = 0; k < PT_MEM_NCAT; k++) rs[5 + PT_MEM_NCAT + k] = (double)t->mem_cur[k];
        if (t->rank != 0) {
            st = pt_comm_send(t->aux, rs, sizeof rs, 0, 7);
            if (st != PT_OK) return prefix_error(st, "step statistics");
        } else {
            double sum = loss;
            for (int r = 1; r < t->nranks; r++) {
                double o[5 + 2 * PT_MEM_NCAT];
                st = pt_comm_recv(t->aux, o, sizeof o, r, 7);
                if (st != PT_OK) return prefix_error(st, "step statistics");
                sum += o[0];
                if ((size_t)o[1] > t->mem_peak_total) t->mem_peak_total = (size_t)o[1];
                for (int k = 0; k < PT_MEM_NCAT; k++)
                    if ((size_t)o[2 + k] > t->mem_peak[k]) t->mem_peak[k] = (size_t)o[2 + k];
                if (o[2 + PT_MEM_NCAT] > last_launch) last_launch = o[2 + PT_MEM_NCAT];
                if ((size_t)o[4 + PT_MEM_NCAT] > t->mem_cur_total)
                    t->mem_cur_total = (size_t)o[4 + PT_MEM_NCAT];
                for (int k = 0; k < PT_MEM_NCAT; k++)
                    if ((size_t)o[5 + PT_MEM_NCAT + k] > t->mem_cur[k])
                        t->mem_cur[k] = (size_t)o[5 + PT_MEM_NCAT + k];
                if (o[3 + PT_MEM_NCAT] > 0 && o[3 + PT_MEM_NCAT] < first_end)
                    first_end = o[3 + PT_MEM_NCAT];
            }
            loss = (float)(sum / t->nranks);
        }
    }
    if (info) {
        memset(info, 0, sizeof *info);
        info->step = t->step;
        info->loss = loss;
        info->lr = lr;
        info->grad_norm = norm;
        info->step_ms = ms;
        info->tokens_per_s = (double)c->train.batch_size * T / (ms > 0 ? ms / 1e3 : 1e-9);
        info->exposed_comm_ms = (double)ds.exposed_ns / 1e6;
        info->comm_ms = (double)ds.comm_ns / 1e6;
        info->compute_ms = ms - info->exposed_comm_ms;
        if (t->rank == 0 && ds.wait_end_ns > ds.wait_start_ns) {
            double w0 = (double)ds.wait_start_ns, w1 = (double)ds.wait_end_ns;
            double a = last_launch < w0 ? w0 : last_launch > w1 ? w1 : last_launch;
            double z = first_end < a ? a : first_end > w1 ? w1 : first_end;
            info->skew_ms = (a - w0) / 1e6;
            info->local_lag_ms = (w1 - z) / 1e6;
            info->exposed_transfer_ms = (z - a) / 1e6;
        }
        /* gradient modes: the rounds waited for this step (deterministic);
         * local_sgd: the blocking averaging */
        info->comm_bytes = (t->ddp ? ds.bytes : world_bytes(t) - bytes0) + zero_bytes;
        info->applied = applied;
    }
    if (!isfinite(loss))
        return pt_error_set(PT_ERR_INTERNAL, "training diverged at step %d (loss %g)", t->step,
                            (double)loss);
    return PT_OK;
}

pt_status pt_trainer_step(pt_trainer *t, pt_step_info *info) {
    if (!t->train) return pt_error_set(PT_ERR_INVALID, "data.train is not set");
    pt_data_sample(t->train, &t->data_rng, t->cfg.train.batch_size, t->cfg.model.seq_len, t->inputs,
                   t->targets);
    return pt_trainer_step_batch(t, t->inputs, t->targets, info);
}

/* Validation gives the same bits under every layout (for the same
 * parameters), so that a layout's val_loss is comparable with one worker's
 * exactly:
 *   - one window per forward: a window's loss (its mean over T positions)
 *     is then the same float whatever the layout; a batched forward's mean
 *     depends on which windows share the batch;
 *   - each rank sums its contiguous share in window order in DOUBLE, and
 *     the ranks' sums travel as doubles, bit for bit (an all-gather of
 *     their bytes; a float all-reduce rounded them to 24 bits, differently
 *     per layout), added in rank order: the single worker's sequential
 *     double sum up to double rounding, ~1e-16 relative, far below the one
 *     float rounding of the result.
 * ZeRO-3's forward hooks are collectives: every rank runs as many passes as
 * the rank with the most windows (extra ones on window 0, not counted). */
pt_status pt_trainer_validate(pt_trainer *t, float *val_loss) {
    if (!t->val) return pt_error_set(PT_ERR_INVALID, "data.val is not set");
    int T = t->cfg.model.seq_len;
    size_t nwin = pt_data_num_windows(t->val, T);
    /* the same windows in every layout: val_batches x batch_size
     * sequences (global batches; micro-batches do not change it), each rank
     * its contiguous share */
    size_t want = (size_t)t->cfg.train.val_batches * (size_t)t->cfg.train.batch_size;
    if (nwin > want) nwin = want;
    size_t first = 0, mine = nwin;
    pt_comm_shard(nwin, t->nranks, t->rank, &first, &mine);
    double sum = 0;
    size_t most = (nwin + (size_t)t->nranks - 1) / (size_t)t->nranks;
    size_t upto = t->zero ? most : mine;
    for (size_t w = 0; w < upto; w++) {
        pt_data_window(t->val, w < mine ? first + w : 0, T, t->inputs, t->targets);
        pt_batch batch = {t->inputs, t->targets, 0.0f, 1, T};
        float loss = 0;
        pt_model_forward(t->model, &batch, &loss);
        if (w < mine) sum += (double)loss;
    }
    if (t->zero) pt_zero_release_params(t->zero);
    if (t->aux) {
        /* two floats' room per rank for its double's bytes (pt_comm_shard of
         * 2 x ranks floats: rank r's are [2r, 2r + 2)) */
        _Static_assert(sizeof(double) == 2 * sizeof(float), "a double in two floats");
        float *all = calloc(2 * (size_t)t->nranks, sizeof(float));
        if (!all) return pt_error_set(PT_ERR_NOMEM, "validation sums");
        memcpy(all + 2 * (size_t)t->rank, &sum, sizeof sum);
        pt_status st = pt_comm_allgather(t->aux, all, 2 * (size_t)t->nranks);
        sum = 0;
        for (int r = 0; st == PT_OK && r < t->nranks; r++) {
            double part;
            memcpy(&part, all + 2 * (size_t)r, sizeof part);
            sum += part;
        }
        free(all);
        PT_CHECK(st);
    }
    *val_loss = (float)(sum / (double)nwin);
    return PT_OK;
}

/* ---- the loop ---- */

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* Metrics lines go through here, so that the first failed write (a full
 * disk, a file over its size limit) is remembered with its errno: buffered
 * stdio reports it only at some later write or flush. */
static void metrics_printf(pt_trainer *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void metrics_printf(pt_trainer *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (vfprintf(t->metrics, fmt, ap) < 0 && !t->metrics_errno)
        t->metrics_errno = errno ? errno : EIO;
    va_end(ap);
}

/* Flush the line written: a failure is an error naming the file, so that
 * a run whose metrics were lost does not exit 0 (rank 0 stops; the other
 * ranks are stopped as for any failed rank). */
static pt_status metrics_flush(pt_trainer *t) {
    errno = 0;
    if (fflush(t->metrics) != 0 && !t->metrics_errno) t->metrics_errno = errno ? errno : EIO;
    if (ferror(t->metrics) && !t->metrics_errno) t->metrics_errno = EIO;
    if (!t->metrics_errno) return PT_OK;
    return pt_error_set(PT_ERR_IO, "log.metrics: %s: write failed at step %d: %s",
                        t->cfg.log.metrics, t->step, strerror(t->metrics_errno));
}

static pt_status write_metrics(pt_trainer *t, const pt_step_info *info) {
    if (!t->metrics) return PT_OK;
    metrics_printf(
        t,
        "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"step_ms\":%.4f,"
        "\"tokens_per_s\":%.1f,\"compute_ms\":%.4f,\"comm_ms\":%.4f,\"exposed_comm_ms\":%.4f,"
        "\"skew_ms\":%.4f,\"local_lag_ms\":%.4f,\"exposed_transfer_ms\":%.4f,\"comm_bytes\":%"
        "llu,\"sync\":\"%s\",\"world\":%d,\"layout\":\"%s\","
        "\"mem\":{",
        info->step, (double)info->loss, (double)info->lr, (double)info->grad_norm, info->step_ms,
        info->tokens_per_s, info->compute_ms, info->comm_ms, info->exposed_comm_ms, info->skew_ms,
        info->local_lag_ms, info->exposed_transfer_ms, (unsigned long long)info->comm_bytes,
        t->cfg.parallel.sync, t->nranks, t->layout);
    static const pt_mem_cat cats[] = {PT_MEM_PARAMS, PT_MEM_GRADS, PT_MEM_OPTIM, PT_MEM_ACTS,
                                      PT_MEM_COMM};
    for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
        metrics_printf(t, "\"%s\":%zu,", pt_mem_cat_name(cats[i]), t->mem_peak[cats[i]]);
    /* mem_current: bytes held at the end of the step (what stays between steps) */
    metrics_printf(t, "\"total\":%zu},\"mem_current\":{", t->mem_peak_total);
    for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
        metrics_printf(t, "\"%s\":%zu,", pt_mem_cat_name(cats[i]), t->mem_cur[cats[i]]);
    metrics_printf(t, "\"total\":%zu}}\n", t->mem_cur_total);
    return metrics_flush(t);
}

static pt_status run_validation(pt_trainer *t, double t_start) {
    float vl = 0;
    PT_CHECK(pt_trainer_validate(t, &vl));
    if (t->rank != 0) return PT_OK;
    fprintf(stderr, "step %d: val loss %.4f\n", t->step, (double)vl);
    if (!t->metrics) return PT_OK;
    metrics_printf(
        t, "{\"step\":%d,\"val_loss\":%.9g,\"elapsed_s\":%.3f,\"world\":%d,\"layout\":\"%s\"}\n",
        t->step, (double)vl, pt_time_s() - t_start, t->nranks, t->layout);
    return metrics_flush(t);
}

/* "log.trace: PATH: write failed: reason" (err: an errno, 0: EIO). */
static pt_status trace_write_error(const char *path, int err) {
    return pt_error_set(PT_ERR_IO, "log.trace: %s: write failed: %s", path,
                        strerror(err ? err : EIO));
}

/* Copy the part file `part` to out; errors name the file that failed. */
static pt_status append_part(FILE *out, const char *tmp, const char *part) {
    FILE *in = NULL;
    pt_status st = pt_file_open_regular(part, &in, NULL);
    if (st != PT_OK) return prefix_error(st, "log.trace");
    char buf[65536];
    size_t n;
    errno = 0;
    while (st == PT_OK && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) st = trace_write_error(tmp, errno);
    if (st == PT_OK && ferror(in)) st = pt_error_set(PT_ERR_IO, "log.trace: %s: read error", part);
    fclose(in);
    return st;
}

/* Every rank writes its events to PATH.rank<r>; rank 0 merges them into
 * PATH (temporary + rename) and removes the parts. Every write is checked:
 * a trace cut short by a full disk is an error naming the file, not a
 * silently truncated JSON. */
static pt_status write_trace(pt_trainer *t) {
    const char *path = t->cfg.log.trace;
    char part[PT_CONFIG_STR_MAX + 32], tmp[PT_CONFIG_STR_MAX + 32];
    snprintf(part, sizeof part, "%s.rank%d", path, t->rank);
    pt_status st = PT_OK;
    FILE *f = fopen(part, "w");
    if (!f) {
        st = pt_error_set(PT_ERR_IO, "log.trace: %s: %s", part, strerror(errno));
    } else {
        errno = 0;
        st = pt_trace_write_events(t->trace, f, t->rank, t->trace_t0);
        int err = errno;
        if (st != PT_OK) st = trace_write_error(part, err);
        if (fclose(f) != 0 && st == PT_OK) st = trace_write_error(part, errno);
        if (st != PT_OK) remove(part);
    }
    if (pt_trace_dropped(t->trace))
        PT_WARN("log.trace: %zu events dropped (buffer full)", pt_trace_dropped(t->trace));
    if (t->aux) {
        float bad[1] = {st == PT_OK ? 0.0f : 1.0f};
        pt_status e = pt_comm_allreduce(t->aux, bad, 1, PT_REDUCE_SUM);
        if (e != PT_OK) return e;
        if (st == PT_OK && bad[0] != 0.0f)
            st = pt_error_set(PT_ERR_IO, "log.trace: a rank could not write its part");
    }
    if (st != PT_OK || t->rank != 0) return st;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) return pt_error_set(PT_ERR_IO, "log.trace: %s: %s", tmp, strerror(errno));
    errno = 0;
    if (fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", out) < 0)
        st = trace_write_error(tmp, errno);
    for (int r = 0; r < t->nranks && st == PT_OK; r++) {
        snprintf(part, sizeof part, "%s.rank%d", path, r);
        if (r > 0 && fputs(",\n", out) < 0) st = trace_write_error(tmp, errno);
        if (st == PT_OK) st = append_part(out, tmp, part);
    }
    if (st == PT_OK && fputs("\n]}\n", out) < 0) st = trace_write_error(tmp, errno);
    if (st == PT_OK && (fflush(out) != 0 || ferror(out))) st = trace_write_error(tmp, errno);
    if (fclose(out) != 0 && st == PT_OK) st = trace_write_error(tmp, errno);
    for (int r = 0; r < t->nranks; r++) { /* the parts go, merged or not */
        snprintf(part, sizeof part, "%s.rank%d", path, r);
        remove(part);
    }
    if (st == PT_OK && rename(tmp, path) != 0)
        st = pt_error_set(PT_ERR_IO, "log.trace: %s: %s", path, strerror(errno));
    if (st != PT_OK) {
        remove(tmp);
        return st;
    }
    PT_INFO("wrote trace %s (%d ranks)", path, t->nranks);
    return st;
}

static void format_eta(char *buf, size_t n, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int sec = (int)(s + 0.5);
    if (sec >= 3600)
        snprintf(buf, n, "%dh%02dm", sec / 3600, sec / 60 % 60);
    else
        snprintf(buf, n, "%dm%02ds", sec / 60, sec % 60);
}

pt_status pt_trainer_run(pt_trainer *t) {
    const pt_config *c = &t->cfg;
    if (!t->train) return pt_error_set(PT_ERR_INVALID, "data.train is not set");
    pt_status st = PT_OK;
    if (c->log.metrics[0] && !t->metrics && t->rank == 0) {
        char parent[PT_CONFIG_STR_MAX];
        snprintf(parent, sizeof parent, "%s", c->log.metrics);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) {
            *slash = '\0';
            if (pt_mkdir_p(parent) != PT_OK) return prefix_error(PT_ERR_IO, "log.metrics");
        }
        t->metrics = fopen(c->log.metrics, t->step > 0 ? "a" : "w");
        t->metrics_errno = 0;
        if (!t->metrics)
            return pt_error_set(PT_ERR_IO, "log.metrics: %s: %s", c->log.metrics, strerror(errno));
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old);

    if (t->rank == 0)
        PT_INFO("world %d (%s), sync %s, %d threads per rank, per-rank batch %d (%d x %d)",
                t->nranks, t->world ? pt_comm_backend_name(t->world) : "single", c->parallel.sync,
                c->train.threads, t->local_B, c->parallel.microbatches, t->micro_B);
    if (t->ddp && t->rank == 0) {
        size_t o, n;
        pt_ddp_bucket(t->ddp, 0, &o, &n, NULL);
        PT_INFO("gradient buckets: %d (largest %.2f MiB), overlap %s", pt_ddp_num_buckets(t->ddp),
                (double)n * 4 / 1048576.0, c->parallel.overlap ? "on" : "off");
    }
    PT_INFO("model: %zu parameters, %d layers, n_embd %d, %d heads, seq_len %d, vocab %d",
            pt_model_num_params(t->model), c->model.n_layer, c->model.n_embd, c->model.n_head,
            c->model.seq_len, c->model.vocab_size);
    int last_val = -1, last_save = -1, start = t->step;
    double t_start = pt_time_s();
    if (t->val) {
        PT_CHECK_GOTO(st, run_validation(t, t_start), done);
        last_val = t->step;
    }
    while (t->step < c->train.steps && !interrupted) {
        pt_step_info info;
        PT_CHECK_GOTO(st, pt_trainer_step(t, &info), done);
        PT_CHECK_GOTO(st, write_metrics(t, &info), done);
        if (t->rank == 0 &&
            (t->step % c->log.every == 0 || t->step == c->train.steps || t->step == start + 1)) {
            double elapsed = pt_time_s() - t_start;
            char eta[32];
            format_eta(eta, sizeof eta, elapsed / (t->step - start) * (c->train.steps - t->step));
            fprintf(stderr, "step %5d/%d  loss %.4f  lr %.2e  %.0f tok/s  %.1f ms  ETA %s\n",
                    t->step, c->train.steps, (double)info.loss, (double)info.lr, info.tokens_per_s,
                    info.step_ms, eta);
        }
        if (t->val && c->train.val_every > 0 && t->step % c->train.val_every == 0) {
            PT_CHECK_GOTO(st, run_validation(t, t_start), done);
            last_val = t->step;
        }
        if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && t->step % c->checkpoint.every == 0) {
            PT_CHECK_GOTO(st, pt_trainer_save(t), done);
            last_save = t->step;
        }
    }
    if (t->val && last_val != t->step) PT_CHECK_GOTO(st, run_validation(t, t_start), done);
    if (c->checkpoint.dir[0] && last_save != t->step) {
        PT_CHECK_GOTO(st, pt_trainer_save(t), done);
        if (t->rank == 0)
            fprintf(stderr, "saved checkpoint %s/step_%08d\n", c->checkpoint.dir, t->step);
    }
    if (t->trace) PT_CHECK_GOTO(st, write_trace(t), done);
    if (interrupted) st = pt_error_set(PT_ERR_INTERRUPTED, "interrupted at step %d", t->step);
done:
    sigaction(SIGINT, &old, NULL);
    if (t->metrics) { /* closed here, where a failed last write can still be reported */
        int bad = fclose(t->metrics) != 0, err = errno;
        t->metrics = NULL;
        if (bad && st == PT_OK)
            st = pt_error_set(PT_ERR_IO, "log.metrics: %s: write failed: %s", c->log.metrics,
                              strerror(err));
    }
    return st;
}
