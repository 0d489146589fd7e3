/* The AMX-BF16 micro-kernel of pt_gemm_bf16 (Sapphire Rapids and later),
 * and Linux's permission to use the tiles.
 *
 * UNTESTED: the development machine (AMD Zen 5) has no AMX, so this code
 * has been compiled, never run; the tests run it wherever the CPU has AMX
 * (they try every available path), and pt_gemm_bf16_kind says when it is
 * in use. Kept small on purpose: it reuses the AVX512_BF16 path's driver,
 * B panels, epilogues and threads, and adds only the tile arithmetic.
 *
 * A 32 x 32 C tile is four 16 x 16 fp32 tiles (tmm0-3); per 32 values of
 * K, two A tiles (16 rows x 32 bf16, tmm4-5) and two B tiles (16 K pairs x
 * 16 columns, tmm6-7: the two halves of a packed panel row, 128 bytes
 * apart) and four TDPBF16PS. A is read in place (row-major, K contiguous:
 * the layout A tiles load) when it is not transposed and kc is a multiple
 * of 32; else it is copied into a zero-padded 32 x kcp block (transposed A
 * by a scalar loop: correct, slow; a vector transpose is the first thing
 * to add once an AMX machine can measure it).
 *
 * Linux (5.16+) hands out the tile data state only after the process asks
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without it the
 * first tile instruction raises SIGILL. pt_bf16_amx_permitted asks once,
 * for the whole process, and the path is offered only when it was granted. */
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bf16_impl.h"

#if PT_BF16_X86
#include <immintrin.h>
#endif

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

static int g_permitted;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void ask(void) {
#if PT_BF16_AMX_BUILD && defined(SYS_arch_prctl)
    if (!pt_bf16_cpu_get()->amx) return;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) == 0 &&
        (mask & (1ul << XFEATURE_XTILEDATA)))
        g_permitted = 1;
#endif
}

int pt_bf16_amx_permitted(void) {
    pthread_once(&g_once, ask);
    return g_permitted;
}

#if PT_BF16_AMX_BUILD
enum { MR = 32, NR = PT_BF16_NR, KT = 32 };
_Static_assert((int)MR <= (int)PT_BF16_MR_MAX, "tile rows");

/* Palette 1: eight tiles of 16 rows x 64 bytes. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;
_Static_assert(sizeof(tile_config) == 64, "ldtilecfg reads 64 bytes");

PT_TGT_AMX static void amx_begin(void) {
    tile_config cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
}

PT_TGT_AMX static void amx_end(void) {
    _tile_release(); /* a thread holding tile state makes context switches dearer */
}

/* c (32 x 32) = (acc ? c : 0) + A (32 x kc) x panel. a: A's 32 rows in
 * place (row stride lda, kc a multiple of 32) or, lda 0, packed with row
 * stride kc rounded up to 32. */
PT_TGT_AMX static void tile_amx(int kc, const pt_bf16 *a, long lda, const pt_bf16 *bp, float *c,
                                long ldc, int acc) {
    long as = lda ? lda : (kc + KT - 1) / KT * KT;
    float t[MR * NR] __attribute__((aligned(64)));
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int k = 0; k < kc; k += KT) {
        const pt_bf16 *b = bp + (long)(k / 2) * 2 * NR;
        _tile_loadd(4, a + k, as * 2);
        _tile_loadd(5, a + 16 * as + k, as * 2);
        _tile_loadd(6, b, 4 * NR);
        _tile_loadd(7, b + NR, 4 * NR); /* columns 16-31: 64 bytes on */
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, t, NR * 4);
    _tile_stored(1, t + 16, NR * 4);
    _tile_stored(2, t + 16 * NR, NR * 4);
    _tile_stored(3, t + 16 * NR + 16, NR * 4);
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j += 16) {
            __m512 v = _mm512_load_ps(t + r * NR + j);
            if (acc) v = _mm512_add_ps(_mm512_loadu_ps(c + r * ldc + j), v);
            _mm512_storeu_ps(c + r * ldc + j, v);
        }
}

/* op(A)[i0 .. i0+h, pc .. pc+kc] row-major with row stride kcp, zero past
 * h rows and kc columns. */
PT_TGT_AMX static void pack_a_amx(pt_bf16 *ap, const pt_bf16_gemm_ctx *g, int i0, int h) {
    for (int r = 0; r < MR; r++) {
        pt_bf16 *d = ap + (long)r * g->kcp;
        int k = 0;
        if (r < h && !g->ta) {
            memcpy(d, g->A + (long)(i0 + r) * g->lda + g->pc, sizeof(pt_bf16) * (size_t)g->kc);
            k = g->kc;
        } else if (r < h) {
            for (; k < g->kc; k++) d[k] = g->A[(long)(g->pc + k) * g->lda + i0 + r];
        }
        memset(d + k, 0, sizeof(pt_bf16) * (size_t)(g->kcp - k));
    }
}

const pt_bf16_ukernel pt_bf16_ukernel_amx = {
    .name = "amx_bf16",
    .mr = MR,
    .kalign = KT,
    .direct_k = KT,
    .pack_a = pack_a_amx,
    .tile = tile_amx,
    .begin = amx_begin,
    .end = amx_end,
};
#endif
