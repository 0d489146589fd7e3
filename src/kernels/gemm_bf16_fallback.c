/* pt_gemm_bf16 on a CPU without AVX512_BF16 or AMX (AVX2-only machines,
 * older AVX-512 ones): blocks of A and B converted to fp32, then pt_sgemm
 * on each block (its own AVX-512 GEMM or OpenBLAS), so the result is
 * exactly what pt_sgemm gives on the converted operands, chunk by chunk.
 *
 *   colsum += B's column sums, once, from the bf16 values (rows in order)
 *   for each K chunk (<= 256):
 *     for each N chunk (<= 384): convert B's chunk
 *       for each M chunk (what the scratch holds, >= 192 rows): convert
 *         A's chunk
 *         pt_sgemm on the chunk: res + bias (and beta) on the first K
 *         chunk, GELU or its derivative on the last
 *
 * The chunks (576 KiB of fp32 together) live in the calling thread's
 * bf16 scratch; no whole matrix is converted up front. Each B element is
 * converted once and each A element once per N chunk: about MNK / 384
 * conversions against 2 MNK flops, a few per cent of a product
 * (bench/bench_bf16.c measures the fallback against fp32 on the same
 * shapes). Sums: each element of C adds the K chunks in turn, inside a
 * chunk in pt_sgemm's order: with the own fp32 GEMM, the same bits at any
 * thread count; with OpenBLAS, its float32-rounding guarantee.
 *
 * Not here: the own bf16 paths (gemm_bf16.c). */
#include <string.h>

#include "bf16_impl.h"

enum { FK = 256, FN = 384, SCRATCH_FLOATS = PT_BF16_SCRATCH_BYTES / sizeof(float) };
_Static_assert((long)FK *FN + 192L * FK <= (long)SCRATCH_FLOATS, "fallback chunks");

/* One product's chunks: K in balanced chunks of at most FK, N in chunks of
 * at most FN, and as many rows of A as the rest of the scratch holds: few,
 * large chunks, since each is a pt_sgemm call with its own pool runs and
 * B packing (at 2 threads a 256-row product in 192-row chunks spent more
 * time at the pool's barriers than converting). */
static void chunk_sizes(int M, int N, int K, int *kb, int *nb, int *mb) {
    int nk = (K + FK - 1) / FK;
    *kb = (K + nk - 1) / nk;
    *nb = N < FN ? N : FN;
    long rows = ((long)SCRATCH_FLOATS - (long)*kb * *nb) / *kb;
    *mb = rows >= M ? M : (int)(rows / 12 * 12); /* whole tiles of the fp32 GEMM */
}

/* ---- column sums ------------------------------------------------------------ */

typedef struct {
    float *colsum;
    const pt_bf16 *B;
    long ldb;
    int K, N;
} colsum_ctx;

/* Columns [lo, hi), rows added in order: the same bits at any thread
 * count, and the own paths' (which add the same rows in the same order
 * while packing). */
static void colsum_part(void *p, int index, int count) {
    const colsum_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    float *restrict cs = c->colsum;
    for (int k = 0; k < c->K; k++) {
        const pt_bf16 *restrict b = c->B + k * c->ldb;
        for (long j = lo; j < hi; j++) {
            uint32_t u = (uint32_t)b[j] << 16;
            float f;
            memcpy(&f, &u, sizeof f);
            cs[j] += f;
        }
    }
}

void pt_bf16_colsum_add(float *colsum, const pt_bf16 *B, long ldb, int K, int N) {
    colsum_ctx c = {.colsum = colsum, .B = B, .ldb = ldb, .K = K, .N = N};
    pt_pool_run(colsum_part, &c, (long)K * N < 65536 || N < 64 ? 1 : pt_kernels_threads());
}

/* ---- chunk conversion --------------------------------------------------------- */

/* dst (rows, cols), contiguous = src (rows, cols) with row stride lds. */
typedef struct {
    float *dst;
    const pt_bf16 *src;
    long lds;
    int rows, cols;
} chunk_ctx;

static void chunk_part(void *p, int index, int count) {
    const chunk_ctx *c = p;
    long lo, hi;
    pt_split_range(c->rows, index, count, &lo, &hi);
    for (long r = lo; r < hi; r++)
        pt_bf16_to_f32_serial(c->dst + r * c->cols, c->src + r * c->lds, (size_t)c->cols);
}

static void convert_chunk(float *dst, const pt_bf16 *src, long lds, int rows, int cols) {
    chunk_ctx c = {.dst = dst, .src = src, .lds = lds, .rows = rows, .cols = cols};
    pt_pool_run(chunk_part, &c, (long)rows * cols < 65536 ? 1 : pt_kernels_threads());
}

/* ---- the product ------------------------------------------------------------ */

/* pt_sgemm on converted chunks; see the file's header. */
static void chunked(int ta, int tb, int M, int N, int K, const pt_bf16 *A, int lda,
                    const pt_bf16 *B, int ldb, float beta, float *C, int ldc,
                    const pt_gemm_epilogue *e) {
    int kb, nb, mb;
    chunk_sizes(M, N, K, &kb, &nb, &mb);
    float *fb = pt_bf16_scratch(), *fa = fb + (long)kb * nb;
    for (int pc = 0; pc < K; pc += kb) {
        int kc = K - pc < kb ? K - pc : kb, first = pc == 0, last = pc + kc == K;
        for (int jc = 0; jc < N; jc += nb) {
            int nc = N - jc < nb ? N - jc : nb;
            /* op(B)[pc .. pc+kc, jc .. jc+nc], in B's storage order */
            if (tb)
                convert_chunk(fb, B + (long)jc * ldb + pc, ldb, nc, kc);
            else
                convert_chunk(fb, B + (long)pc * ldb + jc, ldb, kc, nc);
            for (int ic = 0; ic < M; ic += mb) {
                int mc = M - ic < mb ? M - ic : mb;
                if (ta)
                    convert_chunk(fa, A + (long)pc * lda + ic, lda, kc, mc);
                else
                    convert_chunk(fa, A + (long)ic * lda + pc, lda, mc, kc);
                long off = (long)ic * ldc + jc;
                pt_gemm_epilogue ec = {0};
                if (e && first) {
                    ec.bias = e->bias ? e->bias + jc : NULL;
                    ec.res = e->res ? e->res + off : NULL;
                }
                if (e && last) {
                    ec.act = e->act ? e->act + off : NULL;
                    ec.pre = e->pre ? e->pre + off : NULL;
                }
                pt_sgemm(ta, tb, mc, nc, kc, fa, ta ? mc : kc, fb, tb ? kc : nc,
                         first ? beta : 1.0f, C + off, ldc, &ec);
            }
        }
    }
}

void pt_gemm_bf16_fallback(int ta, int tb, int M, int N, int K, const pt_bf16 *A, int lda,
                           const pt_bf16 *B, int ldb, float beta, float *C, int ldc,
                           const pt_gemm_epilogue *e) {
    if (M <= 0 || N <= 0) return;
    if (e && e->colsum) pt_bf16_colsum_add(e->colsum, B, ldb, K, N);
    if (K > 0) {
        chunked(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, e);
        return;
    }
    /* K = 0: C = res + bias (+ C), then the activation; pt_sgemm does that
     * without reading A or B (given strides it accepts) */
    static const float zero[1];
    pt_gemm_epilogue ec = {0};
    if (e) ec = *e, ec.colsum = NULL;
    pt_sgemm(0, 0, M, N, 0, zero, 1, zero, N, beta, C, ldc, &ec);
}
