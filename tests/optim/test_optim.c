/* Optimizer tests: the LR schedule's shape, clipping scale, AdamW and SGD
 * (with and without momentum) against double-precision scalar oracles (with
 * and without weight decay per segment), and segment validation. */
#include <math.h>
#include <string.h>

#include "partrain/optim.h"
#include "pt_test.h"

static void test_schedule(void) {
    CHECK_NEAR(pt_lr_schedule(0, 100, 10, 1e-3f, 1e-4f), 1e-4, 1e-9, 0);
    CHECK_NEAR(pt_lr_schedule(4, 100, 10, 1e-3f, 1e-4f), 5e-4, 1e-9, 0);
    CHECK_NEAR(pt_lr_schedule(9, 100, 10, 1e-3f, 1e-4f), 1e-3, 1e-9, 0);
    CHECK_NEAR(pt_lr_schedule(10, 100, 10, 1e-3f, 1e-4f), 1e-3, 1e-9, 0);
    CHECK_NEAR(pt_lr_schedule(99, 100, 10, 1e-3f, 1e-4f), 1e-4, 1e-9, 0);
    CHECK_NEAR(pt_lr_schedule(200, 100, 10, 1e-3f, 1e-4f), 1e-4, 1e-9, 0);
    /* halfway through the decay: the mean of lr and min_lr */
    CHECK_NEAR(pt_lr_schedule(10 + 89 / 2, 100, 10, 1e-3f, 0), 0.5e-3, 2e-5, 0);
    int mono = 1;
    for (int s = 11; s < 100; s++)
        if (pt_lr_schedule(s, 100, 10, 1e-3f, 1e-4f) > pt_lr_schedule(s - 1, 100, 10, 1e-3f, 1e-4f))
            mono = 0;
    CHECK(mono);
    CHECK_NEAR(pt_lr_schedule(0, 1, 0, 1e-3f, 1e-4f), 1e-3, 1e-9, 0);
}

static void test_clip(void) {
    CHECK_NEAR(pt_optim_clip_scale(25.0, 1.0f), 0.2, 1e-7, 0);
    CHECK(pt_optim_clip_scale(0.25, 1.0f) == 1.0f);
    CHECK(pt_optim_clip_scale(1e6, 0.0f) == 1.0f);
    float g[3] = {3, 4, 0};
    /* partial norms of shards add up to the whole */
    CHECK_NEAR(pt_optim_grad_sumsq(g, 1) + pt_optim_grad_sumsq(g + 1, 2), 25.0, 1e-9, 0);
}

static void test_adamw(void) {
    enum { N = 6 };
    pt_optim_segment segs[2] = {{0, 4, 1}, {4, 2, 0}};
    pt_adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f, PT_OPTIM_ADAMW, 0};
    pt_adamw *o = NULL;
    CHECK_OK(pt_adamw_new(&o, N, segs, 2, &hp));
    if (!o) return;
    float p[N] = {0.5f, -0.25f, 1.0f, 2.0f, -1.0f, 0.125f};
    double pd[N], md[N] = {0}, vd[N] = {0};
    for (int i = 0; i < N; i++) pd[i] = p[i];
    for (int t = 1; t <= 5; t++) {
        float g[N];
        for (int i = 0; i < N; i++) g[i] = (float)(0.1 * (i + 1) * (t % 2 ? 1 : -1));
        float scale = 0.5f, lr = 1e-2f;
        pt_adamw_step(o, p, g, lr, scale);
        for (int i = 0; i < N; i++) {
            double gi = (double)g[i] * scale;
            md[i] = 0.9 * md[i] + 0.1 * gi;
            vd[i] = 0.95 * vd[i] + 0.05 * gi * gi;
            double mh = md[i] / (1 - pow(0.9, t)), vh = vd[i] / (1 - pow(0.95, t));
            double wd = i < 4 ? 0.1 : 0.0;
            pd[i] -= lr * (mh / (sqrt(vh) + 1e-8) + wd * pd[i]);
        }
    }
    for (int i = 0; i < N; i++) CHECK_NEAR(p[i], pd[i], 1e-5, 1e-5);
    CHECK_EQ(pt_adamw_t(o), 5);
    CHECK_EQ(pt_adamw_size(o), N);
    CHECK(pt_adamw_m(o)[0] != 0 && pt_adamw_v(o)[5] != 0);
    pt_adamw_free(o);
    pt_adamw_free(NULL);
}

/* SGD (train.optimizer = sgd) against a double-precision oracle, with and
 * without momentum: PyTorch's rule with dampening 0, L2 weight decay only on
 * the decayed segment; without momentum it keeps no state at all, and the
 * fused norm pass returns the gradient's sum of squares. */
static void test_sgd(void) {
    enum { N = 6 };
    pt_optim_segment segs[2] = {{0, 4, 1}, {4, 2, 0}};
    for (int withm = 0; withm <= 1; withm++) {
        float mu = withm ? 0.9f : 0.0f;
        pt_adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f, PT_OPTIM_SGD, mu};
        CHECK_EQ(pt_optim_state_count(&hp), withm);
        pt_adamw *o = NULL;
        CHECK_OK(pt_adamw_new(&o, N, segs, 2, &hp));
        if (!o) return;
        CHECK_EQ(pt_mem_current(PT_MEM_OPTIM), withm ? N * sizeof(float) : 0);
        CHECK(pt_adamw_v(o) == NULL && (pt_adamw_m(o) != NULL) == withm);
        CHECK(pt_adamw_kind(o) == PT_OPTIM_SGD);
        float p[N] = {0.5f, -0.25f, 1.0f, 2.0f, -1.0f, 0.125f};
        double pd[N], bd[N] = {0};
        for (int i = 0; i < N; i++) pd[i] = p[i];
        for (int t = 1; t <= 5; t++) {
            float g[N];
            for (int i = 0; i < N; i++) g[i] = (float)(0.1 * (i + 1) * (t % 2 ? 1 : -1));
            float scale = t == 5 ? 1.0f : 0.5f, lr = 1e-1f;
            double sq = 0;
            if (t == 5) {
                sq = pt_adamw_step_sumsq(o, p, g, lr);
                double want = 0;
                for (int i = 0; i < N; i++) want += (double)g[i] * g[i];
                CHECK_NEAR(sq, want, 1e-12, 1e-6);
            } else {
                pt_adamw_step(o, p, g, lr, scale);
            }
            for (int i = 0; i < N; i++) {
                double wd = i < 4 ? 0.1 : 0.0;
                double d = (double)g[i] * scale + wd * pd[i];
                bd[i] = withm ? mu * bd[i] + d : d;
                pd[i] -= lr * bd[i];
            }
        }
        for (int i = 0; i < N; i++) CHECK_NEAR(p[i], pd[i], 1e-6, 1e-6);
        CHECK_EQ(pt_adamw_t(o), 5);
        pt_adamw_free(o);
    }
    CHECK_EQ(pt_mem_current(PT_MEM_OPTIM), 0);
}

static void test_segments(void) {
    pt_adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f, PT_OPTIM_ADAMW, 0};
    pt_optim_segment gap[2] = {{0, 4, 1}, {5, 2, 0}};
    pt_adamw *o = NULL;
    CHECK(pt_adamw_new(&o, 7, gap, 2, &hp) == PT_ERR_INVALID && o == NULL);
    pt_optim_segment shortseg[1] = {{0, 4, 1}};
    CHECK(pt_adamw_new(&o, 7, shortseg, 1, &hp) == PT_ERR_INVALID && o == NULL);
    CHECK_EQ(pt_mem_current(PT_MEM_OPTIM), 0);
}

/* A skipped range (a pipeline's tied wte rows another stage updates):
 * its parameters and state untouched, every other element bitwise what a
 * step without the skip gives, across segment boundaries; the sum of
 * squares leaves it out. AdamW and SGD with momentum. */
static void test_skip(void) {
    enum { N = 40 };
    pt_optim_segment segs[3] = {{0, 10, 1}, {10, 20, 0}, {30, 10, 1}};
    for (int kind = 0; kind < 2; kind++) {
        pt_adamw_hparams hp = {0.9f, 0.95f, 1e-8f, 0.1f, kind ? PT_OPTIM_SGD : PT_OPTIM_ADAMW,
                               0.9f};
        pt_adamw *a = NULL, *b = NULL;
        CHECK_OK(pt_adamw_new(&a, N, segs, 3, &hp));
        CHECK_OK(pt_adamw_new(&b, N, segs, 3, &hp));
        pt_adamw_set_skip(b, 7, 26); /* [7, 33): into the first segment, past the second */
        size_t off, n;
        pt_adamw_skip(b, &off, &n);
        CHECK(off == 7 && n == 26);
        float pa[N], pb[N], g[N];
        for (int i = 0; i < N; i++) pa[i] = pb[i] = 0.1f * (float)(i - 20), g[i] = 0.01f * (i % 7);
        double whole = 0, rest = 0;
        for (int step = 0; step < 3; step++) {
            pt_adamw_step(a, pa, g, 1e-2f, 0.5f);
            whole = pt_adamw_step_sumsq(a, pa, g, 1e-2f);
            pt_adamw_step(b, pb, g, 1e-2f, 0.5f);
            rest = pt_adamw_step_sumsq(b, pb, g, 1e-2f);
        }
        double want = 0;
        for (int i = 0; i < N; i++)
            if (i < 7 || i >= 33) want += (double)g[i] * g[i];
        CHECK_NEAR(rest, want, 1e-9, 1e-6);
        CHECK(whole > rest);
        for (int i = 0; i < N; i++) {
            int skipped = i >= 7 && i < 33;
            CHECK(skipped ? pb[i] == 0.1f * (float)(i - 20) : pb[i] == pa[i]);
            CHECK(skipped ? pt_adamw_m(b)[i] == 0 : pt_adamw_m(b)[i] == pt_adamw_m(a)[i]);
        }
        pt_adamw_free(a);
        pt_adamw_free(b);
    }
}

int main(void) {
    RUN(test_schedule);
    RUN(test_skip);
    RUN(test_clip);
    RUN(test_adamw);
    RUN(test_sgd);
    RUN(test_segments);
    return TEST_DONE();
}
