/* The trainer's optimizer step: a driver over the schedule's passes
 * (parallel.h, pt_schedule), whose micro-batches accumulate into one
 * gradient, then the update of the mode: one worker; data parallel sync (the model's
 * hooks launch the gradient buckets of pt_ddp, parallel.h, after each
 * module's backward, and the step waits for them before clipping and AdamW);
 * stale (the round of k steps ago, applied as is, or as the correction of
 * delayed gradient averaging, dga_step); local_sgd (parameters averaged
 * every sync_every steps); ZeRO (pt_zero_step on the rank's shard). Then the
 * step's statistics: memory peaks and the loss gathered on rank 0 over aux,
 * and the split of the exposed wait into skew, local lag and transfer.
 *
 * Every rank draws the same global batch and computes its contiguous share
 * with loss weight 1/(global tokens), so that the SUM over ranks is the
 * single-worker gradient.
 *
 * Not here: construction and hooks (trainer_new.c), the loop
 * (trainer_run.c), checkpoints (trainer_ckpt.c). */
#include "trainer_impl.h"

#include <math.h>
#include <string.h>

#include "partrain/parallel.h"

/* Bytes this rank has sent on c since its creation (NULL: 0). */
static uint64_t sent_bytes(const pt_comm *c) {
    if (!c) return 0;
    pt_comm_stats s;
    pt_comm_get_stats(c, &s);
    uint64_t b = 0;
    for (int k = 0; k < PT_OP_COUNT; k++) b += s.bytes_sent[k];
    return b;
}

/* Bytes this rank has sent to its neighbour stages (the pipeline's own
 * communicators are splits of pp; pp itself carries the norm's sum). */
static uint64_t sent_bytes_pp(const pt_trainer *t) {
    return t->pipe ? pt_pipe_sent_bytes(t->pipe) : 0;
}

/* Bytes this rank has sent on the dp group (gradient and parameter traffic). */
static uint64_t dp_bytes(const pt_trainer *t) {
    return sent_bytes(t->dp);
}

/* Clip and step on grads (the whole flat buffer); *norm gets the global
 * norm before clipping. */
static pt_status apply_update(pt_trainer *t, const float *grads, float lr, float *norm) {
    uint64_t a = pt_time_ns();
    size_t n = pt_model_num_params(t->model);
    double sumsq;
    if (t->tp || t->pp) { /* the norm over the tp group and the stages, each parameter once */
        double parts[2];
        pt_grad_sumsq_parts(t->model, grads, 0, n, parts);
        if (t->plant == PT_PLANT_TP_NORM) { /* the test hook: whole tensors once per rank */
            parts[0] += parts[1];
            parts[1] = 0;
        }
        pt_status st = pt_grad_sumsq_global(
            NULL, t->tp, t->plant == PT_PLANT_PP_NORM ? NULL : t->pp, parts, &sumsq);
        if (st != PT_OK) return pt_trainer_prefix_error(st, "gradient norm");
        float scale = pt_optim_clip_scale(sumsq, (float)t->cfg.train.grad_clip);
        pt_adamw_step(t->opt, pt_model_params(t->model), grads, lr, scale);
    } else if (t->cfg.train.grad_clip <= 0) { /* norm only reported: one pass, not two */
        sumsq = pt_adamw_step_sumsq(t->opt, pt_model_params(t->model), grads, lr);
    } else {
        sumsq = pt_optim_grad_sumsq(grads, n);
        float scale = pt_optim_clip_scale(sumsq, (float)t->cfg.train.grad_clip);
        pt_adamw_step(t->opt, pt_model_params(t->model), grads, lr, scale);
    }
    pt_trace_add(t->trace, "optimizer", "optim", PT_TRACE_MAIN, a, pt_time_ns(), t->step + 1);
    *norm = (float)sqrt(sumsq);
    return PT_OK;
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
    float N = (float)t->dp_size;
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
    return apply_update(t, g, lr, norm);
}

pt_status pt_trainer_step_batch(pt_trainer *t, const int *inputs, const int *targets,
                                pt_step_info *info) {
    const pt_config *c = &t->cfg;
    int T = c->model.seq_len, M = c->parallel.microbatches, mB = t->micro_B;
    uint64_t t0 = pt_time_ns();
    uint64_t bytes0 = dp_bytes(t);
    uint64_t tp_bytes0 = sent_bytes(t->tp); /* the step's tp traffic: info->tp_comm_bytes */
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
    size_t base = (size_t)t->dp_rank * (size_t)t->local_B * (size_t)T;
    int slot = t->mode == MODE_STALE ? t->step % (c->parallel.staleness + 1) : 0;
    /* the driver: the schedule's passes in order, micro-batch mb in slot
     * mb % in_flight (a schedule never holds more than in_flight at once) */
    const pt_schedule *sc = &t->sched;
    double loss_sum = 0;
    pt_status st = PT_OK;
    uint64_t pp_bytes0 = sent_bytes_pp(t);
    if (t->pipe) PT_CHECK(pt_pipe_step(t->pipe, t, sc, inputs, targets, dloss, base, &loss_sum));
    for (int k = 0; !t->pipe && k < sc->npass; k++) {
        int mb = sc->pass[k].micro;
        pt_model_slot *s = t->slots[mb % sc->in_flight];
        if (sc->pass[k].kind == PT_PASS_FORWARD) {
            size_t off = base + (size_t)mb * (size_t)mB * (size_t)T;
            pt_batch b = {inputs + off, targets + off, dloss, mB, T, mb, mb == sc->last_micro};
            float loss = 0;
            PT_CHECK(pt_model_forward_in(t->model, s, &b, &loss));
            loss_sum += loss;
        } else {
            /* only the last backward completes gradients: arm the buckets */
            if (t->ddp && mb == sc->last_micro)
                pt_ddp_begin(t->ddp, slot, c->parallel.overlap, t->step + 1);
            PT_CHECK(pt_model_backward_in(t->model, s));
        }
    }
    float loss = (float)(loss_sum / M);
    /* the pipeline's bubble: the part of the step's passes' span S (the
     * longest rank's) in which a rank is not working, 1 - busy / S, mean
     * over ranks -- the schedules' idle / (idle + busy)
     * (pt_schedule_bubble), so that the two compare */
    double bubble = 0, busy = 0, span = 0;
    uint64_t stage_acts[PT_STEP_MAX_STAGES] = {0};
    if (t->pipe) {
        uint64_t b, sp;
        pt_pipe_take_stats(t->pipe, &b, &sp);
        busy = (double)b;
        span = (double)sp;
        bubble = span > 0 ? 1 - busy / span : 0;
    }
    float lr = pt_lr_schedule(t->step, c->train.steps, c->train.warmup_steps, (float)c->train.lr,
                              (float)c->train.min_lr);
    float norm = 0;
    int applied = 1;
    if (!t->dp) {
        PT_CHECK(apply_update(t, pt_model_grads(t->model), lr, &norm));
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
        PT_CHECK(apply_update(t, pt_model_grads(t->model), lr, &norm));
    } else if (t->mode == MODE_STALE) {
        PT_CHECK(pt_ddp_launch_all(t->ddp));
        int k = c->parallel.staleness;
        if (t->dga) {
            PT_CHECK(dga_step(t, slot, k, &norm, lr));
        } else if (t->step - t->pipe_start >= k) {
            int s = (t->step - k) % (k + 1);
            PT_CHECK(pt_ddp_wait(t->ddp, s));
            PT_CHECK(apply_update(t, pt_ddp_slot_grads(t->ddp, s), lr, &norm));
        } else {
            applied = 0;
        }
    } else {
        PT_CHECK(apply_update(t, pt_model_grads(t->model), lr, &norm));
        if ((t->step + 1) % c->parallel.sync_every == 0 || t->step + 1 == c->train.steps) {
            uint64_t a = pt_time_ns();
            st = pt_local_sgd_sync(t->lsgd, t->dp, pt_model_params(t->model));
            uint64_t z = pt_time_ns();
            if (st != PT_OK) return pt_trainer_prefix_error(st, "local_sgd parameter averaging");
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
        enum { NRS = 9 + 2 * PT_MEM_NCAT };
        double rs[NRS];
        rs[0] = loss;
        rs[1] = (double)t->mem_peak_total;
        for (int k = 0; k < PT_MEM_NCAT; k++) rs[2 + k] = (double)t->mem_peak[k];
        rs[2 + PT_MEM_NCAT] = (double)ds.launch_ns; /* exact: < 2^53 ns */
        rs[3 + PT_MEM_NCAT] = (double)ds.end_ns;
        rs[4 + PT_MEM_NCAT] = (double)t->mem_cur_total;
        for (int k = 0; k < PT_MEM_NCAT; k++) rs[5 + PT_MEM_NCAT + k] = (double)t->mem_cur[k];
        /* pipelines: whether this rank's loss counts (the head's stage), its
         * stage, and the fraction of its passes' span spent waiting */
        rs[5 + 2 * PT_MEM_NCAT] = !t->pipe || pt_pipe_has_head(t->pipe);
        rs[6 + 2 * PT_MEM_NCAT] = t->pp_rank;
        rs[7 + 2 * PT_MEM_NCAT] = busy;
        rs[8 + 2 * PT_MEM_NCAT] = span;
        if (t->rank != 0) {
            st = pt_comm_send(t->aux, rs, sizeof rs, 0, 7);
            if (st != PT_OK) return pt_trainer_prefix_error(st, "step statistics");
        } else {
            double sum = rs[5 + 2 * PT_MEM_NCAT] ? loss : 0, nloss = rs[5 + 2 * PT_MEM_NCAT];
            double busy_sum = busy, span_max = span;
            stage_acts[0] = t->mem_peak[PT_MEM_ACTS];
            for (int r = 1; r < t->nranks; r++) {
                double o[NRS];
                st = pt_comm_recv(t->aux, o, sizeof o, r, 7);
                if (st != PT_OK) return pt_trainer_prefix_error(st, "step statistics");
                if (o[5 + 2 * PT_MEM_NCAT]) {
                    sum += o[0];
                    nloss += 1;
                }
                busy_sum += o[7 + 2 * PT_MEM_NCAT];
                if (o[8 + 2 * PT_MEM_NCAT] > span_max) span_max = o[8 + 2 * PT_MEM_NCAT];
                int sg = (int)o[6 + 2 * PT_MEM_NCAT];
                if (sg >= 0 && sg < PT_STEP_MAX_STAGES &&
                    (uint64_t)o[2 + PT_MEM_ACTS] > stage_acts[sg])
                    stage_acts[sg] = (uint64_t)o[2 + PT_MEM_ACTS];
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
            loss = (float)(sum / nloss);
            if (t->pipe && span_max > 0) bubble = 1 - busy_sum / t->nranks / span_max;
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
        info->comm_bytes = (t->ddp ? ds.bytes : dp_bytes(t) - bytes0) + zero_bytes;
        /* the tp group's collectives of this step only: a validation pass
         * runs outside it, and the statistics above travel on aux */
        info->tp_comm_bytes = sent_bytes(t->tp) - tp_bytes0;
        info->applied = applied;
        info->bubble = bubble;
        info->stages = t->pp_size;
        info->pp_comm_bytes = sent_bytes_pp(t) - pp_bytes0;
        for (int k = 0; k < t->pp_size && k < PT_STEP_MAX_STAGES; k++)
            info->stage_acts[k] = stage_acts[k];
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
