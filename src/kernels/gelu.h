/* GELU's tanh form and its derivative, for the matrix product's fused
 * epilogues (gemm.c) and pt_gelu_forward (matmul.c), a recompute's GELU.
 *
 * gelu(x) = x / (1 + exp(-2u)), u = k (x + 0.044715 x^3), k = sqrt(2/pi):
 * the same function as 0.5 x (1 + tanh u), accurate in relative terms for
 * large |x| of either sign (no 1 + tanh cancellation), and needs one
 * vectorizable exp. Derivative with s = sigmoid(2u): s + 2 x s (1 - s) u'. */
#ifndef PARTRAIN_KERNELS_GELU_H
#define PARTRAIN_KERNELS_GELU_H

#include "fastmath.h"

#define GELU_K  0.7978845608028654f
#define GELU_K3 (0.7978845608028654f * 0.044715f)

static inline float pt_gelu(float x) {
    float u2 = -2.0f * x * (GELU_K + GELU_K3 * x * x);
    return x / (1.0f + pt_fast_expf(u2));
}

static inline float pt_gelu_grad(float x) {
    float x2 = x * x;
    float u2 = -2.0f * x * (GELU_K + GELU_K3 * x2);
    float s = 1.0f / (1.0f + pt_fast_expf(u2));
    float du = GELU_K + 3.0f * GELU_K3 * x2;
    return s + 2.0f * x * s * (1.0f - s) * du;
}

static inline pt_v8f pt_v8_gelu(pt_v8f x) {
    pt_v8f u2 = -2.0f * x * (GELU_K + GELU_K3 * x * x);
    return x / (1.0f + pt_v8_exp(u2));
}

static inline pt_v8f pt_v8_gelu_grad(pt_v8f x) {
    pt_v8f x2 = x * x;
    pt_v8f u2 = -2.0f * x * (GELU_K + GELU_K3 * x2);
    pt_v8f s = 1.0f / (1.0f + pt_v8_exp(u2));
    pt_v8f du = GELU_K + 3.0f * GELU_K3 * x2;
    return s + 2.0f * x * s * (1.0f - s) * du;
}

#endif
