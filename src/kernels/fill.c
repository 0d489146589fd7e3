/* Parameter initialization: w = std * N(0, 1), each element drawn from its
 * own counter (pt_rng_normal_at), split over the thread pool. The draw is a
 * pure function of (key, index), so the bits are the same at any thread
 * count and any split; gpt2's 124 M draws took 4.5 s of its startup on one
 * thread. */
#include "kernels_impl.h"

typedef struct {
    float *w;
    long n;
    uint64_t key, first;
    float std;
} fill_ctx;

static void fill_normal_part(void *p, int index, int count) {
    const fill_ctx *c = p;
    long lo, hi;
    pt_split_range(c->n, index, count, &lo, &hi);
    for (long j = lo; j < hi; j++)
        c->w[j] = c->std * pt_rng_normal_at(c->key, c->first + (uint64_t)j);
}

void pt_fill_normal(float *w, long n, uint64_t key, uint64_t first, float std) {
    fill_ctx c = {w, n, key, first, std};
    pt_pool_run(fill_normal_part, &c, n < 4096 ? 1 : pt_kernels_threads());
}
