/* Helpers the kernel tests share: a deterministic random stream, central
 * differences of a double-precision forward (the gradient checks' oracle,
 * STYLE rule 13), softmax cross-entropy and GELU in double, and GELU's
 * float error.
 *
 * Include after pt_test.h, with KT_SEED defined to the file's seed (each
 * test keeps its own data). */
#ifndef PT_KERNEL_TEST_H
#define PT_KERNEL_TEST_H

#include <math.h>
#include <stdint.h>

#include "pt_test.h"

/* Central differences with h = 1e-5, compared with |analytic - numeric| <=
 * 1e-4 + 1e-3 |numeric| (why these: test_kernels_grad.c's header). */
#define FD_H    1e-5
#define FD_ATOL 1e-4
#define FD_RTOL 1e-3

static uint64_t g_seed = KT_SEED;
static inline double urand(void) { /* xorshift64*, in [-1, 1) */
    g_seed ^= g_seed >> 12;
    g_seed ^= g_seed << 25;
    g_seed ^= g_seed >> 27;
    return (double)((g_seed * 2685821657736338717ULL) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

typedef double (*loss_fn)(void *ctx);

/* Compare analytic (n floats) with central differences of f over x (n doubles
 * that f reads through ctx). Prints the first few mismatches. */
static inline void fd_check(const char *what, double *x, long n, const float *analytic, loss_fn f,
                            void *ctx) {
    int bad = 0;
    double worst = 0.0;
    for (long i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + FD_H;
        double lp = f(ctx);
        x[i] = save - FD_H;
        double lm = f(ctx);
        x[i] = save;
        double num = (lp - lm) / (2 * FD_H);
        double err = fabs(analytic[i] - num);
        if (err > worst) worst = err;
        if (!(err <= FD_ATOL + FD_RTOL * fabs(num))) {
            if (bad < 5)
                fprintf(stderr, "  %s[%ld]: analytic %.8g numeric %.8g\n", what, i, analytic[i],
                        num);
            bad++;
        }
    }
    if (bad) fprintf(stderr, "  %s: %d of %ld wrong (worst abs err %.3g)\n", what, bad, n, worst);
    CHECK(bad == 0);
}

/* GELU (tanh form, written x / (1 + exp(-2u)) as gelu.h does: no 1 + tanh
 * cancellation) and its derivative, exactly in double. */
static inline double gelu_double(double x) {
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}
static inline double gelu_grad_double(double x) {
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    double s = 1.0 / (1.0 + exp(-2.0 * u));
    return s + 2.0 * x * s * (1.0 - s) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

/* gelu(x) in float (gelu.h) against the exact function: relative error
 * ~1e-6 plus ~1.2e-7 |2u| from exp's amplification of its argument's
 * rounding (test_kernels.c's test_gelu checks exactly this bound). */
static inline double gelu_rel_err(double x) {
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 1e-6 + 2e-7 * fabs(2.0 * u);
}

/* dloss * sum over rows n of -log softmax(l[n,:])[tg[n]], l (N,V), in double. */
static inline double xent_loss_double(const double *l, const int *tg, int N, int V, double dloss) {
    double L = 0.0;
    for (int n = 0; n < N; n++) {
        const double *r = l + (long)n * V;
        double mx = -INFINITY, s = 0.0;
        for (int i = 0; i < V; i++) mx = r[i] > mx ? r[i] : mx;
        for (int i = 0; i < V; i++) s += exp(r[i] - mx);
        L += dloss * (log(s) + mx - r[tg[n]]);
    }
    return L;
}

#endif
