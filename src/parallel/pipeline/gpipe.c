/* none and gpipe: the two schedules with no interleaving of micro-batches.
 * none runs each micro-batch's backward right after its forward (one in
 * flight; the whole model on one rank only); gpipe runs every forward, then
 * every backward (m in flight), on any rank of any p: the forwards wait
 * only on upstream, the backwards only on downstream, so it never
 * deadlocks and its bubble is (p-1) / (m+p-1).
 *
 * Not here: the other pipeline schedules. */
#include "pipeline_impl.h"

int pt_sched_none(pt_pass *out, int m, int p, int r, int v) {
    (void)p, (void)r, (void)v; /* one rank, one chunk */
    int n = 0;
    for (int mb = 0; mb < m; mb++) {
        out[n++] = (pt_pass){PT_PASS_FORWARD, mb, 0};
        out[n++] = (pt_pass){PT_PASS_BACKWARD, mb, 0};
    }
    return n;
}

int pt_sched_gpipe(pt_pass *out, int m, int p, int r, int v) {
    (void)p, (void)r, (void)v; /* every rank runs the same order */
    int n = 0;
    for (int mb = 0; mb < m; mb++) out[n++] = (pt_pass){PT_PASS_FORWARD, mb, 0};
    for (int mb = 0; mb < m; mb++) out[n++] = (pt_pass){PT_PASS_BACKWARD, mb, 0};
    return n;
}
