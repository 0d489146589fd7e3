/* The data-parallel synchronizers on the strategy stack (parallel.h):
 * pt_ddp's buckets driven at the executor's points.
 *
 *   sync   one round in place: armed before the step's last micro-batch's
 *          first backward, each bucket launched once the modules it covers
 *          are final (overlap: during backward; else all at the sync
 *          point), waited for at the sync point; the optimizer entry then
 *          applies the SUM (every rank weighs its positions by 1/global
 *          tokens, so the sum is the single worker's gradient).
 *   stale  staleness k: step s's round runs in slot s mod (k+1) while the
 *          next k steps compute, and is applied at step s + k as it is,
 *          or (dga) as the correction of delayed gradient averaging.
 *
 * Not here: the buckets (ddp.c), the optimizer (strategies.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

struct pt_dp_sync {
    pt_ddp *ddp;
    pt_model *m;
    int k, dga, overlap, microbatches, nslots;
    float dp; /* ranks of the group, as the dga rule's factor */
    int dp_rank, dp_size;
    int start;        /* stale: the step the pipeline (re)started at; step s's round is
                         applied at s + k when s >= start */
    float *dga_local; /* dga: (k+1) x P, this rank's gradient of each step in flight */
    long step;        /* 0-based: steps taken before this one */
    int slot, armed;
};

static pt_status sync_begin(void *self, pt_step_begin *b) {
    pt_dp_sync *s = self;
    s->step = b->step - 1;
    s->slot = s->k ? (int)(s->step % (s->k + 1)) : 0;
    s->armed = b->eval; /* a validation pass has no round */
    return PT_OK;
}

/* The step's last micro-batch's first backward precedes every module's
 * final one: the round opens there. */
static pt_status sync_before_backward(void *self, const pt_hook_point *p) {
    pt_dp_sync *s = self;
    if (!s->armed && p->micro == s->microbatches - 1) {
        pt_ddp_begin(s->ddp, s->slot, s->overlap, s->step + 1);
        s->armed = 1;
    }
    return PT_OK;
}

static pt_status sync_grads(void *self, const pt_hook_point *p) {
    pt_dp_sync *s = self;
    return p->last ? pt_ddp_module_done(s->ddp, p->module) : PT_OK;
}

static pt_status sync_sync(void *self, pt_update *u) {
    (void)u;
    return pt_ddp_wait(((pt_dp_sync *)self)->ddp, 0);
}

/* Delayed gradient averaging (Zhu, Lin, Lu, Han, NeurIPS 2021). The
 * model's gradient holds this rank's share g(t) (weighted by 1/global
 * tokens, so N g(t) is its own mean gradient), launched in this step's
 * slot. The update is
 *     g_eff(t) = N g(t) - N g(t-k) + S(t-k)
 * with S(t-k) the all-reduced sum of step t-k, waited for only now: the
 * fresh local gradient, corrected once the average of the same step
 * arrives. Over steps the local terms telescope, so a rank's parameters
 * are those of the averaged run plus at most its last k local terms; the
 * first k steps (of the run, or after a resume that restarted the
 * pipeline) apply the local gradient alone. */
static pt_status dga(pt_dp_sync *s) {
    size_t n = pt_model_num_params(s->m);
    float *g = pt_model_grads(s->m);
    float *mine = s->dga_local + (size_t)s->slot * n;
    memcpy(mine, g, n * sizeof(float));
    if (s->step - s->start < s->k) {
        for (size_t i = 0; i < n; i++) g[i] *= s->dp;
        return PT_OK;
    }
    int old_slot = (int)((s->step - s->k) % (s->k + 1));
    PT_CHECK(pt_ddp_wait(s->ddp, old_slot));
    const float *old = s->dga_local + (size_t)old_slot * n;
    const float *sum = pt_ddp_slot_grads(s->ddp, old_slot);
    for (size_t i = 0; i < n; i++) g[i] = s->dp * (g[i] - old[i]) + sum[i];
    return PT_OK;
}

static pt_status stale_sync(void *self, pt_update *u) {
    pt_dp_sync *s = self;
    PT_CHECK(pt_ddp_launch_all(s->ddp));
    if (s->dga) return dga(s);
    if (s->step - s->start < s->k) {
        u->skip = 1;
        return PT_OK;
    }
    int old_slot = (int)((s->step - s->k) % (s->k + 1));
    PT_CHECK(pt_ddp_wait(s->ddp, old_slot));
    u->grads = pt_ddp_slot_grads(s->ddp, old_slot);
    return PT_OK;
}

static void sync_stats(void *self, pt_sync_stats *out) {
    pt_sync_stats d;
    pt_ddp_take_stats(((pt_dp_sync *)self)->ddp, &d);
    out->comm_ns += d.comm_ns;
    out->exposed_ns += d.exposed_ns;
    out->bytes += d.bytes;
    out->buckets += d.buckets;
    out->wait_start_ns = d.wait_start_ns;
    out->wait_end_ns = d.wait_end_ns;
    out->launch_ns = d.launch_ns;
    out->end_ns = d.end_ns;
}

/* dga: this rank's own gradient of the step in slot `slot`. */
static float *dga_local(pt_dp_sync *s, int slot) {
    return s->dga_local + (size_t)slot * pt_model_num_params(s->m);
}

/* stale's checkpoint state: the rounds in flight, steps [first, step)
 * (0-based), first = max(step - k, start): each one's all-reduced sum,
 * alike on every rank, and under dga this rank's own gradient of it.
 * Saving completes them first (waiting early changes no value: a later
 * wait of the slot returns at once); loading fills the idle slots. */
static pt_status stale_state(void *self, pt_state_visit *v) {
    pt_dp_sync *s = self;
    if (v->mode == PT_STATE_RESTART) {
        s->start = (int)v->step;
        return PT_OK;
    }
    if (v->mode == PT_STATE_LOAD) s->start = v->pipeline_start;
    v->pipeline_start = s->start;
    long first = v->step - s->k > s->start ? v->step - s->k : s->start;
    size_t n = pt_model_num_params(s->m);
    for (long st = first; st < v->step; st++) {
        int slot = (int)(st % (s->k + 1));
        if (v->mode == PT_STATE_SAVE) PT_CHECK(pt_ddp_wait(s->ddp, slot));
        char name[48];
        snprintf(name, sizeof name, "stale.step_%ld.sum", st);
        pt_state_region r = {name,       -1,        0, n, pt_ddp_slot_grads(s->ddp, slot),
                             s->dp_rank, s->dp_size};
        PT_CHECK(v->region(v, &r));
        if (!s->dga) continue;
        snprintf(name, sizeof name, "stale.step_%ld.local", st);
        r = (pt_state_region){name, s->dp_rank, 0, n, dga_local(s, slot), 0, 1};
        PT_CHECK(v->region(v, &r));
    }
    return PT_OK;
}

static void sync_free(void *self) {
    pt_dp_sync *s = self;
    pt_ddp_free(s->ddp);
    pt_mem_free(s->dga_local);
    free(s);
}

static const pt_strategy_ops SYNC = {.name = "ddp",
                                     .begin = sync_begin,
                                     .before_backward = sync_before_backward,
                                     .grads = sync_grads,
                                     .sync = sync_sync,
                                     .stats = sync_stats,
                                     .free = sync_free};

static const pt_strategy_ops STALE = {.name = "stale",
                                      .begin = sync_begin,
                                      .before_backward = sync_before_backward,
                                      .grads = sync_grads,
                                      .sync = stale_sync,
                                      .stats = sync_stats,
                                      .state = stale_state,
                                      .free = sync_free};

pt_status pt_dp_sync_strategy(pt_strategy *out, pt_dp_sync **handle, pt_model *m, pt_comm *dp,
                              const pt_dp_sync_options *o, pt_trace *trace) {
    pt_dp_sync *s = pt_strategy_entry_new(out, sizeof *s, "data-parallel synchronizer");
    if (!s) return PT_ERR_NOMEM;
    *s = (pt_dp_sync){.m = m,
                      .k = o->staleness,
                      .dga = o->staleness > 0 && o->dga,
                      .overlap = o->overlap,
                      .microbatches = o->microbatches,
                      .nslots = o->staleness + 1,
                      .dp = (float)pt_comm_size(dp),
                      .dp_rank = pt_comm_rank(dp),
                      .dp_size = pt_comm_size(dp)};
    pt_ddp_options d = {o->bucket_bytes, s->nslots, o->staleness == 0, o->grad_bf16};
    pt_status st = pt_ddp_new(&s->ddp, m, dp, &d);
    if (st == PT_OK && s->dga) {
        size_t bytes = (size_t)s->nslots * pt_model_num_params(m) * sizeof(float);
        if (!(s->dga_local = pt_mem_alloc(PT_MEM_COMM, bytes)))
            st = pt_error_set(PT_ERR_NOMEM, "dga local gradients");
    }
    if (st != PT_OK) {
        sync_free(s);
        return st;
    }
    pt_ddp_set_trace(s->ddp, trace);
    *out = (pt_strategy){o->staleness ? &STALE : &SYNC, s};
    if (handle) *handle = s;
    return PT_OK;
}

pt_ddp *pt_dp_sync_ddp(pt_dp_sync *s) {
    return s->ddp;
}
