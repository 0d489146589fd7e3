/* partrain kernels: CPU float32 forward/backward pairs for a GPT-2 model, the
 * AdamW update and gradient norms. Plain functions over raw buffers, in the
 * manner of llm.c: no allocation inside a kernel (callers pass scratch), no
 * knowledge of modules, ranks or parameters' names.
 *
 * Shape letters (used throughout partrain): B batch, T sequence length,
 * C channels (n_embd), NH heads, hs = C / NH, V vocabulary, OC output
 * channels, N = B * T rows. All buffers are row-major and contiguous.
 *
 * Linear weights use GPT-2's checkpoint layout (C, OC): out = inp @ W + b.
 *
 * Backward contract: every backward ACCUMULATES (+=) into every gradient it
 * writes, the input gradient included, so that residual branches and
 * micro-batches add up without extra passes. Callers zero gradients once. The
 * few _set variants below OVERWRITE their input gradient instead (and still
 * accumulate into parameter gradients): a model whose intermediate gradients
 * have a single producer uses them to skip zeroing those buffers (in a block
 * of the small config the zeroing was 11 of 16 N*C-float passes of memset,
 * ~20 ms of a 1.25 s step).
 *
 * Threads: BLAS threads and the kernels' own threads are both set by
 * pt_kernels_set_threads; work is split by (index, count). Call the kernels
 * from one thread at a time (the pool runs one loop at a time). Our own
 * kernels, the own GEMM and attention give the same bits at any thread count
 * (every reduction has a fixed order); products that go to OpenBLAS do not,
 * only within float32 rounding (docs/architecture.md, "Bitwise
 * guarantees"). The pool survives fork().
 *
 * Reference versions of every kernel (plain loops, the tests' oracle) live in
 * src/kernels/reference.c; nothing on the training path uses them. */
#ifndef PARTRAIN_KERNELS_H
#define PARTRAIN_KERNELS_H

#include "partrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- OpenBLAS's CPU kernels (blas_core.c) -----------------------------------
 * OpenBLAS picks its kernels by CPU model when it initialises and falls back
 * to an old core (Prescott, SSE3) on models it does not know; only the
 * environment variable OPENBLAS_CORETYPE, read at that moment, changes the
 * choice. The CLI asks pt_blas_coretype_advice at start-up and re-executes
 * itself with the advice set (docs/architecture.md). */
typedef struct {
    int avx2, fma, avx512f, avx512bw, avx512vl, avx512dq; /* 1: the CPU (and OS) has it */
} pt_cpu_features;
/* This CPU's features (all 0 off x86). */
void pt_cpu_features_detect(pt_cpu_features *f);
/* The kernel set OpenBLAS runs (openblas_get_corename: "Prescott", "Haswell",
 * "SkylakeX", ...). */
const char *pt_blas_corename(void);
/* What OPENBLAS_CORETYPE to run with when the core OpenBLAS chose (corename)
 * is below what the CPU supports: "SkylakeX" for AVX-512 F+BW+VL+DQ, "Haswell"
 * for AVX2+FMA; NULL when the choice is already that good (or better), or
 * the CPU has neither. Pure: no environment, no CPUID. */
const char *pt_blas_coretype_advice(const char *corename, const pt_cpu_features *f);

/* The CPU's model name (/proc/cpuinfo's "model name"; "unknown CPU" where
 * there is none) into buf (n bytes). */
void pt_cpu_model_name(char *buf, size_t n);
/* Which code runs the linears' products: "own AVX-512 GEMM (OpenBLAS below
 * 48x64x64)", "own AVX-512 GEMM (PT_GEMM=own)", "OpenBLAS (PT_GEMM=blas)" or
 * "OpenBLAS (built without AVX-512)". */
const char *pt_gemm_path_name(void);

/* Number of threads the kernels (and BLAS) use; n >= 1. Default 1. */
void pt_kernels_set_threads(int n);
int pt_kernels_threads(void);

/* The speed probe (probe.c): the rate in flop/s of a fixed one-thread
 * product now, the fastest of three after a warm-up (about 10 ms; the
 * thread count is restored). buf: pt_speed_probe_floats() floats, any
 * contents, owned by the caller. pt_speed_probe_cores: n such probes at
 * once, a thread each (n - 1 started for it), on n consecutive parts of
 * buf (n x pt_speed_probe_floats() floats); the slowest one's rate, what a
 * product split n ways runs at. */
size_t pt_speed_probe_floats(void);
double pt_speed_probe(float *buf);
double pt_speed_probe_cores(float *buf, int n);

/* ---- bfloat16 (bf16.c, gemm_bf16*.c) ----------------------------------------
 * bf16 is the top half of an IEEE float32: sign, the same 8 exponent bits,
 * 7 mantissa bits. Every bf16 is a float32 exactly; a float32 rounds to
 * the nearest bf16. train.precision = bf16 keeps fp32 master weights,
 * optimizer state and reductions, and multiplies bf16 copies, accumulating
 * in fp32 (the private pt_gemm_bf16, kernels_impl.h). */
typedef uint16_t pt_bf16;
/* dst (n) = src (n) rounded to the nearest bf16, ties to even: overflow
 * gives +-inf, float32 subnormals round like every other value (to bf16
 * subnormals or a signed zero: no flush), a NaN stays a NaN with its sign
 * and top payload bits and the quiet bit set. Vectorized by what the CPU has
 * (AVX512_BF16's vcvtneps2bf16, AVX-512 or AVX2 integer rounding), split
 * over the kernels' threads when large: the same bits on every CPU and at
 * any thread count. dst and src must not overlap. */
void pt_bf16_from_f32(pt_bf16 *dst, const float *src, size_t n);
/* dst (n) = src (n), exact (a shift; NaN payloads kept). */
void pt_bf16_to_f32(float *dst, const pt_bf16 *src, size_t n);
/* Which bf16 matrix product this CPU runs, chosen once from CPUID (and, for
 * AMX, Linux's permission to use its tiles): "amx_bf16" (tiles, TDPBF16PS),
 * "avx512_bf16" (vdpbf16ps), or "fallback (fp32 products on converted
 * operands)". Static storage; for logs. */
const char *pt_gemm_bf16_kind(void);

/* ---- bf16 kernels of a bf16 model (train.precision = bf16) -----------------
 * The kernels below with bf16 where a bf16 model keeps bf16: weights (a
 * bf16 copy of the fp32 master), the activations it saves for backward,
 * and the operands of every product; fp32 for sums, gradients, LayerNorm
 * statistics, softmax and the loss. Products take bf16 operands and sum in
 * fp32 (the private pt_gemm_bf16, on the path pt_gemm_bf16_kind names); an
 * fp32 gradient operand is rounded to bf16 as the product reads it, and a
 * bias gradient sums the rounded values the product multiplies. Same
 * contracts as the fp32 versions otherwise (shapes, _set overwrites,
 * backward accumulates); the bits depend on the bf16 path (AVX512_BF16,
 * AMX and the fallback round differently) but, on one path, not on the
 * thread count. */

/* out (N,OC) = inp @ weight + bias in fp32, and out16 = bf16(out) when
 * out16 is not NULL. bias may be NULL. */
void pt_matmul16_forward(float *out, pt_bf16 *out16, const pt_bf16 *inp, const pt_bf16 *weight,
                         const float *bias, int N, int C, int OC);
/* out (N,OC) = res + inp @ weight + bias (pt_matmul_forward_res). */
void pt_matmul16_forward_res(float *out, const float *res, const pt_bf16 *inp,
                             const pt_bf16 *weight, const float *bias, int N, int C, int OC);
/* The MLP's c_fc: pre (N,OC) = inp @ weight + bias in fp32 (the caller's
 * scratch), pre16 = bf16(pre) (kept for backward), out16 = bf16(gelu(pre16))
 * (pt_gelu_forward16 of pre16, bit for bit). */
void pt_matmul16_gelu_forward(float *pre, pt_bf16 *pre16, pt_bf16 *out16, const pt_bf16 *inp,
                              const pt_bf16 *weight, const float *bias, int N, int C, int OC);
/* out16 (n) = bf16(gelu(pre16)): a recompute of pt_matmul16_gelu_forward's. */
void pt_gelu_forward16(pt_bf16 *out, const pt_bf16 *pre, size_t n);
/* dinp (N,C) = dout (N,OC, fp32) @ weight^T, OVERWRITTEN. */
void pt_matmul16_backward_input_set(float *dinp, const float *dout, const pt_bf16 *weight, int N,
                                    int C, int OC);
/* dpre (N,C) = gelu'(pre16) * (dout @ weight^T), OVERWRITTEN. */
void pt_matmul16_backward_input_gelu_set(float *dpre, const float *dout, const pt_bf16 *weight,
                                         const pt_bf16 *pre16, int N, int C, int OC);
/* dweight (C,OC) += inp^T @ dout; dbias (OC) += column sums of bf16(dout)
 * (dbias may be NULL). dout (N,OC) is fp32 (dout) or bf16 (dout16): one of
 * the two, the other NULL; the same bits either way when dout16 =
 * bf16(dout). */
void pt_matmul16_backward_weight(float *dweight, float *dbias, const float *dout,
                                 const pt_bf16 *dout16, const pt_bf16 *inp, int N, int C, int OC);
/* The tied LM head, weight (OC,C): out (N,OC) = inp @ weight^T, row stride
 * ldo; dinp (N,C) = dout @ weight, OVERWRITTEN; dweight (OC,C) += dout^T @
 * inp. */
void pt_matmul16_forward_wt(float *out, long ldo, const pt_bf16 *inp, const pt_bf16 *weight, int N,
                            int C, int OC);
void pt_matmul16_backward_wt_input_set(float *dinp, const pt_bf16 *dout, const pt_bf16 *weight,
                                       int N, int C, int OC);
void pt_matmul16_backward_wt_weight(float *dweight, const pt_bf16 *dout, const pt_bf16 *inp, int N,
                                    int C, int OC);

/* LayerNorm with bf16 outputs. Forward: mean, rstd (N) as
 * pt_layernorm_forward's (the same bits); xhat NULL: out16 (N,C) =
 * bf16(norm * weight + bias), norm = (x - mean) * rstd in fp32; xhat not
 * NULL: xhat (N,C) = bf16(norm), kept for a backward that reads it instead
 * of x, and out16 = bf16(xhat * weight + bias) from the rounded xhat. */
void pt_layernorm_forward16(pt_bf16 *out16, pt_bf16 *xhat, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N, int C);
/* A recompute of the forward's out16 (bit for bit): from inp, mean and
 * rstd (xhat NULL), or from xhat (inp, mean, rstd unused). */
void pt_layernorm_out16(pt_bf16 *out16, const float *inp, const pt_bf16 *xhat, const float *mean,
                        const float *rstd, const float *weight, const float *bias, int N, int C);
/* LayerNorm's backward passes (pt_layernorm_backward_input / _params) from
 * the kept xhat (bf16) and rstd instead of x, mean and rstd. */
void pt_layernorm16_backward_input(float *dinp, const float *dres, const float *dout,
                                   const pt_bf16 *xhat, const float *weight, const float *rstd,
                                   int N, int C);
void pt_layernorm16_backward_params(float *dweight, float *dbias, const float *dout,
                                    const pt_bf16 *xhat, int N, int C);

/* Causal attention on bf16 q, k, v (qkv (B,T,3C) bf16), the products on
 * bf16 operands: S = Q K^T summed in fp32, the softmax in fp32, P rounded
 * to bf16 and kept (att, PACKED: pt_attention16_att_elems per (batch,
 * head) pair, only the causal rows' blocks), out (B,T,C) = bf16(P V).
 * Backward: dP = dO V^T in fp32, dS = P (dP - rowsum(P dP)) / sqrt(hs)
 * rounded to bf16, dQ = dS K, dK = dS^T Q, dV = P^T dO summed in fp32 into
 * dqkv (B,T,3C, fp32, OVERWRITTEN); dout (B,T,C) is fp32. scratch:
 * pt_attention16_scratch_floats floats (the forward uses it too). */
void pt_attention16_forward(pt_bf16 *out, pt_bf16 *att, float *scratch, const pt_bf16 *qkv, int B,
                            int T, int C, int NH);
void pt_attention16_backward_set(float *dqkv, float *scratch, const float *dout, const pt_bf16 *qkv,
                                 const pt_bf16 *att, int B, int T, int C, int NH);
size_t pt_attention16_att_elems(int T);
size_t pt_attention16_scratch_floats(int B, int T, int C, int NH);

/* The LM head's cross-entropy over a vocabulary slice in BLOCKS of
 * columns, so that a bf16 model keeps its logits in bf16 and never holds
 * them all in fp32: this rank's columns [0, Vl) of the padded vocabulary
 * (its real ones [0, nreal), global ids v0 + j; at t = 1 v0 = 0, nreal =
 * Vl = V). Per row, stats (N, 4): the running max m, the sum of exp(l - m)
 * as a double (two floats), and the target's logit (0 where not local).
 *   _begin:  stats initialized.
 *   _block:  logits (N, nb, row stride ldl, fp32) of columns [c0, c0+nb):
 *            stats updated with the fp32 values, l16 (N, Vl) columns
 *            [c0, c0+nb) = bf16(l - m) with m the max so far (the larger
 *            logits, which dominate the softmax, lose the least), bmax
 *            (N, nblk) column blk = that m. Blocks in increasing c0.
 *   _shift:  after the last block: red (N, 4) = (the sum rescaled to the
 *            max gmax (N) as two floats, the target's logit, 0): what
 *            tensor parallelism all-reduces (SUM) after all-gathering the
 *            ranks' maxima (stats' m) into gmax; at t = 1 gmax is stats'
 *            m (pt_xent16_local_max copies it).
 *   _finish: losses (N) = log(sum) + gmax - target logit, in fp32 from
 *            the fp32 logits; l16 OVERWRITTEN with dloss * (softmax -
 *            onehot) (bf16, from l16 and bmax), padded columns 0. */
void pt_xent16_begin(float *stats, int N);
void pt_xent16_block(float *stats, pt_bf16 *l16, float *bmax, const float *logits, long ldl,
                     const int *targets, int N, int Vl, int c0, int nb, int blk, int nblk, int v0,
                     int nreal);
void pt_xent16_local_max(float *gmax, const float *stats, int N);
void pt_xent16_shift(float *red, const float *stats, const float *gmax, int N);
void pt_xent16_finish(float *losses, pt_bf16 *l16, const float *bmax, const float *gmax,
                      const float *red, const int *targets, int N, int Vl, int nb, int nblk, int v0,
                      int nreal, float dloss);

/* ---- embedding: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:] --------------------
 * out (B,T,C), inp (B,T) token ids in [0, V), wte (V,C), wpe (>=T, C). */
void pt_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                        int T, int C);
/* dwte (V,C) += scatter of dout by token; dwpe (T,C) += sum over b. */
void pt_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                         int C);

/* ---- LayerNorm over the last dimension, eps 1e-5 ----------------------------
 * out (N,C), mean (N), rstd (N) saved for backward, inp (N,C), weight (C), bias (C). */
void pt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);
/* dinp (N,C) +=, dweight (C) +=, dbias (C) += */
void pt_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C);
/* As pt_layernorm_backward, but dinp (N,C) = dres (N,C) + LayerNorm's input
 * gradient: the gradient of a residual branch x + f(layernorm(x)) in one pass,
 * without first copying dres into dinp. dinp may alias dres. */
void pt_layernorm_backward_res(float *dinp, const float *dres, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C);

/* LayerNorm's backward as its two passes, for a schedule that computes
 * input gradients first and weight gradients later (zero-bubble B and W):
 *   _input:  the row pass. dres NULL: dinp (N,C) += the input gradient;
 *            else dinp = dres + it (as pt_layernorm_backward_res; dinp may
 *            alias dres)
 *   _params: the column pass. dweight (C) +=, dbias (C) += (weight is not
 *            read)
 * Together bit for bit pt_layernorm_backward(_res), at any thread count. */
void pt_layernorm_backward_input(float *dinp, const float *dres, const float *dout,
                                 const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int N, int C);
void pt_layernorm_backward_params(float *dweight, float *dbias, const float *dout, const float *inp,
                                  const float *mean, const float *rstd, int N, int C);

/* ---- linear: out (N,OC) = inp (N,C) @ weight (C,OC) + bias (OC) ---------------
 * bias may be NULL. Through the kernels' own GEMM (AVX-512) or CBLAS sgemm,
 * with bias, residual, GELU and the bias gradient fused into the product. */
void pt_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N,
                       int C, int OC);
/* Linear + residual: out (N,OC) = res (N,OC) + inp @ weight + bias, res and
 * bias added to each output tile as it is written: no separate residual
 * pass and no temporary for the branch. bias may be NULL; out must not alias
 * inp (it may alias res). */
void pt_matmul_forward_res(float *out, const float *res, const float *inp, const float *weight,
                           const float *bias, int N, int C, int OC);
/* The linear's backward: dinp (N,C) = dout @ weight^T, OVERWRITTEN (no
 * separate clear; not NULL); dweight (C,OC) += inp^T @ dout; dbias (OC) +=
 * column sums of dout (dbias may be NULL). */
void pt_matmul_backward_set(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC);
/* The MLP's c_proj backward through the GELU before it: inp = gelu(pre),
 * dpre (N,C) = gelu'(pre) * (dout @ weight^T), OVERWRITTEN; dweight, dbias
 * as pt_matmul_backward_set. Equal to pt_matmul_backward_set into a temporary
 * followed by GELU's backward, without the temporary's two passes. */
void pt_matmul_backward_gelu_set(float *dpre, float *dweight, float *dbias, const float *dout,
                                 const float *inp, const float *weight, const float *pre, int N,
                                 int C, int OC);
/* Linear + GELU, the MLP's c_fc: pre (N,OC) = inp @ weight + bias (saved for
 * backward), out (N,OC) = gelu(pre) (GPT-2's tanh approximation), both written as each output tile
 * is finished. bias may be NULL. */
void pt_matmul_gelu_forward(float *pre, float *out, const float *inp, const float *weight,
                            const float *bias, int N, int C, int OC);

/* out (n) = gelu(pre): pt_matmul_gelu_forward's activation on its own, bit
 * for bit (the same lane-wise arithmetic), for a backward that recomputes
 * the GELU output instead of keeping it (model.recompute). */
void pt_gelu_forward(float *out, const float *pre, size_t n);

/* The linear's backward as two passes, for a schedule that computes input
 * gradients first and weight gradients later (zero-bubble pipelines' B and
 * W). pt_matmul_backward_set = _input_set then _weight, and
 * pt_matmul_backward_gelu_set = _input_gelu_set then _weight, bit for bit
 * (the same products).
 *   _input_set:      dinp (N,C) = dout @ weight^T, OVERWRITTEN
 *   _input_gelu_set: dpre (N,C) = gelu'(pre) * (dout @ weight^T), OVERWRITTEN
 *   _weight:         dweight (C,OC) += inp^T @ dout; dbias (OC) += column
 *                    sums of dout (dbias may be NULL) */
void pt_matmul_backward_input_set(float *dinp, const float *dout, const float *weight, int N, int C,
                                  int OC);
void pt_matmul_backward_input_gelu_set(float *dpre, const float *dout, const float *weight,
                                       const float *pre, int N, int C, int OC);
void pt_matmul_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                               int N, int C, int OC);

/* ---- linear with the weight stored transposed, (OC,C): out = inp @ weight^T + b
 * For the tied LM head (logits = x @ wte^T with wte (V,C)) and any weight kept
 * as (out, in). bias may be NULL. Shapes as pt_matmul_forward otherwise. */
void pt_matmul_forward_wt(float *out, const float *inp, const float *weight, const float *bias,
                          int N, int C, int OC);
/* dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) +=
 * column sums of dout. dinp or dbias may be NULL. */
void pt_matmul_backward_wt(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int C, int OC);

/* pt_matmul_backward_wt as two passes (bit for bit the same):
 *   _wt_input:  dinp (N,C) += dout @ weight
 *   _wt_weight: dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums of
 *               dout (dbias may be NULL) */
void pt_matmul_backward_wt_input(float *dinp, const float *dout, const float *weight, int N, int C,
                                 int OC);
void pt_matmul_backward_wt_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                                  int N, int C, int OC);

/* ---- causal multi-head self-attention -----------------------------------------
 * qkv (B,T,3C): q, k, v side by side along the last dim, head h at columns
 * [h*hs, (h+1)*hs) of each. out (B,T,C): heads concatenated.
 * att (B,NH,T,T) is saved for backward: the softmax probabilities (row t holds
 * entries 0..t; entries past t are never read). Scale 1/sqrt(hs). */
void pt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) OVERWRITTEN. scratch must hold pt_attention_scratch_floats(...)
 * floats. */
void pt_attention_backward_set(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH);
size_t pt_attention_scratch_floats(int B, int T, int C, int NH);

/* ---- fused softmax + cross-entropy ------------------------------------------------
 * logits (N,V), targets (N) in [0, V). losses (N) = -log softmax(logits)[target].
 * If dlogits is non-NULL it is OVERWRITTEN (not accumulated: it is the head of
 * the backward pass) with dloss * (softmax(logits) - onehot(target)), where
 * dloss is the weight of each row's loss in the total (1/N for a mean).
 * dlogits may alias logits (in-place, saves N*V floats). */
void pt_softmax_xent_forward_backward(float *losses, float *dlogits, const float *logits,
                                      const int *targets, int N, int V, float dloss);

/* ---- vocabulary-parallel embedding and cross-entropy (vocab_parallel.c) -----------
 * Under t-way tensor parallelism wte (V, C) is split by vocabulary rows: this
 * rank holds the Vl rows [v0, v0 + Vl) of the vocabulary padded to t * Vl
 * (model.h, "sharded tensors": v0 = piece[0].offset, Vl = extent + pad, nreal
 * = extent); rows >= V are padding. The kernels are local and know nothing of
 * ranks: each operation is split into phases, and the CALLER reduces over the
 * tp group between them (the all-reduces named below). The comm layer has no
 * MAX reduction yet (pt_reduce_op: SUM, AVG); an all-gather of the t maxes,
 * maxed locally, does the same. Tokens and targets are global ids in [0, V).
 * Rows of the logits, (N, Vl), hold this rank's vocabulary slice, padded
 * columns included; nreal = min(V - v0, Vl), clamped at 0, is the count of
 * its real columns (0 on a rank of only padding: it contributes nothing and
 * still runs every phase).
 *
 * Numerics: the same exp, lanes and double chunk sums as
 * pt_softmax_xent_forward_backward, so t = 1 gives ITS BITS exactly (loss and
 * dlogits; tested). At t > 1 the sum of exponentials adds the ranks' partial
 * sums in float in the all-reduce: loss and dlogits agree with the unsplit
 * kernel within a few float roundings. */

/* Masked token lookup, the first half of the embedding:
 *   out[b,t,:] = wte[inp[b,t] - v0,:] (+ wpe[t,:])   if v0 <= inp[b,t] < v0 + Vl
 *   out[b,t,:] = 0                   (+ wpe[t,:])   otherwise
 * out (B,T,C) OVERWRITTEN; wte (Vl,C) this rank's rows; wpe (>=T,C) or NULL.
 * Then all-reduce SUM out over the tp group (or reduce-scatter it under
 * sequence parallelism). Pass wpe on exactly ONE tp rank (e.g. rank 0) and
 * NULL on the others: the reduced sum is then wte[tok] + wpe[t] with at most
 * two non-zero terms, which is pt_encoder_forward's result bit for bit in
 * any reduction order. (Or pass NULL everywhere and add wpe after.) */
void pt_vocab_embed_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C, int v0, int Vl);
/* dwte (Vl,C) += dout of the rows whose token is local (row inp - v0), in
 * order of (b,t): the slice of pt_encoder_backward's dwte bit for bit; no
 * other row (padding included) is touched. dwpe (T,C) += sum over b of dout,
 * or NULL. dout (B,T,C) is the whole gradient of the reduced output (the
 * backward of an all-reduce is the identity: every rank has it); dwpe, a
 * replicated parameter's gradient, comes out the same on every rank. */
void pt_vocab_embed_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C, int v0, int Vl);

/* Floats per row of the statistics that phase 2 writes and the caller
 * all-reduces (SUM): the local sum of exponentials as three floats whose
 * exact sum is the double sum (so that t = 1 keeps the fused kernel's bits),
 * and the target's logit (0 where the target is not local). */
#define PT_VOCAB_XENT_STATS 4

/* Phase 1: gmax (N) = each row's max over this rank's REAL columns
 * (-3e38 when nreal is 0; padded columns are never read). Then all-reduce
 * MAX gmax over the tp group. */
void pt_vocab_xent_max(float *gmax, const float *logits, int N, int Vl, int nreal);
/* Phase 2, with gmax reduced: stats (N, PT_VOCAB_XENT_STATS) OVERWRITTEN
 * with the local sum of exp(logit - gmax) over the real columns and the
 * target's logit if v0 <= target < v0 + nreal (else 0). If dlogits (N,Vl) is
 * non-NULL, exp(logit - gmax) is written to its real columns (dlogits may
 * alias logits; the target's logit is read first): phase 3 turns it into the
 * gradient. Then all-reduce SUM stats over the tp group. */
void pt_vocab_xent_sumexp(float *stats, float *dlogits, const float *logits, const float *gmax,
                          const int *targets, int N, int Vl, int v0, int nreal);
/* Phase 3, with stats reduced: losses (N) = log(sum) + gmax - target logit
 * (the same on every rank). If dlogits is non-NULL (the SAME buffer as
 * phase 2's, or NULL in both) it is OVERWRITTEN: dloss * (softmax -
 * onehot(target)) in the real columns, exactly 0 in the padded ones. dloss
 * as in pt_softmax_xent_forward_backward. */
void pt_vocab_xent_finish(float *losses, float *dlogits, const float *gmax, const float *stats,
                          const int *targets, int N, int Vl, int v0, int nreal, float dloss);

/* ---- optimizer kernels ---------------------------------------------------------------
 * AdamW with decoupled weight decay (Loshchilov & Hutter), bias-corrected:
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
 * over n elements; t >= 1 is the step count. grad_scale multiplies g first
 * (used for clipping without an extra pass). */
void pt_adamw_update(float *param, const float *grad, float *m, float *v, long n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int t,
                     float grad_scale);
/* Sum of squares of x (n), accumulated in double. */
double pt_sum_squares(const float *x, long n);
/* pt_adamw_update and pt_sum_squares(grad, n) (the same bits: the sum of
 * squares of grad before grad_scale) in one pass over the gradients, for a
 * norm that is only reported (no clipping): gpt2 spent 3% of its step in the
 * separate sum-of-squares read of 124 M gradients. */
double pt_adamw_update_sumsq(float *param, const float *grad, float *m, float *v, long n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, int t,
                             float grad_scale);
/* SGD with optional heavy-ball momentum (PyTorch's SGD, dampening 0, not
 * Nesterov), over n elements:
 *   d = grad_scale * g + weight_decay * param      (L2, coupled, as PyTorch)
 *   buf = momentum * buf + d; param -= lr * buf    (buf non-NULL)
 *   param -= lr * d                                (buf NULL: momentum 0)
 * buf starts at zero, so the first step applies d, as PyTorch's does. */
void pt_sgd_update(float *param, const float *grad, float *buf, long n, float lr, float momentum,
                   float weight_decay, float grad_scale);

/* ---- parameter initialization -------------------------------------------------------
 * w[j] = std * pt_rng_normal_at(key, first + j) for j in [0, n): bitwise the
 * same at any thread count. */
void pt_fill_normal(float *w, long n, uint64_t key, uint64_t first, float std);

#ifdef __cplusplus
}
#endif
#endif
