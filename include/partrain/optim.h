/* partrain optimizer: AdamW or SGD over flat (possibly sharded) float buffers, the
 * learning-rate schedule (linear warm-up, then cosine decay to a floor) and
 * global-norm gradient clipping.
 *
 * Sharding-ready by construction: the optimizer state covers a window
 * [base, base + n) of the model's flat parameter buffer, described by
 * segments (each with its own weight-decay flag); a ZeRO rank creates one
 * over its shard. Clipping is split in two so that ranks can sum their
 * partial squared norms (an all-reduce) before the scale is computed:
 *   local = pt_optim_grad_sumsq(g, n);  total = sum over shards;
 *   scale = pt_optim_clip_scale(total, max_norm);
 *   pt_adamw_step(opt, params, grads, lr, scale);
 *
 * Lifecycle: pt_adamw_new -> pt_adamw_step per optimizer step ->
 * pt_adamw_free. State m and v are counted in PT_MEM_OPTIM. The object is
 * named for AdamW (its first and default rule); with hp.kind = PT_OPTIM_SGD
 * the same object runs SGD: m is then the momentum buffer (NULL without
 * momentum) and v is NULL, so code that saves "m and v" saves exactly the
 * state the rule has. Not here: which parameters a rank owns,
 * communication. */
#ifndef PARTRAIN_OPTIM_H
#define PARTRAIN_OPTIM_H

#include "partrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The update rule (train.optimizer). */
typedef enum {
    PT_OPTIM_ADAMW = 0, /* AdamW, decoupled weight decay; state m, v */
    PT_OPTIM_SGD = 1    /* SGD, L2 weight decay added to the gradient (PyTorch's SGD);
                           state: the momentum buffer when momentum > 0, else none */
} pt_optim_kind;

/* beta1, beta2, eps: AdamW only; momentum: SGD only (in [0, 1)). A zeroed
 * tail (kind, momentum) is AdamW, so older initializers keep their meaning. */
typedef struct {
    float beta1, beta2, eps, weight_decay;
    pt_optim_kind kind;
    float momentum;
} pt_adamw_hparams;

/* Flat buffers of state per parameter: 2 (AdamW: m, v), 1 (SGD with
 * momentum: its buffer, in the m slot), 0 (SGD without momentum). */
int pt_optim_state_count(const pt_adamw_hparams *hp);

/* A run of parameters [offset, offset + n) of the optimizer's window
 * (offsets relative to the window's start), decayed or not. */
typedef struct {
    size_t offset, n;
    int decay;
} pt_optim_segment;

typedef struct pt_adamw pt_adamw;

/* State for n floats; segments (copied) must tile [0, n) in order. */
pt_status pt_adamw_new(pt_adamw **out, size_t n, const pt_optim_segment *segs, int nsegs,
                       const pt_adamw_hparams *hp);
void pt_adamw_free(pt_adamw *o);

/* One update of params/grads (n floats each, the optimizer's window) with
 * learning rate lr; grads are multiplied by grad_scale first (clipping).
 * Increments the step count t (bias correction uses t after increment). */
void pt_adamw_step(pt_adamw *o, float *params, const float *grads, float lr, float grad_scale);
/* pt_adamw_step with grad_scale 1 that also returns the sum of squares of
 * grads (the window), summed segment by segment in the same pass: for when
 * the norm is only reported (no clipping). Equal to pt_optim_grad_sumsq up to
 * rounding (the order of the sum differs). */
double pt_adamw_step_sumsq(pt_adamw *o, float *params, const float *grads, float lr);
/* Leave [off, off + n) of the window alone from now on: the steps neither
 * update its parameters nor touch its state (another rank updates them: a
 * pipeline's tied wte, split between two stages). n = 0: none. The skipped
 * state stays allocated, so that checkpoints keep the window's layout. */
void pt_adamw_set_skip(pt_adamw *o, size_t off, size_t n);
/* The skipped range (*n = 0: none). */
void pt_adamw_skip(const pt_adamw *o, size_t *off, size_t *n);

/* State, lent: first and second moments (n floats each; SGD: the momentum
 * buffer or NULL, and NULL) and the number of steps taken (checkpoints save
 * and restore these). */
float *pt_adamw_m(pt_adamw *o);
float *pt_adamw_v(pt_adamw *o);
size_t pt_adamw_size(const pt_adamw *o);
pt_optim_kind pt_adamw_kind(const pt_adamw *o);
int pt_adamw_t(const pt_adamw *o);
void pt_adamw_set_t(pt_adamw *o, int t);

/* Learning rate for 0-based step `step` of `total`: linear warm-up from
 * lr/warmup to lr over `warmup` steps, then cosine from lr to min_lr at the
 * last step. */
float pt_lr_schedule(int step, int total, int warmup, float lr, float min_lr);

/* Sum of squares of a gradient (shard), in double: the partial norm. */
double pt_optim_grad_sumsq(const float *g, size_t n);
/* Factor that scales gradients to global norm max_norm when their total
 * squared norm exceeds max_norm^2; 1 when max_norm <= 0 (no clipping) or
 * the norm is within bounds. */
float pt_optim_clip_scale(double total_sumsq, float max_norm);

#ifdef __cplusplus
}
#endif
#endif
