/* Megatron-style tensor parallelism (Shoeybi et al. 2019) on one rank's
 * slices (shard.c): the three kinds of module with the tp group's
 * collectives, under modules.c's contracts.
 *
 *   block      attention: ln_1 whole -> c_attn column-parallel (this rank's
 *              heads of q, k and v) -> attention on those heads -> c_proj
 *              row-parallel, a PARTIAL sum all-reduced (Megatron's g), then
 *              its bias and the residual added once; the MLP likewise
 *              (c_fc column-parallel with GELU, c_proj row-parallel).
 *              Backward: the input gradient of each column-parallel linear
 *              is a partial sum, all-reduced before its LayerNorm (f).
 *   embedding  wte by vocabulary rows: the lookup masked to this rank's
 *              rows and all-reduced (wpe added by tp rank 0 only: the sum
 *              has at most two non-zero terms, so it is bitwise the
 *              single worker's).
 *   head       the tied LM head column-parallel over the vocabulary; the
 *              cross-entropy never gathers the logits: the rows' maxima
 *              are all-gathered (the comm layer reduces by sums only), the
 *              sums of exponentials and the targets' logits all-reduced
 *              (pt_vocab_xent_*). Padded vocabulary rows never win the
 *              softmax and get exactly zero gradient.
 *
 * Everything whole (LayerNorms, row-parallel biases, wpe, the residual
 * stream) gets the same input on every tp rank, since an all-reduce hands
 * every rank the same sum: their gradients are bitwise equal across the
 * group and the global norm counts them once (gradnorm.c).
 *
 * SEQUENCE PARALLELISM (m->sp; Korthikanti et al. 2022): the LayerNorm
 * and residual regions hold this rank's R = N/t rows of the micro-batch.
 * Each LayerNorm's output is all-gathered before its column-parallel
 * linear, each row-parallel product reduce-scattered instead of
 * all-reduced (in the backward: the output gradient all-gathered, the
 * column-parallel input gradient reduce-scattered). The weight gradients
 * of c_attn, c_fc and the LM head need the whole LayerNorm output: it is
 * gathered again in backward rather than kept (activations a t-th, at the
 * price of one more all-gather per LayerNorm). The LayerNorms' parameter
 * gradients are partial sums over the rows held and are all-reduced in
 * each backward; the row-parallel biases and wpe take theirs from the
 * gathered (whole) output gradient, the same on every rank.
 *
 * Not here: the single-rank passes (modules.c). */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"
#include "partrain/kernels.h"

/* A failed collective is kept (pt_model_take_error) and the pass runs on:
 * the step ends and reports it, rather than every caller checking. */
static void keep(pt_model *m, pt_status st, const char *what) {
    if (st == PT_OK || m->tp_err != PT_OK) return;
    m->tp_err = st;
    snprintf(m->tp_errmsg, sizeof m->tp_errmsg, "tensor-parallel %s: %s", what, pt_error_message());
}

static void allreduce(pt_model *m, float *buf, size_t n, const char *what) {
    if (m->tp_err == PT_OK) keep(m, pt_comm_allreduce(m->tp_comm, buf, n, PT_REDUCE_SUM), what);
}

/* y (N,C) := res + (y + bias): a row-parallel linear's reduced product,
 * its bias and the residual, added once after the all-reduce. */
static void add_bias_res(float *y, const float *res, const float *bias, int N, int C) {
    for (int n = 0; n < N; n++) {
        float *yr = y + (size_t)n * C;
        const float *rr = res + (size_t)n * C;
        for (int c = 0; c < C; c++) yr[c] = rr[c] + (yr[c] + bias[c]);
    }
}

/* Sequence parallelism: full (N,C) from every rank's rows, this rank's at
 * its place already (pt_comm_shard's split of N*C is by rows: t | N). */
static void allgather(pt_model *m, float *full, size_t n, const char *what) {
    if (m->tp_err == PT_OK) keep(m, pt_comm_allgather(m->tp_comm, full, n), what);
}
/* The sum of every rank's (N,C) buf lands in this rank's rows of it. */
static void reduce_scatter(pt_model *m, float *buf, size_t n, const char *what) {
    if (m->tp_err == PT_OK)
        keep(m, pt_comm_reduce_scatter(m->tp_comm, buf, n, PT_REDUCE_SUM), what);
}

/* This rank's rows of an (N,C) buffer. */
static float *my_rows(const pt_model *m, float *full, int N) {
    return full + (size_t)m->tp_rank * (size_t)(N / m->tp) * (size_t)m->cfg.n_embd;
}

/* This rank's rows of a LayerNorm output into their place in s->full, then
 * the whole (N,C) gathered. */
static void gather_rows(pt_model *m, pt_module_scratch *s, const float *rows, int N,
                        const char *what) {
    size_t R = (size_t)(N / m->tp), C = (size_t)m->cfg.n_embd;
    memcpy(my_rows(m, s->full, N), rows, R * C * sizeof(float));
    allgather(m, s->full, (size_t)N * C, what);
}

/* Into a column-parallel linear: the whole (N,C) LayerNorm output, from
 * this rank's rows (plain tp: they are the whole; sequence parallelism:
 * gathered into s->full). */
static const float *col_input(pt_model *m, pt_module_scratch *s, const float *rows, int N,
                              const char *what) {
    if (!m->sp) return rows;
    gather_rows(m, s, rows, N, what);
    return s->full;
}

/* Out of a row-parallel linear: its partial (N,C) product in buf summed
 * over the group (all-reduced, or reduce-scattered under sequence
 * parallelism); returns this rank's rows of the sum, in buf. */
static float *row_output(pt_model *m, float *buf, int N, const char *what) {
    size_t NC = (size_t)N * m->cfg.n_embd;
    if (!m->sp) {
        allreduce(m, buf, NC, what);
        return buf;
    }
    reduce_scatter(m, buf, NC, what);
    return my_rows(m, buf, N);
}

/* Into a row-parallel linear's backward: the whole (N,C) output gradient
 * in full, from this rank's rows (plain tp: they are the whole; sequence
 * parallelism: gathered). rows NULL: already at their place in full. */
static void whole_grad(pt_model *m, float *full, const float *rows, int N, const char *what) {
    size_t C = (size_t)m->cfg.n_embd, R = (size_t)(m->sp ? N / m->tp : N);
    if (rows) memcpy(m->sp ? my_rows(m, full, N) : full, rows, R * C * sizeof(float));
    if (m->sp) allgather(m, full, (size_t)N * C, what);
}

/* dst (R,C) := res + (src + bias), src this rank's rows of a row-parallel
 * output (dst may be src). */
static void finish_row(float *dst, const float *src, const float *res, const float *bias, int R,
                       int C) {
    if (dst != src) memcpy(dst, src, (size_t)R * C * sizeof(float));
    add_bias_res(dst, res, bias, R, C);
}

void pt_tp_embedding_forward(pt_model *m, const pt_batch *b, float *out) {
    int C = m->cfg.n_embd, N = b->B * b->T;
    float *buf = m->sp ? m->scratch->full : out; /* the (N,C) lookup before its sum */
    pt_vocab_embed_forward(buf, b->tokens, W(m, 0, EMB_WTE),
                           m->tp_rank == 0 ? W(m, 0, EMB_WPE) : NULL, b->B, b->T, C, m->v0, m->vl);
    float *mine = row_output(m, buf, N, "embedding sum");
    if (mine != out) memcpy(out, mine, (size_t)(N / m->tp) * C * sizeof(float));
}

/* The fused backwards under tensor parallelism are B then W: the same
 * kernels (the fused ones' halves) and collectives. */
void pt_tp_embedding_backward(pt_model *m, const pt_batch *b, const float *dout) {
    pt_tp_embedding_backward_input(m, m->scratch, b, dout);
    pt_tp_embedding_backward_weight(m, m->scratch, b);
}

/* x, out, c->ln1, res2, ln2 and their statistics: (N,C), or this rank's R
 * rows under sequence parallelism. out NULL: up to fch_gelu only (a FULL
 * recompute; the MLP c_proj's collective is not rerun). */
void pt_tp_block_forward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, const float *x,
                         float *out) {
    int B = b->B, T = b->T, C = m->cfg.n_embd, N = B * T, R = m->sp ? N / m->tp : N;
    int Cl = C / m->tp, NHl = m->cfg.n_head / m->tp;
    pt_module_scratch *s = c->scratch ? c->scratch : m->scratch;
    pt_layernorm_forward(c->ln1, c->ln1_mean, c->ln1_rstd, x, W(m, i, BLK_LN1_W),
                         W(m, i, BLK_LN1_B), R, C);
    const float *ln1 = col_input(m, s, c->ln1, N, "ln_1 all-gather");
    pt_matmul_forward(c->qkv, ln1, W(m, i, BLK_QKV_W), W(m, i, BLK_QKV_B), N, C, 3 * Cl);
    pt_attention_forward(c->atty, c->att, c->qkv, B, T, Cl, NHl);
    float *p = m->sp ? s->d_ln : c->res2; /* the partial (N,C) product */
    pt_matmul_forward(p, c->atty, W(m, i, BLK_ATTPROJ_W), NULL, N, Cl, C);
    p = row_output(m, p, N, "attention c_proj sum");
    finish_row(c->res2, p, x, W(m, i, BLK_ATTPROJ_B), R, C);
    pt_layernorm_forward(c->ln2, c->ln2_mean, c->ln2_rstd, c->res2, W(m, i, BLK_LN2_W),
                         W(m, i, BLK_LN2_B), R, C);
    const float *ln2 = col_input(m, s, c->ln2, N, "ln_2 all-gather");
    pt_matmul_gelu_forward(c->fch, c->fch_gelu, ln2, W(m, i, BLK_FC_W), W(m, i, BLK_FC_B), N, C,
                           4 * Cl);
    if (!out) return;
    p = m->sp ? s->d_ln : out;
    pt_matmul_forward(p, c->fch_gelu, W(m, i, BLK_FCPROJ_W), NULL, N, 4 * Cl, C);
    p = row_output(m, p, N, "MLP c_proj sum");
    finish_row(out, p, c->res2, W(m, i, BLK_FCPROJ_B), R, C);
}

void pt_tp_block_backward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                          const float *dout, float *dx) {
    pt_tp_block_backward_input(m, i, c, b, dout, dx);
    pt_tp_block_backward_weight(m, i, c, b);
}

/* The rows' common shift: the max over every rank's real columns, from the
 * all-gathered local maxima (the same array, so the same shift, on every
 * rank). gathered (t*N): rank r's at [r*N, (r+1)*N); the result lands in
 * its first N. */
static void row_max(pt_model *m, float *gathered, int N) {
    if (m->tp_err == PT_OK)
        keep(m, pt_comm_allgather(m->tp_comm, gathered, (size_t)N * m->tp),
             "cross-entropy max all-gather");
    for (int r = 1; r < m->tp; r++) {
        const float *o = gathered + (size_t)r * N;
        for (int n = 0; n < N; n++)
            if (o[n] > gathered[n]) gathered[n] = o[n];
    }
}

void pt_tp_head_forward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, const float *x,
                        float *out) {
    int N = b->B * b->T, C = m->cfg.n_embd, R = m->sp ? N / m->tp : N;
    pt_layernorm_forward(c->lnf, c->lnf_mean, c->lnf_rstd, x, W(m, i, HEAD_LNF_W),
                         W(m, i, HEAD_LNF_B), R, C);
    /* the whole (N,C) for the vocabulary-parallel product */
    const float *lnf =
        col_input(m, c->scratch ? c->scratch : m->scratch, c->lnf, N, "ln_f all-gather");
    pt_matmul_forward_wt(c->logits, lnf, HEAD_WTE(m), NULL, N, C, m->vl);
    /* the whole logits never exist on one rank: no output without targets */
    PT_ASSERT(b->targets || !out);
    if (!b->targets) return;
    float *stats = c->xent, *gmax = c->xent + (size_t)N * PT_VOCAB_XENT_STATS;
    pt_vocab_xent_max(gmax + (size_t)m->tp_rank * N, c->logits, N, m->vl, m->vreal);
    row_max(m, gmax, N);
    pt_vocab_xent_sumexp(stats, c->logits, c->logits, gmax, b->targets, N, m->vl, m->v0, m->vreal);
    allreduce(m, stats, (size_t)N * PT_VOCAB_XENT_STATS, "cross-entropy sum all-reduce");
    pt_vocab_xent_finish(c->losses, c->logits, gmax, stats, b->targets, N, m->vl, m->v0, m->vreal,
                         b->dloss);
    if (out) memcpy(out, c->losses, (size_t)N * sizeof(float));
}

void pt_tp_head_backward(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, float *dx) {
    pt_tp_head_backward_input(m, i, c, b, dx);
    pt_tp_head_backward_weight(m, i, c, b);
}

/* ---- the split backward (zero-bubble B and W), tp > 1 ----
 * B holds every collective of the input gradients (the all-reduces, or
 * under sequence parallelism the output gradients' all-gathers and the
 * input gradients' reduce-scatters) and leaves each linear's and
 * LayerNorm's output gradient in the scratch (model_impl.h). W issues none,
 * except under sequence parallelism: there the LayerNorms' weight gradients
 * are all-reduced (they are partial sums over this rank's rows), and the
 * column-parallel weight gradients need the WHOLE LayerNorm outputs, which
 * W all-gathers again. Keeping B's gathered
 * copies instead would cost two more (N,C) buffers per scratch -- one per
 * micro-batch whose W is deferred, the memory sequence parallelism exists
 * to save -- and an all-gather in B that its own passes never read; the
 * group runs the same schedule, so a collective in W costs its ranks no
 * extra wait. */

/* A LayerNorm's parameter gradient from its output gradient dout (N,C):
 * plain tp, every row; sequence parallelism, this rank's rows of it,
 * summed over the group through ln_g. */
static void ln_params(pt_model *m, pt_module_scratch *s, float *dw, float *db, float *dout,
                      const float *x, const float *mean, const float *rstd, int N) {
    int C = m->cfg.n_embd;
    if (!m->sp) {
        pt_layernorm_backward_params(dw, db, dout, x, mean, rstd, N, C);
        return;
    }
    memset(s->ln_g, 0, 2 * (size_t)C * sizeof(float));
    pt_layernorm_backward_params(s->ln_g, s->ln_g + C, my_rows(m, dout, N), x, mean, rstd,
                                 N / m->tp, C);
    allreduce(m, s->ln_g, 2 * (size_t)C, "sequence-parallel LayerNorm gradient all-reduce");
    for (int c = 0; c < C; c++) {
        dw[c] += s->ln_g[c];
        db[c] += s->ln_g[C + c];
    }
}

void pt_tp_embedding_backward_input(pt_model *m, pt_module_scratch *s, const pt_batch *b,
                                    const float *dout) {
    whole_grad(m, s->d_out, dout, b->B * b->T, "embedding gradient all-gather");
}

void pt_tp_embedding_backward_weight(pt_model *m, pt_module_scratch *s, const pt_batch *b) {
    pt_vocab_embed_backward(DW(m, 0, EMB_WTE), DW(m, 0, EMB_WPE), s->d_out, b->tokens, b->B, b->T,
                            m->cfg.n_embd, m->v0, m->vl);
}

/* dout, dx: (N,C), or this rank's R rows under sequence parallelism. */
void pt_tp_block_backward_input(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b,
                                const float *dout, float *dx) {
    int B = b->B, T = b->T, C = m->cfg.n_embd, N = B * T, R = m->sp ? N / m->tp : N;
    int Cl = C / m->tp, NHl = m->cfg.n_head / m->tp;
    pt_module_scratch *s = c->scratch ? c->scratch : m->scratch;
    /* MLP: the whole output gradient in d_out */
    whole_grad(m, s->d_out, dout, N, "MLP c_proj gradient all-gather");
    pt_matmul_backward_input_gelu_set(s->d_fch, s->d_out, W(m, i, BLK_FCPROJ_W), c->fch, N, 4 * Cl,
                                      C);
    pt_matmul_backward_input_set(s->d_ln, s->d_fch, W(m, i, BLK_FC_W), N, C, 4 * Cl);
    const float *d_ln2 = row_output(m, s->d_ln, N, "MLP c_fc input-gradient sum");
    float *d_res2 = m->sp ? my_rows(m, s->d_res2, N) : s->d_res2;
    pt_layernorm_backward_input(d_res2, dout, d_ln2, c->res2, W(m, i, BLK_LN2_W), c->ln2_mean,
                                c->ln2_rstd, R, C);
    /* attention: this rank's rows of d(res2), whole */
    whole_grad(m, s->d_res2, NULL, N, "attention c_proj gradient all-gather");
    pt_matmul_backward_input_set(s->d_atty, s->d_res2, W(m, i, BLK_ATTPROJ_W), N, Cl, C);
    pt_attention_backward_set(s->d_qkv, s->att, s->d_atty, c->qkv, c->att, B, T, Cl, NHl);
    pt_matmul_backward_input_set(s->d_ln1, s->d_qkv, W(m, i, BLK_QKV_W), N, C, 3 * Cl);
    /* (the test hook tp_skip_f leaves the partial sum: Megatron's f missing) */
    const float *d_ln1 = m->skip_f
                             ? (m->sp ? my_rows(m, s->d_ln1, N) : s->d_ln1)
                             : row_output(m, s->d_ln1, N, "attention c_attn input-gradient sum");
    pt_layernorm_backward_input(dx, d_res2, d_ln1, c->in, W(m, i, BLK_LN1_W), c->ln1_mean,
                                c->ln1_rstd, R, C);
}

void pt_tp_block_backward_weight(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b) {
    int C = m->cfg.n_embd, N = b->B * b->T;
    int Cl = C / m->tp;
    pt_module_scratch *s = c->scratch ? c->scratch : m->scratch;
    /* c_proj's: the whole output gradient (the row-parallel bias's the
     * same on every rank) */
    pt_matmul_backward_weight(DW(m, i, BLK_FCPROJ_W), DW(m, i, BLK_FCPROJ_B), s->d_out, c->fch_gelu,
                              N, 4 * Cl, C);
    const float *ln2 = col_input(m, s, c->ln2, N, "ln_2 all-gather (weight gradient)");
    pt_matmul_backward_weight(DW(m, i, BLK_FC_W), DW(m, i, BLK_FC_B), s->d_fch, ln2, N, C, 4 * Cl);
    ln_params(m, s, DW(m, i, BLK_LN2_W), DW(m, i, BLK_LN2_B), s->d_ln, c->res2, c->ln2_mean,
              c->ln2_rstd, N);
    pt_matmul_backward_weight(DW(m, i, BLK_ATTPROJ_W), DW(m, i, BLK_ATTPROJ_B), s->d_res2, c->atty,
                              N, Cl, C);
    const float *ln1 = col_input(m, s, c->ln1, N, "ln_1 all-gather (weight gradient)");
    pt_matmul_backward_weight(DW(m, i, BLK_QKV_W), DW(m, i, BLK_QKV_B), s->d_qkv, ln1, N, C,
                              3 * Cl);
    ln_params(m, s, DW(m, i, BLK_LN1_W), DW(m, i, BLK_LN1_B), s->d_ln1, c->in, c->ln1_mean,
              c->ln1_rstd, N);
}

void pt_tp_head_backward_input(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b, float *dx) {
    int N = b->B * b->T, C = m->cfg.n_embd, R = m->sp ? N / m->tp : N;
    size_t NC = (size_t)N * C;
    pt_module_scratch *s = c->scratch ? c->scratch : m->scratch;
    memset(s->d_ln, 0, NC * sizeof(float));
    pt_matmul_backward_wt_input(s->d_ln, c->logits, HEAD_WTE(m), N, C, m->vl);
    const float *d_lnf = row_output(m, s->d_ln, N, "LM head input-gradient sum");
    memset(dx, 0, (size_t)R * C * sizeof(float));
    pt_layernorm_backward_input(dx, NULL, d_lnf, c->in, W(m, i, HEAD_LNF_W), c->lnf_mean,
                                c->lnf_rstd, R, C);
}

void pt_tp_head_backward_weight(pt_model *m, int i, pt_module_ctx *c, const pt_batch *b) {
    int N = b->B * b->T, C = m->cfg.n_embd;
    pt_module_scratch *s = c->scratch ? c->scratch : m->scratch;
    const float *lnf = col_input(m, s, c->lnf, N, "ln_f all-gather (weight gradient)");
    pt_matmul_backward_wt_weight(HEAD_DWTE(m), NULL, c->logits, lnf, N, C, m->vl);
    ln_params(m, s, DW(m, i, HEAD_LNF_W), DW(m, i, HEAD_LNF_B), s->d_ln, c->in, c->lnf_mean,
              c->lnf_rstd, N);
}
