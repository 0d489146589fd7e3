/* The bf16 parts of a GEMM epilogue (kernels_impl.h's pt_gemm_epilogue:
 * out16, act16, pre16) on a row segment after the last K block, shared by
 * pt_sgemm (gemm.c, which the bf16 fallback runs on converted chunks) and
 * the own bf16 paths (gemm_bf16.c), so that every path gives them the
 * same arithmetic. The float ones (act, pre) stay in each file's own
 * epilogue, between these in the documented order (out16, act, act16,
 * pre, pre16); out16 is pt_row_store16 (bf16_vec.h).
 *
 * Not here: res, bias and the column sums. */
#ifndef PARTRAIN_KERNELS_EPILOGUE16_H
#define PARTRAIN_KERNELS_EPILOGUE16_H

#include "bf16_vec.h"
#include "gelu.h"
#include "kernels_impl.h"

/* act16 (w) = bf16(gelu(bf16(c))) over the row segment c[0..w). */
static inline void pt_epilogue16_act(pt_bf16 *a, const float *c, int w) {
    int x = 0;
    for (; x + PT_VW <= w; x += PT_VW)
        pt_v8_store16(a + x, pt_v8_gelu(pt_v8_round16(pt_v8_load(c + x))));
    for (; x < w; x++) a[x] = pt_bf16_of(pt_gelu(pt_round16(c[x])));
}

/* c = gelu'(pre16) * c over the row segment c[0..w). */
static inline void pt_epilogue16_pre(const pt_bf16 *p, float *c, int w) {
    int x = 0;
    for (; x + PT_VW <= w; x += PT_VW)
        pt_v8_store(c + x, pt_v8_gelu_grad(pt_v8_load16(p + x)) * pt_v8_load(c + x));
    for (; x < w; x++) c[x] = pt_gelu_grad(pt_f32_of16(p[x])) * c[x];
}

#endif
