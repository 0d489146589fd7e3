/* Vectorizable float exp for the kernels' hot loops (GELU, softmax). Plain
 * arithmetic and integer bit moves only, so GCC turns loops that call it into
 * SIMD code; libm's expf is a call per element and is not vectorized without
 * -ffast-math. Accuracy: relative error below 2e-7 over the clamped range
 * (degree-7 Taylor on |r| <= ln2/2 after range reduction), tested against
 * libm in tests/kernels. Inputs below -87.3 return ~2^-126 (not 0), above
 * 88.3 return ~2^127.4 (not inf): callers use it only where that is harmless. */
#ifndef PARTRAIN_KERNELS_FASTMATH_H
#define PARTRAIN_KERNELS_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float pt_fast_expf(float x) {
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick (round-to-nearest-even). */
    const float magic = 12582912.0f;
    float t = x * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = x - n * 0.693145751953125f; /* ln2 hi: exact in float */
    r = r - n * 1.42860682030941723212e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t e = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    return p * scale;
}

/* Row kernels on float vectors (GCC/Clang vector extensions, no intrinsics):
 * 16 lanes with AVX-512, 8 with AVX (-march=native), else 4 (SSE). The names say v8
 * for the common case; PT_VW is the real width. GCC does not vectorize a plain `s += x[i]` or `m =
 * max(m, x[i])` loop without -ffast-math, nor the lane-array form reliably; the scalar chains were
 * the largest cost of attention's softmax (perf: a scalar compare loop at 40% of the forward; 1 ns
 * per element before, see attention.c). The order of the sums differs from a serial one only by
 * float rounding. */
#ifndef PT_VBYTES
#if defined(__AVX512F__)
#define PT_VBYTES 64 /* GELU in cache: 0.40 -> 0.35 ns per element vs 32 */
#elif defined(__AVX__)
#define PT_VBYTES 32
#else
#define PT_VBYTES 16 /* SSE/NEON width; wider types would change the call ABI */
#endif
#endif
#define PT_VW (PT_VBYTES / 4)
typedef float pt_v8f __attribute__((vector_size(PT_VBYTES)));
typedef int32_t pt_v8i __attribute__((vector_size(PT_VBYTES)));

static inline pt_v8f pt_v8_load(const float *p) {
    pt_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void pt_v8_store(float *p, pt_v8f v) {
    memcpy(p, &v, sizeof v);
}
static inline pt_v8f pt_v8_splat(float x) {
    return (pt_v8f){0} + x;
}
/* Lane-wise select: m ? a : b, m from a vector comparison (all ones / zero). */
static inline pt_v8f pt_v8_select(pt_v8i m, pt_v8f a, pt_v8f b) {
    return (pt_v8f)((m & (pt_v8i)a) | (~m & (pt_v8i)b));
}
static inline pt_v8f pt_v8_max(pt_v8f a, pt_v8f b) {
    return pt_v8_select(a > b, a, b);
}
static inline float pt_v8_hsum(pt_v8f v) {
    float s = 0.0f;
    for (int j = 0; j < PT_VW; j++) s += v[j];
    return s;
}

/* pt_fast_expf on PT_VW lanes: the same steps, the same results bit for bit. */
static inline pt_v8f pt_v8_exp(pt_v8f x) {
    x = pt_v8_max(x, pt_v8_splat(-87.3f));
    x = pt_v8_select(x > pt_v8_splat(88.3f), pt_v8_splat(88.3f), x);
    const pt_v8f magic = pt_v8_splat(12582912.0f);
    pt_v8f t = x * 1.44269504088896341f + magic;
    pt_v8f n = t - magic;
    pt_v8f r = x - n * 0.693145751953125f;
    r = r - n * 1.42860682030941723212e-6f;
    pt_v8f p = pt_v8_splat(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    pt_v8i e = (__builtin_convertvector(n, pt_v8i) + 127) << 23;
    return p * (pt_v8f)e;
}

static inline float pt_max_lanes(const float *x, long n) {
    float m = -3.0e38f;
    long i = 0;
    if (n >= PT_VW) {
        pt_v8f acc = pt_v8_load(x);
        for (i = PT_VW; i + PT_VW <= n; i += PT_VW) acc = pt_v8_max(acc, pt_v8_load(x + i));
        for (int j = 0; j < PT_VW; j++) m = acc[j] > m ? acc[j] : m;
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* x[i] = exp(x[i] * scale - sub) for i < n; returns the sum of the new x. */
static inline float pt_exp_sum_lanes(float *x, long n, float scale, float sub) {
    pt_v8f acc = pt_v8_splat(0.0f);
    long i = 0;
    for (; i + PT_VW <= n; i += PT_VW) {
        pt_v8f e = pt_v8_exp(pt_v8_load(x + i) * scale - sub);
        pt_v8_store(x + i, e);
        acc += e;
    }
    float s = pt_v8_hsum(acc);
    for (; i < n; i++) {
        float e = pt_fast_expf(x[i] * scale - sub);
        x[i] = e;
        s += e;
    }
    return s;
}

/* Dot product of a and b (n). */
static inline float pt_dot_lanes(const float *a, const float *b, long n) {
    pt_v8f acc = pt_v8_splat(0.0f);
    long i = 0;
    for (; i + PT_VW <= n; i += PT_VW) acc += pt_v8_load(a + i) * pt_v8_load(b + i);
    float s = pt_v8_hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Sum of x (n). */
static inline float pt_sum_lanes(const float *x, long n) {
    pt_v8f acc = pt_v8_splat(0.0f);
    long i = 0;
    for (; i + PT_VW <= n; i += PT_VW) acc += pt_v8_load(x + i);
    float s = pt_v8_hsum(acc);
    for (; i < n; i++) s += x[i];
    return s;
}

/* Sum over i < n of e_i = exp(src[i] - sub), writing e_i to dst when dst is
 * not NULL (dst may be src itself: each element is read before it is
 * written). Vector lanes per 1024-element chunk, chunks added in double:
 * keeps the error of a 50257-wide sum near float epsilon. Shared by the
 * fused cross-entropy (xent.c) and its vocabulary-parallel phases
 * (vocab_parallel.c), which must give the same bits at t = 1. */
static inline double pt_exp_sum_chunked(float *dst, const float *src, long n, float sub) {
    double total = 0.0;
    long i = 0;
    while (i < n) {
        long end = i + 1024 < n ? i + 1024 : n;
        pt_v8f acc = pt_v8_splat(0.0f);
        for (; i + PT_VW <= end; i += PT_VW) {
            pt_v8f e = pt_v8_exp(pt_v8_load(src + i) - sub);
            if (dst) pt_v8_store(dst + i, e);
            acc += e;
        }
        float s = pt_v8_hsum(acc);
        for (; i < end; i++) {
            float e = pt_fast_expf(src[i] - sub);
            if (dst) dst[i] = e;
            s += e;
        }
        total += s;
    }
    return total;
}

#endif
