/* bf16 <-> fp32 conversions, and what the CPU has for bf16 work.
 *
 * One rounding, several codes (docs/architecture.md, "bf16"): the scalar
 * loop; AVX2 and AVX-512 integer rounding (add 0x7fff plus the lowest kept
 * bit, shift, NaNs made quiet: reference_bf16.c says why that is round to
 * nearest even); and AVX512_BF16's vcvtneps2bf16. That instruction rounds
 * the same way but flushes float32 subnormal inputs to a signed zero (Intel
 * SDM; seen on Zen 5 here), so lanes holding a subnormal are redone with the
 * integer rounding: a mask test per 16 floats, a branch never taken on
 * training data. Every code gives the reference's bits (tested on special
 * values and random bit patterns), so results do not depend on the CPU.
 *
 * Each code is compiled with a target attribute and chosen at run time from
 * CPUID: a build without -march=native carries them all.
 *
 * Not here: the matrix products (gemm_bf16*.c). */
#include <pthread.h>
#include <string.h>

#include "bf16_impl.h"

#if PT_BF16_X86
#include <cpuid.h>
#include <immintrin.h>
#endif

/* ---- the CPU ------------------------------------------------------------ */

static pt_bf16_cpu g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

#if PT_BF16_X86
static uint64_t xcr0(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* no OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static void detect(void) {
#if PT_BF16_X86
    /* __builtin_cpu_supports checks XCR0 for the vector registers too */
    __builtin_cpu_init();
    g_cpu.avx2 = __builtin_cpu_supports("avx2") != 0;
    g_cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        unsigned max_sub = a;
        /* AMX-BF16 is EDX bit 22, AMX-TILE bit 24; the OS must save the
         * tile configuration and data (XCR0 bits 17 and 18) */
        int amx = (d >> 22 & 1) && (d >> 24 & 1);
        g_cpu.amx = amx && g_cpu.avx512 && (xcr0() & (3ull << 17)) == (3ull << 17);
        /* AVX512_BF16: leaf 7 sub-leaf 1, EAX bit 5 */
        if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
            g_cpu.avx512bf16 = g_cpu.avx512 && (a >> 5 & 1);
    }
    if (!g_cpu.avx512bf16) g_cpu.amx = 0; /* the AMX path packs with AVX512_BF16 code */
#endif
}

const pt_bf16_cpu *pt_bf16_cpu_get(void) {
    pthread_once(&g_cpu_once, detect);
    return &g_cpu;
}

/* ---- the conversion codes ---------------------------------------------- */

static inline pt_bf16 round1(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (pt_bf16)((u >> 16) | 0x40u);
    return (pt_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void from_scalar(pt_bf16 *d, const float *s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = round1(s[i]);
}

static void to_scalar(float *d, const pt_bf16 *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(d + i, &u, sizeof u);
    }
}

#if PT_BF16_X86
PT_TGT_AVX2 static inline __m256i round_avx2(__m256i x) {
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

PT_TGT_AVX2 static void from_avx2(pt_bf16 *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r0 = round_avx2(_mm256_loadu_si256((const __m256i *)(s + i)));
        __m256i r1 = round_avx2(_mm256_loadu_si256((const __m256i *)(s + i + 8)));
        /* packus works per 128-bit lane: (r0 lo, r1 lo, r0 hi, r1 hi) */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8);
        _mm256_storeu_si256((__m256i *)(d + i), p);
    }
    for (; i < n; i++) d[i] = round1(s[i]);
}

PT_TGT_AVX2 static void to_avx2(float *d, const pt_bf16 *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(x, 16));
    }
    to_scalar(d + i, s + i, n - i);
}

PT_TGT_AVX512 static void from_avx512(pt_bf16 *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i),
                            _mm512_cvtepi32_epi16(pt_bf16_round_avx512(_mm512_loadu_si512(s + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_cvtepi32_storeu_epi16(d + i, m,
                                          pt_bf16_round_avx512(_mm512_maskz_loadu_epi32(m, s + i)));
    }
}

PT_TGT_AVX512 static void to_avx512(float *d, const pt_bf16 *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i)));
        _mm512_storeu_si512(d + i, _mm512_slli_epi32(x, 16));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512i x = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
        _mm512_mask_storeu_epi32(d + i, m, _mm512_slli_epi32(x, 16));
    }
}

PT_TGT_AVX512BF16 static void from_avx512bf16(pt_bf16 *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i), pt_bf16_cvt_avx512bf16(_mm512_loadu_si512(s + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(d + i, m,
                                 pt_bf16_cvt_avx512bf16(_mm512_maskz_loadu_epi32(m, s + i)));
    }
}
#endif

/* ---- dispatch ----------------------------------------------------------- */

typedef struct {
    void (*from)(pt_bf16 *, const float *, size_t);
    void (*to)(float *, const pt_bf16 *, size_t);
} cvt_code;

static cvt_code code_of(int path) {
    switch (path) {
#if PT_BF16_X86
    case PT_BF16_CVT_AVX2:
        return (cvt_code){from_avx2, to_avx2};
    case PT_BF16_CVT_AVX512:
        return (cvt_code){from_avx512, to_avx512};
    case PT_BF16_CVT_AVX512BF16:
        return (cvt_code){from_avx512bf16, to_avx512};
#endif
    default:
        return (cvt_code){from_scalar, to_scalar};
    }
}

int pt_bf16_cvt_has_path(int path) {
    const pt_bf16_cpu *c = pt_bf16_cpu_get();
    switch (path) {
    case PT_BF16_CVT_AUTO:
    case PT_BF16_CVT_SCALAR:
        return 1;
    case PT_BF16_CVT_AVX2:
        return c->avx2;
    case PT_BF16_CVT_AVX512:
        return c->avx512;
    case PT_BF16_CVT_AVX512BF16:
        return c->avx512bf16;
    default:
        return 0;
    }
}

static int g_cvt_path = PT_BF16_CVT_AUTO;

int pt_bf16_cvt_set_path(int path) {
    PT_ASSERT(pt_bf16_cvt_has_path(path));
    int old = g_cvt_path;
    g_cvt_path = path;
    return old;
}

static cvt_code cvt(void) {
    int p = g_cvt_path;
    if (p == PT_BF16_CVT_AUTO) {
        const pt_bf16_cpu *c = pt_bf16_cpu_get();
        p = c->avx512bf16 ? PT_BF16_CVT_AVX512BF16
            : c->avx512   ? PT_BF16_CVT_AVX512
            : c->avx2     ? PT_BF16_CVT_AVX2
                          : PT_BF16_CVT_SCALAR;
    }
    return code_of(p);
}

void pt_bf16_from_f32_serial(pt_bf16 *dst, const float *src, size_t n) {
    cvt().from(dst, src, n);
}

void pt_bf16_to_f32_serial(float *dst, const pt_bf16 *src, size_t n) {
    cvt().to(dst, src, n);
}

/* Large arrays split over the pool in runs of whole cache lines of the
 * float side: elementwise, so any split gives the same bits. */
typedef struct {
    cvt_code c;
    void *dst;
    const void *src;
    size_t n;
    int to;
} cvt_ctx;

static void cvt_part(void *p, int index, int count) {
    const cvt_ctx *x = p;
    long lo, hi;
    pt_split_range((long)((x->n + 15) / 16), index, count, &lo, &hi);
    size_t a = (size_t)lo * 16, b = (size_t)hi * 16 < x->n ? (size_t)hi * 16 : x->n;
    if (a >= b) return;
    if (x->to)
        x->c.to((float *)x->dst + a, (const pt_bf16 *)x->src + a, b - a);
    else
        x->c.from((pt_bf16 *)x->dst + a, (const float *)x->src + a, b - a);
}

static void convert(void *dst, const void *src, size_t n, int to) {
    cvt_ctx x = {.c = cvt(), .dst = dst, .src = src, .n = n, .to = to};
    /* below this a pool run costs more than the loop (microseconds) */
    pt_pool_run(cvt_part, &x, n < (1u << 16) ? 1 : pt_kernels_threads());
}

void pt_bf16_from_f32(pt_bf16 *dst, const float *src, size_t n) {
    convert(dst, src, n, 0);
}

void pt_bf16_to_f32(float *dst, const pt_bf16 *src, size_t n) {
    convert(dst, src, n, 1);
}
