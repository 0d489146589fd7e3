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

#endif
