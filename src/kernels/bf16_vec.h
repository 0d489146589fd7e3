/* bf16 on the kernels' float vectors (fastmath.h's pt_v8f, GCC/Clang
 * vector extensions, no intrinsics): loads that widen bf16 to float32 and
 * stores that round float32 to bf16, for the elementwise kernels and the
 * GEMM epilogues that read or write bf16 activations. Rounding is the
 * reference's (reference_bf16.c: nearest, ties to even, NaN kept quiet),
 * so a value stored here has the bits pt_bf16_from_f32 gives it, on every
 * CPU and at any vector width.
 *
 * Not here: the bulk conversions (bf16.c), which pick AVX-512 or AVX2 code
 * at run time. */
#ifndef PARTRAIN_KERNELS_BF16_VEC_H
#define PARTRAIN_KERNELS_BF16_VEC_H

#include <stdint.h>
#include <string.h>

#include "fastmath.h"
#include "partrain/kernels.h"

typedef uint16_t pt_v8h __attribute__((vector_size(PT_VBYTES / 2)));
typedef uint32_t pt_v8u __attribute__((vector_size(PT_VBYTES)));

/* float32 bits -> bf16 bits in the low half of each lane */
static inline pt_v8u pt_v8_bits16(pt_v8f x) {
    pt_v8u u = (pt_v8u)x;
    pt_v8u r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    pt_v8i nan = (pt_v8i)((u & 0x7fffffffu) > 0x7f800000u);
    pt_v8u q = (u >> 16) | 0x40u;
    return (pt_v8u)((nan & (pt_v8i)q) | (~nan & (pt_v8i)r));
}

/* PT_VW bf16 at p as floats (exact). */
static inline pt_v8f pt_v8_load16(const pt_bf16 *p) {
    pt_v8h h;
    memcpy(&h, p, sizeof h);
    return (pt_v8f)(__builtin_convertvector(h, pt_v8u) << 16);
}

/* x rounded to bf16, stored as PT_VW bf16 at p. */
static inline void pt_v8_store16(pt_bf16 *p, pt_v8f x) {
    pt_v8h h = __builtin_convertvector(pt_v8_bits16(x), pt_v8h);
    memcpy(p, &h, sizeof h);
}

/* x rounded to bf16 and widened back: the value a bf16 store then load gives. */
static inline pt_v8f pt_v8_round16(pt_v8f x) {
    return (pt_v8f)(pt_v8_bits16(x) << 16);
}

/* One element of each. */
static inline float pt_f32_of16(pt_bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline pt_bf16 pt_bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (pt_bf16)((u >> 16) | 0x40u);
    return (pt_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float pt_round16(float x) {
    return pt_f32_of16(pt_bf16_of(x));
}

/* dst (n) = src (n) rounded to bf16, on this thread. */
static inline void pt_row_store16(pt_bf16 *dst, const float *src, long n) {
    long i = 0;
    for (; i + PT_VW <= n; i += PT_VW) pt_v8_store16(dst + i, pt_v8_load(src + i));
    for (; i < n; i++) dst[i] = pt_bf16_of(src[i]);
}

#endif
