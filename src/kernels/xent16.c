/* The LM head's cross-entropy for a bf16 model, in blocks of vocabulary
 * columns (kernels.h, "bf16 kernels"), so that the logits are never all in
 * fp32 at once: each block of fp32 logits (the caller's product, in its
 * scratch) updates the rows' running max and sum of exponentials (online
 * softmax) and the target's logit, all from the fp32 values, and is kept
 * in bf16 as l - m, m the running max when the block was seen (<= 0: the
 * largest logits, which carry the softmax, are rounded with the smallest
 * error, 2^-9 |l - m|). The loss is exact in fp32; the gradient is formed
 * from the kept bf16 values, exp(l16 + m_block - max) / sum - onehot.
 *
 * The same phases serve one rank and a vocabulary-parallel group: between
 * _block and _shift tensor parallelism all-gathers the ranks' maxima, and
 * between _shift and _finish it all-reduces the rescaled sums and the
 * target's logit (tp_group.c); at t = 1 neither is needed.
 *
 * Rows are split over the pool; each row's arithmetic is a fixed order
 * (blocks in turn, lanes and 1024-element chunks as fastmath.h's
 * pt_exp_sum_chunked): the same bits at any thread count.
 *
 * Not here: the fp32 cross-entropies (xent.c, vocab_parallel.c). */
#include <math.h>
#include <string.h>

#include "bf16_vec.h"
#include "kernels_impl.h"

enum { M_ = 0, S_ = 1, T_ = 3, NS = 4 }; /* stats per row: max, sum (a double), target */

static double get_sum(const float *st) {
    double s;
    memcpy(&s, st + S_, sizeof s);
    return s;
}
static void set_sum(float *st, double s) {
    memcpy(st + S_, &s, sizeof s);
}

static int workers(long elems) {
    return elems < 32768 ? 1 : pt_kernels_threads();
}

void pt_xent16_begin(float *stats, int N) {
    for (int n = 0; n < N; n++) {
        float *st = stats + (size_t)n * NS;
        st[M_] = -3.0e38f;
        set_sum(st, 0.0);
        st[T_] = 0.0f;
    }
}

typedef struct {
    float *stats, *bmax, *losses;
    pt_bf16 *l16;
    const float *logits, *gmax, *red, *cbmax;
    float *out;
    const int *targets;
    long ldl;
    int N, Vl, c0, nb, blk, nblk, v0, nreal;
    float dloss;
} x16_ctx;

static void block_part(void *p, int index, int count) {
    const x16_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    int real = c->nreal - c->c0;
    real = real < 0 ? 0 : real > c->nb ? c->nb : real;
    for (long n = lo; n < hi; n++) {
        const float *l = c->logits + n * c->ldl;
        float *st = c->stats + n * NS;
        float m = st[M_];
        if (real > 0) {
            float mn = pt_max_lanes(l, real);
            mn = mn > m ? mn : m;
            double s = get_sum(st) * exp((double)m - (double)mn);
            set_sum(st, s + pt_exp_sum_chunked(NULL, l, real, mn));
            st[M_] = m = mn;
            int j = c->targets[n] - c->v0 - c->c0;
            if (j >= 0 && j < real) st[T_] = l[j];
        }
        pt_bf16 *o = c->l16 + n * c->Vl + c->c0;
        int x = 0;
        for (; x + PT_VW <= real; x += PT_VW) pt_v8_store16(o + x, pt_v8_load(l + x) - m);
        for (; x < real; x++) o[x] = pt_bf16_of(l[x] - m);
        memset(o + real, 0, sizeof(pt_bf16) * (size_t)(c->nb - real));
        c->bmax[n * c->nblk + c->blk] = m;
    }
}

void pt_xent16_block(float *stats, pt_bf16 *l16, float *bmax, const float *logits, long ldl,
                     const int *targets, int N, int Vl, int c0, int nb, int blk, int nblk, int v0,
                     int nreal) {
    PT_ASSERT(c0 >= 0 && nb > 0 && c0 + nb <= Vl && blk >= 0 && blk < nblk);
    x16_ctx c = {.stats = stats,
                 .bmax = bmax,
                 .l16 = l16,
                 .logits = logits,
                 .targets = targets,
                 .ldl = ldl,
                 .N = N,
                 .Vl = Vl,
                 .c0 = c0,
                 .nb = nb,
                 .blk = blk,
                 .nblk = nblk,
                 .v0 = v0,
                 .nreal = nreal};
    pt_pool_run(block_part, &c, workers((long)N * nb));
}

void pt_xent16_local_max(float *gmax, const float *stats, int N) {
    for (int n = 0; n < N; n++) gmax[n] = stats[(size_t)n * NS + M_];
}

void pt_xent16_shift(float *red, const float *stats, const float *gmax, int N) {
    for (int n = 0; n < N; n++) {
        const float *st = stats + (size_t)n * NS;
        double s = get_sum(st) * exp((double)st[M_] - (double)gmax[n]);
        float hi = (float)s;
        float *r = red + (size_t)n * NS;
        r[0] = hi;
        r[1] = (float)(s - (double)hi);
        r[2] = st[T_];
        r[3] = 0.0f;
    }
}

static void finish_part(void *p, int index, int count) {
    const x16_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++) {
        const float *r = c->red + n * NS;
        double sum = (double)r[0] + (double)r[1];
        float g = c->gmax[n];
        c->losses[n] = (float)(log(sum) + (double)g - (double)r[2]);
        float inv = (float)(1.0 / sum), dl = c->dloss;
        int tgt = c->targets[n] - c->v0;
        pt_bf16 *d = c->l16 + n * c->Vl;
        /* the target's probability, before its kept value is overwritten */
        int local = tgt >= 0 && tgt < c->nreal;
        float pt =
            local ? pt_fast_expf(pt_f32_of16(d[tgt]) + (c->cbmax[n * c->nblk + tgt / c->nb] - g)) *
                        inv
                  : 0.0f;
        for (int b = 0; b < c->nblk; b++) {
            int j0 = b * c->nb, j1 = j0 + c->nb < c->nreal ? j0 + c->nb : c->nreal;
            float shift = c->cbmax[n * c->nblk + b] - g;
            int x = j0;
            for (; x + PT_VW <= j1; x += PT_VW)
                pt_v8_store16(d + x, pt_v8_exp(pt_v8_load16(d + x) + shift) * inv * dl);
            for (; x < j1; x++)
                d[x] = pt_bf16_of(pt_fast_expf(pt_f32_of16(d[x]) + shift) * inv * dl);
        }
        if (local) d[tgt] = pt_bf16_of((pt - 1.0f) * dl);
        int from = c->nreal > 0 ? c->nreal : 0;
        memset(d + from, 0, sizeof(pt_bf16) * (size_t)(c->Vl - from));
    }
}

void pt_xent16_finish(float *losses, pt_bf16 *l16, const float *bmax, const float *gmax,
                      const float *red, const int *targets, int N, int Vl, int nb, int nblk, int v0,
                      int nreal, float dloss) {
    x16_ctx c = {.losses = losses,
                 .l16 = l16,
                 .cbmax = bmax,
                 .gmax = gmax,
                 .red = red,
                 .targets = targets,
                 .N = N,
                 .Vl = Vl,
                 .nb = nb,
                 .nblk = nblk,
                 .v0 = v0,
                 .nreal = nreal,
                 .dloss = dloss};
    pt_pool_run(finish_part, &c, workers((long)N * Vl));
}
