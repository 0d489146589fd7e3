/* Vocabulary-parallel embedding and cross-entropy (Megatron's parallel
 * embedding and parallel cross-entropy): the local halves and phases of
 * pt_encoder_forward/backward and pt_softmax_xent_forward_backward when wte
 * is split by vocabulary rows over a tensor-parallel group (contracts in
 * kernels.h). The logits are never gathered: per row, the max, the sum of
 * exponentials and the target's logit are what crosses ranks.
 *
 * Not here: any communication (the caller reduces between the phases), the
 * LM head's product (pt_matmul_forward_wt on the local rows), the split
 * itself (model.h, "sharded tensors"). There is no pt_ref_ version: the
 * oracle is the unsplit kernels composed with hand-made reductions across
 * simulated ranks, and finite differences (tests/kernels/
 * test_vocab_parallel.c).
 *
 * Numerics follow xent.c step for step (pt_max_lanes, pt_exp_sum_chunked,
 * the float scale, the double loss), and this file is built with the same
 * flags, so that t = 1 gives the fused kernel's bits. */
#include <math.h>

#include "fastmath.h"
#include "kernels_impl.h"

/* Below this many elements a parallel split costs more than it saves (as
 * elementwise.c and xent.c). */
#define PAR_MIN_ELEMS 32768L

static int workers_for(long elems) {
    return elems < PAR_MIN_ELEMS ? 1 : pt_kernels_threads();
}

/* ---- masked embedding ---------------------------------------------------- */

typedef struct {
    float *out, *dwte, *dwpe;
    const float *dout, *wte, *wpe;
    const int *inp;
    int B, T, C, v0, Vl;
} vemb_ctx;

/* tok's row in the local slice, or -1 if another rank holds it */
static inline long local_row(int tok, int v0, int Vl) {
    long r = (long)tok - v0;
    return r >= 0 && r < Vl ? r : -1;
}

static void vemb_forward_part(void *p, int index, int count) {
    vemb_ctx *c = p;
    long lo, hi;
    int C = c->C;
    pt_split_range((long)c->B * c->T, index, count, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        float *restrict o = c->out + r * C;
        long row = local_row(c->inp[r], c->v0, c->Vl);
        const float *restrict pe = c->wpe ? c->wpe + (r % c->T) * C : NULL;
        if (row >= 0) {
            const float *restrict we = c->wte + row * C;
            if (pe)
                for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
            else
                for (int i = 0; i < C; i++) o[i] = we[i];
        } else if (pe) {
            for (int i = 0; i < C; i++) o[i] = pe[i];
        } else {
            for (int i = 0; i < C; i++) o[i] = 0.0f;
        }
    }
}

void pt_vocab_embed_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                            int T, int C, int v0, int Vl) {
    vemb_ctx c = {
        .out = out, .inp = inp, .wte = wte, .wpe = wpe, .B = B, .T = T, .C = C, .v0 = v0, .Vl = Vl};
    pt_pool_run(vemb_forward_part, &c, workers_for((long)B * T * C));
}

/* Split by column range, rows in order (as pt_encoder_backward): no races,
 * and each element sums its rows in the unsplit kernel's order. */
static void vemb_backward_part(void *p, int index, int count) {
    vemb_ctx *c = p;
    long lo, hi;
    pt_split_range(c->C, index, count, &lo, &hi);
    long rows = (long)c->B * c->T;
    for (long r = 0; r < rows; r++) {
        const float *restrict d = c->dout + r * c->C;
        long row = local_row(c->inp[r], c->v0, c->Vl);
        if (row >= 0) {
            float *restrict dwe = c->dwte + row * c->C;
            for (long i = lo; i < hi; i++) dwe[i] += d[i];
        }
        if (c->dwpe) {
            float *restrict dpe = c->dwpe + (r % c->T) * c->C;
            for (long i = lo; i < hi; i++) dpe[i] += d[i];
        }
    }
}

void pt_vocab_embed_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                             int T, int C, int v0, int Vl) {
    vemb_ctx c = {.dwte = dwte,
                  .dwpe = dwpe,
                  .dout = dout,
                  .inp = inp,
                  .B = B,
                  .T = T,
                  .C = C,
                  .v0 = v0,
                  .Vl = Vl};
    pt_pool_run(vemb_backward_part, &c, workers_for((long)B * T * C));
}

/* ---- cross-entropy in three phases ---------------------------------------- */

typedef struct {
    float *gmax_out, *stats_out, *losses, *dlogits;
    const float *logits, *gmax, *stats;
    const int *targets;
    int N, Vl, v0, nreal;
    float dloss;
} vxent_ctx;

static int xent_workers(int N, int Vl) {
    return (long)N * Vl < PAR_MIN_ELEMS ? 1 : pt_kernels_threads();
}

static void vxent_max_part(void *p, int index, int count) {
    vxent_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    for (long n = lo; n < hi; n++) c->gmax_out[n] = pt_max_lanes(c->logits + n * c->Vl, c->nreal);
}

void pt_vocab_xent_max(float *gmax, const float *logits, int N, int Vl, int nreal) {
    PT_ASSERT(nreal >= 0 && nreal <= Vl);
    vxent_ctx c = {.gmax_out = gmax, .logits = logits, .N = N, .Vl = Vl, .nreal = nreal};
    pt_pool_run(vxent_max_part, &c, xent_workers(N, Vl));
}

/* s as three floats whose sum in double is s exactly: hi takes s's top 24
 * bits, mid the next 24 of the exact remainder, lo the rest (a double has
 * 53). Each remainder is exact in double (s - fl(s) is representable). */
static inline void split3(double s, float out[3]) {
    float hi = (float)s;
    double r1 = s - (double)hi;
    float mid = (float)r1;
    out[0] = hi;
    out[1] = mid;
    out[2] = (float)(r1 - (double)mid);
}
static inline double join3(const float in[3]) {
    return ((double)in[0] + (double)in[1]) + (double)in[2];
}

static void vxent_sumexp_part(void *p, int index, int count) {
    vxent_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    long Vl = c->Vl;
    for (long n = lo; n < hi; n++) {
        const float *l = c->logits + n * Vl;
        float *st = c->stats_out + n * PT_VOCAB_XENT_STATS;
        long tl = (long)c->targets[n] - c->v0;
        /* read before the exponentials may overwrite it (dlogits == logits) */
        float lt = tl >= 0 && tl < c->nreal ? l[tl] : 0.0f;
        float *dl = c->dlogits ? c->dlogits + n * Vl : NULL;
        split3(pt_exp_sum_chunked(dl, l, c->nreal, c->gmax[n]), st);
        st[3] = lt;
    }
}

void pt_vocab_xent_sumexp(float *stats, float *dlogits, const float *logits, const float *gmax,
                          const int *targets, int N, int Vl, int v0, int nreal) {
    PT_ASSERT(nreal >= 0 && nreal <= Vl);
    vxent_ctx c = {.stats_out = stats,
                   .dlogits = dlogits,
                   .logits = logits,
                   .gmax = gmax,
                   .targets = targets,
                   .N = N,
                   .Vl = Vl,
                   .v0 = v0,
                   .nreal = nreal};
    pt_pool_run(vxent_sumexp_part, &c, xent_workers(N, Vl));
}

static void vxent_finish_part(void *p, int index, int count) {
    vxent_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    long Vl = c->Vl, nreal = c->nreal;
    for (long n = lo; n < hi; n++) {
        const float *st = c->stats + n * PT_VOCAB_XENT_STATS;
        double sum = join3(st);
        float maxv = c->gmax[n], lt = st[3];
        float *dl = c->dlogits ? c->dlogits + n * Vl : NULL;
        if (dl) {
            /* as xent.c: exp * (dloss / sum), then the one-hot */
            float scale = (float)(c->dloss / sum);
            long i = 0;
            for (; i + PT_VW <= nreal; i += PT_VW) pt_v8_store(dl + i, pt_v8_load(dl + i) * scale);
            for (; i < nreal; i++) dl[i] *= scale;
            for (; i < Vl; i++) dl[i] = 0.0f; /* padding: no probability, no gradient */
            long tl = (long)c->targets[n] - c->v0;
            if (tl >= 0 && tl < nreal) dl[tl] -= c->dloss;
        }
        c->losses[n] = (float)(log(sum) + maxv - lt);
    }
}

void pt_vocab_xent_finish(float *losses, float *dlogits, const float *gmax, const float *stats,
                          const int *targets, int N, int Vl, int v0, int nreal, float dloss) {
    PT_ASSERT(nreal >= 0 && nreal <= Vl);
    vxent_ctx c = {.losses = losses,
                   .dlogits = dlogits,
                   .gmax = gmax,
                   .stats = stats,
                   .targets = targets,
                   .N = N,
                   .Vl = Vl,
                   .v0 = v0,
                   .nreal = nreal,
                   .dloss = dloss};
    pt_pool_run(vxent_finish_part, &c, xent_workers(N, Vl));
}
