/* Activation recomputation (model.recompute): SELECTIVE and FULL give
 * NONE's losses, parameter gradients and per-module input gradients BIT
 * FOR BIT -- through the whole-model passes, the fused module backward and
 * the split one (B then W, and every B before every W with a forward of
 * another micro-batch in between, as a zero-bubble stage runs them; with
 * contexts' own scratch and with a stage's deferred scratch) -- at
 * tp = 1 and over a tp group of 2 forked ranks (shm), plain and under
 * sequence parallelism. The oracle is the NONE model with the same weights.
 * Also: each context's PT_MEM_ACTS bytes match the formula of what its
 * mode keeps, the model's activation peak falls with each mode, a FULL
 * backward under tp reruns exactly the forward's first collectives, and
 * pt_module_recompute alone rebuilds what W reads. */
#include <math.h>
#include <string.h>

#include "partrain/comm.h"
#include "../../src/kernels/kernels_impl.h" /* pt_sgemm_set_path: both GEMM paths */
#include "../../src/model/model_impl.h"     /* a scratch's recompute region, to poison it */
#include "partrain/model.h"
#include "pt_test.h"

static const pt_model_config cfg = {2, 32, 4, 64, 16}; /* L, C, NH, V, T */
enum { MB = 2, BT = MB * 16, NC = BT * 32 };
#define CHAIN_NC NC
#define CHAIN_N  BT
#include "split_chain.h"

static const pt_recompute modes[] = {PT_RECOMPUTE_NONE, PT_RECOMPUTE_SELECTIVE, PT_RECOMPUTE_FULL};

/* The whole model's backward: the range of every module in its own slot. */
static pt_status backward(pt_model *m) {
    int L = pt_model_config_of(m)->n_layer;
    return pt_model_backward_range(m, pt_model_own_slot(m), 0, L + 1, NULL, NULL, 0);
}

static pt_status model_new(pt_model **m, pt_recompute rc, int tp, int r, int sp) {
    pt_model_options o = {.tp = tp, .tp_rank = r, .sp = sp, .recompute = rc};
    pt_status st = pt_model_new_opts(m, &cfg, MB, &o);
    if (st != PT_OK) return st;
    pt_model_draw_weights(*m, 7);
    /* LayerNorm weights away from 1 and biases away from 0: every term
     * matters */
    float *p = pt_model_params(*m);
    for (int t = 0; t < pt_model_num_tensors(*m); t++) {
        const pt_param_info *ti = pt_model_tensor(*m, t);
        if (strstr(ti->name, "ln_") || strstr(ti->name, "bias"))
            for (size_t j = 0; j < ti->numel; j++) p[ti->offset + j] += 0.01f * (float)(j % 7);
    }
    return PT_OK;
}

static void fill(int *x, int *y, int salt) {
    for (int i = 0; i < BT; i++) {
        x[i] = (i * 7 + 3 + salt) % cfg.vocab_size;
        y[i] = (i * 5 + 1 + 3 * salt) % cfg.vocab_size;
    }
}

/* ---- what each mode keeps ---- */

/* floats of a block's context at tp = 1 under each mode, and of the
 * scratch's recompute region: the formula model.h states */
static size_t block_floats(pt_recompute rc) {
    size_t N = BT, C = 32, T = 16, NH = 4;
    size_t att = MB * NH * T * T, gelu = N * 4 * C;
    size_t all = N * C * 3 + N * C + N * 4 + N * 3 * C + att + N * 8 * C;
    return rc == PT_RECOMPUTE_NONE ? all : rc == PT_RECOMPUTE_SELECTIVE ? all - att - gelu : 0;
}
static size_t region_floats(pt_recompute rc) {
    return block_floats(PT_RECOMPUTE_NONE) - block_floats(rc);
}

static void test_bytes(void) {
    size_t head = 0, scratch0 = 0, peak[3] = {0};
    for (int k = 0; k < 3; k++) {
        pt_model *m = NULL;
        size_t base = pt_mem_current(PT_MEM_ACTS);
        pt_mem_reset_peak();
        CHECK_OK(model_new(&m, modes[k], 1, 0, 0));
        if (!m) return;
        int x[BT], y[BT];
        fill(x, y, 0);
        pt_batch b = {x, y, 1.0f / BT, MB, 16, 0, 1};
        float loss;
        CHECK_OK(pt_model_forward(m, &b, &loss));
        CHECK_OK(backward(m));
        peak[k] = pt_mem_peak(PT_MEM_ACTS) - base;
        /* one context of each kind, and one scratch */
        pt_module_ctx *c = NULL;
        pt_module_scratch *s = NULL;
        size_t before = pt_mem_current(PT_MEM_ACTS);
        CHECK_OK(pt_module_ctx_new(&c, m, 1, MB));
        CHECK_EQ(pt_mem_current(PT_MEM_ACTS) - before, block_floats(modes[k]) * sizeof(float));
        pt_module_ctx_free(c);
        CHECK_OK(pt_module_ctx_new(&c, m, 0, MB));
        CHECK_EQ(pt_mem_current(PT_MEM_ACTS) - before, 0);
        pt_module_ctx_free(c);
        CHECK_OK(pt_module_ctx_new(&c, m, 3, MB));
        size_t h = pt_mem_current(PT_MEM_ACTS) - before;
        pt_module_ctx_free(c);
        /* the head keeps what it keeps under every mode: (N,C) + 2N + (N,V) + N */
        CHECK_EQ(h, (BT * 32 + 2 * BT + BT * 64 + BT) * sizeof(float));
        if (k == 0) head = h;
        CHECK_EQ(h, head);
        CHECK_OK(pt_module_scratch_new(&s, m, MB));
        size_t sc = pt_mem_current(PT_MEM_ACTS) - before;
        pt_module_scratch_free(s);
        if (k == 0) scratch0 = sc;
        /* the scratch grows by one block's dropped activations */
        CHECK_EQ(sc - scratch0, region_floats(modes[k]) * sizeof(float));
        pt_model_free(m);
    }
    CHECK(peak[1] < peak[0]);
    CHECK(peak[2] < peak[1]);
    /* L contexts keep less, the model's one scratch holds more */
    for (int k = 1; k < 3; k++)
        CHECK_EQ(peak[0] - peak[k], (cfg.n_layer - 1) * region_floats(modes[k]) * sizeof(float));
}

/* ---- bitwise, tp = 1 ---- */

typedef struct {
    float loss, loss2;
    float grads[100000], din[NMOD][NC];
} result;

static result want, got;

static void whole_model(pt_model *m, result *r) {
    int x[BT], y[BT];
    fill(x, y, 0);
    pt_batch b = {x, y, 1.0f / BT, MB, 16, 0, 1};
    pt_model_zero_grads(m);
    CHECK_OK(pt_model_forward(m, &b, &r->loss));
    CHECK_OK(backward(m));
    memcpy(r->grads, pt_model_grads(m), pt_model_num_params(m) * sizeof(float));
}

/* 1: module_chain's contexts get a zero-bubble stage's deferred scratch
 * (B's gradients moved into the block's dead activations) in every mode. */
static int chain_deferred;

/* The module chain in fresh contexts (own scratch each when split, or
 * deferred); a second micro-batch's forward in the model's own slot between
 * every B and every W (CH_ALLB_ALLW). */
static int module_chain(pt_model *m, int mode, result *r) {
    pt_module_ctx *ctx[NMOD] = {0};
    pt_module_scratch *scr[NMOD] = {0};
    int fail = 0;
    for (int i = 0; i < NMOD; i++) {
        if (pt_module_ctx_new(&ctx[i], m, i, MB) != PT_OK) fail = 1;
        if ((mode == CH_FUSED && !chain_deferred) || fail) continue;
        pt_status st =
            chain_deferred
                ? pt_module_scratch_new_deferred(&scr[i], m, MB, 1u << pt_model_module_kind(m, i))
                : pt_module_scratch_new(&scr[i], m, MB);
        if (st != PT_OK) fail = 1;
        pt_module_ctx_set_scratch(ctx[i], scr[i]);
    }
    static chain_bufs cb;
    if (!fail) {
        int x[BT], y[BT], x2[BT], y2[BT];
        fill(x, y, 0);
        fill(x2, y2, 5);
        pt_batch b = {x, y, 1.0f / BT, MB, 16, 0, 1};
        pt_batch b2 = {x2, y2, 1.0f / BT, MB, 16, 1, 1};
        memset(&cb, 0, sizeof cb); /* under sequence parallelism only R rows are written */
        pt_model_zero_grads(m);
        fail |= chain_forward(m, ctx, &b, &cb);
        fail |= chain_input(m, ctx, &b, &cb, mode);
        r->loss2 = 0;
        if (mode == CH_ALLB_ALLW) {
            fail |= pt_model_forward(m, &b2, &r->loss2) != PT_OK;
            fail |= chain_weight(m, ctx, &b);
        }
        memcpy(r->grads, pt_model_grads(m), pt_model_num_params(m) * sizeof(float));
        memcpy(r->din, cb.din, sizeof cb.din);
        r->loss = 0;
        for (int j = 0; j < BT; j++) r->loss += cb.losses[j];
    }
    for (int i = 0; i < NMOD; i++) {
        pt_module_ctx_free(ctx[i]);
        pt_module_scratch_free(scr[i]);
    }
    return fail;
}

/* 0 when got equals want bit for bit (n gradient floats) */
static int same(const result *a, const result *b, size_t n, const char *what) {
    int bad = memcmp(&a->loss, &b->loss, sizeof a->loss) != 0 ||
              memcmp(&a->loss2, &b->loss2, sizeof a->loss2) != 0 ||
              memcmp(a->grads, b->grads, n * sizeof(float)) != 0 ||
              memcmp(a->din, b->din, sizeof a->din) != 0;
    if (bad) fprintf(stderr, "%s: differs from recompute none\n", what);
    return bad;
}

static void bitwise_path(void) {
    pt_model *ref = NULL;
    CHECK_OK(model_new(&ref, PT_RECOMPUTE_NONE, 1, 0, 0));
    if (!ref) return;
    size_t n = pt_model_num_params(ref);
    CHECK(n <= 100000);
    for (int k = 1; k < 3; k++) {
        pt_model *m = NULL;
        CHECK_OK(model_new(&m, modes[k], 1, 0, 0));
        if (!m) break;
        char what[64];
        memset(&want, 0, sizeof want);
        memset(&got, 0, sizeof got);
        whole_model(ref, &want);
        whole_model(m, &got);
        snprintf(what, sizeof what, "mode %d whole model", k);
        CHECK(!same(&want, &got, n, what));
        size_t nz = 0;
        for (size_t j = 0; j < n; j++) nz += got.grads[j] != 0.0f;
        CHECK(nz > n / 2);
        for (int mode = CH_FUSED; mode <= CH_ALLB_ALLW; mode++) {
            CHECK(!module_chain(ref, mode, &want));
            CHECK(!module_chain(m, mode, &got));
            snprintf(what, sizeof what, "mode %d chain %d", k, mode);
            CHECK(!same(&want, &got, n, what));
            /* deferred scratch: NONE's (once) and this mode's */
            chain_deferred = 1;
            for (int d = k == 1 ? 0 : 1; d < 2; d++) {
                memset(&got, 0, sizeof got);
                CHECK(!module_chain(d ? m : ref, mode, &got));
                snprintf(what, sizeof what, "mode %d chain %d deferred", d ? k : 0, mode);
                CHECK(!same(&want, &got, n, what));
            }
            chain_deferred = 0;
        }
        pt_model_free(m);
    }
    pt_model_free(ref);
}

static void test_bitwise(void) {
    pt_sgemm_set_path(PT_GEMM_BLAS);
    bitwise_path();
    if (pt_sgemm_has_own()) {
        pt_sgemm_set_path(PT_GEMM_OWN);
        bitwise_path();
    }
    pt_sgemm_set_path(PT_GEMM_AUTO);
}

/* pt_module_recompute alone (calibrate times it so): every B, then each
 * block's recompute region poisoned and rebuilt by pt_module_recompute,
 * then every W: NONE's gradients bit for bit, which W reads from the region
 * only if the recompute rebuilt it. */
static void test_recompute_alone(void) {
    pt_model *ref = NULL;
    CHECK_OK(model_new(&ref, PT_RECOMPUTE_NONE, 1, 0, 0));
    if (!ref) return;
    size_t n = pt_model_num_params(ref);
    memset(&want, 0, sizeof want);
    CHECK(!module_chain(ref, CH_ALLB_ALLW, &want));
    for (int k = 1; k < 3; k++) {
        pt_model *m = NULL;
        CHECK_OK(model_new(&m, modes[k], 1, 0, 0));
        if (!m) break;
        pt_module_ctx *ctx[NMOD] = {0};
        pt_module_scratch *scr[NMOD] = {0};
        for (int i = 0; i < NMOD; i++) {
            CHECK_OK(pt_module_ctx_new(&ctx[i], m, i, MB));
            CHECK_OK(pt_module_scratch_new(&scr[i], m, MB));
            if (ctx[i] && scr[i]) pt_module_ctx_set_scratch(ctx[i], scr[i]);
        }
        static chain_bufs cb;
        int x[BT], y[BT];
        fill(x, y, 0);
        pt_batch b = {x, y, 1.0f / BT, MB, 16, 0, 1};
        memset(&cb, 0, sizeof cb);
        pt_model_zero_grads(m);
        CHECK(!chain_forward(m, ctx, &b, &cb));
        CHECK(!chain_input(m, ctx, &b, &cb, CH_ALLB_ALLW)); /* every B, no W */
        for (int i = 1; i < NMOD - 1; i++) {
            CHECK(scr[i]->recomp != NULL);
            for (size_t j = 0; j < region_floats(modes[k]); j++) scr[i]->recomp[j] = NAN;
            CHECK_OK(pt_module_recompute(m, i, ctx[i], &b));
        }
        CHECK(!chain_weight(m, ctx, &b));
        int bad = memcmp(want.grads, pt_model_grads(m), n * sizeof(float)) != 0;
        if (bad) fprintf(stderr, "mode %d: W after pt_module_recompute differs from none\n", k);
        CHECK(!bad);
        for (int i = 0; i < NMOD; i++) {
            pt_module_ctx_free(ctx[i]);
            pt_module_scratch_free(scr[i]);
        }
        pt_model_free(m);
    }
    pt_model_free(ref);
}

/* ---- bitwise, tp = 2 ---- */

enum { TP = 2 };

static int check_tp(pt_comm *tp, int sp) {
    int r = pt_comm_rank(tp), fail = 0;
    uint64_t calls[3][PT_OP_COUNT] = {{0}};
    static result w, g;
    pt_model *m[3] = {0};
    for (int k = 0; k < 3; k++) {
        if (model_new(&m[k], modes[k], TP, r, sp) != PT_OK)
            fail = 1;
        else
            pt_model_set_tp_comm(m[k], tp);
    }
    size_t n = m[0] ? pt_model_num_params(m[0]) : 0;
    if (fail || n > 100000) fail = 1;
    for (int mode = CH_FUSED; mode <= CH_ALLB_ALLW && !fail; mode++) {
        memset(&w, 0, sizeof w);
        pt_comm_reset_stats(tp);
        fail |= module_chain(m[0], mode, &w);
        pt_comm_stats st;
        pt_comm_get_stats(tp, &st);
        if (mode == CH_FUSED) memcpy(calls[0], st.calls, sizeof st.calls);
        for (int k = 1; k < 3; k++) {
            memset(&g, 0, sizeof g);
            pt_comm_reset_stats(tp);
            fail |= module_chain(m[k], mode, &g);
            pt_comm_get_stats(tp, &st);
            if (mode == CH_FUSED) memcpy(calls[k], st.calls, sizeof st.calls);
            char what[64];
            snprintf(what, sizeof what, "rank %d sp %d mode %d chain %d", r, sp, k, mode);
            fail |= same(&w, &g, n, what);
        }
        chain_deferred = 1; /* every mode with deferred scratch: NONE's bits */
        for (int k = 0; k < 3; k++) {
            memset(&g, 0, sizeof g);
            fail |= module_chain(m[k], mode, &g);
            char what[64];
            snprintf(what, sizeof what, "rank %d sp %d mode %d chain %d deferred", r, sp, k, mode);
            fail |= same(&w, &g, n, what);
        }
        chain_deferred = 0;
    }
    for (int k = 0; k < 3; k++) pt_model_free(m[k]);
    /* the recompute's extra collectives in one fused chain (L = 2 blocks):
     * SELECTIVE none; FULL the block forward's up to c_fc -- plain tp the
     * attention c_proj's all-reduce, sequence parallelism ln_1's and
     * ln_2's all-gathers and the attention c_proj's reduce-scatter */
    int L = cfg.n_layer;
    for (int op = 0; op < PT_OP_COUNT; op++)
        if (calls[1][op] != calls[0][op]) fail = 1;
    uint64_t ar = sp ? 0 : (uint64_t)L, ag = sp ? 2 * (uint64_t)L : 0, rs = sp ? (uint64_t)L : 0;
    if (calls[2][PT_OP_ALLREDUCE] != calls[0][PT_OP_ALLREDUCE] + ar ||
        calls[2][PT_OP_ALLGATHER] != calls[0][PT_OP_ALLGATHER] + ag ||
        calls[2][PT_OP_REDUCE_SCATTER] != calls[0][PT_OP_REDUCE_SCATTER] + rs) {
        fprintf(stderr,
                "rank %d sp %d: FULL's collectives %llu/%llu/%llu vs none's %llu/%llu/%llu\n", r,
                sp, (unsigned long long)calls[2][PT_OP_ALLREDUCE],
                (unsigned long long)calls[2][PT_OP_ALLGATHER],
                (unsigned long long)calls[2][PT_OP_REDUCE_SCATTER],
                (unsigned long long)calls[0][PT_OP_ALLREDUCE],
                (unsigned long long)calls[0][PT_OP_ALLGATHER],
                (unsigned long long)calls[0][PT_OP_REDUCE_SCATTER]);
        fail = 1;
    }
    return fail;
}

static int rank_main(void *arg) {
    (void)arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_new(&world, &o) != PT_OK) return 1;
    int fail = check_tp(world, 0) | check_tp(world, 1);
    pt_comm_free(world);
    return fail;
}

static void test_bitwise_tp(void) {
    int code = -1;
    pt_comm_options o = {"shm", 20};
    CHECK_OK(pt_launch(TP, rank_main, NULL, &o, &code));
    CHECK_EQ(code, 0);
}

static void test_bad_mode(void) {
    pt_model *m = NULL;
    pt_model_options o = {.recompute = (pt_recompute)7};
    CHECK(pt_model_new_opts(&m, &cfg, MB, &o) == PT_ERR_INVALID);
    CHECK(m == NULL);
    CHECK(strstr(pt_error_message(), "model.recompute") != NULL);
}

int main(void) {
    pt_log_set_level(PT_LOG_WARN);
    RUN(test_bytes);
    RUN(test_bitwise);
    RUN(test_recompute_alone);
    RUN(test_bitwise_tp);
    RUN(test_bad_mode);
    return TEST_DONE();
}
