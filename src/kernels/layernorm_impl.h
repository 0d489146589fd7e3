/* What LayerNorm's fp32 kernels (elementwise.c) and its bf16 ones
 * (layernorm16.c) share: the row statistics, in one order, so that a bf16
 * model's mean and rstd are the fp32 kernel's bits, and the rows'
 * prefetch.
 *
 * Not here: the kernels. */
#ifndef PARTRAIN_KERNELS_LAYERNORM_IMPL_H
#define PARTRAIN_KERNELS_LAYERNORM_IMPL_H

#include <math.h>

#include "fastmath.h"

/* Rows of LayerNorm are short (C floats, in L1 once loaded) and the time
 * per row is the wait for the next one from memory: prefetching rows ahead,
 * the output's for writing, keeps the streams going while a row's reductions
 * run (N 2048, C 384, cold: forward 0.61 -> 0.49 ms, backward_res 1.08 ->
 * 0.82 ms per call; 1 row ahead is as good, 4 worse). */
#define LN_AHEAD 2 /* rows */
static inline void ln_prefetch(const float *row, int C) {
    for (int i = 0; i < C; i += 64 / (int)sizeof(float)) __builtin_prefetch(row + i);
}
/* For a row about to be written: its lines are read in for ownership now,
 * not when the stores reach them. */
static inline void ln_prefetch_w(float *row, int C) {
    for (int i = 0; i < C; i += 64 / (int)sizeof(float)) __builtin_prefetch(row + i, 1);
}

/* Sum of x and of (x - mean)^2 over a row on two vector accumulators: one
 * chain of dependent adds was the critical path of a row. */
static inline float ln_sum(const float *x, int C) {
    pt_v8f a0 = pt_v8_splat(0.0f), a1 = pt_v8_splat(0.0f);
    int i = 0;
    for (; i + 2 * PT_VW <= C; i += 2 * PT_VW) {
        a0 += pt_v8_load(x + i);
        a1 += pt_v8_load(x + i + PT_VW);
    }
    for (; i + PT_VW <= C; i += PT_VW) a0 += pt_v8_load(x + i);
    float v = pt_v8_hsum(a0 + a1);
    for (; i < C; i++) v += x[i];
    return v;
}
static inline float var_lanes(const float *x, float m, int C) {
    pt_v8f a0 = pt_v8_splat(0.0f), a1 = pt_v8_splat(0.0f);
    int i = 0;
    for (; i + 2 * PT_VW <= C; i += 2 * PT_VW) {
        pt_v8f d0 = pt_v8_load(x + i) - m, d1 = pt_v8_load(x + i + PT_VW) - m;
        a0 += d0 * d0;
        a1 += d1 * d1;
    }
    for (; i + PT_VW <= C; i += PT_VW) {
        pt_v8f dx = pt_v8_load(x + i) - m;
        a0 += dx * dx;
    }
    float v = pt_v8_hsum(a0 + a1);
    for (; i < C; i++) v += (x[i] - m) * (x[i] - m);
    return v;
}

/* A row's mean and rstd (eps 1e-5), as every LayerNorm forward takes them. */
static inline void ln_stats(const float *x, int C, float *mean, float *rstd) {
    float m = ln_sum(x, C) / C;
    float v = var_lanes(x, m, C) / C;
    *mean = m;
    *rstd = 1.0f / sqrtf(v + 1e-5f);
}

#endif
