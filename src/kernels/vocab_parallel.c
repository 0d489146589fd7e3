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
#include <string.h>

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
    float *lmax_out, *gmax_out, *stats_out, *losses, *dlogits;
    const float *logits, *lmax, *gmax, *stats;
    const int *targets;
    int N, Vl, v0, nreal;
    float dloss;
} vxent_ctx;

static int xent_workers(int N, int Vl) {
    return (long)N * Vl < PAR_MIN_ELEMS ? 1 : pt_kernels_threads();
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

/* Phase 1's stash in a row of stats, until phase 2 replaces it with what
 * is reduced: the local sum (double) and the target's logit. */
typedef struct {
    double sum;
    float target, unused;
} vxent_stash;
_Static_assert(sizeof(vxent_stash) == PT_VOCAB_XENT_STATS * sizeof(float), "stash size");

/* Per row, xent.c's first two passes (the row stays in cache for the
 * second): the local max, then exp(l - max) summed and, with dlogits,
 * stored. */
static void vxent_local_part(void *p, int index, int count) {
    vxent_ctx *c = p;
    long lo, hi;
    pt_split_range(c->N, index, count, &lo, &hi);
    long Vl = c->Vl;
    for (long n = lo; n < hi; n++) {
        const float *l = c->logits + n * Vl;
        if (n + 2 < hi && Vl <= 4096) /* as xent.c: short rows, fetch ahead */
            for (long i = 0; i < Vl; i += 16) __builtin_prefetch(l + 2 * Vl + i, 1);
        long tl = (long)c->targets[n] - c->v0;
        vxent_stash h = {0.0, 0.0f, 0.0f};
        /* read before the exponentials may overwrite it (dlogits == logits) */
        h.target = tl >= 0 && tl < c->nreal ? l[tl] : 0.0f;
        float maxv = pt_max_lanes(l, c->nreal);
        h.sum = pt_exp_sum_chunked(c->dlogits ? c->dlogits + n * Vl : NULL, l, c->nreal, maxv);
        c->lmax_out[n] = c->gmax_out[n] = maxv;
        memcpy(c->stats_out + n * PT_VOCAB_XENT_STATS, &h, sizeof h);
    }
}

void pt_vocab_xent_local(float *lmax, float *gmax, float *stats, float *dlogits,
                         const float *logits, const int *targets, int N, int Vl, int v0,
                         int nreal) {
    PT_ASSERT(nreal >= 0 && nreal <= Vl);
    vxent_ctx c = {.lmax_out = lmax,
                   .gmax_out = gmax,
                   .stats_out = stats,
                   .dlogits = dlogits,
                   .logits = logits,
                   .targets = targets,
                   .N = N,
                   .Vl = Vl,
                   .v0 = v0,
                   .nreal = nreal};
    pt_pool_run(vxent_local_part, &c, xent_workers(N, Vl));
}

/* e^(local max - global max): 1 at t = 1 and on the rank of the max,
 * without libm's exp there (a row's exp was 40 us of the small config's
 * 0.4 ms at t = 2) */
static inline double to_global(float lmax, float gmax) {
    return lmax == gmax ? 1.0 : exp((double)lmax - (double)gmax);
}

void pt_vocab_xent_rescale(float *stats, const float *lmax, const float *gmax, int N) {
    for (long n = 0; n < N; n++) {
        float *st = stats + n * PT_VOCAB_XENT_STATS;
        vxent_stash h;
        memcpy(&h, st, sizeof h);
        split3(h.sum * to_global(lmax[n], gmax[n]), st);
        st[3] = h.target;
    }
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
            if (n + 2 < hi && Vl <= 4096)
                for (long i = 0; i < Vl; i += 16) __builtin_prefetch(dl + 2 * Vl + i, 1);
            /* as xent.c: exp * (dloss / sum), the exponentials taken from the
             * local max and brought to the global one in the scale (t = 1:
             * dloss * 1 / sum, xent.c's scale), then the one-hot */
            float scale = (float)(c->dloss * to_global(c->lmax[n], maxv) / sum);
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

void pt_vocab_xent_finish(float *losses, float *dlogits, const float *lmax, const float *gmax,
                          const float *stats, const int *targets, int N, int Vl, int v0, int nreal,
                          float dloss) {
    PT_ASSERT(nreal >= 0 && nreal <= Vl);
    vxent_ctx c = {.losses = losses,
                   .dlogits = dlogits,
                   .lmax = lmax,
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
