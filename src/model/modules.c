/* The three kinds of module of GPT-2, one implementation each, written over
 * the tensor-parallel group (tp_group.c; a group of one at tp = 1, where
 * every collective is a no-op): embedding (wte, wpe), transformer block
 * (pre-LN attention and MLP, each a residual branch) and head (ln_f and the
 * LM head tied to wte). Each has a forward and a backward in two passes:
 * B, the input gradient with every collective of it, and W, the weight
 * gradients. The fused backward is B then W (pt_module_backward).
 *
 * Shapes: N = B*T rows, C channels, NH heads, V vocabulary; on tp rank r
 * of t, Cl = C/t columns and NHl = NH/t heads of the split linears, vl
 * vocabulary rows, and R rows of the LayerNorm and residual regions (N,
 * or N/t under sequence parallelism). Saved for backward: everything in
 * the module's context (model_impl.h); a block's recompute mode
 * (model.recompute) drops some, rebuilt in B from what is kept
 * (block_recompute below). W ACCUMULATES into parameter gradients; B
 * OVERWRITES din. Intermediate gradients live in the context's backward
 * scratch (the model's unless the context was given its own).
 *
 * The head reads wte, which the embedding owns (weight tying): its gradient
 * accumulates into the embedding's region (or a pipeline stage's tied
 * copy, model.h).
 *
 * Not here: the plug points and the passes over ranges of modules
 * (passes.c), the collectives (tp_group.c). */
#include "model_impl.h"

#include <string.h>

#include "partrain/kernels.h"

static pt_module_scratch *scratch_of(pt_model *m, const pt_module_ctx *c) {
    return c->scratch ? c->scratch : m->scratch;
}

/* The scratch a pass computes in: a deferred scratch holds only what its W
 * reads (model_impl.h), so the passes run in the model's. */
static pt_module_scratch *pass_scratch(pt_model *m, const pt_module_ctx *c) {
    return c->scratch && !c->scratch->deferred ? c->scratch : m->scratch;
}

/* ---- embedding ---- */

/* tokens (B,T) -> out (R,C) = wte[tokens] + wpe: this rank's vocabulary
 * rows looked up, summed over the group. */
static pt_status embedding_forward(pt_model *m, const pt_batch *b, float *out) {
    int C = m->cfg.n_embd, N = b->B * b->T;
    float *buf = m->sp ? m->scratch->full : out, *sum; /* the (N,C) lookup before its sum */
    pt_vocab_embed_forward(buf, b->tokens, W(m, 0, EMB_WTE),
                           m->tp_rank == 0 ? W(m, 0, EMB_WPE) : NULL, b->B, b->T, C, m->v0, m->vl);
    PT_CHECK(pt_tp_row_sum(m, buf, N, &sum, "embedding sum"));
    if (sum != out) memcpy(out, sum, (size_t)pt_tp_rows_held(m, N) * C * sizeof(float));
    return PT_OK;
}

/* W from the whole (N,C) output gradient d_out. */
static void embedding_weight(pt_model *m, const pt_batch *b, const float *d_out) {
    pt_vocab_embed_backward(DW(m, 0, EMB_WTE), DW(m, 0, EMB_WPE), d_out, b->tokens, b->B, b->T,
                            m->cfg.n_embd, m->v0, m->vl);
}

/* ---- block ---- */

/* x (R,C) -> out (R,C):
 *   res2 = x + c_proj(attn(c_attn(ln_1(x))))
 *   out  = res2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(res2))))
 * out NULL: up to fch_gelu only (a FULL recompute: the backward never
 * reads out; the MLP c_proj's collective is not rerun). */
static pt_status block_forward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                               const float *x, float *out) {
    int B = b->B, T = b->T, C = m->cfg.n_embd, N = B * T, R = pt_tp_rows_held(m, N);
    int Cl = C / m->tp, NHl = m->cfg.n_head / m->tp;
    pt_module_scratch *s = scratch_of(m, c);
    pt_act ln;
    /* bf16: the products' fp32 outputs that nothing keeps go to the
     * backward scratch's d_qkv and d_fch, free until B writes them */
    pt_prec_layernorm(m, c->ln1, NULL, c->ln1_mean, c->ln1_rstd, x, W(m, i, BLK_LN1_W),
                      W(m, i, BLK_LN1_B), R, C);
    PT_CHECK(pt_tp_col_input(m, s, c->ln1, N, &ln, "ln_1 all-gather"));
    pt_prec_linear(m, i, BLK_QKV_W, c->qkv, s->d_qkv, ln, N, C, 3 * Cl);
    pt_prec_attention(m, c->atty, c->att, s->att, c->qkv, B, T, Cl, NHl);
    /* bf16 keeps ln_2's xhat instead of res2 and ln2: res2 lives in d_res2
     * and ln2 in ln16 while the forward reads them */
    float *res2 = m->bf16 ? s->d_res2 : c->res2;
    pt_act ln2 = m->bf16 ? (pt_act){NULL, s->ln16} : c->ln2;
    PT_CHECK(pt_tp_row_linear_res(m, i, BLK_ATTPROJ_W, res2, x, c->atty, N, Cl, s->d_ln,
                                  "attention c_proj sum"));
    pt_prec_layernorm(m, ln2, c->xhat2, c->ln2_mean, c->ln2_rstd, res2, W(m, i, BLK_LN2_W),
                      W(m, i, BLK_LN2_B), R, C);
    PT_CHECK(pt_tp_col_input(m, s, ln2, N, &ln, "ln_2 all-gather"));
    pt_prec_linear_gelu(m, i, BLK_FC_W, c->fch, c->fch_gelu, s->d_fch, ln, N, C, 4 * Cl);
    if (!out) return PT_OK;
    return pt_tp_row_linear_res(m, i, BLK_FCPROJ_W, out, res2, c->fch_gelu, N, 4 * Cl, s->d_ln,
                                "MLP c_proj sum");
}

/* B: dout (R,C) -> dx (R,C), leaving in the scratch what W reads: d_fch,
 * d_ln (ln_2's output gradient), d_res2, d_qkv, d_ln1. *d_out: where the
 * whole (N,C) output gradient is for W -- the scratch's d_out (gathered
 * under sequence parallelism, copied when `keep`), else dout itself. */
static pt_status block_input(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                             const float *dout, float *dx, int keep, const float **d_out) {
    int B = b->B, T = b->T, C = m->cfg.n_embd, N = B * T, R = pt_tp_rows_held(m, N);
    int Cl = C / m->tp, NHl = m->cfg.n_head / m->tp;
    pt_module_scratch *s = scratch_of(m, c);
    const float *whole;
    float *d_ln2, *d_ln1, *d_res2 = pt_tp_rows(m, s->d_res2, N);
    /* MLP: out = res2 + mlp(res2). The _set kernels OVERWRITE their input
     * gradient and LayerNorm's input pass adds the residual's gradient, so
     * no intermediate buffer is zeroed or copied first. c_proj's input
     * gradient goes through GELU's derivative as it is written: d_fch is
     * the gradient of c_fc's pre-activation. */
    PT_CHECK(pt_tp_whole_grad(m, s->d_out, dout, N, keep, d_out, "MLP c_proj gradient all-gather"));
    pt_prec_linear_input_gelu_set(m, i, BLK_FCPROJ_W, s->d_fch, *d_out, c->fch, N, 4 * Cl, C);
    pt_prec_linear_input_set(m, i, BLK_FC_W, s->d_ln, s->d_fch, N, C, 4 * Cl);
    PT_CHECK(pt_tp_row_sum(m, s->d_ln, N, &d_ln2, "MLP c_fc input-gradient sum"));
    pt_prec_layernorm_input(m, d_res2, dout, d_ln2, c->res2, c->xhat2, W(m, i, BLK_LN2_W),
                            c->ln2_mean, c->ln2_rstd, R, C);
    /* attention: res2 = x + attn(x), from the whole d(res2) */
    PT_CHECK(
        pt_tp_whole_grad(m, s->d_res2, NULL, N, 1, &whole, "attention c_proj gradient all-gather"));
    pt_prec_linear_input_set(m, i, BLK_ATTPROJ_W, s->d_atty, whole, N, Cl, C);
    pt_prec_attention_backward_set(m, s->d_qkv, s->att, s->d_atty, c->qkv, c->att, B, T, Cl, NHl);
    pt_prec_linear_input_set(m, i, BLK_QKV_W, s->d_ln1, s->d_qkv, N, C, 3 * Cl);
    if (m->skip_f) /* the test seam: the partial sum, Megatron's f missing */
        d_ln1 = pt_tp_rows(m, s->d_ln1, N);
    else
        PT_CHECK(pt_tp_row_sum(m, s->d_ln1, N, &d_ln1, "attention c_attn input-gradient sum"));
    pt_layernorm_backward_input(dx, d_res2, d_ln1, c->in, W(m, i, BLK_LN1_W), c->ln1_mean,
                                c->ln1_rstd, R, C);
    return PT_OK;
}

/* W: every parameter gradient of the block from what B left, d_out (the
 * whole output gradient) and the saved activations. */
static pt_status block_weight(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                              const float *d_out) {
    int C = m->cfg.n_embd, N = b->B * b->T, Cl = C / m->tp;
    pt_module_scratch *s = scratch_of(m, c);
    pt_act ln;
    /* c_proj's from the whole output gradient (the row-parallel bias's the
     * same on every rank) */
    pt_prec_linear_weight(m, i, BLK_FCPROJ_W, d_out, c->fch_gelu, N, 4 * Cl, C);
    pt_act ln2 = c->ln2;
    if (m->bf16) { /* ln_2's output again, bit for bit, from its xhat (and the
                    * forward's ln_2 parameters: ZeRO-3 freed the module's) */
        pt_layernorm_out16(s->ln16, NULL, c->xhat2, NULL, NULL, m->ln2p[i], m->ln2p[i] + C,
                           pt_tp_rows_held(m, N), C);
        ln2 = (pt_act){NULL, s->ln16};
    }
    PT_CHECK(pt_tp_col_input(m, s, ln2, N, &ln, "ln_2 all-gather (weight gradient)"));
    pt_prec_linear_weight(m, i, BLK_FC_W, s->d_fch, ln, N, C, 4 * Cl);
    PT_CHECK(pt_tp_ln_params(m, s, DW(m, i, BLK_LN2_W), DW(m, i, BLK_LN2_B), s->d_ln, c->res2,
                             c->xhat2, c->ln2_mean, c->ln2_rstd, N));
    pt_prec_linear_weight(m, i, BLK_ATTPROJ_W, s->d_res2, c->atty, N, Cl, C);
    PT_CHECK(pt_tp_col_input(m, s, c->ln1, N, &ln, "ln_1 all-gather (weight gradient)"));
    pt_prec_linear_weight(m, i, BLK_QKV_W, s->d_qkv, ln, N, C, 3 * Cl);
    return pt_tp_ln_params(m, s, DW(m, i, BLK_LN1_W), DW(m, i, BLK_LN1_B), s->d_ln1, c->in, NULL,
                           c->ln1_mean, c->ln1_rstd, N);
}

/* ---- head ---- */

/* x (R,C) -> logits (N,vl) = ln_f(x) @ wte^T (this rank's vocabulary
 * rows); with targets, per-position losses and, in place of the logits,
 * dlogits = dloss * (softmax - onehot). */
static pt_status head_forward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                              const float *x, float *out) {
    int N = b->B * b->T, C = m->cfg.n_embd, R = pt_tp_rows_held(m, N);
    pt_module_scratch *s = scratch_of(m, c);
    pt_act lnf;
    pt_prec_layernorm(m, c->lnf, NULL, c->lnf_mean, c->lnf_rstd, x, W(m, i, HEAD_LNF_W),
                      W(m, i, HEAD_LNF_B), R, C);
    PT_CHECK(pt_tp_col_input(m, s, c->lnf, N, &lnf, "ln_f all-gather"));
    /* bf16: the logits' fp32 blocks in d_fch (pt_xent_block_cols) */
    PT_CHECK(pt_prec_head_forward(m, c, b, lnf, s->d_fch));
    if (!b->targets) {
        /* the whole logits are on one rank only in a group of one */
        PT_ASSERT(!out || m->tp == 1);
        if (out) memcpy(out, c->logits.f, (size_t)N * m->vl * sizeof(float));
        return PT_OK;
    }
    if (out) memcpy(out, c->losses, (size_t)N * sizeof(float));
    return PT_OK;
}

/* B: dx (R,C) from the dlogits the forward left; d_ln (ln_f's output
 * gradient, (N,C)) stays in the scratch for W. */
static pt_status head_input(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, float *dx) {
    int N = b->B * b->T, C = m->cfg.n_embd, R = pt_tp_rows_held(m, N);
    pt_module_scratch *s = scratch_of(m, c);
    float *d_lnf;
    pt_prec_head_input_set(m, c, s->d_ln, N);
    PT_CHECK(pt_tp_row_sum(m, s->d_ln, N, &d_lnf, "LM head input-gradient sum"));
    memset(dx, 0, (size_t)R * C * sizeof(float));
    pt_layernorm_backward_input(dx, NULL, d_lnf, c->in, W(m, i, HEAD_LNF_W), c->lnf_mean,
                                c->lnf_rstd, R, C);
    return PT_OK;
}

static pt_status head_weight(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b) {
    int N = b->B * b->T;
    pt_module_scratch *s = scratch_of(m, c);
    pt_act lnf;
    PT_CHECK(pt_tp_col_input(m, s, c->lnf, N, &lnf, "ln_f all-gather (weight gradient)"));
    pt_prec_head_weight(m, c, lnf, N);
    return pt_tp_ln_params(m, s, DW(m, i, HEAD_LNF_W), DW(m, i, HEAD_LNF_B), s->d_ln, c->in, NULL,
                           c->lnf_mean, c->lnf_rstd, N);
}

/* ---- a block's deferred W (zero-bubble) ---- */

/* Where a block's deferred W finds what its B left, for the deferred
 * scratch s and the block's view v (its context, and under a recompute
 * mode s's recompute region): W reads only the linears' inputs (ln_1,
 * atty, ln_2, fch_gelu), res2, the input and the LayerNorms' statistics,
 * so after B the attention probabilities, qkv and fch are dead (Qi et al.
 * 2024, ZB-H1 at 1F1B's memory). d_fch takes fch's place and d_qkv qkv's
 * (the same shapes), the four (N,C) ones att's while it has room, the rest
 * s->rem (pt_module_scratch_new_deferred sized it). */
static pt_module_scratch block_stash(const pt_model *m, const pt_module_ctx *v,
                                     const pt_module_scratch *s) {
    /* att, qkv, fch are carved for the context's max_B (NONE, SELECTIVE)
     * or s's (the recompute region) */
    PT_ASSERT(m->recompute == PT_RECOMPUTE_FULL || v->max_B >= s->max_B);
    pt_module_scratch w = *s;
    size_t NC = (size_t)s->max_B * (size_t)m->cfg.seq_len * (size_t)m->cfg.n_embd;
    int fit = pt_block_stash_fit(m);
    PT_ASSERT(fit == 4 || s->rem); /* a scratch for blocks (its kinds) */
    float **big[4] = {&w.d_out, &w.d_res2, &w.d_ln, &w.d_ln1};
    for (int k = 0; k < 4; k++)
        *big[k] = k < fit ? v->att.f + (size_t)k * NC : s->rem + (size_t)(k - fit) * NC;
    if (m->bf16) { /* the dead buffers are bf16: d_qkv and d_fch after the four in rem */
        size_t NCl = (size_t)s->max_B * (size_t)m->cfg.seq_len * (size_t)(m->cfg.n_embd / m->tp);
        w.d_qkv = s->rem + (size_t)(4 - fit) * NC;
        w.d_fch = w.d_qkv + 3 * NCl;
    } else {
        w.d_qkv = v->qkv.f;
        w.d_fch = v->fch.f;
    }
    w.d_atty = NULL; /* B's own */
    return w;
}

/* After B (which computed in the model's scratch c): its W's gradients into
 * the stash w. Copies, so W reads B's bits. */
static void block_stash_fill(const pt_model *m, const pt_module_scratch *w,
                             const pt_module_scratch *c, const pt_batch *b) {
    size_t N = (size_t)b->B * (size_t)b->T, C = (size_t)m->cfg.n_embd, Cl = C / (size_t)m->tp;
    const struct {
        float *dst;
        const float *src;
        size_t n;
    } mv[] = {{w->d_out, c->d_out, N * C},      {w->d_res2, c->d_res2, N * C},
              {w->d_ln, c->d_ln, N * C},        {w->d_ln1, c->d_ln1, N * C},
              {w->d_qkv, c->d_qkv, N * 3 * Cl}, {w->d_fch, c->d_fch, N * 4 * Cl}};
    for (size_t k = 0; k < sizeof mv / sizeof mv[0]; k++)
        memcpy(mv[k].dst, mv[k].src, mv[k].n * sizeof(float));
}

/* ---- activation recomputation (model.recompute) ----
 * A block's passes run on a VIEW of its context: the buffers the context
 * keeps, and those it does not in a scratch's recompute region. The
 * forward writes the dropped ones into the model's scratch, where nothing
 * outlives a pass; the backward (B) recomputes them into the context's
 * scratch, where W finds them. The recompute runs the forward's own
 * kernels on the kept inputs, so the view holds the forward's bits. */

static pt_module_ctx block_view(const pt_model *m, const pt_module_ctx *c, pt_module_scratch *s,
                                const pt_batch *b) {
    pt_module_ctx v = *c;
    if (m->recompute == PT_RECOMPUTE_NONE) return v;
    PT_ASSERT(s->recomp && b->B <= s->max_B);
    pt_block_carve(m, s->max_B, m->recompute == PT_RECOMPUTE_FULL ? PT_ACTS_ALL : PT_ACTS_DROPPED,
                   s->recomp, &v);
    return v;
}

/* Fill the view's dropped buffers from what the context kept. SELECTIVE:
 * att from qkv (the attention output, kept, is rewritten into d_atty,
 * which the backward overwrites before reading) and gelu(fch): no
 * collective. FULL: the block's forward up to fch_gelu, without touching
 * gradients, with its collectives, which every rank of the group reruns. */
static pt_status block_recompute(pt_model *m, int i, pt_module_ctx *v, const pt_batch *b) {
    int B = b->B, T = b->T, N = B * T;
    int Cl = m->cfg.n_embd / m->tp, NHl = m->cfg.n_head / m->tp;
    pt_module_scratch *s = scratch_of(m, v);
    switch (m->recompute) {
    case PT_RECOMPUTE_NONE:
        break;
    case PT_RECOMPUTE_SELECTIVE:
        /* the attention output, kept, rewritten into d_atty (bf16: in its
         * first half) */
        pt_prec_attention(m, (pt_act){s->d_atty, (pt_bf16 *)s->d_atty}, v->att, s->att, v->qkv, B,
                          T, Cl, NHl);
        pt_prec_gelu(m, v->fch_gelu, v->fch, (size_t)N * 4 * Cl);
        break;
    case PT_RECOMPUTE_FULL:
        return block_forward(m, i, v, b, v->in, NULL);
    }
    return PT_OK;
}

/* *v: a block's view for its backward (B, or the fused backward) with the
 * recompute region of s (ctx's scratch), what its recompute mode dropped
 * rebuilt. */
static pt_status recomputed_view(pt_model *m, int i, pt_module_ctx *ctx, pt_module_scratch *s,
                                 const pt_batch *b, pt_module_ctx *v) {
    *v = block_view(m, ctx, s, b);
    v->scratch = pass_scratch(m, ctx);
    return block_recompute(m, i, v, b);
}

/* ---- the module passes ---- */

static pt_status module_forward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                                const float *in, float *out) {
    ctx->B = b->B;
    ctx->T = b->T;
    ctx->in = in;
    /* bf16: the weights rounded once per step, at the module's first
     * forward (every schedule runs micro-batch 0's forward of a module
     * before any other pass of it; ZeRO-3 has gathered them by now) */
    if (b->micro == 0) pt_model_round_weights(m, i);
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:
        return embedding_forward(m, b, out);
    case PT_MODULE_BLOCK: {
        PT_ASSERT(in && out && in != out);
        pt_module_ctx v = block_view(m, ctx, m->scratch, b);
        v.scratch = pass_scratch(m, ctx);
        return block_forward(m, i, &v, b, in, out);
    }
    case PT_MODULE_HEAD:
        PT_ASSERT(in);
        return head_forward(m, i, ctx, b, in, out);
    }
    return PT_OK;
}

/* B then W in the pass scratch: W reads B's output gradients there at
 * once, and the whole output gradient from dout itself when it is whole. */
static pt_status module_backward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                                 const float *dout, float *din) {
    pt_module_scratch *s = pass_scratch(m, ctx);
    pt_module_ctx v = *ctx;
    const float *d_out;
    v.scratch = s;
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:
        PT_CHECK(pt_tp_whole_grad(m, s->d_out, dout, b->B * b->T, 0, &d_out,
                                  "embedding gradient all-gather"));
        embedding_weight(m, b, d_out);
        return PT_OK;
    case PT_MODULE_BLOCK:
        PT_ASSERT(dout && din && dout != din);
        PT_CHECK(recomputed_view(m, i, ctx, scratch_of(m, ctx), b, &v));
        PT_CHECK(block_input(m, i, &v, b, dout, din, 0, &d_out));
        return block_weight(m, i, &v, b, d_out);
    case PT_MODULE_HEAD:
        PT_ASSERT(b->targets && din);
        PT_CHECK(head_input(m, i, &v, b, din));
        return head_weight(m, i, &v, b);
    }
    return PT_OK;
}

static pt_status module_backward_input(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                                       const float *dout, float *din) {
    pt_module_scratch *s = scratch_of(m, ctx);
    const float *d_out;
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:        /* no input gradient: W's dout is kept */
        PT_ASSERT(dout && s->d_out); /* (a deferred scratch for the embedding) */
        return pt_tp_whole_grad(m, s->d_out, dout, b->B * b->T, 1, &d_out,
                                "embedding gradient all-gather");
    case PT_MODULE_BLOCK: {
        PT_ASSERT(dout && din && dout != din);
        pt_module_ctx v;
        PT_CHECK(recomputed_view(m, i, ctx, s, b, &v));
        PT_CHECK(block_input(m, i, &v, b, dout, din, 1, &d_out));
        if (s->deferred) {
            pt_module_scratch w = block_stash(m, &v, s);
            block_stash_fill(m, &w, m->scratch, b);
        }
        return PT_OK;
    }
    case PT_MODULE_HEAD:
        PT_ASSERT(b->targets && din && s->d_ln);
        return head_input(m, i, ctx, b, din);
    }
    return PT_OK;
}

static pt_status module_backward_weight(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b) {
    pt_module_scratch *s = scratch_of(m, ctx), w;
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:
        embedding_weight(m, b, s->d_out);
        return PT_OK;
    case PT_MODULE_BLOCK: {
        /* B's recomputed activations, where B left them */
        pt_module_ctx v = block_view(m, ctx, s, b);
        if (s->deferred) { /* and B's gradients where B moved them */
            w = block_stash(m, &v, s);
            v.scratch = &w;
        }
        return block_weight(m, i, &v, b, scratch_of(m, &v)->d_out);
    }
    case PT_MODULE_HEAD:
        return head_weight(m, i, ctx, b);
    }
    return PT_OK;
}

/* ---- the public passes (model.h): pure compute, no plug points ---- */

static void check_pass(const pt_model *m, int i, const pt_module_ctx *ctx, const pt_batch *b) {
    PT_ASSERT(ctx && ctx->module == i && ctx->B == b->B && ctx->T == b->T);
    PT_ASSERT(m->tp == 1 || m->tp_comm); /* a slice runs with its group */
}

pt_status pt_module_forward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                            const float *in, float *out) {
    PT_ASSERT(ctx && ctx->module == i);
    PT_ASSERT(m->tp == 1 || m->tp_comm);
    PT_ASSERT(b->B > 0 && b->B <= ctx->max_B && b->T > 0 && b->T <= m->cfg.seq_len);
    PT_ASSERT(!m->sp || (b->B * b->T) % m->tp == 0);
    PT_ASSERT(m->mod_p[i] && (ctx->kind != PT_MODULE_HEAD || m->tied_p || m->mod_p[0]));
    return module_forward(m, i, ctx, b, in, out);
}

pt_status pt_module_backward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                             const float *dout, float *din) {
    check_pass(m, i, ctx, b);
    PT_ASSERT(m->mod_p[i] && m->mod_g[i] &&
              (ctx->kind != PT_MODULE_HEAD || m->tied_p || (m->mod_p[0] && m->mod_g[0])));
    return module_backward(m, i, ctx, b, dout, din);
}

pt_status pt_module_backward_input(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                                   const float *dout, float *din) {
    check_pass(m, i, ctx, b);
    PT_ASSERT(m->mod_p[i] && (ctx->kind != PT_MODULE_HEAD || m->tied_p || m->mod_p[0]));
    return module_backward_input(m, i, ctx, b, dout, din);
}

pt_status pt_module_recompute(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b) {
    check_pass(m, i, ctx, b);
    if (ctx->kind != PT_MODULE_BLOCK) return PT_OK;
    pt_module_ctx v;
    return recomputed_view(m, i, ctx, scratch_of(m, ctx), b, &v); /* as B's */
}

pt_status pt_module_backward_weight(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b) {
    check_pass(m, i, ctx, b);
    PT_ASSERT(m->mod_g[i] && (ctx->kind != PT_MODULE_HEAD || m->tied_g || m->mod_g[0]));
    return module_backward_weight(m, i, ctx, b);
}
