/* Tensor parallelism against one worker, module by module, over a real tp
 * group of 2 forked ranks (shm), plain and under sequence parallelism.
 * Each rank runs its slice of the model (Megatron's split) through the
 * module chain -- forwards, then the fused backward -- and so does the
 * tp = 1 model with the same weights, in the same process (the same code
 * over a group of one). The rank's outputs must be the single worker's:
 *   each module's output (the residual stream; this rank's rows under
 *   sequence parallelism), the losses, each module's input gradient (its
 *   rows), and every parameter gradient (this rank's slice of it, mapped
 *   by pt_shard_run),
 * within TOL of the largest magnitude of the buffer compared. Only the
 * order of float32 additions differs (partial products summed over the
 * group, a sum split in two), about K 2^-24 of the terms' magnitudes for
 * K <= 4C = 64 terms, through two blocks: measured worst 3.1e-7 (plain
 * and sequence parallel); TOL 1e-5 leaves 30x for other CPUs' kernels, and
 * a missing or doubled collective moves a buffer by O(1) of its magnitude.
 * The comparison proves it can fail: with the test seam
 * pt_model_test_skip_f on (Megatron's f skipped: c_attn's input gradient
 * not summed over the group), the forward still matches and the input and
 * parameter gradients must not.
 *
 * And on each rank, the reordered chain -- B for every module, then W for
 * every module, each context with a scratch of its own, as a zero-bubble
 * schedule runs them -- must give the fused chain's input and parameter
 * gradients BIT FOR BIT: W reads only what B left in its context's scratch
 * and the saved activations, after the other modules' passes ran. The
 * tp = 1 split cases are test_model.c's; the whole training step against
 * one worker is test_tp's. */
#include <math.h>
#include <string.h>

#include "../../src/model/model_test.h" /* pt_model_test_skip_f */
#include "partrain/comm.h"
#include "partrain/model.h"
#include "pt_test.h"

static const pt_model_config cfg = {2, 16, 4, 40, 8}; /* L, C, NH, V, T */
enum { BT = 2 * 8, NC = BT * 16, TP = 2 };
#define TOL      1e-5
#define CHAIN_NC NC
#define CHAIN_N  BT
#include "split_chain.h"

static int chain(pt_model *m, pt_module_ctx **ctx, const pt_batch *b, chain_bufs *cb, int mode) {
    memset(cb, 0, sizeof *cb); /* under sequence parallelism only R rows are written */
    int bad = chain_forward(m, ctx, b, cb) | chain_input(m, ctx, b, cb, mode);
    if (mode == CH_ALLB_ALLW) bad |= chain_weight(m, ctx, b);
    return bad;
}

/* The single worker's weights: GPT-2's draw, the LayerNorm weights away
 * from 1 and the biases away from 0 (every term matters). */
static pt_model *full_model(void) {
    pt_model *m = NULL;
    if (pt_model_new(&m, &cfg, 2) != PT_OK) return NULL;
    pt_model_draw_weights(m, 5);
    float *p = pt_model_params(m);
    for (int t = 0; t < pt_model_num_tensors(m); t++) {
        const pt_param_info *ti = pt_model_tensor(m, t);
        if (strstr(ti->name, "ln_") || strstr(ti->name, "bias"))
            for (size_t j = 0; j < ti->numel; j++) p[ti->offset + j] += 0.01f * (float)(j % 7);
    }
    return m;
}

/* Each of dst's tensors (or gradients): its slice of src's, run by run. */
static void slice_of(pt_model *dst, float *d, const pt_model *src, const float *s) {
    for (int t = 0; t < pt_model_num_tensors(dst); t++) {
        const pt_param_info *ti = pt_model_tensor(dst, t), *fi = pt_model_find(src, ti->name);
        for (size_t k = 0; k < pt_shard_num_runs(&ti->shard); k++) {
            size_t g, l, len;
            pt_shard_run(&ti->shard, k, &g, &l, &len);
            memcpy(d + ti->offset + l, s + fi->offset + g, len * sizeof(float));
        }
    }
}

/* 0 when got (n) is within TOL * max|want| of want; else 1, naming the
 * first element off with both values. *worst: the largest such ratio. */
static int near(const char *what, int i, const float *got, const float *want, size_t n, int quiet,
                double *worst) {
    double big = 0, diff = 0;
    size_t at = 0;
    for (size_t j = 0; j < n; j++) big = fmax(big, fabs(want[j]));
    for (size_t j = 0; j < n; j++) {
        double d = fabs((double)got[j] - want[j]);
        if (d > diff || d != d) diff = d, at = j;
    }
    double rel = big > 0 ? diff / big : diff;
    if (rel > *worst || rel != rel) *worst = rel;
    if (rel <= TOL) return 0;
    if (!quiet)
        fprintf(stderr, "  %s %d: [%zu] %.9g vs one worker's %.9g (%.1e of max %.3g)\n", what, i,
                at, got[at], want[at], rel, big);
    return 1;
}

enum { D_ACTS = 1, D_LOSSES = 2, D_DIN = 4, D_GRADS = 8 };

/* Which of the rank's results differ from the single worker's (D_*
 * mask): g the slice model's chain, w the full model's, gw the full
 * model's gradients. */
static unsigned compare(pt_model *m, const chain_bufs *g, const chain_bufs *w, const pt_model *full,
                        const float *gw, int quiet, double *worst) {
    static float want[40000];
    int sp = pt_model_sequence_parallel(m), size, r;
    pt_model_tp(m, &size, &r);
    size_t R = sp ? BT / TP : BT, off = sp ? (size_t)r * R * 16 : 0;
    unsigned diff = 0;
    for (int i = 0; i < NMOD - 1; i++)
        if (near("module output", i, g->acts[i], w->acts[i] + off, R * 16, quiet, worst))
            diff |= D_ACTS;
    if (near("losses", 0, g->losses, w->losses, BT, quiet, worst)) diff |= D_LOSSES;
    for (int i = 1; i < NMOD; i++)
        if (near("input gradient of module", i, g->din[i], w->din[i] + off, R * 16, quiet, worst))
            diff |= D_DIN;
    slice_of(m, want, full, gw);
    const float *got = pt_model_grads(m);
    for (int t = 0; t < pt_model_num_tensors(m); t++) {
        const pt_param_info *ti = pt_model_tensor(m, t);
        if (near(ti->name, r, got + ti->offset, want + ti->offset, ti->numel, quiet, worst))
            diff |= D_GRADS;
    }
    return diff;
}

typedef struct {
    pt_module_ctx *ctx[NMOD], *own[NMOD];
    pt_module_scratch *scr[NMOD];
} ctx_sets;

static int ctx_sets_new(ctx_sets *c, pt_model *m) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < NMOD; i++) {
        if (pt_module_ctx_new(&c->ctx[i], m, i, 2) != PT_OK) return 1;
        if (pt_module_ctx_new(&c->own[i], m, i, 2) != PT_OK) return 1;
        if (pt_module_scratch_new(&c->scr[i], m, 2) != PT_OK) return 1;
        pt_module_ctx_set_scratch(c->own[i], c->scr[i]);
    }
    return 0;
}
static void ctx_sets_free(ctx_sets *c) {
    for (int i = 0; i < NMOD; i++) {
        pt_module_ctx_free(c->ctx[i]);
        pt_module_ctx_free(c->own[i]);
        pt_module_scratch_free(c->scr[i]);
    }
}

/* The reordered chain on this rank: bit for bit the fused one (gf, cf). */
static int reordered_same(pt_model *m, ctx_sets *c, const pt_batch *b, const float *gf,
                          const chain_bufs *cf, int r, int sp) {
    static chain_bufs cs;
    size_t n = pt_model_num_params(m);
    int fail = 0;
    pt_model_zero_grads(m);
    if (chain(m, c->own, b, &cs, CH_ALLB_ALLW)) return 1;
    if (memcmp(pt_model_grads(m), gf, n * sizeof(float)) != 0) {
        fprintf(stderr, "rank %d sp %d: every B then every W: parameter gradients differ\n", r, sp);
        fail = 1;
    }
    for (int i = 1; i < NMOD; i++)
        for (int j = 0; j < NC; j++)
            if (memcmp(&cs.din[i][j], &cf->din[i][j], sizeof(float)) != 0) {
                fprintf(stderr, "rank %d sp %d: every B then every W: din[%d][%d] %g vs %g\n", r,
                        sp, i, j, cs.din[i][j], cf->din[i][j]);
                fail = 1;
                break;
            }
    return fail;
}

/* 0 when this rank's slice matches the single worker (and, with the seam
 * planted, fails to). */
static int check_layout(pt_comm *tp, int sp) {
    static chain_bufs cw, cf;
    static float gw[40000], gf[40000];
    int r = pt_comm_rank(tp), fail = 0;
    pt_model *full = full_model(), *m = NULL;
    pt_model_options o = {.tp = TP, .tp_rank = r, .sp = sp};
    if (!full || pt_model_new_opts(&m, &cfg, 2, &o) != PT_OK) return 1;
    pt_model_set_tp_comm(m, tp);
    slice_of(m, pt_model_params(m), full, pt_model_params(full));
    int x[BT], y[BT];
    for (int i = 0; i < BT; i++) x[i] = (i * 7 + 3) % cfg.vocab_size, y[i] = (i * 5 + 1) % 40;
    pt_batch b = {x, y, 1.0f / BT, 2, 8, 0, 1};
    size_t n = pt_model_num_params(m), nfull = pt_model_num_params(full);
    ctx_sets cfull, c;
    if (n > 40000 || nfull > 40000 || ctx_sets_new(&cfull, full) || ctx_sets_new(&c, m)) return 1;
    /* the single worker */
    pt_model_zero_grads(full);
    fail |= chain(full, cfull.ctx, &b, &cw, CH_FUSED);
    memcpy(gw, pt_model_grads(full), nfull * sizeof(float));
    size_t nz = 0;
    for (size_t j = 0; j < nfull; j++) nz += gw[j] != 0.0f;
    if (nz < nfull / 2) fail = 1;
    /* this rank's slice */
    double worst = 0;
    pt_model_zero_grads(m);
    fail |= chain(m, c.ctx, &b, &cf, CH_FUSED);
    memcpy(gf, pt_model_grads(m), n * sizeof(float));
    unsigned d = compare(m, &cf, &cw, full, gw, 0, &worst);
    if (d) fprintf(stderr, "rank %d sp %d: differs from one worker (mask %u)\n", r, sp, d);
    fail |= d != 0;
    if (r == 0) fprintf(stderr, "  sp %d: worst difference %.1e of the largest\n", sp, worst);
    fail |= reordered_same(m, &c, &b, gf, &cf, r, sp);
    /* the planted bug: the forward matches, the gradients must not */
    static chain_bufs cp;
    double planted = 0;
    pt_model_test_skip_f(m, 1);
    pt_model_zero_grads(m);
    fail |= chain(m, c.ctx, &b, &cp, CH_FUSED);
    pt_model_test_skip_f(m, 0);
    d = compare(m, &cp, &cw, full, gw, 1, &planted);
    if (d != (D_DIN | D_GRADS)) {
        fprintf(stderr, "rank %d sp %d: skip_f planted, differences %u (want %u)\n", r, sp, d,
                D_DIN | D_GRADS);
        fail = 1;
    }
    ctx_sets_free(&c);
    ctx_sets_free(&cfull);
    pt_model_free(m);
    pt_model_free(full);
    return fail;
}

static int rank_main(void *arg) {
    (void)arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_new(&world, &o) != PT_OK) return 1;
    int fail = check_layout(world, 0) | check_layout(world, 1);
    pt_comm_free(world);
    return fail;
}

static void test_tp_against_one_worker(void) {
    int code = -1;
    pt_comm_options o = {"shm", 20};
    CHECK_OK(pt_launch(TP, rank_main, NULL, &o, &code));
    CHECK_EQ(code, 0);
}

int main(void) {
    pt_log_set_level(PT_LOG_WARN);
    RUN(test_tp_against_one_worker);
    return TEST_DONE();
}
