/* AdamW or SGD over a flat window of parameters, the LR schedule and the
 * clipping helpers. The math per element is the kernels' pt_adamw_update /
 * pt_sgd_update; this file only holds state, segments (weight decay per
 * tensor) and the step count.
 *
 * Not here: communication (a sharded optimizer sums partial norms itself). */
#include "partrain/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"

struct pt_adamw {
    size_t n;
    float *m, *v;
    pt_optim_segment *segs;
    int nsegs;
    pt_adamw_hparams hp;
    int t;
    size_t skip_off, skip_n; /* [skip_off, skip_off + skip_n): left alone */
};

pt_status pt_adamw_new(pt_adamw **out, size_t n, const pt_optim_segment *segs, int nsegs,
                       const pt_adamw_hparams *hp) {
    *out = NULL;
    size_t at = 0;
    for (int i = 0; i < nsegs; i++) {
        if (segs[i].offset != at)
            return pt_error_set(PT_ERR_INVALID, "optimizer segment %d does not follow %d", i,
                                i - 1);
        at += segs[i].n;
    }
    if (at != n)
        return pt_error_set(PT_ERR_INVALID, "optimizer segments cover %zu of %zu floats", at, n);
    pt_adamw *o = calloc(1, sizeof *o);
    if (!o) return pt_error_set(PT_ERR_NOMEM, "optimizer");
    o->n = n;
    o->hp = *hp;
    o->nsegs = nsegs;
    o->segs = malloc((size_t)(nsegs > 0 ? nsegs : 1) * sizeof *o->segs);
    int nstate = pt_optim_state_count(hp);
    if (nstate >= 1) o->m = pt_mem_alloc(PT_MEM_OPTIM, n * sizeof(float));
    if (nstate >= 2) o->v = pt_mem_alloc(PT_MEM_OPTIM, n * sizeof(float));
    if (!o->segs || (nstate >= 1 && !o->m) || (nstate >= 2 && !o->v)) {
        pt_adamw_free(o);
        return pt_error_set(PT_ERR_NOMEM, "optimizer state (%zu floats)", n);
    }
    if (nsegs) memcpy(o->segs, segs, (size_t)nsegs * sizeof *segs);
    *out = o;
    return PT_OK;
}

void pt_adamw_free(pt_adamw *o) {
    if (!o) return;
    pt_mem_free(o->v);
    pt_mem_free(o->m);
    free(o->segs);
    free(o);
}

int pt_optim_state_count(const pt_adamw_hparams *hp) {
    if (hp->kind == PT_OPTIM_SGD) return hp->momentum > 0 ? 1 : 0;
    return 2;
}

/* Segment i's pieces outside the skipped range into out (up to 2, each a
 * segment of the window); returns their count. */
static int pieces(const pt_adamw *o, int i, pt_optim_segment out[2]) {
    pt_optim_segment s = o->segs[i];
    size_t a = o->skip_off, z = o->skip_off + o->skip_n, end = s.offset + s.n;
    if (o->skip_n == 0 || z <= s.offset || a >= end) {
        out[0] = s;
        return 1;
    }
    int k = 0;
    if (a > s.offset) out[k++] = (pt_optim_segment){s.offset, a - s.offset, s.decay};
    if (z < end) out[k++] = (pt_optim_segment){z, end - z, s.decay};
    return k;
}

void pt_adamw_set_skip(pt_adamw *o, size_t off, size_t n) {
    PT_ASSERT(off + n <= o->n);
    o->skip_off = off;
    o->skip_n = n;
}

void pt_adamw_skip(const pt_adamw *o, size_t *off, size_t *n) {
    *off = o->skip_off;
    *n = o->skip_n;
}

/* SGD on the window: per segment, its decay flag picks the weight decay. */
static void sgd_step(pt_adamw *o, float *params, const float *grads, float lr, float grad_scale) {
    pt_optim_segment piece[2];
    for (int i = 0; i < o->nsegs; i++)
        for (int j = 0, k = pieces(o, i, piece); j < k; j++) {
            const pt_optim_segment *s = &piece[j];
            pt_sgd_update(params + s->offset, grads + s->offset, o->m ? o->m + s->offset : NULL,
                          (long)s->n, lr, o->hp.momentum, s->decay ? o->hp.weight_decay : 0.0f,
                          grad_scale);
        }
}

void pt_adamw_step(pt_adamw *o, float *params, const float *grads, float lr, float grad_scale) {
    o->t++;
    if (o->hp.kind == PT_OPTIM_SGD) {
        sgd_step(o, params, grads, lr, grad_scale);
        return;
    }
    pt_optim_segment piece[2];
    for (int i = 0; i < o->nsegs; i++)
        for (int j = 0, k = pieces(o, i, piece); j < k; j++) {
            const pt_optim_segment *s = &piece[j];
            pt_adamw_update(params + s->offset, grads + s->offset, o->m + s->offset,
                            o->v + s->offset, (long)s->n, lr, o->hp.beta1, o->hp.beta2, o->hp.eps,
                            s->decay ? o->hp.weight_decay : 0.0f, o->t, grad_scale);
        }
}

double pt_adamw_step_sumsq(pt_adamw *o, float *params, const float *grads, float lr) {
    double sumsq = 0.0;
    if (o->hp.kind == PT_OPTIM_SGD) {
        /* SGD reads each element once anyway: the sum first, per segment (the
         * same slices as the fused AdamW pass, so the same bits) */
        pt_optim_segment piece[2];
        for (int i = 0; i < o->nsegs; i++)
            for (int j = 0, k = pieces(o, i, piece); j < k; j++)
                sumsq += pt_sum_squares(grads + piece[j].offset, (long)piece[j].n);
        pt_adamw_step(o, params, grads, lr, 1.0f);
        return sumsq;
    }
    o->t++;
    pt_optim_segment piece[2];
    for (int i = 0; i < o->nsegs; i++)
        for (int j = 0, k = pieces(o, i, piece); j < k; j++) {
            const pt_optim_segment *s = &piece[j];
            sumsq +=
                pt_adamw_update_sumsq(params + s->offset, grads + s->offset, o->m + s->offset,
                                      o->v + s->offset, (long)s->n, lr, o->hp.beta1, o->hp.beta2,
                                      o->hp.eps, s->decay ? o->hp.weight_decay : 0.0f, o->t, 1.0f);
        }
    return sumsq;
}

float *pt_adamw_m(pt_adamw *o) {
    return o->m;
}
float *pt_adamw_v(pt_adamw *o) {
    return o->v;
}
size_t pt_adamw_size(const pt_adamw *o) {
    return o->n;
}
pt_optim_kind pt_adamw_kind(const pt_adamw *o) {
    return o->hp.kind;
}
int pt_adamw_t(const pt_adamw *o) {
    return o->t;
}
void pt_adamw_set_t(pt_adamw *o, int t) {
    o->t = t;
}

float pt_lr_schedule(int step, int total, int warmup, float lr, float min_lr) {
    if (step < warmup) return lr * (float)(step + 1) / (float)warmup;
    int decay_steps = total - warmup - 1;
    if (decay_steps <= 0) return lr;
    double progress = (double)(step - warmup) / (double)decay_steps;
    if (progress > 1) progress = 1;
    double c = 0.5 * (1.0 + cos(M_PI * progress));
    return (float)(min_lr + c * (lr - min_lr));
}

double pt_optim_grad_sumsq(const float *g, size_t n) {
    return pt_sum_squares(g, (long)n);
}

float pt_optim_clip_scale(double total_sumsq, float max_norm) {
    if (max_norm <= 0) return 1.0f;
    double norm = sqrt(total_sumsq);
    if (!(norm > max_norm)) return 1.0f; /* also when the norm is NaN: let it show */
    return (float)(max_norm / norm);
}
