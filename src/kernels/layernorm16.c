/* LayerNorm with bf16 outputs, for a bf16 model (kernels.h, "bf16
 * kernels"): the forward writes the normalized row in bf16 (the next
 * product's operand) and, for a LayerNorm whose input the model does not
 * keep, x_hat = (x - mean) * rstd in bf16, from which the backward works
 * instead of x. Statistics and gradients are fp32; the row statistics are
 * the fp32 kernel's (layernorm_impl.h), the splits elementwise.c's: rows
 * for the forward and the input gradient, columns for the parameter
 * gradients, each a fixed order, so the bits do not depend on the thread
 * count.
 *
 * Why x_hat: |x_hat| is O(1), so its bf16 rounding is 2^-9 of it; x in
 * bf16 would carry an error of 2^-9 |x|, and (x - mean) * rstd multiplies
 * it by |x| / std, large on the residual stream's outlier channels.
 *
 * Not here: the fp32 LayerNorm (elementwise.c). */
#include <math.h>
#include <string.h>

#include "bf16_vec.h"
#include "kernels_impl.h"
#include "layernorm_impl.h"

#define PAR_MIN_ELEMS 32768L

static int workers_for(long elems) {
    return elems < PAR_MIN_ELEMS ? 1 : pt_kernels_threads();
}

typedef struct {
    pt_bf16 *out16, *xhat;
    const pt_bf16 *cxhat;
    float *mean, *rstd, *dinp, *dweight, *dbias;
    const float *inp, *weight, *bias, *dout, *dres, *cmean, *crstd;
    int N, C;
} ln16_ctx;

/* out16 row from the normalized row norm (fp32) or from x_hat (bf16). */
static inline void out_row(pt_bf16 *restrict o, const float *restrict x, const pt_bf16 *xh, float m,
                           float s, const float *restrict w, const float *restrict b, int C) {
    int i = 0;
    if (xh) {
        for (; i + PT_VW <= C; i += PT_VW)
            pt_v8_store16(o + i, pt_v8_load16(xh + i) * pt_v8_load(w + i) + pt_v8_load(b + i));
        for (; i < C; i++) o[i] = pt_bf16_of(pt_f32_of16(xh[i]) * w[i] + b[i]);
        return;
    }
    for (; i + PT_VW <= C; i += PT_VW)
        pt_v8_store16(o + i, (s * (pt_v8_load(x + i) - m)) * pt_v8_load(w + i) + pt_v8_load(b + i));
    for (; i < C; i++) o[i] = pt_bf16_of((s * (x[i] - m)) * w[i] + b[i]);
}

static void forward_part(void *p, int index, int count) {
    ln16_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++) {
        const float *restrict x = c->inp + n * C;
        if (n + LN_AHEAD < hi) ln_prefetch(x + LN_AHEAD * C, C);
        float m, s;
        ln_stats(x, C, &m, &s);
        c->mean[n] = m;
        c->rstd[n] = s;
        pt_bf16 *xh = NULL;
        if (c->xhat) {
            xh = c->xhat + n * C;
            int i = 0;
            for (; i + PT_VW <= C; i += PT_VW) pt_v8_store16(xh + i, s * (pt_v8_load(x + i) - m));
            for (; i < C; i++) xh[i] = pt_bf16_of(s * (x[i] - m));
        }
        out_row(c->out16 + n * C, x, xh, m, s, c->weight, c->bias, C);
    }
}

void pt_layernorm_forward16(pt_bf16 *out16, pt_bf16 *xhat, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N,
                            int C) {
    ln16_ctx c = {.out16 = out16,
                  .xhat = xhat,
                  .mean = mean,
                  .rstd = rstd,
                  .inp = inp,
                  .weight = weight,
                  .bias = bias,
                  .N = N,
                  .C = C};
    pt_pool_run(forward_part, &c, workers_for((long)N * C));
}

static void out_part(void *p, int index, int count) {
    ln16_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++) {
        const float *x = c->cxhat ? NULL : c->inp + n * C;
        float m = c->cxhat ? 0.0f : c->cmean[n], s = c->cxhat ? 0.0f : c->crstd[n];
        out_row(c->out16 + n * C, x, c->cxhat ? c->cxhat + n * C : NULL, m, s, c->weight, c->bias,
                C);
    }
}

void pt_layernorm_out16(pt_bf16 *out16, const float *inp, const pt_bf16 *xhat, const float *mean,
                        const float *rstd, const float *weight, const float *bias, int N, int C) {
    ln16_ctx c = {.out16 = out16,
                  .cxhat = xhat,
                  .inp = inp,
                  .cmean = mean,
                  .crstd = rstd,
                  .weight = weight,
                  .bias = bias,
                  .N = N,
                  .C = C};
    pt_pool_run(out_part, &c, workers_for((long)N * C));
}

/* dinp of row n from x_hat: dinp = r + rstd (w d - mean(w d) - x_hat
 * mean(w d x_hat)), r the residual's gradient (dres, or dinp itself). */
static void input_part(void *p, int index, int count) {
    ln16_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range(c->N, index, count, &lo, &hi);
    const float *restrict w = c->weight;
    for (long n = lo; n < hi; n++) {
        const float *restrict d = c->dout + n * C;
        const pt_bf16 *restrict xh = c->cxhat + n * C;
        float *dx = c->dinp + n * C;
        const float *r = (c->dres ? c->dres : c->dinp) + n * C;
        if (n + LN_AHEAD < hi) ln_prefetch(d + LN_AHEAD * C, C);
        float s = c->crstd[n];
        pt_v8f a1 = pt_v8_splat(0.0f), a2 = pt_v8_splat(0.0f);
        int i = 0;
        for (; i + PT_VW <= C; i += PT_VW) {
            pt_v8f dn = pt_v8_load(w + i) * pt_v8_load(d + i);
            a1 += dn;
            a2 += dn * pt_v8_load16(xh + i);
        }
        float s1 = pt_v8_hsum(a1), s2 = pt_v8_hsum(a2);
        for (; i < C; i++) {
            float dn = w[i] * d[i];
            s1 += dn;
            s2 += dn * pt_f32_of16(xh[i]);
        }
        float m1 = s1 / C, m2 = s2 / C;
        for (i = 0; i + PT_VW <= C; i += PT_VW)
            pt_v8_store(dx + i, pt_v8_load(r + i) + s * (pt_v8_load(w + i) * pt_v8_load(d + i) -
                                                         m1 - pt_v8_load16(xh + i) * m2));
        for (; i < C; i++) dx[i] = r[i] + s * (w[i] * d[i] - m1 - pt_f32_of16(xh[i]) * m2);
    }
}

void pt_layernorm16_backward_input(float *dinp, const float *dres, const float *dout,
                                   const pt_bf16 *xhat, const float *weight, const float *rstd,
                                   int N, int C) {
    ln16_ctx c = {.dinp = dinp,
                  .dres = dres,
                  .dout = dout,
                  .cxhat = xhat,
                  .weight = weight,
                  .crstd = rstd,
                  .N = N,
                  .C = C};
    pt_pool_run(input_part, &c, workers_for((long)N * C));
}

/* dweight += sum over rows of x_hat d, dbias += sum of d: by column range,
 * rows in order. */
static void params_part(void *p, int index, int count) {
    ln16_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range(C, index, count, &lo, &hi);
    float *restrict dw = c->dweight, *restrict db = c->dbias;
    for (long n = 0; n < c->N; n++) {
        const float *restrict d = c->dout + n * C;
        const pt_bf16 *restrict xh = c->cxhat + n * C;
        for (long i = lo; i < hi; i++) {
            db[i] += d[i];
            dw[i] += pt_f32_of16(xh[i]) * d[i];
        }
    }
}

void pt_layernorm16_backward_params(float *dweight, float *dbias, const float *dout,
                                    const pt_bf16 *xhat, int N, int C) {
    ln16_ctx c = {.dweight = dweight, .dbias = dbias, .dout = dout, .cxhat = xhat, .N = N, .C = C};
    pt_pool_run(params_part, &c, workers_for((long)N * C));
}
