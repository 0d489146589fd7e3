/* The search's cached memory model (pt_plan_memory_cached) against the
 * public uncached one (pt_plan_memory): on a sweep of every layout shape of
 * 8 ranks (dp x tp x pp, sp, schedule, v, m, ZeRO stage and group,
 * recompute, per-stage recompute, ZeRO-3 whole modules, uneven stage
 * layers), both precisions, two models through one cache in turn, and
 * the pipelines of a deeper model (the cached stages shortened), the
 * same status, the same error text and bitwise the same numbers. */
#include <stdlib.h>
#include <string.h>

#include "../../src/plan/plan_memory_impl.h"
#include "plan_test.h"
#include "pt_test.h"

typedef struct {
    pt_plan_layout *l;
    int n, cap;
} layouts;

static void add(layouts *s, const pt_plan_layout *l) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->l = realloc(s->l, sizeof *s->l * (size_t)s->cap);
    }
    s->l[s->n++] = *l;
}

static void sweep(layouts *s, int world) {
    static const char *const scheds[] = {"gpipe", "1f1b", "interleaved", "zb1", "zbv"};
    static const int ms[] = {1, 2, 4, 8};
    for (int dp = 1; dp <= world; dp *= 2)
        for (int tp = 1; dp * tp <= world; tp *= 2) {
            int pp = world / (dp * tp);
            for (int sp = 0; sp <= (tp > 1); sp++)
                for (int si = 0; si < (pp > 1 ? 5 : 1); si++)
                    for (int v = 1; v <= (pp > 1 ? 2 : 1); v++)
                        for (int mi = 0; mi < 4; mi++)
                            for (int z = 0; z <= (dp > 1 ? 3 : 0); z++)
                                for (int zg = 0; zg <= (z > 0 && dp >= 4 ? 2 : 0); zg += 2)
                                    for (int rc = 0; rc < 3; rc++) {
                                        pt_plan_layout l;
                                        memset(&l, 0, sizeof l);
                                        l.dp = dp, l.tp = tp, l.pp = pp, l.zero = z;
                                        l.zero_group = zg, l.sequence_parallel = sp;
                                        l.microbatches = ms[mi], l.virtual_stages = v;
                                        snprintf(l.schedule, sizeof l.schedule, "%s",
                                                 pp > 1 ? scheds[si] : "none");
                                        l.recompute = rc, l.threads = 1;
                                        add(s, &l);
                                        if (rc) continue;
                                        /* the per-part choices, on the uniform none */
                                        pt_plan_layout w = l;
                                        if (pp > 1) {
                                            snprintf(
                                                w.stage_recompute, sizeof w.stage_recompute, "%s",
                                                pp == 2 ? "full,none" : "selective,none,full,none");
                                            add(s, &w);
                                        }
                                        if (z == 3) {
                                            w = l;
                                            snprintf(w.zero_whole, sizeof w.zero_whole,
                                                     "embedding,h.1");
                                            add(s, &w);
                                        }
                                        if (pp == 2 && v == 1) {
                                            w = l;
                                            snprintf(w.stage_layers, sizeof w.stage_layers, "1,3");
                                            add(s, &w);
                                        }
                                    }
        }
}

/* Pipelines of a deeper model, where a stage holds a few of many blocks
 * and the cached model shortens the runs of blocks it does not hold
 * (memory.c, shorten()): every schedule, interleaved at 2-4 chunks, cuts
 * uneven and balanced, ZeRO-3 with whole modules on either side of the
 * runs, over 8 ranks. */
static void sweep_deep(layouts *s) {
    static const char *const scheds[] = {"gpipe", "1f1b", "interleaved", "zb1", "zbv"};
    static const int pps[] = {2, 4, 8}, ms[] = {1, 8};
    for (int pi = 0; pi < 3; pi++)
        for (int dp = 1; dp * pps[pi] <= 8; dp *= 2)
            for (int si = 0; si < 5; si++)
                for (int v = 1; v <= 4; v++) {
                    int virt = si == 2 || si == 4;
                    if (virt ? v < 2 || (si == 4 && v != 2) : v > 1) continue;
                    for (int mi = 0; mi < 2; mi++)
                        for (int z = 0; z <= (dp > 1 ? 3 : 0); z += 3)
                            for (int rc = 0; rc < 3; rc++) {
                                pt_plan_layout l;
                                memset(&l, 0, sizeof l);
                                l.dp = dp, l.tp = 8 / dp / pps[pi], l.pp = pps[pi], l.zero = z;
                                l.microbatches = ms[mi], l.virtual_stages = v;
                                snprintf(l.schedule, sizeof l.schedule, "%s", scheds[si]);
                                l.recompute = rc, l.threads = 1;
                                add(s, &l);
                                pt_plan_layout w = l;
                                if (z == 3) {
                                    snprintf(w.zero_whole, sizeof w.zero_whole,
                                             "embedding,h.0,h.6,h.19,h.20,head");
                                    add(s, &w);
                                }
                                /* uneven: runs of 1, 9 and 10 blocks apart */
                                const char *cut = l.pp * v == 2   ? "1,20"
                                                  : l.pp * v == 4 ? "9,1,1,10"
                                                  : l.pp * v == 8 ? "1,9,1,1,1,1,1,6"
                                                                  : NULL;
                                if (cut) {
                                    snprintf(w.stage_layers, sizeof w.stage_layers, "%s", cut);
                                    add(s, &w);
                                }
                            }
                }
}

/* Every layout of s through k (in order, or reversed) against the uncached
 * model; *ok counts those with numbers. */
static void compare(pt_plan_memory_cache *k, const pt_config *c, const pt_cluster *cl,
                    const layouts *s, int reversed, long *ok, long *pipelined) {
    pt_plan_mem *ref = malloc(sizeof *ref), *got = malloc(sizeof *got);
    char msg[512];
    int bad = 0;
    for (int i = 0; i < s->n; i++) {
        const pt_plan_layout *l = &s->l[reversed ? s->n - 1 - i : i];
        pt_status a = pt_plan_memory(c, l, cl, ref);
        snprintf(msg, sizeof msg, "%s", a == PT_OK ? "" : pt_error_message());
        pt_status b = pt_plan_memory_cached(k, c, l, cl, got);
        int same = a == b &&
                   (a != PT_OK ? !strcmp(msg, pt_error_message()) : !memcmp(ref, got, sizeof *ref));
        if (!same && bad++ < 5) {
            char name[512];
            pt_plan_layout_name(l, name, sizeof name);
            fprintf(stderr, "%s (%s): uncached %d %s, cached %d %s (total %.17g vs %.17g)\n", name,
                    c->train.precision, (int)a, msg, (int)b, b ? pt_error_message() : "",
                    ref->max.total, got->max.total);
        }
        CHECK(same);
        if (a == PT_OK) (*ok)++, *pipelined += l->pp > 1;
    }
    free(ref);
    free(got);
}

static void test_sweep(void) {
    layouts s = {0};
    sweep(&s, 8);
    pt_cluster cl = plan_test_cluster(2, 4, 80e9);
    /* b: a vocabulary no tp divides (wte padded), more layers than stages */
    pt_config a = plan_test_model(4, 64, 4, 256, 32, 64),
              b = plan_test_model(6, 48, 4, 201, 16, 64);
    pt_plan_memory_cache *k;
    CHECK_OK(pt_plan_memory_cache_new(&k));
    long ok = 0, piped = 0;
    for (int prec = 0; prec < 2; prec++) {
        const char *name = prec ? "bf16" : "fp32";
        snprintf(a.train.precision, sizeof a.train.precision, "%s", name);
        snprintf(b.train.precision, sizeof b.train.precision, "%s", name);
        /* a, then b (the cache forgets a), then a again from the other end */
        compare(k, &a, &cl, &s, 0, &ok, &piped);
        compare(k, &b, &cl, &s, 0, &ok, &piped);
        compare(k, &a, &cl, &s, 1, &ok, &piped);
    }
    /* the sweep reaches the model: most layouts valid, pipelines among them,
     * and the cache answered */
    fprintf(stderr, "%d layouts, %ld computed (%ld pipelined), %ld cache hits\n", s.n, ok, piped,
            pt_plan_memory_cache_hits(k));
    CHECK(ok > 6 * s.n / 4);
    CHECK(piped > ok / 2);
    CHECK(pt_plan_memory_cache_hits(k) > ok);
    /* c: 21 blocks over up to 32 virtual stages */
    layouts d = {0};
    sweep_deep(&d);
    pt_config c = plan_test_model(21, 64, 4, 256, 32, 64);
    long dok = 0, dpiped = 0;
    for (int prec = 0; prec < 2; prec++) {
        snprintf(c.train.precision, sizeof c.train.precision, "%s", prec ? "bf16" : "fp32");
        compare(k, &c, &cl, &d, 0, &dok, &dpiped);
    }
    fprintf(stderr, "deep: %d layouts, %ld computed\n", d.n, dok);
    CHECK(dok > d.n);
    free(d.l);
    pt_plan_memory_cache_free(k);
    pt_plan_memory_cache_free(NULL);
    /* no cache: pt_plan_memory itself */
    pt_plan_layout l = {.dp = 1,
                        .tp = 2,
                        .pp = 4,
                        .microbatches = 4,
                        .virtual_stages = 1,
                        .schedule = "1f1b",
                        .threads = 1};
    pt_plan_mem *x = malloc(sizeof *x), *y = malloc(sizeof *y);
    CHECK_OK(pt_plan_memory(&a, &l, &cl, x));
    CHECK_OK(pt_plan_memory_cached(NULL, &a, &l, &cl, y));
    CHECK_EQ(x->n_stage, 4);
    CHECK(!memcmp(x, y, sizeof *x));
    free(x);
    free(y);
    free(s.l);
}

int main(void) {
    RUN(test_sweep);
    return TEST_DONE();
}
