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

static void init_rows_with_bias(float *out, const float *bias, int N, int OC) {
    for (int n = 0; n < N; n++) memcpy(out + (long)n * OC, bias, sizeof(float) * (size_t)OC);
}

/* dbias (OC) += column sums of dout (N,OC); rows added in order so results
 * do not depend on thread count. */
static void bias_backward(float *restrict dbias, const float *restrict dout, int N, int OC) {
    for (int n = 0; n < N; n++) {
        const float *restrict d = dout + (long)n * OC;
        for (int o = 0; o < OC; o++) dbias[o] += d[o];
    }
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

void pt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC) {
    /* dinp (N,C) += dout (N,OC) @ weight^T (OC,C) */
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC,
                    1.0f, dinp, C);
    /* dweight (C,OC) += inp^T (C,N) @ dout (N,OC) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f,
                dweight, OC);
    if (dbias) bias_backward(dbias, dout, N, OC);
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
