/* The tensor-parallel group the modules are written over (Megatron, Shoeybi
 * et al. 2019), on one rank's slices (shard.c). A group of t ranks; at
 * t = 1 a group of one, where every collective is a no-op and no
 * communicator is needed, so that modules.c has one implementation of each
 * module for every t.
 *
 *   column-parallel linear (c_attn, c_fc, the LM head over vocabulary
 *     rows): whole input, this rank's output columns; its input gradient
 *     is a PARTIAL sum, summed over the group before the LayerNorm below
 *     it (Megatron's f; pt_tp_row_sum).
 *   row-parallel linear (attention and MLP c_proj): this rank's input
 *     columns, a PARTIAL product summed over the group (Megatron's g),
 *     then its bias and the residual added once (pt_tp_row_linear_res).
 *   embedding: the lookup masked to this rank's wte rows, summed like a
 *     row-parallel product (wpe added by tp rank 0 only: the sum has at
 *     most two non-zero terms, so it is bitwise the single worker's).
 *   cross-entropy: the logits are never gathered: the rows' maxima are
 *     all-gathered (the comm layer reduces by sums only), the sums of
 *     exponentials and the targets' logits all-reduced (pt_vocab_xent_*).
 *     Padded vocabulary rows never win the softmax and get exactly zero
 *     gradient.
 *
 * Everything whole (LayerNorms, row-parallel biases, wpe, the residual
 * stream) gets the same input on every rank, since an all-reduce hands
 * every rank the same sum: their gradients are bitwise equal across the
 * group and the global norm counts them once (gradnorm.c).
 *
 * SEQUENCE PARALLELISM (m->sp; Korthikanti et al. 2022): the LayerNorm and
 * residual regions hold this rank's R = N/t rows of the micro-batch. Each
 * LayerNorm's output is all-gathered before its column-parallel linear,
 * each row-parallel product reduce-scattered instead of all-reduced (in the
 * backward: the output gradient all-gathered, the column-parallel input
 * gradient reduce-scattered). The weight gradients of c_attn, c_fc and the
 * LM head need the whole LayerNorm output: it is gathered again in the
 * weight-gradient pass W rather than kept (activations a t-th, at the
 * price of one more all-gather per LayerNorm; keeping B's gathered copies
 * would cost two more (N,C) buffers per micro-batch whose W is deferred,
 * the memory sequence parallelism exists to save). The LayerNorms'
 * parameter gradients are partial sums over the rows held and are
 * all-reduced in W; the row-parallel biases and wpe take theirs from the
 * gathered (whole) output gradient, the same on every rank.
 *
 * Two group-of-one fast paths, each the same interface's implementation
 * for t = 1 and each keeping the single worker's bits: the row-parallel
 * linear adds bias and residual in the GEMM's epilogue (one pass; the
 * epilogue rounds (res + bias) + product, not res + (product + bias)),
 * and the cross-entropy is the fused one-pass kernel, whose context needs
 * no reduction buffer (activations.c sizes the head's without one at
 * t = 1, and the planner counts that).
 *
 * Not here: the modules (modules.c), the split itself (shard.c). */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"
#include "partrain/kernels.h"

/* A collective's failure, named: "tensor-parallel <what>: <its message>". */
static pt_status named(pt_status st, const char *what) {
    if (st == PT_OK) return PT_OK;
    char msg[256]; /* pt_error_set writes the buffer pt_error_message reads */
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "tensor-parallel %s: %s", what, msg);
}

pt_status pt_tp_allreduce(pt_model *m, float *buf, size_t n, const char *what) {
    if (m->tp == 1) return PT_OK;
    return named(pt_comm_allreduce(m->tp_comm, buf, n, PT_REDUCE_SUM), what);
}

/* Sequence parallelism: full (N,C) from every rank's rows, this rank's at
 * its place already (pt_comm_shard's split of N*C is by rows: t | N). */
static pt_status allgather(pt_model *m, float *full, size_t n, const char *what) {
    return named(pt_comm_allgather(m->tp_comm, full, n), what);
}

int pt_tp_rows_held(const pt_model *m, int N) {
    return m->sp ? N / m->tp : N;
}

float *pt_tp_rows(const pt_model *m, float *full, int N) {
    if (!m->sp) return full;
    return full + (size_t)m->tp_rank * (size_t)(N / m->tp) * (size_t)m->cfg.n_embd;
}

pt_status pt_tp_col_input(pt_model *m, pt_module_scratch *s, pt_act rows, int N, pt_act *whole,
                          const char *what) {
    *whole = rows;
    if (!m->sp) return PT_OK;
    size_t R = (size_t)(N / m->tp), C = (size_t)m->cfg.n_embd;
    if (m->bf16) {
        /* bf16 rows all-gathered as floats, two to one (C even, so every
         * rank's R C bf16 are whole floats at their place): half the bytes */
        pt_bf16 *full = (pt_bf16 *)s->full;
        memcpy(full + (size_t)m->tp_rank * R * C, rows.h, R * C * sizeof(pt_bf16));
        *whole = (pt_act){NULL, full};
        return allgather(m, s->full, (size_t)N * C / 2, what);
    }
    memcpy(pt_tp_rows(m, s->full, N), rows.f, R * C * sizeof(float));
    *whole = (pt_act){s->full, NULL};
    return allgather(m, s->full, (size_t)N * C, what);
}

pt_status pt_tp_row_sum(pt_model *m, float *buf, int N, float **mine, const char *what) {
    size_t NC = (size_t)N * (size_t)m->cfg.n_embd;
    *mine = pt_tp_rows(m, buf, N);
    if (!m->sp) return pt_tp_allreduce(m, buf, NC, what);
    /* the sum of every rank's buf lands in this rank's rows of it */
    return named(pt_comm_reduce_scatter(m->tp_comm, buf, NC, PT_REDUCE_SUM), what);
}

pt_status pt_tp_row_linear_res(pt_model *m, int i, int kw, float *out, const float *res, pt_act inp,
                               int N, int K, float *tmp, const char *what) {
    int C = m->cfg.n_embd, R = pt_tp_rows_held(m, N);
    if (m->tp == 1) { /* the fast path (above): bias and residual in the epilogue */
        pt_prec_linear_res(m, i, kw, out, res, inp, N, K, C);
        return PT_OK;
    }
    const float *bias = W(m, i, kw + 1);
    float *p = m->sp ? tmp : out, *sum;
    pt_prec_linear_partial(m, i, kw, p, inp, N, K, C);
    PT_CHECK(pt_tp_row_sum(m, p, N, &sum, what));
    for (int n = 0; n < R; n++) {
        float *o = out + (size_t)n * C;
        const float *y = sum + (size_t)n * C, *r = res + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = r[c] + (y[c] + bias[c]);
    }
    return PT_OK;
}

pt_status pt_tp_whole_grad(pt_model *m, float *full, const float *rows, int N, int keep,
                           const float **whole, const char *what) {
    size_t C = (size_t)m->cfg.n_embd, R = (size_t)pt_tp_rows_held(m, N);
    *whole = full;
    if (!m->sp && rows && !keep) {
        *whole = rows;
        return PT_OK;
    }
    if (rows) memcpy(pt_tp_rows(m, full, N), rows, R * C * sizeof(float));
    return m->sp ? allgather(m, full, (size_t)N * C, what) : PT_OK;
}

/* dw, db += the parameter gradients of R rows. */
static void ln_params(float *dw, float *db, const float *dout, const float *x, const pt_bf16 *xhat,
                      const float *mean, const float *rstd, int R, int C) {
    if (xhat)
        pt_layernorm16_backward_params(dw, db, dout, xhat, R, C);
    else
        pt_layernorm_backward_params(dw, db, dout, x, mean, rstd, R, C);
}

pt_status pt_tp_ln_params(pt_model *m, pt_module_scratch *s, float *dw, float *db, float *dout,
                          const float *x, const pt_bf16 *xhat, const float *mean, const float *rstd,
                          int N) {
    int C = m->cfg.n_embd;
    if (!m->sp) {
        ln_params(dw, db, dout, x, xhat, mean, rstd, N, C);
        return PT_OK;
    }
    memset(s->ln_g, 0, 2 * (size_t)C * sizeof(float));
    ln_params(s->ln_g, s->ln_g + C, pt_tp_rows(m, dout, N), x, xhat, mean, rstd, N / m->tp, C);
    PT_CHECK(pt_tp_allreduce(m, s->ln_g, 2 * (size_t)C,
                             "sequence-parallel LayerNorm gradient all-reduce"));
    for (int c = 0; c < C; c++) {
        dw[c] += s->ln_g[c];
        db[c] += s->ln_g[C + c];
    }
    return PT_OK;
}

/* The rows' common shift: the max over every rank's real columns, from the
 * all-gathered local maxima (the same array, so the same shift, on every
 * rank). gathered (t*N): rank r's at [r*N, (r+1)*N); the result lands in
 * its first N. */
static pt_status row_max(pt_model *m, float *gathered, int N) {
    PT_CHECK(allgather(m, gathered, (size_t)N * m->tp, "cross-entropy max all-gather"));
    for (int r = 1; r < m->tp; r++) {
        const float *o = gathered + (size_t)r * N;
        for (int n = 0; n < N; n++)
            if (o[n] > gathered[n]) gathered[n] = o[n];
    }
    return PT_OK;
}

/* bf16: the blocked cross-entropy (kernels.h, pt_xent16_*): each block of
 * fp32 logits is computed into tmp (N, nb) and folded into the rows'
 * statistics; the maxima all-gathered and the sums all-reduced as in fp32
 * (at t = 1 no collective); dlogits left in bf16 in c->logits. */
static pt_status xent16(pt_model *m, pt_module_ctx *c, const pt_batch *b, const pt_bf16 *lnf,
                        float *tmp) {
    int N = b->B * b->T, C = m->cfg.n_embd, nb = pt_xent_block_cols(m);
    int nblk = (m->vl + nb - 1) / nb;
    float *stats = c->xent, *gmax = stats + (size_t)N * 4, *red = gmax + (size_t)N * m->tp;
    pt_xent16_begin(stats, N);
    for (int k = 0; k < nblk; k++) {
        int c0 = k * nb, w = m->vl - c0 < nb ? m->vl - c0 : nb;
        pt_matmul16_forward_wt(tmp, w, lnf, m->wte16 + (size_t)c0 * C, N, C, w);
        pt_xent16_block(stats, c->logits.h, c->bmax, tmp, w, b->targets, N, m->vl, c0, w, k, nblk,
                        m->v0, m->vreal);
    }
    pt_xent16_local_max(gmax + (size_t)m->tp_rank * N, stats, N);
    if (m->tp > 1) PT_CHECK(row_max(m, gmax, N));
    pt_xent16_shift(red, stats, gmax, N);
    PT_CHECK(pt_tp_allreduce(m, red, (size_t)N * 4, "cross-entropy sum all-reduce"));
    pt_xent16_finish(c->losses, c->logits.h, c->bmax, gmax, red, b->targets, N, m->vl, nb, nblk,
                     m->v0, m->vreal, b->dloss);
    return PT_OK;
}

pt_status pt_tp_xent(pt_model *m, pt_module_ctx *c, const pt_batch *b, pt_act lnf, float *tmp) {
    int N = b->B * b->T;
    if (m->bf16) return xent16(m, c, b, lnf.h, tmp);
    float *logits = c->logits.f;
    if (m->tp == 1) { /* the fast path (above): one pass, no reduction buffer */
        pt_softmax_xent_forward_backward(c->losses, logits, logits, b->targets, N, m->vl, b->dloss);
        return PT_OK;
    }
    float *stats = c->xent, *gmax = c->xent + (size_t)N * PT_VOCAB_XENT_STATS;
    pt_vocab_xent_max(gmax + (size_t)m->tp_rank * N, logits, N, m->vl, m->vreal);
    PT_CHECK(row_max(m, gmax, N));
    pt_vocab_xent_sumexp(stats, logits, logits, gmax, b->targets, N, m->vl, m->v0, m->vreal);
    PT_CHECK(
        pt_tp_allreduce(m, stats, (size_t)N * PT_VOCAB_XENT_STATS, "cross-entropy sum all-reduce"));
    pt_vocab_xent_finish(c->losses, logits, gmax, stats, b->targets, N, m->vl, m->v0, m->vreal,
                         b->dloss);
    return PT_OK;
}
