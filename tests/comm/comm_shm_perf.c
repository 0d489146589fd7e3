/* Quick shm timing for development (not a test; `partrain bench comm` is the
 * real benchmark): all-reduce / reduce-scatter / all-gather latency and bus
 * bandwidth (nccl-tests: allreduce busbw = bytes/t * 2(n-1)/n) for 2 ranks.
 *   comm_shm_perf [--nproc N] */
#include "partrain/comm.h"

#include <stdlib.h>
#include <string.h>

static int nproc = 2;

static int rank_main(void *arg) {
    (void)arg;
    pt_comm *w;
    if (pt_comm_new(&w, NULL) != PT_OK) return 2;
    int me = pt_comm_rank(w), n = pt_comm_size(w);
    size_t maxb = (size_t)64 << 20;
    float *buf = pt_mem_alloc(PT_MEM_SCRATCH, maxb);
    for (size_t i = 0; i < maxb / 4; i++) buf[i] = 1e-3f;
    for (size_t bytes = 8; bytes <= maxb; bytes *= 4) {
        size_t count = bytes / 4;
        for (int op = 0; op < 3; op++) {
            int iters = bytes <= 65536 ? 2000 : bytes <= (1 << 22) ? 100 : 20;
            /* min and median of single operations: the min filters out
             * preemption on a loaded machine, the median does not. */
            static double t[2000];
            pt_comm_barrier(w);
            for (int it = 0; it < iters; it++) {
                double t0 = pt_time_s();
                if (op == 0) pt_comm_allreduce(w, buf, count, PT_REDUCE_SUM);
                if (op == 1) pt_comm_reduce_scatter(w, buf, count, PT_REDUCE_SUM);
                if (op == 2) pt_comm_allgather(w, buf, count);
                t[it] = pt_time_s() - t0;
            }
            for (int i = 1; i < iters; i++)
                for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
                    double z = t[j];
                    t[j] = t[j - 1];
                    t[j - 1] = z;
                }
            double best = t[0], med = t[iters / 2];
            double f = op == 0 ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
            if (me == 0)
                printf("%-15s %10zu B  min %9.2f us %7.2f GB/s  median %9.2f us %7.2f GB/s\n",
                       op == 0   ? "allreduce"
                       : op == 1 ? "reduce_scatter"
                                 : "allgather",
                       bytes, best * 1e6, bytes / best * f / 1e9, med * 1e6, bytes / med * f / 1e9);
        }
    }
    pt_mem_free(buf);
    pt_comm_free(w);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--nproc")) nproc = atoi(argv[2]);
    int code = 1;
    if (pt_launch(nproc, rank_main, NULL, NULL, &code) != PT_OK) return 2;
    return code;
}
