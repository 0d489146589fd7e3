/* Optimizer kernels: the fused AdamW step (one pass over param, grad, m, v;
 * PyTorch 1.13's CPU AdamW makes a separate pass per operation), plain SGD
 * with optional momentum (the scale-sensitive optimizer of the parity tests)
 * and the sum of squares for global-norm clipping.
 *
 * Both split work over the thread pool. pt_sum_squares cuts the input into
 * a fixed number of slices whatever the thread count and adds their partial
 * sums in slice order, so it is bitwise the same at any thread count. */
#include <math.h>

#include "kernels_impl.h"

typedef struct {
    float *param, *m, *v;
    const float *grad;
    long n;
    float lr, beta1, beta2, eps, wd, grad_scale, rbc1, rbc2;
} adamw_ctx;

/* AdamW on elements [lo, hi). */
static inline void adamw_range(const adamw_ctx *c, long lo, long hi) {
    float *restrict param = c->param;
    float *restrict m = c->m;
    float *restrict v = c->v;
    const float *restrict g = c->grad;
    const float b1 = c->beta1, b2 = c->beta2, lr = c->lr, eps = c->eps, wd = c->wd;
    const float gs = c->grad_scale, rbc1 = c->rbc1, rbc2 = c->rbc2;
    for (long i = lo; i < hi; i++) {
        float gi = g[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi * rbc1;
        float vhat = vi * rbc2;
        param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * param[i]);
    }
}

static void adamw_part(void *p, int index, int count) {
    adamw_ctx *c = p;
    long lo, hi;
    pt_split_range(c->n, index, count, &lo, &hi);
    adamw_range(c, lo, hi);
}

static adamw_ctx adamw_setup(float *param, const float *grad, float *m, float *v, long n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, int t,
                             float grad_scale) {
    /* Bias corrections in double: for beta2 = 0.999 and small t, 1 - beta2^t
     * in float loses digits. Multiplying by the reciprocal instead of
     * dividing per element differs from the reference by at most 1 ulp. */
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    adamw_ctx c = {.param = param,
                   .m = m,
                   .v = v,
                   .grad = grad,
                   .n = n,
                   .lr = lr,
                   .beta1 = beta1,
                   .beta2 = beta2,
                   .eps = eps,
                   .wd = weight_decay,
                   .grad_scale = grad_scale,
                   .rbc1 = (float)(1.0 / bc1),
                   .rbc2 = (float)(1.0 / bc2)};
    return c;
}

void pt_adamw_update(float *param, const float *grad, float *m, float *v, long n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int t,
                     float grad_scale) {
    adamw_ctx c =
        adamw_setup(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
    pt_pool_run(adamw_part, &c, n < 32768 ? 1 : pt_kernels_threads());
}

typedef struct {
    float *param, *buf;
    const float *grad;
    long n;
    float lr, momentum, wd, grad_scale;
} sgd_ctx;

static void sgd_part(void *p, int index, int count) {
    const sgd_ctx *c = p;
    long lo, hi;
    pt_split_range(c->n, index, count, &lo, &hi);
    float *restrict param = c->param;
    float *restrict buf = c->buf;
    const float *restrict g = c->grad;
    const float lr = c->lr, mu = c->momentum, wd = c->wd, gs = c->grad_scale;
    if (buf) {
        for (long i = lo; i < hi; i++) {
            float b = mu * buf[i] + (g[i] * gs + wd * param[i]);
            buf[i] = b;
            param[i] -= lr * b;
        }
    } else {
        for (long i = lo; i < hi; i++) param[i] -= lr * (g[i] * gs + wd * param[i]);
    }
}

void pt_sgd_update(float *param, const float *grad, float *buf, long n, float lr, float momentum,
                   float weight_decay, float grad_scale) {
    sgd_ctx c = {param, buf, grad, n, lr, momentum, weight_decay, grad_scale};
    pt_pool_run(sgd_part, &c, n < 32768 ? 1 : pt_kernels_threads());
}

#define SUMSQ_SLICES 64

typedef struct {
    const float *x;
    long n;
    double part[SUMSQ_SLICES];
} sumsq_ctx;

/* Sum of squares in eight float lanes per 1024-element chunk, chunks added in
 * double: vectorizes without -ffast-math (a double accumulator chain does
 * not), with error near float epsilon per chunk. */
static double sumsq_lanes(const float *restrict x, long n) {
    double total = 0.0;
    long i = 0;
    while (i < n) {
        long end = i + 1024 < n ? i + 1024 : n;
        float acc[8] = {0};
        for (; i + 8 <= end; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += x[i + j] * x[i + j];
        for (; i < end; i++) acc[0] += x[i] * x[i];
        double s = 0.0;
        for (int j = 0; j < 8; j++) s += acc[j];
        total += s;
    }
    return total;
}

static void sumsq_part(void *p, int index, int count) {
    sumsq_ctx *c = p;
    for (int s = index; s < SUMSQ_SLICES; s += count) {
        long lo, hi;
        pt_split_range(c->n, s, SUMSQ_SLICES, &lo, &hi);
        c->part[s] = sumsq_lanes(c->x + lo, hi - lo);
    }
}

double pt_sum_squares(const float *x, long n) {
    sumsq_ctx c = {.x = x, .n = n};
    pt_pool_run(sumsq_part, &c, n < 65536 ? 1 : pt_kernels_threads());
    double total = 0.0;
    for (int s = 0; s < SUMSQ_SLICES; s++) total += c.part[s];
    return total;
}

/* AdamW and the sum of squares of grad in one pass: the slices and chunks of
 * pt_sum_squares (so the same bits), each 1024-element chunk summed and then
 * updated while it is in L1. */
typedef struct {
    adamw_ctx a;
    double part[SUMSQ_SLICES];
} adamw_sumsq_ctx;

static void adamw_sumsq_part(void *p, int index, int count) {
    adamw_sumsq_ctx *c = p;
    for (int s = index; s < SUMSQ_SLICES; s += count) {
        long lo, hi;
        pt_split_range(c->a.n, s, SUMSQ_SLICES, &lo, &hi);
        double total = 0.0;
        for (long i = lo; i < hi; i += 1024) {
            long end = i + 1024 < hi ? i + 1024 : hi;
            total += sumsq_lanes(c->a.grad + i, end - i);
            adamw_range(&c->a, i, end);
        }
        c->part[s] = total;
    }
}

double pt_adamw_update_sumsq(float *param, const float *grad, float *m, float *v, long n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, int t,
                             float grad_scale) {
    adamw_sumsq_ctx c = {
        .a = adamw_setup(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t, grad_scale)};
    pt_pool_run(adamw_sumsq_part, &c, n < 65536 ? 1 : pt_kernels_threads());
    double total = 0.0;
    for (int s = 0; s < SUMSQ_SLICES; s++) total += c.part[s];
    return total;
}
