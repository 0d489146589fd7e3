/* interleaved: Megatron-LM's interleaved 1F1B (Narayanan et al. SC'21;
 * forward_backward_pipelining_with_interleaving). Rank r holds v chunks,
 * chunk c being virtual stage c*p + r. Its m*v chunk-passes run in groups
 * of p micro-batches per chunk: the k-th forward is micro-batch
 * (k / (p*v)) * p + k % p of chunk (k / p) % v, the k-th backward the same
 * micro-batch of chunk v-1 - (k / p) % v. Warm-up: min(2(p-r-1) + (v-1)p,
 * m*v) forwards, then one forward and one backward alternate, then the
 * remaining backwards. m must be a multiple of p (schedule.c checks).
 *
 * Not here: Megatron's communication overlap; the bubble and memory
 * (schedule.c and test_schedule.c count them). */
#include "pipeline_impl.h"

int pt_sched_stage_seq(int p, int r, int c) {
    return c * p + r;
}

int pt_sched_rank_seq(int p, int g, int *c) {
    if (c) *c = g / p;
    return g % p;
}

static pt_pass chunk_pass(int k, int p, int v, int forward) {
    int c = (k % (p * v)) / p, mb = (k / (p * v)) * p + k % p;
    if (forward) return (pt_pass){PT_PASS_FORWARD, mb, c};
    return (pt_pass){PT_PASS_BACKWARD, mb, v - 1 - c};
}

int pt_sched_interleaved(pt_pass *out, int m, int p, int r, int v) {
    int total = m * v, w = 2 * (p - r - 1) + (v - 1) * p, n = 0;
    if (w > total) w = total;
    for (int k = 0; k < w; k++) out[n++] = chunk_pass(k, p, v, 1);
    for (int k = 0; k < total; k++) {
        if (w + k < total) out[n++] = chunk_pass(w + k, p, v, 1);
        out[n++] = chunk_pass(k, p, v, 0);
    }
    return n;
}
