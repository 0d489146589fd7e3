/* The planner's search (src/plan/search.c) on a small model and a
 * hand-built cluster of 8 devices:
 *   - every layout returned is valid (the config validator accepts it
 *     written into the config), has dp x tp x pp = world, fits the device
 *     and comes in step-time order; each has its time model's prediction;
 *   - fixed keys are held at the base config's values;
 *   - rejected layouts say why, naming a memory category and the device;
 *   - a fixed key no layout satisfies, and a device nothing fits, are one
 *     clear error each. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"
#include "partrain/plan.h"
#include "plan_test.h"
#include "pt_test.h"

static pt_cluster hand_cluster(double mem) {
    return plan_test_cluster(2, 4, mem);
}

static pt_config small_model(void) {
    return plan_test_model(4, 64, 4, 256, 32, 16);
}

static const char *const cats[] = {"params", "grads", "optim", "acts", "comm", "scratch"};

static int names_category(const char *reason) {
    for (size_t i = 0; i < sizeof cats / sizeof cats[0]; i++)
        if (strstr(reason, cats[i])) return 1;
    return 0;
}

static void check_result(const pt_config *base, const pt_cluster *cl, int world,
                         const pt_plan_result *r) {
    CHECK(r->n_fit > 0);
    CHECK(r->n_fitting >= r->n_fit);
    CHECK(r->n_considered >= r->n_fitting);
    pt_config *c = malloc(sizeof *c);
    for (int i = 0; i < r->n_fit; i++) {
        const pt_plan_entry *e = &r->entry[i];
        const pt_plan_layout *l = &e->layout;
        CHECK(e->fits);
        CHECK_EQ(l->dp * l->tp * l->pp, world);
        CHECK(e->mem.total <= cl->device.memory_bytes);
        CHECK(e->time.step_s > 0 && e->time.tokens_per_s > 0 && e->time.mfu > 0);
        if (i > 0) CHECK(e->time.step_s >= r->entry[i - 1].time.step_s);
        *c = *base;
        pt_plan_layout_apply(l, c);
        CHECK_OK(pt_config_validate(c));
        /* the search's numbers are the models' own */
        pt_plan_time t;
        CHECK_OK(pt_plan_time_predict(base, l, cl, &t));
        CHECK_NEAR(t.step_s, e->time.step_s, 0, 1e-9);
    }
    for (int i = r->n_fit; i < r->n; i++) {
        CHECK(!r->entry[i].fits);
        CHECK(names_category(r->entry[i].reason));
        CHECK(strstr(r->entry[i].reason, "device") != NULL);
    }
    free(c);
}

/* A device that holds some layouts but not all: both kinds come back. */
static void test_space(void) {
    pt_config base = small_model();
    /* between the smallest and the largest layout's need */
    pt_cluster big = hand_cluster(64e9);
    pt_plan_result r;
    CHECK_OK(pt_plan_search(&base, NULL, 0, &big, 8, &r));
    check_result(&base, &big, 8, &r);
    /* the span of the kept layouts' needs */
    double lo = 1e300, hi = 0;
    for (int i = 0; i < r.n_fit; i++) {
        if (r.entry[i].mem.total < lo) lo = r.entry[i].mem.total;
        if (r.entry[i].mem.total > hi) hi = r.entry[i].mem.total;
    }
    pt_plan_result_free(&r);
    CHECK(hi > lo);
    pt_cluster mid = hand_cluster((lo + hi) / 2);
    CHECK_OK(pt_plan_search(&base, NULL, 0, &mid, 8, &r));
    check_result(&base, &mid, 8, &r);
    CHECK(r.n > r.n_fit); /* some were rejected */
    pt_plan_result_free(&r);
}

static void test_fixed(void) {
    pt_config base = small_model();
    pt_cluster cl = hand_cluster(64e9);
    base.parallel.tp = 2;
    snprintf(base.parallel.schedule, sizeof base.parallel.schedule, "zb1");
    base.parallel.zero = 1;
    const char *fixed[] = {"parallel.tp", "parallel.schedule", "parallel.zero"};
    pt_plan_result r;
    CHECK_OK(pt_plan_search(&base, fixed, 3, &cl, 8, &r));
    check_result(&base, &cl, 8, &r);
    for (int i = 0; i < r.n; i++) {
        CHECK_EQ(r.entry[i].layout.tp, 2);
        CHECK_EQ(r.entry[i].layout.zero, 1);
        CHECK(!strcmp(r.entry[i].layout.schedule, "zb1"));
    }
    pt_plan_result_free(&r);
    /* the recompute mode fixed */
    pt_config b2 = small_model();
    snprintf(b2.train.recompute, sizeof b2.train.recompute, "full");
    const char *f2[] = {"model.recompute"};
    CHECK_OK(pt_plan_search(&b2, f2, 1, &cl, 4, &r));
    for (int i = 0; i < r.n; i++) CHECK_EQ(r.entry[i].layout.recompute, PT_RECOMPUTE_FULL);
    pt_plan_result_free(&r);
}

static void test_errors(void) {
    pt_config base = small_model();
    pt_cluster cl = hand_cluster(64e9);
    pt_plan_result r;
    /* tp 3 does not divide 4 heads: nothing is valid */
    base.parallel.tp = 3;
    const char *fixed[] = {"parallel.tp"};
    pt_status st = pt_plan_search(&base, fixed, 1, &cl, 6, &r);
    CHECK(st != PT_OK);
    CHECK(strstr(pt_error_message(), "no layout of 6 ranks is valid with parallel.tp=3 (fixed)"));
    CHECK(strchr(pt_error_message(), '\n') == NULL);
    pt_plan_result_free(&r);
    /* a device of 1 kB: nothing fits; the smallest need is named */
    pt_config b2 = small_model();
    pt_cluster tiny = hand_cluster(1e3);
    st = pt_plan_search(&b2, NULL, 0, &tiny, 8, &r);
    CHECK(st != PT_OK);
    CHECK(strstr(pt_error_message(), "fits on no layout of 8 ranks: the smallest"));
    CHECK(strstr(pt_error_message(), "device"));
    CHECK(strchr(pt_error_message(), '\n') == NULL);
    CHECK_EQ(r.n_fit, 0);
    CHECK(r.n > 0);
    for (int i = 1; i < r.n && r.n_fit == 0; i++)
        CHECK(r.entry[i].mem.total >= r.entry[i - 1].mem.total);
    pt_plan_result_free(&r);
}

/* The pruned search against every layout tried by hand: its best is no
 * slower than the best uniform layout that validates and fits (it may be
 * faster with a per-part choice), so the bounds lost nothing. */
static void test_exhaustive(void) {
    pt_config base = small_model();
    pt_cluster cl = plan_test_cluster(2, 4, 0);
    pt_plan_result r;
    /* a device between the smallest need and the largest, as in test_space */
    cl.device.memory_bytes = 64e9;
    CHECK_OK(pt_plan_search(&base, NULL, 0, &cl, 8, &r));
    double lo = 1e300, hi = 0;
    for (int i = 0; i < r.n_fit; i++) {
        if (r.entry[i].mem.total < lo) lo = r.entry[i].mem.total;
        if (r.entry[i].mem.total > hi) hi = r.entry[i].mem.total;
    }
    pt_plan_result_free(&r);
    cl.device.memory_bytes = (lo + hi) / 2;
    CHECK_OK(pt_plan_search(&base, NULL, 0, &cl, 8, &r));
    double best = INFINITY;
    static const char *const sched[] = {"gpipe", "1f1b", "interleaved", "zb1", "zbv"};
    pt_config *c = malloc(sizeof *c);
    pt_plan_mem *mem = malloc(sizeof *mem);
    for (int tp = 1; tp <= 8; tp *= 2)
        for (int pp = 1; tp * pp <= 8; pp *= 2) {
            int dp = 8 / tp / pp, L = base.model.n_layer;
            for (int sp = 0; sp <= (tp > 1); sp++)
                for (int m = 1; m <= base.train.batch_size / dp; m++)
                    for (int si = 0; si < (pp > 1 ? 5 : 1); si++)
                        for (int v = 1; v <= PT_SCHEDULE_MAX_VIRTUAL; v++)
                            for (int rc = 0; rc < 3; rc++)
                                for (int z = 0; z <= (dp > 1 ? 3 : 0); z++) {
                                    pt_plan_layout l;
                                    memset(&l, 0, sizeof l);
                                    l.dp = dp, l.tp = tp, l.pp = pp, l.sequence_parallel = sp;
                                    l.microbatches = m, l.recompute = rc, l.zero = z;
                                    l.virtual_stages = v;
                                    snprintf(l.schedule, sizeof l.schedule, "%s",
                                             pp > 1 ? sched[si] : "none");
                                    if (pt_schedule_check(l.schedule, m, pp, v, L + 2) != PT_OK)
                                        continue;
                                    *c = base;
                                    pt_plan_layout_apply(&l, c);
                                    if (pt_config_validate(c) != PT_OK) continue;
                                    if (pt_plan_memory(&base, &l, &cl, mem) != PT_OK ||
                                        mem->max.total > cl.device.memory_bytes)
                                        continue;
                                    pt_plan_time t;
                                    if (pt_plan_time_predict(&base, &l, &cl, &t) != PT_OK) continue;
                                    if (t.step_s < best) best = t.step_s;
                                }
        }
    CHECK(isfinite(best));
    CHECK(r.n_fit > 0);
    if (r.n_fit > 0) CHECK(r.entry[0].time.step_s <= best * (1 + 1e-12));
    free(c);
    free(mem);
    pt_plan_result_free(&r);
}

int main(void) {
    RUN(test_space);
    RUN(test_fixed);
    RUN(test_errors);
    RUN(test_exhaustive);
    return TEST_DONE();
}
