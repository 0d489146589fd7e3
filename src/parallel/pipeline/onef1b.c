/* 1f1b (PipeDream-Flush, Narayanan et al. 2021): rank r runs min(p-r-1, m)
 * warm-up forwards, then alternates one forward and one backward, then the
 * remaining backwards. Its bubble is gpipe's, (p-1) / (m+p-1), but rank r
 * holds only min(p-r, m) micro-batches' activations instead of m.
 *
 * Not here: the split (zb1.c) and interleaved (interleaved.c) variants. */
#include "pipeline_impl.h"

int pt_sched_1f1b(pt_pass *out, int m, int p, int r, int v) {
    (void)v;
    int w = p - r - 1 < m ? p - r - 1 : m, n = 0;
    for (int mb = 0; mb < w; mb++) out[n++] = (pt_pass){PT_PASS_FORWARD, mb, 0};
    for (int mb = 0; mb < m; mb++) {
        if (w + mb < m) out[n++] = (pt_pass){PT_PASS_FORWARD, w + mb, 0};
        out[n++] = (pt_pass){PT_PASS_BACKWARD, mb, 0};
    }
    return n;
}
