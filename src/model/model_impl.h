/* Private to the model layer: the model's structs and what its files
 * share: passes.c (passes over ranges of modules, with the plug points;
 * the whole-model passes), model.c (config, tensor table, parameter and
 * gradient buffers, init), modules.c (the three kinds of module: forward,
 * B and W), tp_group.c (the tensor-parallel group they are written over, a
 * group of one at tp = 1), activations.c (contexts, scratch, slots and
 * their sizes), shard.c (which slice of each tensor a tp rank holds). */
#ifndef PT_MODEL_IMPL_H
#define PT_MODEL_IMPL_H

#include "partrain/comm.h"
#include "partrain/kernels.h"
#include "partrain/model.h"

/* An activation in the model's precision (pt_model_options.bf16): f in
 * fp32, h in bf16, the other NULL. What the matrix products read and the
 * backward keeps; sums, gradients and LayerNorm statistics stay float *. */
typedef struct {
    float *f;
    pt_bf16 *h;
} pt_act;

/* Saved activations of one module for one (micro-)batch. One allocation in
 * PT_MEM_ACTS, carved into the buffers below (unused ones stay NULL). A
 * block keeps only what its model's recompute mode keeps (pt_block_carve);
 * the rest lives in a scratch's recompute region while a pass needs it. */
struct pt_module_ctx {
    int module;
    pt_module_kind kind;
    int max_B;
    int B, T;        /* of the last forward */
    const float *in; /* lent input of the last forward, read by backward */
    float *buf;
    int own_buf; /* buf is ours to free (else the caller's memory: pt_model_slot_new_range_in) */
    /* block (pt_act: the model's precision) */
    pt_act ln1;                 /* (R,C) ln_1's output */
    float *ln1_mean, *ln1_rstd; /* (R), (R) */
    pt_act qkv;                 /* (N,3C) */
    pt_act att;  /* softmax probabilities: (B,NH,T,T); bf16 packed (pt_attention16_att_elems) */
    pt_act atty; /* (N,C) attention output before c_proj */
    float *res2; /* (R,C) in + attention branch (fp32; bf16: not kept) */
    pt_act ln2;  /* (R,C) (bf16: not kept) */
    /* bf16: ln_2's normalized input (R,C) in place of res2 and ln2: its
     * backward reads it (pt_layernorm16_*), W recomputes ln2 from it */
    pt_bf16 *xhat2;
    float *ln2_mean, *ln2_rstd; /* (R), (R) */
    pt_act fch, fch_gelu;       /* (N,4C) */
    /* head */
    pt_act lnf;                 /* (R,C) */
    float *lnf_mean, *lnf_rstd; /* (R), (R) */
    /* (N,V); dlogits in place after a forward with targets. bf16: the
     * blocked cross-entropy's l - m per block, bmax its (N, nblk) m */
    pt_act logits;
    float *bmax;
    float *losses; /* (N) */
    float *xent;   /* the cross-entropy's reductions: tp > 1, (N, 4 + tp); bf16, (N, 8 + tp) */
    pt_module_scratch *scratch; /* lent; NULL: the model's */
};

/* A block's intermediate gradients during its backward, and attention's
 * backward scratch: one PT_MEM_ACTS allocation. The split backward's B
 * leaves in it what its W reads: d_out (the module's output gradient; the
 * gathered one under sequence parallelism), d_fch, d_ln (ln_2's output
 * gradient; the head's ln_f's), d_res2, d_qkv, d_ln1 (ln_1's).
 * A DEFERRED scratch (pt_module_scratch_new_deferred) holds only what a
 * deferred W reads and its context cannot: the embedding's d_out and the
 * head's d_ln in rem; a block's B computes in the model's scratch and
 * moves its W's gradients into its view's dead buffers and rem
 * (block_stash in modules.c), and its d_* pointers stay NULL. */
struct pt_module_scratch {
    float *buf;
    int deferred;
    float *rem; /* deferred: (N,C) for the embedding or head, a block's stash overflow */
    float *d_res2, *d_ln, *d_atty; /* (N,C), (N,C), (N,C/tp) */
    float *d_out, *d_ln1;          /* (N,C); d_out: the whole output gradient when gathered
                                      (sequence parallelism) or kept for a later W */
    float *d_qkv;                  /* (N,3C) */
    float *d_fch;                  /* (N,4C) */
    float *att;                    /* pt_attention_scratch_floats */
    /* sequence parallelism: a gathered (N,C) buffer (LayerNorm outputs,
     * the embedding's lookup) and a LayerNorm's partial parameter gradient
     * (2C) before its all-reduce */
    float *full, *ln_g;
    /* bf16: a LayerNorm output (R,C) between its computation and the
     * product that reads it (ln_2's, not kept; its recompute in W) */
    pt_bf16 *ln16;
    /* model.recompute: one block's activations that its context does not
     * keep (FULL: all; SELECTIVE: att, fch_gelu), for batches up to max_B:
     * the forward's transient ones (the model's scratch), the backward's
     * recomputed ones (B writes them, W reads them). NULL under NONE. */
    int max_B;
    float *recomp;
};

/* A block's activation buffers, by which recompute mode keeps them:
 * PT_ACTS_KEPT those SELECTIVE keeps, PT_ACTS_DROPPED those it does not
 * (att, fch_gelu), PT_ACTS_ALL both (NONE's context, FULL's region). */
enum { PT_ACTS_KEPT = 1, PT_ACTS_DROPPED = 2, PT_ACTS_ALL = 3 };
/* The floats of the `which` buffers of a block for max_B; p non-NULL: they
 * are carved from p in that order into c's pointers (the others left). */
size_t pt_block_carve(const pt_model *m, int max_B, unsigned which, float *p, pt_module_ctx *c);

/* Floats a bf16 buffer of n elements takes in a float carve. */
static inline size_t pt_half_floats(size_t n) {
    return (n + 1) / 2;
}

/* How many of a block's four (N,C) W gradients (d_out, d_res2, d_ln,
 * d_ln1) its dead attention probabilities hold after B (0 to 4; the rest
 * go to a deferred scratch's rem). */
int pt_block_stash_fit(const pt_model *m);
/* bf16: the floats of d_qkv and d_fch that a deferred block's stash keeps
 * in rem after the four (N,C) ones (0 in fp32, where they take qkv's and
 * fch's places). */
size_t pt_block_stash_extra(const pt_model *m, int max_B);

/* One micro-batch in flight: a context per module and the residual stream
 * between them (one PT_MEM_ACTS allocation for the stream). */
struct pt_model_slot {
    int nmod;
    int own_stream; /* stream is ours to free */
    pt_module_ctx **ctx;
    float *stream;
    float **resid; /* L+1 buffers (N,C): resid[0] embedding out, resid[i+1] block i out */
    float *losses; /* (N) */
    pt_batch last; /* of the last forward */
    int have_targets;
};

struct pt_model {
    pt_model_config cfg;
    int max_B;       /* 0: a tensor table only (pt_model_new_slice), no buffers */
    int no_slot;     /* pt_model_options.no_slot: no slot of its own */
    int tp, tp_rank; /* the tensor-parallel slice held (1, 0: the whole model) */
    int ntensors;
    pt_param_info *tensors;
    size_t nparams;
    float *params, *grads;
    size_t *mod_offset, *mod_count; /* per module */
    /* Where each module's parameters and gradients are read and written: the
     * module's region of the flat buffers, or a strategy's buffer laid out
     * like it (pt_model_set_module_buffers; ZeRO units). NULL: none (the flat
     * buffer was dropped and nothing given yet). */
    float **mod_p, **mod_g;
    pt_model_slot *own; /* the whole-model passes' slot */
    /* Backward scratch of every context not given its own (used only while
     * a module's backward runs) */
    pt_module_scratch *scratch;
    /* The whole-model backward's gradient ping-pong (N,C) x 2: backwards
     * run one at a time, so every slot shares it. One PT_MEM_ACTS
     * allocation. */
    float *dstream_buf;
    float *dstream[2];
    pt_model_hook hook; /* the strategies' plug points (NULL: none), called by passes.c */
    void *hook_arg;
    pt_comm *tp_comm;  /* the tp group's (tp > 1; a group of one needs none) */
    int v0, vl, vreal; /* wte: first vocabulary row held, rows held (padding included), real */
    int skip_f;        /* test seam: pt_model_test_skip_f (model_test.h) */
    int sp;            /* sequence parallelism: the LayerNorm and residual regions hold rows
                          [tp_rank, tp_rank + 1) x N/tp of a micro-batch's N */
    pt_recompute recompute;
    /* train.precision = bf16 (pt_model_options.bf16): the products read
     * bf16 operands, the weights' from copies of the fp32 masters rounded
     * at a module's first forward of a step (pt_model_round_weights): w16[i]
     * laid out like block i's region (NULL for the others), wte16 the
     * head's wte (vl rows). One PT_MEM_PARAMS allocation, w16_buf. */
    int bf16;
    pt_bf16 *w16_buf, **w16, *wte16;
    /* bf16: block i's ln_2 weight and bias (2C, fp32) as of its forward, for
     * W's recompute of ln_2's output: W must not read the parameters, which
     * ZeRO-3 has freed by then. In w16_buf after the bf16 copies. */
    float **ln2p;
    /* pipeline stage: owned[i] (all 1 for a whole model); mod_first[i] the
     * index of module i's first tensor in the table (-1: not held); the
     * tied wte copy of a stage with the head and not the embedding (NULL
     * otherwise), wte_numel floats each */
    unsigned char *owned;
    int *mod_first;
    float *tied_p, *tied_g;
    size_t wte_numel;
};

/* bf16: the vocabulary columns of one block of the head's blocked
 * cross-entropy (kernels.h, pt_xent16_*): the fp32 logits of a block are
 * computed into the backward scratch's d_fch, (N, 4 Cl), free during the
 * head's forward. */
static inline int pt_xent_block_cols(const pt_model *m) {
    int nb = 4 * (m->cfg.n_embd / m->tp);
    return nb < m->vl ? nb : m->vl;
}

/* Tensor order inside each module (the flat layout): the embedding's tensors
 * are 0..1, block i's start at 2 + 12 i, the head's at 2 + 12 L. */
enum { EMB_WTE, EMB_WPE, EMB_NTENSORS };
enum {
    BLK_LN1_W,
    BLK_LN1_B,
    BLK_QKV_W,
    BLK_QKV_B,
    BLK_ATTPROJ_W,
    BLK_ATTPROJ_B,
    BLK_LN2_W,
    BLK_LN2_B,
    BLK_FC_W,
    BLK_FC_B,
    BLK_FCPROJ_W,
    BLK_FCPROJ_B,
    BLK_NTENSORS
};
enum { HEAD_LNF_W, HEAD_LNF_B, HEAD_NTENSORS };

/* Module i's kind (pt_model_module_kind). */
static inline pt_module_kind pt_kind_of(const pt_model *m, int i) {
    return i == 0 ? PT_MODULE_EMBEDDING : i <= m->cfg.n_layer ? PT_MODULE_BLOCK : PT_MODULE_HEAD;
}

/* Index of module i's first tensor in the tensor table (module i held). */
static inline int pt_model_first_tensor(const pt_model *m, int i) {
    PT_ASSERT(m->mod_first[i] >= 0);
    return m->mod_first[i];
}

/* Tensor k of module i, through the module's (possibly redirected) region. */
#define TOFF(m, i, k)                                                                              \
    ((m)->tensors[pt_model_first_tensor((m), (i)) + (k)].offset - (m)->mod_offset[i])
#define W(m, i, k)   ((m)->mod_p[i] + TOFF(m, i, k))
#define DW(m, i, k)  ((m)->mod_g[i] + TOFF(m, i, k))
#define W16(m, i, k) ((m)->w16[i] + TOFF(m, i, k))
/* The LM head's wte: the embedding's, or a stage's tied copy. */
#define HEAD_WTE(m)  ((m)->tied_p ? (m)->tied_p : W(m, 0, EMB_WTE))
#define HEAD_DWTE(m) ((m)->tied_g ? (m)->tied_g : DW(m, 0, EMB_WTE))

/* bf16: module i's weight copies from its current fp32 parameters (a
 * block's region, the head's wte); nothing in fp32 or for the embedding. */
void pt_model_round_weights(pt_model *m, int i);

/* ---- activations.c ---- */

/* The model's own activation buffers for its max_B: the backward scratch,
 * the gradient ping-pong and, for a whole model, its slot; and their
 * bytes for batches of max_B (what pt_model_buffer_bytes counts as ACTS).
 * _free releases them (those allocated, after a failure too). */
pt_status pt_model_acts_alloc(pt_model *m);
void pt_model_acts_free(pt_model *m);
size_t pt_model_acts_bytes(const pt_model *m, int max_B);

/* ---- tp_group.c: the tensor-parallel group (tp_group.c says the math) ----
 * Every function works for a group of one (tp = 1: no collective, no
 * communicator) and for the tp group (m->tp_comm), with or without
 * sequence parallelism; each returns the first failed collective's error
 * at once, named "tensor-parallel <what>: ...". N is a micro-batch's rows,
 * R = rows held of the LayerNorm and residual regions (N, or N/tp under
 * sequence parallelism). */

/* R for N. */
int pt_tp_rows_held(const pt_model *m, int N);
/* This rank's R rows of an (N,C) buffer (all of it without sequence
 * parallelism). */
float *pt_tp_rows(const pt_model *m, float *full, int N);
pt_status pt_tp_allreduce(pt_model *m, float *buf, size_t n, const char *what);
/* Into a column-parallel linear: *whole the (N,C) LayerNorm output from
 * this rank's rows (plain: rows itself; sequence parallelism: all-gathered
 * into s->full). */
pt_status pt_tp_col_input(pt_model *m, pt_module_scratch *s, pt_act rows, int N, pt_act *whole,
                          const char *what);
/* Out of a row-parallel product (or a column-parallel input gradient):
 * buf (N,C) holds this rank's partial sum; *mine gets this rank's R rows of
 * the group's sum, in buf (all-reduce, or reduce-scatter). */
pt_status pt_tp_row_sum(pt_model *m, float *buf, int N, float **mine, const char *what);
/* A row-parallel linear with bias and residual: out (R,C) = res + (inp
 * (N,K) @ w (K,C), summed over the group, + bias), w and bias module i's
 * tensors kw and kw + 1. tmp (N,C): where the partial product goes under
 * sequence parallelism (out holds only R rows). */
pt_status pt_tp_row_linear_res(pt_model *m, int i, int kw, float *out, const float *res, pt_act inp,
                               int N, int K, float *tmp, const char *what);
/* Into a row-parallel linear's backward: *whole the (N,C) output gradient
 * from this rank's rows (NULL: already at their place in full). Sequence
 * parallelism gathers into full; otherwise the rows are the whole, copied
 * into full only when `keep` (the split backward's W reads full later). */
pt_status pt_tp_whole_grad(pt_model *m, float *full, const float *rows, int N, int keep,
                           const float **whole, const char *what);
/* A LayerNorm's parameter gradients from its output gradient dout (N,C)
 * (this rank's rows of it under sequence parallelism, summed over the
 * group through s->ln_g), input x and statistics (R rows), or (bf16, xhat
 * non-NULL) the normalized input xhat. */
pt_status pt_tp_ln_params(pt_model *m, pt_module_scratch *s, float *dw, float *db, float *dout,
                          const float *x, const pt_bf16 *xhat, const float *mean, const float *rstd,
                          int N);
/* The vocabulary-parallel cross-entropy of the head's context c: losses
 * and, in place of the logits (N, vl), dlogits weighted by b->dloss.
 * fp32: from the logits c holds (lnf, tmp unused); bf16: the logits
 * computed from ln_f's whole output lnf block by block into tmp (N,
 * pt_xent_block_cols). */
pt_status pt_tp_xent(pt_model *m, pt_module_ctx *c, const pt_batch *b, pt_act lnf, float *tmp);

/* ---- precision.c: a module's steps in the model's precision ----
 * fp32 or bf16 kernels by m->bf16, shapes and contracts as the kernels'
 * (kernels.h). A linear is module i's weight tensor kw (its bias kw + 1,
 * or none); its fp32 output, where only the bf16 copy is kept, goes to
 * tmp (N,OC). */
/* bf16 with xhat non-NULL: xhat kept too (pt_layernorm_forward16). */
void pt_prec_layernorm(pt_model *m, pt_act out, pt_bf16 *xhat, float *mean, float *rstd,
                       const float *x, const float *w, const float *b, int R, int C);
/* LayerNorm's input gradient (pt_layernorm_backward_input): from x, mean
 * and rstd, or (bf16, xhat non-NULL) from xhat and rstd. */
void pt_prec_layernorm_input(pt_model *m, float *dinp, const float *dres, const float *dout,
                             const float *x, const pt_bf16 *xhat, const float *w, const float *mean,
                             const float *rstd, int R, int C);
void pt_prec_linear(pt_model *m, int i, int kw, pt_act out, float *tmp, pt_act inp, int N, int C,
                    int OC);
void pt_prec_linear_gelu(pt_model *m, int i, int kw, pt_act pre, pt_act act, float *tmp, pt_act inp,
                         int N, int C, int OC);
/* out (N,OC) = inp @ w, no bias: a row-parallel linear's partial sum. */
void pt_prec_linear_partial(pt_model *m, int i, int kw, float *out, pt_act inp, int N, int C,
                            int OC);
void pt_prec_linear_res(pt_model *m, int i, int kw, float *out, const float *res, pt_act inp, int N,
                        int C, int OC);
void pt_prec_gelu(pt_model *m, pt_act act, pt_act pre, size_t n);
void pt_prec_attention(pt_model *m, pt_act out, pt_act att, float *scratch, pt_act qkv, int B,
                       int T, int C, int NH);
void pt_prec_attention_backward_set(pt_model *m, float *dqkv, float *scratch, const float *dout,
                                    pt_act qkv, pt_act att, int B, int T, int C, int NH);
void pt_prec_linear_input_set(pt_model *m, int i, int kw, float *dinp, const float *dout, int N,
                              int C, int OC);
void pt_prec_linear_input_gelu_set(pt_model *m, int i, int kw, float *dpre, const float *dout,
                                   pt_act pre, int N, int C, int OC);
/* Weight and bias gradients (+=). */
void pt_prec_linear_weight(pt_model *m, int i, int kw, const float *dout, pt_act inp, int N, int C,
                           int OC);
/* The LM head over this rank's vl vocabulary rows of wte: with targets,
 * losses and dlogits (pt_tp_xent); without, the fp32 logits (fp32 only). */
pt_status pt_prec_head_forward(pt_model *m, pt_module_ctx *c, const pt_batch *b, pt_act lnf,
                               float *tmp);
/* d_ln (N,C) = dlogits @ wte, OVERWRITTEN. */
void pt_prec_head_input_set(pt_model *m, pt_module_ctx *c, float *d_ln, int N);
/* wte's gradient += dlogits^T @ lnf. */
void pt_prec_head_weight(pt_model *m, pt_module_ctx *c, pt_act lnf, int N);

#endif
