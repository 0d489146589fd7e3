/* Optimized kernels against the plain reference kernels (the oracle, in
 * src/kernels/reference.c) on awkward sizes: T not a multiple of the
 * attention block, T = 1, NH = 1, odd C and V, N below and above the
 * parallel thresholds; at 1, 2 and 3 threads. Also: AdamW against a step
 * computed in double, pt_sum_squares against a double sum, the vectorized exp
 * against libm, and bitwise equality of results across thread counts.
 *
 * The linears run twice: through the kernels' own GEMM (gemm.c, where the
 * CPU has AVX-512, forced at every size, with partial tiles and several K
 * and N blocks) and through OpenBLAS.
 *
 * What is bitwise across thread counts (docs/architecture.md, "Bitwise
 * guarantees"), and tested as such: every kernel of ours, the own GEMM
 * included, and attention (its OpenBLAS products always run single-threaded).
 * Not bitwise: OpenBLAS's own products (the linears without AVX-512, small
 * products, PT_GEMM=blas): its thread partition changes which kernels sum
 * which part, and the bits depend on the CPU kernel it picks
 * (OPENBLAS_CORETYPE). Those are checked across thread counts against the
 * bound float32 rounding allows for two summation orders (blas_tol).
 *
 * Tolerances: optimized and reference kernels sum in different orders (BLAS
 * blocking, vector lanes) and the optimized exp differs from libm's by < 2e-7
 * relative, so results agree to float rounding: abs 1e-5 + rel 1e-4 on
 * O(1) data with sums of at most a few hundred terms (longer sums get
 * inputs scaled down so that their partial sums stay O(1)). */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "partrain/kernels.h"
#include "../../src/kernels/fastmath.h"
#include "../../src/kernels/kernels_impl.h"
#include "pt_test.h"
#define KT_SEED 777
#include "kernel_test.h"

#define ATOL 1e-5
#define RTOL 1e-4

static float *rnd(long n, double scale) {
    float *x = malloc(sizeof(float) * (n > 0 ? n : 1));
    for (long i = 0; i < n; i++) x[i] = (float)(urand() * scale);
    return x;
}
static float *nans(long n) {
    float *x = malloc(sizeof(float) * (n > 0 ? n : 1));
    for (long i = 0; i < n; i++) x[i] = NAN;
    return x;
}
static float *dupf(const float *x, long n) {
    float *y = malloc(sizeof(float) * (n > 0 ? n : 1));
    memcpy(y, x, sizeof(float) * n);
    return y;
}

/* Close within ATOL + RTOL |want|; prints the first mismatches. */
static void close_all(const char *what, const float *got, const float *want, long n) {
    int bad = 0;
    for (long i = 0; i < n; i++) {
        if (!(fabs((double)got[i] - want[i]) <= ATOL + RTOL * fabs(want[i]))) {
            if (bad < 4) fprintf(stderr, "  %s[%ld]: %.8g want %.8g\n", what, i, got[i], want[i]);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "  %s: %d of %ld differ\n", what, bad, n);
    CHECK(bad == 0);
}

static const int THREADS[] = {1, 2, 3};
#define NTHREADS 3

/* 1 when pt_sgemm runs OpenBLAS (set path BLAS, or no own GEMM built in). */
static int blas_gemm(void) {
    int path = pt_sgemm_set_path(PT_GEMM_AUTO);
    pt_sgemm_set_path(path);
    return path == PT_GEMM_BLAS || !pt_sgemm_has_own();
}

/* A result at another thread count against the first one: bitwise when tol
 * is NULL, else |got - first| <= tol[i] elementwise. */
static void threads_agree(const char *what, const float *got, const float *first, long n,
                          const double *tol) {
    int bad = 0;
    for (long i = 0; i < n; i++) {
        int ok = tol ? fabs((double)got[i] - first[i]) <= tol[i]
                     : memcmp(&got[i], &first[i], sizeof(float)) == 0;
        if (!ok) {
            if (bad < 4)
                fprintf(stderr, "  %s[%ld] at %d threads: %.9g, at 1 thread %.9g (allowed %.3g)\n",
                        what, i, pt_kernels_threads(), got[i], first[i], tol ? tol[i] : 0.0);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "  %s: %d of %ld differ across thread counts\n", what, bad, n);
    CHECK(bad == 0);
}

/* How far two float32 evaluations of y = sum of n terms (K products plus
 * bias, residual, the accumulated value...) in different orders can be
 * apart: each is within gamma_n * sum |terms| of the exact sum (Higham,
 * Accuracy and Stability, 3.1; with or without FMA), gamma_n = n u / (1 - n
 * u), u = 2^-24. For C (M,N) = op(A) op(B) + extra, with extra (M,N) the sum
 * of the absolute values of the added terms (NULL: none):
 *   tol[i,j] = 2 gamma_{K+2} (sum_k |A[i,k]| |B[k,j]| + extra[i,j]).
 * A is M x K with element (i,k) at A[i*ars + k*aks]; B likewise. */
static double *blas_tol(int M, int N, int K, const float *A, long ars, long aks, const float *B,
                        long bks, long bcs, const double *extra) {
    const double u = 1.0 / 16777216.0, n = K + 2.0, g = 2.0 * n * u / (1.0 - n * u);
    double *tol = malloc(sizeof(double) * ((long)M * N > 0 ? (long)M * N : 1));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = extra ? extra[(long)i * N + j] : 0.0;
            for (int k = 0; k < K; k++)
                s += fabs((double)A[i * ars + k * aks] * B[k * bks + j * bcs]);
            tol[(long)i * N + j] = g * s;
        }
    return tol;
}
/* |x| per element, as the extra terms of blas_tol; rows of a length-N vector
 * repeated M times when rows is 0 (a bias). */
static double *abs_terms(const float *x, int M, int N, int rows) {
    double *t = malloc(sizeof(double) * ((long)M * N > 0 ? (long)M * N : 1));
    for (long i = 0; i < (long)M * N; i++) t[i] = fabs((double)x[rows ? i : i % N]);
    return t;
}

static void test_encoder(void) {
    const int B = 3, T = 7, C = 37, V = 11;
    int inp[21];
    for (int i = 0; i < B * T; i++) inp[i] = (i * 5) % V;
    float *wte = rnd(V * C, 1), *wpe = rnd(T * C, 1), *dout = rnd(B * T * C, 1);
    float *out = rnd(B * T * C, 1), *outr = rnd(B * T * C, 1);
    float *dwte = rnd(V * C, 1), *dwpe = rnd(T * C, 1);
    float *dwter = dupf(dwte, V * C), *dwper = dupf(dwpe, T * C);
    pt_ref_encoder_forward(outr, inp, wte, wpe, B, T, C);
    pt_ref_encoder_backward(dwter, dwper, dout, inp, B, T, C);
    float *first[3] = {NULL, NULL, NULL};
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *dw = dupf(dwte, V * C), *dp = dupf(dwpe, T * C);
        pt_encoder_forward(out, inp, wte, wpe, B, T, C);
        pt_encoder_backward(dw, dp, dout, inp, B, T, C);
        close_all("enc out", out, outr, B * T * C);
        close_all("enc dwte", dw, dwter, V * C);
        close_all("enc dwpe", dp, dwper, T * C);
        float *got[3] = {out, dw, dp};
        long len[3] = {B * T * C, V * C, T * C};
        for (int j = 0; j < 3; j++)
            if (k == 0)
                first[j] = dupf(got[j], len[j]);
            else
                threads_agree("encoder", got[j], first[j], len[j], NULL);
        free(dw), free(dp);
    }
    pt_kernels_set_threads(1);
    for (int j = 0; j < 3; j++) free(first[j]);
    free(wte), free(wpe), free(dout), free(out), free(outr), free(dwte), free(dwpe), free(dwter);
    free(dwper);
}

static void layernorm_case(int N, int C) {
    float *x = rnd((long)N * C, 3), *w = rnd(C, 1), *b = rnd(C, 1), *dout = rnd((long)N * C, 1);
    float *outr = rnd((long)N * C, 1), *meanr = rnd(N, 1), *rstdr = rnd(N, 1);
    float *dx0 = rnd((long)N * C, 1), *dw0 = rnd(C, 1), *db0 = rnd(C, 1);
    float *dxr = dupf(dx0, (long)N * C), *dwr = dupf(dw0, C), *dbr = dupf(db0, C);
    pt_ref_layernorm_forward(outr, meanr, rstdr, x, w, b, N, C);
    pt_ref_layernorm_backward(dxr, dwr, dbr, dout, x, w, meanr, rstdr, N, C);
    float *first[4];
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *out = rnd((long)N * C, 1), *mean = rnd(N, 1), *rstd = rnd(N, 1);
        float *dx = dupf(dx0, (long)N * C), *dw = dupf(dw0, C), *db = dupf(db0, C);
        pt_layernorm_forward(out, mean, rstd, x, w, b, N, C);
        pt_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
        close_all("ln out", out, outr, (long)N * C);
        close_all("ln mean", mean, meanr, N);
        close_all("ln rstd", rstd, rstdr, N);
        close_all("ln dinp", dx, dxr, (long)N * C);
        close_all("ln dweight", dw, dwr, C);
        close_all("ln dbias", db, dbr, C);
        if (k == 0) {
            first[0] = out, first[1] = dx, first[2] = dw, first[3] = db;
        } else { /* the same bits at any thread count */
            CHECK(memcmp(out, first[0], sizeof(float) * N * C) == 0);
            CHECK(memcmp(dx, first[1], sizeof(float) * N * C) == 0);
            CHECK(memcmp(dw, first[2], sizeof(float) * C) == 0);
            CHECK(memcmp(db, first[3], sizeof(float) * C) == 0);
            free(out), free(dx), free(dw), free(db);
        }
        free(mean), free(rstd);
    }
    pt_kernels_set_threads(1);
    for (int j = 0; j < 4; j++) free(first[j]);
    free(x), free(w), free(b), free(dout), free(outr), free(meanr), free(rstdr), free(dx0);
    free(dw0), free(db0), free(dxr), free(dwr), free(dbr);
}
static void test_layernorm(void) {
    layernorm_case(1, 5);
    layernorm_case(7, 33);
    layernorm_case(300, 129); /* above the parallel threshold */
}

/* The linear (wt: its transposed-weight form) against the reference. The
 * (C,OC) form's backward is the product's two passes: dinp OVERWRITTEN
 * (from junk dx0; the reference's adds to zeros), dweight and dbias
 * accumulated; the wt form's accumulates all three. */
static void matmul_case(int N, int C, int OC, int wt, int bias, double sc) {
    float *x = rnd((long)N * C, sc), *w = rnd((long)C * OC, sc), *b = rnd(OC, 1);
    float *dout = rnd((long)N * OC, sc), *outr = rnd((long)N * OC, 1), *out = rnd((long)N * OC, 1);
    float *dx0 = rnd((long)N * C, 1), *dw0 = rnd((long)C * OC, 1), *db0 = rnd(OC, 1);
    float *dxa = wt ? dupf(dx0, (long)N * C) : calloc((size_t)N * C, sizeof(float));
    float *dxr = dupf(dxa, (long)N * C), *dwr = dupf(dw0, (long)C * OC), *dbr = dupf(db0, OC);
    const float *bb = bias ? b : NULL;
    if (wt) {
        pt_ref_matmul_forward_wt(outr, x, w, bb, N, C, OC);
        pt_ref_matmul_backward_wt(dxr, dwr, bias ? dbr : NULL, dout, x, w, N, C, OC);
    } else {
        pt_ref_matmul_forward(outr, x, w, bb, N, C, OC);
        pt_ref_matmul_backward(dxr, dwr, bias ? dbr : NULL, dout, x, w, N, C, OC);
    }
    /* across thread counts: the own GEMM bitwise, OpenBLAS within blas_tol;
     * dbias is our column sum on both paths: bitwise */
    double *tol[3] = {NULL, NULL, NULL};
    if (blas_gemm()) {
        double *eb = bias ? abs_terms(b, N, OC, 0) : NULL, *ex = abs_terms(dxa, N, C, 1);
        double *ew = abs_terms(dw0, wt ? OC : C, wt ? C : OC, 1);
        if (wt) { /* w (OC,C) */
            tol[0] = blas_tol(N, OC, C, x, C, 1, w, 1, C, eb);
            tol[1] = blas_tol(N, C, OC, dout, OC, 1, w, C, 1, ex);
            tol[2] = blas_tol(OC, C, N, dout, 1, OC, x, C, 1, ew);
        } else { /* w (C,OC) */
            tol[0] = blas_tol(N, OC, C, x, C, 1, w, OC, 1, eb);
            tol[1] = blas_tol(N, C, OC, dout, OC, 1, w, 1, OC, ex);
            tol[2] = blas_tol(C, OC, N, x, 1, C, dout, OC, 1, ew);
        }
        free(eb), free(ex), free(ew);
    }
    float *first[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *dx = dupf(dx0, (long)N * C), *dw = dupf(dw0, (long)C * OC), *db = dupf(db0, OC);
        if (wt) {
            pt_matmul_forward_wt(out, x, w, bb, N, C, OC);
            pt_matmul_backward_wt(dx, dw, bias ? db : NULL, dout, x, w, N, C, OC);
        } else {
            pt_matmul_forward(out, x, w, bb, N, C, OC);
            pt_matmul_backward_input_set(dx, dout, w, N, C, OC);
            pt_matmul_backward_weight(dw, bias ? db : NULL, dout, x, N, C, OC);
        }
        close_all("mm out", out, outr, (long)N * OC);
        close_all("mm dinp", dx, dxr, (long)N * C);
        close_all("mm dweight", dw, dwr, (long)C * OC);
        close_all("mm dbias", db, dbr, OC);
        float *got[4] = {out, dx, dw, db};
        long len[4] = {(long)N * OC, (long)N * C, (long)C * OC, OC};
        const char *name[4] = {"mm out", "mm dinp", "mm dweight", "mm dbias"};
        for (int j = 0; j < 4; j++) {
            if (k == 0)
                first[j] = dupf(got[j], len[j]);
            else
                threads_agree(name[j], got[j], first[j], len[j], j < 3 ? tol[j] : NULL);
        }
        free(dx), free(dw), free(db);
    }
    pt_kernels_set_threads(1);
    for (int j = 0; j < 4; j++) free(first[j]);
    for (int j = 0; j < 3; j++) free(tol[j]);
    free(x), free(w), free(b), free(dout), free(outr), free(out), free(dx0), free(dw0), free(db0);
    free(dxa), free(dxr), free(dwr), free(dbr);
}
static void test_matmul(void) {
    for (int blas = 0; blas < 2; blas++) {
        pt_sgemm_set_path(blas ? PT_GEMM_BLAS : PT_GEMM_OWN);
        for (int wt = 0; wt < 2; wt++)
            for (int bias = 0; bias < 2; bias++) {
                matmul_case(1, 1, 1, wt, bias, 1);
                matmul_case(13, 31, 17, wt, bias, 1);
                matmul_case(70, 64, 96, wt, bias, 1);
                matmul_case(300, 40, 257, wt, bias, 1);    /* above the parallel bias threshold */
                matmul_case(200, 520, 130, wt, bias, 0.5); /* 2 K blocks, partial tiles */
                matmul_case(97, 64, 1100, wt, bias, 0.3);  /* 3 N blocks / 3 K blocks */
                matmul_case(64, 256, 700, wt, bias, 0.5);  /* 6 tiles: panels split */
                matmul_case(50, 96, 700, wt, bias, 0.5);   /* the same, a partial tile */
            }
    }
    pt_sgemm_set_path(PT_GEMM_AUTO);
}

/* GELU as the training path computes it, in pt_matmul_gelu_forward's
 * epilogue, on both GEMM paths: inp (N,1) = x against a weight (1,OC) of
 * ones makes pre[i,j] = x[i] exactly, so out[i,j] = gelu(x[i]) in every
 * column (the vector lanes and the scalar tail). Against the reference GELU
 * and against the exact function in double; pt_gelu_forward bitwise. */
static void test_gelu(void) {
    const int N = 4099, OC = 37;
    float *x = rnd(N, 8), *w = malloc(sizeof(float) * OC), *pre = nans((long)N * OC);
    float *out = nans((long)N * OC), *outr = rnd(N, 1), *alone = nans((long)N * OC);
    x[0] = 0.0f, x[1] = -30.0f, x[2] = 30.0f, x[3] = -100.0f, x[4] = 100.0f, x[5] = 1e-8f;
    for (int j = 0; j < OC; j++) w[j] = 1.0f;
    pt_ref_gelu_forward(outr, x, N);
    for (int path = PT_GEMM_BLAS; path <= PT_GEMM_OWN; path++) {
        pt_sgemm_set_path(path);
        for (int k = 0; k < NTHREADS; k++) {
            pt_kernels_set_threads(THREADS[k]);
            pt_matmul_gelu_forward(pre, out, x, w, NULL, N, 1, OC);
            int bad = 0;
            for (long i = 0; i < (long)N * OC; i++) {
                double xi = x[i / OC], want_ref = outr[i / OC];
                /* 0.5 x (1 + tanh u) written as x / (1 + exp(-2u)): the same
                 * function, without the cancellation of 1 + tanh u that
                 * makes even double lose all digits of gelu(x) for x < -6. */
                double u = 0.7978845608028654 * (xi + 0.044715 * xi * xi * xi);
                double want = xi / (1.0 + exp(-2.0 * u));
                int ok = pre[i] == x[i / OC] &&
                         fabs(out[i] - want) <= 1e-30 + gelu_rel_err(xi) * fabs(want) &&
                         fabs(out[i] - want_ref) <= ATOL + RTOL * fabs(want_ref);
                if (!ok) {
                    if (bad < 3)
                        fprintf(stderr, "  gelu(%.9g) = %.9g want %.9g (reference %.9g)\n", xi,
                                out[i], want, want_ref);
                    bad++;
                }
            }
            CHECK(bad == 0);
            /* the GELU alone (a recompute's) gives the epilogue's bits,
             * however the vector lanes fall: from element 0 and from 1 */
            for (int shift = 0; shift < 2; shift++) {
                size_t n = (size_t)N * OC - (size_t)shift;
                pt_gelu_forward(alone, pre + shift, n);
                CHECK(memcmp(alone, out + shift, n * sizeof(float)) == 0);
            }
        }
    }
    pt_sgemm_set_path(PT_GEMM_AUTO);
    pt_kernels_set_threads(1);
    free(x), free(w), free(pre), free(out), free(outr), free(alone);
}

/* Attention: ref vs optimized, and bitwise equality across thread counts.
 * The backward OVERWRITES dqkv: it starts as NaN, the reference's at 0. */
static void attention_case(int B, int T, int C, int NH) {
    long nx = (long)B * T * 3 * C, no = (long)B * T * C, na = (long)B * NH * T * T;
    float *qkv = rnd(nx, 2), *dout = rnd(no, 1);
    float *outr = rnd(no, 1), *attr = rnd(na, 1), *dr = calloc(nx, sizeof(float));
    float *scr = rnd(T, 1);
    pt_ref_attention_forward(outr, attr, qkv, B, T, C, NH);
    pt_ref_attention_backward(dr, scr, dout, qkv, attr, B, T, C, NH);
    size_t ns = pt_attention_scratch_floats(B, T, C, NH);
    float *first_out = NULL, *first_d = NULL;
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *out = rnd(no, 1), *att = rnd(na, 1), *d = nans(nx), *scratch = rnd((long)ns, 1);
        pt_attention_forward(out, att, qkv, B, T, C, NH);
        /* entries past t in att must not matter: poison them */
        for (long bh = 0; bh < (long)B * NH; bh++)
            for (int t = 0; t < T; t++)
                for (int t2 = t + 1; t2 < T; t2++) att[(bh * T + t) * T + t2] = NAN;
        pt_attention_backward_set(d, scratch, dout, qkv, att, B, T, C, NH);
        close_all("att out", out, outr, no);
        for (long bh = 0; bh < (long)B * NH; bh++)
            for (int t = 0; t < T; t++)
                close_all("att probs", att + (bh * T + t) * T, attr + (bh * T + t) * T, t + 1);
        close_all("att dqkv", d, dr, nx);
        if (!first_out) {
            first_out = out, first_d = d;
        } else {
            CHECK(memcmp(out, first_out, sizeof(float) * no) == 0);
            CHECK(memcmp(d, first_d, sizeof(float) * nx) == 0);
            free(out), free(d);
        }
        free(att), free(scratch);
    }
    pt_kernels_set_threads(1);
    free(first_out), free(first_d);
    free(qkv), free(dout), free(outr), free(attr), free(dr), free(scr);
}
static void test_attention(void) {
    attention_case(1, 1, 4, 1);     /* T = 1 */
    attention_case(2, 5, 12, 1);    /* NH = 1 */
    attention_case(1, 64, 16, 2);   /* exactly one block */
    attention_case(2, 65, 24, 3);   /* one row past a block */
    attention_case(1, 130, 32, 4);  /* three blocks, the last short */
    attention_case(1, 256, 128, 2); /* four full blocks, hs 64 as in gpt2/small */
    /* hs = 64 takes attention64.c's register tiles: partial row and key tiles */
    attention_case(1, 1, 64, 1);
    attention_case(2, 7, 128, 2);
    attention_case(1, 65, 64, 1);
    attention_case(2, 150, 192, 3);
    /* one (batch, head) pair, hs != 64: OpenBLAS products large enough for
     * OpenBLAS to thread them, were it allowed to */
    attention_case(1, 256, 96, 1);
}

/* The fused and overwriting variants against the reference kernels composed
 * the long way (zeroed or copied input gradient, separate bias + GELU, column
 * sums in double), with the overwritten buffers poisoned with NaN first, and
 * bitwise equality across thread counts. */
static void fused_case(int N, int C, int OC, double sc) {
    long NC = (long)N * C, NO = (long)N * OC;
    float *x = rnd(NC, sc), *w = rnd((long)C * OC, sc), *b = rnd(OC, 1), *dout = rnd(NO, sc);
    float *dres = rnd(NC, 1), *lw = rnd(C, 1), *lb = rnd(C, 1), *dw0 = rnd((long)C * OC, 1);
    float *db0 = rnd(OC, 1), *lnw0 = rnd(C, 1), *lnb0 = rnd(C, 1), *h = rnd(NO, 2);
    /* oracle */
    float *prer = rnd(NO, 1), *outr = rnd(NO, 1), *dxr = calloc(NC, 4),
          *dwr = dupf(dw0, (long)C * OC);
    float *dbr = dupf(db0, OC);
    float *lno = rnd(NC, 1), *lmean = rnd(N, 1), *lrstd = rnd(N, 1), *dlnr = dupf(dres, NC);
    float *lnwr = dupf(lnw0, C), *lnbr = dupf(lnb0, C);
    pt_ref_matmul_forward(prer, x, w, b, N, C, OC);
    pt_ref_gelu_forward(outr, prer, NO);
    float *prer2 = rnd(NO, 1);
    pt_ref_matmul_backward(dxr, dwr, dbr, dout, x, w, N, C, OC);
    pt_ref_layernorm_forward(lno, lmean, lrstd, x, lw, lb, N, C);
    pt_ref_layernorm_backward(dlnr, lnwr, lnbr, dres, x, lw, lmean, lrstd, N, C);
    float *first[5] = {0};
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *pre = nans(NO), *out = nans(NO), *dx = nans(NC), *dw = dupf(dw0, (long)C * OC);
        float *db = dupf(db0, OC), *dln = nans(NC);
        float *lnw = dupf(lnw0, C), *lnb = dupf(lnb0, C);
        pt_matmul_gelu_forward(pre, out, x, w, b, N, C, OC);
        /* linear + residual, out of place and in place (out aliasing res) */
        float *ro = nans(NO), *ri = dupf(h, NO);
        pt_matmul_forward_res(ro, h, x, w, b, N, C, OC);
        pt_matmul_forward_res(ri, ri, x, w, b, N, C, OC);
        for (long j = 0; j < NO; j++) prer2[j] = prer[j] + h[j];
        close_all("mm_res out", ro, prer2, NO);
        CHECK(memcmp(ri, ro, sizeof(float) * NO) == 0);
        free(ro), free(ri);
        pt_matmul_backward_set(dx, dw, db, dout, x, w, N, C, OC);
        pt_layernorm_backward_res(dln, dres, lnw, lnb, dres, x, lw, lmean, lrstd, N, C);
        close_all("mmgelu pre", pre, prer, NO);
        close_all("mmgelu out", out, outr, NO);
        close_all("mm_set dinp", dx, dxr, NC);
        close_all("mm_set dweight", dw, dwr, (long)C * OC);
        close_all("mm_set dbias", db, dbr, OC);
        close_all("ln_res dinp", dln, dlnr, NC);
        close_all("ln_res dweight", lnw, lnwr, C);
        close_all("ln_res dbias", lnb, lnbr, C);
        /* in place: dinp aliasing dres */
        float *dln2 = dupf(dres, NC), *lnw2 = dupf(lnw0, C), *lnb2 = dupf(lnb0, C);
        pt_layernorm_backward_res(dln2, dln2, lnw2, lnb2, dres, x, lw, lmean, lrstd, N, C);
        CHECK(memcmp(dln2, dln, sizeof(float) * NC) == 0);
        free(dln2), free(lnw2), free(lnb2);
        /* across thread counts: LayerNorm is ours (bitwise); the linear is
         * bitwise on the own GEMM, within blas_tol on OpenBLAS, and its GELU
         * then moves by at most max |gelu'| (< 1.13) times that, plus GELU's
         * own float error at both ends */
        float *got[5] = {out, dln, lnw, pre, dx};
        long len[5] = {NO, NC, C, NO, NC};
        const char *name[5] = {"mmgelu out", "ln_res dinp", "ln_res dweight", "mmgelu pre",
                               "mm_set dinp"};
        for (int j = 0; j < 5; j++) {
            if (k == 0) {
                first[j] = dupf(got[j], len[j]);
            } else {
                double *tol = NULL;
                if (blas_gemm() && (j == 0 || j == 3)) {
                    double *eb = abs_terms(b, N, OC, 0);
                    tol = blas_tol(N, OC, C, x, C, 1, w, OC, 1, eb);
                    free(eb);
                    if (j == 0)
                        for (long i = 0; i < NO; i++)
                            tol[i] = 1.13 * tol[i] + 2.0 * gelu_rel_err(first[3][i]) *
                                                         (fabs((double)first[0][i]) + 1e-30);
                } else if (blas_gemm() && j == 4) {
                    tol = blas_tol(N, C, OC, dout, OC, 1, w, 1, OC, NULL);
                }
                threads_agree(name[j], got[j], first[j], len[j], tol);
                free(tol);
            }
        }
        free(pre), free(out), free(dx), free(dw), free(db), free(dln);
        free(lnw), free(lnb);
    }
    pt_kernels_set_threads(1);
    for (int j = 0; j < 5; j++) free(first[j]);
    free(x), free(w), free(b), free(dout), free(dres), free(lw), free(lb), free(dw0), free(db0);
    free(lnw0), free(lnb0), free(h), free(prer), free(outr), free(dxr), free(dwr), free(dbr);
    free(prer2), free(lno), free(lmean), free(lrstd), free(dlnr), free(lnwr), free(lnbr);
}
static void attention_set_case(int B, int T, int C, int NH) {
    long nx = (long)B * T * 3 * C, no = (long)B * T * C, na = (long)B * NH * T * T;
    float *qkv = rnd(nx, 2), *dout = rnd(no, 1), *dr = calloc(nx, 4), *outr = rnd(no, 1);
    float *attr = rnd(na, 1), *scr = rnd(T, 1), *first = NULL;
    pt_ref_attention_forward(outr, attr, qkv, B, T, C, NH);
    pt_ref_attention_backward(dr, scr, dout, qkv, attr, B, T, C, NH);
    size_t ns = pt_attention_scratch_floats(B, T, C, NH);
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *d = nans(nx), *scratch = rnd((long)ns, 1);
        pt_attention_backward_set(d, scratch, dout, qkv, attr, B, T, C, NH);
        close_all("att_set dqkv", d, dr, nx);
        if (!first) {
            first = d;
        } else {
            CHECK(memcmp(d, first, sizeof(float) * nx) == 0);
            free(d);
        }
        free(scratch);
    }
    pt_kernels_set_threads(1);
    free(first), free(qkv), free(dout), free(dr), free(outr), free(attr), free(scr);
}
/* c_proj's backward through GELU: dpre = gelu'(pre) * (dout @ w^T), against
 * the reference linear backward into a temporary and the reference GELU
 * backward; bitwise the same at every thread count. */
static void gelu_set_case(int N, int C, int OC, double sc) {
    long NC = (long)N * C, NO = (long)N * OC;
    float *pre = rnd(NC, 2), *inp = rnd(NC, 1), *w = rnd((long)C * OC, sc), *dout = rnd(NO, sc);
    float *dw0 = rnd((long)C * OC, 1), *db0 = rnd(OC, 1), *t = calloc(NC, 4), *dr = calloc(NC, 4);
    float *dwr = dupf(dw0, (long)C * OC), *dbr = dupf(db0, OC), *first = NULL;
    pt_ref_gelu_forward(inp, pre, NC);
    pt_ref_matmul_backward(t, dwr, dbr, dout, inp, w, N, C, OC);
    pt_ref_gelu_backward(dr, pre, t, NC);
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *d = nans(NC), *dw = dupf(dw0, (long)C * OC), *db = dupf(db0, OC);
        pt_matmul_backward_gelu_set(d, dw, db, dout, inp, w, pre, N, C, OC);
        close_all("mm_gelu_set dpre", d, dr, NC);
        close_all("mm_gelu_set dweight", dw, dwr, (long)C * OC);
        close_all("mm_gelu_set dbias", db, dbr, OC);
        if (!first) {
            first = d;
        } else {
            /* OpenBLAS: dout @ w^T within blas_tol, times |gelu'(pre)| < 1.13,
             * plus one rounding of the product by gelu' */
            double *tol = NULL;
            if (blas_gemm()) {
                tol = blas_tol(N, C, OC, dout, OC, 1, w, 1, OC, NULL);
                for (long i = 0; i < NC; i++)
                    tol[i] = 1.13 * tol[i] * (1.0 + 1e-6) + 2.0 * 1.2e-7 * fabs((double)first[i]);
            }
            threads_agree("mm_gelu_set dpre", d, first, NC, tol);
            free(tol);
            free(d);
        }
        free(dw), free(db);
    }
    pt_kernels_set_threads(1);
    free(first), free(pre), free(inp), free(w), free(dout), free(dw0), free(db0), free(t), free(dr);
    free(dwr), free(dbr);
}
static void test_fused_and_set(void) {
    for (int blas = 0; blas < 2; blas++) {
        pt_sgemm_set_path(blas ? PT_GEMM_BLAS : PT_GEMM_OWN);
        fused_case(1, 1, 1, 1);
        fused_case(13, 31, 17, 1);
        fused_case(300, 40, 257, 1); /* above the parallel thresholds */
        fused_case(256, 64, 96, 1);
        fused_case(150, 96, 600, 0.4); /* own GEMM: 2 N blocks forward, 2 K blocks back */
        gelu_set_case(13, 31, 17, 1);
        gelu_set_case(200, 130, 96, 1);
        gelu_set_case(100, 600, 520, 0.4);
    }
    pt_sgemm_set_path(PT_GEMM_AUTO);
    attention_set_case(1, 1, 4, 1);
    attention_set_case(2, 65, 24, 3);
    attention_set_case(1, 130, 32, 4);
    attention_set_case(2, 256, 128, 2);
    attention_set_case(1, 1, 64, 1);
    attention_set_case(1, 97, 128, 2);
}

/* The split backward's kernels (B: input gradients, W: weight gradients)
 * against the reference backward, and BIT FOR BIT against the fused
 * kernels they are the halves of, at every thread count: the linears'
 * input and weight passes are the fused kernels' products, LayerNorm's
 * row and column passes the fused kernel's. */
static void split_case(int N, int C, int OC, double sc) {
    long NC = (long)N * C, NO = (long)N * OC, CO = (long)C * OC;
    float *x = rnd(NC, sc), *w = rnd(CO, sc), *dout = rnd(NO, sc), *dw0 = rnd(CO, 1);
    float *db0 = rnd(OC, 1), *pre = rnd(NC, 2), *gin = rnd(NC, 1), *dx0 = rnd(NC, 1);
    float *lw = rnd(C, 1), *lb = rnd(C, 1), *dres = rnd(NC, 1), *ld = rnd(NC, 1);
    float *lo = rnd(NC, 1), *lmean = rnd(N, 1), *lrstd = rnd(N, 1);
    pt_ref_gelu_forward(gin, pre, NC);
    pt_ref_layernorm_forward(lo, lmean, lrstd, x, lw, lb, N, C);
    /* oracles: the reference backwards; c_proj's through GELU into a
     * temporary then GELU's backward */
    float *dxr = calloc(NC, 4), *dwr = dupf(dw0, CO), *dbr = dupf(db0, OC);
    pt_ref_matmul_backward(dxr, dwr, dbr, dout, x, w, N, C, OC);
    float *t = calloc(NC, 4), *dgr = calloc(NC, 4), *dwg = dupf(dw0, CO), *dbg = dupf(db0, OC);
    pt_ref_matmul_backward(t, dwg, dbg, dout, gin, w, N, C, OC);
    pt_ref_gelu_backward(dgr, pre, t, NC);
    float *dxwr = dupf(dx0, NC), *dwwr = dupf(dw0, CO), *dbwr = dupf(db0, OC);
    pt_ref_matmul_backward_wt(dxwr, dwwr, dbwr, dout, x, w, N, C, OC);
    float *dlr = dupf(dx0, NC), *lwr = dupf(lw, C), *lbr = dupf(lb, C);
    pt_ref_layernorm_backward(dlr, lwr, lbr, ld, x, lw, lmean, lrstd, N, C);
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        /* linear: fused vs input_set + weight */
        float *dxf = nans(NC), *dwf = dupf(dw0, CO), *dbf = dupf(db0, OC);
        float *dxs = nans(NC), *dws = dupf(dw0, CO), *dbs = dupf(db0, OC);
        pt_matmul_backward_set(dxf, dwf, dbf, dout, x, w, N, C, OC);
        pt_matmul_backward_input_set(dxs, dout, w, N, C, OC);
        pt_matmul_backward_weight(dws, dbs, dout, x, N, C, OC);
        close_all("mm_input_set dinp", dxs, dxr, NC);
        close_all("mm_weight dweight", dws, dwr, CO);
        close_all("mm_weight dbias", dbs, dbr, OC);
        CHECK(memcmp(dxs, dxf, sizeof(float) * NC) == 0);
        CHECK(memcmp(dws, dwf, sizeof(float) * CO) == 0);
        CHECK(memcmp(dbs, dbf, sizeof(float) * OC) == 0);
        /* no bias gradient */
        float *dwn = dupf(dw0, CO);
        pt_matmul_backward_weight(dwn, NULL, dout, x, N, C, OC);
        CHECK(memcmp(dwn, dwf, sizeof(float) * CO) == 0);
        /* through GELU */
        memcpy(dwf, dw0, sizeof(float) * CO), memcpy(dbf, db0, sizeof(float) * OC);
        memcpy(dws, dw0, sizeof(float) * CO), memcpy(dbs, db0, sizeof(float) * OC);
        pt_matmul_backward_gelu_set(dxf, dwf, dbf, dout, gin, w, pre, N, C, OC);
        for (long i = 0; i < NC; i++) dxs[i] = NAN;
        pt_matmul_backward_input_gelu_set(dxs, dout, w, pre, N, C, OC);
        pt_matmul_backward_weight(dws, dbs, dout, gin, N, C, OC);
        close_all("mm_input_gelu_set dpre", dxs, dgr, NC);
        close_all("mm_weight (gelu) dweight", dws, dwg, CO);
        close_all("mm_weight (gelu) dbias", dbs, dbg, OC);
        CHECK(memcmp(dxs, dxf, sizeof(float) * NC) == 0);
        CHECK(memcmp(dws, dwf, sizeof(float) * CO) == 0);
        CHECK(memcmp(dbs, dbf, sizeof(float) * OC) == 0);
        /* weight stored transposed, (OC,C): both accumulate */
        memcpy(dxf, dx0, sizeof(float) * NC), memcpy(dxs, dx0, sizeof(float) * NC);
        memcpy(dwf, dw0, sizeof(float) * CO), memcpy(dbf, db0, sizeof(float) * OC);
        memcpy(dws, dw0, sizeof(float) * CO), memcpy(dbs, db0, sizeof(float) * OC);
        pt_matmul_backward_wt(dxf, dwf, dbf, dout, x, w, N, C, OC);
        pt_matmul_backward_wt_input(dxs, dout, w, N, C, OC);
        pt_matmul_backward_wt_weight(dws, dbs, dout, x, N, C, OC);
        close_all("mm_wt_input dinp", dxs, dxwr, NC);
        close_all("mm_wt_weight dweight", dws, dwwr, CO);
        close_all("mm_wt_weight dbias", dbs, dbwr, OC);
        CHECK(memcmp(dxs, dxf, sizeof(float) * NC) == 0);
        CHECK(memcmp(dws, dwf, sizeof(float) * CO) == 0);
        CHECK(memcmp(dbs, dbf, sizeof(float) * OC) == 0);
        /* LayerNorm: accumulating, and with a residual (in place too) */
        float *lxf = dupf(dx0, NC), *lwf = dupf(lw, C), *lbf = dupf(lb, C);
        float *lxs = dupf(dx0, NC), *lws = dupf(lw, C), *lbs = dupf(lb, C);
        pt_layernorm_backward(lxf, lwf, lbf, ld, x, lw, lmean, lrstd, N, C);
        pt_layernorm_backward_input(lxs, NULL, ld, x, lw, lmean, lrstd, N, C);
        pt_layernorm_backward_params(lws, lbs, ld, x, lmean, lrstd, N, C);
        close_all("ln_input dinp", lxs, dlr, NC);
        close_all("ln_params dweight", lws, lwr, C);
        close_all("ln_params dbias", lbs, lbr, C);
        CHECK(memcmp(lxs, lxf, sizeof(float) * NC) == 0);
        CHECK(memcmp(lws, lwf, sizeof(float) * C) == 0);
        CHECK(memcmp(lbs, lbf, sizeof(float) * C) == 0);
        float *rx = dupf(dres, NC);
        memcpy(lwf, lw, sizeof(float) * C), memcpy(lbf, lb, sizeof(float) * C);
        pt_layernorm_backward_res(lxf, dres, lwf, lbf, ld, x, lw, lmean, lrstd, N, C);
        for (long i = 0; i < NC; i++) lxs[i] = NAN;
        pt_layernorm_backward_input(lxs, dres, ld, x, lw, lmean, lrstd, N, C);
        pt_layernorm_backward_input(rx, rx, ld, x, lw, lmean, lrstd, N, C);
        CHECK(memcmp(lxs, lxf, sizeof(float) * NC) == 0);
        CHECK(memcmp(rx, lxf, sizeof(float) * NC) == 0);
        free(dxf), free(dwf), free(dbf), free(dxs), free(dws), free(dbs), free(dwn);
        free(lxf), free(lwf), free(lbf), free(lxs), free(lws), free(lbs), free(rx);
    }
    pt_kernels_set_threads(1);
    free(x), free(w), free(dout), free(dw0), free(db0), free(pre), free(gin), free(dx0);
    free(lw), free(lb), free(dres), free(ld), free(lo), free(lmean), free(lrstd);
    free(dxr), free(dwr), free(dbr), free(t), free(dgr), free(dwg), free(dbg);
    free(dxwr), free(dwwr), free(dbwr), free(dlr), free(lwr), free(lbr);
}
static void test_split_backward(void) {
    for (int blas = 0; blas < 2; blas++) {
        pt_sgemm_set_path(blas ? PT_GEMM_BLAS : PT_GEMM_OWN);
        split_case(1, 1, 1, 1);
        split_case(13, 31, 17, 1);
        split_case(300, 40, 257, 1);   /* above the parallel thresholds */
        split_case(150, 96, 600, 0.4); /* own GEMM: 2 K blocks back */
    }
    pt_sgemm_set_path(PT_GEMM_AUTO);
}

static void xent_case(int N, int V) {
    float *l = rnd((long)N * V, 5), *lossr = rnd(N, 1), *dr = rnd((long)N * V, 1);
    int *tg = malloc(sizeof(int) * N);
    for (int n = 0; n < N; n++) tg[n] = (n * 7919) % V;
    pt_ref_softmax_xent_forward_backward(lossr, dr, l, tg, N, V, 1.0f / N);
    float *first_loss = NULL, *first_d = NULL;
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *loss = rnd(N, 1), *loss2 = rnd(N, 1), *d = dupf(l, (long)N * V);
        pt_softmax_xent_forward_backward(loss, d, d, tg, N, V, 1.0f / N); /* in place */
        pt_softmax_xent_forward_backward(loss2, NULL, l, tg, N, V, 1.0f / N);
        close_all("xent loss", loss, lossr, N);
        close_all("xent loss (no grad)", loss2, lossr, N);
        /* dlogits are O(1/N V): compare with an absolute scale of their own */
        int bad = 0;
        for (long i = 0; i < (long)N * V; i++)
            if (fabs(d[i] - dr[i]) > 1e-7 / N + 1e-5 * fabs(dr[i])) bad++;
        CHECK(bad == 0);
        if (k == 0) {
            first_loss = loss, first_d = d;
        } else {
            threads_agree("xent loss", loss, first_loss, N, NULL);
            threads_agree("xent dlogits", d, first_d, (long)N * V, NULL);
            free(loss), free(d);
        }
        free(loss2);
    }
    pt_kernels_set_threads(1);
    free(first_loss), free(first_d);
    free(l), free(lossr), free(dr), free(tg);
}
static void test_softmax_xent(void) {
    xent_case(1, 1);
    xent_case(3, 13);
    xent_case(17, 5003);
}

/* AdamW against one step computed in double from the formula in kernels.h. */
static void test_adamw(void) {
    const long n = 100001;
    for (int k = 0; k < NTHREADS; k++) {
        pt_kernels_set_threads(THREADS[k]);
        float *p = rnd(n, 1), *g = rnd(n, 1), *m = rnd(n, 0.1), *v = rnd(n, 0.1);
        for (long i = 0; i < n; i++) v[i] = fabsf(v[i]);
        float *p0 = dupf(p, n), *m0 = dupf(m, n), *v0 = dupf(v, n);
        const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
        const int t = 3;
        pt_adamw_update(p, g, m, v, n, lr, b1, b2, eps, wd, t, gs);
        { /* the same bits as one thread on the same inputs */
            float *p1 = dupf(p0, n), *m1 = dupf(m0, n), *v1 = dupf(v0, n);
            pt_kernels_set_threads(1);
            pt_adamw_update(p1, g, m1, v1, n, lr, b1, b2, eps, wd, t, gs);
            pt_kernels_set_threads(THREADS[k]);
            threads_agree("adamw param", p, p1, n, NULL);
            threads_agree("adamw m", m, m1, n, NULL);
            threads_agree("adamw v", v, v1, n, NULL);
            free(p1), free(m1), free(v1);
        }
        int bad = 0;
        for (long i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            double mi = (double)b1 * m0[i] + (1.0 - (double)b1) * gi;
            double vi = (double)b2 * v0[i] + (1.0 - (double)b2) * gi * gi;
            double mh = mi / (1.0 - pow(b1, t)), vh = vi / (1.0 - pow(b2, t));
            double step = (double)lr * (mh / (sqrt(vh) + eps) + (double)wd * p0[i]);
            double pi = p0[i] - step;
            if (fabs(m[i] - mi) > 1e-7 + 1e-5 * fabs(mi)) bad++;
            if (fabs(v[i] - vi) > 1e-9 + 1e-5 * fabs(vi)) bad++;
            /* float rounds p0 and the step (|mhat| / sqrt(vhat) reaches ~50
             * with random, unrelated m and v, so the step is not always
             * O(lr)): ~1e-7 of |p0| + |step|, whatever cancels between them */
            if (fabs(p[i] - pi) > 1e-6 * (fabs(p0[i]) + fabs(step) + lr)) {
                if (bad < 3) fprintf(stderr, "  adamw p[%ld] %.9g want %.9g\n", i, p[i], pi);
                bad++;
            }
        }
        CHECK(bad == 0);
        /* and against the float reference kernel */
        float *pr = dupf(p0, n), *mr = dupf(m0, n), *vr = dupf(v0, n);
        pt_ref_adamw_update(pr, g, mr, vr, n, lr, b1, b2, eps, wd, t, gs);
        close_all("adamw param", p, pr, n);
        /* the fused AdamW + sum of squares: bitwise pt_adamw_update and
         * pt_sum_squares (the oracle above and test_sum_squares), at n below
         * and above its parallel threshold */
        for (long nn = 1000; nn <= n; nn += n - 1000) {
            float *p2 = dupf(p0, nn), *m2 = dupf(m0, nn), *v2 = dupf(v0, nn);
            float *p3 = dupf(p0, nn), *m3 = dupf(m0, nn), *v3 = dupf(v0, nn);
            pt_adamw_update(p3, g, m3, v3, nn, lr, b1, b2, eps, wd, t, gs);
            double ss = pt_adamw_update_sumsq(p2, g, m2, v2, nn, lr, b1, b2, eps, wd, t, gs);
            CHECK(ss == pt_sum_squares(g, nn));
            CHECK(memcmp(p2, p3, sizeof(float) * nn) == 0);
            CHECK(memcmp(m2, m3, sizeof(float) * nn) == 0);
            CHECK(memcmp(v2, v3, sizeof(float) * nn) == 0);
            free(p2), free(m2), free(v2), free(p3), free(m3), free(v3);
        }
        free(p), free(g), free(m), free(v), free(p0), free(m0), free(v0), free(pr), free(mr);
        free(vr);
    }
    pt_kernels_set_threads(1);
}

static void test_sum_squares(void) {
    const long sizes[] = {0, 1, 7, 1025, 300007};
    for (int s = 0; s < 5; s++) {
        long n = sizes[s];
        float *x = rnd(n, 3);
        double want = 0.0;
        for (long i = 0; i < n; i++) want += (double)x[i] * x[i];
        double first = 0.0;
        for (int k = 0; k < NTHREADS; k++) {
            pt_kernels_set_threads(THREADS[k]);
            double got = pt_sum_squares(x, n);
            CHECK_NEAR(got, want, 1e-12, 1e-6);
            if (k == 0)
                first = got;
            else
                CHECK(got == first); /* same bits at any thread count */
        }
        free(x);
    }
    pt_kernels_set_threads(1);
}

/* pt_fill_normal is the scalar draw, element by element, at an offset
 * counter, below and above its parallel threshold, at every thread count. */
static void test_fill_normal(void) {
    const long sizes[] = {0, 1, 4095, 4096, 100003};
    const uint64_t key = pt_rng_key(5, "h.0.mlp.c_fc.weight"), first = 12345;
    for (int s = 0; s < 5; s++) {
        long n = sizes[s];
        float *w = malloc((size_t)(n + 1) * sizeof *w);
        for (int k = 0; k < NTHREADS; k++) {
            pt_kernels_set_threads(THREADS[k]);
            w[n] = -1.0f; /* a sentinel past the end */
            pt_fill_normal(w, n, key, first, 0.02f);
            int same = w[n] == -1.0f;
            for (long j = 0; j < n; j++)
                same &= w[j] == 0.02f * pt_rng_normal_at(key, first + (uint64_t)j);
            CHECK(same);
        }
        free(w);
    }
    pt_kernels_set_threads(1);
}

static void test_fast_exp(void) {
    double worst = 0.0;
    for (float x = -87.0f; x <= 88.0f; x += 0.001953125f) {
        double want = exp((double)x), got = pt_fast_expf(x);
        double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
    }
    fprintf(stderr, "  fast exp: worst relative error %.3g\n", worst);
    CHECK(worst < 2e-7);
    /* the vector exp gives the scalar one's bits */
    int differ = 0;
    for (float x = -100.0f; x <= 100.0f; x += 0.37f * PT_VW) {
        float in[PT_VW], out[PT_VW];
        for (int j = 0; j < PT_VW; j++) in[j] = x + 0.37f * j;
        pt_v8_store(out, pt_v8_exp(pt_v8_load(in)));
        for (int j = 0; j < PT_VW; j++) differ += out[j] != pt_fast_expf(in[j]);
    }
    CHECK(differ == 0);
    CHECK(pt_fast_expf(-1000.0f) < 1e-37f);
    CHECK(isfinite(pt_fast_expf(1000.0f)));
}

/* The launcher forks ranks, perhaps after the parent ran threaded kernels:
 * the child must not wait for pool workers that fork did not copy. */
static void test_fork_after_threads(void) {
    const long N = 200000;
    float *x = rnd(N, 2), *a = rnd(N, 1), *b = rnd(N, 1), *mean = rnd(N / 100, 1);
    float *rstd = rnd(N / 100, 1), *w = rnd(100, 1), *bias = rnd(100, 1);
    pt_kernels_set_threads(2);
    pt_layernorm_forward(a, mean, rstd, x, w, bias, N / 100, 100);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* a hang becomes a failure, not a stuck test */
        pt_layernorm_forward(b, mean, rstd, x, w, bias, N / 100, 100);
        _exit(memcmp(a, b, sizeof(float) * N) == 0 ? 0 : 1);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pt_kernels_set_threads(1);
    free(x), free(a), free(b), free(mean), free(rstd), free(w), free(bias);
}

/* The speed probe on n cores at once: a positive rate; every thread ran
 * its own product on its own part of the buffer (parts filled alike but
 * for their outputs come out alike, bit for bit); the thread count is
 * restored. Not its speed: that is the machine's. */
static void test_speed_probe(void) {
    size_t per = pt_speed_probe_floats();
    enum { MAXN = 3 };
    float *buf = malloc(sizeof(float) * per * MAXN);
    CHECK(buf != NULL);
    if (!buf) return;
    for (int n = 1; n <= MAXN; n++) {
        for (int i = 0; i < MAXN; i++)
            for (size_t j = 0; j < per; j++)
                buf[i * per + j] = (float)((j * 7 + 3) % 17) * 0.125f - 1.0f;
        for (int i = 0; i < MAXN; i++) buf[i * per] = 1000.0f + (float)i; /* each output's first */
        pt_kernels_set_threads(2);
        double r = n == 1 ? pt_speed_probe(buf) : pt_speed_probe_cores(buf, n);
        CHECK(r > 0 && r < 1e15);
        CHECK(pt_kernels_threads() == 2);
        for (int i = 1; i < n; i++) CHECK(memcmp(buf, buf + i * per, sizeof(float) * per) == 0);
        for (int i = n; i < MAXN; i++) CHECK(buf[i * per] == 1000.0f + (float)i); /* untouched */
    }
    pt_kernels_set_threads(1);
    free(buf);
}

/* The OpenBLAS core advice (blas_core.c) on both kinds of CPU, with fake
 * feature sets: only a core below what the CPU supports gets advice. */
static void test_blas_coretype_advice(void) {
    const pt_cpu_features none = {0};
    const pt_cpu_features avx2 = {.avx2 = 1, .fma = 1};
    const pt_cpu_features avx512 = {
        .avx2 = 1, .fma = 1, .avx512f = 1, .avx512bw = 1, .avx512vl = 1, .avx512dq = 1};
    pt_cpu_features knl = avx512; /* AVX-512F without BW/VL/DQ (Knights Landing) */
    knl.avx512bw = knl.avx512vl = knl.avx512dq = 0;
    pt_cpu_features avx2_nofma = {.avx2 = 1};
    const struct {
        const char *core;
        const pt_cpu_features *f;
        const char *want; /* NULL: nothing to do */
    } cases[] = {
        {"Prescott", &avx2, "Haswell"},   {"Prescott", &avx512, "SkylakeX"},
        {"SkylakeX", &avx512, NULL},      {"Haswell", &avx2, NULL},
        {"Prescott", &none, NULL},        {"Sandybridge", &avx512, "SkylakeX"},
        {"Haswell", &avx512, "SkylakeX"}, {"Zen", &avx2, NULL},
        {"Cooperlake", &avx512, NULL},    {"SapphireRapids", &avx512, NULL},
        {"SKYLAKEX", &avx512, NULL},      {"SkylakeX", &avx2, NULL},
        {"Nehalem", &knl, "Haswell"},     {"Prescott", &avx2_nofma, NULL},
        {NULL, &avx512, "SkylakeX"},      {"", &avx2, "Haswell"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = pt_blas_coretype_advice(cases[i].core, cases[i].f);
        int ok = cases[i].want ? got && !strcmp(got, cases[i].want) : got == NULL;
        if (!ok)
            fprintf(stderr, "  advice for core %s: got %s, want %s\n",
                    cases[i].core ? cases[i].core : "(null)", got ? got : "none",
                    cases[i].want ? cases[i].want : "none");
        CHECK(ok);
    }
    /* this machine, for the log */
    pt_cpu_features f;
    pt_cpu_features_detect(&f);
    const char *core = pt_blas_corename(), *adv = pt_blas_coretype_advice(core, &f);
    fprintf(stderr,
            "  this CPU: avx2 %d fma %d avx512 f/bw/vl/dq %d%d%d%d; OpenBLAS core %s; advice %s\n",
            f.avx2, f.fma, f.avx512f, f.avx512bw, f.avx512vl, f.avx512dq, core ? core : "?",
            adv ? adv : "none");
    CHECK(core != NULL);
}

int main(void) {
    RUN(test_blas_coretype_advice);
    RUN(test_fast_exp);
    RUN(test_encoder);
    RUN(test_layernorm);
    RUN(test_matmul);
    RUN(test_gelu);
    RUN(test_attention);
    RUN(test_fused_and_set);
    RUN(test_split_backward);
    RUN(test_softmax_xent);
    RUN(test_adamw);
    RUN(test_sum_squares);
    RUN(test_fill_normal);
    RUN(test_fork_after_threads);
    RUN(test_speed_probe);
    return TEST_DONE();
}
