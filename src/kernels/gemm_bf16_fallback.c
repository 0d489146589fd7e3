/* pt_gemm_bf16 on a CPU without AVX512_BF16 or AMX (AVX2-only machines,
 * older AVX-512 ones): blocks of A and B converted to fp32, then pt_sgemm
 * on each block (its own AVX-512 GEMM or OpenBLAS), so the result is
 * exactly what pt_sgemm gives on the converted operands, chunk by chunk.
 *
 *   colsum += B's column sums, once, from the bf16 values (rows in order)
 *   for each K chunk (<= 512):
 *     for each N chunk (<= 1024): convert B's chunk
 *       for each M chunk (what the buffer holds, >= 1024 rows): convert
 *         A's chunk
 *         pt_sgemm on the chunk: res + bias (and beta) on the first K
 *         chunk, GELU or its derivative on the last
 *
 * The chunks live in one static 4 MiB buffer (no whole matrix is
 * converted up front). Large chunks because each is a pt_sgemm call with
 * its own pool runs: in chunks of 192 rows x 384 columns (what a
 * thread's 576 KiB scratch held) gpt2's fc product was 264 calls, and at
 * 2 threads on the shared development host the pool's worker spent 38% of
 * its samples waiting at barriers (perf; fp32 on the same product: 2%);
 * the model's linears are now 1 to 12 calls. One static buffer follows
 * kernels.h's rule (the kernels are called from one thread at a time);
 * a call from a second thread at once is caught by an assert. Each B
 * element is converted once and each A element once per N chunk: at most
 * MNK / 1024 + MK + NK conversions against 2 MNK flops. Sums: each element of
 * C adds the K chunks in turn, inside a chunk in pt_sgemm's order: with
 * the own fp32 GEMM, the same bits at any thread count; with OpenBLAS,
 * its float32-rounding guarantee.
 *
 * Not here: the own bf16 paths (gemm_bf16.c). */
#include <stdatomic.h>
#include <string.h>

#include "bf16_impl.h"
#include "bf16_vec.h"

enum { FK = 512, FN = 1536, CHUNK_FLOATS = 1 << 20 };
static float g_chunks[CHUNK_FLOATS] __attribute__((aligned(64))); /* 4 MiB, BSS */
static atomic_flag g_busy = ATOMIC_FLAG_INIT;
static long g_limit = CHUNK_FLOATS; /* how much of it to use: tests shrink it */

long pt_gemm_bf16_fallback_set_chunk(long floats) {
    long old = g_limit;
    g_limit = floats < 16384 ? 16384 : floats > CHUNK_FLOATS ? CHUNK_FLOATS : floats;
    return old;
}

/* One product's chunks: K in balanced chunks of at most FK (the size of
 * gemm.c's K blocks: C is loaded and stored once per chunk, as often as
 * pt_sgemm on the whole product would), N in balanced chunks of at most
 * FN and at most half the buffer, and as many rows of A as the rest of the
 * buffer holds, in whole 12-row tiles. */
static void chunk_sizes(int M, int N, int K, int *kb, int *nb, int *mb) {
    int nk = (K + FK - 1) / FK;
    *kb = (K + nk - 1) / nk;
    long cols = g_limit / 2 / *kb;
    cols = cols < FN ? cols : FN;
    long nn = (N + cols - 1) / cols;
    *nb = (int)((N + nn - 1) / nn);
    long rows = (g_limit - (long)*kb * *nb) / *kb;
    *mb = rows >= M ? M : (int)(rows / 12 * 12);
}

/* ---- column sums ------------------------------------------------------------ */

typedef struct {
    float *colsum;
    const pt_bf16 *B;
    const float *Bf; /* or an fp32 B */
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
        if (c->Bf) {
            const float *restrict b = c->Bf + k * c->ldb;
            for (long j = lo; j < hi; j++) cs[j] += pt_round16(b[j]);
            continue;
        }
        const pt_bf16 *restrict b = c->B + k * c->ldb;
        for (long j = lo; j < hi; j++) cs[j] += pt_f32_of16(b[j]);
    }
}

/* colsum (N) += B (K,N)'s rows as float32 (an fp32 B's rounded to bf16),
 * in order; columns split over the pool. */
static void colsum_add(float *colsum, const void *B, int b_f32, long ldb, int K, int N) {
    colsum_ctx c = {.colsum = colsum,
                    .B = b_f32 ? NULL : B,
                    .Bf = b_f32 ? B : NULL,
                    .ldb = ldb,
                    .K = K,
                    .N = N};
    pt_pool_run(colsum_part, &c, (long)K * N < 65536 || N < 64 ? 1 : pt_kernels_threads());
}

/* ---- chunk conversion --------------------------------------------------------- */

/* dst (rows, cols), contiguous = src (rows, cols) with row stride lds, a
 * bf16 src widened, an fp32 one (f32) rounded to bf16 values. */
typedef struct {
    float *dst;
    const void *src;
    long lds;
    int rows, cols, f32;
} chunk_ctx;

static void chunk_part(void *p, int index, int count) {
    const chunk_ctx *c = p;
    long lo, hi;
    pt_split_range(c->rows, index, count, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        float *d = c->dst + r * c->cols;
        if (!c->f32) {
            pt_bf16_to_f32_serial(d, (const pt_bf16 *)c->src + r * c->lds, (size_t)c->cols);
            continue;
        }
        const float *s = (const float *)c->src + r * c->lds;
        int x = 0;
        for (; x + PT_VW <= c->cols; x += PT_VW)
            pt_v8_store(d + x, pt_v8_round16(pt_v8_load(s + x)));
        for (; x < c->cols; x++) d[x] = pt_round16(s[x]);
    }
}

/* src + off elements of its type (bf16 or fp32). */
static const void *at(const void *src, int f32, long off) {
    return f32 ? (const void *)((const float *)src + off)
               : (const void *)((const pt_bf16 *)src + off);
}

static void convert_chunk(float *dst, const void *src, int f32, long off, long lds, int rows,
                          int cols) {
    chunk_ctx c = {
        .dst = dst, .src = at(src, f32, off), .lds = lds, .rows = rows, .cols = cols, .f32 = f32};
    pt_pool_run(chunk_part, &c, (long)rows * cols < 8192 ? 1 : pt_kernels_threads());
}

/* ---- the product ------------------------------------------------------------ */

/* pt_sgemm on converted chunks; see the file's header. */
static void chunked(int ta, int tb, int M, int N, int K, const void *A, int a32, int lda,
                    const void *B, int b32, int ldb, float beta, float *C, int ldc,
                    const pt_gemm_epilogue *e) {
    int kb, nb, mb;
    chunk_sizes(M, N, K, &kb, &nb, &mb);
    float *fb = g_chunks, *fa = fb + (long)kb * nb;
    for (int pc = 0; pc < K; pc += kb) {
        int kc = K - pc < kb ? K - pc : kb, first = pc == 0, last = pc + kc == K;
        for (int jc = 0; jc < N; jc += nb) {
            int nc = N - jc < nb ? N - jc : nb;
            /* op(B)[pc .. pc+kc, jc .. jc+nc], in B's storage order */
            if (tb)
                convert_chunk(fb, B, b32, (long)jc * ldb + pc, ldb, nc, kc);
            else
                convert_chunk(fb, B, b32, (long)pc * ldb + jc, ldb, kc, nc);
            for (int ic = 0; ic < M; ic += mb) {
                int mc = M - ic < mb ? M - ic : mb;
                if (ta)
                    convert_chunk(fa, A, a32, (long)pc * lda + ic, lda, kc, mc);
                else
                    convert_chunk(fa, A, a32, (long)ic * lda + pc, lda, mc, kc);
                long off = (long)ic * ldc + jc;
                pt_gemm_epilogue ec = {0};
                if (e && first) {
                    ec.bias = e->bias ? e->bias + jc : NULL;
                    ec.res = e->res ? e->res + off : NULL;
                }
                if (e && last) {
                    ec.act = e->act ? e->act + off : NULL;
                    ec.pre = e->pre ? e->pre + off : NULL;
                    ec.out16 = e->out16 ? e->out16 + off : NULL;
                    ec.act16 = e->act16 ? e->act16 + off : NULL;
                    ec.pre16 = e->pre16 ? e->pre16 + off : NULL;
                }
                pt_sgemm(ta, tb, mc, nc, kc, fa, ta ? mc : kc, fb, tb ? kc : nc,
                         first ? beta : 1.0f, C + off, ldc, &ec);
            }
        }
    }
}

void pt_gemm_bf16_fallback(int ta, int tb, int M, int N, int K, const void *A, int a_f32, int lda,
                           const void *B, int b_f32, int ldb, float beta, float *C, int ldc,
                           const pt_gemm_epilogue *e) {
    if (M <= 0 || N <= 0) return;
    if (e && e->colsum) colsum_add(e->colsum, B, b_f32, ldb, K, N);
    if (K > 0) {
        PT_ASSERT(!atomic_flag_test_and_set(&g_busy)); /* one thread at a time (kernels.h) */
        chunked(ta, tb, M, N, K, A, a_f32, lda, B, b_f32, ldb, beta, C, ldc, e);
        atomic_flag_clear(&g_busy);
        return;
    }
    /* K = 0: C = res + bias (+ C), then the activation; pt_sgemm does that
     * without reading A or B (given strides it accepts) */
    static const float zero[1];
    pt_gemm_epilogue ec = {0};
    if (e) ec = *e, ec.colsum = NULL;
    pt_sgemm(0, 0, M, N, 0, zero, 1, zero, N, beta, C, ldc, &ec);
}
