/* Row-wise kernels: token + position embedding and LayerNorm. Each splits its loop over the
 * kernels' thread pool by (index, count), and every reduction runs in a fixed order that does not
 * depend on the thread count, so results are bitwise the same at 1 or N
 * threads.
 *
 * Parameter gradients that sum over rows (dwte, dwpe, LayerNorm dweight and
 * dbias) are split by COLUMN range across workers, not by rows: each worker
 * owns whole output columns, so there are no races and no per-thread partial
 * buffers to allocate or combine.
 *
 * Not here: the reference versions (reference.c); GELU and the residual
 * adds, which are fused into the linears' GEMM epilogues (matmul.c, gemm.c)
 * and have no separate kernel. */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "kernels_impl.h"
#include "layernorm_impl.h"

/* Below this many elements a parallel split costs more than it saves. */
#define PAR_MIN_ELEMS 32768L

static int workers_for(long elems) {
    int n = pt_kernels_threads();
    if (elems < PAR_MIN_ELEMS) return 1;
    return n;
}

/* ---- encoder ------------------------------------------------------------ */

/* Rows of wte are gathered by token: no stream for the hardware prefetcher
 * to follow, so the kernels fetch ENC_AHEAD rows ahead themselves (B*T 2048,
 * C 384: forward 0.38 -> 0.35 ms, backward 0.36 -> 0.33 ms). */
#define ENC_AHEAD 2

typedef struct {
    float *out, *dwte, *dwpe;
    const float *dout, *wte, *wpe;
    const int *inp;
    int B, T, C;
} enc_ctx;

static void encoder_forward_part(void *p, int index, int count) {
    enc_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range((long)c->B * c->T, index, count, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        int t = (int)(r % c->T);
        float *restrict o = c->out + r * C;
        const float *restrict we = c->wte + (long)c->inp[r] * C;
        const float *restrict pe = c->wpe + (long)t * C;
        if (r + ENC_AHEAD < hi) {
            const float *wn = c->wte + (long)c->inp[r + ENC_AHEAD] * C;
            for (int i = 0; i < C; i += 16) {
                __builtin_prefetch(wn + i);
                __builtin_prefetch(o + ENC_AHEAD * C + i, 1);
            }
        }
        for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
    }
}

void pt_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                        int T, int C) {
    enc_ctx c = {.out = out, .inp = inp, .wte = wte, .wpe = wpe, .B = B, .T = T, .C = C};
    pt_pool_run(encoder_forward_part, &c, workers_for((long)B * T * C));
}

static void encoder_backward_part(void *p, int index, int count) {
    enc_ctx *c = p;
    long lo, hi;
    pt_split_range(c->C, index, count, &lo, &hi);
    long rows = (long)c->B * c->T;
    for (long r = 0; r < rows; r++) {
        int t = (int)(r % c->T);
        const float *restrict d = c->dout + r * c->C;
        float *restrict dwe = c->dwte + (long)c->inp[r] * c->C;
        float *restrict dpe = c->dwpe + (long)t * c->C;
        if (r + ENC_AHEAD < rows) {
            const float *dn = d + ENC_AHEAD * c->C;
            float *wn = c->dwte + (long)c->inp[r + ENC_AHEAD] * c->C;
            for (long i = lo; i < hi; i += 16) {
                __builtin_prefetch(dn + i);
                __builtin_prefetch(wn + i, 1);
            }
        }
        for (long i = lo; i < hi; i++) {
            dwe[i] += d[i];
            dpe[i] += d[i];
        }
    }
}

void pt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                         int C) {
    enc_ctx c = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .inp = inp, .B = B, .T = T, .C = C};
    pt_pool_run(encoder_backward_part, &c, workers_for((long)B * T * C));
}

/* ---- layernorm ------------------------------------------------------------ */

typedef struct {
    float *out, *mean, *rstd, *dinp, *dweight, *dbias;
    const float *inp, *weight, *bias, *dout;
    const float *dres; /* backward: NULL to accumulate into dinp, else dinp = dres + ... */
    const float *cmean, *crstd;
    int N, C;
} ln_ctx;

/* The two row means of LayerNorm's backward: mean(w d) and mean(w d norm). */
typedef struct {
    float dnorm_mean, dnorm_norm_mean;
} ln_sums;
static inline ln_sums ln_row_sums(const float *w, const float *d, const float *x, float m, float s,
                                  int C) {
    pt_v8f a1 = pt_v8_splat(0.0f), a2 = pt_v8_splat(0.0f);
    pt_v8f b1 = pt_v8_splat(0.0f), b2 = pt_v8_splat(0.0f);
    int i = 0;
    for (; i + 2 * PT_VW <= C; i += 2 * PT_VW) {
        pt_v8f dn = pt_v8_load(w + i) * pt_v8_load(d + i);
        pt_v8f en = pt_v8_load(w + i + PT_VW) * pt_v8_load(d + i + PT_VW);
        a1 += dn;
        a2 += dn * ((pt_v8_load(x + i) - m) * s);
        b1 += en;
        b2 += en * ((pt_v8_load(x + i + PT_VW) - m) * s);
    }
    for (; i + PT_VW <= C; i += PT_VW) {
        pt_v8f dn = pt_v8_load(w + i) * pt_v8_load(d + i);
        a1 += dn;
        a2 += dn * ((pt_v8_load(x + i) - m) * s);
    }
    float s1 = pt_v8_hsum(a1 + b1), s2 = pt_v8_hsum(a2 + b2);
    for (; i < C; i++) {
        float dn = w[i] * d[i];
        s1 += dn;
        s2 += dn * ((x[i] - m) * s);
    }
    return (ln_sums){s1 / C, s2 / C};
}

/* dinp of row n; with dw and db not NULL also adds the row into dweight and
 * dbias, the same operations as layernorm_backward_cols. Rows up to hi are
 * prefetched LN_AHEAD ahead. One function for both paths so that dinp has
 * the same bits at any thread count. */
static inline void ln_backward_row(const ln_ctx *c, long n, long hi, float *restrict dw,
                                   float *restrict db) {
    int C = c->C;
    const float *restrict w = c->weight;
    const float *restrict d = c->dout + n * C;
    const float *restrict x = c->inp + n * C;
    float *dx = c->dinp + n * C; /* may alias r */
    const float *r = (c->dres ? c->dres : c->dinp) + n * C;
    if (n + LN_AHEAD < hi) {
        ln_prefetch(d + LN_AHEAD * C, C);
        ln_prefetch(x + LN_AHEAD * C, C);
        ln_prefetch(r + LN_AHEAD * C, C);
        if (dx != r) ln_prefetch_w(dx + LN_AHEAD * C, C);
    }
    float m = c->cmean[n], s = c->crstd[n];
    ln_sums rs = ln_row_sums(w, d, x, m, s, C);
    const float dnorm_mean = rs.dnorm_mean, dnorm_norm_mean = rs.dnorm_norm_mean;
    /* explicit vectors: GCC does not vectorize this loop by itself */
    int i = 0;
    for (; i + PT_VW <= C; i += PT_VW) {
        pt_v8f di = pt_v8_load(d + i);
        pt_v8f norm = (pt_v8_load(x + i) - m) * s;
        pt_v8_store(dx + i, pt_v8_load(r + i) +
                                s * (pt_v8_load(w + i) * di - dnorm_mean - norm * dnorm_norm_mean));
        if (db) {
            pt_v8_store(db + i, pt_v8_load(db + i) + di);
            pt_v8_store(dw + i, pt_v8_load(dw + i) + norm * di);
        }
    }
    for (; i < C; i++) {
        float norm = (x[i] - m) * s;
        dx[i] = r[i] + s * (w[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean);
        if (db) {
            db[i] += d[i];
            dw[i] += norm * d[i];
        }
    }
}

static void layernorm_forward_part(void *p, int index, int count) {
    ln_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range(c->N, index, count, &lo, &hi);
    const float *restrict w = c->weight;
    const float *restrict bb = c->bias;
    for (long n = lo; n < hi; n++) {
        const float *restrict x = c->inp + n * C;
        float *restrict o = c->out + n * C;
        if (n + LN_AHEAD < hi) ln_prefetch(x + LN_AHEAD * C, C);
        float m, s;
        ln_stats(x, C, &m, &s);
        int i = 0;
        for (; i + PT_VW <= C; i += PT_VW)
            pt_v8_store(o + i,
                        (s * (pt_v8_load(x + i) - m)) * pt_v8_load(w + i) + pt_v8_load(bb + i));
        for (; i < C; i++) o[i] = (s * (x[i] - m)) * w[i] + bb[i];
        c->mean[n] = m;
        c->rstd[n] = s;
    }
}

void pt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C) {
    ln_ctx c = {.out = out,
                .mean = mean,
                .rstd = rstd,
                .inp = inp,
                .weight = weight,
                .bias = bias,
                .N = N,
                .C = C};
    pt_pool_run(layernorm_forward_part, &c, workers_for((long)N * C));
}

/* dinp, by rows. */
static void layernorm_backward_rows(void *p, int index, int count) {
    ln_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++) ln_backward_row(c, n, hi, NULL, NULL);
}

/* dweight and dbias, by column range. */
static void layernorm_backward_cols(void *p, int index, int count) {
    ln_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range(C, index, count, &lo, &hi);
    float *restrict dw = c->dweight;
    float *restrict db = c->dbias;
    for (long n = 0; n < c->N; n++) {
        const float *restrict d = c->dout + n * C;
        const float *restrict x = c->inp + n * C;
        float m = c->cmean[n], s = c->crstd[n];
        for (long i = lo; i < hi; i++) {
            db[i] += d[i];
            dw[i] += ((x[i] - m) * s) * d[i];
        }
    }
}

/* One thread: dinp, dweight and dbias in a single pass over the rows. The
 * dweight/dbias updates are the same operations in the same row order as
 * layernorm_backward_cols, so the bits match the two-pass threaded path;
 * it saves re-reading dout and inp (2 N C floats) per call. */
static void layernorm_backward_fused(ln_ctx *c) {
    for (long n = 0; n < c->N; n++) ln_backward_row(c, n, c->N, c->dweight, c->dbias);
}

static void ln_backward_run(ln_ctx *c) {
    int nw = workers_for((long)c->N * c->C);
    if (nw == 1) {
        layernorm_backward_fused(c);
        return;
    }
    pt_pool_run(layernorm_backward_rows, c, nw);
    pt_pool_run(layernorm_backward_cols, c, nw);
}

void pt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C) {
    /* no residual: ln_ctx's dres NULL accumulates into dinp */
    pt_layernorm_backward_res(dinp, NULL, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void pt_layernorm_backward_res(float *dinp, const float *dres, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C) {
    ln_ctx c = {.dinp = dinp,
                .dres = dres,
                .dweight = dweight,
                .dbias = dbias,
                .dout = dout,
                .inp = inp,
                .weight = weight,
                .cmean = mean,
                .crstd = rstd,
                .N = N,
                .C = C};
    ln_backward_run(&c);
}

/* The split passes (a zero-bubble schedule's B and W): the threaded path's
 * row and column passes on their own, so each gives the fused kernel's
 * bits (ln_backward_row's dinp at any thread count; the column pass the
 * same operations in the same row order as the one-thread fused pass). */
void pt_layernorm_backward_input(float *dinp, const float *dres, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int N, int C) {
    ln_ctx c = {.dinp = dinp,
                .dres = dres,
                .dout = dout,
                .inp = inp,
                .weight = weight,
                .cmean = mean,
                .crstd = rstd,
                .N = N,
                .C = C};
    pt_pool_run(layernorm_backward_rows, &c, workers_for((long)N * C));
}

void pt_layernorm_backward_params(float *dweight, float *dbias, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C) {
    ln_ctx c = {.dweight = dweight,
                .dbias = dbias,
                .dout = dout,
                .inp = inp,
                .cmean = mean,
                .crstd = rstd,
                .N = N,
                .C = C};
    pt_pool_run(layernorm_backward_cols, &c, workers_for((long)N * C));
}
