/* Causal attention for one (batch, head) pair when hs = 64 (every GPT-2
 * size): the products written as register-tiled loops on float vectors
 * instead of sgemm calls. At hs = 64 the products are small (64-row blocks,
 * K = 64 or a few hundred) and OpenBLAS ran them at about half its peak in
 * the step (packing both operands per call, the beta pass); these tiles keep
 * ATT_R rows x 4 vectors of accumulators in registers and read their operands
 * where they lie (no packing beyond a transposed 64-key tile of K or V).
 *
 * Three tile shapes cover all five products (A rows, B rows, out rows):
 *   abt: out[i][j] = A[i] . B[j]           via B^T in a key tile (S = Q K^T, dP = dO V^T)
 *   ab:  out[i]   = sum_j A[i][j] B[j]     (O = P V, dQ = dS K)
 *   atb: out[j]   = sum_i A[i][j] B[i]     (dV = P^T dO, dK = dS^T Q)
 * Same contracts and same block order as attention.c's sgemm path (which
 * still serves other head sizes); results differ from it by float rounding.
 *
 * Vector extensions only (fastmath.h), no intrinsics: with AVX-512 a vector
 * holds 16 floats and a 64-float row is 4 vectors; narrower builds run the
 * same code with more (spilled) vectors. */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "kernels_impl.h"

#define HS    64
#define HV    (HS / PT_VW) /* vectors per 64-float row */
#define KW    (4 * PT_VW)  /* keys per abt tile: 4 vectors */
#define ATT_R 6            /* rows per tile: 6 x 4 accumulators + 4 operands fit 32 registers */

/* The tile bodies are inlined twice by their wrappers: with rn = ATT_R (a
 * compile-time constant: accumulators stay in registers, stores unrolled) and
 * with the partial rn of a last tile. With a variable rn GCC kept the
 * accumulators on the stack for the stores, a third of tile_atb's time. */
#define TILE_INLINE static inline __attribute__((always_inline))

/* out[r] (HV vectors) = acc[r], or += acc[r] when beta != 0, for r < rn. */
TILE_INLINE void store_rows(float *out, long ldo, pt_v8f acc[ATT_R][HV], int rn, float beta) {
    if (beta == 0.0f) {
        for (int r = 0; r < rn; r++)
            for (int v = 0; v < HV; v++) pt_v8_store(out + r * ldo + v * PT_VW, acc[r][v]);
    } else {
        for (int r = 0; r < rn; r++)
            for (int v = 0; v < HV; v++) {
                float *o = out + r * ldo + v * PT_VW;
                pt_v8_store(o, pt_v8_load(o) + acc[r][v]);
            }
    }
}

/* out[r][0:nk] = A[r] . BT[:, 0:nk] for r < rn; A rows at stride lda (HS
 * floats each), BT (HS, KW) at row stride ldb with KW readable columns. */
TILE_INLINE void tile_abt_body(float *out, long ldo, const float *A, long lda, const float *BT,
                               long ldb, int rn, int nk) {
    pt_v8f acc[ATT_R][4];
    for (int r = 0; r < rn; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = pt_v8_splat(0.0f);
    for (int d = 0; d < HS; d++) {
        const float *b = BT + d * ldb;
        pt_v8f b0 = pt_v8_load(b), b1 = pt_v8_load(b + PT_VW), b2 = pt_v8_load(b + 2 * PT_VW),
               b3 = pt_v8_load(b + 3 * PT_VW);
        for (int r = 0; r < rn; r++) {
            float x = A[r * lda + d];
            acc[r][0] += x * b0, acc[r][1] += x * b1, acc[r][2] += x * b2, acc[r][3] += x * b3;
        }
    }
    for (int r = 0; r < rn; r++) {
        float *o = out + r * ldo;
        if (nk == KW) {
            for (int v = 0; v < 4; v++) pt_v8_store(o + v * PT_VW, acc[r][v]);
        } else {
            float tmp[KW];
            for (int v = 0; v < 4; v++) pt_v8_store(tmp + v * PT_VW, acc[r][v]);
            memcpy(o, tmp, sizeof(float) * (size_t)nk);
        }
    }
}
static void tile_abt(float *out, long ldo, const float *A, long lda, const float *BT, long ldb,
                     int rn, int nk) {
    if (rn == ATT_R)
        tile_abt_body(out, ldo, A, lda, BT, ldb, ATT_R, nk);
    else
        tile_abt_body(out, ldo, A, lda, BT, ldb, rn, nk);
}

/* out[r] = beta * out[r] + sum_{j < n} A[r][j] B[j] for r < rn (HS floats). */
TILE_INLINE void tile_ab_body(float *out, long ldo, const float *A, long lda, const float *B,
                              long ldb, int rn, int n, float beta) {
    pt_v8f acc[ATT_R][HV];
    for (int r = 0; r < rn; r++)
        for (int v = 0; v < HV; v++) acc[r][v] = pt_v8_splat(0.0f);
    for (int j = 0; j < n; j++) {
        const float *b = B + j * ldb;
        pt_v8f bv[HV];
        for (int v = 0; v < HV; v++) bv[v] = pt_v8_load(b + v * PT_VW);
        for (int r = 0; r < rn; r++) {
            float x = A[r * lda + j];
            for (int v = 0; v < HV; v++) acc[r][v] += x * bv[v];
        }
    }
    store_rows(out, ldo, acc, rn, beta);
}
static void tile_ab(float *out, long ldo, const float *A, long lda, const float *B, long ldb,
                    int rn, int n, float beta) {
    if (rn == ATT_R)
        tile_ab_body(out, ldo, A, lda, B, ldb, ATT_R, n, beta);
    else
        tile_ab_body(out, ldo, A, lda, B, ldb, rn, n, beta);
}

/* out[r] = beta * out[r] + sum_{i in [i0, i1)} A[i][j0 + r] B[i] for r < rn:
 * A's row i at A + i * lda, B's at B + i * ldb. */
TILE_INLINE void tile_atb_body(float *out, long ldo, const float *A, long lda, const float *B,
                               long ldb, int j0, int rn, int i0, int i1, float beta) {
    pt_v8f acc[ATT_R][HV];
    for (int r = 0; r < rn; r++)
        for (int v = 0; v < HV; v++) acc[r][v] = pt_v8_splat(0.0f);
    for (int i = i0; i < i1; i++) {
        const float *b = B + i * ldb;
        const float *a = A + i * lda + j0;
        pt_v8f bv[HV];
        for (int v = 0; v < HV; v++) bv[v] = pt_v8_load(b + v * PT_VW);
        for (int r = 0; r < rn; r++) {
            float x = a[r];
            for (int v = 0; v < HV; v++) acc[r][v] += x * bv[v];
        }
    }
    store_rows(out, ldo, acc, rn, beta);
}
static void tile_atb(float *out, long ldo, const float *A, long lda, const float *B, long ldb,
                     int j0, int rn, int i0, int i1, float beta) {
    if (rn == ATT_R)
        tile_atb_body(out, ldo, A, lda, B, ldb, j0, ATT_R, i0, i1, beta);
    else
        tile_atb_body(out, ldo, A, lda, B, ldb, j0, rn, i0, i1, beta);
}

/* Causal scores: S[i][j] = A[i] . B[j] for rows [r0, r1), keys j <= i (and
 * whatever else the key tile covers: entries past i are not meaningful).
 * BT (HS, ldb) holds B transposed, ldb >= the keys rounded up to KW, zeros
 * past the last key. */
static void scores(float *S, long lds, const float *A, long lda, const float *BT, long ldb, int r0,
                   int r1) {
    for (int k0 = 0; k0 < r1; k0 += KW) {
        int nk = r1 - k0 < KW ? r1 - k0 : KW;
        int i0 = k0 > r0 ? k0 : r0;
        for (int i = i0; i < r1; i += ATT_R) {
            int rn = r1 - i < ATT_R ? r1 - i : ATT_R;
            tile_abt(S + i * lds + k0, lds, A + i * lda, lda, BT + k0, ldb, rn, nk);
        }
    }
}

/* BT (HS, ld) = rows [0, n) of B (stride ldb) transposed; columns [n, ld)
 * zeroed. Row by row: each read is a contiguous row of B and the writes of 16
 * consecutive rows stay in the same 64 cache lines of BT; walking B by
 * columns instead missed L1 on every element (a row stride of 3C floats) and
 * was most of the backward's time outside the tiles. */
static void transpose64(float *BT, long ld, const float *B, long ldb, int n) {
    for (int j = 0; j < n; j++) {
        const float *b = B + j * ldb;
        for (int d = 0; d < HS; d++) BT[d * ld + j] = b[d];
    }
    for (int d = 0; d < HS; d++)
        for (long j = n; j < ld; j++) BT[d * ld + j] = 0.0f;
}

/* scores() for all T rows with B transposed one key tile at a time into a
 * 16 KiB stack buffer: the forward has no scratch argument. */
static void scores_all(float *S, long lds, const float *A, long lda, const float *B, long ldb,
                       int T) {
    float bt[HS * KW];
    for (int k0 = 0; k0 < T; k0 += KW) {
        int nk = T - k0 < KW ? T - k0 : KW;
        transpose64(bt, KW, B + k0 * ldb, ldb, nk);
        for (int i = k0; i < T; i += ATT_R) {
            int rn = T - i < ATT_R ? T - i : ATT_R;
            tile_abt(S + i * lds + k0, lds, A + i * lda, lda, bt, KW, rn, nk);
        }
    }
}

/* Row stride of the backward's scratch blocks: keys rounded up to a tile,
 * plus one cache line so that the 64 rows of a block do not share L1 sets
 * (a 1 KiB stride at T = 256 put 16 rows in each 12-way set). */
static long pad_keys(int T) {
    return ((long)T + KW - 1) / KW * KW + 16;
}

size_t pt_att64_scratch_floats(int T, int block) {
    return (size_t)HS * (size_t)pad_keys(T) + 2 * (size_t)block * (size_t)pad_keys(T);
}

/* q, k, v: row 0 of the pair's head in qkv (row stride C3); att (T, T);
 * out row stride C. */
void pt_att64_forward_pair(float *out, float *att, const float *q, const float *k, const float *v,
                           int T, long C3, long C, int block) {
    float scale = 1.0f / sqrtf((float)HS);
    scores_all(att, T, q, C3, k, C3, T);
    for (int r0 = 0; r0 < T; r0 += block) {
        int r1 = r0 + block < T ? r0 + block : T;
        for (int t = r0; t < r1; t++) {
            float *restrict a = att + (long)t * T;
            int n = t + 1;
            float maxv = pt_max_lanes(a, n) * scale;
            float inv = 1.0f / pt_exp_sum_lanes(a, n, scale, maxv);
            for (int i = 0; i < n; i++) a[i] *= inv;
            for (int i = n; i < r1; i++) a[i] = 0.0f; /* tile_ab reads up to its last row */
        }
        for (int i = r0; i < r1; i += ATT_R) {
            int rn = r1 - i < ATT_R ? r1 - i : ATT_R;
            tile_ab(out + i * C, C, att + (long)i * T, T, v, C3, rn, i + rn, 0.0f);
        }
    }
}

/* As attention.c's backward per pair: blocks of query rows last first, so
 * the first write of dK and dV (last block, beta0) covers all their rows.
 * scratch: V^T (HS, ld), then P and dS blocks (block, ld). */
void pt_att64_backward_pair(float *dq, float *dk, float *dv, const float *q, const float *k,
                            const float *v, const float *att, const float *dout, float *scratch,
                            int T, long C3, long C, int block, float beta0) {
    float scale = 1.0f / sqrtf((float)HS);
    long ld = pad_keys(T);
    float *vt = scratch, *P = scratch + HS * ld, *dS = P + (long)block * ld;
    transpose64(vt, ld, v, C3, T);
    int nblocks = (T + block - 1) / block;
    for (int blk = nblocks - 1; blk >= 0; blk--) {
        int r0 = blk * block;
        int r1 = r0 + block < T ? r0 + block : T;
        float beta_kv = blk == nblocks - 1 ? beta0 : 1.0f;
        /* P rows with zeros past t: dV's tiles read up to r1 */
        for (int t = r0; t < r1; t++) {
            float *p = P + (long)(t - r0) * ld;
            memcpy(p, att + (long)t * T, sizeof(float) * (size_t)(t + 1));
            for (int i = t + 1; i < r1; i++) p[i] = 0.0f;
        }
        /* dV[0:r1] = beta dV + P^T dO[r0:r1]: row j gets rows i >= max(j, r0) */
        for (int j = 0; j < r1; j += ATT_R) {
            int rn = r1 - j < ATT_R ? r1 - j : ATT_R;
            int i0 = j > r0 ? j : r0;
            tile_atb(dv + j * C3, C3, P - r0 * ld, ld, dout, C, j, rn, i0, r1, beta_kv);
        }
        /* dP = dO V^T (into dS), then dS = P * (dP - rowsum(P * dP)) * scale */
        scores(dS - r0 * ld, ld, dout, C, vt, ld, r0, r1);
        for (int t = r0; t < r1; t++) {
            const float *restrict p = P + (long)(t - r0) * ld;
            float *restrict d = dS + (long)(t - r0) * ld;
            int n = t + 1;
            float dot = pt_dot_lanes(p, d, n);
            for (int i = 0; i < n; i++) d[i] = p[i] * (d[i] - dot) * scale;
            for (int i = n; i < r1; i++) d[i] = 0.0f;
        }
        /* dQ[r0:r1] = beta0 dQ + dS K[0:r1] */
        for (int i = r0; i < r1; i += ATT_R) {
            int rn = r1 - i < ATT_R ? r1 - i : ATT_R;
            tile_ab(dq + i * C3, C3, dS + (long)(i - r0) * ld, ld, k, C3, rn, i + rn, beta0);
        }
        /* dK[0:r1] = beta dK + dS^T Q[r0:r1] */
        for (int j = 0; j < r1; j += ATT_R) {
            int rn = r1 - j < ATT_R ? r1 - j : ATT_R;
            int i0 = j > r0 ? j : r0;
            tile_atb(dk + j * C3, C3, dS - r0 * ld, ld, q, C3, j, rn, i0, r1, beta_kv);
        }
    }
}
