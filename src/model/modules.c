/* The three kinds of module of GPT-2 and their forward/backward pairs:
 * embedding (wte, wpe), transformer block (pre-LN attention and MLP, each a
 * residual branch) and head (ln_f and the LM head tied to wte).
 *
 * Shapes: N = B*T rows, C channels, NH heads, V vocabulary. Saved for
 * backward: everything in the module's context (model_impl.h); a block's
 * recompute mode (model.recompute) drops some, rebuilt in backward from
 * what is kept (block_recompute below). Backward
 * ACCUMULATES into parameter gradients and OVERWRITES din. Intermediate
 * gradients live in the context's backward scratch (the model's unless the
 * context was given its own). Every pass calls the model's plug points
 * around its work. The split backward (B: input gradients, W: weight
 * gradients; model.h) is the same work in two passes, beside the fused one.
 *
 * The head reads wte, which the embedding owns (weight tying): its gradient
 * accumulates into the embedding's region. A pipeline with the head on
 * another stage keeps a replica of wte there and sums the two gradients
 * (Megatron's shared-embedding all-reduce); not done here. */
#include "model_impl.h"

#include <string.h>

#include "partrain/kernels.h"

static void embedding_forward(pt_model *m, pt_module_ctx *c, const pt_batch *b, float *out) {
    (void)c;
    pt_encoder_forward(out, b->tokens, W(m, 0, EMB_WTE), W(m, 0, EMB_WPE), b->B, b->T,
                       m->cfg.n_embd);
}

static void embedding_backward(pt_model *m, const pt_batch *b, const float *dout) {
    pt_encoder_backward(DW(m, 0, EMB_WTE), DW(m, 0, EMB_WPE), dout, b->tokens, b->B, b->T,
                        m->cfg.n_embd);
}

/* x (N,C) -> out (N,C):
 *   res2 = x + c_proj(attn(c_attn(ln_1(x))))
 *   out  = res2 + mlp.c_proj(gelu(mlp.c_fc(ln_2(res2))))
 * out NULL: up to fch_gelu only (a FULL recompute: the backward never
 * reads out). */
static void block_forward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, const float *x,
                          float *out) {
    int B = b->B, T = b->T, C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
    pt_layernorm_forward(c->ln1, c->ln1_mean, c->ln1_rstd, x, W(m, i, BLK_LN1_W),
                         W(m, i, BLK_LN1_B), N, C);
    pt_matmul_forward(c->qkv, c->ln1, W(m, i, BLK_QKV_W), W(m, i, BLK_QKV_B), N, C, 3 * C);
    pt_attention_forward(c->atty, c->att, c->qkv, B, T, C, NH);
    pt_matmul_forward_res(c->res2, x, c->atty, W(m, i, BLK_ATTPROJ_W), W(m, i, BLK_ATTPROJ_B), N, C,
                          C);
    pt_layernorm_forward(c->ln2, c->ln2_mean, c->ln2_rstd, c->res2, W(m, i, BLK_LN2_W),
                         W(m, i, BLK_LN2_B), N, C);
    pt_matmul_gelu_forward(c->fch, c->fch_gelu, c->ln2, W(m, i, BLK_FC_W), W(m, i, BLK_FC_B), N, C,
                           4 * C);
    if (!out) return;
    pt_matmul_forward_res(out, c->res2, c->fch_gelu, W(m, i, BLK_FCPROJ_W), W(m, i, BLK_FCPROJ_B),
                          N, 4 * C, C);
}

static void block_backward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                           const float *dout, float *dx) {
    int B = b->B, T = b->T, C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
    pt_module_scratch *s = c->scratch ? c->scratch : m->scratch;
    /* MLP branch: out = res2 + mlp(res2). The _set kernels OVERWRITE their
     * input gradient and the _res LayerNorm adds the residual's gradient, so
     * no intermediate buffer is zeroed or copied first (16 N*C-float
     * memset/memcpy passes per block before: 3% of small's step). */
    /* c_proj's input gradient goes through GELU's derivative as it is
     * written: d_fch is the gradient of c_fc's pre-activation. */
    pt_matmul_backward_gelu_set(s->d_fch, DW(m, i, BLK_FCPROJ_W), DW(m, i, BLK_FCPROJ_B), dout,
                                c->fch_gelu, W(m, i, BLK_FCPROJ_W), c->fch, N, 4 * C, C);
    pt_matmul_backward_set(s->d_ln, DW(m, i, BLK_FC_W), DW(m, i, BLK_FC_B), s->d_fch, c->ln2,
                           W(m, i, BLK_FC_W), N, C, 4 * C);
    pt_layernorm_backward_res(s->d_res2, dout, DW(m, i, BLK_LN2_W), DW(m, i, BLK_LN2_B), s->d_ln,
                              c->res2, W(m, i, BLK_LN2_W), c->ln2_mean, c->ln2_rstd, N, C);
    /* attention branch: res2 = x + attn(x) */
    pt_matmul_backward_set(s->d_atty, DW(m, i, BLK_ATTPROJ_W), DW(m, i, BLK_ATTPROJ_B), s->d_res2,
                           c->atty, W(m, i, BLK_ATTPROJ_W), N, C, C);
    pt_attention_backward_set(s->d_qkv, s->att, s->d_atty, c->qkv, c->att, B, T, C, NH);
    pt_matmul_backward_set(s->d_ln, DW(m, i, BLK_QKV_W), DW(m, i, BLK_QKV_B), s->d_qkv, c->ln1,
                           W(m, i, BLK_QKV_W), N, C, 3 * C);
    pt_layernorm_backward_res(dx, s->d_res2, DW(m, i, BLK_LN1_W), DW(m, i, BLK_LN1_B), s->d_ln,
                              c->in, W(m, i, BLK_LN1_W), c->ln1_mean, c->ln1_rstd, N, C);
}

/* x (N,C) -> logits (N,V) = ln_f(x) @ wte^T; with targets, per-position
 * losses and, in place of the logits, dlogits = dloss * (softmax - onehot). */
static void head_forward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, const float *x,
                         float *out) {
    int N = b->B * b->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    pt_layernorm_forward(c->lnf, c->lnf_mean, c->lnf_rstd, x, W(m, i, HEAD_LNF_W),
                         W(m, i, HEAD_LNF_B), N, C);
    pt_matmul_forward_wt(c->logits, c->lnf, HEAD_WTE(m), NULL, N, C, V);
    if (b->targets) {
        pt_softmax_xent_forward_backward(c->losses, c->logits, c->logits, b->targets, N, V,
                                         b->dloss);
        if (out) memcpy(out, c->losses, (size_t)N * sizeof(float));
    } else if (out) {
        memcpy(out, c->logits, (size_t)N * V * sizeof(float));
    }
}

static void head_backward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, float *dx) {
    int N = b->B * b->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    pt_module_scratch *s = c->scratch ? c->scratch : m->scratch;
    memset(s->d_ln, 0, (size_t)N * C * sizeof(float));
    pt_matmul_backward_wt(s->d_ln, HEAD_DWTE(m), NULL, c->logits, c->lnf, HEAD_WTE(m), N, C, V);
    memset(dx, 0, (size_t)N * C * sizeof(float));
    pt_layernorm_backward(dx, DW(m, i, HEAD_LNF_W), DW(m, i, HEAD_LNF_B), s->d_ln, c->in,
                          W(m, i, HEAD_LNF_W), c->lnf_mean, c->lnf_rstd, N, C);
}

/* ---- the split backward (zero-bubble B and W), tp = 1 ----
 * The fused backward's kernels cut in two: B runs every input-gradient
 * pass (the _input kernels) and leaves each linear's and LayerNorm's
 * output gradient in the scratch; W runs the weight-gradient passes on
 * them. The kernels are the fused ones' halves (kernels.h), so B then W
 * gives pt_module_backward's bits. */

static pt_module_scratch *scratch_of(pt_model *m, pt_module_ctx *c) {
    return c->scratch ? c->scratch : m->scratch;
}

/* The scratch a block's pass computes in: a deferred scratch holds only
 * what its W reads (model_impl.h), so the passes run in the model's. */
static pt_module_scratch *pass_scratch(pt_model *m, const pt_module_ctx *c) {
    return c->scratch && !c->scratch->deferred ? c->scratch : m->scratch;
}

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
        *big[k] = k < fit ? v->att + (size_t)k * NC : s->rem + (size_t)(k - fit) * NC;
    w.d_qkv = v->qkv;
    w.d_fch = v->fch;
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

static void block_backward_input(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                                 const float *dout, float *dx) {
    int B = b->B, T = b->T, C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
    pt_module_scratch *s = scratch_of(m, c);
    memcpy(s->d_out, dout, (size_t)N * C * sizeof(float)); /* the caller's buffer moves on */
    pt_matmul_backward_input_gelu_set(s->d_fch, dout, W(m, i, BLK_FCPROJ_W), c->fch, N, 4 * C, C);
    pt_matmul_backward_input_set(s->d_ln, s->d_fch, W(m, i, BLK_FC_W), N, C, 4 * C);
    pt_layernorm_backward_input(s->d_res2, dout, s->d_ln, c->res2, W(m, i, BLK_LN2_W), c->ln2_mean,
                                c->ln2_rstd, N, C);
    pt_matmul_backward_input_set(s->d_atty, s->d_res2, W(m, i, BLK_ATTPROJ_W), N, C, C);
    pt_attention_backward_set(s->d_qkv, s->att, s->d_atty, c->qkv, c->att, B, T, C, NH);
    pt_matmul_backward_input_set(s->d_ln1, s->d_qkv, W(m, i, BLK_QKV_W), N, C, 3 * C);
    pt_layernorm_backward_input(dx, s->d_res2, s->d_ln1, c->in, W(m, i, BLK_LN1_W), c->ln1_mean,
                                c->ln1_rstd, N, C);
}

static void block_backward_weight(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b) {
    int C = m->cfg.n_embd, N = b->B * b->T;
    pt_module_scratch *s = scratch_of(m, c);
    pt_matmul_backward_weight(DW(m, i, BLK_FCPROJ_W), DW(m, i, BLK_FCPROJ_B), s->d_out, c->fch_gelu,
                              N, 4 * C, C);
    pt_matmul_backward_weight(DW(m, i, BLK_FC_W), DW(m, i, BLK_FC_B), s->d_fch, c->ln2, N, C,
                              4 * C);
    pt_layernorm_backward_params(DW(m, i, BLK_LN2_W), DW(m, i, BLK_LN2_B), s->d_ln, c->res2,
                                 c->ln2_mean, c->ln2_rstd, N, C);
    pt_matmul_backward_weight(DW(m, i, BLK_ATTPROJ_W), DW(m, i, BLK_ATTPROJ_B), s->d_res2, c->atty,
                              N, C, C);
    pt_matmul_backward_weight(DW(m, i, BLK_QKV_W), DW(m, i, BLK_QKV_B), s->d_qkv, c->ln1, N, C,
                              3 * C);
    pt_layernorm_backward_params(DW(m, i, BLK_LN1_W), DW(m, i, BLK_LN1_B), s->d_ln1, c->in,
                                 c->ln1_mean, c->ln1_rstd, N, C);
}

static void head_backward_input(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                                float *dx) {
    int N = b->B * b->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    pt_module_scratch *s = scratch_of(m, c);
    memset(s->d_ln, 0, (size_t)N * C * sizeof(float));
    pt_matmul_backward_wt_input(s->d_ln, c->logits, HEAD_WTE(m), N, C, V);
    memset(dx, 0, (size_t)N * C * sizeof(float));
    pt_layernorm_backward_input(dx, NULL, s->d_ln, c->in, W(m, i, HEAD_LNF_W), c->lnf_mean,
                                c->lnf_rstd, N, C);
}

static void head_backward_weight(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b) {
    int N = b->B * b->T, C = m->cfg.n_embd, V = m->cfg.vocab_size;
    pt_module_scratch *s = scratch_of(m, c);
    pt_matmul_backward_wt_weight(HEAD_DWTE(m), NULL, c->logits, c->lnf, N, C, V);
    pt_layernorm_backward_params(DW(m, i, HEAD_LNF_W), DW(m, i, HEAD_LNF_B), s->d_ln, c->in,
                                 c->lnf_mean, c->lnf_rstd, N, C);
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
 * collective. FULL: the block's forward up to fch_gelu, without the plug
 * points and without touching gradients; under tensor parallelism with its
 * collectives (modules_tp.c), which every rank of the group reruns. */
static void block_recompute(pt_model *m, int i, pt_module_ctx *v, const pt_batch *b) {
    int B = b->B, T = b->T, N = B * T;
    int Cl = m->cfg.n_embd / m->tp, NHl = m->cfg.n_head / m->tp;
    pt_module_scratch *s = scratch_of(m, v);
    switch (m->recompute) {
    case PT_RECOMPUTE_NONE:
        break;
    case PT_RECOMPUTE_SELECTIVE:
        pt_attention_forward(s->d_atty, v->att, v->qkv, B, T, Cl, NHl);
        pt_gelu_forward(v->fch_gelu, v->fch, (size_t)N * 4 * Cl);
        break;
    case PT_RECOMPUTE_FULL:
        if (m->tp > 1)
            pt_tp_block_forward(m, i, v, b, v->in, NULL);
        else
            block_forward(m, i, v, b, v->in, NULL);
        break;
    }
}

/* A block's view for its backward (B, or the fused backward) in scratch s
 * (ctx's), with what its recompute mode dropped rebuilt. */
static pt_module_ctx recomputed_view(pt_model *m, int i, pt_module_ctx *ctx, pt_module_scratch *s,
                                     const pt_batch *b) {
    pt_module_ctx v = block_view(m, ctx, s, b);
    v.scratch = pass_scratch(m, ctx);
    block_recompute(m, i, &v, b);
    return v;
}

void pt_module_forward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b, const float *in,
                       float *out) {
    PT_ASSERT(ctx && ctx->module == i);
    PT_ASSERT(m->tp == 1 || m->tp_comm); /* a slice runs with its group */
    PT_ASSERT(b->B > 0 && b->B <= ctx->max_B && b->T > 0 && b->T <= m->cfg.seq_len);
    PT_ASSERT(!m->sp || (b->B * b->T) % m->tp == 0);
    PT_ASSERT(m->mod_p[i] && (ctx->kind != PT_MODULE_HEAD || m->tied_p || m->mod_p[0]));
    ctx->B = b->B;
    ctx->T = b->T;
    ctx->in = in;
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:
        if (m->tp > 1)
            pt_tp_embedding_forward(m, b, out);
        else
            embedding_forward(m, ctx, b, out);
        break;
    case PT_MODULE_BLOCK: {
        PT_ASSERT(in && out && in != out);
        pt_module_ctx v = block_view(m, ctx, m->scratch, b);
        v.scratch = pass_scratch(m, ctx);
        if (m->tp > 1)
            pt_tp_block_forward(m, i, &v, b, in, out);
        else
            block_forward(m, i, &v, b, in, out);
        break;
    }
    case PT_MODULE_HEAD:
        PT_ASSERT(in);
        if (m->tp > 1)
            pt_tp_head_forward(m, i, ctx, b, in, out);
        else
            head_forward(m, i, ctx, b, in, out);
        break;
    }
}

void pt_module_backward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                        const float *dout, float *din) {
    PT_ASSERT(ctx && ctx->module == i && ctx->B == b->B && ctx->T == b->T);
    PT_ASSERT(m->tp == 1 || m->tp_comm);
    PT_ASSERT(m->mod_p[i] && m->mod_g[i] &&
              (ctx->kind != PT_MODULE_HEAD || m->tied_p || (m->mod_p[0] && m->mod_g[0])));
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:
        if (m->tp > 1)
            pt_tp_embedding_backward(m, b, dout);
        else
            embedding_backward(m, b, dout);
        break;
    case PT_MODULE_BLOCK: {
        PT_ASSERT(dout && din && dout != din);
        pt_module_ctx v = recomputed_view(m, i, ctx, scratch_of(m, ctx), b);
        if (m->tp > 1)
            pt_tp_block_backward(m, i, &v, b, dout, din);
        else
            block_backward(m, i, &v, b, dout, din);
        break;
    }
    case PT_MODULE_HEAD:
        PT_ASSERT(b->targets && din);
        if (m->tp > 1)
            pt_tp_head_backward(m, i, ctx, b, din);
        else
            head_backward(m, i, ctx, b, din);
        break;
    }
}

void pt_module_backward_input(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                              const float *dout, float *din) {
    PT_ASSERT(ctx && ctx->module == i && ctx->B == b->B && ctx->T == b->T);
    PT_ASSERT(m->tp == 1 || m->tp_comm);
    PT_ASSERT(m->mod_p[i] && (ctx->kind != PT_MODULE_HEAD || m->tied_p || m->mod_p[0]));
    pt_module_scratch *s = scratch_of(m, ctx);
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:        /* no input gradient: W's dout is kept */
        PT_ASSERT(dout && s->d_out); /* (a deferred scratch for the embedding) */
        if (m->tp > 1)
            pt_tp_embedding_backward_input(m, s, b, dout);
        else
            memcpy(s->d_out, dout, (size_t)b->B * b->T * m->cfg.n_embd * sizeof(float));
        break;
    case PT_MODULE_BLOCK: {
        PT_ASSERT(dout && din && dout != din);
        pt_module_ctx v = recomputed_view(m, i, ctx, s, b);
        if (m->tp > 1)
            pt_tp_block_backward_input(m, i, &v, b, dout, din);
        else
            block_backward_input(m, i, &v, b, dout, din);
        if (s->deferred) {
            pt_module_scratch w = block_stash(m, &v, s);
            block_stash_fill(m, &w, m->scratch, b);
        }
        break;
    }
    case PT_MODULE_HEAD:
        PT_ASSERT(b->targets && din && s->d_ln);
        if (m->tp > 1)
            pt_tp_head_backward_input(m, i, ctx, b, din);
        else
            head_backward_input(m, i, ctx, b, din);
        break;
    }
}

void pt_module_recompute(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b) {
    PT_ASSERT(ctx && ctx->module == i && ctx->B == b->B && ctx->T == b->T);
    PT_ASSERT(m->tp == 1 || m->tp_comm);
    if (ctx->kind != PT_MODULE_BLOCK) return;
    recomputed_view(m, i, ctx, scratch_of(m, ctx), b); /* as B's */
}

void pt_module_backward_weight(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b) {
    PT_ASSERT(ctx && ctx->module == i && ctx->B == b->B && ctx->T == b->T);
    PT_ASSERT(m->tp == 1 || m->tp_comm);
    PT_ASSERT(m->mod_g[i] && (ctx->kind != PT_MODULE_HEAD || m->tied_g || m->mod_g[0]));
    switch (ctx->kind) {
    case PT_MODULE_EMBEDDING:
        if (m->tp > 1)
            pt_tp_embedding_backward_weight(m, scratch_of(m, ctx), b);
        else
            pt_encoder_backward(DW(m, 0, EMB_WTE), DW(m, 0, EMB_WPE), scratch_of(m, ctx)->d_out,
                                b->tokens, b->B, b->T, m->cfg.n_embd);
        break;
    case PT_MODULE_BLOCK: {
        /* B's recomputed activations, where B left them */
        pt_module_scratch *s = scratch_of(m, ctx), w;
        pt_module_ctx v = block_view(m, ctx, s, b);
        if (s->deferred) { /* and B's gradients where B moved them */
            w = block_stash(m, &v, s);
            v.scratch = &w;
        }
        if (m->tp > 1)
            pt_tp_block_backward_weight(m, i, &v, b);
        else
            block_backward_weight(m, i, &v, b);
        break;
    }
    case PT_MODULE_HEAD:
        if (m->tp > 1)
            pt_tp_head_backward_weight(m, i, ctx, b);
        else
            head_backward_weight(m, i, ctx, b);
        break;
    }
}
