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

_Static_assert(PT_NGROUPS == PT_STEP_GROUPS, "train.h's groups are parallel.h's");

/* One rank's figures of a step, sent to rank 0 on aux as they are (every
 * rank runs the same binary): doubles, exact for byte counts and
 * nanosecond clocks below 2^53. */
typedef struct {
    double loss, has_loss; /* has_loss: this rank holds the head (its loss counts) */
    double stage, busy_ns, span_ns;
    double launch_ns, end_ns; /* the last bucket's launch, its completion (pt_sync_stats) */
    double peak_total, cur_total;
    double peak[PT_MEM_NCAT], cur[PT_MEM_NCAT];
    double wall_ns, part_ns[PT_NPARTS]; /* the step's time and its parts (split_time) */
    double idle_ns;                     /* idle outside its passes (split_time) */
    double overlap_ns[PT_NGROUPS], sent[PT_NGROUPS], comm_ns[PT_NGROUPS];
} rank_stats;

/* What rank 0 makes of every rank's rank_stats. */
typedef struct {
    double loss_sum, nloss, busy_sum, span_max, last_launch, first_end;
    int nranks; /* merged */
    uint64_t stage_acts[PT_STEP_MAX_STAGES];
    double stage_idle_ms[PT_STEP_MAX_STAGES];
    pt_spread wall, part[PT_NPARTS], overlap[PT_NGROUPS];
    double sent[PT_NGROUPS], comm_ns[PT_NGROUPS];
    double rank_wall_ms[PT_STEP_MAX_RANKS], rank_part_ms[PT_STEP_MAX_RANKS][PT_NPARTS];
    uint64_t rank_mem[PT_STEP_MAX_RANKS][PT_MEM_NCAT + 1];
} step_stats;

const char *pt_step_part_name(pt_step_part k) {
    static const char *names[PT_NPARTS] = {"compute", "dp",        "tp",   "pp",
                                           "zero",    "optimizer", "other"};
    return (unsigned)k < PT_NPARTS ? names[k] : "unknown";
}

/* v, rank's figure in ms, into s (first: the first rank merged) */
static void spread_add(pt_spread *s, double v, int rank, int first) {
    if (first || v < s->min) s->min = v;
    if (first || v > s->max) s->max = v, s->max_rank = rank;
    s->mean += v; /* divided by the ranks in fill_info */
}

/* rank r's times and counts into m (r: the order merged, its world rank) */
static void merge_times(step_stats *m, const rank_stats *o, int r) {
    spread_add(&m->wall, o->wall_ns / 1e6, r, r == 0);
    if (r < PT_STEP_MAX_RANKS) m->rank_wall_ms[r] = o->wall_ns / 1e6;
    for (int k = 0; k < PT_NPARTS; k++) {
        spread_add(&m->part[k], o->part_ns[k] / 1e6, r, r == 0);
        if (r < PT_STEP_MAX_RANKS) m->rank_part_ms[r][k] = o->part_ns[k] / 1e6;
    }
    for (int g = 0; g < PT_NGROUPS; g++) {
        spread_add(&m->overlap[g], o->overlap_ns[g] / 1e6, r, r == 0);
        m->sent[g] += o->sent[g];
        m->comm_ns[g] += o->comm_ns[g];
    }
    if (r < PT_STEP_MAX_RANKS) {
        for (int k = 0; k < PT_MEM_NCAT; k++) m->rank_mem[r][k] = (uint64_t)o->peak[k];
        m->rank_mem[r][PT_MEM_NCAT] = (uint64_t)o->peak_total;
    }
}

static void merge(pt_trainer *t, step_stats *m, const rank_stats *o) {
    merge_times(m, o, m->nranks);
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
    if (sg >= 0 && sg < PT_STEP_MAX_STAGES && o->idle_ns / 1e6 > m->stage_idle_ms[sg])
        m->stage_idle_ms[sg] = o->idle_ns / 1e6;
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

/* The clock and the groups' counters at one point of a step. */
typedef struct {
    uint64_t ns;
    pt_comm_counts k;
    pt_pipeline_stats ps;
} mark;

enum { M_START, M_PASSES, M_PASSES_END, M_UPDATE, M_END, M_N };

static void mark_now(pt_trainer *t, mark *m) {
    memset(&m->k, 0, sizeof m->k);
    pt_comm_counts_add(&m->k, PT_GROUP_DP, t->dp);
    pt_comm_counts_add(&m->k, PT_GROUP_TP, t->tp);
    pt_comm_counts_add(&m->k, PT_GROUP_PP, t->pp);
    pt_stack_counts(&t->stack, &m->k);
    pt_pipeline_get_stats(t->pipe, &m->ps);
    m->ns = pt_time_ns();
}

/* The step's time [start, end] into disjoint parts, on the calling thread's
 * clock. Blocked time is the communicators' own count (pt_comm_stats
 * .blocked_ns); inside the passes it happens only within their work (the
 * strategies' hooks, tensor parallel's collectives: the pipeline's own
 * waits for neighbours fall between passes), so:
 *   compute   = the passes' work (busy) - blocked during the passes
 *   pp        += the passes' span - busy (waits for neighbours, pp > 1)
 *   optimizer = the update point's time - blocked during it
 *   group g   = blocked on g's communicators anywhere in the step
 *   other     = the rest (zeroing gradients, the stack's begin and end
 *               less their blocking, bookkeeping) */
static void split_time(const pt_trainer *t, const mark *mk, rank_stats *r) {
    const pt_comm_counts *k0 = &mk[M_START].k, *k1 = &mk[M_PASSES].k, *k2 = &mk[M_PASSES_END].k,
                         *k3 = &mk[M_UPDATE].k, *k4 = &mk[M_END].k;
    double wall = (double)(mk[M_END].ns - mk[M_START].ns), in_passes = 0, in_update = 0;
    for (int g = 0; g < PT_NGROUPS; g++) {
        in_passes += (double)(k2->blocked_ns[g] - k1->blocked_ns[g]);
        in_update += (double)(k4->blocked_ns[g] - k3->blocked_ns[g]);
        r->part_ns[PT_PART_DP + g] = (double)(k4->blocked_ns[g] - k0->blocked_ns[g]);
        r->sent[g] = (double)(k4->sent[g] - k0->sent[g]);
        r->comm_ns[g] = (double)(k4->comm_ns[g] - k0->comm_ns[g]);
    }
    /* idle outside the passes: before the first pass's work and after the
     * last's (inside the executor's span), and blocked before and after
     * the passes (a stage waiting through another's update shows here) */
    double around = 0;
    for (int g = 0; g < PT_NGROUPS; g++)
        around += (double)(k1->blocked_ns[g] - k0->blocked_ns[g]) +
                  (double)(k4->blocked_ns[g] - k2->blocked_ns[g]);
    r->idle_ns = (double)(mk[M_END].ps.lead_ns + mk[M_END].ps.tail_ns) + around;
    double busy = (double)mk[M_END].ps.busy_ns;
    double passes = (double)(mk[M_PASSES_END].ns - mk[M_PASSES].ns);
    double wait = passes > busy ? passes - busy : 0;
    r->part_ns[PT_PART_COMPUTE] = busy > in_passes ? busy - in_passes : 0;
    double upd = (double)(mk[M_END].ns - mk[M_UPDATE].ns);
    r->part_ns[PT_PART_OPTIMIZER] = upd > in_update ? upd - in_update : 0;
    if (t->pp) { /* the pipeline's own transfers are pp's */
        r->part_ns[PT_PART_PP] += wait;
        r->sent[PT_GROUP_PP] += (double)(mk[M_END].ps.sent_bytes - mk[M_START].ps.sent_bytes);
        r->comm_ns[PT_GROUP_PP] += (double)(mk[M_END].ps.comm_ns - mk[M_START].ps.comm_ns);
    }
    double known = 0;
    for (int k = 0; k < PT_PART_OTHER; k++) known += r->part_ns[k];
    r->part_ns[PT_PART_OTHER] = wall > known ? wall - known : 0;
    r->wall_ns = wall;
    /* the lanes' time beyond what the thread waited for */
    for (int g = 0; g < PT_NGROUPS; g++) {
        double exposed = r->part_ns[PT_PART_DP + g];
        r->overlap_ns[g] = r->comm_ns[g] > exposed ? r->comm_ns[g] - exposed : 0;
    }
}

static void mine_of(const pt_trainer *t, double loss, const pt_sync_stats *ss,
                    const pt_pipeline_stats *ps, const mark *mk, rank_stats *r) {
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
    split_time(t, mk, r);
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

/* This rank's parts; on rank 0 every rank's (m: all merged). */
static void fill_times(pt_step_info *info, const rank_stats *mine, const step_stats *m) {
    for (int k = 0; k < PT_NPARTS; k++) info->part_ms[k] = mine->part_ns[k] / 1e6;
    int n = m->nranks > 0 ? m->nranks : 1, kept = n < PT_STEP_MAX_RANKS ? n : PT_STEP_MAX_RANKS;
    info->nranks = n;
    info->wall = m->wall;
    info->wall.mean /= n;
    for (int k = 0; k < PT_NPARTS; k++) {
        info->part[k] = m->part[k];
        info->part[k].mean /= n;
    }
    for (int g = 0; g < PT_NGROUPS; g++) {
        info->overlap[g] = m->overlap[g];
        info->overlap[g].mean /= n;
        info->group_bytes[g] = (uint64_t)m->sent[g];
        info->group_comm_ms[g] = m->comm_ns[g] / 1e6;
    }
    memcpy(info->rank_wall_ms, m->rank_wall_ms, (size_t)kept * sizeof m->rank_wall_ms[0]);
    memcpy(info->rank_part_ms, m->rank_part_ms, (size_t)kept * sizeof m->rank_part_ms[0]);
    memcpy(info->rank_mem, m->rank_mem, (size_t)kept * sizeof m->rank_mem[0]);
}

static void fill_info(const pt_trainer *t, pt_step_info *info, double ms, float loss,
                      const pt_update *u, const pt_sync_stats *ss, const step_stats *m,
                      const step_bytes *b0, const rank_stats *mine) {
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
        info->stage_acts[k] = m->stage_acts[k], info->stage_idle_ms[k] = m->stage_idle_ms[k];
    fill_times(info, mine, m);
}

pt_status pt_trainer_step_batch(pt_trainer *t, const int *inputs, const int *targets,
                                pt_step_info *info) {
    const pt_config *c = &t->cfg;
    int T = c->model.seq_len, M = c->parallel.microbatches;
    mark mk[M_N];
    mark_now(t, &mk[M_START]);
    uint64_t t0 = mk[M_START].ns;
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
    mark_now(t, &mk[M_PASSES]);
    pt_status st = pt_pipeline_step(t->pipe, &pb, &loss_sum);
    mark_now(t, &mk[M_PASSES_END]);
    pt_status end = pt_stack_end(&t->stack, &b);
    PT_CHECK(st);
    PT_CHECK(end);
    pt_update u = {.step = b.step,
                   .steps = c->train.steps,
                   .lr = pt_lr_schedule(t->step, c->train.steps, c->train.warmup_steps,
                                        (float)c->train.lr, (float)c->train.min_lr),
                   .clip = (float)c->train.grad_clip,
                   .grads = pt_model_grads(t->model)};
    mark_now(t, &mk[M_UPDATE]);
    PT_CHECK(pt_stack_update(&t->stack, &u));
    t->step++;
    pt_comm_note_step(t->world, t->step);
    mark_now(t, &mk[M_END]);
    double ms = (double)(mk[M_END].ns - t0) / 1e6;
    float loss = (float)(loss_sum / M);
    pt_sync_stats ss;
    pt_stack_stats(&t->stack, &ss);
    pt_pipeline_get_stats(t->pipe, &ps);
    rank_stats mine;
    step_stats m;
    mine_of(t, loss, &ss, &ps, mk, &mine);
    PT_CHECK(gather_stats(t, &mine, &m));
    if (t->rank == 0 && m.nloss > 0) loss = (float)(m.loss_sum / m.nloss);
    if (info) fill_info(t, info, ms, loss, &u, &ss, &m, &b0, &mine);
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
