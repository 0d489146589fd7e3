/* The planner's search (src/plan/search.c) on a small model and a
 * hand-built cluster of 8 devices:
 *   - every layout returned is valid (the config validator accepts it
 *     written into the config), has dp x tp x pp = world, fits the device
 *     and comes in step-time order; each has its time model's prediction;
 *   - fixed keys are held at the base config's values;
 *   - rejected layouts say why, naming a memory category and the device;
 *   - ranks beyond the devices share a device's memory;
 *   - a checkpoint save's scratch counts toward a fit;
 *   - a fixed key no layout satisfies, and a device nothing fits, are one
 *     clear error each;
 *   - the pruned search's best is no slower than every layout tried by
 *     hand, with modelled costs and with a made-up profile's tables. */
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
        CHECK(e->mem.total + e->mem.save <= cl->device.memory_bytes);
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

/* The smallest and the largest need among r's kept layouts. */
static void needs_span(const pt_plan_result *r, double *lo, double *hi) {
    *lo = 1e300, *hi = 0;
    for (int i = 0; i < r->n_fit; i++) {
        if (r->entry[i].mem.total < *lo) *lo = r->entry[i].mem.total;
        if (r->entry[i].mem.total > *hi) *hi = r->entry[i].mem.total;
    }
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
    double lo, hi;
    needs_span(&r, &lo, &hi);
    pt_plan_result_free(&r);
    CHECK(hi > lo);
    pt_cluster mid = hand_cluster((lo + hi) / 2);
    CHECK_OK(pt_plan_search(&base, NULL, 0, &mid, 8, &r));
    check_result(&base, &mid, 8, &r);
    CHECK(r.n > r.n_fit); /* some were rejected */
    pt_plan_result_free(&r);
}

/* More ranks than devices (this machine's 4 ranks on 2 cores): the ranks
 * on a device share its memory, so a rank gets the device's over
 * ceil(world / devices), and a layout that would fit a device whole but
 * not that share is rejected, its reason saying so. A measured machine
 * (a profile: RAM shared by a node's ranks) gives a rank the node's RAM
 * over the node's ranks. */
static void test_shared_devices(void) {
    pt_cluster cl = hand_cluster(64e9); /* 2 nodes of 4 devices */
    pt_plan_capacity cap;
    pt_plan_rank_capacity(&cl, 8, &cap);
    CHECK(cap.bytes == 64e9 && cap.share == 1 && !strcmp(cap.what, "the device has 64.0 GB"));
    pt_plan_rank_capacity(&cl, 1, &cap);
    CHECK(cap.bytes == 64e9 && cap.share == 1);
    pt_plan_rank_capacity(&cl, 9, &cap);
    CHECK(cap.bytes == 32e9 && cap.share == 2);
    CHECK(!strcmp(cap.what, "a rank has 32.0 GB (the device's 64.0 GB over 2 ranks)"));
    pt_plan_rank_capacity(&cl, 16, &cap);
    CHECK(cap.bytes == 32e9 && cap.share == 2);
    pt_plan_rank_capacity(&cl, 17, &cap);
    CHECK(cap.bytes == 64e9 / 3 && cap.share == 3);
    pt_cluster host = plan_test_cluster(1, 2, 12e9); /* 24 GB of RAM over 2 cores */
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    host.profile = &prof;
    pt_plan_rank_capacity(&host, 1, &cap);
    CHECK(cap.bytes == 24e9 && cap.share == 1);
    CHECK(!strcmp(cap.what, "a rank has 24.0 GB (the node's 24.0 GB over 1 rank)"));
    pt_plan_rank_capacity(&host, 3, &cap);
    CHECK(cap.bytes == 8e9 && cap.share == 3);
    CHECK(!strcmp(cap.what, "a rank has 8.0 GB (the node's 24.0 GB over 3 ranks)"));

    /* 16 ranks on 8 devices: the span of the layouts' needs, then a device
     * that holds them all whole (the upper need) but halved holds some */
    pt_config base = small_model();
    pt_plan_result r;
    CHECK_OK(pt_plan_search(&base, NULL, 0, &cl, 16, &r));
    double lo, hi;
    needs_span(&r, &lo, &hi);
    pt_plan_result_free(&r);
    CHECK(hi > lo);
    cl.device.memory_bytes = lo + hi; /* a rank's share: (lo + hi) / 2 */
    CHECK_OK(pt_plan_search(&base, NULL, 0, &cl, 16, &r));
    CHECK(r.n > r.n_fit);
    for (int i = 0; i < r.n_fit; i++) CHECK(r.entry[i].mem.total <= (lo + hi) / 2);
    int whole = 0; /* rejected, though within the whole device */
    for (int i = r.n_fit; i < r.n; i++) {
        CHECK(strstr(r.entry[i].reason, "over 2 ranks") != NULL);
        whole += r.entry[i].mem.total <= lo + hi;
    }
    CHECK(whole > 0);
    pt_plan_result_free(&r);
}

/* A checkpoint save's scratch counts: under checkpoint.async (each rank
 * stages its write share) a device that holds a ZeRO-3 layout's step but
 * not its ranks while they save rejects it, naming the save; one that holds
 * both keeps it. A synchronous save holds nothing. */
static void test_save_counts(void) {
    pt_config base = small_model();
    base.parallel.dp = 2, base.parallel.zero = 3;
    base.checkpoint.async = 1;
    snprintf(base.train.recompute, sizeof base.train.recompute, "none");
    const char *fixed[] = {"parallel.dp",   "parallel.tp",     "parallel.pp",
                           "parallel.zero", "model.recompute", "parallel.zero_whole"};
    pt_cluster cl = hand_cluster(64e9);
    pt_plan_result r;
    CHECK_OK(pt_plan_search(&base, fixed, 6, &cl, 2, &r));
    CHECK(r.n_fit > 0);
    double least = 1e300; /* the smallest need of a step alone, and its save */
    for (int i = 0; i < r.n_fit; i++) {
        CHECK(r.entry[i].mem.save > 0);
        if (r.entry[i].mem.total < least) least = r.entry[i].mem.total;
    }
    pt_plan_result_free(&r);
    cl.device.memory_bytes = least * 1.0001; /* the step fits, the save does not */
    pt_status st = pt_plan_search(&base, fixed, 6, &cl, 2, &r);
    CHECK(st != PT_OK);
    CHECK(strstr(pt_error_message(), "a checkpoint save") != NULL);
    pt_plan_result_free(&r);
    base.checkpoint.async = 0; /* the same device holds the synchronous saves */
    CHECK_OK(pt_plan_search(&base, fixed, 6, &cl, 2, &r));
    for (int i = 0; i < r.n; i++) CHECK(r.entry[i].mem.save == 0);
    pt_plan_result_free(&r);
}

/* ZeRO-3 keeping the embedding and the head whole can need less than
 * sharding them for a small model (the gathered units' pool outweighs what
 * sharding saves): a device between the two keeps the layout, whole,
 * where the search once tried the whole variant only after the sharded one
 * fit. */
static void test_zero3_whole_when_smaller(void) {
    pt_config base = plan_test_model(2, 32, 4, 64, 32, 16);
    base.parallel.dp = 2, base.parallel.zero = 3;
    snprintf(base.train.recompute, sizeof base.train.recompute, "none");
    const char *fixed[] = {"parallel.dp",   "parallel.tp",     "parallel.pp",
                           "parallel.zero", "model.recompute", "parallel.microbatches"};
    pt_cluster cl = hand_cluster(64e9);
    pt_plan_capacity cap;
    pt_plan_rank_capacity(&cl, 2, &cap);
    pt_plan_layout l = {.dp = 2, .tp = 1, .pp = 1, .zero = 3, .microbatches = 1};
    snprintf(l.schedule, sizeof l.schedule, "none");
    pt_plan_mem sharded, whole;
    CHECK_OK(pt_plan_memory(&base, &l, &cl, &sharded));
    snprintf(l.zero_whole, sizeof l.zero_whole, "embedding,head");
    CHECK_OK(pt_plan_memory(&base, &l, &cl, &whole));
    double ns = pt_plan_mem_need(&sharded.max, &cap), nw = pt_plan_mem_need(&whole.max, &cap);
    fprintf(stderr, "  need: sharded %.0f B, whole %.0f B\n", ns, nw);
    CHECK(nw < ns); /* the case this test is about */
    cl.device.memory_bytes = (ns + nw) / 2;
    base.parallel.microbatches = 1;
    pt_plan_result r;
    CHECK_OK(pt_plan_search(&base, fixed, 6, &cl, 2, &r));
    CHECK_EQ(r.n_fit, 1);
    if (r.n_fit == 1) CHECK(!strcmp(r.entry[0].layout.zero_whole, "embedding,head"));
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

/* The best uniform layout's step over every layout tried by hand that
 * validates and fits cl's device. */
static double exhaustive_best(const pt_config *base, const pt_cluster *cl) {
    double best = INFINITY;
    static const char *const sched[] = {"gpipe", "1f1b", "interleaved", "zb1", "zbv"};
    pt_config *c = malloc(sizeof *c);
    pt_plan_mem *mem = malloc(sizeof *mem);
    for (int tp = 1; tp <= 8; tp *= 2)
        for (int pp = 1; tp * pp <= 8; pp *= 2) {
            int dp = 8 / tp / pp, L = base->model.n_layer;
            for (int sp = 0; sp <= (tp > 1); sp++)
                for (int m = 1; m <= base->train.batch_size / dp; m++)
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
                                    *c = *base;
                                    pt_plan_layout_apply(&l, c);
                                    if (pt_config_validate(c) != PT_OK) continue;
                                    if (pt_plan_memory(base, &l, cl, mem) != PT_OK ||
                                        mem->max.total + mem->max.save > cl->device.memory_bytes)
                                        continue;
                                    pt_plan_time t;
                                    if (pt_plan_time_predict(base, &l, cl, &t) != PT_OK) continue;
                                    if (t.step_s < best) best = t.step_s;
                                }
        }
    free(c);
    free(mem);
    return best;
}

/* The pruned search against every layout tried by hand: its best is no
 * slower than the best uniform layout that validates and fits (it may be
 * faster with a per-part choice), so the bounds lost nothing. The device
 * holds some layouts but not all (as in test_space): a tenth, half and
 * nine tenths of the way from the smallest need to the largest. */
static void check_exhaustive(const pt_config *base, pt_cluster *cl) {
    pt_plan_result r;
    cl->device.memory_bytes = 64e9;
    CHECK_OK(pt_plan_search(base, NULL, 0, cl, 8, &r));
    double lo, hi;
    needs_span(&r, &lo, &hi);
    pt_plan_result_free(&r);
    for (double f = 0.1; f < 1; f += 0.4) {
        cl->device.memory_bytes = lo + (hi - lo) * f;
        CHECK_OK(pt_plan_search(base, NULL, 0, cl, 8, &r));
        double best = exhaustive_best(base, cl);
        CHECK(isfinite(best));
        CHECK(r.n_fit > 0);
        if (r.n_fit > 0) CHECK(r.entry[0].time.step_s <= best * (1 + 1e-12));
        pt_plan_result_free(&r);
    }
}

static void test_exhaustive(void) {
    pt_config base = small_model();
    pt_cluster cl = plan_test_cluster(2, 4, 0);
    check_exhaustive(&base, &cl);
}

/* The same with a measured machine's tables (a calibrate profile, made up
 * here): module times per token that fall with the size, and collectives
 * latency-bound below 64 KiB and at a higher rate above, so that no cost
 * is linear in the bytes it moves, which the search's bounds (ZeRO-3's
 * sharded and whole modules among them) must survive. A batch of 64 makes
 * 2,460 layouts, beyond the 256 kept, so that the bounds prune (about 450
 * evaluated); a pipeline bound planted 3x too high fails here. */
static void test_exhaustive_profile(void) {
    pt_config base = small_model();
    base.train.batch_size = 64; /* beyond the layouts kept: the bounds prune */
    pt_cluster cl = plan_test_cluster(1, 8, 0);
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.cores = 8;
    prof.memory_bw = 1e10, prof.elementwise_s = 1e-9, prof.adamw_s = 2e-9, prof.sgd_s = 1e-9;
    pt_profile_module mods[3 * 4 * 5];
    int nm = 0;
    const pt_model_config *mc = &base.model;
    for (int t = 1; t <= 4; t *= 2)
        for (int tok = 32; tok <= 512; tok *= 2)
            for (int k = 0; k < 3; k++) {
                /* a fixed part (kernel launches, a collective's latency in
                 * a group) and a per-token part, the block the dearest */
                double per = (k == 1 ? 4e-7 : 1e-7) / t, fixed = 2e-5 * (1 + (t > 1));
                double s = fixed + per * tok;
                mods[nm++] = (pt_profile_module){.kind = k,
                                                 .n_embd = mc->n_embd,
                                                 .n_head = mc->n_head,
                                                 .seq_len = mc->seq_len,
                                                 .vocab_size = mc->vocab_size,
                                                 .tp = t,
                                                 .tokens = tok,
                                                 .threads = 1,
                                                 .ranks = t,
                                                 .fwd_s = s,
                                                 .bgrad_s = 1.1 * s,
                                                 .wgrad_s = 0.9 * s,
                                                 .recompute_s = {0, 0.3 * s, s}};
            }
    prof.module = mods, prof.n_module = nm;
    pt_profile_comm comm[5 * 3 * 8];
    int nc = 0;
    for (int op = 0; op < PT_PROFILE_NOPS; op++)
        for (int n = 2; n <= 8; n *= 2) {
            if (op == PT_PROFILE_P2P && n != 2) continue;
            for (double bytes = 4096; bytes <= 64 << 20; bytes *= 4) {
                double bw = bytes < 65536 ? 1e9 : 8e9, lat = 1e-5 * n;
                double move = op == PT_PROFILE_ALLREDUCE ? 2.0 * (n - 1) / n : (n - 1.0) / n;
                if (op == PT_PROFILE_P2P || op == PT_PROFILE_BROADCAST) move = 1;
                comm[nc++] = (pt_profile_comm){.backend = "shm",
                                               .op = op,
                                               .ranks = n,
                                               .bytes = bytes,
                                               .seconds = lat + move * bytes / bw};
            }
        }
    prof.comm = comm, prof.n_comm = nc;
    cl.profile = &prof;
    check_exhaustive(&base, &cl);
}

int main(void) {
    RUN(test_space);
    RUN(test_fixed);
    RUN(test_shared_devices);
    RUN(test_save_counts);
    RUN(test_zero3_whole_when_smaller);
    RUN(test_errors);
    RUN(test_exhaustive);
    RUN(test_exhaustive_profile);
    return TEST_DONE();
}
