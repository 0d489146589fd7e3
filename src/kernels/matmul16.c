/* The linears of a bf16 model (kernels.h, "bf16 kernels"): matmul.c's
 * calls on pt_gemm_bf16x, bf16 weights and activations, fp32 gradients
 * rounded as the products read them, the elementwise work in the
 * epilogues as in fp32 (bias, residual, GELU and its derivative, the bias
 * gradient) plus the bf16 copies a bf16 model keeps (the epilogue's out16
 * and act16), so that no pass over an activation-sized array is added.
 *
 * Not here: the fp32 linears (matmul.c), the product itself
 * (gemm_bf16*.c). */
#include "bf16_vec.h"
#include "gelu.h"
#include "kernels_impl.h"

enum { F32 = 1, BF16 = 0 };

void pt_matmul16_forward(float *out, pt_bf16 *out16, const pt_bf16 *inp, const pt_bf16 *weight,
                         const float *bias, int N, int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias, .out16 = out16};
    pt_gemm_bf16(0, 0, N, OC, C, inp, C, weight, OC, 0.0f, out, OC, &e);
}

void pt_matmul16_forward_res(float *out, const float *res, const pt_bf16 *inp,
                             const pt_bf16 *weight, const float *bias, int N, int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias, .res = res};
    pt_gemm_bf16(0, 0, N, OC, C, inp, C, weight, OC, 0.0f, out, OC, &e);
}

void pt_matmul16_gelu_forward(float *pre, pt_bf16 *pre16, pt_bf16 *out16, const pt_bf16 *inp,
                              const pt_bf16 *weight, const float *bias, int N, int C, int OC) {
    pt_gemm_epilogue e = {.bias = bias, .out16 = pre16, .act16 = out16};
    pt_gemm_bf16(0, 0, N, OC, C, inp, C, weight, OC, 0.0f, pre, OC, &e);
}

/* The epilogue's act16 on its own: the same lanes, so the same bits. */
typedef struct {
    pt_bf16 *out;
    const pt_bf16 *pre;
    size_t n;
} gelu_ctx;

static void gelu_part(void *p, int index, int count) {
    const gelu_ctx *g = p;
    long lo, hi;
    pt_split_range((long)((g->n + 15) / 16), index, count, &lo, &hi);
    size_t a = (size_t)lo * 16, b = (size_t)hi * 16 < g->n ? (size_t)hi * 16 : g->n;
    size_t x = a;
    for (; x + PT_VW <= b; x += PT_VW)
        pt_v8_store16(g->out + x, pt_v8_gelu(pt_v8_load16(g->pre + x)));
    for (; x < b; x++) g->out[x] = pt_bf16_of(pt_gelu(pt_f32_of16(g->pre[x])));
}

void pt_gelu_forward16(pt_bf16 *out, const pt_bf16 *pre, size_t n) {
    gelu_ctx g = {out, pre, n};
    pt_pool_run(gelu_part, &g, n < (1u << 15) ? 1 : pt_kernels_threads());
}

void pt_matmul16_backward_input_set(float *dinp, const float *dout, const pt_bf16 *weight, int N,
                                    int C, int OC) {
    /* dinp (N,C) = dout (N,OC) @ weight^T (OC,C) */
    pt_gemm_bf16x(0, 1, N, C, OC, dout, F32, OC, weight, BF16, OC, 0.0f, dinp, C, NULL);
}

void pt_matmul16_backward_input_gelu_set(float *dpre, const float *dout, const pt_bf16 *weight,
                                         const pt_bf16 *pre16, int N, int C, int OC) {
    pt_gemm_epilogue e = {.pre16 = pre16};
    pt_gemm_bf16x(0, 1, N, C, OC, dout, F32, OC, weight, BF16, OC, 0.0f, dpre, C, &e);
}

void pt_matmul16_backward_weight(float *dweight, float *dbias, const float *dout,
                                 const pt_bf16 *dout16, const pt_bf16 *inp, int N, int C, int OC) {
    PT_ASSERT(!dout != !dout16);
    pt_gemm_epilogue e = {.colsum = dbias};
    const void *d = dout ? (const void *)dout : (const void *)dout16;
    pt_gemm_bf16x(1, 0, C, OC, N, inp, BF16, C, d, dout ? F32 : BF16, OC, 1.0f, dweight, OC, &e);
}

void pt_matmul16_forward_wt(float *out, long ldo, const pt_bf16 *inp, const pt_bf16 *weight, int N,
                            int C, int OC) {
    /* out (N,OC) = inp (N,C) @ weight^T, weight (OC,C) */
    pt_gemm_bf16(0, 1, N, OC, C, inp, C, weight, C, 0.0f, out, (int)ldo, NULL);
}

void pt_matmul16_backward_wt_input_set(float *dinp, const pt_bf16 *dout, const pt_bf16 *weight,
                                       int N, int C, int OC) {
    /* dinp (N,C) = dout (N,OC) @ weight (OC,C) */
    pt_gemm_bf16(0, 0, N, C, OC, dout, OC, weight, C, 0.0f, dinp, C, NULL);
}

void pt_matmul16_backward_wt_weight(float *dweight, const pt_bf16 *dout, const pt_bf16 *inp, int N,
                                    int C, int OC) {
    /* dweight (OC,C) += dout^T (OC,N) @ inp (N,C) */
    pt_gemm_bf16(1, 0, OC, C, N, dout, OC, inp, C, 1.0f, dweight, C, NULL);
}
