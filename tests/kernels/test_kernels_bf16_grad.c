/* Gradient check of a bf16 MLP built from pt_gemm_bf16 the way the model
 * uses it (fp32 master values, bf16 copies into every product, fp32
 * accumulation), against central differences of the same function in
 * double, on every bf16 GEMM path the CPU has (the fallback always):
 *
 *   forward   pre (N,H) = x16 @ W1_16 + b1, h = gelu(pre)     bias + GELU epilogue
 *             y (N,OC) = bf16(h) @ W2_16 + b2                  bias epilogue
 *             L = sum G * y, G (N,OC) fixed: dy = G
 *   backward  dW2 (H,OC) += bf16(h)^T @ bf16(dy), db2 += its column sums   A transposed, colsum
 *             dpre (N,H) = gelu'(pre) * (bf16(dy) @ W2_16^T)   B transposed, GELU' epilogue
 *             dW1 (C,H) += x16^T @ bf16(dpre), db1 += column sums
 *             dx (N,C) += bf16(dpre) @ W1_16^T
 *
 * The bound, at bf16 tolerances: x, W1 and W2 are bf16 values (their copies
 * are exact), G and the intermediates h, dy and dpre are not. Rounding to
 * bf16 (8 significant bits, nearest) moves a value by at most 2^-9 of it,
 * so each product a * b in a gradient's sum carries at most two such
 * roundings (bf16(h) and bf16(dy) in dW2; bf16(dpre), itself from bf16(dy),
 * in dW1, db1 and dx): |error| <= (2 * 2^-9 + 2^-18) |a b|. The rest is fp32
 * accumulation (gamma_n, n <= 40: 2.4e-6 relative), GELU's and its
 * derivative's float error (gelu.h: about 1e-6 relative, 1e-5 absolute on
 * gelu'), all under 2^-12 relative; so per gradient element
 *     |analytic - numeric| <= (2^-8 + 2^-12) T + 1e-5,
 * with T the sum over its products of |a b| in double (gelu'(pre) counted
 * as |gelu'| + 1e-5), and 1e-5 absolute for the pre-activation's fp32
 * error (about 1e-6 of sum |x W1|) seen through GELU and the central
 * differences' own error (h = 1e-5 in double: ~1e-10). A transposed
 * operand, a missed epilogue or a wrong sum is off by O(T). */
#include <math.h>
#include <string.h>

#include "partrain/kernels.h"
#include "../../src/kernels/kernels_impl.h"
#include "pt_test.h"
#define KT_SEED 4041
#include "kernel_test.h"

enum { N = 13, C = 9, H = 37, OC = 6 }; /* H > 32: two column panels */
#define RTOL_BF16 (1.0 / 256 + 1.0 / 4096)
#define ATOL_BF16 1e-5

/* The parameters in double (x, W1, W2 hold bf16 values; b1, b2 do not)
 * and the fixed upstream gradient G. */
typedef struct {
    double x[N * C], w1[C * H], b1[H], w2[H * OC], b2[OC], g[N * OC];
} mlp;

/* L = sum G * (gelu(x W1 + b1) W2 + b2), in double. */
static double loss(void *ctx) {
    const mlp *m = ctx;
    double L = 0.0;
    for (int n = 0; n < N; n++) {
        double h[H];
        for (int j = 0; j < H; j++) {
            double p = m->b1[j];
            for (int c = 0; c < C; c++) p += m->x[n * C + c] * m->w1[c * H + j];
            h[j] = gelu_double(p);
        }
        for (int o = 0; o < OC; o++) {
            double y = m->b2[o];
            for (int j = 0; j < H; j++) y += h[j] * m->w2[j * OC + o];
            L += m->g[n * OC + o] * y;
        }
    }
    return L;
}

static double bf16_value(double scale) {
    return pt_ref_bf16_float(pt_ref_bf16_round((float)(urand() * scale)));
}

static void to_bf16(pt_bf16 *d, const double *s, int n) {
    for (int i = 0; i < n; i++) d[i] = pt_ref_bf16_round((float)s[i]);
}

/* The analytic gradients through pt_gemm_bf16 (grads start at zero). */
typedef struct {
    float dx[N * C], dw1[C * H], db1[H], dw2[H * OC], db2[OC];
} grads;

static void bf16_forward_backward(const mlp *m, grads *gr) {
    pt_bf16 x16[N * C], w1_16[C * H], w2_16[H * OC], h16[N * H], dy16[N * OC], dpre16[N * H];
    float b1[H], b2[OC], pre[N * H], h[N * H], y[N * OC], dy[N * OC], dpre[N * H];
    to_bf16(x16, m->x, N * C), to_bf16(w1_16, m->w1, C * H), to_bf16(w2_16, m->w2, H * OC);
    for (int j = 0; j < H; j++) b1[j] = (float)m->b1[j];
    for (int o = 0; o < OC; o++) b2[o] = (float)m->b2[o];
    for (int i = 0; i < N * OC; i++) dy[i] = (float)m->g[i];
    memset(gr, 0, sizeof *gr);
    /* forward: c_fc with bias and GELU, then c_proj with bias */
    pt_gemm_epilogue fc = {.bias = b1, .act = h}, proj = {.bias = b2};
    pt_gemm_bf16(0, 0, N, H, C, x16, C, w1_16, H, 0.0f, pre, H, &fc);
    pt_bf16_from_f32(h16, h, N * H);
    pt_gemm_bf16(0, 0, N, OC, H, h16, H, w2_16, OC, 0.0f, y, OC, &proj);
    /* backward of c_proj: weight gradient, then the input gradient
     * through GELU's derivative */
    pt_bf16_from_f32(dy16, dy, N * OC);
    pt_gemm_epilogue dw2 = {.colsum = gr->db2}, dgelu = {.pre = pre}, dw1 = {.colsum = gr->db1};
    pt_gemm_bf16(1, 0, H, OC, N, h16, H, dy16, OC, 1.0f, gr->dw2, OC, &dw2);
    pt_gemm_bf16(0, 1, N, H, OC, dy16, OC, w2_16, OC, 0.0f, dpre, H, &dgelu);
    /* backward of c_fc */
    pt_bf16_from_f32(dpre16, dpre, N * H);
    pt_gemm_bf16(1, 0, C, H, N, x16, C, dpre16, H, 1.0f, gr->dw1, H, &dw1);
    pt_gemm_bf16(0, 1, N, C, H, dpre16, H, w1_16, H, 1.0f, gr->dx, C, NULL);
    (void)y;
}

/* T of every gradient element: its products' |a b| summed in double. */
typedef struct {
    double dx[N * C], dw1[C * H], db1[H], dw2[H * OC], db2[OC];
} bounds;

static void abs_terms(const mlp *m, bounds *t) {
    static double h[N * H], tp[N * H]; /* |h|, and dpre's T */
    memset(t, 0, sizeof *t);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            double p = m->b1[j], s = 0.0;
            for (int c = 0; c < C; c++) p += m->x[n * C + c] * m->w1[c * H + j];
            for (int o = 0; o < OC; o++) s += fabs(m->g[n * OC + o] * m->w2[j * OC + o]);
            h[n * H + j] = fabs(gelu_double(p));
            tp[n * H + j] = (fabs(gelu_grad_double(p)) + 1e-5) * s;
        }
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) t->db2[o] += fabs(m->g[n * OC + o]);
        for (int j = 0; j < H; j++) {
            for (int o = 0; o < OC; o++)
                t->dw2[j * OC + o] += h[n * H + j] * fabs(m->g[n * OC + o]);
            t->db1[j] += tp[n * H + j];
            for (int c = 0; c < C; c++) {
                t->dw1[c * H + j] += fabs(m->x[n * C + c]) * tp[n * H + j];
                t->dx[n * C + c] += tp[n * H + j] * fabs(m->w1[c * H + j]);
            }
        }
    }
}

/* Central differences of loss over x[0..n) against analytic, within the
 * header's bound with T from t: the count of elements outside it. */
static int count_bad(const char *what, const char *path, double *x, int n, const float *analytic,
                     const double *t, mlp *m) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + FD_H;
        double lp = loss(m);
        x[i] = save - FD_H;
        double lm = loss(m);
        x[i] = save;
        double num = (lp - lm) / (2 * FD_H), tol = RTOL_BF16 * t[i] + ATOL_BF16;
        if (!(fabs(analytic[i] - num) <= tol) && bad++ < 4)
            fprintf(stderr, "  %s %s[%d]: analytic %.8g numeric %.8g (allowed %.3g)\n", path, what,
                    i, analytic[i], num, tol);
    }
    return bad;
}

static void test_mlp_grad(void) {
    static mlp m;
    for (int i = 0; i < N * C; i++) m.x[i] = bf16_value(1.0);
    for (int i = 0; i < C * H; i++) m.w1[i] = bf16_value(0.8);
    for (int i = 0; i < H * OC; i++) m.w2[i] = bf16_value(0.5);
    for (int j = 0; j < H; j++) m.b1[j] = urand() * 0.5;
    for (int o = 0; o < OC; o++) m.b2[o] = urand() * 0.5;
    for (int i = 0; i < N * OC; i++) m.g[i] = urand(); /* not bf16: dy is rounded */
    static bounds t;
    abs_terms(&m, &t);
    static const int PATHS[] = {PT_BF16_AMX, PT_BF16_AVX512, PT_BF16_FALLBACK};
    static const char *NAMES[] = {"amx_bf16", "avx512_bf16", "fallback"};
    for (int p = 0; p < 3; p++) {
        if (!pt_gemm_bf16_has_path(PATHS[p])) continue;
        int old = pt_gemm_bf16_set_path(PATHS[p]);
        static grads g;
        bf16_forward_backward(&m, &g);
        CHECK_EQ(count_bad("dx", NAMES[p], m.x, N * C, g.dx, t.dx, &m), 0);
        CHECK_EQ(count_bad("dW1", NAMES[p], m.w1, C * H, g.dw1, t.dw1, &m), 0);
        CHECK_EQ(count_bad("db1", NAMES[p], m.b1, H, g.db1, t.db1, &m), 0);
        CHECK_EQ(count_bad("dW2", NAMES[p], m.w2, H * OC, g.dw2, t.dw2, &m), 0);
        CHECK_EQ(count_bad("db2", NAMES[p], m.b2, OC, g.db2, t.db2, &m), 0);
        pt_gemm_bf16_set_path(old);
    }
}

/* The bound is not vacuous: the same check on the fp32 gradients of the
 * function, with one planted error of 2% of T (the bf16 bound allows
 * about 0.4%), fails at exactly that element. */
static void test_bound_catches(void) {
    static mlp m;
    for (int i = 0; i < N * C; i++) m.x[i] = bf16_value(1.0);
    for (int i = 0; i < C * H; i++) m.w1[i] = bf16_value(0.8);
    for (int i = 0; i < H * OC; i++) m.w2[i] = bf16_value(0.5);
    for (int i = 0; i < N * OC; i++) m.g[i] = urand();
    static bounds t;
    abs_terms(&m, &t);
    static grads g;
    bf16_forward_backward(&m, &g);
    CHECK_EQ(count_bad("dW1", "unplanted", m.w1, C * H, g.dw1, t.dw1, &m), 0);
    g.dw1[7] += (float)(0.02 * t.dw1[7] + 2 * ATOL_BF16);
    fprintf(stderr, "  (one planted error, expected below)\n");
    CHECK_EQ(count_bad("dW1", "planted", m.w1, C * H, g.dw1, t.dw1, &m), 1);
}

int main(void) {
    RUN(test_mlp_grad);
    RUN(test_bound_catches);
    return TEST_DONE();
}
