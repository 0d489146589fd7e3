/* The bf16 kernels of a bf16 model (kernels.h, "bf16 kernels"), on every
 * bf16 path the running CPU has and on the fallback, forced (what an
 * AVX2-only CI machine runs), each against an oracle:
 *
 *   linears: an fp32 operand rounded as the product reads it gives
 *     bitwise the product of the rounded copy (column sums too); the
 *     epilogue's bf16 outputs are the rounding of its fp32 ones, and the
 *     GELU output is bitwise pt_gelu_forward16 of the kept pre-activation
 *     (a recompute's); GELU's derivative from pre16 is bitwise the fp32
 *     epilogue's on the widened pre16.
 *   LayerNorm: mean and rstd bitwise the fp32 kernel's, out16 the rounding
 *     of the fp32 output (without x_hat), the recompute bitwise the
 *     forward; the backward from x_hat against double precision on the
 *     same x_hat (fp32 sums: 1e-5).
 *   attention: against double precision with the kernel's rounding points
 *     (P and dS in bf16, dO rounded): each rounded value may land one bf16
 *     step away from the oracle's (2^-8 relative), so an output is within
 *     2^-7 of the sum of its terms' magnitudes plus its own rounding; P's
 *     rows sum to 1 within that and are zero past the diagonal in the
 *     packed layout.
 *   cross-entropy in blocks: the loss against the fused fp32 kernel
 *     (float rounding: 1e-5), the gradient within the bf16 rounding of l
 *     - m (2^-9 |l - m|) and of the result (2^-8); three simulated
 *     vocabulary-parallel ranks against one.
 * Every kernel: the same bits at 1, 2 and 3 threads on a path. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "partrain/kernels.h"
#include "../../src/kernels/bf16_impl.h"
#include "pt_test.h"
#define KT_SEED 4041
#include "kernel_test.h"

static float r16(float x) {
    pt_bf16 b;
    pt_bf16_from_f32(&b, &x, 1);
    float f;
    pt_bf16_to_f32(&f, &b, 1);
    return f;
}
static float f16(pt_bf16 b) {
    float f;
    pt_bf16_to_f32(&f, &b, 1);
    return f;
}
static float *rndf(long n, double scale) {
    float *x = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = (float)(urand() * scale);
    return x;
}
static pt_bf16 *rnd16(long n, double scale) {
    float *x = rndf(n, scale);
    pt_bf16 *b = malloc((size_t)n * sizeof(pt_bf16));
    pt_bf16_from_f32(b, x, (size_t)n);
    free(x);
    return b;
}
static pt_bf16 *to16(const float *x, long n) {
    pt_bf16 *b = malloc((size_t)n * sizeof(pt_bf16));
    pt_bf16_from_f32(b, x, (size_t)n);
    return b;
}

/* The bf16 paths to test: the best one and, where it is another, the
 * fallback. Returns how many, into paths. */
static int bf16_paths(int *paths) {
    int n = 0;
    if (pt_gemm_bf16_has_path(PT_BF16_AMX)) paths[n++] = PT_BF16_AMX;
    if (pt_gemm_bf16_has_path(PT_BF16_AVX512)) paths[n++] = PT_BF16_AVX512;
    paths[n++] = PT_BF16_FALLBACK;
    return n;
}
static const char *path_name(int p) {
    return p == PT_BF16_AMX ? "amx" : p == PT_BF16_AVX512 ? "avx512_bf16" : "fallback";
}

/* ---- linears ---- */

static void linears_case(int N, int C, int OC) {
    pt_bf16 *inp = rnd16((long)N * C, 1), *w = rnd16((long)C * OC, 0.3);
    float *bias = rndf(OC, 0.2), *dout = rndf((long)N * OC, 1);
    pt_bf16 *dout16 = to16(dout, (long)N * OC);
    size_t nc = (size_t)N * OC, ni = (size_t)N * C;
    float *pre = malloc(nc * 4), *dinp = malloc(ni * 4), *dinp_b = malloc(ni * 4),
          *dw = calloc((size_t)C * OC, 4), *dw_b = calloc((size_t)C * OC, 4),
          *db = calloc((size_t)OC, 4), *db_b = calloc((size_t)OC, 4);
    pt_bf16 *pre16 = malloc(nc * 2), *act16 = malloc(nc * 2), *act_b = malloc(nc * 2);
    /* c_fc: pre16 = bf16(pre), act16 = gelu16(pre16) */
    pt_matmul16_gelu_forward(pre, pre16, act16, inp, w, bias, N, C, OC);
    int ok = 1;
    for (size_t i = 0; i < nc && ok; i++) ok = f16(pre16[i]) == r16(pre[i]);
    CHECK(ok);
    pt_gelu_forward16(act_b, pre16, nc);
    CHECK(!memcmp(act_b, act16, nc * 2));
    /* the fp32 dout rounded as read = the product of the rounded copy:
     * dinp (N,C) = dout (N,OC) @ w^T */
    pt_matmul16_backward_input_set(dinp, dout, w, N, C, OC);
    pt_gemm_bf16(0, 1, N, C, OC, dout16, OC, w, OC, 0.0f, dinp_b, C, NULL);
    CHECK(!memcmp(dinp, dinp_b, ni * 4));
    /* weight gradients: fp32 dout vs its bf16 copy, with the bias sums */
    pt_matmul16_backward_weight(dw, db, dout, NULL, inp, N, C, OC);
    pt_matmul16_backward_weight(dw_b, db_b, NULL, dout16, inp, N, C, OC);
    CHECK(!memcmp(dw, dw_b, (size_t)C * OC * 4));
    CHECK(!memcmp(db, db_b, (size_t)OC * 4));
    free(inp), free(w), free(bias), free(dout), free(dout16), free(pre), free(dinp), free(dinp_b),
        free(dw), free(dw_b), free(db), free(db_b), free(pre16), free(act16), free(act_b);
}

/* GELU's derivative epilogue: dpre (N,C) = gelu'(pre16) * (dout (N,OC) @
 * w^T), w (C,OC), against the fp32-pre epilogue on the widened pre16. */
static void gelu_grad_case(int N, int C, int OC) {
    pt_bf16 *w = rnd16((long)C * OC, 0.3), *pre16 = rnd16((long)N * C, 2);
    float *dout = rndf((long)N * OC, 1), *pre = malloc((size_t)N * C * 4);
    pt_bf16 *dout16 = to16(dout, (long)N * OC);
    float *a = malloc((size_t)N * C * 4), *b = malloc((size_t)N * C * 4);
    pt_bf16_to_f32(pre, pre16, (size_t)N * C);
    pt_matmul16_backward_input_gelu_set(a, dout, w, pre16, N, C, OC);
    pt_gemm_epilogue e = {.pre = pre};
    pt_gemm_bf16(0, 1, N, C, OC, dout16, OC, w, OC, 0.0f, b, C, &e);
    CHECK(!memcmp(a, b, (size_t)N * C * 4));
    free(w), free(pre16), free(dout), free(pre), free(dout16), free(a), free(b);
}

static void test_linears(void) {
    int paths[3], np = bf16_paths(paths);
    for (int p = 0; p < np; p++) {
        int old = pt_gemm_bf16_set_path(paths[p]);
        static const int T[] = {1, 2, 3};
        for (int t = 0; t < 3; t++) {
            pt_kernels_set_threads(T[t]);
            linears_case(37, 45, 70);
            linears_case(130, 96, 200);
            gelu_grad_case(50, 70, 33);
            gelu_grad_case(200, 128, 96);
        }
        pt_kernels_set_threads(1);
        pt_gemm_bf16_set_path(old);
    }
}

/* ---- LayerNorm ---- */

static void test_layernorm(void) {
    int N = 70, C = 99;
    float *x = rndf((long)N * C, 3), *w = rndf(C, 1), *b = rndf(C, 0.5);
    for (int i = 0; i < N * C; i++) x[i] += (float)(i % 7); /* rows with a mean */
    float *out = malloc((size_t)N * C * 4), *m = malloc(N * 4), *s = malloc(N * 4),
          *m2 = malloc(N * 4), *s2 = malloc(N * 4);
    pt_bf16 *o16 = malloc((size_t)N * C * 2), *o16b = malloc((size_t)N * C * 2),
            *xh = malloc((size_t)N * C * 2);
    pt_layernorm_forward(out, m, s, x, w, b, N, C);
    static const int TH[] = {1, 2, 3};
    for (int t = 0; t < 3; t++) {
        pt_kernels_set_threads(TH[t]);
        pt_layernorm_forward16(o16, NULL, m2, s2, x, w, b, N, C);
        CHECK(!memcmp(m, m2, N * 4) && !memcmp(s, s2, N * 4));
        int ok = 1;
        for (int i = 0; i < N * C && ok; i++) ok = f16(o16[i]) == r16(out[i]);
        CHECK(ok);
        pt_layernorm_out16(o16b, x, NULL, m2, s2, w, b, N, C);
        CHECK(!memcmp(o16, o16b, (size_t)N * C * 2));
        /* with x_hat: x_hat within one rounding of the exact one, out16 from it */
        pt_layernorm_forward16(o16, xh, m2, s2, x, w, b, N, C);
        int bad = 0;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) {
                double xe = ((double)x[n * C + c] - m[n]) * s[n], xv = f16(xh[n * C + c]);
                if (fabs(xv - xe) > fabs(xe) * 0x1p-8 + 1e-6) bad++;
                if (f16(o16[n * C + c]) != r16(xv * w[c] + b[c]) &&
                    fabs(f16(o16[n * C + c]) - (xv * w[c] + b[c])) >
                        fabs(xv * w[c] + b[c]) * 0x1p-7 + 1e-7)
                    bad++;
            }
        CHECK_EQ(bad, 0);
        pt_layernorm_out16(o16b, NULL, xh, NULL, NULL, w, b, N, C);
        CHECK(!memcmp(o16, o16b, (size_t)N * C * 2));
        /* backward from x_hat against double */
        float *d = rndf((long)N * C, 1), *res = rndf((long)N * C, 1),
              *dx = malloc((size_t)N * C * 4), *dw = calloc(C, 4), *db = calloc(C, 4);
        pt_layernorm16_backward_input(dx, res, d, xh, w, s2, N, C);
        pt_layernorm16_backward_params(dw, db, d, xh, N, C);
        bad = 0;
        for (int n = 0; n < N; n++) {
            double s1 = 0, sm = 0, mag = 0;
            for (int c = 0; c < C; c++) {
                double dn = (double)w[c] * d[n * C + c];
                s1 += dn;
                sm += dn * f16(xh[n * C + c]);
                mag += fabs(dn);
            }
            s1 /= C, sm /= C;
            for (int c = 0; c < C; c++) {
                double xv = f16(xh[n * C + c]);
                double ref = res[n * C + c] + s2[n] * ((double)w[c] * d[n * C + c] - s1 - xv * sm);
                if (fabs(dx[n * C + c] - ref) > 1e-5 * (fabs(res[n * C + c]) + s2[n] * mag)) bad++;
            }
        }
        for (int c = 0; c < C; c++) {
            double rw = 0, rb = 0, mw = 0, mb = 0;
            for (int n = 0; n < N; n++) {
                rw += f16(xh[n * C + c]) * (double)d[n * C + c];
                rb += d[n * C + c];
                mw += fabs(f16(xh[n * C + c]) * (double)d[n * C + c]);
                mb += fabs(d[n * C + c]);
            }
            if (fabs(dw[c] - rw) > 1e-5 * mw || fabs(db[c] - rb) > 1e-5 * mb) bad++;
        }
        CHECK_EQ(bad, 0);
        free(d), free(res), free(dx), free(dw), free(db);
    }
    pt_kernels_set_threads(1);
    free(x), free(w), free(b), free(out), free(m), free(s), free(m2), free(s2), free(o16),
        free(o16b), free(xh);
}

/* ---- attention ---- */

typedef struct {
    int B, T, C, NH;
    pt_bf16 *qkv, *out, *att;
    float *dout, *dqkv, *scratch;
} att_case;

static void att_run(att_case *a) {
    size_t elems = pt_attention16_att_elems(a->T);
    memset(a->att, 0xff, (size_t)a->B * a->NH * elems * 2); /* every kept entry is written */
    pt_attention16_forward(a->out, a->att, a->scratch, a->qkv, a->B, a->T, a->C, a->NH);
    pt_attention16_backward_set(a->dqkv, a->scratch, a->dout, a->qkv, a->att, a->B, a->T, a->C,
                                a->NH);
}

/* The packed P row t of pair (b, h): its r1 entries. */
static const pt_bf16 *prow(const att_case *a, int b, int h, int t, int *r1) {
    int r0 = t / 64 * 64;
    *r1 = r0 + 64 < a->T ? r0 + 64 : a->T;
    size_t blk = (size_t)(r0 / 64), off = (size_t)64 * 64 * blk * (blk + 1) / 2;
    return a->att + ((size_t)b * a->NH + h) * pt_attention16_att_elems(a->T) + off +
           (size_t)(t - r0) * *r1;
}

/* Against double precision with the kernel's rounding points; returns the
 * number of elements outside the bound. */
static int att_check(const att_case *a) {
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH, bad = 0;
    long C3 = 3L * C;
    double scale = 1.0 / sqrt((double)hs), tol = 0x1p-7;
    double *p = malloc((size_t)T * sizeof(double)), *ds = malloc((size_t)T * T * sizeof(double));
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < NH; h++) {
            const pt_bf16 *q = a->qkv + (long)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
            const float *dq = a->dqkv + (long)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            memset(ds, 0, (size_t)T * T * sizeof(double));
            for (int t = 0; t < T; t++) {
                int r1;
                const pt_bf16 *P = prow(a, b, h, t, &r1);
                double mx = -1e300, sum = 0, psum = 0;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < hs; d++)
                        s += (double)f16(q[t * C3 + d]) * f16(k[j * C3 + d]);
                    p[j] = s * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j <= t; j++) sum += p[j] = exp(p[j] - mx);
                for (int j = 0; j <= t; j++) {
                    p[j] /= sum;
                    if (fabs(f16(P[j]) - p[j]) > p[j] * 0x1p-8 + 1e-30) bad++;
                    psum += f16(P[j]);
                }
                for (int j = t + 1; j < r1; j++) bad += P[j] != 0;
                if (fabs(psum - 1) > 0x1p-7) bad++;
                /* out[t] = sum_j P16 v, and dS from the kernel's P16 */
                double dot = 0, dpv[1024];
                for (int j = 0; j <= t; j++) {
                    double dp = 0;
                    for (int d = 0; d < hs; d++)
                        dp += (double)r16(a->dout[((long)b * T + t) * C + h * hs + d]) *
                              f16(v[j * C3 + d]);
                    dpv[j] = dp;
                    dot += f16(P[j]) * dp;
                }
                for (int j = 0; j <= t; j++)
                    ds[(long)t * T + j] = f16(P[j]) * (dpv[j] - dot) * scale;
                for (int d = 0; d < hs; d++) {
                    double o = 0, mag = 0;
                    for (int j = 0; j <= t; j++) {
                        o += p[j] * f16(v[j * C3 + d]);
                        mag += p[j] * fabs(f16(v[j * C3 + d]));
                    }
                    double got = f16(a->out[((long)b * T + t) * C + h * hs + d]);
                    if (fabs(got - o) > tol * mag + fabs(o) * 0x1p-8 + 1e-30) bad++;
                }
            }
            /* dQ = dS K, dK = dS^T Q, dV = P16^T dO */
            for (int i = 0; i < T; i++)
                for (int d = 0; d < hs; d++) {
                    double rq = 0, mq = 0, rk = 0, mk = 0, rv = 0, mv = 0;
                    for (int j = 0; j <= i; j++) {
                        double x = ds[(long)i * T + j] * f16(k[j * C3 + d]);
                        rq += x, mq += fabs(x);
                    }
                    for (int t = i; t < T; t++) {
                        int r1;
                        const pt_bf16 *P = prow(a, b, h, t, &r1);
                        double x = ds[(long)t * T + i] * f16(q[t * C3 + d]);
                        double y = f16(P[i]) * r16(a->dout[((long)b * T + t) * C + h * hs + d]);
                        rk += x, mk += fabs(x), rv += y, mv += fabs(y);
                    }
                    if (fabs(dq[i * C3 + d] - rq) > tol * mq + 1e-12) bad++;
                    if (fabs(dk[i * C3 + d] - rk) > tol * mk + 1e-12) bad++;
                    if (fabs(dv[i * C3 + d] - rv) > 1e-5 * mv + 1e-12) bad++;
                }
        }
    free(p), free(ds);
    return bad;
}

static void att_alloc(att_case *a, int B, int T, int C, int NH) {
    *a = (att_case){.B = B, .T = T, .C = C, .NH = NH};
    size_t n3 = (size_t)B * T * 3 * C, n = (size_t)B * T * C;
    a->qkv = rnd16((long)n3, 1.5);
    a->dout = rndf((long)n, 1);
    a->out = malloc(n * 2);
    a->att = malloc((size_t)B * NH * pt_attention16_att_elems(T) * 2);
    a->dqkv = malloc(n3 * 4);
    a->scratch = malloc(pt_attention16_scratch_floats(B, T, C, NH) * 4);
}
static void att_free(att_case *a) {
    free(a->qkv), free(a->dout), free(a->out), free(a->att), free(a->dqkv), free(a->scratch);
}

static void test_attention(void) {
    static const int shapes[][4] = {
        {2, 70, 128, 2}, {1, 130, 48, 2}, {2, 64, 64, 1}, {1, 5, 32, 2}};
    int paths[3], np = bf16_paths(paths);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        att_case a;
        att_alloc(&a, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
        size_t nout = (size_t)a.B * a.T * a.C, n3 = nout * 3;
        pt_bf16 *out1 = malloc(nout * 2);
        float *dq1 = malloc(n3 * 4);
        for (int p = 0; p < np; p++) {
            int old = pt_gemm_bf16_set_path(paths[p]);
            static const int TH[] = {1, 2, 3};
            for (int t = 0; t < 3; t++) {
                pt_kernels_set_threads(TH[t]);
                att_run(&a);
                if (t == 0) {
                    int bad = att_check(&a);
                    if (bad)
                        printf("  attention B %d T %d C %d NH %d on %s: %d bad\n", a.B, a.T, a.C,
                               a.NH, path_name(paths[p]), bad);
                    CHECK_EQ(bad, 0);
                    memcpy(out1, a.out, nout * 2);
                    memcpy(dq1, a.dqkv, n3 * 4);
                } else {
                    CHECK(!memcmp(out1, a.out, nout * 2) && !memcmp(dq1, a.dqkv, n3 * 4));
                }
            }
            pt_kernels_set_threads(1);
            pt_gemm_bf16_set_path(old);
        }
        free(out1), free(dq1);
        att_free(&a);
    }
}

/* ---- cross-entropy in blocks ---- */

/* One rank's phases over its Vl columns (nreal real), blocks of nb. */
static void xent_rank(float *stats, pt_bf16 *l16, float *bmax, const float *logits, const int *tg,
                      int N, int Vl, int nb, int v0, int nreal) {
    int nblk = (Vl + nb - 1) / nb;
    pt_xent16_begin(stats, N);
    float *blk = malloc((size_t)N * nb * 4);
    for (int b = 0; b < nblk; b++) {
        int c0 = b * nb, w = Vl - c0 < nb ? Vl - c0 : nb;
        for (int n = 0; n < N; n++)
            memcpy(blk + (long)n * w, logits + (long)n * Vl + c0, (size_t)w * 4);
        pt_xent16_block(stats, l16, bmax, blk, w, tg, N, Vl, c0, w, b, nblk, v0, nreal);
    }
    free(blk);
}

static void test_xent(void) {
    int N = 40, V = 301, nb = 37;
    float dloss = 1.0f / N;
    float *lg = rndf((long)N * V, 4), *ref = malloc((size_t)N * V * 4), *loss_ref = malloc(N * 4);
    int *tg = malloc(N * sizeof(int));
    for (int n = 0; n < N; n++) tg[n] = (int)((urand() + 1) * 0.5 * V) % V;
    lg[3 * V + 5] = 60.0f; /* a confident row */
    pt_softmax_xent_forward_backward(loss_ref, ref, lg, tg, N, V, dloss);
    int nblk = (V + nb - 1) / nb;
    float *stats = malloc((size_t)N * 4 * 4), *bmax = malloc((size_t)N * nblk * 4),
          *gmax = malloc(N * 4), *red = malloc((size_t)N * 4 * 4), *loss = malloc(N * 4);
    pt_bf16 *l16 = malloc((size_t)N * V * 2);
    pt_bf16 *first = malloc((size_t)N * V * 2);
    static const int TH[] = {1, 2, 3};
    for (int t = 0; t < 3; t++) {
        pt_kernels_set_threads(TH[t]);
        xent_rank(stats, l16, bmax, lg, tg, N, V, nb, 0, V);
        pt_xent16_local_max(gmax, stats, N);
        pt_xent16_shift(red, stats, gmax, N);
        pt_xent16_finish(loss, l16, bmax, gmax, red, tg, N, V, nb, nblk, 0, V, dloss);
        if (t == 0) memcpy(first, l16, (size_t)N * V * 2);
        CHECK(!memcmp(first, l16, (size_t)N * V * 2));
    }
    pt_kernels_set_threads(1);
    int bad = 0;
    for (int n = 0; n < N; n++) {
        CHECK_NEAR(loss[n], loss_ref[n], 1e-6, 1e-5);
        float mx = -1e30f, mn = 1e30f;
        for (int j = 0; j < V; j++) {
            mx = lg[n * V + j] > mx ? lg[n * V + j] : mx;
            mn = lg[n * V + j] < mn ? lg[n * V + j] : mn;
        }
        for (int j = 0; j < V; j++) {
            double d = ref[n * V + j], p = d / dloss + (j == tg[n]);
            double tol = dloss * p * (0x1p-9 * (mx - mn) + 0x1p-7) + fabs(d) * 0x1p-8 + 1e-12;
            if (fabs(f16(l16[n * V + j]) - d) > tol) bad++;
        }
    }
    CHECK_EQ(bad, 0);
    /* three vocabulary-parallel ranks (101 rows each, the last 2 padding) */
    int t3 = 3, Vl = (V + t3 - 1) / t3;
    float *st3 = malloc((size_t)t3 * N * 16), *bm3 = malloc((size_t)t3 * N * 16 * 4),
          *g3 = malloc((size_t)t3 * N * 4), *red3 = malloc((size_t)t3 * N * 16),
          *lgr = calloc((size_t)N * Vl, 4);
    pt_bf16 *l3 = malloc((size_t)t3 * N * Vl * 2);
    int nb3 = 16, nblk3 = (Vl + nb3 - 1) / nb3;
    for (int r = 0; r < t3; r++) {
        int v0 = r * Vl, nreal = V - v0 < Vl ? V - v0 : Vl;
        for (int n = 0; n < N; n++)
            for (int j = 0; j < Vl; j++) lgr[n * Vl + j] = j < nreal ? lg[n * V + v0 + j] : 1e9f;
        xent_rank(st3 + (size_t)r * N * 4, l3 + (size_t)r * N * Vl, bm3 + (size_t)r * N * nblk3,
                  lgr, tg, N, Vl, nb3, v0, nreal);
    }
    for (int n = 0; n < N; n++) { /* the max all-gathered */
        float g = -3e38f;
        for (int r = 0; r < t3; r++) g = fmaxf(g, st3[((size_t)r * N + n) * 4]);
        for (int r = 0; r < t3; r++) g3[(size_t)r * N + n] = g;
    }
    for (int r = 0; r < t3; r++)
        pt_xent16_shift(red3 + (size_t)r * N * 4, st3 + (size_t)r * N * 4, g3 + (size_t)r * N, N);
    for (int i = 0; i < N * 4; i++) { /* the sums all-reduced */
        float s = 0;
        for (int r = 0; r < t3; r++) s += red3[(size_t)r * N * 4 + i];
        for (int r = 0; r < t3; r++) red3[(size_t)r * N * 4 + i] = s;
    }
    bad = 0;
    for (int r = 0; r < t3; r++) {
        int v0 = r * Vl, nreal = V - v0 < Vl ? V - v0 : Vl;
        pt_xent16_finish(loss, l3 + (size_t)r * N * Vl, bm3 + (size_t)r * N * nblk3,
                         g3 + (size_t)r * N, red3 + (size_t)r * N * 4, tg, N, Vl, nb3, nblk3, v0,
                         nreal, dloss);
        for (int n = 0; n < N; n++) {
            CHECK_NEAR(loss[n], loss_ref[n], 1e-6, 1e-5);
            for (int j = 0; j < Vl; j++) {
                float got = f16(l3[((size_t)r * N + n) * Vl + j]);
                if (j >= nreal) {
                    bad += got != 0;
                    continue;
                }
                double d = ref[n * V + v0 + j];
                double tol = fabs(d) * 0x1p-6 + dloss * 0x1p-8 + 1e-12;
                if (fabs(got - d) > tol) bad++;
            }
        }
    }
    CHECK_EQ(bad, 0);
    free(lg), free(ref), free(loss_ref), free(tg), free(stats), free(bmax), free(gmax), free(red),
        free(loss), free(l16), free(first), free(st3), free(bm3), free(g3), free(red3), free(lgr),
        free(l3);
}

int main(void) {
    RUN(test_linears);
    RUN(test_layernorm);
    RUN(test_attention);
    RUN(test_xent);
    return TEST_DONE();
}
