/* The planner's time model (src/plan/time.c) on hand-built clusters:
 *   - the simulated pipeline with F = B = W and instant transfers gives the
 *     schedule's closed-form makespan and the runtime simulator's;
 *   - the data-parallel all-reduce and tp's per-block all-reduces are the
 *     ring formula, computed here from the formula text;
 *   - ranks beyond the cluster's cores slow compute by world / cores, and
 *     a rank's threads are cores / world;
 *   - a measured profile's module times replace the datasheet model,
 *     interpolated log-log in tokens; entries measured in groups (tp
 *     shards, tp 1 under load) are chosen by the layout's busy cores. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/plan/plan_time_impl.h"
#include "plan_test.h"
#include "pt_test.h"

static pt_cluster hand_cluster(int nodes, int dpn) {
    return plan_test_cluster(nodes, dpn, 16e9);
}

static pt_config small_model(void) {
    pt_config c = plan_test_model(8, 256, 8, 512, 128, 32);
    c.parallel.overlap = 0;
    return c;
}

static pt_plan_layout layout(int dp, int tp, int pp, const char *sched, int v, int m) {
    pt_plan_layout l;
    memset(&l, 0, sizeof l);
    l.dp = dp, l.tp = tp, l.pp = pp, l.microbatches = m, l.virtual_stages = v;
    snprintf(l.schedule, sizeof l.schedule, "%s", sched);
    return l;
}

/* F = B = W = 1 on every virtual stage, no transfer time: the makespan is
 * the closed form (m + p - 1) x 3 for gpipe / 1f1b, (v m + p - 1) x 3 / v
 * per chunk unit for interleaved, and the runtime simulator's for all. */
static void test_bubble_formula(void) {
    static const struct {
        const char *name;
        int p, v, m;
    } cases[] = {{"gpipe", 4, 1, 8},       {"1f1b", 4, 1, 8}, {"1f1b", 2, 1, 6},
                 {"interleaved", 2, 2, 4}, {"zb1", 4, 1, 8},  {"zbv", 2, 2, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int p = cases[i].p, v = cases[i].v, m = cases[i].m;
        pt_plan_layout l = layout(1, 1, p, cases[i].name, v, m);
        pt_plan_pipe *pp = calloc(1, sizeof *pp);
        pp->p = p, pp->v = v, pp->m = m, pp->G = p * v, pp->stride = 1, pp->dpn = 64;
        for (int g = 0; g < p * v; g++) {
            pp->f[g] = pp->b[g] = pp->w[g] = 1.0;
            pp->rank_of[g] = pt_schedule_locate(cases[i].name, p, v, g, NULL);
        }
        double mk = 0, ref = 0;
        CHECK_OK(pt_plan_pipe_simulate(&l, pp, 1, &mk, NULL, NULL));
        CHECK_OK(pt_schedule_simulate(cases[i].name, m, p, v, 1, 1, 1, &ref, NULL));
        CHECK_NEAR(mk, ref, 1e-9, 0);
        double busy = 3.0 * m * v; /* per rank */
        for (int r = 0; r < p; r++) CHECK_NEAR(pp->busy[r], busy, 1e-9, 0);
        double bubble = 1 - busy / mk;
        CHECK_NEAR(bubble, pt_schedule_bubble(cases[i].name, m, p, v, 1, 1, 1), 1e-9, 0);
        if (!strcmp(cases[i].name, "1f1b") || !strcmp(cases[i].name, "gpipe"))
            CHECK_NEAR(mk, 3.0 * (m + p - 1), 1e-9, 0);
        if (!strcmp(cases[i].name, "interleaved"))
            CHECK_NEAR(bubble, (double)(p - 1) / (v * m + p - 1), 1e-9, 0);
        /* a transfer time makes it no shorter */
        pp->p2p_intra = pp->p2p_inter = 0.25;
        double mk2 = 0;
        CHECK_OK(pt_plan_pipe_simulate(&l, pp, 1, &mk2, NULL, NULL));
        CHECK(mk2 > mk);
        free(pp);
    }
}

static double ring_ar(int n, double bytes, double bw, double lat) {
    return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
}

/* dp n: the exposed all-reduce (overlap off) of every parameter in fp32. */
static void test_dp_ring(void) {
    pt_cluster cl = hand_cluster(1, 8);
    pt_config c = small_model();
    double P = (double)pt_model_config_num_params(&c.model), prev = 0;
    for (int n = 2; n <= 8; n *= 2) {
        pt_plan_layout l = layout(n, 1, 1, "none", 1, 1);
        pt_plan_time t;
        CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
        double want =
            ring_ar(n, P * 4, cl.intra_node.bw * cl.efficiency.comm, cl.intra_node.latency);
        CHECK_NEAR(t.comm_s[PT_MESH_DP], want, 0, 1e-9);
        CHECK(t.comm_s[PT_MESH_DP] > prev);
        prev = t.comm_s[PT_MESH_DP];
        CHECK_NEAR(t.step_s, t.compute_s + t.comm_s[PT_MESH_DP] + t.optim_s, 0, 1e-9);
    }
    /* a group wider than a node crosses the inter-node link */
    pt_cluster two = hand_cluster(2, 4);
    pt_plan_layout l = layout(8, 1, 1, "none", 1, 1);
    pt_plan_time t;
    CHECK_OK(pt_plan_time_predict(&c, &l, &two, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP],
               ring_ar(8, P * 4, two.inter_node.bw * two.efficiency.comm, two.inter_node.latency),
               0, 1e-9);
    /* overlap on: only what exceeds the last backward is exposed */
    c.parallel.overlap = 1;
    pt_plan_time t2;
    CHECK_OK(pt_plan_time_predict(&c, &l, &two, &t2));
    CHECK(t2.comm_s[PT_MESH_DP] < t.comm_s[PT_MESH_DP]);
}

/* tp 2: per micro-batch 4 all-reduces of (N, C) a block, the embedding's
 * forward and the head's backward one each, and the head's (max, sum). */
static void test_tp_ring(void) {
    pt_cluster cl = hand_cluster(1, 8);
    pt_config c = small_model();
    int m = 2, L = c.model.n_layer;
    pt_plan_layout l = layout(1, 2, 1, "none", 1, m);
    pt_plan_time t;
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    double N = 32.0 / m * 128, bw = cl.intra_node.bw * cl.efficiency.comm,
           lat = cl.intra_node.latency;
    double ar = ring_ar(2, N * 256 * 4, bw, lat), small = ring_ar(2, 2 * N * 4, bw, lat);
    CHECK_NEAR(t.comm_s[PT_MESH_TP], m * ((4 * L + 2) * ar + small), 0, 1e-9);
    /* full recompute reruns the forward's two a block */
    l.recompute = PT_RECOMPUTE_FULL;
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_TP], m * ((6 * L + 2) * ar + small), 0, 1e-9);
}

/* A measured machine of 2 cores: 4 ranks share them, each at half speed;
 * 1 rank gets both cores as threads. */
static void test_oversubscription(void) {
    pt_cluster cl = hand_cluster(1, 2);
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.cores = 2;
    cl.profile = &prof;
    pt_config c = small_model();
    pt_plan_time t2, t4, t1;
    c.train.batch_size = 8;
    pt_plan_layout l2 = layout(2, 1, 1, "none", 1, 1);
    CHECK_OK(pt_plan_time_predict(&c, &l2, &cl, &t2));
    c.train.batch_size = 16; /* the same share a rank */
    pt_plan_layout l4 = layout(4, 1, 1, "none", 1, 1);
    CHECK_OK(pt_plan_time_predict(&c, &l4, &cl, &t4));
    CHECK_NEAR(t4.compute_s, 2 * t2.compute_s, 0, 1e-9);
    c.train.batch_size = 4;
    pt_plan_layout l1 = layout(1, 1, 1, "none", 1, 1);
    CHECK_OK(pt_plan_time_predict(&c, &l1, &cl, &t1));
    CHECK_NEAR(t1.compute_s, 0.5 * t2.compute_s, 0, 1e-9);
    /* train.threads fixed: the rank keeps its one thread */
    l1.threads = 1;
    CHECK_OK(pt_plan_time_predict(&c, &l1, &cl, &t1));
    CHECK_NEAR(t1.compute_s, t2.compute_s, 0, 1e-9);
}

/* The block's F on stage 0 of layout l: the stage's F less that of the
 * same model without blocks (the embedding and head, modelled). */
static double block_f(const pt_config *c, const pt_cluster *cl, const pt_plan_layout *l) {
    pt_config c0 = *c;
    c0.model.n_layer = 0;
    pt_plan_pipe *pp = calloc(1, sizeof *pp), *rest = calloc(1, sizeof *rest);
    CHECK_OK(pt_plan_pipe_times(c, l, cl, pp));
    CHECK_OK(pt_plan_pipe_times(&c0, l, cl, rest));
    double f = pp->f[0] - rest->f[0];
    free(pp);
    free(rest);
    return f;
}

/* A block's profile entry of the tests' shape (C 256, NH 8, T 128, V 512;
 * one thread): tp shard `tp` timed with `ranks` ranks at once. */
static pt_profile_module block_entry(int tp, int ranks, int tokens, double f, double b, double w) {
    return (pt_profile_module){.kind = PT_MODULE_BLOCK,
                               .n_embd = 256,
                               .n_head = 8,
                               .seq_len = 128,
                               .vocab_size = 512,
                               .tp = tp,
                               .tokens = tokens,
                               .threads = 1,
                               .ranks = ranks,
                               .fwd_s = f,
                               .bgrad_s = b,
                               .wgrad_s = w};
}

/* Block times from the profile: log-log between the measured tokens. */
static void test_profile_modules(void) {
    pt_cluster cl = hand_cluster(1, 1);
    pt_config c = small_model();
    c.model.n_layer = 1;
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.cores = 1;
    /* 1024 and 4096 tokens; 8x the time for 4x the tokens */
    pt_profile_module mods[2] = {block_entry(1, 1, 1024, 0.01, 0.02, 0.01),
                                 block_entry(1, 1, 4096, 0.08, 0.16, 0.08)};
    prof.module = mods, prof.n_module = 2;
    cl.profile = &prof;
    c.train.batch_size = 16; /* 2048 tokens: the geometric middle */
    pt_plan_layout l = layout(1, 1, 1, "none", 1, 1);
    /* the stage = embedding + block + head; the block's share is measured */
    CHECK_NEAR(block_f(&c, &cl, &l), sqrt(0.01 * 0.08), 0, 1e-9);
    pt_plan_pipe *pp = calloc(1, sizeof *pp);
    CHECK_OK(pt_plan_pipe_times(&c, &l, &cl, pp));
    /* two ranks on the one device, the same share each: measured passes
     * slow down as the modelled ones do */
    cl.profile = &prof;
    c.train.batch_size = 32;
    pt_plan_layout l2 = layout(2, 1, 1, "none", 1, 1);
    pt_plan_pipe *shared = calloc(1, sizeof *shared);
    CHECK_OK(pt_plan_pipe_times(&c, &l2, &cl, shared));
    CHECK_NEAR(shared->f[0], 2 * pp->f[0], 0, 1e-9);
    CHECK_NEAR(shared->b[0], 2 * pp->b[0], 0, 1e-9);
    free(shared);
    free(pp);
    /* an entry slower than a larger size's (a noisy host's outlier) is
     * capped by it: 1024 tokens at 0.09 under 4096's 0.08 reads 0.08 */
    mods[0].fwd_s = 0.09;
    c.train.batch_size = 8; /* 1024 tokens */
    CHECK_NEAR(block_f(&c, &cl, &l), 0.08, 0, 1e-9);
}

/* Entries measured in groups (calibrate's ranks field): a tp shard's own
 * entry holds its collectives (nothing modelled is added), its group's own
 * oversubscription is not counted twice, and whole modules under load are
 * what a rank among others on the cores runs at, alone what a lone rank
 * does. Only blocks are measured here: the embedding and head are
 * modelled, the same in every layout of one tp. */
static void test_profile_groups(void) {
    pt_cluster cl = hand_cluster(1, 2);
    pt_config c = small_model();
    c.model.n_layer = 1;
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.cores = 2;
    /* tp 1 alone 10 ms, tp 1 under load (2 ranks) 12 ms, tp 2 in its group
     * 7 ms, tp 4 in its group of 4 on the 2 cores 8 ms: forward = B = W */
    const struct {
        int tp, ranks;
        double s;
    } e[4] = {{1, 1, 0.010}, {1, 2, 0.012}, {2, 2, 0.007}, {4, 4, 0.008}};
    pt_profile_module mods[4];
    for (int i = 0; i < 4; i++)
        mods[i] = block_entry(e[i].tp, e[i].ranks, 512, e[i].s, e[i].s, e[i].s);
    prof.module = mods, prof.n_module = 4;
    c.train.batch_size = 4; /* 512 tokens a micro-batch at dp 1, m 1 */
    cl.profile = &prof;
    pt_plan_layout one = layout(1, 1, 1, "none", 1, 1);
    one.threads = 1; /* a lone rank at one thread: the entry alone */
    CHECK_NEAR(block_f(&c, &cl, &one), 0.010, 0, 1e-9);
    c.train.batch_size = 8; /* dp 2: 512 tokens each */
    pt_plan_layout dp2 = layout(2, 1, 1, "none", 1, 1);
    CHECK_NEAR(block_f(&c, &cl, &dp2), 0.012, 0, 1e-9); /* both cores busy: under load */
    /* pp 2 over the 2 cores, none shared: a pass at the under-load time
     * while both stages compute, at the lone rank's while the other waits
     * (the pipeline's own measured cores; a modelled device has one time) */
    c.train.batch_size = 4;
    c.model.n_layer = 2;
    pt_plan_layout pp2 = layout(1, 1, 2, "1f1b", 1, 1);
    pp2.threads = 1;
    pt_plan_pipe *two = calloc(1, sizeof *two), *none = calloc(1, sizeof *none);
    CHECK_OK(pt_plan_pipe_times(&c, &pp2, &cl, two));
    c.model.n_layer = 0;
    CHECK_OK(pt_plan_pipe_times(&c, &pp2, &cl, none));
    CHECK(two->alone && two->slow == 1);
    CHECK_NEAR(two->f[0] - none->f[0], 0.012, 0, 1e-9);
    CHECK_NEAR(two->fa[0] - none->fa[0], 0.010, 0, 1e-9);
    CHECK_NEAR(two->wa[1] - none->wa[1], 0.010, 0, 1e-9);
    /* one micro-batch: the stages in turn, every pass alone (and the
     * tied wte's add, which the run without transfers keeps) */
    CHECK_OK(pt_plan_pipe_run(&pp2, two));
    double lone = two->tied_add;
    for (int g = 0; g < 2; g++) lone += two->fa[g] + two->ba[g] + two->wa[g];
    CHECK_NEAR(two->makespan_nop2p, lone, 1e-12, 0);
    cl.profile = NULL;
    c.model.n_layer = 2;
    CHECK_OK(pt_plan_pipe_times(&c, &pp2, &cl, two));
    CHECK(!two->alone);
    cl.profile = &prof;
    free(two);
    free(none);
    c.model.n_layer = 1;
    c.train.batch_size = 4;
    pt_plan_layout tp2 = layout(1, 2, 1, "none", 1, 1);
    CHECK_NEAR(block_f(&c, &cl, &tp2), 0.007, 0, 1e-9); /* no all-reduce added */
    pt_plan_layout tp4 = layout(1, 4, 1, "none", 1, 1);
    CHECK_NEAR(block_f(&c, &cl, &tp4), 0.008, 0, 1e-9); /* its own 2x, not twice */
    c.train.batch_size = 8;
    pt_plan_layout dp2tp2 = layout(2, 2, 1, "none", 1, 1);
    CHECK_NEAR(block_f(&c, &cl, &dp2tp2), 2 * 0.007, 0, 1e-9); /* 4 ranks on the group's 2 cores */
    /* tp 2 x pp 2, 4 ranks on the 2 cores: every pass at twice the
     * group's time, and alone (the other stage waiting) at the group's */
    c.train.batch_size = 4;
    pt_plan_layout tp2pp2 = layout(1, 2, 2, "1f1b", 1, 1);
    c.model.n_layer = 2;
    pt_plan_pipe *pp = calloc(1, sizeof *pp);
    CHECK_OK(pt_plan_pipe_times(&c, &tp2pp2, &cl, pp));
    c.model.n_layer = 0;
    pt_plan_pipe *rest = calloc(1, sizeof *rest);
    CHECK_OK(pt_plan_pipe_times(&c, &tp2pp2, &cl, rest));
    CHECK_NEAR(pp->f[0] - rest->f[0], 2 * 0.007, 0, 1e-9);
    CHECK_NEAR(pp->fa[0] - rest->fa[0], 0.007, 0, 1e-9);
    CHECK_NEAR(pp->b[1] - rest->b[1], 2 * 0.007, 0, 1e-9);
    CHECK_NEAR(pp->ba[1] - rest->ba[1], 0.007, 0, 1e-9);
    free(pp);
    free(rest);
}

/* gpipe over p pipeline ranks at twice the devices' load (slow 2), every
 * pass 1 with all computing, 0.75 with every core just busy, 0.5 alone:
 * stage 0's first forward runs alone, its second (beside stage 1's first)
 * takes `second`. */
static void shared_second_forward(pt_plan_pipe *pp, int p, double second) {
    pt_plan_layout l = layout(1, 1, p, "gpipe", 1, 1);
    memset(pp, 0, sizeof *pp);
    pp->p = p, pp->v = 1, pp->m = 2, pp->G = p, pp->stride = 1, pp->dpn = 64, pp->slow = 2;
    pp->alone = 1;
    for (int g = 0; g < p; g++) {
        pp->f[g] = pp->b[g] = pp->w[g] = 1.0;
        pp->fc[g] = pp->bc[g] = pp->wc[g] = 0.75;
        pp->fa[g] = pp->ba[g] = pp->wa[g] = 0.5;
        pp->rank_of[g] = g;
    }
    double mk = 0;
    pt_sched_slot *sl = NULL;
    int ns = 0, seen = 0;
    CHECK_OK(pt_plan_pipe_simulate(&l, pp, 0, &mk, &sl, &ns));
    for (int i = 0; i < ns; i++) {
        if (sl[i].kind != PT_PASS_FORWARD || sl[i].rank != 0) continue;
        CHECK_NEAR(sl[i].end - sl[i].start, sl[i].micro == 0 ? 0.5 : second, 1e-12, 0);
        seen++;
    }
    CHECK(seen == 2);
    free(sl);
}

/* Ranks sharing devices (slow > 1): a pass runs at its alone time while
 * the other pipeline ranks wait, at its full time while they all compute,
 * and at the devices' just-full time where that many compute. */
static void test_shared_pipeline(void) {
    pt_plan_layout l = layout(1, 1, 2, "gpipe", 1, 1);
    pt_plan_pipe *pp = calloc(1, sizeof *pp);
    pp->p = 2, pp->v = 1, pp->m = 1, pp->G = 2, pp->stride = 1, pp->dpn = 64, pp->slow = 2;
    pp->alone = 1;
    for (int g = 0; g < 2; g++) {
        pp->f[g] = pp->b[g] = pp->w[g] = 1.0;
        pp->fa[g] = pp->ba[g] = pp->wa[g] = 0.5;
        pp->rank_of[g] = g;
    }
    /* one micro-batch: never two stages at once, every pass alone */
    double mk = 0;
    CHECK_OK(pt_plan_pipe_simulate(&l, pp, 1, &mk, NULL, NULL));
    CHECK_NEAR(mk, 0.5 + 0.5 + 1.0 + 1.0, 1e-12, 0);
    CHECK_NEAR(pp->busy[0], 1.5, 1e-12, 0);
    /* two: F0 on stage 0 alone (0 to 0.5), its F1 beside stage 1's F0 at
     * the full time (to 1.5), stage 1's F1 (to 2) and first backward (B +
     * W, to 3) alone, its second beside stage 0's first (to 5), stage 0's
     * second alone (to 6); every pass at the full time would take 9 */
    pp->m = 2;
    pt_sched_slot *sl = NULL;
    int ns = 0;
    CHECK_OK(pt_plan_pipe_simulate(&l, pp, 1, &mk, &sl, &ns));
    CHECK_NEAR(mk, 6.0, 1e-12, 0);
    CHECK(ns == 8);
    CHECK_NEAR(sl[0].end, 0.5, 1e-12, 0); /* stage 0, F0, alone */
    for (int i = 0; i < ns; i++)
        if (sl[i].kind == PT_PASS_FORWARD && sl[i].micro == 1 && sl[i].rank == 0)
            CHECK_NEAR(sl[i].end - sl[i].start, 1.0, 1e-12, 0); /* beside stage 1's F0 */
    /* with alone = full, the event simulation is the plain one */
    for (int g = 0; g < 2; g++) pp->fa[g] = pp->ba[g] = pp->wa[g] = 1.0;
    double ded = 0;
    CHECK_OK(pt_plan_pipe_simulate(&l, pp, 1, &mk, NULL, NULL));
    pp->slow = 1, pp->alone = 0;
    CHECK_OK(pt_plan_pipe_simulate(&l, pp, 1, &ded, NULL, NULL));
    CHECK_NEAR(mk, ded, 1e-12, 0);
    free(sl);
    /* pp 4 over 2 devices (a rank alone leaves one free): two ranks
     * computing fill them, each pass at fc (every core busy, none shared) */
    shared_second_forward(pp, 4, 0.75);
    /* pp 8 over 4 devices (a rank alone loads them a quarter): two ranks
     * computing load them half, a third of the way from a quarter to full,
     * so a third of the way from the alone time to fc */
    shared_second_forward(pp, 8, 0.5 + 0.25 / 3);
    free(pp);
}

/* The optimizer with a profile: adamw_s over the rank's threads, never
 * faster than 28 bytes a parameter over memory_bw, plus a 4-byte read of
 * the gradients for their norm unless the runtime fuses it (no tp, pp or
 * ZeRO, no clipping). */
static void test_profile_optimizer(void) {
    pt_cluster cl = hand_cluster(1, 2);
    pt_config c = small_model();
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.cores = 2;
    prof.memory_bw = 1e10;
    prof.adamw_s = 1e-9; /* faster than its bytes: 28 / 1e10 = 2.8e-9 */
    cl.profile = &prof;
    pt_plan_layout l = layout(1, 1, 1, "none", 1, 1);
    l.threads = 1;
    /* GPT-2's count, the tied wte once: V C + T C + L (12 C^2 + 13 C) + 2 C */
    double C = c.model.n_embd, P = c.model.vocab_size * C + c.model.seq_len * C +
                                   c.model.n_layer * (12 * C * C + 13 * C) + 2 * C;
    pt_plan_time t;
    double reset = P * 4 / 1e10; /* the gradients' memset, on one thread */
    c.train.grad_clip = 0;       /* fused: the update alone, at its bytes (2.8e-9 > 1e-9) */
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.optim_s, P * 28 / 1e10 + reset, 0, 1e-9);
    c.train.grad_clip = 1; /* the norm's read first */
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.optim_s, P * 32 / 1e10 + reset, 0, 1e-9);
    c.train.grad_clip = 0; /* ZeRO reads the norm apart even unclipped: the shard's update + read */
    c.train.batch_size = 64;
    pt_plan_layout z = layout(2, 1, 1, "none", 1, 1);
    z.zero = 1, z.threads = 1;
    CHECK_OK(pt_plan_time_predict(&c, &z, &cl, &t));
    CHECK_NEAR(t.optim_s, P / 2 * 32 / 1e10 + reset, 0, 1e-9);
    c.train.grad_clip = 1;
    prof.adamw_s = 8e-9; /* slower than its bytes: the measured rate, over the threads */
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.optim_s, P * (8e-9 + 4 / 1e10) + reset, 0, 1e-9);
    l.threads = 2; /* the threads share the rate and add their bandwidth; the memset has one */
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.optim_s, P * (4e-9 + 4 / 2e10) + reset, 0, 1e-9);
    prof.adamw_s = 1e-9; /* 2 threads, faster than their bytes: 28 / 2e10 */
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.optim_s, P * 32 / 2e10 + reset, 0, 1e-9);
    /* pp 2: each rank updates what it holds, the tied wte's rows split
     * between the two at dp 1 (tied_split.c) with their exchange; the step
     * waits for the longer update. The embedding's rank holds wte, wpe and
     * its blocks, the head's its blocks, ln_f and wte's copy (not updated:
     * its rows are) */
    pt_plan_layout q = layout(1, 1, 2, "1f1b", 1, 2);
    q.threads = 1;
    pt_plan_pipe *pp = calloc(1, sizeof *pp);
    CHECK_OK(pt_plan_pipe_predict(&c, &q, &cl, pp));
    double V = c.model.vocab_size, wte = V * C, hi = (V - (double)pt_tied_split_rows((int)V)) * C;
    CHECK(pp->tied_split && pp->first[1] > 0);
    double upd0 = pp->stage_params[0] - hi, upd1 = pp->stage_params[1] - wte + hi;
    double u0 = upd0 * 32 / 1e10 + pp->stage_params[0] * 4 / 1e10 + pp->tied_x;
    double u1 = upd1 * 32 / 1e10 + pp->stage_params[1] * 4 / 1e10 + pp->tied_x;
    pt_plan_time_finish(&c, &q, &cl, pp, &t);
    CHECK_NEAR(t.optim_s, u0 > u1 ? u0 : u1, 0, 1e-9);
    CHECK_NEAR(t.step_s, pp->makespan + t.optim_s, 1e-12, 0);
    free(pp);
}

/* On a measured machine whose cores the ranks' threads fill, ZeRO-3's
 * gathers and reduce-scatters are copies on the cores that compute: all
 * of them add to the step. With a core to spare they hide behind the
 * passes, as on a machine whose links move data by themselves; the main
 * thread's own copies never do. */
static void test_profile_exposed(void) {
    pt_cluster cl = hand_cluster(1, 4);
    pt_config c = small_model();
    c.train.batch_size = 64;
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.memory_bw = 1e10;
    prof.adamw_s = 1e-9;
    cl.profile = &prof;
    pt_plan_layout z = layout(2, 1, 1, "none", 1, 2);
    z.zero = 3, z.threads = 1;
    double P = (double)pt_model_config_num_params(&c.model);
    double gather =
        pt_plan_allgather_s(2, P * 4, cl.intra_node.bw * cl.efficiency.comm, cl.intra_node.latency);
    double copies = 2 * P * (4 + 28.0 / 2) / 1e10; /* memsets, shard copies and adds, m = 2 */
    pt_plan_time t;
    prof.cores = 2; /* 2 ranks x 1 thread: full */
    CHECK_OK(pt_plan_time_predict(&c, &z, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP], 3 * 2 * gather + copies, 0, 1e-9);
    CHECK(t.step_s > t.compute_s + 3 * 2 * gather + copies);
    prof.cores = 4; /* two cores idle: the passes hide the gathers, not the main thread's copies */
    CHECK_OK(pt_plan_time_predict(&c, &z, &cl, &t));
    CHECK(t.compute_s > 3 * 2 * gather);
    CHECK_NEAR(t.comm_s[PT_MESH_DP], copies, 0, 1e-9);
}

/* On a measured machine the dp group's collectives are the profile's own
 * (the shm backend's copies), not the link's ring: interpolated log-log in
 * bytes, latency-bound below the table and linear above it, and scaled
 * from the oversubscription they were timed at (n ranks on the cores) to
 * the layout's. ZeRO-1 all-reduces the gradients, as plain dp does, then
 * all-gathers the updated shards. */
static void test_profile_collectives(void) {
    pt_cluster cl = hand_cluster(1, 2);
    pt_config c = small_model();
    c.train.batch_size = 64;
    double P = (double)pt_model_config_num_params(&c.model), B = P * 4;
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.memory_bw = 1e10;
    prof.adamw_s = 1e-9;
    prof.cores = 2;
    double t1 = 1e-3, t2 = 9e-3, tg = 2e-3, t4 = 5e-3;
    pt_profile_comm tab[] = {{"shm", PT_PROFILE_ALLREDUCE, 2, B / 4, t1},
                             {"shm", PT_PROFILE_ALLREDUCE, 2, 4 * B, t2},
                             {"shm", PT_PROFILE_ALLGATHER, 2, 4 * B, tg},
                             {"shm", PT_PROFILE_ALLREDUCE, 4, B / 8, t4}};
    prof.comm = tab, prof.n_comm = 4;
    cl.profile = &prof;
    pt_plan_time t;
    /* dp 2 on 2 cores: B is the geometric middle of the table's two sizes */
    pt_plan_layout l = layout(2, 1, 1, "none", 1, 1);
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP], sqrt(t1 * t2), 0, 1e-12);
    /* ZeRO-1: the same all-reduce, then the gather (below the table: its smallest) */
    l.zero = 1;
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP], sqrt(t1 * t2) + tg, 0, 1e-12);
    /* dp 4 on 2 cores, as the 4-rank entry was timed: linear above the table */
    l = layout(4, 1, 1, "none", 1, 1);
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP], t4 * 8, 0, 1e-12);
    /* dp 2 x tp 2: 2-rank groups timed alone, here 4 ranks on 2 cores (x 2),
     * each moving half the parameters (a quarter of the way from B / 4 to 4 B) */
    l = layout(2, 2, 1, "none", 1, 1);
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP], 2 * pow(t1, 0.75) * pow(t2, 0.25), 0, 1e-12);
    /* no entry for the op and size: the ring over the link */
    l = layout(2, 1, 1, "none", 1, 1);
    l.zero = 2;
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    double bw = cl.intra_node.bw * cl.efficiency.comm, lat = cl.intra_node.latency;
    CHECK_NEAR(t.comm_s[PT_MESH_DP], pt_plan_allgather_s(2, B, bw, lat) + tg, 0, 1e-12);
    /* ZeRO-2 without a pipeline reduce-scatters after every micro-batch's
     * backward (zero.c), none hidden on full cores: m of them */
    l.microbatches = 3;
    double rs = pt_plan_allgather_s(2, B, bw, lat);
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP], 3 * rs + tg, 0, 1e-12);
    /* with cores to spare (one thread a rank) each hides behind the
     * compute after it (here far longer), unless parallel.overlap is off:
     * then all three wait */
    prof.cores = 4, c.parallel.overlap = 1, l.threads = 1;
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK(t.compute_s / 3 > rs);
    CHECK_NEAR(t.comm_s[PT_MESH_DP], tg, 0, 1e-12);
    c.parallel.overlap = 0;
    CHECK_OK(pt_plan_time_predict(&c, &l, &cl, &t));
    CHECK_NEAR(t.comm_s[PT_MESH_DP], 3 * rs + tg, 0, 1e-12);
}

/* The tied wte between the embedding's and the head's pipeline ranks
 * (trainer_pipe.c): the step's first forward waits for its send; the
 * embedding's last weight pass ends no earlier than the head's gradient
 * lands (sent after the head's last weight pass), then adds it. */
static void test_tied_embedding(void) {
    pt_plan_layout l = layout(1, 1, 2, "gpipe", 1, 1);
    pt_plan_pipe *pp = calloc(1, sizeof *pp);
    pp->p = 2, pp->v = 1, pp->m = 1, pp->G = 2, pp->stride = 1, pp->dpn = 64, pp->slow = 1;
    double f[2] = {1, 2}, bw[2] = {3, 4}, x = 0.25, tied = 5, add = 0.5;
    for (int g = 0; g < 2; g++) {
        pp->f[g] = pp->fa[g] = f[g];
        pp->b[g] = pp->ba[g] = bw[g] / 2, pp->w[g] = pp->wa[g] = bw[g] / 2;
        pp->rank_of[g] = g;
    }
    pp->p2p_intra = pp->p2p_inter = x;
    pp->tied_s = tied, pp->tied_add = add;
    /* stage 0's F ends at 1 + 5, stage 1's F and BW (the head's last) at
     * 6 + x + 2 + 4 = H; stage 0's BW starts at H + x, or H + 5 - 3 if
     * later, and takes 3 + 0.5 */
    double H = f[0] + tied + x + f[1] + bw[1], mk = 0;
    CHECK_OK(pt_plan_pipe_simulate(&l, pp, 1, &mk, NULL, NULL));
    CHECK_NEAR(mk, fmax(H + x, H + tied - bw[0]) + bw[0] + add, 1e-12, 0);
    CHECK_NEAR(pp->busy[0], f[0] + tied + bw[0] + add, 1e-12, 0);
    /* without transfers: the add stays, the waits go */
    CHECK_OK(pt_plan_pipe_simulate(&l, pp, 0, &mk, NULL, NULL));
    CHECK_NEAR(mk, f[0] + f[1] + bw[1] + bw[0] + add, 1e-12, 0);
    /* The shared run (pt_sched_simulate), every pass as long alone as
     * beside the others, is the plain one: it cannot start the
     * embedding's last weight pass early to end at the gradient's arrival,
     * so it runs it and then waits. With zb1's split W, that pass is ready
     * before the head's last has ended (before: it waited for that end,
     * then ran, 0.45 s later at m 4). */
    static const char *sched[3] = {"gpipe", "1f1b", "zb1"};
    for (int k = 0; k < 3; k++) {
        for (int m = 1; m <= 4; m *= 2) {
            pt_plan_layout lk = layout(1, 1, 2, sched[k], 1, m);
            pp->m = m, pp->slow = 1;
            for (int g = 0; g < 2; g++) {
                pp->fc[g] = pp->fa[g] = pp->f[g] = f[g] * 0.3;
                pp->bc[g] = pp->ba[g] = pp->b[g] = bw[g] * 0.15;
                pp->wc[g] = pp->wa[g] = pp->w[g] = bw[g] * 0.15;
            }
            for (int p2p = 0; p2p < 2; p2p++) {
                double ded = 0, ev = 0, busy[2];
                pp->alone = 0;
                CHECK_OK(pt_plan_pipe_simulate(&lk, pp, p2p, &ded, NULL, NULL));
                busy[0] = pp->busy[0], busy[1] = pp->busy[1];
                pp->alone = 1;
                CHECK_OK(pt_plan_pipe_simulate(&lk, pp, p2p, &ev, NULL, NULL));
                CHECK_NEAR(ev, ded, 1e-12, 0);
                CHECK_NEAR(pp->busy[0], busy[0], 1e-12, 0);
                CHECK_NEAR(pp->busy[1], busy[1], 1e-12, 0);
            }
        }
    }
    free(pp);

    /* from the model: the vocabulary shard over the link (no profile), and
     * nothing where one rank holds both (zbv's V puts the head on rank 0).
     * At dp 1 the two stages split wte's update (tied_split.c): nothing at
     * the first forward or the last backward; after the passes each way a
     * half of the gradient and of the rows, and the half's add */
    pt_cluster cl = hand_cluster(1, 8);
    pt_config c = small_model();
    pt_plan_pipe *q = calloc(1, sizeof *q);
    pt_plan_layout h = layout(1, 2, 2, "1f1b", 1, 2);
    CHECK_OK(pt_plan_pipe_times(&c, &h, &cl, q));
    double V = c.model.vocab_size;
    double hb = (V - (double)pt_tied_split_rows((int)V)) * c.model.n_embd / 2 * 4;
    double one = hb / (cl.intra_node.bw * cl.efficiency.comm) + cl.intra_node.latency;
    CHECK(q->tied_split && q->tied_s == 0 && q->tied_add == 0);
    CHECK_NEAR(q->tied_x, 2 * one + 3 * hb / (cl.device.memory_bw * cl.efficiency.elementwise),
               1e-12, 0);
    /* with data parallelism the embedding's stage updates all of it (tied.c) */
    pt_plan_layout t = layout(2, 2, 2, "1f1b", 1, 2);
    CHECK_OK(pt_plan_pipe_times(&c, &t, &cl, q));
    CHECK(!q->tied_split && q->tied_x == 0);
    double wb = (double)c.model.vocab_size * c.model.n_embd / 2 * 4;
    CHECK_NEAR(q->tied_s, wb / (cl.intra_node.bw * cl.efficiency.comm) + cl.intra_node.latency,
               1e-12, 0);
    CHECK(q->tied_add > 0);
    pt_plan_layout v = layout(1, 1, 2, "zbv", 2, 2);
    CHECK_OK(pt_plan_pipe_times(&c, &v, &cl, q));
    CHECK(q->tied_s == 0 && q->tied_add == 0);
    /* on a measured machine, the profile's point-to-point, and every dp
     * rank of the stage sends its own at once: ranks beyond the devices
     * share them (dp 2 x pp 2 on 2 cores, twice a lone pair's time) */
    pt_profile prof;
    memset(&prof, 0, sizeof prof);
    prof.cores = 2;
    pt_profile_comm pc[2] = {{"shm", PT_PROFILE_P2P, 2, 1 << 10, 1e-5},
                             {"shm", PT_PROFILE_P2P, 2, 1 << 30, 0.1}};
    prof.comm = pc, prof.n_comm = 2;
    pt_cluster two = hand_cluster(1, 2);
    two.profile = &prof;
    pt_plan_layout shared = layout(2, 1, 2, "1f1b", 1, 2);
    double lone = pt_plan_coll_s(&two, 1, PT_PROFILE_P2P, 2, wb * 2, &two.intra_node);
    CHECK(lone > 1e-5 && lone < 0.1);
    CHECK_OK(pt_plan_pipe_times(&c, &shared, &two, q));
    CHECK_NEAR(q->tied_s, 2 * lone, 1e-12, 0);
    free(q);
}

int main(void) {
    RUN(test_bubble_formula);
    RUN(test_dp_ring);
    RUN(test_tp_ring);
    RUN(test_oversubscription);
    RUN(test_profile_modules);
    RUN(test_profile_groups);
    RUN(test_shared_pipeline);
    RUN(test_tied_embedding);
    RUN(test_profile_optimizer);
    RUN(test_profile_exposed);
    RUN(test_profile_collectives);
    return TEST_DONE();
}
