/* partrain calibrate: the kernels' rates (calibrate_impl.h) -- a streaming
 * copy (memory bandwidth, STREAM's convention), an elementwise pass (GELU),
 * AdamW and SGD per parameter on one thread, on buffers beyond the caches;
 * and the matrix products of the models' linears (pt_matmul_forward) at
 * small, medium and large row counts and every thread count timed, each
 * beside the speed probe on as many cores, with the backward's transposed
 * products' rate against the forward's for the summary.
 *
 * Not here: the modules' passes (calibrate_modules.c). */
#include <stdlib.h>
#include <string.h>

#include "calibrate_impl.h"
#include "partrain/kernels.h"

typedef struct {
    float *a, *b, *c, *d;
    size_t n;
    int t;
} stream_arg;

static void pass_copy(void *arg) {
    stream_arg *s = arg;
    memcpy(s->b, s->a, s->n * sizeof(float));
    __asm__ volatile("" : : "r"(s->b) : "memory"); /* keep the copy */
}
static void pass_gelu(void *arg) {
    stream_arg *s = arg;
    pt_gelu_forward(s->b, s->a, s->n);
}
static void pass_adamw(void *arg) {
    stream_arg *s = arg;
    pt_adamw_update(s->a, s->b, s->c, s->d, (long)s->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++s->t,
                    1.0f);
}
static void pass_sgd(void *arg) {
    stream_arg *s = arg;
    pt_sgd_update(s->a, s->b, s->c, (long)s->n, 1e-4f, 0.9f, 0.0f, 1.0f);
}

pt_status pt_calib_measure_stream(calib *k) {
    size_t n = k->e->stream_floats;
    stream_arg s = {.n = n};
    float **bufs[4] = {&s.a, &s.b, &s.c, &s.d};
    pt_status st = PT_OK;
    for (int i = 0; i < 4; i++) {
        *bufs[i] = pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float));
        if (!*bufs[i])
            st = pt_error_set(PT_ERR_NOMEM, "calibrate: %zu-float buffers", n);
        else
            pt_calib_fill(*bufs[i], n, (uint32_t)i + 1);
    }
    double p0 = 0, p1 = 0;
    if (st == PT_OK) st = pt_calib_probe(k, 1, &p0);
    if (st == PT_OK) {
        pt_kernels_set_threads(1);
        /* STREAM's copy convention: bytes read plus bytes written */
        k->p->memory_bw =
            2.0 * (double)(n * sizeof(float)) / pt_calib_time_min(k->e, pass_copy, &s);
        k->p->elementwise_s = pt_calib_time_min(k->e, pass_gelu, &s) / (double)n;
        memset(s.c, 0, n * sizeof(float));
        memset(s.d, 0, n * sizeof(float));
        k->p->adamw_s = pt_calib_time_min(k->e, pass_adamw, &s) / (double)n;
        k->p->sgd_s = pt_calib_time_min(k->e, pass_sgd, &s) / (double)n;
        st = pt_calib_probe(k, 1, &p1);
        k->probe_stream = 0.5 * (p0 + p1);
    }
    for (int i = 0; i < 4; i++) pt_mem_free(*bufs[i]);
    return st;
}

typedef struct {
    float *out, *inp, *w, *bias;
    int m, n, k;
    int which; /* 0 the forward (NN), 1 the input gradient (NT), 2 the weight gradient (TN) */
} gemm_arg;

static void pass_gemm(void *arg) {
    gemm_arg *g = arg;
    if (g->which == 0)
        pt_matmul_forward(g->out, g->inp, g->w, g->bias, g->m, g->k, g->n);
    else if (g->which == 1)
        pt_matmul_backward_input_set(g->inp, g->out, g->w, g->m, g->k, g->n);
    else
        pt_matmul_backward_weight(g->w, NULL, g->out, g->inp, g->m, g->k, g->n);
}

/* The model's linears for width C and vocabulary V: (k, n) of qkv, attention
 * projection, MLP up, MLP down, LM head. */
static int linear_shapes(const pt_model_config *mc, int kn[5][2]) {
    int C = mc->n_embd;
    int s[5][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, mc->vocab_size}};
    memcpy(kn, s, sizeof s);
    return 5;
}

static pt_status measure_gemm_shape(calib *k, int m, int n, int kk) {
    double flop = 2.0 * m * n * kk;
    if (flop > k->e->gemm_max_flop) return PT_OK;
    for (int i = 0; i < k->p->n_gemm; i++) /* a shape two configs share: once */
        if (k->p->gemm[i].m == m && k->p->gemm[i].n == n && k->p->gemm[i].k == kk) return PT_OK;
    gemm_arg g = {.m = m, .n = n, .k = kk};
    g.out = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)m * n);
    g.inp = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)m * kk);
    g.w = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)kk * n);
    g.bias = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)n);
    pt_status st = PT_OK;
    if (!g.out || !g.inp || !g.w || !g.bias)
        st = pt_error_set(PT_ERR_NOMEM, "calibrate: gemm %dx%dx%d buffers", m, n, kk);
    if (st == PT_OK) {
        pt_calib_fill(g.inp, (size_t)m * kk, 1);
        pt_calib_fill(g.w, (size_t)kk * n, 2);
        pt_calib_fill(g.bias, (size_t)n, 3);
    }
    double p0, p1; /* the probes before and after, on the product's threads */
    for (int t = 0; st == PT_OK && t < k->n_threads; t++) {
        pt_kernels_set_threads(k->threads[t]);
        pt_profile_gemm e = {.m = m, .n = n, .k = kk, .threads = k->threads[t]};
        if ((st = pt_calib_probe(k, k->threads[t], &p0)) != PT_OK) break;
        e.flops_s = flop / pt_calib_time_min(k->e, pass_gemm, &g);
        st = pt_calib_probe(k, k->threads[t], &p1);
        double pe = 0.5 * (p0 + p1);
        if (st == PT_OK)
            st = pt_calib_push((void **)&k->probe_gemm, &k->n_gemm_probed, &k->cap_probe_gemm,
                               sizeof pe, &pe);
        if (st == PT_OK)
            st = pt_calib_push((void **)&k->p->gemm, &k->p->n_gemm, &k->cap_gemm, sizeof e, &e);
        /* the backward's transposed products, at the medium row count on
         * one thread: the profile has no field for them (the modules'
         * bgrad_s and wgrad_s include them); how far they are from the
         * forward's rate goes to the summary */
        for (g.which = 1; st == PT_OK && m == 512 && k->threads[t] == 1 && g.which <= 2;
             g.which++) {
            double r = flop / pt_calib_time_min(k->e, pass_gemm, &g) / e.flops_s;
            double *lo = &k->c->transpose_lo[g.which - 1], *hi = &k->c->transpose_hi[g.which - 1];
            if (*lo == 0 || r < *lo) *lo = r;
            if (r > *hi) *hi = r;
        }
        g.which = 0;
    }
    pt_mem_free(g.bias);
    pt_mem_free(g.w);
    pt_mem_free(g.inp);
    pt_mem_free(g.out);
    return st;
}

pt_status pt_calib_measure_gemm(calib *k, const pt_model_config *models, int n_models) {
    /* small, medium and large row counts: a short micro-batch to a long one */
    static const int rows_full[] = {128, 512, 2048}, rows_quick[] = {128, 512};
    const int *rows = k->e->quick ? rows_quick : rows_full;
    int n_rows = k->e->quick ? 2 : 3;
    for (int mi = 0; mi < n_models; mi++) {
        int kn[5][2];
        int ns = linear_shapes(&models[mi], kn);
        for (int r = 0; r < n_rows; r++)
            for (int s = 0; s < ns; s++)
                PT_CHECK(measure_gemm_shape(k, rows[r], kn[s][1], kn[s][0]));
    }
    return PT_OK;
}
