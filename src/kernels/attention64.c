/* Causal attention for one (batch, head) pair when hs = 64 (every GPT-2
 * size): the products written as register-tiled loops on float vectors
 * instead of sgemm calls. At hs = 64 the products are small (64-row blocks,
 * K = 64 or a few hundred) and OpenBLAS ran them at about half its peak in
 * the step (packing both operands per call, the beta pass); these tiles keep
 * ATT_R rows x 4 vectors of accumulators in registers; their operands are
 * read in place or from plain copies (a transposed 64-key tile of K or V,
 * contiguous rows), never packed into sgemm's panels.
 *
 * Three tile shapes cover all five products (A rows, B rows, out rows):
 *   abt: out[i][j] = A[i] . B[j]           via B^T in a key tile (S = Q K^T, dP = dO V^T)
 *   ab:  out[i]   = sum_j A[i][j] B[j]     (O = P V, dQ = dS K)
 *   atb: out[j]   = sum_i A[i][j] B[i]     (dV = P^T dO, dK = dS^T Q)
 * Same contracts and same block order as attention.c's sgemm path (which
 * still serves other head sizes); results differ from it by float rounding.
 *
 * Vector extensions (fastmath.h): with AVX-512 a vector holds 16 floats and
 * a 64-float row is 4 vectors; narrower builds run the same code with more
 * (spilled) vectors. The one intrinsic part is the 16 x 16 transpose of K and
 * V tiles, with a scalar loop where AVX-512 is not built in.
 *
 * Around the tiles: partial row tiles also get constant row counts, diagonal
 * A B^T tiles compute only the key vectors their rows reach, the softmax rows
 * end in a masked vector instead of scalar tails, the B operands of the A B
 * and A^T B tiles are read from contiguous copies (K and V chunks, the
 * block's dO and Q rows), and the cold rows of q, k, v and dO are prefetched
 * a few rows per tile ahead of their use. */
#include <math.h>
#include <string.h>

#include "fastmath.h"
#include "kernels_impl.h"
#include "transpose.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define HS    64
#define HV    (HS / PT_VW) /* vectors per 64-float row */
#define KW    (4 * PT_VW)  /* keys per abt tile: 4 vectors */
#define ATT_R 6            /* rows per tile: 6 x 4 accumulators + 4 operands fit 32 registers */

/* The tile bodies are inlined by their wrappers once per row count 1..ATT_R,
 * each a compile-time constant: accumulators stay in registers, stores
 * unrolled. With a variable rn GCC kept the accumulators on the stack (a
 * third of tile_atb's time when only full tiles were constant), and the
 * partial tiles are not rare: 64-row blocks end in a 4-row tile, and with a
 * variable rn those ran a load + FMA + store per accumulator per step. */
#define TILE_INLINE static inline __attribute__((always_inline))
_Static_assert(ATT_R == 6, "ROWS_DISPATCH lists 1..6");
/* F(R) with R the constant rn (1..ATT_R) */
/* clang-format off */
#define ROWS_DISPATCH(rn, F)                                                                       \
    switch (rn) {                                                                                  \
    case 1: F(1); break;                                                                           \
    case 2: F(2); break;                                                                           \
    case 3: F(3); break;                                                                           \
    case 4: F(4); break;                                                                           \
    case 5: F(5); break;                                                                           \
    default: F(6); break;                                                                          \
    }
/* clang-format on */

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
 * floats each), BT (HS, KW) at row stride ldb with KW readable columns. Only
 * the first nv of the 4 key vectors are computed (and at most nk columns
 * stored): on the diagonal a row tile needs only the keys up to its last
 * row, and the rest of the tile is masked. */
TILE_INLINE void tile_abt_body(float *out, long ldo, const float *A, long lda, const float *BT,
                               long ldb, int rn, int nk, int nv) {
    pt_v8f acc[ATT_R][4];
    for (int r = 0; r < rn; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = pt_v8_splat(0.0f);
    for (int d = 0; d < HS; d++) {
        const float *b = BT + d * ldb;
        pt_v8f bv[4];
        for (int v = 0; v < nv; v++) bv[v] = pt_v8_load(b + v * PT_VW);
        for (int r = 0; r < rn; r++) {
            float x = A[r * lda + d];
            for (int v = 0; v < nv; v++) acc[r][v] += x * bv[v];
        }
    }
    for (int r = 0; r < rn; r++) {
        float *o = out + r * ldo;
        if (nk >= nv * PT_VW) {
            for (int v = 0; v < nv; v++) pt_v8_store(o + v * PT_VW, acc[r][v]);
        } else {
            float tmp[KW];
            for (int v = 0; v < nv; v++) pt_v8_store(tmp + v * PT_VW, acc[r][v]);
            memcpy(o, tmp, sizeof(float) * (size_t)nk);
        }
    }
}
/* need: the columns that matter (<= nk); full tiles drop the key vectors
 * past it, partial ones (a block's last rows) compute all four. */
static void tile_abt(float *out, long ldo, const float *A, long lda, const float *BT, long ldb,
                     int rn, int nk, int need) {
    if (rn == ATT_R) {
        switch ((need + PT_VW - 1) / PT_VW) {
        case 1:
            tile_abt_body(out, ldo, A, lda, BT, ldb, ATT_R, nk, 1);
            break;
        case 2:
            tile_abt_body(out, ldo, A, lda, BT, ldb, ATT_R, nk, 2);
            break;
        case 3:
            tile_abt_body(out, ldo, A, lda, BT, ldb, ATT_R, nk, 3);
            break;
        default:
            tile_abt_body(out, ldo, A, lda, BT, ldb, ATT_R, nk, 4);
            break;
        }
        return;
    }
#define ABT(R) tile_abt_body(out, ldo, A, lda, BT, ldb, R, nk, 4)
    ROWS_DISPATCH(rn, ABT);
#undef ABT
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
#define AB(R) tile_ab_body(out, ldo, A, lda, B, ldb, R, n, beta)
    ROWS_DISPATCH(rn, AB);
#undef AB
}

/* out[r] = beta * out[r] + sum_{i in [i0, i1)} A[i][j0 + r] B[i] for r < rn:
 * A's row i at A + (i - a0) * lda, B's at B + (i - a0) * ldb (A and B start
 * at row a0 <= i0: a block's rows, without a pointer before the buffer). */
TILE_INLINE void tile_atb_body(float *out, long ldo, const float *A, long lda, const float *B,
                               long ldb, int j0, int rn, int i0, int i1, int a0, float beta) {
    pt_v8f acc[ATT_R][HV];
    for (int r = 0; r < rn; r++)
        for (int v = 0; v < HV; v++) acc[r][v] = pt_v8_splat(0.0f);
    for (int i = i0; i < i1; i++) {
        const float *b = B + (i - a0) * ldb;
        const float *a = A + (i - a0) * lda + j0;
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
                     int j0, int rn, int i0, int i1, int a0, float beta) {
#define ATB(R) tile_atb_body(out, ldo, A, lda, B, ldb, j0, R, i0, i1, a0, beta)
    ROWS_DISPATCH(rn, ATB);
#undef ATB
}

/* Causal scores: S[i][j] = A[i] . B[j] for rows [r0, r1), keys j <= i (and
 * whatever else the key tile covers: entries past i are not meaningful).
 * S and A hold the rows from r0: row i at S + (i - r0) * lds.
 * BT (HS, ldb) holds B transposed, ldb >= the keys rounded up to KW, zeros
 * past the last key. */
static void scores(float *S, long lds, const float *A, long lda, const float *BT, long ldb, int r0,
                   int r1) {
    for (int k0 = 0; k0 < r1; k0 += KW) {
        int nk = r1 - k0 < KW ? r1 - k0 : KW;
        int i0 = k0 > r0 ? k0 : r0;
        for (int i = i0; i < r1; i += ATT_R) {
            int rn = r1 - i < ATT_R ? r1 - i : ATT_R;
            int need = i + rn - k0 < nk ? i + rn - k0 : nk;
            tile_abt(S + (i - r0) * lds + k0, lds, A + (i - r0) * lda, lda, BT + k0, ldb, rn, nk,
                     need);
        }
    }
}

/* BT (HS, ld) = rows [0, n) of B (stride ldb) transposed; columns [n, ld)
 * zeroed. Whole 16-row groups by register transposes where AVX-512 is built
 * in; the rest row by row: each read is a contiguous row of B and the writes
 * of 16 consecutive rows stay in the same 64 cache lines of BT (walking B by
 * columns instead missed L1 on every element: a row stride of 3C floats). */
static void transpose64(float *BT, long ld, const float *B, long ldb, int n) {
    int j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
        for (int d = 0; d < HS; d += 16) pt_transpose16(BT + d * ld + j, ld, B + j * ldb + d, ldb);
#endif
    for (; j < n; j++) {
        const float *b = B + j * ldb;
        for (int d = 0; d < HS; d++) BT[d * ld + j] = b[d];
    }
    for (int d = 0; d < HS; d++)
        for (long c = n; c < ld; c++) BT[d * ld + c] = 0.0f;
}

/* Software prefetch (into L2) of rows from a queue of up to four row
 * ranges, a few rows at a time from the tile loops. In the step the pair's
 * rows of q, k, v and dO are cold (written layers ago) and at strides of C or
 * 3C floats, one 256-byte run per 1.5-4.5 KiB, which the hardware
 * prefetchers do not follow: the tiles and the copies waited on one row at a
 * time. */
typedef struct {
    const float *m; /* first row */
    long ld;        /* row stride in floats */
    int rows, n;    /* rows, floats per row */
} pf_range;
typedef struct {
    pf_range rg[4];
    int nr, r, at; /* ranges; the next row: range r, row at */
} pf_queue;

static inline void pf_rows(pf_queue *pq, int n) {
    while (n > 0 && pq->r < pq->nr) {
        const pf_range *g = &pq->rg[pq->r];
        if (pq->at >= g->rows) {
            pq->r++, pq->at = 0;
            continue;
        }
        const char *row = (const char *)(g->m + pq->at * g->ld);
        for (long l = 0; l < g->n * (long)sizeof(float); l += 64) __builtin_prefetch(row + l, 0, 2);
        pq->at++, n--;
    }
}

/* Prefetch for writing rows [r, r + n) (HS floats each, stride ld) of dQ, dK
 * or dV: their first write in the backward goes to cold lines. */
static inline void pf_write_rows(float *m, long ld, int r, int n, int end) {
    for (int i = r; i < r + n && i < end; i++)
        for (int l = 0; l < HS; l += 64 / (int)sizeof(float))
            __builtin_prefetch(m + i * ld + l, 1, 2);
}

/* scores() for all T rows with B transposed one key tile at a time into a
 * 16 KiB stack buffer: the forward has no scratch argument. pq is advanced
 * by a few rows per tile (ahead of A's rows in the first sweep). */
static void scores_all(float *S, long lds, const float *A, long lda, const float *B, long ldb,
                       int T, pf_queue *pq) {
    float bt[HS * KW];
    pf_rows(pq, 2 * ATT_R);
    for (int k0 = 0; k0 < T; k0 += KW) {
        int nk = T - k0 < KW ? T - k0 : KW;
        transpose64(bt, KW, B + k0 * ldb, ldb, nk);
        for (int i = k0; i < T; i += ATT_R) {
            int rn = T - i < ATT_R ? T - i : ATT_R;
            pf_rows(pq, ATT_R + 2);
            int need = i + rn - k0 < nk ? i + rn - k0 : nk;
            tile_abt(S + i * lds + k0, lds, A + i * lda, lda, bt, KW, rn, nk, need);
        }
    }
}

/* out[i] = beta * out[i] + sum_{j <= i} A[i][j] B[j] for rows i in [r0, r1),
 * by chunks of KW keys (B's rows) in the outer loop. A's row i at
 * A + (i - a0) * lda (A starts at row a0 <= r0) with zeros from i + 1 to the end of its block of
 * `block` rows: tiles never cross a block. B's rows with a stride other than HS are first copied
 * into a contiguous 16 KiB buffer: in place (a stride of 3C floats) they fall into half of L1's
 * sets and 256 of them do not fit, so every 6-row tile streamed them again from L2 (perf: the tiles
 * stalled on those loads); a chunk, copied once, stays in L1 for all the tiles that need it. */
static void ab_causal(float *out, long ldo, const float *A, long lda, int a0, const float *B,
                      long ldb, int r0, int r1, int block, float beta) {
    float bc[KW * HS];
    for (int k0 = 0; k0 < r1; k0 += KW) {
        int nk = r1 - k0 < KW ? r1 - k0 : KW;
        const float *bk = B + k0 * ldb;
        if (ldb != HS) {
            for (int j = 0; j < nk; j++) memcpy(bc + j * HS, bk + j * ldb, sizeof(float) * HS);
            bk = bc;
        }
        float b = k0 == 0 ? beta : 1.0f; /* chunk 0 reaches every row */
        for (int s = r0; s < r1; s += block) {
            int e = s + block < r1 ? s + block : r1;
            for (int i = s; i < e; i += ATT_R) {
                int rn = e - i < ATT_R ? e - i : ATT_R;
                int n = i + rn - k0 < nk ? i + rn - k0 : nk;
                if (k0 == 0) pf_write_rows(out, ldo, i + ATT_R, ATT_R, e);
                if (n > 0)
                    tile_ab(out + i * ldo, ldo, A + (i - a0) * lda + k0, lda, bk, HS, rn, n, b);
            }
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
    return (size_t)HS * (size_t)pad_keys(T) + 2 * (size_t)block * (size_t)pad_keys(T) +
           2 * (size_t)block * HS + (size_t)T * HS;
}

/* a[0:n] = softmax(a[0:n] * scale), a[n:end) = 0, with a readable and
 * writable up to lim >= end. The last partial vector is done masked when it
 * fits under lim (lanes past n give 0), not by a scalar tail: at hs = 64 the
 * scalar exp, max and scale tails of every row (7.5 elements on average)
 * cost about as much as the row's vectors. */
static void softmax_row(float *restrict a, int n, int end, int lim, float scale) {
    const float lowest = -3.0e38f;
    int full = n / PT_VW * PT_VW;
    int masked = full < n && full + PT_VW <= lim;
    pt_v8i lane;
    for (int l = 0; l < PT_VW; l++) lane[l] = l;
    pt_v8i live = lane < (pt_v8i){0} + (n - full);
    pt_v8f m = pt_v8_splat(lowest);
    for (int i = 0; i < full; i += PT_VW) m = pt_v8_max(m, pt_v8_load(a + i));
    if (masked) m = pt_v8_max(m, pt_v8_select(live, pt_v8_load(a + full), pt_v8_splat(lowest)));
    float maxv = lowest;
    for (int l = 0; l < PT_VW; l++) maxv = m[l] > maxv ? m[l] : maxv;
    if (!masked)
        for (int i = full; i < n; i++) maxv = a[i] > maxv ? a[i] : maxv;
    maxv *= scale;
    pt_v8f acc = pt_v8_splat(0.0f);
    for (int i = 0; i < full; i += PT_VW) {
        pt_v8f e = pt_v8_exp(pt_v8_load(a + i) * scale - maxv);
        pt_v8_store(a + i, e);
        acc += e;
    }
    float tail = 0.0f;
    if (masked) {
        pt_v8f e = pt_v8_exp(pt_v8_load(a + full) * scale - maxv);
        e = pt_v8_select(live, e, pt_v8_splat(0.0f));
        pt_v8_store(a + full, e);
        acc += e;
    } else {
        for (int i = full; i < n; i++) tail += a[i] = pt_fast_expf(a[i] * scale - maxv);
    }
    pt_v8f inv = pt_v8_splat(1.0f / (pt_v8_hsum(acc) + tail));
    int done = masked ? full + PT_VW : full;
    for (int i = 0; i < done; i += PT_VW) pt_v8_store(a + i, pt_v8_load(a + i) * inv);
    for (int i = done; i < n; i++) a[i] *= inv[0];
    for (int i = done > n ? done : n; i < end; i++) a[i] = 0.0f;
}

/* d[0:n] = p * (d - p . d) * scale over [0, n), d[n:end) = 0, with d and p
 * readable and d writable up to lim >= end: as softmax_row, the last partial
 * vector masked instead of scalar tails. */
static void softmax_bwd_row(float *restrict d, const float *restrict p, int n, int end, int lim,
                            float scale) {
    int full = n / PT_VW * PT_VW;
    int masked = full < n && full + PT_VW <= lim;
    pt_v8i lane;
    for (int l = 0; l < PT_VW; l++) lane[l] = l;
    pt_v8i live = lane < (pt_v8i){0} + (n - full);
    pt_v8f acc = pt_v8_splat(0.0f), zero = pt_v8_splat(0.0f);
    for (int i = 0; i < full; i += PT_VW) acc += pt_v8_load(p + i) * pt_v8_load(d + i);
    if (masked) acc += pt_v8_select(live, pt_v8_load(p + full) * pt_v8_load(d + full), zero);
    float dot = pt_v8_hsum(acc);
    if (!masked)
        for (int i = full; i < n; i++) dot += p[i] * d[i];
    for (int i = 0; i < full; i += PT_VW)
        pt_v8_store(d + i, pt_v8_load(p + i) * (pt_v8_load(d + i) - dot) * scale);
    if (masked) {
        pt_v8f x = pt_v8_load(p + full) * (pt_v8_load(d + full) - dot) * scale;
        pt_v8_store(d + full, pt_v8_select(live, x, zero));
    } else {
        for (int i = full; i < n; i++) d[i] = p[i] * (d[i] - dot) * scale;
    }
    for (int i = masked ? full + PT_VW : n; i < end; i++) d[i] = 0.0f;
}

/* q, k, v: row 0 of the pair's head in qkv (row stride C3); att (T, T);
 * out row stride C. */
void pt_att64_forward_pair(float *out, float *att, const float *q, const float *k, const float *v,
                           int T, long C3, long C, int block) {
    float scale = 1.0f / sqrtf((float)HS);
    /* q's rows lead (the first key tile's sweep reads them all), then the
     * rows of k past the first tile, then v's for P V */
    pf_queue pq = {.nr = 3};
    pq.rg[0] = (pf_range){q, C3, T, HS};
    pq.rg[1] = (pf_range){T > KW ? k + KW * C3 : k, C3, T > KW ? T - KW : 0, HS};
    pq.rg[2] = (pf_range){v, C3, T, HS};
    scores_all(att, T, q, C3, k, C3, T, &pq);
    for (int r0 = 0; r0 < T; r0 += block) {
        int r1 = r0 + block < T ? r0 + block : T;
        /* zeros up to r1: tile_ab reads up to its last row */
        for (int t = r0; t < r1; t++) softmax_row(att + (long)t * T, t + 1, r1, T, scale);
    }
    ab_causal(out, C, att, T, 0, v, C3, 0, T, block, 0.0f);
}

/* out[0:r1] (row stride ldo) = beta out + A^T B over the block's rows
 * [r0, r1) (A: P or dS, row stride lda; B: dO or Q, contiguous HS floats):
 * key row j gets rows i >= max(j, r0). Each tile also advances the prefetch
 * queue; first: the first block walked (blocks go last-first), whose tiles
 * write out for the first time, so its next rows are fetched for writing. */
static void atb_keys(float *out, long ldo, const float *A, long lda, const float *B, int r0, int r1,
                     int first, pf_queue *pq, int per, float beta) {
    for (int j = 0; j < r1; j += ATT_R) {
        int rn = r1 - j < ATT_R ? r1 - j : ATT_R;
        int i0 = j > r0 ? j : r0;
        pf_rows(pq, per);
        if (first) pf_write_rows(out, ldo, j + ATT_R, ATT_R, r1);
        tile_atb(out + j * ldo, ldo, A, lda, B, HS, j, rn, i0, r1, r0, beta);
    }
}

/* As attention.c's backward per pair: blocks of query rows last first, so
 * the first write of dK and dV (last block, beta0) covers all their rows.
 * scratch: V^T (HS, ld), then P and dS blocks (block, ld), then the block's
 * rows of dO and Q (block, HS), then K packed (T, HS). */
void pt_att64_backward_pair(float *dq, float *dk, float *dv, const float *q, const float *k,
                            const float *v, const float *att, const float *dout, float *scratch,
                            int T, long C3, long C, int block, float beta0) {
    float scale = 1.0f / sqrtf((float)HS);
    long ld = pad_keys(T);
    float *vt = scratch, *P = scratch + HS * ld, *dS = P + (long)block * ld;
    float *dob = dS + (long)block * ld, *qb = dob + (long)block * HS, *kp = qb + (long)block * HS;
    int nblocks = (T + block - 1) / block;
    int rl = (nblocks - 1) * block; /* the last block's first row */
    pf_queue pq = {.nr = 4};
    pq.rg[0] = (pf_range){k, C3, T, HS};
    pq.rg[1] = (pf_range){v, C3, T, HS};
    pq.rg[2] = (pf_range){dout + rl * C, C, T - rl, HS};
    pq.rg[3] = (pf_range){q + rl * C3, C3, T - rl, HS};
    pf_rows(&pq, 16);
    for (int t = 0; t < T; t++) {
        pf_rows(&pq, 3);
        memcpy(kp + (long)t * HS, k + t * C3, sizeof(float) * HS);
    }
    transpose64(vt, ld, v, C3, T);
    for (int blk = nblocks - 1; blk >= 0; blk--) {
        int r0 = blk * block;
        int r1 = r0 + block < T ? r0 + block : T;
        float beta_kv = blk == nblocks - 1 ? beta0 : 1.0f;
        /* the block's rows of dO and Q, contiguous: the A^T B tiles read all
         * of them once per 6 keys, and at their row strides (C, 3C floats)
         * they use a half or a quarter of L1's sets */
        for (int t = r0; t < r1; t++) {
            memcpy(dob + (long)(t - r0) * HS, dout + t * C, sizeof(float) * HS);
            memcpy(qb + (long)(t - r0) * HS, q + t * C3, sizeof(float) * HS);
        }
        /* P rows with zeros past t: dV's tiles read up to r1 */
        for (int t = r0; t < r1; t++) {
            float *p = P + (long)(t - r0) * ld;
            memcpy(p, att + (long)t * T, sizeof(float) * (size_t)(t + 1));
            for (int i = t + 1; i < r1; i++) p[i] = 0.0f;
        }
        /* while this block runs its tiles: the next block's rows of dO, Q
         * and att, spread over the dV and dK tiles */
        if (blk > 0) {
            int n0 = r0 - block;
            pq = (pf_queue){.nr = 2};
            pq.rg[0] = (pf_range){dout + n0 * C, C, block, HS};
            pq.rg[1] = (pf_range){q + n0 * C3, C3, block, HS};
        }
        int calls = 2 * ((r1 + ATT_R - 1) / ATT_R);
        int per = (2 * block + calls - 1) / calls;
        /* dV[0:r1] = beta dV + P^T dO[r0:r1] */
        atb_keys(dv, C3, P, ld, dob, r0, r1, blk == nblocks - 1, &pq, per, beta_kv);
        /* dP = dO V^T (into dS), then dS = P * (dP - rowsum(P * dP)) * scale */
        scores(dS, ld, dob, HS, vt, ld, r0, r1);
        for (int t = r0; t < r1; t++)
            softmax_bwd_row(dS + (long)(t - r0) * ld, P + (long)(t - r0) * ld, t + 1, r1, ld,
                            scale);
        /* dQ[r0:r1] = beta0 dQ + dS K[0:r1] */
        ab_causal(dq, C3, dS, ld, r0, kp, HS, r0, r1, block, beta0);
        /* dK[0:r1] = beta dK + dS^T Q[r0:r1] */
        atb_keys(dk, C3, dS, ld, qb, r0, r1, blk == nblocks - 1, &pq, per, beta_kv);
    }
}
