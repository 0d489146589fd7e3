/* The global gradient norm over the mesh, counting every parameter once.
 *
 * A rank's gradient elements are of two kinds: SPLIT (a slice of a tensor
 * that tensor parallelism shards: each tp rank holds different elements)
 * and WHOLE (LayerNorms, row-parallel biases, wpe: every tp rank holds the
 * same elements with the same gradient). The global sum of squares is the
 * split part summed over the tp group plus the whole part once; a sharded
 * data-parallel strategy (ZeRO) first sums both parts over the group its
 * shards are spread on. With tp = 1 (no tp group) nothing is exchanged and
 * the result is the local sum, bitwise what it was before the mesh.
 *
 * Not here: clipping (optim), the optimizer step. */
#include "partrain/parallel.h"

void pt_grad_sumsq_parts(const pt_model *m, const float *g, size_t off, size_t n, double parts[2]) {
    parts[0] = parts[1] = 0;
    int nt = pt_model_num_tensors(m);
    size_t end = off + n;
    for (int i = 0; i < nt; i++) {
        const pt_param_info *p = pt_model_tensor(m, i);
        size_t a = p->offset > off ? p->offset : off;
        size_t z = p->offset + p->numel < end ? p->offset + p->numel : end;
        if (a >= z) continue;
        parts[p->shard.split_dim >= 0 ? 0 : 1] += pt_optim_grad_sumsq(g + (a - off), z - a);
    }
}

/* x summed over c as a (hi, lo) float pair: the comm layer reduces floats,
 * and one float would drop the sum's low bits. */
static pt_status sum_double(pt_comm *c, double *x, int k) {
    float hl[4];
    for (int i = 0; i < k; i++) {
        hl[2 * i] = (float)x[i];
        hl[2 * i + 1] = (float)(x[i] - (double)hl[2 * i]);
    }
    PT_CHECK(pt_comm_allreduce(c, hl, (size_t)(2 * k), PT_REDUCE_SUM));
    for (int i = 0; i < k; i++) x[i] = (double)hl[2 * i] + (double)hl[2 * i + 1];
    return PT_OK;
}

pt_status pt_grad_parts_sum(pt_comm *c, double parts[2]) {
    return sum_double(c, parts, 2);
}

pt_status pt_grad_sumsq_global(pt_comm *shard_group, pt_comm *tp, pt_comm *pp,
                               const double parts[2], double *sumsq) {
    double p[2] = {parts[0], parts[1]};
    if (shard_group) PT_CHECK(sum_double(shard_group, p, 2));
    if (tp) PT_CHECK(sum_double(tp, p, 1)); /* the split part only */
    double total = p[0] + p[1];
    if (pp) PT_CHECK(sum_double(pp, &total, 1)); /* the stages hold disjoint modules */
    *sumsq = total;
    return PT_OK;
}

/* ---- the norm's stack entries: tp, then pp (pt_grad_sumsq_global's order) ---- */

static pt_status tp_norm(void *self, double parts[2]) {
    return sum_double(self, parts, 1); /* the split part only */
}

static pt_status pp_norm(void *self, double parts[2]) {
    double total = parts[0] + parts[1]; /* the stages hold disjoint modules */
    PT_CHECK(sum_double(self, &total, 1));
    parts[0] = total;
    parts[1] = 0;
    return PT_OK;
}

static const pt_strategy_ops TP_NORM = {.name = "tp_norm", .norm = tp_norm};
static const pt_strategy_ops PP_NORM = {.name = "pp_norm", .norm = pp_norm};

pt_status pt_tp_norm_strategy(pt_strategy *out, pt_comm *tp) {
    *out = tp ? (pt_strategy){&TP_NORM, tp} : (pt_strategy){0};
    return PT_OK;
}

pt_status pt_pp_norm_strategy(pt_strategy *out, pt_comm *pp) {
    *out = pp ? (pt_strategy){&PP_NORM, pp} : (pt_strategy){0};
    return PT_OK;
}
