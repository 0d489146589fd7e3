/* The split backward's test chain, shared by test_model.c, test_model_tp.c
 * and test_recompute.c: module-level passes of one batch over a model of
 * 4 modules (L = 2): forwards, then a backward chain. CH_FUSED:
 * pt_module_backward per module; CH_BW: B then W per module;
 * CH_ALLB_ALLW: B for every module, then (chain_weight) W for every module
 * -- the whole-model split, as a zero-bubble stage defers W: each context
 * needs its own scratch. din[i] is module i's input gradient (i >= 1). The
 * includer defines CHAIN_NC, the floats of one activation buffer, and
 * CHAIN_N, of the losses. Each function returns 0, or 1 when a pass
 * returned an error. */
#ifndef PT_TEST_SPLIT_CHAIN_H
#define PT_TEST_SPLIT_CHAIN_H

#include "partrain/model.h"

enum { CH_FUSED, CH_BW, CH_ALLB_ALLW };
enum { NMOD = 4 };
typedef struct {
    float acts[NMOD][CHAIN_NC], din[NMOD][CHAIN_NC], losses[CHAIN_N];
} chain_bufs;

static int chain_forward(pt_model *m, pt_module_ctx **ctx, const pt_batch *b, chain_bufs *cb) {
    int bad = pt_module_forward(m, 0, ctx[0], b, NULL, cb->acts[0]) != PT_OK;
    for (int i = 1; i < NMOD - 1; i++)
        bad |= pt_module_forward(m, i, ctx[i], b, cb->acts[i - 1], cb->acts[i]) != PT_OK;
    bad |=
        pt_module_forward(m, NMOD - 1, ctx[NMOD - 1], b, cb->acts[NMOD - 2], cb->losses) != PT_OK;
    return bad;
}
static int chain_input(pt_model *m, pt_module_ctx **ctx, const pt_batch *b, chain_bufs *cb,
                       int mode) {
    int bad = 0;
    for (int i = NMOD - 1; i >= 0; i--) {
        const float *dout = i == NMOD - 1 ? NULL : cb->din[i + 1];
        float *din = i == 0 ? NULL : cb->din[i];
        if (mode == CH_FUSED) {
            bad |= pt_module_backward(m, i, ctx[i], b, dout, din) != PT_OK;
            continue;
        }
        bad |= pt_module_backward_input(m, i, ctx[i], b, dout, din) != PT_OK;
        if (mode == CH_BW) bad |= pt_module_backward_weight(m, i, ctx[i], b) != PT_OK;
    }
    return bad;
}
/* W in the backward's module order (head first: wte's two gradients add
 * up in the fused order) */
static int chain_weight(pt_model *m, pt_module_ctx **ctx, const pt_batch *b) {
    int bad = 0;
    for (int i = NMOD - 1; i >= 0; i--) bad |= pt_module_backward_weight(m, i, ctx[i], b) != PT_OK;
    return bad;
}

#endif
