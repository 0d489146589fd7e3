/* partrain model: a GPT-2 decoder (pre-LN blocks, fused qkv, 4x MLP, tanh
 * GELU, learned positions, LM head tied to the token embedding) built as a
 * LIST OF MODULES over one flat parameter buffer.
 *
 * Modules, in order: 0 the embedding (wte, wpe); 1..L the blocks h.{i};
 * L+1 the head (ln_f, and the tied LM head, which reads wte). Each module owns
 * its named parameters in ONE contiguous region of the model-wide flat
 * parameter buffer, and its gradients in the same region of the flat
 * gradient buffer, so that a DDP bucket, a ZeRO shard or an FSDP unit is a
 * slice, not a copy. Parameter names and shapes are GPT-2's (checkpoint layout
 * (C, OC) for linears). Shape letters as in kernels.h: B, T, C, NH, V, L.
 *
 * Lifecycle: pt_model_new (allocates params, grads and every activation
 * buffer for batches up to max_B x seq_len, up front, by category) ->
 * pt_model_draw_weights (GPT-2 init from (seed, name, element index)) -> repeatedly
 * pt_model_zero_grads, pt_model_forward_range, pt_model_backward_range
 * (over a slot's modules, the model's own slot for the whole model) ->
 * pt_model_free. The passes allocate nothing.
 *
 * Module-level access (for pipeline stages and FSDP): pt_module_forward /
 * pt_module_backward run one module with an explicit activation context
 * (pt_module_ctx), pure compute; the range passes (pt_model_forward_range
 * and its siblings) run contiguous modules in a slot and call the plug
 * point (pt_model_set_hook) around each. The model keeps one slot of
 * contexts for its own whole-model passes; a schedule can create more
 * (pt_model_slot: one per in-flight micro-batch). Every pass returns
 * pt_status: a failed tensor-parallel collective, or a hook's error, at
 * once.
 *
 * Sharded tensors (pt_shard, pt_model_new_slice): the model of one tensor-
 * parallel rank holds slices of the global tensors; shard.c describes them.
 *
 * Tensor parallelism (pt_model_set_tp_comm): each module has one
 * implementation, Megatron's, written over a tensor-parallel group that
 * may have one rank (tp = 1: every collective a no-op, no communicator);
 * with tp > 1 the collectives are the tp group's, the only communication
 * in the model (src/model/tp_group.c).
 *
 * Not here: the optimizer, data, the strategies' communication (parallel),
 * checkpoint files. */
#ifndef PARTRAIN_MODEL_H
#define PARTRAIN_MODEL_H

#include "partrain/comm.h"
#include "partrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest model.vocab_size: what a token id's type holds. Ids are int
 * (32-bit) in batches and kernels, llm.c's wide token files hold uint32
 * ids checked below the vocabulary, and every size built from V (wte's
 * V x C, the logits' N x V) is computed in 64 bits. */
#define PT_VOCAB_MAX 2147483647

/* Architecture. All > 0 (vocab_size <= PT_VOCAB_MAX); n_embd % n_head == 0.
 * seq_len is also the number of learned positions (wpe rows). */
typedef struct {
    int n_layer;
    int n_embd;
    int n_head;
    int vocab_size;
    int seq_len;
} pt_model_config;

/* One clear message per problem, naming the key ("model.n_embd ..."). */
pt_status pt_model_config_validate(const pt_model_config *c);
/* Number of parameters (floats) of the architecture. */
size_t pt_model_config_num_params(const pt_model_config *c);

/* ---- sharded tensors ----
 * Under t-way tensor parallelism (Megatron's split) every parameter keeps
 * its GLOBAL shape, GPT-2's, and tp rank r holds a SLICE of it: the pieces
 * [offset, offset + extent) of one split dimension, concatenated in order;
 * the other dimension is whole. The split, for rank r of t:
 *   column-parallel c_attn, c_fc: the output dimension (weight dim 1, bias
 *     dim 0). c_attn's (C, 3C) holds q, k and v side by side, so its slice is
 *     THREE pieces, rank r's heads of each: [b*C + r*C/t, C/t) for b = q, k, v;
 *   row-parallel attn.c_proj, mlp.c_proj: the input dimension (weight dim
 *     0); their biases are whole (added once, after the all-reduce);
 *   wte (V, C): vocabulary rows (vocabulary-parallel embedding and LM
 *     head) of the vocabulary PADDED to Vp = t*Vl, Vl = ceil(V/t): rank r
 *     holds the Vl rows [r*Vl, (r+1)*Vl), of which those below V are real
 *     (one piece, offset r*Vl, extent min(V, (r+1)*Vl) - r*Vl, possibly 0:
 *     V 5, t 4 gives rank 3 only padding) and the last `pad` are padding;
 *   wpe and the LayerNorms: whole on every rank.
 * Padding rows are in the local shape and numel (the model allocates them;
 * the vocabulary-parallel kernels' (kernels.h) v0 is piece[0].offset, Vl
 * piece[0].extent + pad and nreal piece[0].extent) but in no run: init
 * leaves them as allocated (zero), a checkpoint never holds them (its
 * shapes are GPT-2's) and the slice reader sets them to zero. Only wte is
 * ever padded.
 * t must divide n_head (each rank holds whole heads; then it divides C and
 * 4C too). With t = 1 every slice is the whole tensor (pad 0). The
 * description is a pure function of (config, tensor name, t, r): every rank
 * can compute every other rank's slice. */
#define PT_SHARD_MAX_PIECES 3
typedef struct {
    int ndim;         /* 1 or 2 */
    int64_t shape[2]; /* the global tensor's shape (shape[1] 0 for a vector) */
    int split_dim;    /* -1: whole on every rank (npieces 0); else 0 or 1 */
    int npieces;      /* along split_dim, increasing, not overlapping */
    struct {
        int64_t offset, extent; /* global indices along split_dim */
    } piece[PT_SHARD_MAX_PIECES];
    int64_t pad; /* padding rows after the pieces along split_dim 0 (wte only), else 0 */
} pt_shard;

/* Whether t-way tensor parallelism can split cfg's model: one line naming
 * the value that t does not divide. */
pt_status pt_shard_check(const pt_model_config *c, int t);
/* The slice of tensor `name` (a GPT-2 parameter name of cfg's model) held by
 * tp rank r of t. Errors: an unknown name, pt_shard_check's, r outside
 * [0, t). */
pt_status pt_shard_describe(pt_shard *out, const pt_model_config *c, const char *name, int t,
                            int r);
/* The slice's shape: the global shape with split_dim's extent the sum of
 * the pieces' plus pad (shape[1] 0 for a vector); and its element count,
 * padding included. */
void pt_shard_local_shape(const pt_shard *s, int64_t shape[2]);
size_t pt_shard_local_numel(const pt_shard *s);
/* The global tensor's element count; whether the slice is all of it, laid
 * out alike (no padding: every piece, or no split). */
size_t pt_shard_numel(const pt_shard *s);
int pt_shard_whole(const pt_shard *s);
/* The slice as runs of consecutive elements of both row-major layouts: run
 * k (0 <= k < pt_shard_num_runs) is the len elements at index *global of
 * the full tensor and at *local of the slice. Runs go in increasing order of
 * both and cover the slice's REAL elements once (never padding): one per
 * non-empty piece for a row split (none for a rank of wte that holds only
 * padding), one per (row, piece) for a column split, one for a whole
 * tensor. */
size_t pt_shard_num_runs(const pt_shard *s);
void pt_shard_run(const pt_shard *s, size_t k, size_t *global, size_t *local, size_t *len);

/* A named parameter tensor: a slice of the flat buffers. */
#define PT_PARAM_NAME_MAX 48
typedef struct {
    char name[PT_PARAM_NAME_MAX]; /* GPT-2 name, e.g. "h.0.attn.c_attn.weight" */
    int ndim;                     /* 1 or 2 */
    int64_t shape[2];             /* of the slice this model holds (t = 1: GPT-2's) */
    size_t offset;                /* in floats, into pt_model_params / pt_model_grads */
    size_t numel;                 /* of the slice */
    int decay;                    /* 1 for matrices (weight decay applies), 0 for biases and LN */
    int module;                   /* index of the owning module */
    pt_shard shard;               /* the global tensor and which part of it this is */
} pt_param_info;

typedef enum { PT_MODULE_EMBEDDING, PT_MODULE_BLOCK, PT_MODULE_HEAD } pt_module_kind;

/* What one (micro-)batch feeds the model. tokens and targets (B,T) are lent
 * for the duration of forward AND backward. dloss is the weight of each
 * position's loss in the total that is differentiated (1/(B*T) for the mean
 * over one batch; 1/(B*T*M) with M micro-batches). */
typedef struct {
    const int *tokens;  /* (B,T), read by the embedding */
    const int *targets; /* (B,T) or NULL (inference), read by the head */
    float dloss;
    int B, T;
    /* Where the (micro-)batch stands in the optimizer step, for the plug
     * points (pt_hook_point): its index among the step's micro-batches, and
     * whether its backward is the LAST of the step on this rank (the one
     * after which a module's gradients are final). Outside a training step
     * both may stay 0. */
    int micro, last;
} pt_batch;

typedef struct pt_model pt_model;
typedef struct pt_module_ctx pt_module_ctx;

/* Allocate a model for batches of up to max_B sequences of up to seq_len
 * tokens. Parameters are zero until pt_model_draw_weights or a checkpoint load. */
pt_status pt_model_new(pt_model **out, const pt_model_config *cfg, int max_B);
/* The model of tp rank tp_rank of tp (pt_shard_check'd): the same modules
 * and tensors as pt_model_new's, each of its slice's shape (pt_param_info's
 * shape and numel; .shard has the global one), laid out module by module in
 * flat buffers of the slices' total size. tp = 1 is exactly pt_model_new.
 * With tp > 1 the passes are tensor-parallel and need the group's
 * communicator (pt_model_set_tp_comm); init and checkpoints work by slice,
 * and activations are this rank's share (heads, MLP columns, vocabulary
 * rows; LayerNorms and the residual stream whole). max_B 0
 * builds the tensor table only, without any buffer (pt_model_params and
 * pt_model_grads NULL, as after pt_model_drop_flat; no pass can run): what
 * a checkpoint reader or writer needs. */
pt_status pt_model_new_slice(pt_model **out, const pt_model_config *cfg, int max_B, int tp,
                             int tp_rank);
/* Activation recomputation (model.recompute): what a block's forward keeps
 * for its backward. NONE keeps every intermediate; SELECTIVE drops the
 * attention probabilities att (B,NH,T,T) and the GELU output gelu(fch)
 * (N,4C), recomputed in backward from qkv and fch, which are kept
 * (Korthikanti et al. 2022's selective recomputation; no collective);
 * FULL keeps only the module's input (lent, as in every mode) and reruns
 * its forward up to gelu(fch) in backward, without the plug points and
 * without touching gradients. The embedding keeps nothing in any mode and
 * the head keeps what NONE keeps (the fused cross-entropy leaves dlogits
 * in the logits, which its backward needs): recomputation is the blocks'.
 * Per block context, in floats, with N = B*T rows (max_B), Cl = C/tp, NHl
 * = NH/tp, R = N (N/tp under sequence parallelism):
 *   NONE       3RC + 4R + N Cl + 3N Cl + B NHl T^2 + 8N Cl
 *   SELECTIVE  NONE - B NHl T^2 - 4N Cl
 *   FULL       0
 * What a context does not keep lives in a RECOMPUTE REGION of a backward
 * scratch (pt_module_scratch_new grows it by one block's dropped buffers:
 * B NHl T^2 + 4N Cl under SELECTIVE, NONE's block under FULL): the forward
 * writes its transient ones into the model's scratch, the backward
 * recomputes them into the context's scratch -- the input-gradient pass B
 * recomputes, the weight-gradient pass W reads, so a context with a
 * scratch of its own keeps them from its B to its W (other passes between,
 * other micro-batches' forwards included). One scratch per deferred W: two
 * contexts sharing one would overwrite each other's.
 * Under tensor parallelism every rank of the group recomputes the same
 * block in the same backward, so the collectives match; FULL reruns the
 * forward's collectives up to c_fc -- per block and backward, plain tp one
 * more all-reduce of (N,C) (attention c_proj's), sequence parallelism two
 * more all-gathers (ln_1's, ln_2's) and one more reduce-scatter (c_proj's)
 * -- extra traffic counted in the comm stats like any other; SELECTIVE
 * adds none. The gradients, input gradients and losses are bitwise those
 * of NONE (the same kernels on the same data, in the same order), for the
 * fused backward and for B then W. */
typedef enum { PT_RECOMPUTE_NONE = 0, PT_RECOMPUTE_SELECTIVE, PT_RECOMPUTE_FULL } pt_recompute;

/* Everything about a model's layout beyond the architecture; zero-filled
 * means the whole model on one worker (tp 0 reads as 1). */
typedef struct {
    int tp, tp_rank; /* the tensor-parallel slice (pt_model_new_slice) */
    /* SEQUENCE PARALLELISM (Korthikanti et al. 2022), tp > 1 and seq_len
     * % tp == 0: the LayerNorm and residual regions are split by rows, tp
     * rank r holding rows [r N/tp, (r+1) N/tp) of a micro-batch's N = B*T
     * (all-gather before each column-parallel linear, reduce-scatter after
     * each row-parallel one). The residual stream between modules is then
     * this rank's rows: a block's in and out and the head's in are
     * (N/tp, C), the embedding's out too; the head's losses stay (N). A
     * t-th of those activations per rank; the LayerNorms' weight gradients
     * are all-reduced over the group in each backward. */
    int sp;
    /* A PIPELINE STAGE's modules: n_layer + 2 flags, module i held when
     * owned[i] (NULL: every module). The tensor table, the flat buffers
     * and every slot then hold only the owned modules (pt_model_num_tensors
     * counts theirs; a module not held has an empty region); passes run
     * module by module (pt_model_forward_range). A stage that holds the
     * head but not the embedding keeps the tied wte as a COPY outside the
     * flat buffers (pt_model_tied_wte): the head reads it and accumulates
     * its gradient there; the pipeline keeps it equal to the embedding's. */
    const unsigned char *owned;
    pt_recompute recompute;
    /* 1: the caller runs every pass in slots of its own (the trainer's
     * executor): the model keeps no slot of its own (a pipeline stage never
     * does), and pt_model_forward cannot run. */
    int no_slot;
    /* train.precision = bf16: every matrix product (the linears,
     * attention's two, the LM head) on bf16 operands summed in fp32, the
     * weights' from bf16 copies of the fp32 parameters rounded once per
     * step, at each module's forward of micro-batch 0 (pt_batch.micro);
     * LayerNorm, softmax, GELU's derivative, the loss and every gradient
     * in fp32; the activations kept for backward in bf16 but the residual
     * stream and LayerNorm statistics (about half the bytes: activations.c
     * sizes them). Parameters, gradients, the flat layout and every hook
     * are fp32's: strategies see no difference. Needs targets (no logits
     * for inference: pt_model_logits is fp32's). */
    int bf16;
} pt_model_options;

/* The general constructor: pt_model_new_slice is this with tp and tp_rank
 * set. */
pt_status pt_model_new_opts(pt_model **out, const pt_model_config *cfg, int max_B,
                            const pt_model_options *o);
void pt_model_free(pt_model *m);
/* The tensor-parallel slice the model holds: rank *rank of *size (1, 0 for
 * pt_model_new's). */
void pt_model_tp(const pt_model *m, int *size, int *rank);
/* Whether the model computes in bf16 (pt_model_options.bf16). */
int pt_model_bf16(const pt_model *m);
/* Whether the model runs sequence parallelism (pt_model_options.sp). */
int pt_model_sequence_parallel(const pt_model *m);
/* The tp group's communicator (lent; its size and this rank's index must be
 * the model's tp and tp_rank). A model with tp > 1 runs its passes only
 * with one, every rank of the group running the same passes in the same
 * order; tp = 1 needs none (a group of one: no collective). */
void pt_model_set_tp_comm(pt_model *m, pt_comm *tp);

const pt_model_config *pt_model_config_of(const pt_model *m);
int pt_model_max_batch(const pt_model *m);

/* Draw GPT-2's initial weights: normal(0, 0.02), *.c_proj.weight normal(0, 0.02/sqrt(2L)),
 * LayerNorm weights 1, biases 0. Element j of tensor `name` is
 * 0.02 * pt_rng_normal_at(pt_rng_key(seed, name), j): independent of layout.
 * j is the index in the GLOBAL tensor: a slice model's elements are bitwise
 * those of the whole tensor at their places (pt_shard_run). */
void pt_model_draw_weights(pt_model *m, uint64_t seed);

/* Flat buffers (lent; NULL after pt_model_drop_flat dropped them). */
float *pt_model_params(pt_model *m);
float *pt_model_grads(pt_model *m);
size_t pt_model_num_params(const pt_model *m);
/* Zero the flat gradient buffer (nothing when dropped). */
void pt_model_zero_grads(pt_model *m);

/* Module-level redirection, for strategies that hold a module's parameters
 * or gradients elsewhere (ZeRO-3 / FSDP units gathered into a pool buffer,
 * ZeRO-2 per-unit gradient buffers): module i then reads its parameters from
 * `params` and accumulates its gradients into `grads`, each laid out like its
 * region (pt_model_module_region's count floats; lent until replaced). NULL
 * restores the module's region of the flat buffer (none when dropped). The
 * head reads (and accumulates into) wte through MODULE 0's pointers. */
void pt_model_set_module_buffers(pt_model *m, int i, float *params, float *grads);
/* Where module i's parameters and gradients are now (lent): its region of
 * the flat buffers or what pt_model_set_module_buffers gave. */
float *pt_model_module_params(pt_model *m, int i);
float *pt_model_module_grads(pt_model *m, int i);
/* Free the flat parameter and/or gradient buffer (memory a sharded strategy
 * does not need). Afterwards every module must have buffers set before it
 * runs; pt_model_draw_weights must come before dropping parameters. */
void pt_model_drop_flat(pt_model *m, int params, int grads);

/* Tensor table, in flat-buffer order. */
int pt_model_num_tensors(const pt_model *m);
const pt_param_info *pt_model_tensor(const pt_model *m, int i);
const pt_param_info *pt_model_find(const pt_model *m, const char *name); /* NULL if absent */

/* Plug points (DESIGN "How strategies plug into the model"): ONE callback
 * that the range passes (pt_model_forward_range, _backward_range,
 * _backward_weight_range, and the whole-model passes over them) call
 * before and after each module's pass -- so they fire for a pipeline
 * stage's passes as they do for the whole model's, which run the modules
 * in execution order (backward: head, blocks L..1, embedding). The
 * module passes (pt_module_*) call none: they are pure compute. A point
 * says which module, which micro-batch, in which activation context, and
 * whether this backward is the module's last of the step (b->last).
 * Module i's own gradient region is final for the step at
 * AFTER_BACKWARD with last set (the fused backward), or at AFTER_WEIGHT
 * with last set (the split one, whose B fires the BACKWARD points) --
 * except that the head also accumulates into wte (module 0's region), so
 * module 0's region is final only after module 0. A hook that returns an
 * error stops the range there, which returns it. Hooks must not run model
 * passes themselves. */
typedef struct {
    int module;
    int micro;          /* pt_batch.micro */
    int last;           /* pt_batch.last: the step's last backward of this module */
    pt_module_ctx *ctx; /* the pass's activation context (lent) */
} pt_hook_point;

typedef enum {
    PT_HOOK_BEFORE_FORWARD,
    PT_HOOK_AFTER_FORWARD,
    PT_HOOK_BEFORE_BACKWARD, /* the fused backward, or its input-gradient pass B */
    PT_HOOK_AFTER_BACKWARD,
    PT_HOOK_BEFORE_WEIGHT, /* the split backward's weight-gradient pass W */
    PT_HOOK_AFTER_WEIGHT,
} pt_hook_kind;

typedef pt_status (*pt_model_hook)(void *arg, pt_hook_kind k, const pt_hook_point *p);
/* Install the hook (arg lent, passed to every call); NULL removes it. */
void pt_model_set_hook(pt_model *m, pt_model_hook fn, void *arg);

/* ---- micro-batches in flight ----
 * A SLOT holds what one micro-batch needs between its forward and its
 * backward: an activation context per module and the residual stream
 * between modules. The model owns one (pt_model_own_slot), which
 * pt_model_forward uses; a schedule that runs several forwards before their
 * backwards (gpipe) makes one slot per micro-batch in flight.
 *
 * Backward SCRATCH (the intermediate gradients of a block: d_qkv, d_fch,
 * ...) lives only while a module's backward runs, so by default every
 * context uses the model's one. A pass that keeps them past the backward
 * (a zero-bubble schedule's deferred weight-gradient pass) gives its
 * contexts scratch of their own. */
typedef struct pt_model_slot pt_model_slot;
typedef struct pt_module_scratch pt_module_scratch;

/* A slot for batches up to the model's max_B, counted in PT_MEM_ACTS. */
pt_status pt_model_slot_new(pt_model_slot **out, pt_model *m);
void pt_model_slot_free(pt_model_slot *s);
/* The model's own slot (lent). */
pt_model_slot *pt_model_own_slot(pt_model *m);
/* Module i's context in slot s (lent). */
pt_module_ctx *pt_model_slot_ctx(pt_model_slot *s, int i);

/* Scratch for batches up to max_B (PT_MEM_ACTS); under a recompute mode it
 * also holds one block's recompute region (pt_recompute), which B fills and
 * W reads: its max_B bounds the batches of the contexts that use it. */
pt_status pt_module_scratch_new(pt_module_scratch **out, const pt_model *m, int max_B);
/* A scratch for a context whose weight-gradient pass is deferred (a
 * zero-bubble W after other passes), for contexts of the module kinds in
 * `kinds` (a mask of 1u << pt_module_kind). It holds what its B leaves for
 * its W that the context cannot: B computes in the model's scratch, and a
 * block's W gradients then take the place of the activations only B reads
 * (d_fch fch's, d_qkv qkv's, as many of d_out, d_res2, d_ln, d_ln1 as fit
 * the attention probabilities'; Qi et al. 2024: after B only the linears'
 * inputs and output gradients live). So it holds, in floats, N = max_B T:
 *   embedding, head  N C (d_out; d_ln)
 *   block            (4 - min(4, floor(NHl T / C))) N C, and the block's
 *                    recompute region (pt_recompute) under SELECTIVE, FULL
 * the largest of those of kinds, summed with the recompute region. What
 * only one pass reads while it runs (the attention backward's workspace,
 * sequence parallelism's gathered rows) stays the model's own scratch's.
 * max_B at most the model's and its contexts'. */
pt_status pt_module_scratch_new_deferred(pt_module_scratch **out, const pt_model *m, int max_B,
                                         unsigned kinds);
void pt_module_scratch_free(pt_module_scratch *s);
/* The scratch module backward in context c uses (lent until replaced);
 * NULL: the model's. */
void pt_module_ctx_set_scratch(pt_module_ctx *c, pt_module_scratch *s);

/* A slot for modules [first, last] only (of those the model holds): their
 * contexts and the stream buffers they read and write -- the range's input
 * (pt_model_slot_stream(s, first - 1), first > 0) and outputs. What a
 * pipeline chunk keeps per micro-batch in flight. pt_model_slot_new is the
 * range [0, n_layer + 1]. */
pt_status pt_model_slot_new_range(pt_model_slot **out, pt_model *m, int first, int last);
/* The same slot with its contexts and stream carved from mem, the caller's
 * (at least pt_model_slot_bytes, 64-byte aligned, lent until the slot is
 * freed and not counted by the slot): slots of different ranges may share
 * memory when they are never in use at once (a pipeline rank's chunks). */
size_t pt_model_slot_bytes(const pt_model *m, int first, int last);
/* pt_model_slot_bytes for batches of max_B, from any model of the same
 * layout (the table-only one of max_B 0 too): what the planner counts
 * without allocating the buffers. */
size_t pt_model_slot_bytes_at(const pt_model *m, int first, int last, int max_B);
/* Bytes of PT_MEM_ACTS that pt_module_scratch_new (deferred_kinds 0) or
 * pt_module_scratch_new_deferred (its kinds mask) allocates for batches of
 * max_B. */
size_t pt_module_scratch_bytes(const pt_model *m, int max_B, unsigned deferred_kinds);
/* Bytes of category c that pt_model_new_opts allocates for the model's
 * layout and batches of max_B: PARAMS and GRADS the flat buffer (and the
 * tied wte copy of a stage with the head and not the embedding), ACTS the
 * backward scratch, the gradient ping-pong and, for the whole model, its
 * own slot; 0 for the others. Any model of the layout answers, the
 * table-only one (max_B 0) included. */
size_t pt_model_buffer_bytes(const pt_model *m, int max_B, pt_mem_cat c);
pt_status pt_model_slot_new_range_in(pt_model_slot **out, pt_model *m, int first, int last,
                                     void *mem);
/* The residual stream buffer j of slot s (lent; j in [0, n_layer]: the
 * output of module j, (N,C), or (N/tp,C) under sequence parallelism): where
 * a stage receives its input and sends its output. */
float *pt_model_slot_stream(pt_model_slot *s, int j);
/* Whether the model holds module i (pt_model_options.owned). */
int pt_model_owns(const pt_model *m, int i);
/* The tied wte copy of a stage that holds the head and not the embedding
 * (lent; *n floats each, wte's slice; all NULL and 0 otherwise). Its
 * gradient is zeroed with the others' by pt_model_zero_grads; nothing else
 * (no optimizer, no strategy) sees it. */
void pt_model_tied_wte(pt_model *m, float **params, float **grads, size_t *n);

/* Passes over the contiguous modules [first, last] in slot s (a slot that
 * covers them): the forward reads its input from stream first - 1 (first >
 * 0; the caller fills it) and writes stream last (last <= n_layer), or the
 * losses and *loss (last is the head, with b->targets). The backward takes
 * the output gradient dy (NULL when last is the head) and overwrites dx
 * with module first's input gradient (NULL when first is the embedding);
 * dy and dx are the caller's, (rows, C) as the stream's; between modules
 * the gradient goes through the model's ping-pong buffers (backwards run
 * one at a time). split: the input-gradient passes only
 * (pt_module_backward_input), the weight gradients then by
 * pt_model_backward_weight_range. Plug points around each module (the
 * hook); the first error stops the range and is returned. */
pt_status pt_model_forward_range(pt_model *m, pt_model_slot *s, const pt_batch *b, int first,
                                 int last, float *loss);
pt_status pt_model_backward_range(pt_model *m, pt_model_slot *s, int first, int last,
                                  const float *dy, float *dx, int split);
pt_status pt_model_backward_weight_range(pt_model *m, pt_model_slot *s, int first, int last);
/* pt_module_recompute of modules [first, last] in slot s, after their
 * forward (no plug points). */
pt_status pt_model_recompute_range(pt_model *m, pt_model_slot *s, int first, int last);

/* GOING AWAY (the trainer's p = 1 driver is their last user): the ranges
 * of every module in slot s, forward and fused backward. */
pt_status pt_model_forward_in(pt_model *m, pt_model_slot *s, const pt_batch *b, float *loss);
pt_status pt_model_backward_in(pt_model *m, pt_model_slot *s);

/* The whole model's forward in its own slot (the range of every module).
 * With b->targets, returns the mean loss over B*T positions in *loss and
 * prepares the backward pass (dlogits, weighted by b->dloss; the backward:
 * pt_model_backward_range over the own slot); without, computes logits
 * (see pt_model_logits). B <= max_B, T <= seq_len; token ids must be in
 * [0, V) (the data loader checks). */
pt_status pt_model_forward(pt_model *m, const pt_batch *b, float *loss);
/* Logits (B,T,V) of the last forward without targets in the model's own
 * slot (lent). */
const float *pt_model_logits(const pt_model *m);

/* ---- modules ---- */
int pt_model_num_modules(const pt_model *m); /* n_layer + 2 */
pt_module_kind pt_model_module_kind(const pt_model *m, int i);
/* The module's region of the flat buffers: [offset, offset + count) floats. */
void pt_model_module_region(const pt_model *m, int i, size_t *offset, size_t *count);

/* An activation context for module i and batches up to max_B x seq_len,
 * counted in PT_MEM_ACTS: of a block, only what the model's recompute mode
 * keeps (pt_recompute gives the sizes; under SELECTIVE and FULL a block's
 * batches are also bounded by the model's max_B and its scratch's, whose
 * recompute regions hold the rest). */
pt_status pt_module_ctx_new(pt_module_ctx **out, const pt_model *m, int i, int max_B);
void pt_module_ctx_free(pt_module_ctx *c);
/* Module i's context in the model's own slot (lent). */
pt_module_ctx *pt_model_ctx(pt_model *m, int i);

/* Forward of module i. A block writes what its model's recompute mode
 * does not keep into the model's backward scratch (pt_recompute).
 *   embedding: in unused (NULL), out (B,T,C)
 *   block:     in (B,T,C), out (B,T,C)
 *   head:      in (B,T,C); out (B,T) per-position losses when b->targets,
 *              else a copy of the (B,T,V) logits; out may be NULL (the
 *              logits stay in the context: pt_model_logits for the model's)
 * `in` is lent until the matching backward returns (it is saved, not copied;
 * for the split backward, until its weight-gradient pass returns).
 * out must not alias in. */
pt_status pt_module_forward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                            const float *in, float *out);
/* Backward of module i after its forward with the same ctx and batch:
 * B then W (below) at once, in the pass's scratch. ACCUMULATES into the
 * module's parameter gradients; din (B,T,C) is OVERWRITTEN with the input
 * gradient (NULL for the embedding).
 *   embedding: dout (B,T,C)
 *   block:     dout (B,T,C)
 *   head:      dout unused (NULL): the loss weight b->dloss was applied in
 *              the fused forward. */
pt_status pt_module_backward(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                             const float *dout, float *din);

/* The same backward in two passes, for schedules that defer the weight
 * gradients (zero-bubble pipelines' B and W, Qi et al. 2023):
 *   _input  (B): din as pt_module_backward's (the same arguments), and
 *           every tensor-parallel collective of the input gradients; it
 *           leaves the output gradients of the module's linears and
 *           LayerNorms in ctx's backward scratch (a deferred one: in the
 *           block's activations that only B reads, and the scratch,
 *           pt_module_scratch_new_deferred).
 *   _weight (W): after the _input of the same ctx and batch, ACCUMULATES
 *           every parameter gradient of the module from what B left and
 *           the saved activations. Collectives: none, except under
 *           sequence parallelism the LayerNorm outputs' all-gathers and
 *           their weight gradients' all-reduce (tp_group.c says why).
 * Between the two, ctx's activations, its input, b->tokens and its scratch
 * (with the activations B recomputed there, pt_recompute) must stay as
 * they are: a context whose W comes after other modules'
 * passes needs a scratch of its own (pt_module_ctx_set_scratch). With a
 * deferred scratch, B overwrites a block's qkv, att and fch (W reads none
 * of them): a second backward of the context needs a forward first. B then W
 * gives pt_module_backward's bits (the same code; W reads what B left
 * wherever it left it). */
pt_status pt_module_backward_input(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b,
                                   const float *dout, float *din);
pt_status pt_module_backward_weight(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b);
/* What B (and pt_module_backward) of module i recomputes first under the
 * model's recompute mode, alone: nothing for NONE and for the embedding and
 * the head. After a forward of ctx and b; under tensor parallelism a FULL
 * recompute runs the forward's collectives, on every rank of the group.
 * For calibrate, which times recomputation on its own. */
pt_status pt_module_recompute(pt_model *m, int i, pt_module_ctx *ctx, const pt_batch *b);

#ifdef __cplusplus
}
#endif
#endif
