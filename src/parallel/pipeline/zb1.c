/* zb1: ZB-H1 of "Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024).
 * 1F1B's order with each backward split into B (input gradient, on the
 * critical path) and W (weight gradients): rank r defers its W's by r
 * micro-batches, so that the W's it still owes fill the cool-down bubble
 * while upstream ranks wait on its B's. Rank r then holds at most
 * (p-r) + r = p micro-batches (1F1B's peak, rank 0's), and the bubble drops
 * from (p-1)(tf+tb+tw) to about (p-1)(tf+tb-tw) per rank.
 *
 * Not here: ZB-H2 (more memory, no bubble) and the V (zbv.c). */
#include "pipeline_impl.h"

int pt_sched_zb1(pt_pass *out, int m, int p, int r, int v) {
    (void)v;
    int w = p - r - 1 < m ? p - r - 1 : m, n = 0, nw = 0;
    for (int mb = 0; mb < w; mb++) out[n++] = (pt_pass){PT_PASS_FORWARD, mb, 0};
    for (int mb = 0; mb < m; mb++) {
        if (w + mb < m) out[n++] = (pt_pass){PT_PASS_FORWARD, w + mb, 0};
        out[n++] = (pt_pass){PT_PASS_BACKWARD_INPUT, mb, 0};
        if (mb - nw >= r) out[n++] = (pt_pass){PT_PASS_BACKWARD_WEIGHT, nw++, 0};
    }
    while (nw < m) out[n++] = (pt_pass){PT_PASS_BACKWARD_WEIGHT, nw++, 0};
    return n;
}
