/* Linear layers through CBLAS sgemm. The bias is folded into the product:
 * output rows start as copies of the bias and sgemm runs with beta = 1, so
 * there is no separate pass over the output. Backward accumulates with
 * beta = 1 too (the += contract costs nothing). dbias is a column sum.
 *
 * Not here: our own GEMM. OpenBLAS is the same library PyTorch uses on this
 * machine; the margin over it is won in the other kernels. */
#include <cblas.h>
#include <string.h>

#include "kernels_impl.h"

typedef struct {
    float *out;
    const float *bias, *dout;
    int N, OC;
} bias_ctx;

static void init_rows_part(void *p, int index, int count) {
    bias_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++)
        memcpy(c->out + n * c->OC, c->bias, sizeof(float) * (size_t)c->OC);
}

/* Output rows start as copies of the bias (sgemm then runs with beta = 1). */
static void init_rows_with_bias(float *out, const float *bias, int N, int OC) {
    bias_ctx c = {.out = out, .bias = bias, .N = N, .OC = OC};
    pt_pool_run(init_rows_part, &c, (long)N * OC < 65536 ? 1 : pt_kernels_threads());
}

/* Columns [lo, hi) of dbias, rows added in order: the same bits at any
 * thread count. */
static void bias_backward_part(void *p, int index, int count) {
    bias_ctx *c = p;
    long lo, hi;
    pt_split_range(c->OC, index, count, &lo, &hi);
    float *restrict dbias = c->out;
    for (long n = 0; n < c->N; n++) {
        const float *restrict d = c->dout + n * c->OC;
        for (long o = lo; o < hi; o++) dbias[o] += d[o];
    }
}

/* dbias (OC) += column sums of dout (N,OC). */
static void bias_backward(float *dbias, const float *dout, int N, int OC) {
    bias_ctx c = {.out = dbias, .dout = dout, .N = N, .OC = OC};
    int nw = (long)N * OC < 65536 || OC < 64 ? 1 : pt_kernels_threads();
    pt_pool_run(bias_backward_part, &c, nw);
}

typedef struct {
    float *out;
    const float *res, *bias;
    int N, OC;
} res_ctx;

static void init_rows_res_part(void *p, int index, int count) {
    res_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++) {
        float *o = c->out + n * c->OC; /* may alias r */
        const float *r = c->res + n * c->OC;
        if (c->bias)
            for (int j = 0; j < c->OC; j++) o[j] = r[j] + c->bias[j];
        else if (o != r)
            memcpy(o, r, sizeof(float) * (size_t)c->OC);
    }
}

/* out (N,OC) = res + inp (N,C) @ weight (C,OC) + bias */
void pt_matmul_forward_res(float *out, const float *res, const float *inp, const float *weight,
                           const float *bias, int N, int C, int OC) {
    res_ctx c = {.out = out, .res = res, .bias = bias, .N = N, .OC = OC};
    pt_pool_run(init_rows_res_part, &c, (long)N * OC < 65536 ? 1 : pt_kernels_threads());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC, 1.0f,
                out, OC);
}

/* out (N,OC) = inp (N,C) @ weight (C,OC) + bias (OC) */
void pt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC) {
    float beta = 0.0f;
    if (bias) {
        init_rows_with_bias(out, bias, N, OC);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC, beta,
                out, OC);
}

/* dbias goes first in both backward variants: dout was just written by the
 * previous kernel and is partly still in cache, which the two sgemms flush. */
void pt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC) {
    if (dbias) bias_backward(dbias, dout, N, OC);
    /* dinp (N,C) += dout (N,OC) @ weight^T (OC,C) */
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC,
                    1.0f, dinp, C);
    /* dweight (C,OC) += inp^T (C,N) @ dout (N,OC) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f,
                dweight, OC);
}

/* As pt_matmul_backward with dinp overwritten: beta = 0 costs the same as
 * beta = 1 inside sgemm and saves the caller's memset of dinp. */
void pt_matmul_backward_set(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC) {
    if (dbias) bias_backward(dbias, dout, N, OC);
    /* dinp (N,C) = dout (N,OC) @ weight^T (OC,C) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f,
                dinp, C);
    pt_matmul_backward(NULL, dweight, NULL, dout, inp, weight, N, C, OC);
}

/* out (N,OC) = inp (N,C) @ weight^T, weight (OC,C) */
void pt_matmul_forward_wt(float *out, const float *inp, const float *weight, const float *bias,
                          int N, int C, int OC) {
    float beta = 0.0f;
    if (bias) {
        init_rows_with_bias(out, bias, N, OC);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta,
                out, OC);
}

void pt_matmul_backward_wt(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int C, int OC) {
    /* dinp (N,C) += dout (N,OC) @ weight (OC,C) */
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                    1.0f, dinp, C);
    /* dweight (OC,C) += dout^T (OC,N) @ inp (N,C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
    if (dbias) bias_backward(dbias, dout, N, OC);
}
