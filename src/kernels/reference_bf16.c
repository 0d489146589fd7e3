/* The bf16 conversions one element at a time, written for obviousness: the
 * oracle of bf16.c's vector code (every path must give these bits) and of
 * the tests. Not on the training path.
 *
 * Rounding to nearest, ties to even, on the float's bits: adding 0x7fff
 * plus the lowest kept bit carries into bit 16 exactly when the dropped half
 * is above one half, or equal to it with an odd kept part; a carry out of
 * the mantissa raises the exponent (2.0 from 1.99..., inf from the largest
 * floats), and subnormals round the same way. Only NaN needs its own case:
 * the carry could turn it into an infinity, and truncation could clear all
 * its kept payload bits. */
#include <string.h>

#include "kernels_impl.h"

pt_bf16 pt_ref_bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (pt_bf16)((u >> 16) | 0x0040u); /* quiet NaN */
    return (pt_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float pt_ref_bf16_float(pt_bf16 x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
