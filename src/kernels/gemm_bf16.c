/* pt_gemm_bf16: C (fp32) = op(A) op(B) (+ C) with A and B in bf16, the
 * products summed in fp32, pt_sgemm's epilogues fused; the path chosen at
 * run time (kernels_impl.h lists them; pt_gemm_bf16_kind names it).
 *
 * The own paths (AVX512_BF16, AMX) are gemm.c's BLIS loop nest on pairs of
 * K (vdpbf16ps and TDPBF16PS multiply two bf16 pairs per fp32 lane):
 *
 *   for each K block (kc <= KC_MAX, a multiple of the kernel's kalign):
 *     for each N block (nc <= NC_MAX columns):
 *       pack B[kc, nc] into 32-column panels of K pairs (bf16_impl.h), the
 *         panels split over the pool, adding B's column sums (as fp32) to
 *         epi->colsum on the way
 *       for each mr-row tile of A (split over the pool; with fewer than 8
 *         tiles the panels are split instead):
 *         pack the tile if A is transposed or the tile is partial (else
 *           the micro-kernel reads A's rows in place: a K pair is 4
 *           adjacent bytes of a row)
 *         for each panel: res + bias into the C tile on the first K block,
 *           the micro-kernel adds the product, GELU or its derivative
 *           after the last K block while the tile is in L1
 *
 * The AVX512_BF16 micro-kernel is 12 x 32: 24 zmm accumulators; per K pair
 * two panel loads, 12 broadcasts of an A pair, 24 vdpbf16ps (each 16 lanes
 * x 2 products). Each C element is a sum over K in a fixed order (K blocks
 * in turn, pairs in turn inside a block, the pair's two products inside
 * the instruction): the same bits at any thread count and any M. They need
 * not be the fallback's bits: vdpbf16ps rounds after each product's add
 * (Intel SDM) and treats bf16 subnormals as zero.
 *
 * Not here: AMX's micro-kernel and permission (gemm_bf16_amx.c), the
 * fallback (gemm_bf16_fallback.c), conversions (bf16.c). */
#include <string.h>

#include "bf16_impl.h"
#include "epilogue16.h"
#include "gelu.h"

#if PT_BF16_X86
#include <immintrin.h>
#endif

/* ---- path choice ---------------------------------------------------------- */

static int g_path = PT_BF16_AUTO;

int pt_gemm_bf16_has_path(int path) {
    const pt_bf16_cpu *c = pt_bf16_cpu_get();
    switch (path) {
    case PT_BF16_AUTO:
    case PT_BF16_FALLBACK:
        return 1;
    case PT_BF16_AVX512:
        return c->avx512bf16;
    case PT_BF16_AMX:
        return c->amx && pt_bf16_amx_permitted();
    default:
        return 0;
    }
}

int pt_gemm_bf16_set_path(int path) {
    PT_ASSERT(pt_gemm_bf16_has_path(path));
    int old = g_path;
    g_path = path;
    return old;
}

static int path_now(void) {
    if (g_path != PT_BF16_AUTO) return g_path;
    if (pt_gemm_bf16_has_path(PT_BF16_AMX)) return PT_BF16_AMX;
    if (pt_gemm_bf16_has_path(PT_BF16_AVX512)) return PT_BF16_AVX512;
    return PT_BF16_FALLBACK;
}

const char *pt_gemm_bf16_kind(void) {
    switch (path_now()) {
    case PT_BF16_AMX:
        return "amx_bf16";
    case PT_BF16_AVX512:
        return "avx512_bf16";
    default:
        return "fallback (fp32 products on converted operands)";
    }
}

static _Thread_local unsigned char tl_scratch[PT_BF16_SCRATCH_BYTES] __attribute__((aligned(64)));

void *pt_bf16_scratch(void) {
    return tl_scratch;
}

/* ---- epilogue --------------------------------------------------------------
 * gemm.c's epilogue_row on a tile's rows: the same arithmetic (res + bias,
 * then the accumulated value), and the GELU of pt_gelu_forward, so that a
 * recompute of the activation gives the epilogue's bits. */

/* First K block: c = res + bias (set: C holds nothing yet), else
 * (res + bias) + c. Rows [0, h), columns [0, w) of the tile at (i0, j). */
static void tile_first(const pt_gemm_epilogue *e, float *c, long ldc, long i0, long j, int h, int w,
                       int set) {
    for (int r = 0; r < h; r++, c += ldc) {
        const float *b = e->bias ? e->bias + j : NULL;
        const float *s = e->res ? e->res + (i0 + r) * ldc + j : NULL;
        int x = 0;
        for (; x + PT_VW <= w; x += PT_VW) {
            pt_v8f t =
                b && s ? pt_v8_load(s + x) + pt_v8_load(b + x) : pt_v8_load(b ? b + x : s + x);
            pt_v8_store(c + x, set ? t : t + pt_v8_load(c + x));
        }
        for (; x < w; x++) {
            float t = b && s ? s[x] + b[x] : b ? b[x] : s[x];
            c[x] = set ? t : t + c[x];
        }
    }
}

/* Last K block, in kernels_impl.h's order: out16 = bf16(c), act =
 * gelu(c), act16 = bf16(gelu(bf16(c))), c = gelu'(pre) * c, c =
 * gelu'(pre16) * c. */
static void tile_last(const pt_gemm_epilogue *e, float *c, long ldc, long i0, long j, int h,
                      int w) {
    for (int r = 0; r < h; r++, c += ldc) {
        long off = (i0 + r) * ldc + j;
        if (e->out16) pt_row_store16(e->out16 + off, c, w);
        if (e->act) pt_gelu_forward(e->act + off, c, (size_t)w);
        if (e->act16) pt_epilogue16_act(e->act16 + off, c, w);
        if (e->pre) {
            const float *p = e->pre + off;
            int x = 0;
            for (; x + PT_VW <= w; x += PT_VW)
                pt_v8_store(c + x, pt_v8_gelu_grad(pt_v8_load(p + x)) * pt_v8_load(c + x));
            for (; x < w; x++) c[x] = pt_gelu_grad(p[x]) * c[x];
        }
        if (e->pre16) pt_epilogue16_pre(e->pre16 + off, c, w);
    }
}

#if PT_BF16_X86

/* ---- the driver ------------------------------------------------------------- */

/* Blocks: a B block of 768 x 384 bf16 (576 KiB) stays in L2 (1 MiB per
 * core here) beside the A tile (12 x 768 bf16, 18 KiB: L1) and the C
 * tiles. Measured (bench_bf16 --cpu, gpt2's six large shapes, share of
 * the vdpbf16ps ceiling): kc 768 x nc 384 85-90%; 512 x 384 82-89%;
 * 384 x 384 80-85% (C is loaded and stored once per K block); 768 x 256
 * 85-88%. */
enum { NR = PT_BF16_NR, KC_MAX = 768, NC_MAX = 384, MIN_TILES = 8 };
_Static_assert(KC_MAX % 32 == 0, "K blocks hold whole AMX tiles");

_Static_assert((long)KC_MAX *NC_MAX * sizeof(pt_bf16) <= (long)PT_BF16_SCRATCH_BYTES, "B block");

/* Each worker's packed A tile, and its rounded fp32 A tile (fixed size:
 * no kernel allocates). */
static _Thread_local pt_bf16 tl_a[PT_BF16_MR_MAX * KC_MAX] __attribute__((aligned(64)));
static _Thread_local pt_bf16 tl_a32[PT_BF16_MR_MAX * KC_MAX] __attribute__((aligned(64)));

/* Word indices interleaving two vectors x, y of 32 bf16 into pairs:
 * (x0, y0, x1, y1, ...): the low 16 pairs, then the high 16. */
static const uint16_t PAIR_LO[32]
    __attribute__((aligned(64))) = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
static const uint16_t PAIR_HI[32]
    __attribute__((aligned(64))) = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                    24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};

/* The columns' fp32 sums: cs[0..32) += the 32 bf16 of x (lanes past w
 * are zero and not stored). */
PT_TGT_AVX512 static inline void colsum_row(__m512 *c0, __m512 *c1, __m512i x) {
    __m512 lo = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(x)), 16));
    __m512 hi = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(x, 1)), 16));
    *c0 = _mm512_add_ps(*c0, lo);
    *c1 = _mm512_add_ps(*c1, hi);
}

/* A panel of B stored as is (K, N): rows 2p and 2p + 1 interleaved. */
PT_TGT_AVX512 static void pack_panel_n(pt_bf16 *restrict dst, const pt_bf16_gemm_ctx *g, int j0,
                                       int w, float *cs) {
    const pt_bf16 *src = g->B + (long)g->pc * g->ldb + g->jc + j0;
    __mmask32 m = w == NR ? ~(__mmask32)0 : (__mmask32)((1u << w) - 1);
    __mmask16 m0 = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
    __mmask16 m1 = (__mmask16)(w >= 32 ? 0xffff : w > 16 ? (1u << (w - 16)) - 1 : 0);
    __m512i lo_idx = _mm512_load_si512(PAIR_LO), hi_idx = _mm512_load_si512(PAIR_HI);
    __m512 c0 = _mm512_setzero_ps(), c1 = c0;
    if (cs) c0 = _mm512_maskz_loadu_ps(m0, cs), c1 = _mm512_maskz_loadu_ps(m1, cs + 16);
    int p = 0;
    for (; 2 * p < g->kc; p++, src += 2 * g->ldb, dst += 2 * NR) {
        __m512i x = _mm512_maskz_loadu_epi16(m, src), y = _mm512_setzero_si512();
        if (2 * p + 1 < g->kc) y = _mm512_maskz_loadu_epi16(m, src + g->ldb);
        _mm512_store_si512(dst, _mm512_permutex2var_epi16(x, lo_idx, y));
        _mm512_store_si512(dst + NR, _mm512_permutex2var_epi16(x, hi_idx, y));
        if (cs) {
            colsum_row(&c0, &c1, x); /* row 2p, then 2p + 1: rows in order */
            if (2 * p + 1 < g->kc) colsum_row(&c0, &c1, y);
        }
    }
    for (; 2 * p < g->kcp; p++, dst += 2 * NR) {
        _mm512_store_si512(dst, _mm512_setzero_si512());
        _mm512_store_si512(dst + NR, _mm512_setzero_si512());
    }
    if (cs) _mm512_mask_storeu_ps(cs, m0, c0), _mm512_mask_storeu_ps(cs + 16, m1, c1);
}

/* 16 rows of 16 dwords (row i at src + i * lds bf16) transposed: dst row x
 * (stride ldd dwords) holds dword x of every source row. */
PT_TGT_AVX512 static void transpose16_dw(uint32_t *dst, long ldd, const pt_bf16 *src, long lds) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int k = 0; k < 2; k++) {
            r[i + 2 * k] = _mm512_unpacklo_epi64(t[i + k], t[i + k + 2]);
            r[i + 2 * k + 1] = _mm512_unpackhi_epi64(t[i + k], t[i + k + 2]);
        }
    for (int i = 0; i < 16; i += 8)
        for (int k = 0; k < 4; k++) {
            t[i + k] = _mm512_shuffle_i32x4(r[i + k], r[i + k + 4], 0x88);
            t[i + k + 4] = _mm512_shuffle_i32x4(r[i + k], r[i + k + 4], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_i32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_i32x4(t[k], t[k + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_si512(dst + i * ldd, r[i]);
}

/* A panel of B stored transposed (N, K): a K pair is already 4 adjacent
 * bytes of B's row j, so the panel is a transpose of dwords. */
PT_TGT_AVX512 static void pack_panel_t(pt_bf16 *restrict dst, const pt_bf16_gemm_ctx *g, int j0,
                                       int w) {
    const pt_bf16 *src = g->B + (long)(g->jc + j0) * g->ldb + g->pc;
    int p16 = w == NR ? g->kc / 32 * 16 : 0; /* whole pairs, in runs of 16 */
    for (int p = 0; p < p16; p += 16)
        for (int j = 0; j < NR; j += 16)
            transpose16_dw((uint32_t *)dst + (long)p * NR + j, NR, src + (long)j * g->ldb + 2 * p,
                           g->ldb);
    for (int p = p16; 2 * p < g->kcp; p++)
        for (int j = 0; j < NR; j++) {
            const pt_bf16 *s = src + (long)j * g->ldb + 2 * p;
            pt_bf16 *d = dst + ((long)p * NR + j) * 2;
            d[0] = j < w && 2 * p < g->kc ? s[0] : 0;
            d[1] = j < w && 2 * p + 1 < g->kc ? s[1] : 0;
        }
}

/* w <= 32 floats at src, rounded to bf16 (lanes past w zero) in one
 * vector. */
PT_TGT_AVX512BF16 static inline __m512i row32_f32(const float *src, int w) {
    __mmask16 m0 = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
    __mmask16 m1 = (__mmask16)(w >= 32 ? 0xffff : w > 16 ? (1u << (w - 16)) - 1 : 0);
    __m256i lo = pt_bf16_cvt_avx512bf16(_mm512_maskz_loadu_epi32(m0, src));
    __m256i hi = pt_bf16_cvt_avx512bf16(_mm512_maskz_loadu_epi32(m1, src + 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* pack_panel_n of an fp32 B (K, N), rounded as it is packed; the column
 * sums add the rounded values (pack_panel_n's on the rounded B). */
PT_TGT_AVX512BF16 static void pack_panel_n_f32(pt_bf16 *restrict dst, const pt_bf16_gemm_ctx *g,
                                               int j0, int w, float *cs) {
    const float *src = g->Bf + (long)g->pc * g->ldb + g->jc + j0;
    __mmask16 m0 = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
    __mmask16 m1 = (__mmask16)(w >= 32 ? 0xffff : w > 16 ? (1u << (w - 16)) - 1 : 0);
    __m512i lo_idx = _mm512_load_si512(PAIR_LO), hi_idx = _mm512_load_si512(PAIR_HI);
    __m512 c0 = _mm512_setzero_ps(), c1 = c0;
    if (cs) c0 = _mm512_maskz_loadu_ps(m0, cs), c1 = _mm512_maskz_loadu_ps(m1, cs + 16);
    int p = 0;
    for (; 2 * p < g->kc; p++, src += 2 * g->ldb, dst += 2 * NR) {
        __m512i x = row32_f32(src, w), y = _mm512_setzero_si512();
        if (2 * p + 1 < g->kc) y = row32_f32(src + g->ldb, w);
        _mm512_store_si512(dst, _mm512_permutex2var_epi16(x, lo_idx, y));
        _mm512_store_si512(dst + NR, _mm512_permutex2var_epi16(x, hi_idx, y));
        if (cs) {
            colsum_row(&c0, &c1, x);
            if (2 * p + 1 < g->kc) colsum_row(&c0, &c1, y);
        }
    }
    for (; 2 * p < g->kcp; p++, dst += 2 * NR) {
        _mm512_store_si512(dst, _mm512_setzero_si512());
        _mm512_store_si512(dst + NR, _mm512_setzero_si512());
    }
    if (cs) _mm512_mask_storeu_ps(cs, m0, c0), _mm512_mask_storeu_ps(cs + 16, m1, c1);
}

/* pack_panel_t of an fp32 B (N, K): element by element (no caller on the
 * training path). */
static void pack_panel_t_f32(pt_bf16 *restrict dst, const pt_bf16_gemm_ctx *g, int j0, int w) {
    const float *src = g->Bf + (long)(g->jc + j0) * g->ldb + g->pc;
    for (int p = 0; 2 * p < g->kcp; p++)
        for (int j = 0; j < NR; j++) {
            const float *s = src + (long)j * g->ldb + 2 * p;
            pt_bf16 *d = dst + ((long)p * NR + j) * 2;
            d[0] = j < w && 2 * p < g->kc ? pt_bf16_of(s[0]) : 0;
            d[1] = j < w && 2 * p + 1 < g->kc ? pt_bf16_of(s[1]) : 0;
        }
}

/* Panels [plo, phi) of B's block [pc, pc + kc) x [jc, jc + nc) into g->bp. */
static void pack_panels(const pt_bf16_gemm_ctx *g, long plo, long phi) {
    float *colsum = g->e ? g->e->colsum : NULL;
    for (int j0 = (int)plo * NR; j0 < phi * NR; j0 += NR) {
        int w = g->nc - j0 < NR ? g->nc - j0 : NR;
        pt_bf16 *dst = g->bp + (long)j0 * g->kcp;
        float *cs = colsum ? colsum + g->jc + j0 : NULL;
        if (g->Bf && g->tb)
            pack_panel_t_f32(dst, g, j0, w);
        else if (g->Bf)
            pack_panel_n_f32(dst, g, j0, w, cs);
        else if (g->tb)
            pack_panel_t(dst, g, j0, w);
        else
            pack_panel_n(dst, g, j0, w, cs);
    }
}

/* The block's panels split over the pool: each worker owns whole panels,
 * hence whole columns of colsum. */
static void pack_b_part(void *p, int index, int count) {
    const pt_bf16_gemm_ctx *g = p;
    long lo, hi;
    pt_split_range((g->nc + NR - 1) / NR, index, count, &lo, &hi);
    pack_panels(g, lo, hi);
}

/* ---- the AVX512_BF16 micro-kernel ----------------------------------------- */

enum { MR = 12, PF_B = 4, PF_C = 12 };
_Static_assert((int)MR <= (int)PT_BF16_MR_MAX, "tile rows");

/* c[12][32] (row stride ldc) = (acc ? c : 0) + A[12][kc] x the panel, with
 * the pair (A[r][2p], A[r][2p+1]) the 4 bytes at a + r * rs + p * ks
 * (elements). An odd kc's last k is read as one bf16 (its pair's second
 * half may not exist); the panel's matching half is zero. Inlined into its
 * two callers, which fix the strides. */
PT_TGT_AVX512BF16 static inline __attribute__((always_inline)) void
kernel_tile(int kc, const pt_bf16 *restrict a, long rs, long ks, const pt_bf16 *restrict bp,
            float *restrict c, long ldc, int acc) {
    /* rows through 4 pointers of 3 rows each (at 0, rs, 2 rs): left to
     * itself GCC keeps 12 row addresses, spills some and reloads them in
     * the loop; the empty asm hides how the pointers relate */
    const pt_bf16 *ar[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        ar[q] = a + 3 * q * rs;
        __asm__("" : "+r"(ar[q]));
    }
    __m512 cv[MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++) cv[r][0] = cv[r][1] = _mm512_setzero_ps();
    int np = kc / 2;
    for (int p = 0; p < np; p++) {
        /* C's lines are needed after the loop: fetch them a little
         * before, and the panel a few pairs ahead (two lines a pair) */
        if (p == np - PF_C)
#pragma GCC unroll 12
            for (int r = 0; r < MR; r++) {
                _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
                _mm_prefetch((const char *)(c + r * ldc + 16), _MM_HINT_T0);
            }
        _mm_prefetch((const char *)(bp + PF_B * 2 * NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(bp + PF_B * 2 * NR + NR), _MM_HINT_T0);
        __m512bh b0 = (__m512bh)_mm512_load_si512(bp), b1 = (__m512bh)_mm512_load_si512(bp + NR);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            uint32_t w;
            memcpy(&w, ar[r / 3] + r % 3 * rs, sizeof w);
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)w);
            cv[r][0] = _mm512_dpbf16_ps(cv[r][0], av, b0);
            cv[r][1] = _mm512_dpbf16_ps(cv[r][1], av, b1);
        }
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) ar[q] += ks;
        bp += 2 * NR;
    }
    if (kc & 1) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(bp), b1 = (__m512bh)_mm512_load_si512(bp + NR);
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ar[r / 3][r % 3 * rs]);
            cv[r][0] = _mm512_dpbf16_ps(cv[r][0], av, b0);
            cv[r][1] = _mm512_dpbf16_ps(cv[r][1], av, b1);
        }
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

/* A packed (lda 0): pair p of row r at dword p * 12 + r; else A's rows in
 * place, row stride lda. */
PT_TGT_AVX512BF16 static void tile_avx512(int kc, const pt_bf16 *a, long lda, const pt_bf16 *bp,
                                          float *c, long ldc, int acc) {
    if (lda)
        kernel_tile(kc, a, lda, 2, bp, c, ldc, acc);
    else
        kernel_tile(kc, a, 2, 2 * MR, bp, c, ldc, acc);
}

/* op(A)[i0 .. i0+h, pc .. pc+kc] as pairs, pair-major: dword p * 12 + r. */
PT_TGT_AVX512 static void pack_a_avx512(pt_bf16 *ap, const pt_bf16_gemm_ctx *g, int i0, int h) {
    int np = (g->kc + 1) / 2;
    if (g->ta) {
        /* A stored (K, M): rows 2p and 2p + 1 of A's storage, h columns
         * each, interleaved into h pairs */
        __m512i lo_idx = _mm512_load_si512(PAIR_LO);
        __mmask16 m = (__mmask16)((1u << h) - 1);
        const pt_bf16 *src = g->A + (long)g->pc * g->lda + i0;
        for (int p = 0; p < np; p++, src += 2 * g->lda, ap += 2 * MR) {
            __m512i x = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(m, src));
            __m512i y = _mm512_setzero_si512();
            if (2 * p + 1 < g->kc)
                y = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(m, src + g->lda));
            _mm512_mask_storeu_epi32(ap, (1u << MR) - 1, _mm512_permutex2var_epi16(x, lo_idx, y));
        }
        return;
    }
    /* a partial tile of A stored as is: rows past h are zero */
    for (int r = 0; r < MR; r++) {
        const pt_bf16 *src = g->A + (long)(i0 + r) * g->lda + g->pc;
        for (int p = 0; p < np; p++) {
            pt_bf16 *d = ap + ((long)p * MR + r) * 2;
            d[0] = r < h ? src[2 * p] : 0;
            d[1] = r < h && 2 * p + 1 < g->kc ? src[2 * p + 1] : 0;
        }
    }
}

static const pt_bf16_ukernel ukernel_avx512 = {
    .name = "avx512_bf16",
    .mr = MR,
    .kalign = 2,
    .direct_k = 1,
    .pack_a = pack_a_avx512,
    .tile = tile_avx512,
};

/* ---- the loop nest ---------------------------------------------------------- */

/* op(A)[i0 .. i0+h, pc .. pc+kc] of an fp32 A, rounded, row-major with row
 * stride kcp and zeros from kc to kcp: every micro-kernel reads that in
 * place (AMX's loads a whole 32-deep step, hence the zeros); rows past h
 * are left as they are (their results are dropped). */
static void round_a_tile(pt_bf16 *restrict d, const pt_bf16_gemm_ctx *g, int i0, int h) {
    for (int r = 0; r < h; r++, d += g->kcp) {
        if (!g->ta) {
            pt_bf16_from_f32_serial(d, g->Af + (long)(i0 + r) * g->lda + g->pc, (size_t)g->kc);
        } else {
            for (int k = 0; k < g->kc; k++)
                d[k] = pt_bf16_of(g->Af[(long)(g->pc + k) * g->lda + i0 + r]);
        }
        for (int k = g->kc; k < g->kcp; k++) d[k] = 0;
    }
}

/* Tiles [lo, hi) of A times panels [plo, phi) of the B block: each C
 * tile's sum is the same whichever worker takes it. */
static void compute_block(const pt_bf16_gemm_ctx *g, long lo, long hi, long plo, long phi) {
    const pt_bf16_ukernel *uk = g->uk;
    const pt_gemm_epilogue *e = g->e;
    int mr = uk->mr;
    /* res + bias go in before the product (the tile may alias res), the
     * activation after the last K block */
    int pro = g->first && e && (e->bias || e->res), epi = g->last && pt_gemm_epilogue_last(e);
    int acc = g->acc || pro;
    float edge[PT_BF16_MR_MAX * NR] __attribute__((aligned(64)));
    for (long t = lo; t < hi; t++) {
        int i0 = (int)(t * mr), h = g->M - i0 < mr ? g->M - i0 : mr;
        const pt_bf16 *a;
        long la;
        if (g->Af) { /* rounded into a row-major tile, read in place */
            round_a_tile(tl_a32, g, i0, h);
            a = tl_a32, la = g->kcp;
        } else {
            int direct = !g->ta && h == mr && g->kc % uk->direct_k == 0;
            if (!direct) uk->pack_a(tl_a, g, i0, h);
            a = direct ? g->A + (long)i0 * g->lda + g->pc : tl_a;
            la = direct ? g->lda : 0;
        }
        for (int j0 = (int)plo * NR; j0 < phi * NR; j0 += NR) {
            float *c = g->C + (long)i0 * g->ldc + g->jc + j0;
            const pt_bf16 *bp = g->bp + (long)j0 * g->kcp;
            int w = g->nc - j0 < NR ? g->nc - j0 : NR;
            if (pro) tile_first(e, c, g->ldc, i0, g->jc + j0, h, w, !g->acc);
            if (h == mr && w == NR) {
                uk->tile(g->kc, a, la, bp, c, g->ldc, acc);
            } else {
                uk->tile(g->kc, a, la, bp, edge, NR, 0);
                for (int r = 0; r < h; r++)
                    for (int j = 0; j < w; j++)
                        c[r * g->ldc + j] = (acc ? c[r * g->ldc + j] : 0.0f) + edge[r * NR + j];
            }
            if (epi) tile_last(e, c, g->ldc, i0, g->jc + j0, h, w);
        }
    }
}

/* The block split over the pool by tiles of A, or by panels when there
 * are fewer than 8 tiles. */
static void compute_part(void *p, int index, int count) {
    const pt_bf16_gemm_ctx *g = p;
    long tiles = (g->M + g->uk->mr - 1) / g->uk->mr, panels = (g->nc + NR - 1) / NR, lo = 0,
         hi = tiles, plo = 0, phi = panels;
    if (tiles < MIN_TILES)
        pt_split_range(panels, index, count, &plo, &phi);
    else
        pt_split_range(tiles, index, count, &lo, &hi);
    if (lo >= hi || plo >= phi) return;
    if (g->uk->begin) g->uk->begin();
    compute_block(g, lo, hi, plo, phi);
    if (g->uk->end) g->uk->end();
}

static int block_size(int n, int max, int unit);

/* g's K block at pc: its size, packed size and epilogue flags. */
static void set_k_block(pt_bf16_gemm_ctx *g, int pc, int K) {
    g->pc = pc;
    g->kc = K - pc < g->kcb ? K - pc : g->kcb;
    g->kcp = (g->kc + g->uk->kalign - 1) / g->uk->kalign * g->uk->kalign;
    g->acc = pc > 0 || g->beta1;
    g->first = pc == 0;
    g->last = pc + g->kc == K;
}

/* The whole product on worker index's own columns (whole panels of N):
 * every K block in turn, its columns in N blocks packed into its own
 * scratch, all of A's tiles against them. One pool run for the product
 * instead of two per block: at 2 threads on the shared development host
 * the barriers between packing and computing cost 256-row products a
 * third of their time. The same sums as the other split. */
static void columns_part(void *p, int index, int count) {
    pt_bf16_gemm_ctx g = *(const pt_bf16_gemm_ctx *)p;
    long lo, hi, tiles = (g.M + g.uk->mr - 1) / g.uk->mr;
    pt_split_range((g.N + NR - 1) / NR, index, count, &lo, &hi);
    int j_end = hi * NR < g.N ? (int)hi * NR : g.N;
    if (lo >= hi) return;
    g.bp = pt_bf16_scratch();
    int ncb = block_size(j_end - (int)lo * NR, NC_MAX, NR);
    if (g.uk->begin) g.uk->begin();
    for (int pc = 0; pc < g.K; pc += g.kcb) {
        set_k_block(&g, pc, g.K);
        for (g.jc = (int)lo * NR; g.jc < j_end; g.jc += ncb) {
            g.nc = j_end - g.jc < ncb ? j_end - g.jc : ncb;
            long panels = (g.nc + NR - 1) / NR;
            pack_panels(&g, 0, panels);
            compute_block(&g, 0, tiles, 0, panels);
        }
    }
    if (g.uk->end) g.uk->end();
}

/* Split n into the fewest blocks of at most max, rounded up to a multiple of
 * unit (max is one): balanced blocks instead of a full one and a sliver. */
static int block_size(int n, int max, int unit) {
    int nb = (n + max - 1) / max;
    int b = (n + nb - 1) / nb;
    return (b + unit - 1) / unit * unit;
}

/* serial: on this thread only (pt_gemm_bf16x_serial). */
static void gemm_own(const pt_bf16_ukernel *uk, int ta, int tb, int M, int N, int K, const void *A,
                     int a_f32, int lda, const void *B, int b_f32, int ldb, float beta, float *C,
                     int ldc, const pt_gemm_epilogue *e, int serial) {
    pt_bf16_gemm_ctx g = {.ta = ta,
                          .tb = tb,
                          .A = a_f32 ? NULL : A,
                          .B = b_f32 ? NULL : B,
                          .Af = a_f32 ? A : NULL,
                          .Bf = b_f32 ? B : NULL,
                          .lda = lda,
                          .ldb = ldb,
                          .ldc = ldc,
                          .C = C,
                          .bp = pt_bf16_scratch(),
                          .e = e,
                          .uk = uk,
                          .M = M,
                          .N = N,
                          .K = K,
                          .beta1 = beta != 0.0f};
    g.kcb = block_size(K, KC_MAX, uk->kalign);
    long tiles = (M + uk->mr - 1) / uk->mr, panels = (N + NR - 1) / NR;
    /* as gemm.c: few tiles split the panels; under a million multiply-adds
     * the product stays on one thread (a pool run costs microseconds) */
    int workers =
        !serial && (tiles >= MIN_TILES || (long)M * N * K >= 1L << 20) ? pt_kernels_threads() : 1;
    /* Columns per worker where they split fairly (the busiest worker has
     * at most 1/8 more panels than the average); otherwise each block is
     * packed, then computed, by all workers. */
    long most = (panels + workers - 1) / workers;
    if (workers == 1 || (tiles >= MIN_TILES && 8 * most * workers <= 9 * panels)) {
        pt_pool_run(columns_part, &g, workers);
        return;
    }
    int ncb = block_size(N, NC_MAX, NR);
    for (int pc = 0; pc < K; pc += g.kcb) {
        set_k_block(&g, pc, K);
        for (int jc = 0; jc < N; jc += ncb) {
            g.jc = jc;
            g.nc = N - jc < ncb ? N - jc : ncb;
            pt_pool_run(pack_b_part, &g, workers);
            pt_pool_run(compute_part, &g, workers);
        }
    }
}
#endif /* PT_BF16_X86 */

static const pt_bf16_ukernel *own_kernel(int path) {
#if PT_BF16_X86
#if PT_BF16_AMX_BUILD
    if (path == PT_BF16_AMX) return &pt_bf16_ukernel_amx;
#endif
    if (path != PT_BF16_FALLBACK) return &ukernel_avx512;
#endif
    (void)path;
    return NULL;
}

void pt_gemm_bf16x(int ta, int tb, int M, int N, int K, const void *A, int a_f32, int lda,
                   const void *B, int b_f32, int ldb, float beta, float *C, int ldc,
                   const pt_gemm_epilogue *e) {
    PT_ASSERT(!(e && e->colsum && tb)); /* column sums of a B stored as is only */
    if (M <= 0 || N <= 0) return;
    const pt_bf16_ukernel *uk = own_kernel(path_now());
#if PT_BF16_X86
    if (K > 0 && uk) {
        gemm_own(uk, ta, tb, M, N, K, A, a_f32, lda, B, b_f32, ldb, beta, C, ldc, e, 0);
        return;
    }
#endif
    (void)uk;
    pt_gemm_bf16_fallback(ta, tb, M, N, K, A, a_f32, lda, B, b_f32, ldb, beta, C, ldc, e);
}

int pt_gemm_bf16_serial_ok(void) {
    return own_kernel(path_now()) != NULL;
}

void pt_gemm_bf16x_serial(int ta, int tb, int M, int N, int K, const void *A, int a_f32, int lda,
                          const void *B, int b_f32, int ldb, float beta, float *C, int ldc,
                          const pt_gemm_epilogue *e) {
    PT_ASSERT(!(e && e->colsum && tb));
    const pt_bf16_ukernel *uk = own_kernel(path_now());
    PT_ASSERT(uk && K > 0); /* pt_gemm_bf16_serial_ok */
    if (M <= 0 || N <= 0) return;
#if PT_BF16_X86
    gemm_own(uk, ta, tb, M, N, K, A, a_f32, lda, B, b_f32, ldb, beta, C, ldc, e, 1);
#endif
}

void pt_gemm_bf16(int ta, int tb, int M, int N, int K, const pt_bf16 *A, int lda, const pt_bf16 *B,
                  int ldb, float beta, float *C, int ldc, const pt_gemm_epilogue *e) {
    pt_gemm_bf16x(ta, tb, M, N, K, A, 0, lda, B, 0, ldb, beta, C, ldc, e);
}
