/* Fused softmax + cross-entropy, forward and backward in one kernel. Per
 * row: one pass for the max, one pass that writes exp(l - max) straight into
 * dlogits while summing it, one pass that scales in place and subtracts the
 * one-hot. With dlogits aliasing logits (the trainer's choice) the logits are
 * never copied; PyTorch's log_softmax + nll_loss + their backward make about
 * twice the passes and allocate the (N,V) tensors afresh each step.
 *
 * Rows are split across the thread pool; each row is handled by one worker,
 * so results do not depend on the thread count. */
#include <math.h>

#include "fastmath.h"
#include "kernels_impl.h"

typedef struct {
    float *losses, *dlogits;
    const float *logits;
    const int *targets;
    int N, V;
    float dloss;
} xent_ctx;

/* Sum of x (n) in eight float lanes per 1024-element chunk, chunks added in
 * double: vectorizes without -ffast-math, and keeps the error of a
 * 50257-wide sum near float epsilon. */
static double sum_lanes(const float *restrict x, long n) {
    double total = 0.0;
    long i = 0;
    while (i < n) {
        long end = i + 1024 < n ? i + 1024 : n;
        float acc[8] = {0};
        for (; i + 8 <= end; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += x[i + j];
        for (; i < end; i++) acc[0] += x[i];
        double s = 0.0;
        for (int j = 0; j < 8; j++) s += acc[j];
        total += s;
    }
    return total;
}

static float max_lanes(const float *restrict x, long n) {
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = -INFINITY;
    long i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (; i < n; i++) acc[0] = x[i] > acc[0] ? x[i] : acc[0];
    float m = acc[0];
    for (int j = 1; j < 8; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

static void xent_part(void *p, int index, int count) {
    xent_ctx *c = p;
    long lo, hi;
    long V = c->V;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++) {
        const float *l = c->logits + n * V;
        int tg = c->targets[n];
        float lt = l[tg];
        float maxv = max_lanes(l, V);
        double sum;
        if (c->dlogits) {
            /* dl may alias l: each element is read before it is written. */
            float *dl = c->dlogits + n * V;
            for (long i = 0; i < V; i++) dl[i] = pt_fast_expf(l[i] - maxv);
            sum = sum_lanes(dl, V);
            float scale = (float)(c->dloss / sum);
            for (long i = 0; i < V; i++) dl[i] *= scale;
            dl[tg] -= c->dloss;
        } else {
            sum = 0.0;
            for (long i0 = 0; i0 < V; i0 += 1024) {
                long end = i0 + 1024 < V ? i0 + 1024 : V;
                float acc = 0.0f;
                for (long i = i0; i < end; i++) acc += pt_fast_expf(l[i] - maxv);
                sum += acc;
            }
        }
        c->losses[n] = (float)(log(sum) + maxv - lt);
    }
}

void pt_softmax_xent_forward_backward(float *losses, float *dlogits, const float *logits,
                                      const int *targets, int N, int V, float dloss) {
    xent_ctx c = {.losses = losses,
                  .dlogits = dlogits,
                  .logits = logits,
                  .targets = targets,
                  .N = N,
                  .V = V,
                  .dloss = dloss};
    int nw = (long)N * V < 32768 ? 1 : pt_kernels_threads();
    pt_pool_run(xent_part, &c, nw);
}
