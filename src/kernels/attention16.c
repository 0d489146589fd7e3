/* Causal attention of a bf16 model (kernels.h, "bf16 kernels"): attention.c's
 * blocks of 64 query rows that skip the masked half, with every product on
 * bf16 operands summed in fp32, per (batch, head) pair:
 *
 *   forward, per block [r0, r1):  S = Q[r0:r1] K[0:r1]^T (fp32, scratch)
 *                                 P = softmax(S / sqrt(hs)) in fp32, kept in bf16
 *                                 out[r0:r1] = bf16(P V[0:r1])
 *   backward, last block first:   dV[0:r1] += P^T dO[r0:r1]
 *                                 dP = dO[r0:r1] V[0:r1]^T (fp32, scratch)
 *                                 dS = P (dP - rowsum(P dP)) / sqrt(hs), bf16
 *                                 dQ[r0:r1] = dS K[0:r1];  dK[0:r1] += dS^T Q[r0:r1]
 *
 * P is kept PACKED: block b's rows hold only its r1 = min(64 (b + 1), T)
 * columns (entries past t zero), so a pair keeps sum_b rows_b r1_b bf16
 * (pt_attention16_att_elems) instead of T^2: 62.5% of it at T = 256, a
 * third of the bf16 model's saving on the small config. dO (the fp32
 * gradient of the attention output) is rounded as the products read it;
 * dQ, dK, dV are summed in fp32 in dqkv (dK and dV over the blocks, the
 * last block first, whose r1 = T reaches every row: its beta 0 is the
 * first write, so dqkv needs no clearing).
 *
 * The products are pt_gemm_bf16x_serial calls on strided views of qkv
 * (the own AVX512_BF16 or AMX code, one thread: the pairs are split over
 * the pool, as attention.c's). On a CPU without either, each product
 * widens its operands (rounded, where fp32) into the thread's bf16
 * scratch, at most 256 x 256 of each at once, and runs OpenBLAS's sgemm:
 * the same rounding points, other summation orders. Every pair is
 * computed the same way whichever worker takes it: the bits do not depend
 * on the thread count.
 *
 * Not here: fp32 attention (attention.c, attention64.c). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "bf16_impl.h"
#include "bf16_vec.h"

enum { BLK = 64, CH = 256 };

size_t pt_attention16_att_elems(int T) {
    size_t n = 0;
    for (int r0 = 0; r0 < T; r0 += BLK) {
        int r1 = r0 + BLK < T ? r0 + BLK : T;
        n += (size_t)(r1 - r0) * (size_t)r1;
    }
    return n;
}

/* Elements of the packed P before the block starting at r0 (every earlier
 * block is whole). */
static size_t block_off(int r0) {
    size_t b = (size_t)(r0 / BLK);
    return (size_t)BLK * BLK * b * (b + 1) / 2;
}

/* A worker's slot, in floats: S or dP (BLK, T), dS (BLK, T) in bf16, the
 * output block (BLK, hs); each rounded to 16. */
static size_t slot_floats(int T, int hs) {
    size_t s = ((size_t)BLK * T + 15) & ~(size_t)15;
    size_t ds = ((size_t)BLK * T / 2 + 16) & ~(size_t)15;
    size_t o = ((size_t)BLK * hs + 15) & ~(size_t)15;
    return s + ds + o;
}

size_t pt_attention16_scratch_floats(int B, int T, int C, int NH) {
    size_t slots = (size_t)B * NH;
    if (slots > PT_KERNELS_MAX_THREADS) slots = PT_KERNELS_MAX_THREADS;
    return slots * slot_floats(T, C / NH);
}

/* ---- the pair's products ---- */

/* dst (rows, cols) = the block at src (row stride lds) as floats: a bf16
 * one widened, an fp32 one rounded to bf16 values. */
static void widen(float *dst, const void *src, int f32, long lds, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        float *d = dst + (long)r * cols;
        int x = 0;
        if (f32) {
            const float *s = (const float *)src + r * lds;
            for (; x + PT_VW <= cols; x += PT_VW)
                pt_v8_store(d + x, pt_v8_round16(pt_v8_load(s + x)));
            for (; x < cols; x++) d[x] = pt_round16(s[x]);
        } else {
            const pt_bf16 *s = (const pt_bf16 *)src + r * lds;
            for (; x + PT_VW <= cols; x += PT_VW) pt_v8_store(d + x, pt_v8_load16(s + x));
            for (; x < cols; x++) d[x] = pt_f32_of16(s[x]);
        }
    }
}

static const void *elem(const void *p, int f32, long off) {
    return f32 ? (const void *)((const float *)p + off) : (const void *)((const pt_bf16 *)p + off);
}

/* pt_gemm_bf16x without AVX512_BF16 or AMX: chunks of at most CH of each
 * dimension, stored blocks widened into the thread's scratch, sgemm with
 * the transposes. */
static void mm_fallback(int ta, int tb, int M, int N, int K, const void *A, int a32, long lda,
                        const void *B, int b32, long ldb, float beta, float *C, long ldc) {
    float *fa = pt_bf16_scratch(), *fb = fa + CH * CH;
    for (int i0 = 0; i0 < M; i0 += CH)
        for (int j0 = 0; j0 < N; j0 += CH)
            for (int k0 = 0; k0 < K; k0 += CH) {
                int mc = M - i0 < CH ? M - i0 : CH, nc = N - j0 < CH ? N - j0 : CH;
                int kc = K - k0 < CH ? K - k0 : CH;
                if (ta)
                    widen(fa, elem(A, a32, (long)k0 * lda + i0), a32, lda, kc, mc);
                else
                    widen(fa, elem(A, a32, (long)i0 * lda + k0), a32, lda, mc, kc);
                if (tb)
                    widen(fb, elem(B, b32, (long)j0 * ldb + k0), b32, ldb, nc, kc);
                else
                    widen(fb, elem(B, b32, (long)k0 * ldb + j0), b32, ldb, kc, nc);
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, mc, nc, kc, 1.0f, fa, ta ? mc : kc, fb,
                            tb ? kc : nc, k0 == 0 ? beta : 1.0f, C + (long)i0 * ldc + j0, (int)ldc);
            }
}

_Static_assert((long)CH *CH * 2 * sizeof(float) <= (long)PT_BF16_SCRATCH_BYTES, "chunks fit");

static void mm(int ta, int tb, int M, int N, int K, const void *A, int a32, long lda, const void *B,
               int b32, long ldb, float beta, float *C, long ldc) {
    if (pt_gemm_bf16_serial_ok())
        pt_gemm_bf16x_serial(ta, tb, M, N, K, A, a32, (int)lda, B, b32, (int)ldb, beta, C, (int)ldc,
                             NULL);
    else
        mm_fallback(ta, tb, M, N, K, A, a32, lda, B, b32, ldb, beta, C, ldc);
}

/* ---- the pairs ---- */

typedef struct {
    pt_bf16 *out, *att;
    float *dqkv, *scratch;
    const pt_bf16 *qkv, *catt;
    const float *dout;
    int B, T, C, NH;
    size_t slot;
} att16_ctx;

/* p16[0..n) = bf16(softmax(s[0..n) * scale)), p16[n..end) = 0; s is
 * overwritten. */
static void softmax_row(pt_bf16 *p16, float *s, int n, int end, float scale) {
    float maxv = pt_max_lanes(s, n) * scale;
    float inv = 1.0f / pt_exp_sum_lanes(s, n, scale, maxv);
    int i = 0;
    for (; i + PT_VW <= n; i += PT_VW) pt_v8_store16(p16 + i, pt_v8_load(s + i) * inv);
    for (; i < n; i++) p16[i] = pt_bf16_of(s[i] * inv);
    memset(p16 + n, 0, sizeof(pt_bf16) * (size_t)(end - n));
}

static void forward_pair(const att16_ctx *c, int b, int h, float *slot) {
    int T = c->T, C = c->C, hs = C / c->NH;
    long C3 = 3L * C;
    float scale = 1.0f / sqrtf((float)hs);
    const pt_bf16 *q = c->qkv + (long)b * T * C3 + (long)h * hs, *k = q + C, *v = q + 2 * C;
    pt_bf16 *att = c->att + ((size_t)b * c->NH + (size_t)h) * pt_attention16_att_elems(T);
    pt_bf16 *out = c->out + (long)b * T * C + (long)h * hs;
    float *S = slot, *O = slot + slot_floats(T, hs) - (((size_t)BLK * hs + 15) & ~(size_t)15);
    for (int r0 = 0; r0 < T; r0 += BLK) {
        int r1 = r0 + BLK < T ? r0 + BLK : T, rows = r1 - r0;
        pt_bf16 *P = att + block_off(r0); /* (rows, r1) */
        mm(0, 1, rows, r1, hs, q + r0 * C3, 0, C3, k, 0, C3, 0.0f, S, T);
        for (int t = r0; t < r1; t++)
            softmax_row(P + (long)(t - r0) * r1, S + (long)(t - r0) * T, t + 1, r1, scale);
        mm(0, 0, rows, hs, r1, P, 0, r1, v, 0, C3, 0.0f, O, hs);
        for (int t = r0; t < r1; t++)
            pt_row_store16(out + (long)t * C, O + (long)(t - r0) * hs, hs);
    }
}

/* d16[0..n) = bf16(p (dp - p . dp) * scale), d16[n..end) = 0. */
static void softmax_bwd_row(pt_bf16 *d16, const float *dp, const pt_bf16 *p, int n, int end,
                            float scale) {
    pt_v8f acc = pt_v8_splat(0.0f);
    int i = 0;
    for (; i + PT_VW <= n; i += PT_VW) acc += pt_v8_load16(p + i) * pt_v8_load(dp + i);
    float dot = pt_v8_hsum(acc);
    for (; i < n; i++) dot += pt_f32_of16(p[i]) * dp[i];
    for (i = 0; i + PT_VW <= n; i += PT_VW)
        pt_v8_store16(d16 + i, pt_v8_load16(p + i) * (pt_v8_load(dp + i) - dot) * scale);
    for (; i < n; i++) d16[i] = pt_bf16_of(pt_f32_of16(p[i]) * (dp[i] - dot) * scale);
    memset(d16 + n, 0, sizeof(pt_bf16) * (size_t)(end - n));
}

static void backward_pair(const att16_ctx *c, int b, int h, float *slot) {
    int T = c->T, C = c->C, hs = C / c->NH;
    long C3 = 3L * C;
    float scale = 1.0f / sqrtf((float)hs);
    const pt_bf16 *q = c->qkv + (long)b * T * C3 + (long)h * hs, *k = q + C, *v = q + 2 * C;
    float *dq = c->dqkv + (long)b * T * C3 + (long)h * hs, *dk = dq + C, *dv = dq + 2 * C;
    const pt_bf16 *att = c->catt + ((size_t)b * c->NH + (size_t)h) * pt_attention16_att_elems(T);
    const float *dout = c->dout + (long)b * T * C + (long)h * hs;
    float *dP = slot;
    pt_bf16 *dS = (pt_bf16 *)(slot + (((size_t)BLK * T + 15) & ~(size_t)15));
    int nblocks = (T + BLK - 1) / BLK;
    for (int blk = nblocks - 1; blk >= 0; blk--) {
        int r0 = blk * BLK, r1 = r0 + BLK < T ? r0 + BLK : T, rows = r1 - r0;
        float beta = blk == nblocks - 1 ? 0.0f : 1.0f; /* the first write of dK, dV */
        const pt_bf16 *P = att + block_off(r0);
        mm(1, 0, r1, hs, rows, P, 0, r1, dout + (long)r0 * C, 1, C, beta, dv, C3);
        mm(0, 1, rows, r1, hs, dout + (long)r0 * C, 1, C, v, 0, C3, 0.0f, dP, T);
        for (int t = r0; t < r1; t++)
            softmax_bwd_row(dS + (long)(t - r0) * r1, dP + (long)(t - r0) * T,
                            P + (long)(t - r0) * r1, t + 1, r1, scale);
        mm(0, 0, rows, hs, r1, dS, 0, r1, k, 0, C3, 0.0f, dq + r0 * C3, C3);
        mm(1, 0, r1, hs, rows, dS, 0, r1, q + r0 * C3, 0, C3, beta, dk, C3);
    }
}

static void forward_part(void *p, int index, int count) {
    const att16_ctx *c = p;
    long lo, hi;
    pt_split_range((long)c->B * c->NH, index, count, &lo, &hi);
    for (long bh = lo; bh < hi; bh++)
        forward_pair(c, (int)(bh / c->NH), (int)(bh % c->NH), c->scratch + (size_t)index * c->slot);
}

static void backward_part(void *p, int index, int count) {
    const att16_ctx *c = p;
    long lo, hi;
    pt_split_range((long)c->B * c->NH, index, count, &lo, &hi);
    for (long bh = lo; bh < hi; bh++)
        backward_pair(c, (int)(bh / c->NH), (int)(bh % c->NH),
                      c->scratch + (size_t)index * c->slot);
}

/* attention.c's run_pairs: the pairs over the pool, OpenBLAS (the
 * fallback's sgemm) single-threaded inside at any thread count. */
static void run_pairs(pt_pool_fn fn, att16_ctx *c) {
    int pairs = c->B * c->NH, n = pt_kernels_threads();
    if (n > pairs) n = pairs;
    if (n > PT_KERNELS_MAX_THREADS) n = PT_KERNELS_MAX_THREADS;
    int serial = pt_gemm_bf16_serial_ok();
    if (!serial) openblas_set_num_threads(1);
    pt_pool_run(fn, c, n);
    if (!serial) openblas_set_num_threads(pt_kernels_threads());
}

void pt_attention16_forward(pt_bf16 *out, pt_bf16 *att, float *scratch, const pt_bf16 *qkv, int B,
                            int T, int C, int NH) {
    att16_ctx c = {.out = out,
                   .att = att,
                   .scratch = scratch,
                   .qkv = qkv,
                   .B = B,
                   .T = T,
                   .C = C,
                   .NH = NH,
                   .slot = slot_floats(T, C / NH)};
    run_pairs(forward_part, &c);
}

void pt_attention16_backward_set(float *dqkv, float *scratch, const float *dout, const pt_bf16 *qkv,
                                 const pt_bf16 *att, int B, int T, int C, int NH) {
    att16_ctx c = {.dqkv = dqkv,
                   .scratch = scratch,
                   .dout = dout,
                   .qkv = qkv,
                   .catt = att,
                   .B = B,
                   .T = T,
                   .C = C,
                   .NH = NH,
                   .slot = slot_floats(T, C / NH)};
    run_pairs(backward_part, &c);
}
