/* Causal multi-head self-attention that skips the masked half.
 *
 * Per (batch, head) pair and per block of ATT_BLOCK query rows [r0, r1), only
 * keys 0..r1-1 can be attended to, so each product runs over r1 columns
 * instead of T: about (T + ATT_BLOCK) / 2T of the full T x T work (62% at
 * T = 256), where PyTorch's reference model computes all T x T scores and
 * masks them afterwards. Products go through sgemm on strided views of qkv
 * (row stride 3C), so q, k, v are never copied out.
 *
 * Forward per block: S = Q K^T (sgemm) written straight into att's rows;
 * fused scale + mask + softmax per row (vectorized exp); out = P V (sgemm).
 * Entries t2 in (t, r1) of att row t are written as 0, entries >= r1 are not
 * written (the header says entries past t are never read).
 *
 * Backward per block, LAST block first, with P the block's probabilities (copied into scratch
 * with the entries past t zeroed, so that we rely only on entries 0..t):
 *   dV[0:r1] += P^T dO      dP = dO V^T      dS = P * (dP - rowsum(P * dP)) / sqrt(hs)
 *   dQ[r0:r1] += dS K       dK[0:r1] += dS^T Q
 * The last block (r1 = T) touches every row of dK and dV and each block its
 * own rows of dQ, so going backwards the first write of every dqkv element is
 * an sgemm whose beta is 0 for the overwriting variant (_set): no memset of
 * dqkv before the call.
 *
 * Threads: with more than one thread, (b, h) pairs are split over the pool
 * and BLAS runs single-threaded inside each (small products parallelize badly;
 * one pair per worker keeps the cores busy). Each worker owns its own scratch
 * slot; every output element is written by exactly one pair, so no races, and
 * the result does not depend on the thread count (BLAS stays single-threaded
 * even for a single pair: see run_pairs). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "kernels_impl.h"

#ifndef ATT_BLOCK
#define ATT_BLOCK 64
#endif

typedef struct {
    float *out, *att, *dqkv, *scratch;
    const float *qkv, *dout, *catt;
    int B, T, C, NH;
    float beta0; /* backward: 0 overwrites dqkv, 1 accumulates */
    size_t slot_floats;
} att_ctx;

static void softmax_causal_rows(float *att, int r0, int r1, int T, float scale) {
    for (int t = r0; t < r1; t++) {
        float *restrict a = att + (long)t * T;
        int n = t + 1;
        float maxv = pt_max_lanes(a, n) * scale;
        float sum = pt_exp_sum_lanes(a, n, scale, maxv);
        float inv = 1.0f / sum;
        for (int i = 0; i < n; i++) a[i] *= inv;
        for (int i = n; i < r1; i++) a[i] = 0.0f;
    }
}

static void attention_forward_pair(att_ctx *c, int b, int h) {
    int T = c->T, C = c->C, hs = C / c->NH;
    long C3 = 3L * C;
    float scale = 1.0f / sqrtf((float)hs);
    const float *q = c->qkv + (long)b * T * C3 + h * hs;
    const float *k = q + C;
    const float *v = q + 2 * C;
    float *att = c->att + ((long)b * c->NH + h) * T * T;
    float *out = c->out + (long)b * T * C + h * hs;
    for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
        int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        int rows = r1 - r0;
        /* att[r0:r1, 0:r1] = Q[r0:r1] K[0:r1]^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, hs, 1.0f, q + r0 * C3, C3, k,
                    C3, 0.0f, att + (long)r0 * T, T);
        softmax_causal_rows(att, r0, r1, T, scale);
        /* out[r0:r1] = P[r0:r1, 0:r1] V[0:r1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, r1, 1.0f,
                    att + (long)r0 * T, T, v, C3, 0.0f, out + (long)r0 * C, C);
    }
}

static void attention_backward_pair(att_ctx *c, int b, int h, float *scratch) {
    int T = c->T, C = c->C, hs = C / c->NH;
    long C3 = 3L * C;
    float scale = 1.0f / sqrtf((float)hs);
    const float *q = c->qkv + (long)b * T * C3 + h * hs;
    const float *k = q + C;
    const float *v = q + 2 * C;
    float *dq = c->dqkv + (long)b * T * C3 + h * hs;
    float *dk = dq + C;
    float *dv = dq + 2 * C;
    const float *att = c->catt + ((long)b * c->NH + h) * T * T;
    const float *dout = c->dout + (long)b * T * C + h * hs;
    int bw = T < ATT_BLOCK ? T : ATT_BLOCK;
    float *P = scratch;                 /* (rows, r1), leading dimension T */
    float *dS = scratch + (long)bw * T; /* (rows, r1), leading dimension T */
    int nblocks = (T + ATT_BLOCK - 1) / ATT_BLOCK;
    for (int blk = nblocks - 1; blk >= 0; blk--) {
        int r0 = blk * ATT_BLOCK;
        int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
        int rows = r1 - r0;
        float beta_kv = blk == nblocks - 1 ? c->beta0 : 1.0f; /* first write of dK, dV */
        for (int t = r0; t < r1; t++) {
            float *restrict p = P + (long)(t - r0) * T;
            memcpy(p, att + (long)t * T, sizeof(float) * (size_t)(t + 1));
            for (int i = t + 1; i < r1; i++) p[i] = 0.0f;
        }
        /* dV[0:r1] += P^T dO[r0:r1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rows, 1.0f, P, T,
                    dout + (long)r0 * C, C, beta_kv, dv, C3);
        /* dP = dO[r0:r1] V[0:r1]^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r1, hs, 1.0f,
                    dout + (long)r0 * C, C, v, C3, 0.0f, dS, T);
        /* softmax backward, scale folded in; masked entries become 0 */
        for (int t = r0; t < r1; t++) {
            const float *restrict p = P + (long)(t - r0) * T;
            float *restrict d = dS + (long)(t - r0) * T;
            int n = t + 1;
            float dot = pt_dot_lanes(p, d, n);
            for (int i = 0; i < n; i++) d[i] = p[i] * (d[i] - dot) * scale;
            for (int i = n; i < r1; i++) d[i] = 0.0f;
        }
        /* dQ[r0:r1] += dS K[0:r1] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, r1, 1.0f, dS, T, k, C3,
                    c->beta0, dq + r0 * C3, C3);
        /* dK[0:r1] += dS^T Q[r0:r1] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rows, 1.0f, dS, T, q + r0 * C3,
                    C3, beta_kv, dk, C3);
    }
}

/* hs = 64 goes to attention64.c's register tiles, other head sizes to sgemm. */
static void forward_part(void *p, int index, int count) {
    att_ctx *c = p;
    long lo, hi;
    pt_split_range((long)c->B * c->NH, index, count, &lo, &hi);
    int T = c->T, C = c->C;
    for (long bh = lo; bh < hi; bh++) {
        int b = (int)(bh / c->NH), h = (int)(bh % c->NH);
        if (C / c->NH == 64) {
            const float *q = c->qkv + (long)b * T * 3 * C + h * 64;
            pt_att64_forward_pair(c->out + (long)b * T * C + h * 64, c->att + bh * T * T, q, q + C,
                                  q + 2 * C, T, 3L * C, C, ATT_BLOCK);
        } else {
            attention_forward_pair(c, b, h);
        }
    }
}

static void backward_part(void *p, int index, int count) {
    att_ctx *c = p;
    long lo, hi;
    pt_split_range((long)c->B * c->NH, index, count, &lo, &hi);
    float *scratch = c->scratch + (size_t)index * c->slot_floats;
    int T = c->T, C = c->C;
    for (long bh = lo; bh < hi; bh++) {
        int b = (int)(bh / c->NH), h = (int)(bh % c->NH);
        if (C / c->NH == 64) {
            long off = (long)b * T * 3 * C + h * 64;
            const float *q = c->qkv + off;
            float *dq = c->dqkv + off;
            pt_att64_backward_pair(dq, dq + C, dq + 2 * C, q, q + C, q + 2 * C,
                                   c->catt + bh * T * T, c->dout + (long)b * T * C + h * 64,
                                   scratch, T, 3L * C, C, T < ATT_BLOCK ? T : ATT_BLOCK, c->beta0);
        } else {
            attention_backward_pair(c, b, h, scratch);
        }
    }
}

/* Runs fn over the pool with BLAS single-threaded inside, also when there is
 * only one pair to run: OpenBLAS's bits depend on its thread count (its
 * partition of a product changes which edge kernels run), ours must not, so
 * every (b, h) pair is computed the same way at any thread count. */
static void run_pairs(pt_pool_fn fn, att_ctx *c) {
    int pairs = c->B * c->NH;
    int n = pt_kernels_threads();
    if (n > pairs) n = pairs;
    if (pt_kernels_threads() > 1) {
        openblas_set_num_threads(1);
        pt_pool_run(fn, c, n);
        openblas_set_num_threads(pt_kernels_threads());
    } else {
        fn(c, 0, 1);
    }
}

void pt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    att_ctx c = {.out = out, .att = att, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH};
    run_pairs(forward_part, &c);
}

static size_t slot_floats(int T, int hs) {
    int bw = T < ATT_BLOCK ? T : ATT_BLOCK;
    if (hs == 64) return pt_att64_scratch_floats(T, bw);
    return 2 * (size_t)bw * (size_t)T;
}

void pt_attention_backward_set(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH) {
    att_ctx c = {.dqkv = dqkv,
                 .beta0 = 0.0f, /* dqkv overwritten */
                 .scratch = scratch,
                 .dout = dout,
                 .qkv = qkv,
                 .catt = att,
                 .B = B,
                 .T = T,
                 .C = C,
                 .NH = NH,
                 .slot_floats = slot_floats(T, C / NH)};
    run_pairs(backward_part, &c);
}

/* One slot (two blocks of ATT_BLOCK x T) per worker that can run at once. */
size_t pt_attention_scratch_floats(int B, int T, int C, int NH) {
    size_t slots = (size_t)B * NH;
    if (slots > PT_KERNELS_MAX_THREADS) slots = PT_KERNELS_MAX_THREADS;
    return slots * slot_floats(T, C / NH);
}
