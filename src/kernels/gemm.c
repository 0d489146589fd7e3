/* pt_sgemm: row-major C = op(A) op(B) (+ C), with the linears' elementwise
 * work fused into it.
 *
 * OpenBLAS runs the linears' shapes (N = 384 outputs, K = 384 inner sizes)
 * at 80-90% of its square-matrix peak, clears C in a separate pass when
 * beta = 0, and leaves bias, residual, GELU and the bias gradient to extra
 * passes over 3-12 MB arrays. Here the same products are the BLIS loop nest
 * on AVX-512, cut to these shapes:
 *
 *   for each K block (kc <= 512):
 *     for each N block (nc <= 384 columns):
 *       pack B[kc, nc] into 32-column panels, k-major (stays in L2; the
 *         panels split over the pool's threads), adding B's column sums to
 *         epi->colsum on the way (dbias)
 *       for each 12-row tile of A (split over the pool's threads; with
 *         fewer than 8 tiles, a micro-batch of 64 tokens, the panels are
 *         split instead):
 *         pack the tile's A[12, kc], k-major, if A is transposed (else
 *           the micro-kernel reads A's 12 rows in place)
 *         for each 32-column panel: the 12x32 micro-kernel (24 zmm
 *           accumulators) adds the product to the C tile; on the first K
 *           block the tile starts as res + bias, after the last GELU or
 *           GELU's derivative is applied to it while it is in L1
 *
 * Each C element is a sum over k in a fixed order (K blocks in turn, k in
 * turn inside a block): the same bits at any thread count and any M.
 *
 * The OpenBLAS path (no AVX-512, small products, or PT_GEMM=blas) does the
 * same arithmetic as separate passes around cblas_sgemm; the tests run
 * both. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "epilogue16.h"
#include "gelu.h"
#include "kernels_impl.h"
#include "transpose.h"

static int g_path = -1; /* a pt_gemm_path; -1: PT_GEMM not read yet */

int pt_sgemm_set_path(int path) {
    int old = g_path;
    g_path = path;
    return old;
}

int pt_sgemm_has_own(void) {
#if defined(__AVX512F__)
    return 1;
#else
    return 0;
#endif
}

/* ---- epilogue, shared by both paths ------------------------------------- */

/* Row segment c[0..w) of C at (row i, column j). first: c = (res + bias) +
 * c, or c = res + bias when set (C holds nothing yet; it may alias res).
 * last: act = gelu(c), or c = gelu'(pre) * c. res / act / pre share C's row
 * stride. */
static void epilogue_row(const pt_gemm_epilogue *e, float *c, long i, long j, long ldc, int w,
                         int first, int last, int set) {
    long off = i * ldc + j;
    int x = 0;
    if (first && (e->bias || e->res)) {
        const float *b = e->bias ? e->bias + j : NULL, *r = e->res ? e->res + off : NULL;
        for (; x + PT_VW <= w; x += PT_VW) {
            pt_v8f t =
                b && r ? pt_v8_load(r + x) + pt_v8_load(b + x) : pt_v8_load(b ? b + x : r + x);
            pt_v8_store(c + x, set ? t : t + pt_v8_load(c + x));
        }
        for (; x < w; x++) {
            float t = b && r ? r[x] + b[x] : b ? b[x] : r[x];
            c[x] = set ? t : t + c[x];
        }
    }
    if (!last) return;
    if (e->out16) pt_row_store16(e->out16 + off, c, w);
    if (e->act) {
        float *a = e->act + off;
        for (x = 0; x + PT_VW <= w; x += PT_VW) pt_v8_store(a + x, pt_v8_gelu(pt_v8_load(c + x)));
        for (; x < w; x++) a[x] = pt_gelu(c[x]);
    }
    if (e->act16) pt_epilogue16_act(e->act16 + off, c, w);
    if (e->pre) {
        const float *p = e->pre + off;
        for (x = 0; x + PT_VW <= w; x += PT_VW)
            pt_v8_store(c + x, pt_v8_gelu_grad(pt_v8_load(p + x)) * pt_v8_load(c + x));
        for (; x < w; x++) c[x] = pt_gelu_grad(p[x]) * c[x];
    }
    if (e->pre16) pt_epilogue16_pre(e->pre16 + off, c, w);
}

/* ---- OpenBLAS path --------------------------------------------------------- */

typedef struct {
    const pt_gemm_epilogue *e;
    float *C;
    long ldc;
    int M, N, first, last, set;
} epi_ctx;

static void epilogue_part(void *p, int index, int count) {
    const epi_ctx *c = p;
    long lo, hi;
    pt_split_range(c->M, index, count, &lo, &hi);
    for (long i = lo; i < hi; i++)
        epilogue_row(c->e, c->C + i * c->ldc, i, 0, c->ldc, c->N, c->first, c->last, c->set);
}

typedef struct {
    float *colsum;
    const float *B;
    long ldb;
    int K, N;
} colsum_ctx;

/* Columns [lo, hi), rows added in order: the same bits at any thread count. */
static void colsum_part(void *p, int index, int count) {
    const colsum_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    float *restrict cs = c->colsum;
    for (int k = 0; k < c->K; k++) {
        const float *restrict b = c->B + k * c->ldb;
        for (long j = lo; j < hi; j++) cs[j] += b[j];
    }
}

void pt_colsum_add(float *colsum, const float *B, long ldb, int K, int N) {
    colsum_ctx c = {.colsum = colsum, .B = B, .ldb = ldb, .K = K, .N = N};
    pt_pool_run(colsum_part, &c, (long)K * N < 65536 || N < 64 ? 1 : pt_kernels_threads());
}

static void sgemm_blas(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B,
                       int ldb, float beta, float *C, int ldc, const pt_gemm_epilogue *e) {
    if (e && e->colsum) pt_colsum_add(e->colsum, B, ldb, K, N);
    int nw = (long)M * N < 65536 ? 1 : pt_kernels_threads();
    epi_ctx ec = {.e = e, .C = C, .ldc = ldc, .M = M, .N = N, .first = 1, .set = beta == 0.0f};
    if (e && (e->bias || e->res)) {
        /* C starts as res + bias, or gets it added (beta = 1). */
        pt_pool_run(epilogue_part, &ec, nw);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    if (pt_gemm_epilogue_last(e)) {
        ec.first = 0;
        ec.last = 1;
        pt_pool_run(epilogue_part, &ec, nw);
    }
}

/* ---- AVX-512 path ---------------------------------------------------------- */

#if defined(__AVX512F__)
#include <immintrin.h>

/* Tile and blocks: a 12x32 C tile is 24 of the 32 zmm registers; a B block
 * of 512 x 384 floats (768 KiB) stays in L2 (2 MiB here) beside A and C;
 * prefetch B 8 k-steps ahead and the C tile 24 k-steps before it is needed
 * (measured: 512 x 384 blocks 1-3% faster than 384 x 384 or 512 x 512). */
enum { MR = 12, NR = 32, KC_MAX = 512, NC_MAX = 384, PF_B = 8, PF_C = 24 };
/* Below this many row tiles the workers split the B block's panels. */
enum { MIN_TILES = 8 };
_Static_assert(NR == 2 * PT_VW, "a tile row is two vectors");

typedef struct {
    int ta, tb;
    const float *A, *B;
    long lda, ldb, ldc;
    float *C;
    const float *bp; /* packed B block */
    float *bp_w;     /* the same, to write */
    const pt_gemm_epilogue *e;
    int M, N, pc, kc, jc, nc, acc, first, last;
} gemm_ctx;

/* Per-thread packing buffers, fixed size (no kernel allocates): the B block
 * of the calling thread and the A tile of each worker. Untouched pages of a
 * thread that never multiplies cost nothing. */
static _Thread_local float tl_b[KC_MAX * NC_MAX] __attribute__((aligned(64)));
static _Thread_local float tl_a[MR * KC_MAX] __attribute__((aligned(64)));

/* c[12][32] (row stride ldc) = (acc ? c : 0) + A[12][kc] * bp[kc][32], with
 * A's (r, k) at ap[r * rs + k * ks]. Inlined into its two callers, which fix
 * the strides. */
static inline __attribute__((always_inline)) void
kernel_tile(int kc, const float *restrict ap, long rs, long ks, const float *restrict bp,
            float *restrict c, long ldc, int acc) {
    __m512 cv[MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) cv[r][0] = cv[r][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++) {
        /* C's 24 lines are read or written after the loop: fetch them a
         * little before, and B's panel a few steps ahead. */
        if (k == kc - PF_C)
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++) {
                _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
                _mm_prefetch((const char *)(c + r * ldc + 16), _MM_HINT_T0);
            }
        _mm_prefetch((const char *)(bp + PF_B * NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(bp + PF_B * NR + 16), _MM_HINT_T0);
        __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512 a = _mm512_set1_ps(ap[r * rs]);
            cv[r][0] = _mm512_fmadd_ps(a, b0, cv[r][0]);
            cv[r][1] = _mm512_fmadd_ps(a, b1, cv[r][1]);
        }
        ap += ks;
        bp += NR;
    }
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) {
        float *p = c + r * ldc;
        if (acc) {
            cv[r][0] = _mm512_add_ps(_mm512_loadu_ps(p), cv[r][0]);
            cv[r][1] = _mm512_add_ps(_mm512_loadu_ps(p + 16), cv[r][1]);
        }
        _mm512_storeu_ps(p, cv[r][0]);
        _mm512_storeu_ps(p + 16, cv[r][1]);
    }
}

/* A packed: ap[kc][12]. */
static void kernel_12x32(int kc, const float *ap, const float *bp, float *c, long ldc, int acc) {
    kernel_tile(kc, ap, 1, MR, bp, c, ldc, acc);
}

/* A read in place, row r at ap + r * lda: for A not transposed, packing is
 * a transpose that cost 8-15% of a product with 384 output columns. */
static void kernel_12x32_direct(int kc, const float *ap, long lda, const float *bp, float *c,
                                long ldc, int acc) {
    kernel_tile(kc, ap, lda, 1, bp, c, ldc, acc);
}

/* B[pc .. pc+kc, jc .. jc+nc] as 32-column panels, k-major, zero past N;
 * B's column sums go to epi->colsum in row order (B not transposed). The
 * panels are split over the pool: each worker owns whole columns. */
static void pack_b_part(void *p, int index, int count) {
    const gemm_ctx *g = p;
    float *restrict bp = g->bp_w;
    float *colsum = g->e ? g->e->colsum : NULL;
    long lo, hi;
    pt_split_range((g->nc + NR - 1) / NR, index, count, &lo, &hi);
    for (int j0 = (int)lo * NR; j0 < hi * NR; j0 += NR) {
        float *restrict dst = bp + (long)j0 * g->kc;
        int w = g->N - (g->jc + j0) < NR ? g->N - (g->jc + j0) : NR;
        if (!g->tb) {
            const float *src = g->B + (long)g->pc * g->ldb + g->jc + j0;
            float *restrict cs = colsum ? colsum + g->jc + j0 : NULL;
            for (int k = 0; k < g->kc; k++, src += g->ldb, dst += NR) {
                memcpy(dst, src, sizeof(float) * (size_t)w);
                for (int j = w; j < NR; j++) dst[j] = 0.0f;
                if (cs)
                    for (int j = 0; j < w; j++) cs[j] += src[j];
            }
        } else {
            /* 16 x 16 register transposes; the scalar loop (one strided
             * store per element) cost 15-30% of a product with 256 rows */
            const float *src = g->B + (long)(g->jc + j0) * g->ldb + g->pc;
            int k16 = w == NR ? g->kc / 16 * 16 : 0;
            for (int k = 0; k < k16; k += 16)
                for (int j = 0; j < NR; j += 16)
                    pt_transpose16(dst + (long)k * NR + j, NR, src + (long)j * g->ldb + k, g->ldb);
            for (int j = 0; j < NR; j++) {
                const float *sj = src + (long)j * g->ldb;
                for (int k = k16; k < g->kc; k++) dst[(long)k * NR + j] = j < w ? sj[k] : 0.0f;
            }
        }
    }
}

/* A[i0 .. i0+12, pc .. pc+kc], k-major, zero past M. */
static void pack_a(float *restrict ap, const gemm_ctx *g, int i0) {
    int h = g->M - i0 < MR ? g->M - i0 : MR;
    if (g->ta) {
        const float *src = g->A + (long)g->pc * g->lda + i0;
        for (int k = 0; k < g->kc; k++, src += g->lda, ap += MR) {
            memcpy(ap, src, sizeof(float) * (size_t)h);
            for (int r = h; r < MR; r++) ap[r] = 0.0f;
        }
    } else {
        for (int r = 0; r < MR; r++) {
            if (r >= h) {
                for (int k = 0; k < g->kc; k++) ap[(long)k * MR + r] = 0.0f;
                continue;
            }
            const float *src = g->A + (long)(i0 + r) * g->lda + g->pc;
            for (int k = 0; k < g->kc; k++) ap[(long)k * MR + r] = src[k];
        }
    }
}

/* epilogue_row on a whole 12x32 tile at (i0, j), each case in its own
 * loop: called per row, the branches and setup cost as much as the work.
 * The same arithmetic as epilogue_row, so the same bits. */
static void tile_first(const pt_gemm_epilogue *e, float *c, long ldc, long i0, long j, int set) {
    const float *b = e->bias ? e->bias + j : NULL, *res = e->res ? e->res + i0 * ldc + j : NULL;
    pt_v8f b0 = {0}, b1 = {0};
    if (b) b0 = pt_v8_load(b), b1 = pt_v8_load(b + PT_VW);
    for (int r = 0; r < MR; r++, c += ldc) {
        pt_v8f t0 = b0, t1 = b1;
        if (res) {
            const float *x = res + r * ldc;
            t0 = b ? pt_v8_load(x) + b0 : pt_v8_load(x);
            t1 = b ? pt_v8_load(x + PT_VW) + b1 : pt_v8_load(x + PT_VW);
        }
        pt_v8_store(c, set ? t0 : t0 + pt_v8_load(c));
        pt_v8_store(c + PT_VW, set ? t1 : t1 + pt_v8_load(c + PT_VW));
    }
}

static void tile_last(const pt_gemm_epilogue *e, float *c, long ldc, long i0, long j) {
    long off = i0 * ldc + j;
    if (e->out16 || e->act16 || e->pre16 || (e->act && e->pre)) {
        /* the bf16 parts (the bf16 fallback's chunks): row by row */
        for (int r = 0; r < MR; r++) epilogue_row(e, c + r * ldc, i0 + r, j, ldc, NR, 0, 1, 0);
        return;
    }
    if (e->act) {
        float *a = e->act + off;
        for (int r = 0; r < MR; r++, c += ldc, a += ldc) {
            pt_v8_store(a, pt_v8_gelu(pt_v8_load(c)));
            pt_v8_store(a + PT_VW, pt_v8_gelu(pt_v8_load(c + PT_VW)));
        }
    } else {
        const float *p = e->pre + off;
        for (int r = 0; r < MR; r++, c += ldc, p += ldc) {
            pt_v8_store(c, pt_v8_gelu_grad(pt_v8_load(p)) * pt_v8_load(c));
            pt_v8_store(c + PT_VW, pt_v8_gelu_grad(pt_v8_load(p + PT_VW)) * pt_v8_load(c + PT_VW));
        }
    }
}

/* One C tile: A packed in ap, or read in place (direct). */
static void tile(const gemm_ctx *g, int direct, const float *ap, int i0, const float *bp, float *c,
                 long ldc, int acc) {
    if (direct)
        kernel_12x32_direct(g->kc, g->A + (long)i0 * g->lda + g->pc, g->lda, bp, c, ldc, acc);
    else
        kernel_12x32(g->kc, ap, bp, c, ldc, acc);
}

/* Tiles [lo, hi) of A times panels [plo, phi) of the B block: each C
 * tile's sum is the same whichever worker takes it. */
static void compute_part(void *p, int index, int count) {
    const gemm_ctx *g = p;
    long tiles = (g->M + MR - 1) / MR, panels = (g->nc + NR - 1) / NR, lo = 0, hi = tiles, plo = 0,
         phi = panels;
    if (tiles < MIN_TILES)
        pt_split_range(panels, index, count, &plo, &phi);
    else
        pt_split_range(tiles, index, count, &lo, &hi);
    float *ap = tl_a;
    const pt_gemm_epilogue *e = g->e;
    /* res + bias go in before the product (the tile may alias res), the
     * activation after the last K block. */
    int pro = g->first && e && (e->bias || e->res), epi = g->last && pt_gemm_epilogue_last(e);
    int acc = g->acc || pro;
    float edge[MR * NR];
    for (long t = lo; t < hi; t++) {
        int i0 = (int)(t * MR), h = g->M - i0 < MR ? g->M - i0 : MR;
        int direct = !g->ta && h == MR; /* a partial tile is packed with zero rows */
        if (!direct) pack_a(ap, g, i0);
        for (int j0 = (int)plo * NR; j0 < phi * NR; j0 += NR) {
            float *c = g->C + (long)i0 * g->ldc + g->jc + j0;
            const float *bp = g->bp + (long)j0 * g->kc;
            int w = g->nc - j0 < NR ? g->nc - j0 : NR;
            int full = h == MR && w == NR;
            if (pro && full)
                tile_first(e, c, g->ldc, i0, g->jc + j0, !g->acc);
            else if (pro)
                for (int r = 0; r < h; r++)
                    epilogue_row(e, c + r * g->ldc, i0 + r, g->jc + j0, g->ldc, w, 1, 0, !g->acc);
            if (full) {
                tile(g, direct, ap, i0, bp, c, g->ldc, acc);
            } else {
                tile(g, direct, ap, i0, bp, edge, NR, 0);
                for (int r = 0; r < h; r++)
                    for (int j = 0; j < w; j++)
                        c[r * g->ldc + j] = (acc ? c[r * g->ldc + j] : 0.0f) + edge[r * NR + j];
            }
            if (epi && full)
                tile_last(e, c, g->ldc, i0, g->jc + j0);
            else if (epi)
                for (int r = 0; r < h; r++)
                    epilogue_row(e, c + r * g->ldc, i0 + r, g->jc + j0, g->ldc, w, 0, 1, 0);
        }
    }
}

/* Split n into the fewest blocks of at most max, rounded up to a multiple of
 * unit: balanced blocks instead of a full one and a sliver. */
static int block_size(int n, int max, int unit) {
    int nb = (n + max - 1) / max;
    int b = (n + nb - 1) / nb;
    return (b + unit - 1) / unit * unit;
}

static void sgemm_avx512(int ta, int tb, int M, int N, int K, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc,
                         const pt_gemm_epilogue *e) {
    gemm_ctx g = {.ta = ta,
                  .tb = tb,
                  .A = A,
                  .B = B,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .C = C,
                  .e = e,
                  .M = M,
                  .N = N};
    int kcb = block_size(K, KC_MAX, 1), ncb = block_size(N, NC_MAX, NR);
    float *bp = tl_b; /* kcb <= KC_MAX, ncb <= NC_MAX */
    long tiles = (M + MR - 1) / MR;
    /* Few tiles: the panels go to the workers instead (gpt2's head at 64
     * tokens is 6 tiles: it took 39 ms on one thread and on two). Under a
     * million multiply-adds the product stays on one thread: a pool run
     * costs microseconds. */
    int workers = tiles >= MIN_TILES || (long)M * N * K >= 1L << 20 ? pt_kernels_threads() : 1;
    for (int pc = 0; pc < K; pc += kcb) {
        g.pc = pc;
        g.kc = K - pc < kcb ? K - pc : kcb;
        g.acc = pc > 0 || beta != 0.0f;
        g.first = pc == 0;
        g.last = pc + g.kc == K;
        for (int jc = 0; jc < N; jc += ncb) {
            g.jc = jc;
            g.nc = N - jc < ncb ? N - jc : ncb;
            g.bp = g.bp_w = bp;
            pt_pool_run(pack_b_part, &g, workers);
            pt_pool_run(compute_part, &g, workers);
        }
    }
}

static int gemm_path(void) {
    if (g_path < 0) {
        const char *s = pt_knob_str("PT_GEMM");
        g_path = strcmp(s, "blas") == 0  ? PT_GEMM_BLAS
                 : strcmp(s, "own") == 0 ? PT_GEMM_OWN
                                         : PT_GEMM_AUTO;
    }
    return g_path;
}

/* Below this much work per call the packing does not pay: OpenBLAS's small
 * kernels are faster (measured: a 37x45x29 product at half its speed). */
static int small(int M, int N, int K) {
    return M < 48 || N < 64 || K < 64;
}
#endif

const char *pt_gemm_path_name(void) {
#if defined(__AVX512F__)
    int path = gemm_path();
    return path == PT_GEMM_BLAS  ? "OpenBLAS (PT_GEMM=blas)"
           : path == PT_GEMM_OWN ? "own AVX-512 GEMM (PT_GEMM=own)"
                                 : "own AVX-512 GEMM (OpenBLAS below 48x64x64)";
#else
    return "OpenBLAS (built without AVX-512)";
#endif
}

void pt_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
              float beta, float *C, int ldc, const pt_gemm_epilogue *e) {
    PT_ASSERT(!(e && e->colsum && tb)); /* column sums of a B stored as is only */
    if (M <= 0 || N <= 0) return;
#if defined(__AVX512F__)
    int path = gemm_path();
    if (K > 0 && (path == PT_GEMM_OWN || (path == PT_GEMM_AUTO && !small(M, N, K)))) {
        sgemm_avx512(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, e);
        return;
    }
#endif
    sgemm_blas(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, e);
}
