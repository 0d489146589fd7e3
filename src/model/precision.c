/* The model's kernels in its precision (pt_model_options.bf16): each
 * function here is one step of a module (modules.c) that calls the fp32
 * kernel or the bf16 one, so that every module has one implementation for
 * both precisions and a layout, a schedule or a recompute mode never asks
 * which one runs.
 *
 * bf16 (kernels.h, "bf16 kernels"): a product reads bf16 operands -- the
 * weights' copies (pt_model_round_weights), the bf16 activations -- and an
 * fp32 gradient rounded as it is read, and sums in fp32; LayerNorm's
 * statistics, its backward (from the fp32 input, which the residual stream
 * keeps anyway), GELU's derivative and every gradient stay fp32. A
 * product's fp32 output that nothing keeps goes to the caller's scratch
 * `tmp` (N,OC).
 *
 * Not here: the collectives (tp_group.c), the modules (modules.c). */
#include "model_impl.h"

#include <string.h>

void pt_prec_layernorm(pt_model *m, pt_act out, pt_bf16 *xhat, float *mean, float *rstd,
                       const float *x, const float *w, const float *b, int R, int C) {
    if (m->bf16)
        pt_layernorm_forward16(out.h, xhat, mean, rstd, x, w, b, R, C);
    else
        pt_layernorm_forward(out.f, mean, rstd, x, w, b, R, C);
}

void pt_prec_layernorm_input(pt_model *m, float *dinp, const float *dres, const float *dout,
                             const float *x, const pt_bf16 *xhat, const float *w, const float *mean,
                             const float *rstd, int R, int C) {
    if (m->bf16 && xhat)
        pt_layernorm16_backward_input(dinp, dres, dout, xhat, w, rstd, R, C);
    else
        pt_layernorm_backward_input(dinp, dres, dout, x, w, mean, rstd, R, C);
}

void pt_prec_linear(pt_model *m, int i, int kw, pt_act out, float *tmp, pt_act inp, int N, int C,
                    int OC) {
    const float *bias = W(m, i, kw + 1); /* every linear's bias follows its weight */
    if (m->bf16)
        pt_matmul16_forward(tmp, out.h, inp.h, W16(m, i, kw), bias, N, C, OC);
    else
        pt_matmul_forward(out.f, inp.f, W(m, i, kw), bias, N, C, OC);
}

void pt_prec_linear_gelu(pt_model *m, int i, int kw, pt_act pre, pt_act act, float *tmp, pt_act inp,
                         int N, int C, int OC) {
    const float *bias = W(m, i, kw + 1);
    if (m->bf16)
        pt_matmul16_gelu_forward(tmp, pre.h, act.h, inp.h, W16(m, i, kw), bias, N, C, OC);
    else
        pt_matmul_gelu_forward(pre.f, act.f, inp.f, W(m, i, kw), bias, N, C, OC);
}

void pt_prec_linear_partial(pt_model *m, int i, int kw, float *out, pt_act inp, int N, int C,
                            int OC) {
    if (m->bf16)
        pt_matmul16_forward(out, NULL, inp.h, W16(m, i, kw), NULL, N, C, OC);
    else
        pt_matmul_forward(out, inp.f, W(m, i, kw), NULL, N, C, OC);
}

void pt_prec_linear_res(pt_model *m, int i, int kw, float *out, const float *res, pt_act inp, int N,
                        int C, int OC) {
    const float *bias = W(m, i, kw + 1);
    if (m->bf16)
        pt_matmul16_forward_res(out, res, inp.h, W16(m, i, kw), bias, N, C, OC);
    else
        pt_matmul_forward_res(out, res, inp.f, W(m, i, kw), bias, N, C, OC);
}

void pt_prec_gelu(pt_model *m, pt_act act, pt_act pre, size_t n) {
    if (m->bf16)
        pt_gelu_forward16(act.h, pre.h, n);
    else
        pt_gelu_forward(act.f, pre.f, n);
}

void pt_prec_attention(pt_model *m, pt_act out, pt_act att, float *scratch, pt_act qkv, int B,
                       int T, int C, int NH) {
    if (m->bf16)
        pt_attention16_forward(out.h, att.h, scratch, qkv.h, B, T, C, NH);
    else
        pt_attention_forward(out.f, att.f, qkv.f, B, T, C, NH);
}

void pt_prec_attention_backward_set(pt_model *m, float *dqkv, float *scratch, const float *dout,
                                    pt_act qkv, pt_act att, int B, int T, int C, int NH) {
    if (m->bf16)
        pt_attention16_backward_set(dqkv, scratch, dout, qkv.h, att.h, B, T, C, NH);
    else
        pt_attention_backward_set(dqkv, scratch, dout, qkv.f, att.f, B, T, C, NH);
}

void pt_prec_linear_input_set(pt_model *m, int i, int kw, float *dinp, const float *dout, int N,
                              int C, int OC) {
    if (m->bf16)
        pt_matmul16_backward_input_set(dinp, dout, W16(m, i, kw), N, C, OC);
    else
        pt_matmul_backward_input_set(dinp, dout, W(m, i, kw), N, C, OC);
}

void pt_prec_linear_input_gelu_set(pt_model *m, int i, int kw, float *dpre, const float *dout,
                                   pt_act pre, int N, int C, int OC) {
    if (m->bf16)
        pt_matmul16_backward_input_gelu_set(dpre, dout, W16(m, i, kw), pre.h, N, C, OC);
    else
        pt_matmul_backward_input_gelu_set(dpre, dout, W(m, i, kw), pre.f, N, C, OC);
}

void pt_prec_linear_weight(pt_model *m, int i, int kw, const float *dout, pt_act inp, int N, int C,
                           int OC) {
    if (m->bf16)
        pt_matmul16_backward_weight(DW(m, i, kw), DW(m, i, kw + 1), dout, NULL, inp.h, N, C, OC);
    else
        pt_matmul_backward_weight(DW(m, i, kw), DW(m, i, kw + 1), dout, inp.f, N, C, OC);
}

/* ---- the LM head (weight tying: wte (vl,C) read as the head's weight) ---- */

pt_status pt_prec_head_forward(pt_model *m, pt_module_ctx *c, const pt_batch *b, pt_act lnf,
                               float *tmp) {
    int N = b->B * b->T, C = m->cfg.n_embd;
    if (!m->bf16) {
        pt_matmul_forward_wt(c->logits.f, lnf.f, HEAD_WTE(m), NULL, N, C, m->vl);
        return b->targets ? pt_tp_xent(m, c, b, lnf, NULL) : PT_OK;
    }
    if (!b->targets)
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "train.precision = bf16 computes the loss, not the logits: "
                            "inference runs in fp32");
    return pt_tp_xent(m, c, b, lnf, tmp);
}

/* d_ln (N,C) = dlogits @ wte, OVERWRITTEN. */
void pt_prec_head_input_set(pt_model *m, pt_module_ctx *c, float *d_ln, int N) {
    int C = m->cfg.n_embd;
    if (m->bf16) {
        pt_matmul16_backward_wt_input_set(d_ln, c->logits.h, m->wte16, N, C, m->vl);
        return;
    }
    memset(d_ln, 0, (size_t)N * C * sizeof(float));
    pt_matmul_backward_wt_input(d_ln, c->logits.f, HEAD_WTE(m), N, C, m->vl);
}

void pt_prec_head_weight(pt_model *m, pt_module_ctx *c, pt_act lnf, int N) {
    int C = m->cfg.n_embd;
    if (m->bf16)
        pt_matmul16_backward_wt_weight(HEAD_DWTE(m), c->logits.h, lnf.h, N, C, m->vl);
    else
        pt_matmul_backward_wt_weight(HEAD_DWTE(m), NULL, c->logits.f, lnf.f, N, C, m->vl);
}
