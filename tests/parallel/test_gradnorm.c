/* The global gradient norm over the mesh (parallel.h, gradnorm.c) counts
 * every parameter once: the gradients of a whole model, cut by hand into
 * the slices of t = 2 and 4 tensor-parallel ranks (pt_shard_run), give
 * split and whole parts whose global sum is the whole model's sum of
 * squares; the parts of a ZeRO-like shard of any range add up the same;
 * and pt_grad_sumsq_global over a real tp group of 2 forked ranks (shm)
 * sums the split part only, so the whole tensors are not counted twice. */
#include <math.h>
#include <string.h>

#include "partrain/comm.h"
#include "partrain/parallel.h"
#include "pt_test.h"

static const pt_model_config cfg = {2, 16, 4, 40, 8}; /* L, C, NH, V, T */

/* pt_sum_squares adds 1024-element chunks in 16 float lanes (64 terms per
 * lane) before the double total: a cut in another place moves the result by
 * up to gamma_64 = 64 u relative (u = 2^-24). */
#define SUMSQ_RTOL (64.0 / 16777216.0)

/* The gradient of element j of tensor k: distinct, of varied sizes. */
static float grad_at(int k, size_t j) {
    return (float)sin(0.37 * (double)j + 1.3 * k) * (float)(1 + k % 5);
}

static void fill(pt_model *m) {
    float *g = pt_model_grads(m);
    for (int k = 0; k < pt_model_num_tensors(m); k++) {
        const pt_param_info *p = pt_model_tensor(m, k);
        for (size_t r = 0; r < pt_shard_num_runs(&p->shard); r++) {
            size_t gi, li, len;
            pt_shard_run(&p->shard, r, &gi, &li, &len);
            for (size_t j = 0; j < len; j++) g[p->offset + li + j] = grad_at(k, gi + j);
        }
    }
}

static double whole_sumsq(void) {
    pt_model *w = NULL;
    CHECK_OK(pt_model_new(&w, &cfg, 1));
    if (!w) return 0;
    fill(w);
    double s = 0;
    for (size_t i = 0; i < pt_model_num_params(w); i++)
        s += (double)pt_model_grads(w)[i] * pt_model_grads(w)[i];
    pt_model_free(w);
    return s;
}

static void test_parts_count_once(void) {
    double ref = whole_sumsq();
    for (int t = 2; t <= 4; t *= 2) {
        double split = 0, whole0 = 0;
        for (int r = 0; r < t; r++) {
            pt_model *m = NULL;
            CHECK_OK(pt_model_new_slice(&m, &cfg, 1, t, r));
            if (!m) return;
            fill(m);
            size_t n = pt_model_num_params(m);
            double parts[2];
            pt_grad_sumsq_parts(m, pt_model_grads(m), 0, n, parts);
            split += parts[0];
            if (r == 0) whole0 = parts[1];
            CHECK_NEAR(parts[1], whole0, 0, 1e-15); /* every rank: the same whole tensors */
            /* a shard of any range, cut in three: the same parts in sum */
            double a[2], b[2], c[2];
            size_t x = n / 3 + 1, y = 2 * n / 3 + 5;
            pt_grad_sumsq_parts(m, pt_model_grads(m), 0, x, a);
            pt_grad_sumsq_parts(m, pt_model_grads(m) + x, x, y - x, b);
            pt_grad_sumsq_parts(m, pt_model_grads(m) + y, y, n - y, c);
            CHECK_NEAR(a[0] + b[0] + c[0], parts[0], 0, SUMSQ_RTOL);
            CHECK_NEAR(a[1] + b[1] + c[1], parts[1], 0, SUMSQ_RTOL);
            pt_model_free(m);
        }
        CHECK(whole0 > 0 && split > 0);
        CHECK_NEAR(split + whole0, ref, 0, SUMSQ_RTOL);
        /* counting the whole tensors on every rank would be wrong by this */
        CHECK(fabs(split + t * whole0 - ref) > 100 * SUMSQ_RTOL * ref);
    }
}

static int rank_main(void *arg) {
    (void)arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_new(&world, &o) != PT_OK) return 1;
    int r = pt_comm_rank(world), fail = 0;
    pt_model *m = NULL;
    if (pt_model_new_slice(&m, &cfg, 1, 2, r) != PT_OK) return 1;
    fill(m);
    double parts[2], s = 0, ref = whole_sumsq();
    pt_grad_sumsq_parts(m, pt_model_grads(m), 0, pt_model_num_params(m), parts);
    /* the world as the tp group */
    if (pt_grad_sumsq_global(NULL, world, NULL, parts, &s) != PT_OK) fail = 1;
    if (!(fabs(s - ref) <= SUMSQ_RTOL * ref)) fail = 1;
    /* the world as the shard group of a strategy whose ranks hold halves of
     * the same (tp = 1) gradient: each element once */
    pt_model *w = NULL;
    if (pt_model_new(&w, &cfg, 1) != PT_OK) return 1;
    fill(w);
    size_t n = pt_model_num_params(w), h = n / 2, off = r ? h : 0, len = r ? n - h : h;
    pt_grad_sumsq_parts(w, pt_model_grads(w) + off, off, len, parts);
    if (pt_grad_sumsq_global(world, NULL, NULL, parts, &s) != PT_OK) fail = 1;
    if (!(fabs(s - ref) <= SUMSQ_RTOL * ref)) fail = 1;
    pt_model_free(w);
    pt_model_free(m);
    pt_comm_free(world);
    return fail;
}

static void test_global_over_groups(void) {
    int code = -1;
    pt_comm_options o = {"shm", 20};
    CHECK_OK(pt_launch(2, rank_main, NULL, &o, &code));
    CHECK_EQ(code, 0);
}

int main(void) {
    pt_log_set_level(PT_LOG_WARN);
    RUN(test_parts_count_once);
    RUN(test_global_over_groups);
    return TEST_DONE();
}
