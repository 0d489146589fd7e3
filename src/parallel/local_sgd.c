/* Local SGD's synchronization: every sync_every steps the ranks average
 * their parameters (one all-reduce of the whole flat buffer); with the outer
 * Nesterov optimizer (DiLoCo, Douillard et al. 2023) the average is treated
 * as a pseudo-gradient delta = anchor - average applied to the anchor (the
 * parameters after the previous synchronization) with momentum.
 *
 * The stack entry (the end of the file) synchronizes every sync_every
 * steps, after the optimizer entry's local step.
 *
 * Not here: the inner optimizer (strategies.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

struct pt_local_sgd {
    size_t n;
    int nesterov;
    float outer_lr, momentum;
    float *anchor, *u; /* n each (nesterov only) */
};

pt_status pt_local_sgd_new(pt_local_sgd **out, const float *params, size_t n, int nesterov,
                           float outer_lr, float momentum) {
    *out = NULL;
    pt_local_sgd *l = calloc(1, sizeof *l);
    if (!l) return pt_error_set(PT_ERR_NOMEM, "local_sgd");
    l->n = n;
    l->nesterov = nesterov;
    l->outer_lr = outer_lr;
    l->momentum = momentum;
    if (nesterov) {
        l->anchor = pt_mem_alloc(PT_MEM_OPTIM, n * sizeof(float));
        l->u = pt_mem_alloc(PT_MEM_OPTIM, n * sizeof(float));
        if (!l->anchor || !l->u) {
            pt_local_sgd_free(l);
            return pt_error_set(PT_ERR_NOMEM, "local_sgd outer state (%zu floats)", n);
        }
        memcpy(l->anchor, params, n * sizeof(float));
    }
    *out = l;
    return PT_OK;
}

void pt_local_sgd_free(pt_local_sgd *l) {
    if (!l) return;
    pt_mem_free(l->u);
    pt_mem_free(l->anchor);
    free(l);
}

pt_status pt_local_sgd_sync(pt_local_sgd *l, pt_comm *c, float *params) {
    PT_CHECK(pt_comm_allreduce(c, params, l->n, PT_REDUCE_AVG));
    if (!l->nesterov) return PT_OK;
    float lr = l->outer_lr, mu = l->momentum;
    for (size_t i = 0; i < l->n; i++) {
        float delta = l->anchor[i] - params[i];
        float u = mu * l->u[i] + delta;
        l->u[i] = u;
        l->anchor[i] -= lr * (delta + mu * u);
        params[i] = l->anchor[i];
    }
    return PT_OK;
}

/* ---- the stack entry ---- */

typedef struct {
    pt_local_sgd *l;
    pt_comm *dp;
    pt_model *m;
    pt_trace *trace;
    int every;
    uint64_t a, z;  /* the last averaging's span (0: none since the stats) */
    uint64_t bytes; /* sent by it */
} local_entry;

/* Each rank's own mean: its positions weighed by 1/(its tokens). */
static pt_status local_begin(void *self, pt_step_begin *b) {
    (void)self;
    b->dloss = b->local_dloss;
    return PT_OK;
}

/* After the optimizer's local step: every `every` steps, and at the last,
 * the parameters are averaged over the group. */
static pt_status local_update(void *self, pt_update *u) {
    local_entry *e = self;
    if (u->step % e->every != 0 && u->step != u->steps) return PT_OK;
    uint64_t a = pt_time_ns(), b0 = pt_comm_sent_bytes(e->dp);
    pt_status st = pt_local_sgd_sync(e->l, e->dp, pt_model_params(e->m));
    uint64_t z = pt_time_ns();
    e->bytes = pt_comm_sent_bytes(e->dp) - b0;
    if (st != PT_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", pt_error_message());
        return pt_error_set(st, "local_sgd parameter averaging: %s", msg);
    }
    e->a = a;
    e->z = z;
    pt_trace_add(e->trace, "average params", "comm", PT_TRACE_COMM, a, z, u->step);
    pt_trace_add(e->trace, "wait params", "wait", PT_TRACE_MAIN, a, z, u->step);
    return PT_OK;
}

/* The averaging blocks: launched when its wait starts. */
static void local_stats(void *self, pt_sync_stats *s) {
    local_entry *e = self;
    if (!e->z) return;
    s->comm_ns += e->z - e->a;
    s->exposed_ns += e->z - e->a;
    s->wait_start_ns = s->launch_ns = e->a;
    s->wait_end_ns = s->end_ns = e->z;
    s->bytes += e->bytes;
    e->a = e->z = e->bytes = 0;
}

/* The outer state, alike on every rank (computed from the averaged
 * parameters): the anchor and the momentum (nesterov only). The ranks' own
 * parameters and moments are the optimizer entry's. Restarted: the anchor
 * is the parameters just loaded, the momentum zero. */
static pt_status local_state(void *self, pt_state_visit *v) {
    local_entry *e = self;
    pt_local_sgd *l = e->l;
    if (!l->nesterov) return PT_OK;
    if (v->mode == PT_STATE_RESTART) {
        memcpy(l->anchor, pt_model_params(e->m), l->n * sizeof(float));
        memset(l->u, 0, l->n * sizeof(float));
        return PT_OK;
    }
    int r = e->dp ? pt_comm_rank(e->dp) : 0, size = e->dp ? pt_comm_size(e->dp) : 1;
    pt_state_region a = {"outer.anchor", -1, 0, l->n, l->anchor, r, size};
    PT_CHECK(v->region(v, &a));
    pt_state_region u = {"outer.momentum", -1, 0, l->n, l->u, r, size};
    return v->region(v, &u);
}

static void local_free(void *self) {
    local_entry *e = self;
    pt_local_sgd_free(e->l);
    free(e);
}

static const pt_strategy_ops LOCAL = {.name = "local_sgd",
                                      .begin = local_begin,
                                      .update = local_update,
                                      .stats = local_stats,
                                      .state = local_state,
                                      .free = local_free};

pt_status pt_local_sgd_strategy(pt_strategy *out, pt_local_sgd **handle, pt_model *m, pt_comm *dp,
                                const pt_local_sgd_options *o, pt_trace *trace) {
    local_entry *e = pt_strategy_entry_new(out, sizeof *e, "local_sgd");
    if (!e) return PT_ERR_NOMEM;
    pt_status st = pt_local_sgd_new(&e->l, pt_model_params(m), pt_model_num_params(m), o->nesterov,
                                    o->outer_lr, o->outer_momentum);
    if (st != PT_OK) {
        free(e);
        return st;
    }
    e->dp = dp;
    e->m = m;
    e->trace = trace;
    e->every = o->sync_every;
    *out = (pt_strategy){&LOCAL, e};
    if (handle) *handle = e->l;
    return PT_OK;
}
