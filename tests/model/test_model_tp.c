/* The split backward (B: input gradients, W: weight gradients) under
 * tensor parallelism, over a real tp group of 2 forked ranks (shm): on
 * each rank, for Megatron's slices and under sequence parallelism. Under
 * tp > 1 pt_module_backward IS B then W (modules_tp.c), so the per-module
 * chain matches it by construction; what can fail here is the reordered
 * chain -- B for every module, then W for every module, each context with
 * its own scratch, as a zero-bubble schedule runs them -- which must give
 * the same input gradients and this rank's parameter gradients BIT FOR
 * BIT (W reads only what B left in its context's scratch and the saved
 * activations). Correctness against one worker is test_tp's. The tp = 1
 * cases (fused kernels against their halves) are test_model.c's. */
#include <string.h>

#include "partrain/comm.h"
#include "partrain/model.h"
#include "pt_test.h"

static const pt_model_config cfg = {2, 16, 4, 40, 8}; /* L, C, NH, V, T */
enum { BT = 2 * 8, NC = BT * 16, TP = 2 };
#define CHAIN_NC NC
#define CHAIN_N  BT
#include "split_chain.h"

static int chain(pt_model *m, pt_module_ctx **ctx, const pt_batch *b, chain_bufs *cb, int mode) {
    int bad = chain_forward(m, ctx, b, cb) | chain_input(m, ctx, b, cb, mode);
    if (mode == CH_ALLB_ALLW) bad |= chain_weight(m, ctx, b);
    return bad;
}

/* 0 when every split chain equals the fused one on this rank */
static int check_layout(pt_comm *tp, int sp) {
    int r = pt_comm_rank(tp), fail = 0;
    pt_model *m = NULL;
    pt_model_options o = {.tp = TP, .tp_rank = r, .sp = sp};
    if (pt_model_new_opts(&m, &cfg, 2, &o) != PT_OK) return 1;
    pt_model_set_tp_comm(m, tp);
    pt_model_draw_weights(m, 5);
    /* LayerNorm weights away from 1 and biases away from 0: every term
     * matters */
    float *p = pt_model_params(m);
    for (int t = 0; t < pt_model_num_tensors(m); t++) {
        const pt_param_info *ti = pt_model_tensor(m, t);
        if (strstr(ti->name, "ln_") || strstr(ti->name, "bias"))
            for (size_t j = 0; j < ti->numel; j++) p[ti->offset + j] += 0.01f * (float)(j % 7);
    }
    int x[BT], y[BT];
    for (int i = 0; i < BT; i++) x[i] = (i * 7 + 3) % cfg.vocab_size, y[i] = (i * 5 + 1) % 40;
    pt_batch b = {x, y, 1.0f / BT, 2, 8, 0, 1};
    size_t n = pt_model_num_params(m);
    static float gf[40000];
    static chain_bufs cf, cs;
    if (n > 40000) return 1;
    pt_module_ctx *ctx[NMOD] = {0}, *own[NMOD] = {0};
    pt_module_scratch *scr[NMOD] = {0};
    for (int i = 0; i < NMOD; i++) {
        if (pt_module_ctx_new(&ctx[i], m, i, 2) != PT_OK) return 1;
        if (pt_module_ctx_new(&own[i], m, i, 2) != PT_OK) return 1;
        if (pt_module_scratch_new(&scr[i], m, 2) != PT_OK) return 1;
        pt_module_ctx_set_scratch(own[i], scr[i]);
    }
    memset(&cf, 0, sizeof cf); /* under sequence parallelism only R rows are written */
    pt_model_zero_grads(m);
    if (chain(m, ctx, &b, &cf, CH_FUSED)) fail = 1;
    memcpy(gf, pt_model_grads(m), n * sizeof(float));
    size_t nz = 0;
    for (size_t j = 0; j < n; j++) nz += gf[j] != 0.0f;
    if (nz < n / 2) fail = 1;
    for (int mode = CH_BW; mode <= CH_ALLB_ALLW; mode++) {
        memset(&cs, 0, sizeof cs);
        pt_model_zero_grads(m);
        if (chain(m, own, &b, &cs, mode)) fail = 1;
        if (memcmp(pt_model_grads(m), gf, n * sizeof(float)) != 0) {
            fprintf(stderr, "rank %d sp %d mode %d: parameter gradients differ\n", r, sp, mode);
            fail = 1;
        }
        for (int i = 1; i < NMOD; i++)
            if (memcmp(cs.din[i], cf.din[i], sizeof cf.din[i]) != 0) {
                fprintf(stderr, "rank %d sp %d mode %d: din[%d] differs\n", r, sp, mode, i);
                for (int j = 0; j < NC; j++)
                    if (cs.din[i][j] != cf.din[i][j]) {
                        fprintf(stderr, "  [%d] %g vs %g\n", j, cs.din[i][j], cf.din[i][j]);
                        break;
                    }
                fail = 1;
            }
    }
    for (int i = 0; i < NMOD; i++) {
        pt_module_ctx_free(ctx[i]);
        pt_module_ctx_free(own[i]);
        pt_module_scratch_free(scr[i]);
    }
    pt_model_free(m);
    return fail;
}

static int rank_main(void *arg) {
    (void)arg;
    pt_comm *world = NULL;
    pt_comm_options o = {"shm", 20};
    if (pt_comm_init(&world, &o) != PT_OK) return 1;
    int fail = check_layout(world, 0) | check_layout(world, 1);
    pt_comm_free(world);
    return fail;
}

static void test_split_tp(void) {
    int code = -1;
    pt_comm_options o = {"shm", 20};
    CHECK_OK(pt_launch(TP, rank_main, NULL, &o, &code));
    CHECK_EQ(code, 0);
}

int main(void) {
    pt_log_set_level(PT_LOG_WARN);
    RUN(test_split_tp);
    return TEST_DONE();
}
