/* dst[x][y] = src[y][x] for a 16 x 16 float block (row strides ldd, lds) in
 * AVX-512 registers: 16 row loads, 64 shuffles, 16 row stores. Shared by the
 * attention tiles (K and V blocks; the scalar loop was one strided store per
 * element, 70% of the backward outside the tiles) and the GEMM's packing of
 * a transposed B. */
#ifndef PARTRAIN_KERNELS_TRANSPOSE_H
#define PARTRAIN_KERNELS_TRANSPOSE_H

#if defined(__AVX512F__)
#include <immintrin.h>

static inline void pt_transpose16(float *dst, long ldd, const float *src, long lds) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int k = 0; k < 2; k++) {
            __m512d a = _mm512_castps_pd(t[i + k]), b = _mm512_castps_pd(t[i + k + 2]);
            r[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 16; i += 8)
        for (int k = 0; k < 4; k++) {
            t[i + k] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0x88);
            t[i + k + 4] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * ldd, r[i]);
}
#endif

#endif
