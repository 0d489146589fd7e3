/* bench_step: the time of one partrain training step (single worker), as the
 * trainer takes it: pt_trainer_step_batch = zero grads + forward + backward +
 * grad norm + AdamW, on random tokens, for the three benchmark configs that
 * ../shared/peers/pytorch_gpt_bench.py also runs (same CONFIGS table, same
 * optimizer: AdamW lr 3e-4, betas (0.9, 0.999), weight decay 0; clipping off,
 * as the peer does not clip). Run by hand (bench/run_step_bench.sh runs it
 * beside the peer); not a test.
 *
 *   bench_step [--config tiny|small|gpt2] [--threads N] [--warmup W]
 *              [--steps S] [--peak-n N] [--precision fp32|bf16] [--fallback] [--json]
 *
 * --precision bf16: train.precision = bf16 (the peer's --precision bf16 is
 * torch.autocast); the activation peak (PT_MEM_ACTS) is reported for
 * either, to compare the two. --fallback: the bf16 products on the
 * fallback (fp32 products on converted operands), as on a CPU without
 * AVX512_BF16 or AMX.
 *
 * Reports the median ms/step over S timed steps after W warm-up steps,
 * tokens/s, achieved GFLOP/s and its fraction of this machine's sgemm peak,
 * measured in the same process at the same thread count (best of a few
 * cblas_sgemm calls on N x N matrices, N = 2048 by default, before and after
 * the steps: on a shared machine either can catch a busy moment). The
 * process's CPU time per step is reported too: CPU ms / (wall ms x threads)
 * well below 1 means the neighbours took the cores during the step.
 *
 * FLOPs per step are counted from the architecture, not measured (a
 * multiply-add is 2 FLOPs; backward is twice the forward):
 *   linears   6 * (non-embedding params) * B*T       (Kaplan et al.'s 6N:
 *             every weight is a multiply-add per token in forward, two in
 *             backward; biases and LayerNorm are in that count too, <1%)
 *   LM head   6 * B*T * C * V                         (tied to wte)
 *   attention 12 * L * B * T^2 * C: per layer and head, QK^T and PV are
 *             2*T^2*hs each forward, and backward needs four such products.
 *             This is the FULL T x T, the work PyTorch's unmasked attention
 *             does; partrain's causal kernel skips most of the masked half,
 *             so its own count would be about half of this term. Counting the
 *             full square keeps the two systems' GFLOP/s comparable.
 *   Elementwise work (LayerNorm, GELU, softmax, AdamW) is not counted. */
#include <cblas.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"
#include "partrain/train.h"
#include "../src/kernels/bf16_impl.h" /* pt_gemm_bf16_set_path */

typedef struct {
    const char *name;
    int n_layer, n_embd, n_head, vocab, T, B;
} bench_config;

/* The peer's CONFIGS: name: (n_layer, n_embd, n_head, vocab, T, B). */
static const bench_config CONFIGS[] = {
    {"tiny", 4, 256, 8, 256, 256, 8},
    {"small", 6, 384, 6, 256, 256, 8},
    {"gpt2", 12, 768, 12, 50257, 64, 4},
};
#define NCONFIGS (int)(sizeof CONFIGS / sizeof CONFIGS[0])

typedef struct {
    double linear, head, attention, total;
} step_flops;

static step_flops count_flops(const bench_config *c, size_t n_params) {
    double L = c->n_layer, C = c->n_embd, V = c->vocab, T = c->T, B = c->B, N = B * T;
    double non_embedding = (double)n_params - V * C - T * C;
    step_flops f;
    f.linear = 6.0 * non_embedding * N;
    f.head = 6.0 * N * C * V;
    f.attention = 12.0 * L * B * T * T * C;
    f.total = f.linear + f.head + f.attention;
    return f;
}

/* Best GFLOP/s of cblas_sgemm on n x n matrices at the current BLAS thread
 * count: one untimed call, then `reps` timed ones. The best, not the median:
 * a peak is what the machine can do when nothing else runs. */
static double sgemm_peak_gflops(int n, int reps) {
    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)),
          *c = malloc(nn * sizeof(float));
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return 0;
    }
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 17) * 0.01f - 0.08f;
        b[i] = (float)(i % 13) * 0.01f - 0.06f;
        c[i] = 0;
    }
    double best = 0;
    for (int r = -1; r < reps; r++) {
        double t0 = pt_time_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c,
                    n);
        double dt = pt_time_s() - t0;
        double g = 2.0 * n * (double)n * n / dt / 1e9;
        if (r >= 0 && g > best) best = g;
    }
    free(a), free(b), free(c);
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_step [--config tiny|small|gpt2] [--threads N] [--warmup W] "
               "[--steps S] [--peak-n N] [--precision fp32|bf16] [--fallback] [--json]\n");
}

static int parse_int(const char *flag, const char *v, int lo, int *out) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < lo || x > 1000000) {
        fprintf(stderr, "bench_step: %s needs an integer >= %d\n", flag, lo);
        return -1;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv) {
    const char *cname = "tiny";
    const char *precision = "fp32";
    int threads = 1, warmup = 3, steps = 10, peak_n = 2048, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--config") && v)
            cname = v, i++;
        else if (!strcmp(a, "--threads"))
            rc = parse_int(a, v, 1, &threads), i++;
        else if (!strcmp(a, "--warmup"))
            rc = parse_int(a, v, 0, &warmup), i++;
        else if (!strcmp(a, "--steps"))
            rc = parse_int(a, v, 1, &steps), i++;
        else if (!strcmp(a, "--peak-n"))
            rc = parse_int(a, v, 64, &peak_n), i++;
        else if (!strcmp(a, "--precision") && v && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
            precision = v, i++;
        else if (!strcmp(a, "--fallback"))
            pt_gemm_bf16_set_path(PT_BF16_FALLBACK);
        else if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "bench_step: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (rc) return 2;
    }
    const bench_config *bc = NULL;
    for (int i = 0; i < NCONFIGS; i++)
        if (!strcmp(CONFIGS[i].name, cname)) bc = &CONFIGS[i];
    if (!bc) {
        fprintf(stderr, "bench_step: unknown config '%s' (tiny, small, gpt2)\n", cname);
        return 2;
    }
    pt_log_set_level(PT_LOG_WARN);

    pt_config cfg;
    pt_config_defaults(&cfg);
    cfg.model = (pt_model_config){bc->n_layer, bc->n_embd, bc->n_head, bc->vocab, bc->T};
    cfg.data.train[0] = cfg.data.val[0] = '\0';
    cfg.train.batch_size = bc->B;
    cfg.train.steps = warmup + steps;
    cfg.train.warmup_steps = 0;
    cfg.train.lr = cfg.train.min_lr = 3e-4; /* constant, as the peer's AdamW */
    cfg.train.weight_decay = 0.0;
    cfg.train.beta1 = 0.9;
    cfg.train.beta2 = 0.999; /* torch.optim.AdamW's default */
    cfg.train.grad_clip = 0.0;
    cfg.train.threads = threads;
    snprintf(cfg.train.precision, sizeof cfg.train.precision, "%s", precision);

    pt_trainer *tr = NULL;
    if (pt_trainer_new(&tr, &cfg) != PT_OK) {
        fprintf(stderr, "bench_step: %s\n", pt_error_message());
        return 1;
    }
    /* Same BLAS thread count as the step: pt_trainer_new set it. */
    double peak = sgemm_peak_gflops(peak_n, 5);

    size_t n_params = pt_model_num_params(pt_trainer_model(tr));
    step_flops fl = count_flops(bc, n_params);
    int ntok = bc->B * bc->T;
    int *inputs = malloc((size_t)ntok * sizeof(int)), *targets = malloc((size_t)ntok * sizeof(int));
    double *ms = malloc((size_t)steps * sizeof(double)),
           *cpu = malloc((size_t)steps * sizeof(double));
    if (!inputs || !targets || !ms || !cpu) {
        fprintf(stderr, "bench_step: out of memory\n");
        return 1;
    }
    pt_rng rng;
    pt_rng_init(&rng, 42, "bench_step.tokens");
    float loss_first = 0, loss_last = 0;
    for (int s = 0; s < warmup + steps; s++) {
        /* Fresh random (B, T+1) windows per step, outside the timed region. */
        for (int b = 0; b < bc->B; b++) {
            int prev = (int)pt_rng_below(&rng, (uint64_t)bc->vocab);
            for (int t = 0; t < bc->T; t++) {
                int next = (int)pt_rng_below(&rng, (uint64_t)bc->vocab);
                inputs[b * bc->T + t] = prev;
                targets[b * bc->T + t] = next;
                prev = next;
            }
        }
        pt_step_info info;
        double c0 = cpu_ms();
        uint64_t t0 = pt_time_ns();
        pt_status st = pt_trainer_step_batch(tr, inputs, targets, &info);
        double dt = (double)(pt_time_ns() - t0) / 1e6, dc = cpu_ms() - c0;
        if (st != PT_OK) {
            fprintf(stderr, "bench_step: step %d: %s\n", s, pt_error_message());
            return 1;
        }
        if (s == 0) loss_first = info.loss;
        loss_last = info.loss;
        if (s >= warmup) ms[s - warmup] = dt, cpu[s - warmup] = dc;
    }
    double peak2 = sgemm_peak_gflops(peak_n, 5);
    if (peak2 > peak) peak = peak2;
    double *sorted = malloc((size_t)steps * sizeof(double));
    if (!sorted) return 1;
    memcpy(sorted, ms, (size_t)steps * sizeof(double));
    double med = median(sorted, steps), cpu_med = median(cpu, steps);
    double cpu_share = cpu_med / (med * threads);
    double tok_s = ntok / (med / 1e3);
    double gflops = fl.total / (med / 1e3) / 1e9;
    double frac = peak > 0 ? gflops / peak : 0;
    double acts_mib = (double)pt_mem_peak(PT_MEM_ACTS) / 1048576.0;

    if (json) {
        printf("{\"system\": \"partrain\", \"bf16_kind\": \"%s\", \"precision\": \"%s\", "
               "\"acts_peak_mib\": %.2f, "
               "\"config\": \"%s\", \"threads\": %d, \"n_layer\": %d, "
               "\"n_embd\": %d, \"n_head\": %d, \"vocab\": %d, \"T\": %d, \"B\": %d, "
               "\"n_params\": %zu, \"flops_per_step\": %.6e, \"flops_linear\": %.6e, "
               "\"flops_head\": %.6e, \"flops_attention_full\": %.6e, \"warmup\": %d, "
               "\"steps\": %d, \"step_ms_median\": %.3f, \"step_ms_min\": %.3f, "
               "\"step_ms_max\": %.3f, \"step_ms_all\": [",
               pt_gemm_bf16_kind(), precision, acts_mib, bc->name, threads, bc->n_layer, bc->n_embd,
               bc->n_head, bc->vocab, bc->T, bc->B, n_params, fl.total, fl.linear, fl.head,
               fl.attention, warmup, steps, med, sorted[0], sorted[steps - 1]);
        for (int i = 0; i < steps; i++) printf("%s%.1f", i ? ", " : "", ms[i]);
        printf("], \"tokens_per_s\": %.1f, \"gflops\": %.2f, \"sgemm_peak_gflops\": %.2f, "
               "\"sgemm_peak_n\": %d, \"peak_fraction\": %.4f, \"loss_first\": %.4f, "
               "\"loss_last\": %.4f, \"cpu_ms_median\": %.3f, \"cpu_share\": %.3f}\n",
               tok_s, gflops, peak, peak_n, frac, (double)loss_first, (double)loss_last, cpu_med,
               cpu_share);
    } else {
        printf("partrain %s (%s): L=%d C=%d NH=%d V=%d T=%d B=%d, %zu params, threads %d\n",
               bc->name, precision, bc->n_layer, bc->n_embd, bc->n_head, bc->vocab, bc->T, bc->B,
               n_params, threads);
        printf("  FLOPs/step %.3f G (linears %.3f + LM head %.3f + attention, full T^2, %.3f)\n",
               fl.total / 1e9, fl.linear / 1e9, fl.head / 1e9, fl.attention / 1e9);
        printf("  step median %.1f ms (min %.1f, max %.1f, %d steps after %d warm-up)\n", med,
               sorted[0], sorted[steps - 1], steps, warmup);
        printf("  %.0f tokens/s, %.1f GFLOP/s = %.1f%% of sgemm peak %.1f GFLOP/s (%dx%d)\n", tok_s,
               gflops, 100 * frac, peak, peak_n, peak_n);
        printf("  CPU time %.1f ms/step = %.0f%% of %d thread(s) x wall\n", cpu_med,
               100 * cpu_share, threads);
        printf("  loss %.4f -> %.4f\n", (double)loss_first, (double)loss_last);
        printf("  activation peak %.1f MiB; bf16 product: %s\n", acts_mib, pt_gemm_bf16_kind());
    }
    free(sorted), free(cpu), free(ms), free(inputs), free(targets);
    pt_trainer_free(tr);
    return 0;
}
