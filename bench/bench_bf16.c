/* bench_bf16: the bf16 GEMM's speed at the model's shapes, next to what the
 * CPU can do and to the fp32 GEMM. Run by hand (not a test):
 *
 *   taskset -c 0   bench_bf16 --threads 1 [--reps R] [--quick] [--json]
 *   taskset -c 0,1 bench_bf16 --threads 2 ...
 *   bench_bf16 --only "gpt2 fc"      (the shapes whose name holds the text)
 *   bench_bf16 --cpu                 (rates by CPU time, see now())
 *
 * For each shape and thread count, R rounds (default 7) of, in turn:
 *   ceiling   vdpbf16ps on 24 independent register accumulators, no memory
 *             operand, on every thread at once: the bf16 multiply-add rate
 *             the cores give right now (a multiply-add is 2 flops; one
 *             vdpbf16ps is 16 lanes x 2 pairs = 64 flops)
 *   bf16      pt_gemm_bf16 on the path AUTO picks (pt_gemm_bf16_kind)
 *   fp32      pt_sgemm, the same shape in fp32 (its AUTO path)
 *   fallback  pt_gemm_bf16 forced onto the fallback (fp32 products on
 *             converted blocks), against fp32: the issue asks <= 1.15x
 * each timed over enough calls (or loop turns) to last 20 ms. Printed: medians over the
 * rounds, and the median of the rounds' bf16 / ceiling ratios (a shared
 * host's speed moves within seconds: a ratio within one round compares
 * like with like). --json adds one JSON line per row.
 *
 * Shapes: the linears of the small (C = 384) and gpt2 (C = 768) configs at
 * N = B*T = 2048 and 256 rows, OC = 3C (qkv) and 4C (fc), each as forward
 * (rows x OC x C), input gradient (rows x C x OC, B transposed) and weight
 * gradient (C x OC x rows, A transposed), and 1024^3. --quick: forward
 * only. Written as M x N x K of C (M,N) = op(A) (M,K) op(B) (K,N). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "partrain/kernels.h"
#include "../src/kernels/bf16_impl.h"

#if PT_BF16_X86
#include <immintrin.h>
#endif

/* The clock: wall time, or with --cpu the process's CPU time divided by
 * the thread count. On a shared machine whose other processes take turns
 * on the same cores, CPU time leaves out the turns they took (it still
 * counts a hypervisor's steal, and a waiting worker's spin). */
static int g_cpu_clock, g_threads = 1;
static double now(void) {
    if (!g_cpu_clock) return pt_time_s();
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return ((double)t.tv_sec + 1e-9 * (double)t.tv_nsec) / g_threads;
}

typedef struct {
    char name[48];
    int ta, tb, M, N, K;
} shape;

/* ---- the ceiling ---------------------------------------------------------- */

enum { CEIL_ITERS = 1 << 16, CEIL_ACC = 24 };

typedef struct {
    long iters;
    double t[64];
} ceil_ctx;

#if PT_BF16_X86
/* Plain dependency chains: no barrier inside the loop (an asm "+v" on an
 * array of accumulators made GCC store all 24 every iteration, a third of
 * the rate); the inputs come from volatile memory and the sum is returned,
 * so nothing can be folded away. */
static volatile uint16_t g_one = 0x3f80, g_zero = 0;

PT_TGT_AVX512BF16 static float ceiling_loop(long iters) {
    __m512bh a = (__m512bh)_mm512_set1_epi16((short)g_one);
    __m512bh b = (__m512bh)_mm512_set1_epi16((short)g_zero);
    __m512 c[CEIL_ACC];
    for (int i = 0; i < CEIL_ACC; i++) c[i] = _mm512_setzero_ps();
    for (long n = 0; n < iters; n++)
#pragma GCC unroll 24
        for (int i = 0; i < CEIL_ACC; i++) c[i] = _mm512_dpbf16_ps(c[i], a, b);
    __m512 s = c[0];
    for (int i = 1; i < CEIL_ACC; i++) s = _mm512_add_ps(s, c[i]);
    return _mm512_reduce_add_ps(s);
}
#endif

static volatile float g_sink;

static void ceiling_part(void *p, int index, int count) {
    (void)count;
    ceil_ctx *c = p;
    double t0 = pt_time_s();
#if PT_BF16_X86
    g_sink += ceiling_loop(c->iters);
#endif
    c->t[index] = pt_time_s() - t0; /* each thread's wall time */
}

/* flop/s of the ceiling loop on all threads at once (0 without
 * AVX512_BF16): the total work over the slowest thread's time. Run for
 * about as long as a product's measurement (20 ms): a short loop fits
 * between a shared host's preemptions and reads high. */
static double ceiling(int threads) {
    if (!pt_bf16_cpu_get()->avx512bf16) return 0.0;
    ceil_ctx c = {.iters = CEIL_ITERS};
    for (;;) {
        double t0 = now();
        pt_pool_run(ceiling_part, &c, threads);
        double worst = 0.0;
        for (int i = 0; i < threads; i++) worst = c.t[i] > worst ? c.t[i] : worst;
        if (g_cpu_clock) worst = now() - t0;
        if (worst >= 0.02 || c.iters >= (1L << 30))
            return (double)c.iters * CEIL_ACC * 64.0 * threads / worst;
        c.iters *= 2;
    }
}

/* ---- the products ---------------------------------------------------------- */

enum { K_BF16, K_FP32, K_FALLBACK, K_N };

typedef struct {
    const shape *s;
    pt_bf16 *A16, *B16;
    float *A, *B, *C;
} operands;

static void run_once(const operands *o, int kind) {
    const shape *s = o->s;
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    if (kind == K_FP32) {
        pt_sgemm(s->ta, s->tb, s->M, s->N, s->K, o->A, lda, o->B, ldb, 0.0f, o->C, s->N, NULL);
        return;
    }
    int old = pt_gemm_bf16_set_path(kind == K_FALLBACK ? PT_BF16_FALLBACK : PT_BF16_AUTO);
    pt_gemm_bf16(s->ta, s->tb, s->M, s->N, s->K, o->A16, lda, o->B16, ldb, 0.0f, o->C, s->N, NULL);
    pt_gemm_bf16_set_path(old);
}

/* flop/s of one kind, over enough calls to last 20 ms. */
static double rate(const operands *o, int kind) {
    double flops = 2.0 * o->s->M * o->s->N * o->s->K, t0 = now(), t;
    int calls = 0;
    do {
        run_once(o, kind);
        calls++;
    } while ((t = now() - t0) < 0.02);
    return flops * calls / t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* One row of the table: R rounds of ceiling, bf16, fp32, fallback. */
static void bench_shape(const shape *s, int threads, int reps, int json) {
    long na = (long)s->M * s->K, nb = (long)s->K * s->N;
    operands o = {.s = s};
    o.A = malloc(sizeof(float) * na), o.B = malloc(sizeof(float) * nb);
    o.C = malloc(sizeof(float) * s->M * s->N);
    o.A16 = malloc(sizeof(pt_bf16) * na), o.B16 = malloc(sizeof(pt_bf16) * nb);
    for (long i = 0; i < na; i++) o.A[i] = (float)((i * 7919 % 1000) / 1000.0 - 0.5);
    for (long i = 0; i < nb; i++) o.B[i] = (float)((i * 104729 % 1000) / 1000.0 - 0.5);
    pt_bf16_from_f32(o.A16, o.A, (size_t)na);
    pt_bf16_from_f32(o.B16, o.B, (size_t)nb);
    pt_kernels_set_threads(threads);
    g_threads = threads;
    double r[K_N][64], ceil[64], ratio[64];
    for (int k = 0; k < K_N; k++) run_once(&o, k); /* warm up: pages, pool, caches */
    for (int i = 0; i < reps; i++) {
        ceil[i] = ceiling(threads);
        for (int k = 0; k < K_N; k++) r[k][i] = rate(&o, k);
        ratio[i] = ceil[i] > 0 ? r[K_BF16][i] / ceil[i] : 0.0;
    }
    double mc = median(ceil, reps) / 1e9, mr = median(ratio, reps), m[K_N];
    for (int k = 0; k < K_N; k++) m[k] = median(r[k], reps) / 1e9;
    printf("%-28s %2d %8.1f %8.1f %5.0f%% %8.1f %6.2fx %8.1f %6.2fx\n", s->name, threads, mc,
           m[K_BF16], 100.0 * mr, m[K_FP32], m[K_BF16] / m[K_FP32], m[K_FALLBACK],
           m[K_FP32] / m[K_FALLBACK]);
    if (json)
        printf("{\"bench\":\"bf16_gemm\",\"shape\":\"%s\",\"M\":%d,\"N\":%d,\"K\":%d,\"ta\":%d,"
               "\"tb\":%d,\"threads\":%d,\"kind\":\"%s\",\"clock\":\"%s\",\"ceiling_gflops\":%.2f,"
               "\"bf16_gflops\":%.2f,\"bf16_of_ceiling\":%.4f,\"fp32_gflops\":%.2f,"
               "\"fallback_gflops\":%.2f,\"reps\":%d}\n",
               s->name, s->M, s->N, s->K, s->ta, s->tb, threads, pt_gemm_bf16_kind(),
               g_cpu_clock ? "cpu" : "wall", mc, m[K_BF16], mr, m[K_FP32], m[K_FALLBACK], reps);
    fflush(stdout);
    free(o.A), free(o.B), free(o.C), free(o.A16), free(o.B16);
}

static int model_shapes(shape *out, int quick) {
    static const struct {
        const char *name;
        int C;
    } CONFIGS[] = {{"small", 384}, {"gpt2", 768}};
    static const int ROWS[] = {2048, 256};
    int n = 0;
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < 2; r++)
            for (int m = 3; m <= 4; m++) {
                int C = CONFIGS[c].C, OC = m * C, R = ROWS[r];
                const char *lin = m == 3 ? "qkv" : "fc";
                shape f = {"", 0, 0, R, OC, C}, di = {"", 0, 1, R, C, OC},
                      dw = {"", 1, 0, C, OC, R};
                snprintf(f.name, sizeof f.name, "%s %s fwd %dx%dx%d", CONFIGS[c].name, lin, R, OC,
                         C);
                snprintf(di.name, sizeof di.name, "%s %s dinp %dx%dx%d", CONFIGS[c].name, lin, R, C,
                         OC);
                snprintf(dw.name, sizeof dw.name, "%s %s dW %dx%dx%d", CONFIGS[c].name, lin, C, OC,
                         R);
                out[n++] = f;
                if (!quick) out[n++] = di, out[n++] = dw;
            }
    out[n++] = (shape){"square 1024^3", 0, 0, 1024, 1024, 1024};
    return n;
}

int main(int argc, char **argv) {
    int thr[8] = {1}, nthr = 1, reps = 7, json = 0, quick = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            nthr = 0;
            for (char *t = strtok(argv[++i], ","); t && nthr < 8; t = strtok(NULL, ","))
                thr[nthr++] = atoi(t) > 0 ? atoi(t) : 1;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--cpu")) {
            g_cpu_clock = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: bench_bf16 [--threads 1,2] [--reps R] [--quick] [--only TEXT] "
                            "[--cpu] [--json]\n");
            return 2;
        }
    }
    shape shapes[32];
    int ns = model_shapes(shapes, quick);
    printf("bf16 GEMM: %s; fp32 GEMM: %s; GFLOP/s by %s time, medians of %d rounds\n",
           pt_gemm_bf16_kind(),
           pt_sgemm_has_own() ? "own AVX-512 (large) / OpenBLAS (small)" : "OpenBLAS",
           g_cpu_clock ? "CPU" : "wall", reps);
    printf("%-28s %2s %8s %8s %6s %8s %7s %8s %7s\n", "shape (MxNxK)", "th", "ceiling", "bf16",
           "of_ceil", "fp32", "bf16/32", "fallbk", "fp32/fb");
    for (int t = 0; t < nthr; t++)
        for (int s = 0; s < ns; s++)
            if (!only || strstr(shapes[s].name, only)) bench_shape(&shapes[s], thr[t], reps, json);
    return 0;
}
