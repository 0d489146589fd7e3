/* Linear layers through pt_sgemm (gemm.c), with the elementwise work around
 * them fused into the product: bias and residual are added to each output
 * tile as it is written, GELU (forward) or GELU's derivative (backward) is
 * applied there too, and the bias gradient is summed while the product
 * packs dout. No separate pass over an activation-sized array. */

#include "kernels_impl.h"

void pt_matmul_forward_res(float *out, const float *res, const float *inp, const float *weight,
                           const float *bias, int N, int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias, .res = res};
    pt_sgemm(0, 0, N, OC, C, inp, C, weight, OC, 0.0f, out, OC, &e);
}

void pt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias};
    pt_sgemm(0, 0, N, OC, C, inp, C, weight, OC, 0.0f, out, OC, &e);
}

void pt_matmul_gelu_forward(float *pre, float *out, const float *inp, const float *weight,
                            const float *bias, int N, int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias, .act = out};
    pt_sgemm(0, 0, N, OC, C, inp, C, weight, OC, 0.0f, pre, OC, &e);
}

/* dweight (C,OC) += inp^T (C,N) @ dout (N,OC); dbias summed as dout is
 * packed. */
static void weight_backward(float *dweight, float *dbias, const float *dout, const float *inp,
                            int N, int C, int OC) {
    pt_gemm_epilogue e = {.colsum = dbias};
    pt_sgemm(1, 0, C, OC, N, inp, C, dout, OC, 1.0f, dweight, OC, &e);
}

void pt_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int N, int C, int OC) {
    /* dinp (N,C) += dout (N,OC) @ weight^T (OC,C) */
    if (dinp) pt_sgemm(0, 1, N, C, OC, dout, OC, weight, OC, 1.0f, dinp, C, NULL);
    weight_backward(dweight, dbias, dout, inp, N, C, OC);
}

void pt_matmul_backward_set(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC) {
    pt_sgemm(0, 1, N, C, OC, dout, OC, weight, OC, 0.0f, dinp, C, NULL);
    weight_backward(dweight, dbias, dout, inp, N, C, OC);
}

void pt_matmul_backward_gelu_set(float *dpre, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *pre, int N,
                                 int C, int OC) {
    pt_gemm_epilogue e = {.pre = pre};
    pt_sgemm(0, 1, N, C, OC, dout, OC, weight, OC, 0.0f, dpre, C, &e);
    weight_backward(dweight, dbias, dout, inp, N, C, OC);
}

/* out (N,OC) = inp (N,C) @ weight^T, weight (OC,C) */
void pt_matmul_forward_wt(float *out, const float *inp, const float *weight, const float *bias,
                          int N, int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias};
    pt_sgemm(0, 1, N, OC, C, inp, C, weight, C, 0.0f, out, OC, &e);
}

void pt_matmul_backward_wt(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int C, int OC) {
    /* dinp (N,C) += dout (N,OC) @ weight (OC,C) */
    if (dinp) pt_sgemm(0, 0, N, C, OC, dout, OC, weight, C, 1.0f, dinp, C, NULL);
    /* dweight (OC,C) += dout^T (OC,N) @ inp (N,C) */
    pt_sgemm(1, 0, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C, NULL);
    if (dbias) pt_colsum_add(dbias, dout, OC, N, OC);
}
