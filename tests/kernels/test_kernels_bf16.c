/* bf16 kernels: the conversions and pt_gemm_bf16, on every path the running
 * CPU has (the fallback on every CPU, forced), against oracles:
 *
 * Conversions: every code (scalar, AVX2, AVX-512, AVX512_BF16) gives the
 * reference's bits (reference_bf16.c) on special values (zeros, subnormals,
 * ties, the largest floats, infinities, NaNs with every kind of payload)
 * and on random bit patterns, at every length and alignment of the vector
 * tails, at 1, 2 and 3 threads. The reference itself is checked against
 * the definition: the nearest bf16 in double arithmetic, ties to even.
 *
 * Products: C against a double-precision product of the same bf16 values.
 * The bound asserted, per element: A and B are bf16 (8 significant bits),
 * so each product a * b has at most 16 and is exact in fp32 (O(1) data:
 * no overflow, no subnormals, so vdpbf16ps's flushing never applies); only
 * the fp32 additions round, in whatever order the path takes (vdpbf16ps's
 * two adds per lane, AMX's, an FMA chain, OpenBLAS's). A sum of n terms in
 * any order is within gamma_{n-1} sum |terms| of the exact one (Higham,
 * Accuracy and Stability, 3.1), gamma_n = n u / (1 - n u), u = 2^-24; with
 * the K products, bias, residual and beta C: n = K + 3, so
 *     |C - exact| <= gamma_{K+3} (sum_k |a_ik b_kj| + |bias_j| + |res_ij| + |C_ij|).
 * GELU's derivative epilogue multiplies that by gelu'(pre), computed in
 * float within GELU_GRAD_ERR (below) of the exact derivative; the GELU
 * epilogue's activation is checked against the exact GELU of the C it
 * returned, within gelu.h's float error (gelu_rel_err). Column sums are
 * bitwise a float sum of the bf16 values, rows in order, on every path.
 *
 * Bitwise across 1, 2 and 3 threads: the own paths (AVX512_BF16, AMX), and
 * the fallback over pt_sgemm's own GEMM; the fallback over OpenBLAS only
 * within the bound above (docs/architecture.md, "Bitwise guarantees").
 *
 * Sizes: M, N, K off every blocking (12-row and 32-row tiles, 32-column
 * panels, K pairs and 32-deep AMX steps, K and N blocks of 768 and 384, the
 * fallback's chunks of up to 512 of K, and of tens of rows and columns
 * when it is told to use a small buffer), padded strides, res aliasing C. */
#include <math.h>
#include <string.h>

#include "partrain/kernels.h"
#include "../../src/kernels/bf16_impl.h"
#include "pt_test.h"
#define KT_SEED 4040
#include "kernel_test.h"

static const int THREADS[] = {1, 2, 3};
#define NTHREADS 3

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static uint64_t g_bits = 0x9e3779b97f4a7c15ull;
static uint32_t rand_bits(void) { /* splitmix64 */
    uint64_t z = (g_bits += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 16);
}

/* ---- conversions ------------------------------------------------------------ */

/* The definition, in double: the bf16 nearest to x, ties to the even one;
 * beyond the largest bf16 plus half an ulp, infinity. NaN: quiet, with the
 * top payload kept. */
static uint16_t nearest_bf16(float x) {
    uint32_t u = u_of(x);
    if (isnan(x)) return (uint16_t)((u >> 16) | 0x40);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* truncation, one step out */
    if ((u & 0xffff) == 0) return lo;
    if ((lo & 0x7fff) == 0x7f7f) { /* the largest finite: above it lies infinity */
        double top = f_of(0x7f7f0000u), ulp = top - (double)f_of(0x7f7e0000u);
        return fabs((double)x) >= top + ulp / 2 ? (uint16_t)((lo & 0x8000) | 0x7f80) : lo;
    }
    double dl = fabs((double)x - f_of((uint32_t)lo << 16));
    double dh = fabs((double)f_of((uint32_t)hi << 16) - x);
    return dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
}

static const uint32_t SPECIAL[] = {
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00007fff, 0x00008000, 0x00008001, 0x00018000,
    0x007fffff, 0x807fffff, 0x00400000, 0x007f8000, 0x00800000, 0x3f800000, 0x3f808000, 0x3f818000,
    0x3f807fff, 0x3f808001, 0x3f80ffff, 0xbf808000, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0xff7fffff,
    0x7f800000, 0xff800000, 0x7f800001, 0xff800001, 0x7f8000ff, 0x7fc00000, 0xffc00000, 0x7fbfffff,
    0x7f810000, 0x7fffffff, 0xffffffff, 0x33800000, 0x4b800001, 0x477fe000, 0x477ff000, 0xc77ff000};
#define NSPECIAL (int)(sizeof SPECIAL / sizeof SPECIAL[0])

/* The reference against the definition, on the special values and random
 * patterns (both directions: bf16 -> fp32 is exact, so it round-trips). */
static void test_reference_rounding(void) {
    int bad = 0;
    for (int i = 0; i < NSPECIAL + 200000; i++) {
        float x = f_of(i < NSPECIAL ? SPECIAL[i] : rand_bits());
        uint16_t r = pt_ref_bf16_round(x), want = nearest_bf16(x);
        int ok = r == want && u_of(pt_ref_bf16_float(r)) == (uint32_t)r << 16;
        if (!ok && bad++ < 4) fprintf(stderr, "  %08x -> %04x, want %04x\n", u_of(x), r, want);
    }
    CHECK(bad == 0);
}

/* Every code at every length up to 40 and offsets 0..3 (the tails), and
 * n large enough to split over the pool, against the reference. */
static void test_convert(void) {
    const size_t big = 200003;
    float *x = malloc(sizeof(float) * big), *y = malloc(sizeof(float) * big);
    pt_bf16 *h = malloc(sizeof(pt_bf16) * big), *hr = malloc(sizeof(pt_bf16) * big);
    for (size_t i = 0; i < big; i++)
        x[i] = f_of(i % 7 == 0 ? SPECIAL[i / 7 % NSPECIAL] : rand_bits());
    for (size_t i = 0; i < big; i++) hr[i] = pt_ref_bf16_round(x[i]);
    for (int path = PT_BF16_CVT_SCALAR; path < PT_BF16_CVT_NPATHS; path++) {
        if (!pt_bf16_cvt_has_path(path)) {
            fprintf(stderr, "  conversion path %d: not on this CPU\n", path);
            continue;
        }
        int old = pt_bf16_cvt_set_path(path);
        int bad = 0;
        for (size_t off = 0; off < 4; off++)
            for (size_t n = 0; n <= 40; n++) {
                memset(h, 0xab, sizeof(pt_bf16) * 48);
                pt_bf16_from_f32(h + off, x + off, n);
                for (size_t i = 0; i < 48; i++) {
                    int in = i >= off && i < off + n;
                    bad += in ? h[i] != hr[i] : h[i] != 0xabab; /* nothing past the end */
                }
                pt_bf16_to_f32(y, hr + off, n);
                for (size_t i = 0; i < n; i++) bad += u_of(y[i]) != (uint32_t)hr[off + i] << 16;
            }
        CHECK_EQ(bad, 0);
        for (int k = 0; k < NTHREADS; k++) {
            pt_kernels_set_threads(THREADS[k]);
            memset(h, 0, sizeof(pt_bf16) * big);
            pt_bf16_from_f32(h, x, big);
            CHECK(memcmp(h, hr, sizeof(pt_bf16) * big) == 0);
            pt_bf16_to_f32(y, hr, big);
            bad = 0;
            for (size_t i = 0; i < big; i++) bad += u_of(y[i]) != (uint32_t)hr[i] << 16;
            CHECK_EQ(bad, 0);
        }
        pt_kernels_set_threads(1);
        pt_bf16_cvt_set_path(old);
    }
    free(x), free(y), free(h), free(hr);
}

/* ---- products --------------------------------------------------------------- */

/* |pt_gelu_grad(x) - gelu'(x)| over |x| <= 8 (gelu.h's float code, scalar
 * and vector lanes): measured at most 2.0e-6 on a 2-million-point grid;
 * asserted with a factor 5 of room. */
#define GELU_GRAD_ERR 1e-5

/* n bf16 values drawn uniformly from [-scale, scale) and rounded. */
static pt_bf16 *rnd_bf16(long n, double scale) {
    pt_bf16 *x = malloc(sizeof(pt_bf16) * (n > 0 ? n : 1));
    for (long i = 0; i < n; i++) x[i] = pt_ref_bf16_round((float)(urand() * scale));
    return x;
}
static float *rnd(long n, double scale) {
    float *x = malloc(sizeof(float) * (n > 0 ? n : 1));
    for (long i = 0; i < n; i++) x[i] = (float)(urand() * scale);
    return x;
}
static float *dupf(const float *x, long n) {
    float *y = malloc(sizeof(float) * (n > 0 ? n : 1));
    memcpy(y, x, sizeof(float) * (n > 0 ? n : 0));
    return y;
}

enum { E_NONE, E_BIAS, E_RES, E_BIAS_RES_ACT, E_PRE, E_COLSUM, E_ALIAS, E_N };
static const char *ENAMES[E_N] = {"none",  "bias",   "res",           "bias+res+gelu",
                                  "gelu'", "colsum", "res aliasing C"};

/* One product's operands and its exact value in double. */
typedef struct {
    int M, N, K, ta, tb, lda, ldb, ldc;
    pt_bf16 *A, *B;
    float *C0, *bias, *res, *pre, *cs0;
    double *P, *S; /* op(A) op(B) and sum_k |a b|, (M,N) */
} gcase;

static void gcase_init(gcase *g, int M, int N, int K, int ta, int tb, double scale) {
    *g = (gcase){.M = M, .N = N, .K = K, .ta = ta, .tb = tb};
    g->lda = (ta ? M : K) + 3, g->ldb = (tb ? K : N) + 1, g->ldc = N + 5; /* padded strides */
    g->A = rnd_bf16((long)(ta ? K : M) * g->lda, scale);
    g->B = rnd_bf16((long)(tb ? N : K) * g->ldb, scale);
    long nc = (long)M * g->ldc;
    g->C0 = rnd(nc, 1), g->res = rnd(nc, 1), g->pre = rnd(nc, 4);
    g->bias = rnd(N, 1), g->cs0 = rnd(N, 1);
    g->P = calloc((size_t)M * N, sizeof(double)), g->S = calloc((size_t)M * N, sizeof(double));
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            double a = pt_ref_bf16_float(g->A[ta ? (long)k * g->lda + i : (long)i * g->lda + k]);
            for (int j = 0; j < N; j++) {
                double t =
                    a * pt_ref_bf16_float(g->B[tb ? (long)j * g->ldb + k : (long)k * g->ldb + j]);
                g->P[(long)i * N + j] += t, g->S[(long)i * N + j] += fabs(t);
            }
        }
}

static void gcase_free(gcase *g) {
    free(g->A), free(g->B), free(g->C0), free(g->res), free(g->pre), free(g->bias), free(g->cs0);
    free(g->P), free(g->S);
}

/* Run the product with epilogue kind ek: C (M, ldc), act (M, ldc) and cs
 * (N) written; the padding columns of C must stay as they were. */
static void run_case(const gcase *g, int ek, float beta, float *C, float *act, float *cs) {
    long nc = (long)g->M * g->ldc;
    memcpy(C, ek == E_ALIAS ? g->res : g->C0, sizeof(float) * nc);
    for (long i = 0; i < nc; i++) act[i] = NAN;
    memcpy(cs, g->cs0, sizeof(float) * g->N);
    pt_gemm_epilogue e = {0};
    if (ek == E_BIAS || ek == E_BIAS_RES_ACT || ek == E_COLSUM) e.bias = g->bias;
    if (ek == E_RES || ek == E_BIAS_RES_ACT) e.res = g->res;
    if (ek == E_ALIAS) e.res = C;
    if (ek == E_BIAS_RES_ACT) e.act = act;
    if (ek == E_PRE) e.pre = g->pre;
    if (ek == E_COLSUM) e.colsum = cs;
    pt_gemm_bf16(g->ta, g->tb, g->M, g->N, g->K, g->A, g->lda, g->B, g->ldb,
                 ek == E_ALIAS ? 0.0f : beta, C, g->ldc, ek == E_NONE ? NULL : &e);
}

static int e_has_res(int ek) {
    return ek == E_RES || ek == E_BIAS_RES_ACT || ek == E_ALIAS;
}
static int e_has_bias(int ek) {
    return ek == E_BIAS || ek == E_BIAS_RES_ACT || ek == E_COLSUM;
}

/* C, act and cs against the exact values and the bound in the file's header. */
static int check_case(const gcase *g, int ek, float beta, const float *C, const float *act,
                      const float *cs) {
    const double u = 1.0 / 16777216.0, n = g->K + 3.0, gam = n * u / (1.0 - n * u);
    int bad = 0;
    for (int i = 0; i < g->M; i++)
        for (int j = 0; j < g->ldc; j++) {
            long o = (long)i * g->ldc + j;
            if (j >= g->N) { /* padding: untouched */
                bad += u_of(C[o]) != u_of(ek == E_ALIAS ? g->res[o] : g->C0[o]);
                continue;
            }
            double base = g->P[(long)i * g->N + j], sa = g->S[(long)i * g->N + j];
            double add[3] = {ek == E_ALIAS ? 0.0 : beta * (double)g->C0[o],
                             e_has_res(ek) ? g->res[o] : 0.0, e_has_bias(ek) ? g->bias[j] : 0.0};
            for (int t = 0; t < 3; t++) base += add[t], sa += fabs(add[t]);
            double want = base, tol = gam * sa;
            if (ek == E_PRE) {
                double d = gelu_grad_double(g->pre[o]);
                want = d * base;
                tol = fabs(d) * tol + fabs(base) * GELU_GRAD_ERR + u * fabs(want);
            }
            int ok = fabs(C[o] - want) <= tol + 1e-30;
            if (ek == E_BIAS_RES_ACT) {
                double a = gelu_double(C[o]);
                ok = ok && fabs(act[o] - a) <= gelu_rel_err(C[o]) * fabs(a) + 1e-30;
            }
            if (!ok && bad++ < 3)
                fprintf(stderr, "  C[%d,%d] = %.9g want %.9g (allowed %.3g)%s\n", i, j, C[o], want,
                        tol, ek == E_BIAS_RES_ACT ? " or its GELU" : "");
        }
    for (int j = 0; ek == E_COLSUM && j < g->N; j++) { /* rows in order, in float */
        float s = g->cs0[j];
        for (int k = 0; k < g->K; k++) s += pt_ref_bf16_float(g->B[(long)k * g->ldb + j]);
        bad += u_of(cs[j]) != u_of(s);
    }
    return bad;
}

/* The paths to run: every own path the CPU has, and the fallback over each
 * of pt_sgemm's codes (own AVX-512 GEMM where built in, OpenBLAS). */
typedef struct {
    int path, sgemm, bitwise;
    const char *name;
    long chunk; /* the fallback's buffer limit, floats */
} run_path;

static int paths(run_path *out) {
    int n = 0;
    const long big = 1L << 20, small = 32768; /* small: e.g. 24 x 32 x 512 chunks */
    if (pt_gemm_bf16_has_path(PT_BF16_AMX))
        out[n++] = (run_path){PT_BF16_AMX, PT_GEMM_AUTO, 1, "amx_bf16", big};
    if (pt_gemm_bf16_has_path(PT_BF16_AVX512))
        out[n++] = (run_path){PT_BF16_AVX512, PT_GEMM_AUTO, 1, "avx512_bf16", big};
    /* the chunking once, over the own GEMM where there is one (bitwise) */
    int own = pt_sgemm_has_own();
    if (own)
        out[n++] = (run_path){PT_BF16_FALLBACK, PT_GEMM_OWN, 1, "fallback over the own GEMM", big};
    out[n++] = (run_path){PT_BF16_FALLBACK, own ? PT_GEMM_OWN : PT_GEMM_BLAS, own,
                          "fallback in small chunks", small};
    out[n++] = (run_path){PT_BF16_FALLBACK, PT_GEMM_BLAS, 0, "fallback over OpenBLAS", big};
    return n;
}

static void gemm_case(int M, int N, int K, int ta, int tb, double scale) {
    gcase g;
    gcase_init(&g, M, N, K, ta, tb, scale);
    long nc = (long)M * g.ldc;
    float *C = malloc(sizeof(float) * nc), *act = malloc(sizeof(float) * nc);
    float *cs = malloc(sizeof(float) * N), *C1 = NULL, *act1 = NULL, *cs1 = NULL;
    run_path rp[6];
    int np = paths(rp);
    for (int p = 0; p < np; p++) {
        if (rp[p].chunk < (1L << 20) && M * N < 2048 && K <= 512) continue; /* one chunk anyway */
        int old = pt_gemm_bf16_set_path(rp[p].path), olds = pt_sgemm_set_path(rp[p].sgemm);
        long oldc = pt_gemm_bf16_fallback_set_chunk(rp[p].chunk);
        for (int ek = 0; ek < E_N; ek++)
            for (int b = 0; b < (ek == E_ALIAS ? 1 : 2); b++) {
                if (ek == E_COLSUM && tb) continue; /* column sums of B as stored only */
                int bad = 0;
                for (int k = 0; k < NTHREADS; k++) {
                    pt_kernels_set_threads(THREADS[k]);
                    run_case(&g, ek, (float)b, C, act, cs);
                    if (k == 0 || !rp[p].bitwise) {
                        bad += check_case(&g, ek, (float)b, C, act, cs);
                    } else {
                        bad += memcmp(C, C1, sizeof(float) * nc) != 0;
                        bad += memcmp(cs, cs1, sizeof(float) * N) != 0;
                        if (ek == E_BIAS_RES_ACT) {
                            for (long i = 0; i < nc; i++) bad += u_of(act[i]) != u_of(act1[i]);
                        }
                    }
                    if (k == 0) {
                        free(C1), free(act1), free(cs1);
                        C1 = dupf(C, nc), act1 = dupf(act, nc), cs1 = dupf(cs, N);
                    }
                }
                if (bad)
                    fprintf(stderr, "  %s: M %d N %d K %d ta %d tb %d, %s, beta %d: %d wrong\n",
                            rp[p].name, M, N, K, ta, tb, ENAMES[ek], b, bad);
                CHECK_EQ(bad, 0);
            }
        pt_gemm_bf16_set_path(old);
        pt_sgemm_set_path(olds);
        pt_gemm_bf16_fallback_set_chunk(oldc);
    }
    pt_kernels_set_threads(1);
    free(C), free(act), free(cs), free(C1), free(act1), free(cs1);
    gcase_free(&g);
}

static void test_gemm(void) {
    static const int SHAPES[][3] = {
        {1, 1, 1},      {13, 31, 17},  {37, 45, 29}, {70, 64, 96},
        {33, 64, 64},   {50, 400, 67}, /* 2 N blocks, partial panels, few tiles: panels split */
        {30, 40, 801},                 /* 2 K blocks, the second odd */
        {97, 800, 20},                 /* columns per worker at 2 and 3 threads, 3 N blocks at 1 */
        {100, 70, 520},                /* small chunks: 2 of the fallback's in M, N and K */
        {5, 7, 0},                     /* no product: C = res + bias (+ C) */
    };
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++)
        for (int t = 0; t < 4; t++)
            gemm_case(SHAPES[s][0], SHAPES[s][1], SHAPES[s][2], t & 1, t >> 1, 1.0);
}

/* pt_gemm_bf16_kind names the path AUTO takes, and a forced one. */
static void test_kind(void) {
    const char *k = pt_gemm_bf16_kind();
    fprintf(stderr, "  bf16 GEMM on this CPU: %s\n", k);
    CHECK(strcmp(k, pt_gemm_bf16_has_path(PT_BF16_AMX) ? "amx_bf16"
                    : pt_gemm_bf16_has_path(PT_BF16_AVX512)
                        ? "avx512_bf16"
                        : "fallback (fp32 products on converted operands)") == 0);
    int old = pt_gemm_bf16_set_path(PT_BF16_FALLBACK);
    CHECK(strncmp(pt_gemm_bf16_kind(), "fallback", 8) == 0);
    pt_gemm_bf16_set_path(old);
}

int main(void) {
    RUN(test_reference_rounding);
    RUN(test_convert);
    RUN(test_kind);
    RUN(test_gemm);
    return TEST_DONE();
}
