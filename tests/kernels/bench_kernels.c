/* A GPT-2 training step (forward, backward, AdamW) built from the kernels
 * alone, in the manner of llm.c, timed per kernel: the kernels' share of
 * partrain's step, to compare with ../shared/peers/pytorch_gpt_bench.py and to
 * see where the time goes. Not a test: built, never run by ctest.
 *
 *   bench_kernels CONFIG THREADS [STEPS]    CONFIG: tiny | small | gpt2
 *
 * Prints the median step in ms and a breakdown by kernel (summed over steps). */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"

/* GELU and the residual adds are fused into the linears (matmul.c), as in
 * the model (src/model/modules.c): they count under matmul. */
enum { K_ENC, K_LN, K_MM, K_ATT, K_HEAD, K_XENT, K_ADAM, K_ZERO, K_N };
static const char *KNAMES[K_N] = {"encoder", "layernorm", "matmul", "attention",
                                  "lm head", "xent",      "adamw",  "zero grad"};
static double g_t[K_N];
#define TIMED(k, call)                                                                             \
    do {                                                                                           \
        double t0_ = pt_time_s();                                                                  \
        call;                                                                                      \
        g_t[k] += pt_time_s() - t0_;                                                               \
    } while (0)

typedef struct {
    float *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcpw,
        *fcpb, *lnfw, *lnfb;
} params;

static size_t layout(params *p, float *base, int L, int C, int V, int T) {
    size_t sizes[16] = {(size_t)V * C,
                        (size_t)T * C,
                        (size_t)L * C,
                        (size_t)L * C,
                        (size_t)L * C * 3 * C,
                        (size_t)L * 3 * C,
                        (size_t)L * C * C,
                        (size_t)L * C,
                        (size_t)L * C,
                        (size_t)L * C,
                        (size_t)L * C * 4 * C,
                        (size_t)L * 4 * C,
                        (size_t)L * 4 * C * C,
                        (size_t)L * C,
                        (size_t)C,
                        (size_t)C};
    float **ptrs[16] = {&p->wte,   &p->wpe,   &p->ln1w, &p->ln1b, &p->qkvw, &p->qkvb,
                        &p->projw, &p->projb, &p->ln2w, &p->ln2b, &p->fcw,  &p->fcb,
                        &p->fcpw,  &p->fcpb,  &p->lnfw, &p->lnfb};
    size_t off = 0;
    for (int i = 0; i < 16; i++) {
        if (base) *ptrs[i] = base + off;
        off += sizes[i];
    }
    return off;
}

/* Best sgemm GFLOP/s on 1024^3 at the current thread count: the machine's
 * practical peak, to express the step as a fraction of it. */
static double sgemm_peak(void) {
    const int n = 1024;
    float *a = calloc((size_t)n * n, 4), *b = calloc((size_t)n * n, 4),
          *c = calloc((size_t)n * n, 4);
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = pt_time_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double dt = pt_time_s() - t0;
        if (dt < best) best = dt;
    }
    free(a), free(b), free(c);
    return 2.0 * n * n * n / best * 1e-9;
}

int main(int argc, char **argv) {
    const char *cfg = argc > 1 ? argv[1] : "tiny";
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    int steps = argc > 3 ? atoi(argv[3]) : 5;
    int L = 4, C = 256, NH = 8, V = 256, T = 256, B = 8;
    if (!strcmp(cfg, "small")) L = 6, C = 384, NH = 6, V = 256, T = 256, B = 8;
    if (!strcmp(cfg, "gpt2")) L = 12, C = 768, NH = 12, V = 50257, T = 64, B = 4;
    pt_kernels_set_threads(threads);
    int N = B * T;
    params P, G;
    size_t np = layout(&P, NULL, L, C, V, T);
    float *pbuf = malloc(np * sizeof(float)), *gbuf = calloc(np, sizeof(float));
    float *mbuf = calloc(np, sizeof(float)), *vbuf = calloc(np, sizeof(float));
    layout(&P, pbuf, L, C, V, T), layout(&G, gbuf, L, C, V, T);
    for (size_t i = 0; i < np; i++)
        pbuf[i] = 0.02f * ((float)((i * 2654435761u) % 1000) / 500.0f - 1.0f);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < C; i++) P.ln1w[l * C + i] = P.ln2w[l * C + i] = 1.0f;
    /* activations, per layer where backward needs them */
    long NC = (long)N * C;
    float *enc = malloc(NC * 4), *ln1 = malloc(L * NC * 4), *ln1m = malloc(L * N * 4),
          *ln1r = malloc(L * N * 4), *qkv = malloc(L * NC * 3 * 4), *atty = malloc(L * NC * 4),
          *att = malloc((size_t)L * B * NH * T * T * 4), *res2 = malloc(L * NC * 4),
          *ln2 = malloc(L * NC * 4), *ln2m = malloc(L * N * 4), *ln2r = malloc(L * N * 4),
          *fch = malloc(L * NC * 4 * 4), *fcg = malloc(L * NC * 4 * 4), *res3 = malloc(L * NC * 4),
          *lnf = malloc(NC * 4), *lnfm = malloc(N * 4), *lnfr = malloc(N * 4),
          *logits = malloc((size_t)N * V * 4), *losses = malloc(N * 4);
    float *dres = calloc(NC, 4), *dres2 = calloc(NC, 4), *dtmp = calloc(NC, 4),
          *dbig = calloc(NC * 4, 4), *dqkv = calloc(NC * 3, 4), *dattp = calloc(NC, 4);
    float *scratch = malloc(pt_attention_scratch_floats(B, T, C, NH) * 4);
    int *inp = malloc(N * sizeof(int)), *tgt = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) inp[i] = (i * 31) % V, tgt[i] = (i * 17 + 3) % V;
    double *stepms = malloc(sizeof(double) * steps);
    for (int s = -1; s < steps; s++) {
        if (s == 0) memset(g_t, 0, sizeof g_t);
        double t0 = pt_time_s();
        TIMED(K_ZERO, memset(gbuf, 0, np * 4));
        TIMED(K_ENC, pt_encoder_forward(enc, inp, P.wte, P.wpe, B, T, C));
        for (int l = 0; l < L; l++) {
            float *x = l == 0 ? enc : res3 + (l - 1) * NC;
            TIMED(K_LN, pt_layernorm_forward(ln1 + l * NC, ln1m + l * N, ln1r + l * N, x,
                                             P.ln1w + l * C, P.ln1b + l * C, N, C));
            TIMED(K_MM,
                  pt_matmul_forward(qkv + l * NC * 3, ln1 + l * NC, P.qkvw + (long)l * C * 3 * C,
                                    P.qkvb + l * 3 * C, N, C, 3 * C));
            TIMED(K_ATT, pt_attention_forward(atty + l * NC, att + (long)l * B * NH * T * T,
                                              qkv + l * NC * 3, B, T, C, NH));
            TIMED(K_MM, pt_matmul_forward_res(res2 + l * NC, x, atty + l * NC,
                                              P.projw + (long)l * C * C, P.projb + l * C, N, C, C));
            TIMED(K_LN, pt_layernorm_forward(ln2 + l * NC, ln2m + l * N, ln2r + l * N,
                                             res2 + l * NC, P.ln2w + l * C, P.ln2b + l * C, N, C));
            TIMED(K_MM, pt_matmul_gelu_forward(fch + l * NC * 4, fcg + l * NC * 4, ln2 + l * NC,
                                               P.fcw + (long)l * C * 4 * C, P.fcb + l * 4 * C, N, C,
                                               4 * C));
            TIMED(K_MM,
                  pt_matmul_forward_res(res3 + l * NC, res2 + l * NC, fcg + l * NC * 4,
                                        P.fcpw + (long)l * 4 * C * C, P.fcpb + l * C, N, 4 * C, C));
        }
        TIMED(K_LN,
              pt_layernorm_forward(lnf, lnfm, lnfr, res3 + (L - 1) * NC, P.lnfw, P.lnfb, N, C));
        TIMED(K_HEAD, pt_matmul_forward_wt(logits, lnf, P.wte, NULL, N, C, V));
        TIMED(K_XENT,
              pt_softmax_xent_forward_backward(losses, logits, logits, tgt, N, V, 1.0f / N));
        /* backward */
        memset(dres, 0, NC * 4), memset(dtmp, 0, NC * 4);
        TIMED(K_HEAD, pt_matmul_backward_wt(dtmp, G.wte, NULL, logits, lnf, P.wte, N, C, V));
        TIMED(K_LN, pt_layernorm_backward(dres, G.lnfw, G.lnfb, dtmp, res3 + (L - 1) * NC, P.lnfw,
                                          lnfm, lnfr, N, C));
        for (int l = L - 1; l >= 0; l--) {
            float *x = l == 0 ? enc : res3 + (l - 1) * NC;
            /* dres holds d(res3[l]); the _set kernels overwrite their input
             * gradient and the _res LayerNorm adds the residual's, as in
             * the model's block backward: nothing is zeroed first */
            TIMED(K_MM,
                  pt_matmul_backward_gelu_set(dbig, G.fcpw + (long)l * 4 * C * C, G.fcpb + l * C,
                                              dres, fcg + l * NC * 4, P.fcpw + (long)l * 4 * C * C,
                                              fch + l * NC * 4, N, 4 * C, C));
            TIMED(K_MM,
                  pt_matmul_backward_set(dtmp, G.fcw + (long)l * C * 4 * C, G.fcb + l * 4 * C, dbig,
                                         ln2 + l * NC, P.fcw + (long)l * C * 4 * C, N, C, 4 * C));
            TIMED(K_LN, pt_layernorm_backward_res(dres2, dres, G.ln2w + l * C, G.ln2b + l * C, dtmp,
                                                  res2 + l * NC, P.ln2w + l * C, ln2m + l * N,
                                                  ln2r + l * N, N, C));
            TIMED(K_MM,
                  pt_matmul_backward_set(dattp, G.projw + (long)l * C * C, G.projb + l * C, dres2,
                                         atty + l * NC, P.projw + (long)l * C * C, N, C, C));
            TIMED(K_ATT, pt_attention_backward_set(dqkv, scratch, dattp, qkv + l * NC * 3,
                                                   att + (long)l * B * NH * T * T, B, T, C, NH));
            TIMED(K_MM, pt_matmul_backward_set(dtmp, G.qkvw + (long)l * C * 3 * C,
                                               G.qkvb + l * 3 * C, dqkv, ln1 + l * NC,
                                               P.qkvw + (long)l * C * 3 * C, N, C, 3 * C));
            TIMED(K_LN,
                  pt_layernorm_backward_res(dres, dres2, G.ln1w + l * C, G.ln1b + l * C, dtmp, x,
                                            P.ln1w + l * C, ln1m + l * N, ln1r + l * N, N, C));
            (void)x;
        }
        TIMED(K_ENC, pt_encoder_backward(G.wte, G.wpe, dres, inp, B, T, C));
        TIMED(K_ADAM, pt_adamw_update(pbuf, gbuf, mbuf, vbuf, (long)np, 3e-4f, 0.9f, 0.999f, 1e-8f,
                                      0.0f, s + 2, 1.0f));
        if (s >= 0) stepms[s] = (pt_time_s() - t0) * 1e3;
    }
    for (int i = 0; i < steps; i++)
        for (int j = i + 1; j < steps; j++)
            if (stepms[j] < stepms[i]) {
                double t = stepms[i];
                stepms[i] = stepms[j], stepms[j] = t;
            }
    double med = stepms[steps / 2];
    /* model FLOPs of a step: 6 per parameter per token for the matmuls (tied
     * head included, position embedding excluded) plus causal attention's
     * 6 B NH T^2 hs (fwd 2 products of T^2/2 hs multiply-adds each, bwd 4) */
    double flops = 6.0 * (double)(np - (size_t)T * C) * N + 6.0 * L * (double)B * T * T * C;
    double peak = sgemm_peak();
    printf("%s threads=%d params=%zu median step %.1f ms, %.0f tok/s, loss %.3f, %.1f GFLOP/s "
           "(%.0f%% of sgemm peak %.1f)\n",
           cfg, threads, np, med, N / med * 1e3, losses[0], flops / med * 1e-6,
           100.0 * flops / med * 1e-6 / peak, peak);
    for (int k = 0; k < K_N; k++)
        printf("  %-10s %8.2f ms/step\n", KNAMES[k], g_t[k] * 1e3 / steps);
    return 0;
}
