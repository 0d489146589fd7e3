/* The trainer's optimizer step: the strategy stack's begin, the executor's
 * passes over this rank's share of the batch, the stack's end, sync and
 * update, then the step's statistics gathered on rank 0.
 *
 * Every rank draws the same global batch and computes its contiguous share
 * with loss weight 1/(global tokens), so that the SUM over ranks is the
 * single-worker gradient (a synchronizer that averages parameters instead,
 * local SGD, takes each rank's own mean).
 *
 * Not here: construction and the stack's order (trainer_new.c), the loop
 * (trainer_run.c), checkpoints (trainer_ckpt.c), the strategies (parallel/). */
#include "trainer_impl.h"

#include <math.h>
#include <string.h>

#include "partrain/parallel.h"

/* One rank's figures of a step, sent to rank 0 on aux as they are (every
 * rank runs the same binary): doubles, exact for byte counts and
 * nanosecond clocks below 2^53. */
typedef struct {
    double loss, has_loss; /* has_loss: this rank holds the head (its loss counts) */
    double stage, busy_ns, span_ns;
    double launch_ns, end_ns; /* the last bucket's launch, its completion (pt_sync_stats) */
    double peak_total, cur_total;
    double peak[PT_MEM_NCAT], cur[PT_MEM_NCAT];
} rank_stats;

/* What rank 0 makes of every rank's rank_stats. */
typedef struct {
    double loss_sum, nloss, busy_sum, span_max, last_launch, first_end;
    int nranks; /* merged */
    uint64_t stage_acts[PT_STEP_MAX_STAGES];
} step_stats;

static void merge(pt_trainer *t, step_stats *m, const rank_stats *o) {
    m->nranks++;
    if (o->has_loss) {
        m->loss_sum += o->loss;
        m->nloss += 1;
    }
    m->busy_sum += o->busy_ns;
    if (o->span_ns > m->span_max) m->span_max = o->span_ns;
    int sg = (int)o->stage;
    if (sg >= 0 && sg < PT_STEP_MAX_STAGES && (uint64_t)o->peak[PT_MEM_ACTS] > m->stage_acts[sg])
        m->stage_acts[sg] = (uint64_t)o->peak[PT_MEM_ACTS];
    if ((size_t)o->peak_total > t->mem_peak_total) t->mem_peak_total = (size_t)o->peak_total;
    if ((size_t)o->cur_total > t->mem_cur_total) t->mem_cur_total = (size_t)o->cur_total;
    for (int k = 0; k < PT_MEM_NCAT; k++) {
        if ((size_t)o->peak[k] > t->mem_peak[k]) t->mem_peak[k] = (size_t)o->peak[k];
        if ((size_t)o->cur[k] > t->mem_cur[k]) t->mem_cur[k] = (size_t)o->cur[k];
    }
    if (o->launch_ns > m->last_launch) m->last_launch = o->launch_ns;
    if (o->end_ns > 0 && (m->first_end == 0 || o->end_ns < m->first_end)) m->first_end = o->end_ns;
}

/* Rank 0 learns the global loss, every rank's memory peaks (max per
 * category), every stage's activations and the pipeline's busy time; on
 * aux, so that the groups' counters hold their own traffic only. */
static pt_status gather_stats(pt_trainer *t, const rank_stats *mine, step_stats *m) {
    for (int k = 0; k < PT_MEM_NCAT; k++) t->mem_peak[k] = pt_mem_peak((pt_mem_cat)k);
    t->mem_peak_total = pt_mem_peak_total();
    for (int k = 0; k < PT_MEM_NCAT; k++) t->mem_cur[k] = pt_mem_current((pt_mem_cat)k);
    t->mem_cur_total = pt_mem_current_total();
    memset(m, 0, sizeof *m);
    merge(t, m, mine);
    if (!t->aux) return PT_OK;
    pt_status st = PT_OK;
    if (t->rank != 0) {
        st = pt_comm_send(t->aux, mine, sizeof *mine, 0, 7);
    } else {
        for (int r = 1; r < t->nranks && st == PT_OK; r++) {
            rank_stats o;
            st = pt_comm_recv(t->aux, &o, sizeof o, r, 7);
            if (st == PT_OK) merge(t, m, &o);
        }
    }
    return st == PT_OK ? PT_OK : pt_trainer_prefix_error(st, "step statistics");
}

static void mine_of(const pt_trainer *t, double loss, const pt_sync_stats *ss,
                    const pt_pipeline_stats *ps, rank_stats *r) {
    *r = (rank_stats){.loss = loss,
                      .has_loss = pt_pipeline_has_head(t->pipe),
                      .stage = t->pp_rank,
                      .busy_ns = (double)ps->busy_ns,
                      .span_ns = (double)ps->span_ns,
                      .launch_ns = (double)ss->launch_ns,
                      .end_ns = (double)ss->end_ns,
                      .peak_total = (double)pt_mem_peak_total(),
                      .cur_total = (double)pt_mem_current_total()};
    for (int k = 0; k < PT_MEM_NCAT; k++) {
        r->peak[k] = (double)pt_mem_peak((pt_mem_cat)k);
        r->cur[k] = (double)pt_mem_current((pt_mem_cat)k);
    }
}

/* rank 0 splits its wait at the last rank's launch and the first rank's
 * completion of the last bucket (one host: one monotonic clock) */
static void split_wait(pt_step_info *info, const pt_sync_stats *ss, const step_stats *m) {
    if (ss->wait_end_ns <= ss->wait_start_ns) return;
    double w0 = (double)ss->wait_start_ns, w1 = (double)ss->wait_end_ns;
    double last = m->last_launch, first = m->first_end > 0 ? m->first_end : w1;
    double a = last < w0 ? w0 : last > w1 ? w1 : last;
    double z = first < a ? a : first > w1 ? w1 : first;
    info->skew_ms = (a - w0) / 1e6;
    info->local_lag_ms = (w1 - z) / 1e6;
    info->exposed_transfer_ms = (z - a) / 1e6;
}

/* The step's byte counters before its passes. */
typedef struct {
    uint64_t tp, pp;
} step_bytes;

static void fill_info(const pt_trainer *t, pt_step_info *info, double ms, float loss,
                      const pt_update *u, const pt_sync_stats *ss, const step_stats *m,
                      const step_bytes *b0) {
    const pt_config *c = &t->cfg;
    memset(info, 0, sizeof *info);
    info->step = t->step;
    info->loss = loss;
    info->lr = u->lr;
    info->grad_norm = u->norm;
    info->step_ms = ms;
    info->tokens_per_s =
        (double)c->train.batch_size * c->model.seq_len / (ms > 0 ? ms / 1e3 : 1e-9);
    info->exposed_comm_ms = (double)ss->exposed_ns / 1e6;
    info->comm_ms = (double)ss->comm_ns / 1e6;
    info->compute_ms = ms - info->exposed_comm_ms;
    if (t->rank == 0) split_wait(info, ss, m);
    /* gradient modes: the rounds waited for this step (deterministic) */
    info->comm_bytes = ss->bytes;
    /* the tp group's collectives of this step only: a validation pass runs
     * outside it, and the statistics travel on aux */
    info->tp_comm_bytes = pt_comm_sent_bytes(t->tp) - b0->tp;
    info->applied = !u->skip;
    info->stages = t->pp_size;
    if (t->pp) {
        pt_pipeline_stats ps;
        pt_pipeline_get_stats(t->pipe, &ps);
        info->pp_comm_bytes = ps.sent_bytes + ss->pp_bytes - b0->pp;
        /* the part of the passes' span S (the longest rank's) a rank is not
         * working, 1 - busy / S, mean over ranks: the schedules' idle /
         * (idle + busy) (pt_schedule_bubble), so that the two compare */
        if (m->span_max > 0) info->bubble = 1 - m->busy_sum / m->nranks / m->span_max;
    }
    for (int k = 0; k < t->pp_size && k < PT_STEP_MAX_STAGES; k++)
        info->stage_acts[k] = m->stage_acts[k];
}

pt_status pt_trainer_step_batch(pt_trainer *t, const int *inputs, const int *targets,
                                pt_step_info *info) {
    const pt_config *c = &t->cfg;
    int T = c->model.seq_len, M = c->parallel.microbatches;
    uint64_t t0 = pt_time_ns();
    pt_pipeline_stats ps;
    pt_pipeline_get_stats(t->pipe, &ps);
    step_bytes b0 = {pt_comm_sent_bytes(t->tp), ps.sent_bytes};
    pt_mem_reset_peak();
    pt_model_zero_grads(t->model);
    pt_step_begin b = {.step = t->step + 1,
                       .microbatches = M,
                       .dloss = 1.0f / ((float)c->train.batch_size * (float)T),
                       .local_dloss = 1.0f / ((float)t->local_B * (float)T)};
    PT_CHECK(pt_stack_begin(&t->stack, &b));
    size_t share = (size_t)t->dp_rank * (size_t)t->local_B * (size_t)T;
    pt_pipeline_batch pb = {inputs + share, targets + share, t->micro_B, T, b.dloss, b.step};
    double loss_sum = 0;
    pt_status st = pt_pipeline_step(t->pipe, &pb, &loss_sum);
    pt_status end = pt_stack_end(&t->stack, &b);
    PT_CHECK(st);
    PT_CHECK(end);
    pt_update u = {.step = b.step,
                   .steps = c->train.steps,
                   .lr = pt_lr_schedule(t->step, c->train.steps, c->train.warmup_steps,
                                        (float)c->train.lr, (float)c->train.min_lr),
                   .clip = (float)c->train.grad_clip,
                   .grads = pt_model_grads(t->model)};
    PT_CHECK(pt_stack_update(&t->stack, &u));
    t->step++;
    pt_comm_note_step(t->world, t->step);
    double ms = (double)(pt_time_ns() - t0) / 1e6;
    float loss = (float)(loss_sum / M);
    pt_sync_stats ss;
    pt_stack_stats(&t->stack, &ss);
    pt_pipeline_get_stats(t->pipe, &ps);
    rank_stats mine;
    step_stats m;
    mine_of(t, loss, &ss, &ps, &mine);
    PT_CHECK(gather_stats(t, &mine, &m));
    if (t->rank == 0 && m.nloss > 0) loss = (float)(m.loss_sum / m.nloss);
    if (info) fill_info(t, info, ms, loss, &u, &ss, &m, &b0);
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
