/* The optimizer's stack entry (parallel.h): AdamW or SGD over the whole
 * flat buffer, for every synchronizer that is not sharded; and the
 * clip-and-step helper it shares with them.
 *
 * Not here: the norm's reductions (gradnorm.c), the synchronizers (ddp.c's
 * and zero's entries, local_sgd.c), the stack (stack.c). */
#include <math.h>
#include <stdlib.h>

#include "partrain/parallel.h"

pt_status pt_update_apply(pt_update *u, pt_adamw *opt, const pt_model *m, float *params,
                          const float *grads, size_t off, size_t n) {
    double sumsq;
    if (u->reduce_norm) { /* the norm over the tp group and the stages, each parameter once */
        double parts[2], rest[2];
        size_t so, sn; /* the window's part another rank updates (and counts) */
        pt_adamw_skip(opt, &so, &sn);
        pt_grad_sumsq_parts(m, grads, off, sn ? so : n, parts);
        if (sn) {
            pt_grad_sumsq_parts(m, grads + so + sn, off + so + sn, n - so - sn, rest);
            parts[0] += rest[0], parts[1] += rest[1];
        }
        pt_status st = u->reduce_norm(u->norm_arg, parts, &sumsq);
        if (st != PT_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", pt_error_message());
            return pt_error_set(st, "gradient norm: %s", msg);
        }
        pt_adamw_step(opt, params, grads, u->lr, pt_optim_clip_scale(sumsq, u->clip));
    } else if (u->clip <= 0) { /* the norm only reported: one pass, not two */
        sumsq = pt_adamw_step_sumsq(opt, params, grads, u->lr);
    } else {
        sumsq = pt_optim_grad_sumsq(grads, n);
        pt_adamw_step(opt, params, grads, u->lr, pt_optim_clip_scale(sumsq, u->clip));
    }
    u->norm = (float)sqrt(sumsq);
    u->sumsq = sumsq;
    return PT_OK;
}

/* ---- the optimizer ---- */

typedef struct {
    pt_adamw *opt;
    pt_model *m;
    pt_trace *trace;
    pt_state_share share;
} optimizer;

static pt_status optimizer_update(void *self, pt_update *u) {
    optimizer *o = self;
    if (u->skip) return PT_OK;
    uint64_t a = pt_time_ns();
    PT_CHECK(pt_update_apply(u, o->opt, o->m, pt_model_params(o->m), u->grads, 0,
                             pt_model_num_params(o->m)));
    pt_trace_add(o->trace, "optimizer", "optim", PT_TRACE_MAIN, a, pt_time_ns(), u->step);
    return PT_OK;
}

/* The parameters and the state the rule keeps (AdamW m and v, SGD's
 * momentum as m, or none), each the whole flat buffer; the update count. */
static pt_status optimizer_state(void *self, pt_state_visit *v) {
    optimizer *o = self;
    if (v->mode == PT_STATE_RESTART) return PT_OK;
    if (v->mode == PT_STATE_SAVE) v->optim_t = pt_adamw_t(o->opt);
    if (v->mode == PT_STATE_LOAD) pt_adamw_set_t(o->opt, v->optim_t);
    const char *names[] = {"params", "optim_m", "optim_v"};
    float *bufs[] = {pt_model_params(o->m), pt_adamw_m(o->opt), pt_adamw_v(o->opt)};
    for (int k = 0; k < 3; k++) {
        if (!bufs[k]) continue;
        pt_state_region r = {names[k],      o->share.replica, 0, pt_model_num_params(o->m), bufs[k],
                             o->share.copy, o->share.copies};
        PT_CHECK(v->region(v, &r));
    }
    return PT_OK;
}

static const pt_strategy_ops OPTIMIZER = {
    .name = "optimizer", .update = optimizer_update, .state = optimizer_state, .free = free};

pt_status pt_optimizer_strategy(pt_strategy *out, pt_adamw *opt, pt_model *m, pt_trace *trace,
                                pt_state_share share) {
    PT_ASSERT(share.copies >= 1 && share.copy >= 0 && share.copy < share.copies);
    optimizer *o = pt_strategy_entry_new(out, sizeof *o, "optimizer");
    if (!o) return PT_ERR_NOMEM;
    *o = (optimizer){opt, m, trace, share};
    *out = (pt_strategy){&OPTIMIZER, o};
    return PT_OK;
}
