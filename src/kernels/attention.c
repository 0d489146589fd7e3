/* Causal multi-head self-attention (placeholder: the reference loops). */
#include "kernels_impl.h"

void pt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    pt_ref_attention_forward(out, att, qkv, B, T, C, NH);
}

void pt_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH) {
    pt_ref_attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
}

size_t pt_attention_scratch_floats(int B, int T, int C, int NH) {
    (void)C;
    size_t slots = (size_t)B * NH;
    if (slots > PT_KERNELS_MAX_THREADS) slots = PT_KERNELS_MAX_THREADS;
    return slots * (size_t)T * T;
}
