/* Private to the bf16 kernels (bf16.c, gemm_bf16.c, gemm_bf16_amx.c,
 * gemm_bf16_fallback.c): what the CPU has, the target attributes that let
 * a build without -march=native carry AVX2, AVX-512, AVX512_BF16 and AMX
 * code (chosen at run time, never assumed), the conversion loops the GEMM
 * paths share, and the table of micro-kernels the own GEMM driver runs.
 *
 * Not here: anything public (partrain/kernels.h, kernels_impl.h). */
#ifndef PARTRAIN_KERNELS_BF16_IMPL_H
#define PARTRAIN_KERNELS_BF16_IMPL_H

#include "kernels_impl.h"

#if defined(__x86_64__)
#define PT_BF16_X86       1
#define PT_TGT_AVX2       __attribute__((target("avx2")))
#define PT_TGT_AVX512     __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define PT_TGT_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define PT_TGT_AMX                                                                                 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
#else
#define PT_BF16_X86 0
#endif
/* AMX's intrinsics need GCC 11 or clang 12: an older compiler builds
 * everything else, and the AMX path is then never offered. */
#if PT_BF16_X86 && ((defined(__clang__) && __clang_major__ >= 12) ||                               \
                    (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define PT_BF16_AMX_BUILD 1
#else
#define PT_BF16_AMX_BUILD 0
#endif

/* ---- the CPU (bf16.c) ---------------------------------------------------
 * Each flag is 1 when the CPU has the instructions and the OS saves their
 * registers (XCR0): avx512 means F+BW+VL+DQ. amx: AMX-TILE and AMX-BF16 in
 * CPUID and tile state in XCR0; Linux still has to grant the process the
 * tile data (gemm_bf16_amx.c asks). Detected once, thread-safe. */
typedef struct {
    int avx2, avx512, avx512bf16, amx;
} pt_bf16_cpu;
const pt_bf16_cpu *pt_bf16_cpu_get(void);

#if PT_BF16_X86
#include <immintrin.h>

/* 16 floats' bits rounded to bf16 (in the low half of each lane), the
 * reference's rounding on integers (bf16.c says why). */
PT_TGT_AVX512 static inline __m512i pt_bf16_round_avx512(__m512i x) {
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
}

/* 16 floats rounded to 16 bf16 with vcvtneps2bf16, with the lanes that hold a float32 subnormal
 * (exponent bits 0, mantissa not 0) redone by the integer rounding. */
PT_TGT_AVX512BF16 static inline __m256i pt_bf16_cvt_avx512bf16(__m512i x) {
    __m256i r = (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(x));
    __mmask16 sub = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7f800000)) &
                    _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x007fffff));
    if (__builtin_expect(sub != 0, 0))
        r = _mm256_mask_mov_epi16(r, sub, _mm512_cvtepi32_epi16(pt_bf16_round_avx512(x)));
    return r;
}

#endif

/* The conversion loops of the path pt_bf16_from_f32 / pt_bf16_to_f32 run,
 * on one thread (for callers already inside a pool job). */
void pt_bf16_from_f32_serial(pt_bf16 *dst, const float *src, size_t n);
void pt_bf16_to_f32_serial(float *dst, const pt_bf16 *src, size_t n);

/* ---- the own GEMM's driver and micro-kernels (gemm_bf16.c) ---------------
 * B is packed in 32-column panels of K pairs, the layout vdpbf16ps and
 * TDPBF16PS both read ("VNNI"): row p of a panel holds, for its 32 columns
 * j, the pair (B[2p][j], B[2p+1][j]) as 64 bf16 (128 bytes), zero past K
 * and past N. A micro-kernel multiplies an mr-row tile of A by one panel. */
enum { PT_BF16_NR = 32, PT_BF16_MR_MAX = 32 };

typedef struct pt_bf16_ukernel pt_bf16_ukernel;
typedef struct {
    int ta, tb;
    const pt_bf16 *A, *B;
    const float *Af, *Bf; /* an fp32 operand instead (A or Af, B or Bf), rounded as it is packed */
    long lda, ldb, ldc;
    float *C;
    pt_bf16 *bp; /* the packed B block */
    const pt_gemm_epilogue *e;
    const pt_bf16_ukernel *uk;
    int M, N, K, beta1;                        /* beta1: beta is 1 (C accumulates) */
    int kcb;                                   /* K block size (the last may be smaller) */
    int pc, kc, kcp, jc, nc, acc, first, last; /* kcp: kc rounded up to uk->kalign */
} pt_bf16_gemm_ctx;

struct pt_bf16_ukernel {
    const char *name;
    int mr;       /* rows of a C tile, <= PT_BF16_MR_MAX */
    int kalign;   /* packed K blocks are multiples of this (2: pairs) */
    int direct_k; /* A not transposed and a full tile is read in place when
                     kc is a multiple of this (1: always) */
    /* op(A) rows [i0, i0 + h) x columns [pc, pc + kc) into ap in the
     * micro-kernel's layout, zero up to mr rows and kcp columns. */
    void (*pack_a)(pt_bf16 *ap, const pt_bf16_gemm_ctx *g, int i0, int h);
    /* c (mr x 32, row stride ldc) = (acc ? c : 0) + A tile x B panel bp
     * (kcp / 2 pair rows). a: the packed tile (lda 0) or A's row i0,
     * column pc in place (lda its row stride). */
    void (*tile)(int kc, const pt_bf16 *a, long lda, const pt_bf16 *bp, float *c, long ldc,
                 int acc);
    /* Around a worker's tiles (AMX: load and release the tile
     * configuration); NULL: nothing. */
    void (*begin)(void);
    void (*end)(void);
};

/* The calling thread's scratch block (gemm_bf16.c), 64-byte aligned: the
 * own paths' packed B block (each worker's own when it takes whole
 * columns). Fixed size: no kernel allocates. */
enum { PT_BF16_SCRATCH_BYTES = 768 * 384 * 2 };
void *pt_bf16_scratch(void);

/* AMX (gemm_bf16_amx.c): the micro-kernel (where PT_BF16_AMX_BUILD), and
 * whether Linux lets this process use the tiles (asks once; 0 where the
 * CPU has no AMX or the build has no AMX path). */
#if PT_BF16_AMX_BUILD
extern const pt_bf16_ukernel pt_bf16_ukernel_amx;
#endif
int pt_bf16_amx_permitted(void);

/* The fallback (gemm_bf16_fallback.c): pt_gemm_bf16x's contract on any CPU. */
void pt_gemm_bf16_fallback(int ta, int tb, int M, int N, int K, const void *A, int a_f32, int lda,
                           const void *B, int b_f32, int ldb, float beta, float *C, int ldc,
                           const pt_gemm_epilogue *e);
/* Tests: use at most this many floats of the fallback's chunk buffer
 * (clamped to [16384, 4 Mi / 4]), so that small products take several
 * chunks in every dimension; returns the old limit. */
long pt_gemm_bf16_fallback_set_chunk(long floats);

#endif
