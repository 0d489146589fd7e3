/* Sharded data parallel, ZeRO stages 1 and 2 (parallel.h). The unit of
 * sharding is a module's region of the flat buffers: rank r of the shard
 * group owns pt_comm_shard(count, g, r) of every module, so each in-place
 * reduce-scatter / all-gather covers exactly one module and a rank's shard
 * is a set of slices (one per module), each with its own AdamW state.
 *
 * Exactness: the update of an element is the single-worker AdamW update of
 * the same (all-reduced or reduce-scattered) gradient; only the float sum
 * order of the gradient differs (as in plain data parallel). The global
 * norm is the sum of the ranks' partial squares; the partial sums are
 * computed in double and carried through the float all-reduce as a hi + lo
 * pair, so the total keeps ~48 bits.
 *
 * Not here: data sharding, loss scaling (trainer), the all-reduce buckets of
 * stage 1 (pt_ddp). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

typedef struct {
    size_t off, count; /* the module's region */
    size_t soff, sn;   /* this rank's slice of it (absolute offset) */
    pt_adamw *opt;     /* NULL when sn == 0 */
} piece;

struct pt_zero {
    pt_model *m;
    pt_comm *group; /* shard group (owned) */
    pt_comm *cross; /* same index across groups (owned; NULL: one group) */
    int stage, g, grank;
    int np;
    piece *p;
    pt_comm_req **reqs; /* per module: the reduce-scatter in flight */
    int active, launch_now;
    pt_status err;
    char errmsg[256];
    uint64_t bytes_seen;
};

static uint64_t comm_sent(pt_comm *c) {
    if (!c) return 0;
    pt_comm_stats s;
    pt_comm_get_stats(c, &s);
    uint64_t b = 0;
    for (int k = 0; k < PT_OP_COUNT; k++) b += s.bytes_sent[k];
    return b;
}

pt_status pt_zero_new(pt_zero **out, pt_model *m, pt_comm *world, const pt_zero_options *opt,
                      const pt_adamw_hparams *hp) {
    *out = NULL;
    int W = pt_comm_size(world), r = pt_comm_rank(world);
    int g = opt->group > 0 ? opt->group : W;
    if (opt->stage < 1 || opt->stage > 2)
        return pt_error_set(PT_ERR_INVALID, "zero: stage %d (1 or 2 here)", opt->stage);
    if (g > W || W % g != 0)
        return pt_error_set(PT_ERR_INVALID, "parallel.zero_group (%d) must divide parallel.dp (%d)",
                            g, W);
    pt_status st = PT_OK;
    pt_zero *z = calloc(1, sizeof *z);
    if (!z) return pt_error_set(PT_ERR_NOMEM, "zero");
    z->m = m;
    z->stage = opt->stage;
    z->g = g;
    z->active = 0;
    PT_CHECK_GOTO(st, pt_comm_split(world, r / g, r, &z->group), fail);
    if (g < W) PT_CHECK_GOTO(st, pt_comm_split(world, r % g, r, &z->cross), fail);
    z->grank = pt_comm_rank(z->group);
    z->np = pt_model_num_modules(m);
    z->p = calloc((size_t)z->np, sizeof *z->p);
    z->reqs = calloc((size_t)z->np, sizeof *z->reqs);
    int ntens = pt_model_num_tensors(m);
    pt_optim_segment *segs = malloc((size_t)ntens * sizeof *segs);
    if (!z->p || !z->reqs || !segs) {
        free(segs);
        st = pt_error_set(PT_ERR_NOMEM, "zero tables");
        goto fail;
    }
    for (int i = 0; i < z->np; i++) {
        piece *pc = &z->p[i];
        pt_model_module_region(m, i, &pc->off, &pc->count);
        size_t so, sn;
        pt_comm_shard(pc->count, g, z->grank, &so, &sn);
        pc->soff = pc->off + so;
        pc->sn = sn;
        if (!sn) continue;
        /* segments: the tensors intersected with the slice (a cut tensor
         * keeps its decay flag on both sides of the cut) */
        int ns = 0;
        for (int k = 0; k < ntens; k++) {
            const pt_param_info *t = pt_model_tensor(m, k);
            size_t a = t->offset > pc->soff ? t->offset : pc->soff;
            size_t e = t->offset + t->numel < pc->soff + sn ? t->offset + t->numel : pc->soff + sn;
            if (a < e) segs[ns++] = (pt_optim_segment){a - pc->soff, e - a, t->decay};
        }
        st = pt_adamw_new(&pc->opt, sn, segs, ns, hp);
        if (st != PT_OK) {
            free(segs);
            goto fail;
        }
    }
    free(segs);
    z->bytes_seen = comm_sent(z->group) + comm_sent(z->cross);
    *out = z;
    return PT_OK;
fail:
    pt_zero_free(z);
    return st;
}

void pt_zero_free(pt_zero *z) {
    if (!z) return;
    for (int i = 0; z->reqs && i < z->np; i++)
        if (z->reqs[i]) pt_comm_wait(z->reqs[i]);
    for (int i = 0; z->p && i < z->np; i++) pt_adamw_free(z->p[i].opt);
    free(z->reqs);
    free(z->p);
    pt_comm_free(z->cross);
    pt_comm_free(z->group);
    free(z);
}

void pt_zero_begin(pt_zero *z, int launch, long step) {
    (void)step;
    z->active = 1;
    z->launch_now = launch;
}

static void launch_rs(pt_zero *z, int i) {
    if (z->reqs[i] || z->err != PT_OK) return;
    piece *pc = &z->p[i];
    pt_status st = pt_comm_ireduce_scatter(z->group, pt_model_grads(z->m) + pc->off, pc->count,
                                           PT_REDUCE_SUM, &z->reqs[i]);
    if (st != PT_OK) {
        z->err = st;
        snprintf(z->errmsg, sizeof z->errmsg, "%s", pt_error_message());
        z->reqs[i] = NULL;
    }
}

void pt_zero_module_done(pt_zero *z, int module) {
    if (z->stage < 2 || !z->active || !z->launch_now) return;
    launch_rs(z, module);
}

/* Wait for every request in reqs[0..n); the first error wins. */
static pt_status wait_all(pt_comm_req **reqs, int n, pt_status st, char *msg, size_t msgn) {
    for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        pt_status e = pt_comm_wait(reqs[i]);
        reqs[i] = NULL;
        if (e != PT_OK && st == PT_OK) {
            st = e;
            snprintf(msg, msgn, "%s", pt_error_message());
        }
    }
    return st;
}

pt_status pt_zero_step(pt_zero *z, float lr, float max_norm, float *norm) {
    float *grads = pt_model_grads(z->m), *params = pt_model_params(z->m);
    pt_status st = PT_OK;
    if (z->stage >= 2) {
        /* backward order: the head first, the embedding last */
        for (int i = z->np - 1; i >= 0; i--) launch_rs(z, i);
        z->active = 0;
        st = wait_all(z->reqs, z->np, z->err, z->errmsg, sizeof z->errmsg);
        z->err = PT_OK;
        if (st != PT_OK) return pt_error_set(st, "gradient reduce-scatter: %s", z->errmsg);
        if (z->cross) {
            for (int i = z->np - 1; i >= 0 && st == PT_OK; i--)
                if (z->p[i].sn)
                    st = pt_comm_iallreduce(z->cross, grads + z->p[i].soff, z->p[i].sn,
                                            PT_REDUCE_SUM, &z->reqs[i]);
            if (st != PT_OK) snprintf(z->errmsg, sizeof z->errmsg, "%s", pt_error_message());
            st = wait_all(z->reqs, z->np, st, z->errmsg, sizeof z->errmsg);
            if (st != PT_OK)
                return pt_error_set(st, "gradient all-reduce across groups: %s", z->errmsg);
        }
    }
    /* global norm: partial squares of the slices, summed over the group */
    double part = 0;
    for (int i = 0; i < z->np; i++) part += pt_optim_grad_sumsq(grads + z->p[i].soff, z->p[i].sn);
    float hl[2];
    hl[0] = (float)part;
    hl[1] = (float)(part - (double)hl[0]);
    PT_CHECK(pt_comm_allreduce(z->group, hl, 2, PT_REDUCE_SUM));
    double total = (double)hl[0] + (double)hl[1];
    float scale = pt_optim_clip_scale(total, max_norm);
    for (int i = 0; i < z->np; i++)
        if (z->p[i].opt)
            pt_adamw_step(z->p[i].opt, params + z->p[i].soff, grads + z->p[i].soff, lr, scale);
    for (int i = 0; i < z->np && st == PT_OK; i++)
        st = pt_comm_iallgather(z->group, params + z->p[i].off, z->p[i].count, &z->reqs[i]);
    if (st != PT_OK) snprintf(z->errmsg, sizeof z->errmsg, "%s", pt_error_message());
    st = wait_all(z->reqs, z->np, st, z->errmsg, sizeof z->errmsg);
    if (st != PT_OK) return pt_error_set(st, "parameter all-gather: %s", z->errmsg);
    *norm = (float)sqrt(total);
    return PT_OK;
}

uint64_t pt_zero_take_bytes(pt_zero *z) {
    uint64_t now = comm_sent(z->group) + comm_sent(z->cross);
    uint64_t d = now - z->bytes_seen;
    z->bytes_seen = now;
    return d;
}

pt_status pt_zero_gather_optim(pt_zero *z, float *m_full, float *v_full, int *t) {
    *t = 0;
    for (int i = 0; i < z->np; i++) {
        piece *pc = &z->p[i];
        if (!pc->opt) continue;
        memcpy(m_full + pc->soff, pt_adamw_m(pc->opt), pc->sn * sizeof(float));
        memcpy(v_full + pc->soff, pt_adamw_v(pc->opt), pc->sn * sizeof(float));
        *t = pt_adamw_t(pc->opt);
    }
    for (int i = 0; i < z->np; i++) {
        PT_CHECK(pt_comm_allgather(z->group, m_full + z->p[i].off, z->p[i].count));
        PT_CHECK(pt_comm_allgather(z->group, v_full + z->p[i].off, z->p[i].count));
    }
    float tf[1] = {(float)*t};
    PT_CHECK(pt_comm_allreduce(z->group, tf, 1, PT_REDUCE_SUM));
    *t = (int)lroundf(tf[0] / (float)z->g); /* every rank has the same count */
    return PT_OK;
}

void pt_zero_load_optim(pt_zero *z, const float *m_full, const float *v_full, int t) {
    for (int i = 0; i < z->np; i++) {
        piece *pc = &z->p[i];
        if (!pc->opt) continue;
        memcpy(pt_adamw_m(pc->opt), m_full + pc->soff, pc->sn * sizeof(float));
        memcpy(pt_adamw_v(pc->opt), v_full + pc->soff, pc->sn * sizeof(float));
        pt_adamw_set_t(pc->opt, t);
    }
}

size_t pt_zero_optim_bytes(const pt_zero *z) {
    size_t b = 0;
    for (int i = 0; i < z->np; i++) b += 2 * z->p[i].sn * sizeof(float);
    return b;
}
