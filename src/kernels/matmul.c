/* Linear layers through pt_sgemm (gemm.c), with the elementwise work around
 * them fused into the product: bias and residual are added to each output
 * tile as it is written, GELU (forward) or GELU's derivative (backward) is
 * applied there too, and the bias gradient is summed while the product
 * packs dout. No separate pass over an activation-sized array. */

#include "gelu.h"
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

/* The GEMM epilogue's GELU (gemm.c): vector lanes, then a scalar tail; the
 * two are the same steps (fastmath.h), so any split gives the same bits. */
void pt_gelu_forward(float *out, const float *pre, size_t n) {
    size_t x = 0;
    for (; x + PT_VW <= n; x += PT_VW) pt_v8_store(out + x, pt_v8_gelu(pt_v8_load(pre + x)));
    for (; x < n; x++) out[x] = pt_gelu(pre[x]);
}

/* The fused backwards below are their input-gradient pass followed by
 * their weight-gradient pass: the split kernels (a zero-bubble schedule's B
 * and W) are the same calls, so B then W gives the fused kernel's bits. */

void pt_matmul_backward_input_set(float *dinp, const float *dout, const float *weight, int N, int C,
                                  int OC) {
    /* dinp (N,C) = dout (N,OC) @ weight^T (OC,C) */
    pt_sgemm(0, 1, N, C, OC, dout, OC, weight, OC, 0.0f, dinp, C, NULL);
}

void pt_matmul_backward_input_gelu_set(float *dpre, const float *dout, const float *weight,
                                       const float *pre, int N, int C, int OC) {
    pt_gemm_epilogue e = {.pre = pre};
    pt_sgemm(0, 1, N, C, OC, dout, OC, weight, OC, 0.0f, dpre, C, &e);
}

/* dweight (C,OC) += inp^T (C,N) @ dout (N,OC); dbias summed as dout is
 * packed. */
void pt_matmul_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                               int N, int C, int OC) {
    pt_gemm_epilogue e = {.colsum = dbias};
    pt_sgemm(1, 0, C, OC, N, inp, C, dout, OC, 1.0f, dweight, OC, &e);
}

void pt_matmul_backward_set(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC) {
    pt_matmul_backward_input_set(dinp, dout, weight, N, C, OC);
    pt_matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

void pt_matmul_backward_gelu_set(float *dpre, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *pre, int N,
                                 int C, int OC) {
    pt_matmul_backward_input_gelu_set(dpre, dout, weight, pre, N, C, OC);
    pt_matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

/* out (N,OC) = inp (N,C) @ weight^T, weight (OC,C) */
void pt_matmul_forward_wt(float *out, const float *inp, const float *weight, const float *bias,
                          int N, int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias};
    pt_sgemm(0, 1, N, OC, C, inp, C, weight, C, 0.0f, out, OC, &e);
}

void pt_matmul_backward_wt_input(float *dinp, const float *dout, const float *weight, int N, int C,
                                 int OC) {
    /* dinp (N,C) += dout (N,OC) @ weight (OC,C) */
    pt_sgemm(0, 0, N, C, OC, dout, OC, weight, C, 1.0f, dinp, C, NULL);
}

void pt_matmul_backward_wt_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                                  int N, int C, int OC) {
    /* dweight (OC,C) += dout^T (OC,N) @ inp (N,C) */
    pt_sgemm(1, 0, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C, NULL);
    if (dbias) pt_colsum_add(dbias, dout, OC, N, OC);
}

void pt_matmul_backward_wt(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int C, int OC) {
    if (dinp) pt_matmul_backward_wt_input(dinp, dout, weight, N, C, OC);
    pt_matmul_backward_wt_weight(dweight, dbias, dout, inp, N, C, OC);
}
