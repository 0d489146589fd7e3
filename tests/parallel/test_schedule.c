/* Schedules (parallel.h, schedule.c, pipeline/): for every schedule, p in
 * {1, 2, 3, 4, 8}, m in 1..16 and 32 and the valid v, each rank's list
 * holds every pass it owns exactly once with a chunk's backwards in
 * micro-batch order; in_flight, chunk_in_flight and last_pass equal a
 * recount from the list and the closed forms; the simulator runs every
 * rank's list to the end at four sets of pass times; the bubble equals the
 * closed forms where they hold; zb1 has a third of 1f1b's idle time and zbv
 * less bubble than zb1; every bad configuration is one line naming its key;
 * the simulator refuses lists that deadlock or miss or repeat a pass;
 * none / gpipe through pt_schedule_build are the lists they were; zbv's
 * lists are those of its list scheduler as first written (kept here as the
 * oracle) for p 1..16 x m 1..48; and zbv at the largest step, p 1024 x m
 * 1024, builds valid lists that simulate to the lower bound. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"
#include "pt_test.h"

static const char *NAMES[] = {"none", "gpipe", "1f1b", "interleaved", "zb1", "zbv"};
static const int PS[] = {1, 2, 3, 4, 8};
/* the brief's three, and one where W is longer than F (zb1's closed form
 * no longer holds: the bubble comes from the simulator) */
static const double TIMES[4][3] = {{1, 1, 1}, {1, 2, 1}, {1, 1, 0.5}, {1, 1, 2}};

static int imin(int a, int b) {
    return a < b ? a : b;
}

/* Every rank's list s[0..p-1] simulated with every pass taking 1 (BW 2):
 * the simulator itself, which pt_schedule_simulate builds the lists for
 * (here they may be broken by hand). */
static pt_status unit_simulate(const pt_schedule *s, double *end) {
    int G = s[0].stages * s[0].virtual_stages;
    double *one = malloc(sizeof(double) * (size_t)G);
    for (int g = 0; g < G; g++) one[g] = 1;
    pt_sched_times t = {.f = one, .b = one, .w = one};
    pt_sched_result out = {0};
    pt_status st = pt_sched_simulate(s, &t, &out);
    *end = out.makespan;
    free(one);
    return st;
}

/* The v values to try for a schedule (0-terminated). */
static const int *vs_of(const char *name) {
    static const int one[] = {1, 0}, two[] = {2, 0}, many[] = {2, 3, 4, 0};
    if (!strcmp(name, "interleaved")) return many;
    if (!strcmp(name, "zbv")) return two;
    return one;
}

static int valid(const char *name, int m, int p, int v) {
    int ok = pt_schedule_check(name, m, p, v, 0) == PT_OK;
    pt_error_clear();
    return ok;
}

/* The list against an independent recount; returns 0 on a failed check. */
static void check_rank(const pt_schedule *s, const char *name, int m, int p, int r, int v) {
    int split = !strcmp(name, "zb1") || !strcmp(name, "zbv");
    CHECK_EQ(s->split, split);
    CHECK_EQ(s->npass, (split ? 3 : 2) * m * v);
    CHECK(!strcmp(s->name, name));
    CHECK_EQ(s->microbatches, m);
    CHECK_EQ(s->stages, p);
    CHECK_EQ(s->stage, r);
    CHECK_EQ(s->virtual_stages, v);
    static int cnt[4][PT_SCHEDULE_MAX_MICRO][PT_SCHEDULE_MAX_VIRTUAL];
    memset(cnt, 0, sizeof cnt);
    int held[PT_SCHEDULE_MAX_VIRTUAL] = {0}, peak[PT_SCHEDULE_MAX_VIRTUAL] = {0}, total = 0,
        tpeak = 0, last[PT_SCHEDULE_MAX_VIRTUAL], nextb[PT_SCHEDULE_MAX_VIRTUAL] = {0}, ok = 1;
    for (int c = 0; c < v; c++) last[c] = -1;
    for (int k = 0; k < s->npass; k++) {
        pt_pass q = s->pass[k];
        if (q.micro < 0 || q.micro >= m || q.chunk < 0 || q.chunk >= v) {
            ok = 0;
            break;
        }
        cnt[q.kind][q.micro][q.chunk]++;
        if (q.kind == PT_PASS_FORWARD) {
            if (++held[q.chunk] > peak[q.chunk]) peak[q.chunk] = held[q.chunk];
            if (++total > tpeak) tpeak = total;
        }
        if (q.kind == PT_PASS_BACKWARD || q.kind == PT_PASS_BACKWARD_INPUT) {
            /* a chunk's backwards in increasing micro-batch order */
            if (q.micro != nextb[q.chunk]) ok = 0;
            nextb[q.chunk]++;
        }
        if (q.kind == PT_PASS_BACKWARD || q.kind == PT_PASS_BACKWARD_WEIGHT) {
            held[q.chunk]--, total--;
            last[q.chunk] = k;
        }
    }
    CHECK(ok);
    for (int mb = 0; ok && mb < m; mb++)
        for (int c = 0; c < v; c++) {
            if (cnt[PT_PASS_FORWARD][mb][c] != 1) ok = 0;
            if (cnt[PT_PASS_BACKWARD][mb][c] != !split) ok = 0;
            if (cnt[PT_PASS_BACKWARD_INPUT][mb][c] != split) ok = 0;
            if (cnt[PT_PASS_BACKWARD_WEIGHT][mb][c] != split) ok = 0;
        }
    CHECK(ok);
    CHECK_EQ(s->in_flight, tpeak);
    for (int c = 0; c < v; c++) {
        CHECK_EQ(s->chunk_in_flight[c], peak[c]);
        CHECK_EQ(s->last_pass[c], last[c]);
        CHECK(last[c] >= 0 && s->pass[last[c]].micro == m - 1);
    }
    /* the closed forms */
    if (!strcmp(name, "none")) CHECK_EQ(s->in_flight, 1);
    if (!strcmp(name, "gpipe")) CHECK_EQ(s->in_flight, m);
    if (!strcmp(name, "1f1b")) CHECK_EQ(s->in_flight, imin(p - r, m));
    /* zb1 defers rank r's W's by r: p - r + r = p, 1F1B's peak (rank 0's) */
    if (!strcmp(name, "zb1")) CHECK_EQ(s->in_flight, imin(p, m));
    if (!strcmp(name, "interleaved")) {
        int w = imin(2 * (p - r - 1) + (v - 1) * p, m * v);
        CHECK_EQ(s->in_flight, imin(w + 1, m * v));
    }
    /* zbv: at most 2p chunks (p stages' bytes); the greedy fills them */
    if (!strcmp(name, "zbv")) CHECK_EQ(s->in_flight, imin(2 * p, 2 * m));
    /* the descriptor's rule, which the memory test and others read */
    const pt_sched *d = pt_sched_find(name);
    CHECK(d && s->sched == d);
    CHECK_EQ(d->in_flight(m, p, r, v), s->in_flight);
    CHECK_EQ(d->split, split);
}

/* The descriptor table: every schedule once, in its order, found by name. */
static void test_table(void) {
    int n = 0;
    for (const pt_sched *d; (d = pt_sched_at(n)); n++) {
        CHECK(!strcmp(d->name, NAMES[n]));
        CHECK(pt_sched_find(NAMES[n]) == d);
        CHECK(d->v_min <= d->v_default && d->v_default <= d->v_max);
        CHECK(pt_sched_find(d->as_pipeline) && pt_sched_find(d->as_pipeline)->pipeline);
        CHECK(d->whole || d->pipeline);
    }
    CHECK_EQ(n, 6);
    CHECK(pt_sched_at(-1) == NULL);
    CHECK(pt_sched_find("pipedream") == NULL && pt_sched_find(NULL) == NULL);
}

static void test_lists_and_simulation(void) {
    for (int si = 0; si < 6; si++)
        for (int pi = 0; pi < 5; pi++)
            for (int m = 1; m <= 32; m = m < 16 ? m + 1 : 2 * m)
                for (const int *vp = vs_of(NAMES[si]); *vp; vp++) {
                    const char *name = NAMES[si];
                    int p = PS[pi], v = *vp;
                    if (!valid(name, m, p, v)) continue;
                    for (int r = 0; r < p; r++) {
                        pt_schedule s;
                        CHECK_OK(pt_schedule_build_stage(&s, name, m, p, r, v));
                        check_rank(&s, name, m, p, r, v);
                        for (int c = 0; c < v; c++) {
                            int ch = -1, g = pt_schedule_virtual_stage(&s, c);
                            CHECK_EQ(pt_schedule_locate(name, p, v, g, &ch), r);
                            CHECK_EQ(ch, c);
                        }
                        pt_schedule_free(&s);
                    }
                    for (int ti = 0; ti < 4; ti++) {
                        double tf = TIMES[ti][0], tb = TIMES[ti][1], tw = TIMES[ti][2];
                        double end = 0, busy[8], sum = 0;
                        CHECK_OK(pt_schedule_simulate(name, m, p, v, tf, tb, tw, &end, busy));
                        for (int r = 0; r < p; r++) {
                            CHECK_NEAR(busy[r], m * v * (tf + tb + tw), 1e-9, 0);
                            sum += busy[r];
                        }
                        double b = 1 - sum / (p * end), cf = -1;
                        if (!strcmp(name, "none") || !strcmp(name, "gpipe") ||
                            !strcmp(name, "1f1b"))
                            cf = (double)(p - 1) / (m + p - 1);
                        if (!strcmp(name, "interleaved")) cf = (double)(p - 1) / (v * m + p - 1);
                        if (!strcmp(name, "zb1") && m >= p && tw <= tf && tw <= tb) {
                            double idle = (p - 1) * (tf + tb - tw);
                            cf = idle / (m * (tf + tb + tw) + idle);
                        }
                        if (cf >= 0) CHECK_NEAR(b, cf, 1e-9, 0);
                        CHECK_NEAR(pt_schedule_bubble(name, m, p, v, tf, tb, tw), b, 1e-9, 0);
                    }
                }
}

/* Per-rank idle time at unit times: the bubble in time, not as a fraction
 * of the (longer) 1F1B step. */
static double idle_unit(const char *name, int m, int p, int v) {
    double end = 0, busy[8], idle = 0;
    CHECK_OK(pt_schedule_simulate(name, m, p, v, 1, 1, 1, &end, busy));
    for (int r = 0; r < p; r++) idle += end - busy[r];
    return idle / p;
}

static void test_zero_bubble(void) {
    for (int pi = 1; pi < 5; pi++)
        for (int m = PS[pi]; m <= 32; m = m < 16 ? m + 1 : 2 * m) {
            int p = PS[pi];
            double i1 = idle_unit("1f1b", m, p, 1), iz = idle_unit("zb1", m, p, 1);
            CHECK_NEAR(i1, 3.0 * (p - 1), 1e-9, 0);
            CHECK(iz <= i1 / 3 + 1e-9);
            if (m >= 2 * p) {
                double bz = pt_schedule_bubble("zb1", m, p, 1, 1, 1, 1);
                double bv = pt_schedule_bubble("zbv", m, p, 2, 1, 1, 1);
                CHECK(bv >= 0 && bv < bz);
                if (!(bv < bz)) fprintf(stderr, "  zbv m %d p %d: %g vs zb1 %g\n", m, p, bv, bz);
            }
        }
}

static void expect_error(pt_status st, const char *key) {
    CHECK_EQ(st, PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), key) != NULL);
    if (!strstr(pt_error_message(), key))
        fprintf(stderr, "  message \"%s\" lacks %s\n", pt_error_message(), key);
}

static void test_check_errors(void) {
    CHECK_OK(pt_schedule_check("zbv", 8, 4, 2, 14));
    CHECK_OK(pt_schedule_check("interleaved", 8, 4, 3, 12));
    expect_error(pt_schedule_check("pipedream", 8, 4, 1, 14), "parallel.schedule = pipedream");
    expect_error(pt_schedule_check("1f1b", 0, 4, 1, 14), "parallel.microbatches");
    expect_error(pt_schedule_check("1f1b", 1025, 4, 1, 14), "(got 1025)");
    expect_error(pt_schedule_check("interleaved", 6, 4, 2, 14), "parallel.microbatches = 6");
    expect_error(pt_schedule_check("interleaved", 6, 4, 2, 14), "parallel.pp = 4");
    expect_error(pt_schedule_check("interleaved", 8, 4, 1, 14), "parallel.virtual_stages >= 2");
    expect_error(pt_schedule_check("1f1b", 8, 4, 2, 14), "parallel.virtual_stages = 2");
    expect_error(pt_schedule_check("zb1", 8, 4, 2, 14), "interleaved or zbv");
    expect_error(pt_schedule_check("zbv", 8, 4, 3, 14), "parallel.virtual_stages = 2 (got 3)");
    expect_error(pt_schedule_check("none", 8, 2, 1, 14), "parallel.pp = 2");
    expect_error(pt_schedule_check("none", 8, 2, 1, 14), "gpipe, 1f1b");
    expect_error(pt_schedule_check("zbv", 8, 4, 2, 7),
                 "parallel.pp x parallel.virtual_stages = 8 virtual stages, more than the "
                 "model's 7 modules");
    expect_error(pt_schedule_check("1f1b", 8, 0, 1, 14), "parallel.pp");
    expect_error(pt_schedule_check("interleaved", 8, 1, 9, 14), "parallel.virtual_stages");
    pt_schedule s;
    expect_error(pt_schedule_build_stage(&s, "1f1b", 4, 4, 4, 1), "parallel.pp = 4");
    CHECK(s.pass == NULL && s.npass == 0);
    expect_error(pt_schedule_build_stage(&s, "gpipe", 0, 2, 0, 1), "parallel.microbatches");
    CHECK(pt_schedule_bubble("none", 4, 2, 1, 1, 1, 1) < 0);
    double end;
    expect_error(pt_schedule_simulate("1f1b", 4, 2, 1, -1, 1, 1, &end, NULL), "times");
    CHECK_EQ(pt_schedule_locate("zbv", 4, 2, 8, NULL), -1);
    CHECK_EQ(pt_schedule_locate("zbv", 4, 2, -1, NULL), -1);
    pt_error_clear();
}

/* The V and the interleaving by hand (p = 4). */
static void test_mapping(void) {
    int c = -1;
    CHECK_EQ(pt_schedule_locate("zbv", 4, 2, 0, &c), 0);
    CHECK_EQ(c, 0);
    CHECK_EQ(pt_schedule_locate("zbv", 4, 2, 7, &c), 0);
    CHECK_EQ(c, 1);
    CHECK_EQ(pt_schedule_locate("zbv", 4, 2, 4, &c), 3);
    CHECK_EQ(c, 1);
    CHECK_EQ(pt_schedule_locate("interleaved", 4, 2, 5, &c), 1);
    CHECK_EQ(c, 1);
    CHECK_EQ(pt_schedule_locate("1f1b", 4, 1, 3, &c), 3);
    CHECK_EQ(c, 0);
}

/* none and gpipe for the trainer, exactly as before pipelines. */
static void test_legacy(void) {
    for (int m = 1; m <= 16; m++) {
        pt_schedule s;
        CHECK_OK(pt_schedule_build(&s, "none", m));
        CHECK_EQ(s.npass, 2 * m);
        CHECK_EQ(s.in_flight, 1);
        for (int k = 0; k < s.npass; k++) {
            CHECK_EQ(s.pass[k].kind, k % 2 ? PT_PASS_BACKWARD : PT_PASS_FORWARD);
            CHECK_EQ(s.pass[k].micro, k / 2);
            CHECK_EQ(s.pass[k].chunk, 0);
        }
        pt_schedule_free(&s);
        CHECK_OK(pt_schedule_build(&s, "gpipe", m));
        CHECK_EQ(s.npass, 2 * m);
        CHECK_EQ(s.in_flight, m);
        CHECK_EQ(s.last_pass[0], 2 * m - 1);
        for (int k = 0; k < s.npass; k++) {
            CHECK_EQ(s.pass[k].kind, k < m ? PT_PASS_FORWARD : PT_PASS_BACKWARD);
            CHECK_EQ(s.pass[k].micro, k % m);
        }
        pt_schedule_free(&s);
        pt_schedule_free(&s); /* idempotent */
        CHECK(s.pass == NULL);
    }
    pt_schedule_free(NULL);
    pt_schedule s;
    CHECK_EQ(pt_schedule_build(&s, "1f1b", 4), PT_ERR_UNSUPPORTED);
    CHECK(strstr(pt_error_message(), "parallel.schedule = 1f1b") != NULL);
    CHECK_EQ(pt_schedule_build(&s, "gpipe", 0), PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "parallel.microbatches") != NULL);
    CHECK_EQ(pt_schedule_build(&s, "gpipe", PT_SCHEDULE_MAX_MICRO + 1), PT_ERR_INVALID);
    CHECK(s.pass == NULL);
    /* the largest step still builds, simulates and frees */
    CHECK_OK(pt_schedule_build(&s, "gpipe", PT_SCHEDULE_MAX_MICRO));
    CHECK_EQ(s.in_flight, PT_SCHEDULE_MAX_MICRO);
    pt_schedule_free(&s);
    double end;
    CHECK_OK(pt_schedule_simulate("zbv", PT_SCHEDULE_MAX_MICRO, 8, 2, 1, 1, 1, &end, NULL));
    CHECK_EQ(pt_mem_current(PT_MEM_SCRATCH), 0);
    pt_error_clear();
}

/* The simulator is the oracle of every list above: it must refuse broken
 * ones. gpipe at p = 2, m = 2, rewritten by hand. */
static void test_simulator_refuses(void) {
    pt_schedule s[2];
    double end;
    for (int r = 0; r < 2; r++) CHECK_OK(pt_schedule_build_stage(&s[r], "gpipe", 2, 2, r, 1));
    CHECK_OK(unit_simulate(s, &end));
    CHECK_NEAR(end, 9, 1e-12, 0); /* (m+p-1)(tf+tb+tw) */
    /* rank 0 runs none's order, rank 1 BW1 before BW0: rank 0's BW0 waits
     * on rank 1's BW0, behind its BW1, behind F1, behind rank 0's BW0 */
    pt_pass r0[4] = {{PT_PASS_FORWARD, 0, 0},
                     {PT_PASS_BACKWARD, 0, 0},
                     {PT_PASS_FORWARD, 1, 0},
                     {PT_PASS_BACKWARD, 1, 0}};
    pt_pass r1[4] = {{PT_PASS_FORWARD, 0, 0},
                     {PT_PASS_FORWARD, 1, 0},
                     {PT_PASS_BACKWARD, 1, 0},
                     {PT_PASS_BACKWARD, 0, 0}};
    memcpy(s[0].pass, r0, sizeof r0);
    memcpy(s[1].pass, r1, sizeof r1);
    CHECK_EQ(unit_simulate(s, &end), PT_ERR_INTERNAL);
    CHECK(strstr(pt_error_message(), "deadlocks: rank 0 waits at pass 1") != NULL);
    /* a backward before its own forward */
    pt_pass early[4] = {{PT_PASS_BACKWARD, 0, 0},
                        {PT_PASS_FORWARD, 0, 0},
                        {PT_PASS_FORWARD, 1, 0},
                        {PT_PASS_BACKWARD, 1, 0}};
    memcpy(s[1].pass, early, sizeof early);
    memcpy(s[0].pass, r0, sizeof r0);
    CHECK_EQ(unit_simulate(s, &end), PT_ERR_INTERNAL);
    CHECK(strstr(pt_error_message(), "deadlocks") != NULL);
    /* a pass repeated (so another missing) */
    s[1].pass[3] = (pt_pass){PT_PASS_BACKWARD, 0, 0};
    CHECK_EQ(unit_simulate(s, &end), PT_ERR_INTERNAL);
    CHECK(strstr(pt_error_message(), "BW of micro-batch 0 chunk 0 appears 2 times") != NULL);
    /* a split pass in a non-split schedule */
    s[1].pass[3] = (pt_pass){PT_PASS_BACKWARD_INPUT, 1, 0};
    CHECK_EQ(unit_simulate(s, &end), PT_ERR_INTERNAL);
    CHECK(strstr(pt_error_message(), "does not belong") != NULL);
    for (int r = 0; r < 2; r++) pt_schedule_free(&s[r]);
    /* zb1 with a W moved before its B */
    for (int r = 0; r < 2; r++) CHECK_OK(pt_schedule_build_stage(&s[r], "zb1", 2, 2, r, 1));
    CHECK_OK(unit_simulate(s, &end));
    int kb = -1, kw = -1;
    for (int k = 0; k < s[1].npass; k++) {
        if (s[1].pass[k].kind == PT_PASS_BACKWARD_INPUT && s[1].pass[k].micro == 0) kb = k;
        if (s[1].pass[k].kind == PT_PASS_BACKWARD_WEIGHT && s[1].pass[k].micro == 0) kw = k;
    }
    CHECK(kb >= 0 && kw > kb);
    pt_pass tmp = s[1].pass[kb];
    s[1].pass[kb] = s[1].pass[kw], s[1].pass[kw] = tmp;
    CHECK_EQ(unit_simulate(s, &end), PT_ERR_INTERNAL);
    char want[96];
    snprintf(want, sizeof want, "rank 1 waits at pass %d (W of micro-batch 0 chunk 0)", kb);
    CHECK(strstr(pt_error_message(), want) != NULL);
    for (int r = 0; r < 2; r++) pt_schedule_free(&s[r]);
    pt_error_clear();
}

/* Every rank's lists at once (pt_schedule_build_all; zbv from one run of
 * its list scheduler) are each rank's own list, pass for pass, with the
 * same counts. */
static void test_build_all(void) {
    static const struct {
        const char *name;
        int p, v;
    } cases[] = {
        {"zbv", 2, 2}, {"zbv", 3, 2}, {"zbv", 5, 2}, {"1f1b", 4, 1}, {"interleaved", 2, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int m = 1; m <= 9; m += 4) {
            int p = cases[i].p, v = cases[i].v;
            if (pt_schedule_check(cases[i].name, m, p, v, 0) != PT_OK) {
                pt_error_clear();
                continue;
            }
            pt_schedule all[5], one;
            CHECK_OK(pt_schedule_build_all(all, cases[i].name, m, p, v));
            for (int r = 0; r < p; r++) {
                CHECK_OK(pt_schedule_build_stage(&one, cases[i].name, m, p, r, v));
                CHECK_EQ(all[r].npass, one.npass);
                CHECK_EQ(all[r].stage, r);
                CHECK_EQ(all[r].in_flight, one.in_flight);
                CHECK(!strcmp(all[r].name, one.name));
                CHECK(memcmp(all[r].pass, one.pass, sizeof(pt_pass) * (size_t)one.npass) == 0);
                pt_schedule_free(&one);
                pt_schedule_free(&all[r]);
            }
        }
    /* an invalid configuration: one line, every list zeroed */
    pt_schedule bad[2];
    CHECK(pt_schedule_build_all(bad, "zbv", 2, 2, 3) != PT_OK);
    CHECK(bad[0].pass == NULL && bad[1].pass == NULL);
    pt_error_clear();
}

/* ---- zbv's list scheduler as it was first written: the oracle ---------------
 * The paper's greedy at unit times, run the plain way: take the earliest
 * free rank (ties to the lowest), let it choose (a ready B, smallest
 * micro-batch then chunk 1; a ready F, chunk 1 first, within 2p chunks
 * with one kept for chunk 1; a pending W), or put it to sleep until the
 * next pass ends. A scan of all p ranks per pass, O(m p^2): zbv.c steps
 * through time slots instead and must give these lists pass for pass. */
enum { REF_F, REF_B, REF_W };

typedef struct {
    int next[2][3];
    double free_at;
    int asleep, done;
} ref_rank;

static int ref_g(int p, int r, int c) {
    return c == 0 ? r : 2 * p - 1 - r;
}

/* Every rank's list into out[r] (room for 6m) and its count n[r]. */
static void zbv_reference(pt_pass *const *out, int *n, int m, int p) {
    int G = 2 * p, cap = 2 * p;
    double *fin = malloc(sizeof(double) * 2 * (size_t)m * G);
    ref_rank *rk = calloc((size_t)p, sizeof *rk);
    for (size_t i = 0; i < 2 * (size_t)m * G; i++) fin[i] = INFINITY;
    for (int k = 0; k < p; k++) n[k] = 0;
#define FIN(kind, mb, g) fin[((size_t)(kind)*m + (mb)) * G + (g)]
    for (int left = p; left > 0;) {
        int q = -1;
        for (int k = 0; k < p; k++)
            if (!rk[k].done && (q < 0 || rk[k].free_at < rk[q].free_at)) q = k;
        ref_rank *R = &rk[q];
        if (!isfinite(R->free_at)) break; /* a deadlock: the lists come out short */
        double t = R->free_at;
        int held = 0, kind = -1, chunk = -1;
        for (int c = 0; c < 2; c++) held += R->next[c][REF_F] - R->next[c][REF_W];
        for (int c = 1; c >= 0; c--) {
            int mb = R->next[c][REF_B], g = ref_g(p, q, c);
            if (mb < m && FIN(REF_F, mb, g) <= t && (g == G - 1 || FIN(REF_B, mb, g + 1) <= t) &&
                (kind < 0 || mb < R->next[chunk][REF_B]))
                kind = REF_B, chunk = c;
        }
        for (int c = 1; kind < 0 && c >= 0; c--) {
            int mb = R->next[c][REF_F], g = ref_g(p, q, c);
            if (mb < m && (g == 0 || FIN(REF_F, mb, g - 1) <= t) && held < cap - (c == 0))
                kind = REF_F, chunk = c;
        }
        for (int c = 1; kind < 0 && c >= 0; c--)
            if (R->next[c][REF_W] < R->next[c][REF_B]) kind = REF_W, chunk = c;
        if (kind < 0) {
            double wake = INFINITY;
            for (int k = 0; k < p; k++)
                if (rk[k].free_at > t && rk[k].free_at < wake) wake = rk[k].free_at;
            R->free_at = wake, R->asleep = 1;
            continue;
        }
        int mb = R->next[chunk][kind]++, g = ref_g(p, q, chunk);
        double end = t + 1;
        if (kind != REF_W) FIN(kind, mb, g) = end;
        R->free_at = end, R->asleep = 0;
        for (int k = 0; k < p; k++)
            if (rk[k].asleep && rk[k].free_at > end) rk[k].free_at = end;
        pt_pass_kind pk = kind == REF_F   ? PT_PASS_FORWARD
                          : kind == REF_B ? PT_PASS_BACKWARD_INPUT
                                          : PT_PASS_BACKWARD_WEIGHT;
        out[q][n[q]++] = (pt_pass){pk, mb, chunk};
        if (R->next[0][REF_W] == m && R->next[1][REF_W] == m) R->done = 1, left--;
    }
#undef FIN
    free(rk);
    free(fin);
}

/* zbv's lists against the oracle's, pass for pass: p 1..16 x m 1..48 and
 * a few larger (the oracle's O(m p^2) keeps them small). */
static void test_zbv_reference(void) {
    static const int big[][2] = {{24, 64}, {32, 33}, {40, 80}, {64, 64}};
    int nbig = (int)(sizeof big / sizeof big[0]), bad = 0;
    for (int i = 0; i < 16 * 48 + nbig; i++) {
        int p = i < 16 * 48 ? 1 + i / 48 : big[i - 16 * 48][0];
        int m = i < 16 * 48 ? 1 + i % 48 : big[i - 16 * 48][1];
        pt_schedule *s = calloc((size_t)p, sizeof *s);
        pt_pass **ref = calloc((size_t)p, sizeof *ref);
        int *n = calloc((size_t)p, sizeof *n);
        for (int r = 0; r < p; r++) ref[r] = malloc(sizeof(pt_pass) * 6 * (size_t)m);
        zbv_reference(ref, n, m, p);
        CHECK_OK(pt_schedule_build_all(s, "zbv", m, p, 2));
        for (int r = 0; r < p; r++) {
            int same =
                s[r].npass == n[r] && !memcmp(s[r].pass, ref[r], sizeof(pt_pass) * (size_t)n[r]);
            if (!same && bad++ < 4) fprintf(stderr, "  zbv p %d m %d rank %d differs\n", p, m, r);
            pt_schedule_free(&s[r]);
            free(ref[r]);
        }
        free(n);
        free(ref);
        free(s);
    }
    CHECK_EQ(bad, 0); /* lists that differ */
    CHECK_EQ(pt_mem_current(PT_MEM_SCRATCH), 0);
}

/* zbv at the largest step, p 1024 and m 1024 (6.3 million passes): every
 * rank's list valid and run by the simulator to the end. Both are linear
 * in the passes (0.3 s of CPU in release, 2 s under the sanitizers); the
 * list scheduler was O(m p^2), 34 s here in release and about two minutes
 * under the sanitizers, so this test's time is where a quadratic one would
 * show. */
static void test_zbv_large(void) {
    int p = 1024, m = PT_SCHEDULE_MAX_MICRO;
    pt_schedule *s = calloc((size_t)p, sizeof *s);
    double end = 0;
    CHECK_OK(pt_schedule_build_all(s, "zbv", m, p, 2));
    for (int r = 0; r < p; r++) check_rank(&s[r], "zbv", m, p, r, 2);
    CHECK_OK(unit_simulate(s, &end));
    /* rank p-1 starts nothing before p-1, then has 6m passes: the greedy
     * meets that bound here */
    CHECK_NEAR(end, 6.0 * m + p - 1, 0, 0);
    for (int r = 0; r < p; r++) pt_schedule_free(&s[r]);
    free(s);
    CHECK_EQ(pt_mem_current(PT_MEM_SCRATCH), 0);
}

int main(void) {
    RUN(test_table);
    RUN(test_legacy);
    RUN(test_mapping);
    RUN(test_check_errors);
    RUN(test_simulator_refuses);
    RUN(test_lists_and_simulation);
    RUN(test_zero_bubble);
    RUN(test_build_all);
    RUN(test_zbv_reference);
    RUN(test_zbv_large);
    return TEST_DONE();
}
