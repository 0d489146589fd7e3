/* Private to the kernels layer: the plain reference kernels (the test oracle,
 * STYLE rule 11) and the small persistent thread pool the optimized kernels
 * split their loops over.
 *
 * The pt_ref_* functions have exactly the contracts of their public
 * counterparts in partrain/kernels.h; they are written for obviousness, not
 * speed (plain loops, no BLAS, one thread), and are never on the training
 * path. Tests compare every optimized kernel against them. */
#ifndef PARTRAIN_KERNELS_IMPL_H
#define PARTRAIN_KERNELS_IMPL_H

#include "partrain/kernels.h"

/* Upper bound on pt_kernels_set_threads; also sizes per-worker scratch. */
#define PT_KERNELS_MAX_THREADS 64

/* ---- thread pool --------------------------------------------------------
 * pt_pool_run(fn, ctx, n) calls fn(ctx, i, n) once for each i in [0, n) and
 * returns when all calls have returned; call i = 0 runs on the calling thread.
 * n is clamped to the pool size (pt_kernels_threads()); with n == 1 no other
 * thread is involved. Not reentrant: fn must not call pt_pool_run. */
typedef void (*pt_pool_fn)(void *ctx, int index, int count);
void pt_pool_run(pt_pool_fn fn, void *ctx, int n);
/* The half-open range [*lo, *hi) of [0, total) that worker index of count owns. */
static inline void pt_split_range(long total, int index, int count, long *lo, long *hi) {
    long q = total / count, r = total % count;
    *lo = index * q + (index < r ? index : r);
    *hi = *lo + q + (index < r ? 1 : 0);
}

/* ---- matrix product (gemm.c) --------------------------------------------
 * Row-major C (M,N) = op(A) (M,K) op(B) (K,N), plus C when beta is 1 (beta
 * is 0 or 1; with 0, C is only written). ta / tb: A / B stored transposed.
 * The epilogue (NULL: none) fuses the elementwise work around a linear:
 *   bias (N), res (M,N): C = res + bias + op(A) op(B); res may alias C
 *   act (M,N):           act = gelu(C) after the product (C keeps pre-GELU)
 *   pre (M,N):           C = gelu'(pre) * op(A) op(B) (GELU backward)
 *   colsum (N):          colsum += column sums of B, rows in order (B not
 *                        transposed): the bias gradient of a dW product.
 * and in bf16 (train.precision = bf16), after the last K block:
 *   out16 (M,N):         out16 = bf16(C) (C keeps the float32 values)
 *   act16 (M,N):         act16 = bf16(gelu(bf16(C))): the GELU of the
 *                        rounded pre-activation a bf16 model keeps, so
 *                        that a recompute from it gives the same bits
 *   pre16 (M,N):         C = gelu'(pre16) * op(A) op(B)
 * res, act, pre and the bf16 ones have C's row stride. In that order:
 * out16, act, act16, pre, pre16. */
typedef struct {
    const float *bias, *res, *pre;
    float *act, *colsum;
    const pt_bf16 *pre16;
    pt_bf16 *act16, *out16;
} pt_gemm_epilogue;
/* Whether e has work after the last K block. */
static inline int pt_gemm_epilogue_last(const pt_gemm_epilogue *e) {
    return e && (e->act || e->pre || e->out16 || e->act16 || e->pre16);
}
void pt_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc, const pt_gemm_epilogue *e);
/* colsum (N) += column sums of B (K,N) (row stride ldb), rows in order,
 * columns split over the pool: a bias gradient. */
void pt_colsum_add(float *colsum, const float *B, long ldb, int K, int N);
/* Which code pt_sgemm runs: AUTO (the default) its own AVX-512 code for all
 * but small products, BLAS always OpenBLAS, OWN its own code at every size
 * (for tests). The environment's PT_GEMM=auto|blas|own sets it at the first
 * call; pt_sgemm_set_path returns the old setting (-1: not read yet). Without
 * AVX-512 every path is OpenBLAS. */
enum { PT_GEMM_AUTO, PT_GEMM_BLAS, PT_GEMM_OWN };
int pt_sgemm_set_path(int path);
/* 1 where the own GEMM is built in (AVX-512), else every path is OpenBLAS. */
int pt_sgemm_has_own(void);

/* ---- bf16 matrix product (gemm_bf16.c) ----------------------------------
 * pt_sgemm with A and B in bf16: C (M,N) fp32 = op(A) op(B) (+ C), the
 * products exact in fp32 and summed in fp32, with the same beta, strides,
 * transposes and epilogue. Column sums (colsum, B not transposed) add B's
 * bf16 values as float32, rows in order: the same bits on every path. The
 * paths, chosen at run time (pt_gemm_bf16_kind names the one in use):
 *   AMX       32 x 32 C tiles of TDPBF16PS (Sapphire Rapids and later, with
 *             Linux's permission); UNTESTED: no AMX on the development machine
 *   AVX512    a 12 x 32 vdpbf16ps micro-kernel on K-pair-packed panels
 *   FALLBACK  blocks of A and B converted to fp32, then pt_sgemm: any CPU
 * AMX and AVX512 give the same bits at any thread count (fixed order per
 * element, as pt_sgemm's own GEMM); FALLBACK gives pt_sgemm's guarantee.
 * pt_gemm_bf16_set_path forces a path for tests and benchmarks (AUTO: the
 * best available) and returns the old one; the path must be available
 * (pt_gemm_bf16_has_path). */
void pt_gemm_bf16(int ta, int tb, int M, int N, int K, const pt_bf16 *A, int lda, const pt_bf16 *B,
                  int ldb, float beta, float *C, int ldc, const pt_gemm_epilogue *e);
/* pt_gemm_bf16 with either operand in fp32 (a_f32, b_f32: A, B are float*),
 * rounded to bf16 as the product reads it: exactly pt_gemm_bf16 on the
 * rounded operands, without a rounded copy (a gradient in fp32 times a
 * bf16 weight). Column sums add the ROUNDED values of B, the ones the
 * product multiplies. */
void pt_gemm_bf16x(int ta, int tb, int M, int N, int K, const void *A, int a_f32, int lda,
                   const void *B, int b_f32, int ldb, float beta, float *C, int ldc,
                   const pt_gemm_epilogue *e);
/* pt_gemm_bf16x on the calling thread alone, for callers inside a pool job
 * (attention's (batch, head) pairs): the own paths only (AVX512_BF16, AMX:
 * pt_gemm_bf16_serial_ok), whose bits do not depend on the split, so it
 * gives pt_gemm_bf16x's bits. */
void pt_gemm_bf16x_serial(int ta, int tb, int M, int N, int K, const void *A, int a_f32, int lda,
                          const void *B, int b_f32, int ldb, float beta, float *C, int ldc,
                          const pt_gemm_epilogue *e);
int pt_gemm_bf16_serial_ok(void);
enum { PT_BF16_AUTO, PT_BF16_AMX, PT_BF16_AVX512, PT_BF16_FALLBACK };
int pt_gemm_bf16_set_path(int path);
int pt_gemm_bf16_has_path(int path);
/* The conversions' code, forced the same way (AUTO: the best available);
 * every one gives the scalar reference's bits. */
enum {
    PT_BF16_CVT_AUTO,
    PT_BF16_CVT_SCALAR,
    PT_BF16_CVT_AVX2,
    PT_BF16_CVT_AVX512,
    PT_BF16_CVT_AVX512BF16,
    PT_BF16_CVT_NPATHS
};
int pt_bf16_cvt_set_path(int path);
int pt_bf16_cvt_has_path(int path);

/* ---- attention for hs = 64 (attention64.c), one (batch, head) pair ------
 * q, k, v: the pair's row 0 in qkv (row stride C3); att (T,T) of the pair;
 * out, dout row stride C; dq, dk, dv the pair's row 0 in dqkv. Blocks of
 * `block` query rows as in attention.c; backward writes dQ/dK/dV with beta0
 * (0 overwrites) on first touch. scratch: pt_att64_scratch_floats(T, block). */
void pt_att64_forward_pair(float *out, float *att, const float *q, const float *k, const float *v,
                           int T, long C3, long C, int block);
void pt_att64_backward_pair(float *dq, float *dk, float *dv, const float *q, const float *k,
                            const float *v, const float *att, const float *dout, float *scratch,
                            int T, long C3, long C, int block, float beta0);
size_t pt_att64_scratch_floats(int T, int block);

/* ---- reference kernels (see partrain/kernels.h for contracts) ---------- */
void pt_ref_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C);
void pt_ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C);
void pt_ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
void pt_ref_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);
void pt_ref_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int C, int OC);
void pt_ref_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC);
void pt_ref_matmul_forward_wt(float *out, const float *inp, const float *weight, const float *bias,
                              int N, int C, int OC);
void pt_ref_matmul_backward_wt(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int N, int C, int OC);
/* GELU has no public kernel (it is fused into pt_matmul_gelu_forward and
 * pt_matmul_backward_gelu_set): out (N) = gelu(inp), dinp (N) += gelu'(inp)
 * * dout, the oracle of those epilogues. */
void pt_ref_gelu_forward(float *out, const float *inp, long N);
void pt_ref_gelu_backward(float *dinp, const float *inp, const float *dout, long N);
/* scratch: at least T floats. */
void pt_ref_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                              int NH);
void pt_ref_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);
void pt_ref_softmax_xent_forward_backward(float *losses, float *dlogits, const float *logits,
                                          const int *targets, int N, int V, float dloss);
/* bf16 conversions one element at a time (reference_bf16.c). */
pt_bf16 pt_ref_bf16_round(float x);
float pt_ref_bf16_float(pt_bf16 x);
void pt_ref_adamw_update(float *param, const float *grad, float *m, float *v, long n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, int t,
                         float grad_scale);

#endif
