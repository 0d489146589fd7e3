/* partrain parallel: the strategies, as tables on one ordered stack that the
 * trainer's executor calls at its points (docs/architecture.md, "A step"):
 *
 *   pt_stack     the ordered array of strategy tables (pt_strategy_ops):
 *                BEFORE points in order, AFTER points in reverse; every
 *                entry returns pt_status.
 *   entries      "ddp" / "stale" (pt_dp_sync over pt_ddp's buckets), "zero"
 *                (pt_zero), "optimizer", "local_sgd" (pt_local_sgd), "tied"
 *                (the tied embedding across a pipeline), "tp_norm" and
 *                "pp_norm" (the global norm's reductions), "trace".
 *   pt_ddp       gradient synchronization in BUCKETS: slices of the flat
 *                gradient buffer, in reverse module order, each all-reduced
 *                (non-blocking) the moment the modules it covers have final
 *                gradients. Several in-flight SLOTS, each with its own
 *                buffer, give bounded-stale synchronization.
 *   pt_local_sgd parameter averaging every few steps, with an optional outer
 *                Nesterov optimizer on the averaged delta (DiLoCo).
 *   pt_zero      sharded data parallel (ZeRO 1, 2, 3 / FSDP; HSDP): optimizer
 *                state, gradients and parameters split per module over the
 *                ranks, reduce-scatter and all-gather per module.
 *   pt_trace     a recorder of timed events (Chrome trace).
 *   pt_mesh      the device mesh dp x tp x pp over the world: this rank's
 *                coordinates and the communicator of every group it belongs
 *                to, each made once by split. The strategies run on the
 *                mesh's groups, never the world.
 * and, through pipeline.h (included here), the schedules, their simulator,
 * the stage cut and the executor.
 *
 * Not here: data sharding, the loss weight's choice, metrics files (train). */
#ifndef PARTRAIN_PARALLEL_H
#define PARTRAIN_PARALLEL_H

#include "partrain/comm.h"
#include "partrain/core.h"
#include "partrain/model.h"
#include "partrain/optim.h"
#include "partrain/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pt_trace pt_trace; /* the trace recorder (below) */

/* ---- the global gradient norm (gradnorm.c) --------------------------------- */
/* The sum of squares of g, which holds elements [off, off + n) of m's flat
 * gradient layout, in two parts: [0] the elements of tensors that tensor
 * parallelism splits (pt_shard split_dim >= 0), [1] those every tp rank
 * holds whole. */
void pt_grad_sumsq_parts(const pt_model *m, const float *g, size_t off, size_t n, double parts[2]);
/* The global sum of squares from every rank's parts: both summed over
 * shard_group (the group a sharded strategy spreads the gradient over;
 * NULL: none), then the split part summed over the tp group (NULL: tp = 1),
 * then the total over the pipeline group (NULL: pp = 1; each stage holds
 * its own modules, a stage's copy of the tied wte excluded), so that every
 * parameter counts once. Collective over the three groups. */
pt_status pt_grad_sumsq_global(pt_comm *shard_group, pt_comm *tp, pt_comm *pp,
                               const double parts[2], double *sumsq);
/* Both parts summed over c in place (a sharded strategy's group; exact to
 * double rounding: carried as hi + lo floats). */
pt_status pt_grad_parts_sum(pt_comm *c, double parts[2]);

/* ---- trace recorder ---------------------------------------------------------- */

enum { PT_TRACE_MAIN = 0, PT_TRACE_COMM = 1 }; /* tids: the main and the comm thread */

/* Room for max_events events (counted in PT_MEM_SCRATCH); later ones are
 * dropped (counted). NULL-safe: every function accepts a NULL trace. */
pt_status pt_trace_new(pt_trace **out, size_t max_events);
void pt_trace_free(pt_trace *t);
/* One complete event [start_ns, end_ns) (pt_time_ns clock). name is copied
 * (truncated to 39 bytes); cat must be a string literal. */
void pt_trace_add(pt_trace *t, const char *name, const char *cat, int tid, uint64_t start_ns,
                  uint64_t end_ns, long step);
size_t pt_trace_count(const pt_trace *t);
size_t pt_trace_dropped(const pt_trace *t);
/* Write the events as Chrome trace JSON objects separated by ",\n" (no
 * enclosing brackets), pid = rank, timestamps in microseconds from t0_ns,
 * preceded by the process and thread name metadata. */
pt_status pt_trace_write_events(const pt_trace *t, FILE *f, int rank, uint64_t t0_ns);

/* ---- the strategy stack --------------------------------------------------------
 * Every strategy (data-parallel buckets, ZeRO, the stale and local-SGD
 * synchronizers, the optimizer, the tied embedding's sync, the global
 * norm's reductions, the trace) is a static const table of the points
 * below plus its own context; the trainer keeps them in ONE ordered array,
 * built once (pt_stack). At every point the executor calls the entries
 * that fill it: the BEFORE points (begin, before_*, sync, norm, update) in
 * stack order, the AFTER points (after_*, grads) in reverse, so that what
 * an entry sets up before a pass is still there when the entries after it
 * look, and is torn down after them:
 *
 *   ZeRO-3 gathers a module's parameters (before), the tied embedding's
 *   stage sends wte from them (before, after ZeRO), the trace starts its
 *   clock (before, last: a gather is not the module's compute); after the
 *   pass the trace records first, the tied send is waited for, then ZeRO
 *   releases the parameters. After a module's last backward the tied
 *   stage adds the head's half of wte's gradient before data parallelism
 *   launches the module's bucket or ZeRO its reduce-scatter.
 *
 * Every entry returns a status; the first error stops the step where it
 * happens (the entries after it are not called) and is the step's error.
 * A NULL slot is skipped. Lifecycle: pt_stack_push each entry in order ->
 * per step: begin, the passes' points, end, sync, norm (inside an
 * update), update, stats; around a checkpoint: state -> pt_stack_free
 * (frees the entries in reverse). */

/* The stack's view of a step, set before its first pass. */
typedef struct {
    long step;         /* the step about to run, 1-based */
    int eval;          /* 1: a validation pass (forwards only), not a step */
    int microbatches;  /* M */
    float dloss;       /* in/out: each position's weight in the differentiated loss,
                          1 / (global tokens): the sum over ranks is the single worker's */
    float local_dloss; /* 1 / (this rank's tokens): a synchronizer that averages
                          parameters (local SGD) takes it instead */
} pt_step_begin;

/* An optimizer update, passed through the sync and update points. */
typedef struct {
    long step;      /* the step being taken, 1-based */
    long steps;     /* train.steps (local SGD averages at the last step too) */
    float lr, clip; /* clip <= 0: no clipping (the norm is still reported) */
    float *grads;   /* the gradient to apply: the model's unless a sync entry
                       points elsewhere (stale: the round of k steps ago) */
    int skip;       /* set by a sync entry: no update this step (stale's first k) */
    /* The global sum of squares from this rank's two parts (pt_grad_sumsq_parts):
     * the stack's norm entries in order (NULL: one model replica, nothing to sum) */
    pt_status (*reduce_norm)(void *arg, double parts[2], double *sumsq);
    void *norm_arg;
    float norm;   /* out: the global gradient norm before clipping */
    double sumsq; /* out: its square as summed (an entry that updates parameters
                     of its own after the optimizer clips them alike) */
} pt_update;

/* One rank's communication figures of a step (entries add theirs). */
typedef struct {
    uint64_t comm_ns;    /* comm-thread (or blocking) time of the operations completed */
    uint64_t exposed_ns; /* time the calling thread spent blocked on them */
    uint64_t bytes;      /* bytes this rank sent for gradients and parameters */
    int buckets;         /* completed bucket all-reduces */
    /* For telling rank skew from transfer (pt_time_ns clock; 0: no wait):
     * the last wait's start and end, when this rank launched the last
     * bucket of the round it waited for, and when its comm thread
     * completed the last of them. An all-reduce cannot finish before every
     * rank has launched it, so the part of a wait before the LAST rank's
     * launch_ns is waiting for that rank (skew), not for the transfer; the
     * part after the FIRST rank's end_ns is this rank finishing locally
     * what a peer already has (its comm thread scheduled late). */
    uint64_t wait_start_ns, wait_end_ns, launch_ns, end_ns;
    uint64_t pp_bytes; /* bytes this rank sent to other stages beyond the activations */
} pt_sync_stats;

/* The groups whose communication a step's time is told apart by (the
 * metrics' parts, docs/report.md): data parallel's buckets and local SGD's
 * averaging, tensor parallel's collectives, the pipeline's neighbours and
 * the tied embedding, ZeRO's gathers and reduce-scatters. */
typedef enum { PT_GROUP_DP, PT_GROUP_TP, PT_GROUP_PP, PT_GROUP_ZERO, PT_NGROUPS } pt_group;
/* "dp", "tp", "pp", "zero" */
const char *pt_group_name(pt_group g);

/* Cumulative counters of communicators, summed by group (pt_comm_stats):
 * a step's figures are the difference of two readings. */
typedef struct {
    uint64_t blocked_ns[PT_NGROUPS]; /* calling threads blocked in their calls and waits */
    uint64_t comm_ns[PT_NGROUPS];    /* their operations, start to completion (lanes too) */
    uint64_t sent[PT_NGROUPS];       /* bytes sent (pt_comm_sent_bytes) */
} pt_comm_counts;
/* Add c's counters (NULL: nothing) to group g of k. */
void pt_comm_counts_add(pt_comm_counts *k, pt_group g, const pt_comm *c);

/* ---- checkpoint state: what an entry holds that a checkpoint carries ----
 * An entry's `state` slot lists its state as REGIONS of this rank's flat
 * layout (the model's: its tp slice of its stage's modules), each a named
 * set of tensors ("params", "optim_m", "optim_v", "stale.step_5.sum",
 * "outer.anchor", ...) that the checkpoint stores in full-tensor terms
 * (GPT-2's names and shapes) and reads back by slice (trainer_ckpt.c). A
 * region says how the dp group holds it, which decides who writes it:
 *   replica  -1: one state of the whole group (every rank that holds an
 *            element holds the same value: the model under sync, ZeRO's
 *            shards, a stale round's sum); else the dp index whose OWN
 *            state it is (local SGD's and dga's parameters and moments,
 *            dga's local gradients), stored per replica;
 *   copy, copies  the region's elements are held alike by `copies` ranks of
 *            the dp group, this rank being `copy`: it writes part `copy` of
 *            `copies` of the region (pt_comm_shard), so that replicas spread
 *            the writing; a region that is this rank's alone: 0, 1.
 * (Replicas across the tp group, tensors every tp rank holds whole, are
 * the checkpoint's to split: the entry does not see tp.)
 * The modes of a visit:
 *   SAVE     list what to write; an entry first completes what is in
 *            flight that the regions read (stale: the rounds), and reports
 *            optim_t and pipeline_start;
 *   LOAD     list what to fill (the checkpoint's step, optim_t and
 *            pipeline_start given: the entry sets them before listing, as
 *            they decide what it lists); an entry drops what it gathered
 *            (ZeRO-3's units) first;
 *   RESTART  the checkpoint holds no per-replica state this run can
 *            continue from (another dp, another mode): after the main files
 *            are loaded, an entry starts its own state fresh from them
 *            (stale's pipeline from this step, local SGD's outer anchor
 *            from the parameters, momentum 0); lists nothing. */
typedef enum { PT_STATE_SAVE, PT_STATE_LOAD, PT_STATE_RESTART } pt_state_mode;
typedef struct {
    const char *name; /* the tensor set (copied by the visitor) */
    int replica;      /* -1: the group's one state; else the dp index whose own state */
    size_t off, n;    /* elements [off, off + n) of the flat layout */
    float *data;      /* their n floats (lent) */
    int copy, copies; /* this rank writes part copy of copies */
} pt_state_region;
typedef struct pt_state_visit {
    pt_state_mode mode;
    long step;          /* steps taken: the checkpoint's step */
    int optim_t;        /* SAVE: out (the optimizer's update count; step by default);
                           LOAD: in */
    int pipeline_start; /* stale: the step its pipeline (re)started at; SAVE: out, LOAD: in */
    /* called once per region, in a fixed order (the same on every rank of a
     * dp group); an error stops the visit */
    pt_status (*region)(struct pt_state_visit *v, const pt_state_region *r);
    void *arg; /* the visitor's */
} pt_state_visit;

/* The points. p: the module pass (model.h's pt_hook_point). */
typedef struct pt_strategy_ops {
    const char *name; /* "ddp", "zero", "tied", ... (tests find entries by it) */
    pt_status (*begin)(void *self, pt_step_begin *b);
    pt_status (*before_forward)(void *self, const pt_hook_point *p);
    pt_status (*after_forward)(void *self, const pt_hook_point *p);
    /* around a backward's input-gradient pass (B, or the whole backward BW) */
    pt_status (*before_backward)(void *self, const pt_hook_point *p);
    pt_status (*after_backward)(void *self, const pt_hook_point *p);
    /* around a split backward's weight-gradient pass (W) */
    pt_status (*before_weight)(void *self, const pt_hook_point *p);
    pt_status (*after_weight)(void *self, const pt_hook_point *p);
    /* module p->module's gradient of this micro-batch is complete (after its
     * BW or W); p->last: final for the step */
    pt_status (*grads)(void *self, const pt_hook_point *p);
    /* after the passes of a step or a validation (an AFTER point): what
     * they left in flight is complete, what they lent is returned */
    pt_status (*end)(void *self, const pt_step_begin *b);
    /* after the passes: make u->grads the synchronized gradient (wait) */
    pt_status (*sync)(void *self, pt_update *u);
    /* sum the parts of a sum of squares over the entry's group */
    pt_status (*norm)(void *self, double parts[2]);
    /* the optimizer's step, parameter averaging, ... */
    pt_status (*update)(void *self, pt_update *u);
    void (*stats)(void *self, pt_sync_stats *s); /* add the step's figures, reset */
    /* add the cumulative counters of the communicators the entry made for
     * itself (NULL: it runs on the trainer's groups only) */
    void (*counts)(void *self, pt_comm_counts *k);
    /* the entry's checkpoint state (above); NULL: it holds none */
    pt_status (*state)(void *self, pt_state_visit *v);
    void (*free)(void *self);
} pt_strategy_ops;

typedef struct {
    const pt_strategy_ops *ops; /* NULL: no entry (a constructor that does not apply) */
    void *self;                 /* owned: ops->free */
} pt_strategy;

#define PT_STACK_MAX 12
typedef struct {
    pt_strategy at[PT_STACK_MAX];
    int n;
} pt_stack;

typedef enum {
    PT_POINT_BEFORE_FORWARD,
    PT_POINT_AFTER_FORWARD,
    PT_POINT_BEFORE_BACKWARD,
    PT_POINT_AFTER_BACKWARD,
    PT_POINT_BEFORE_WEIGHT,
    PT_POINT_AFTER_WEIGHT,
    PT_POINT_GRADS,
} pt_point;

/* Append e (ignored when e.ops is NULL); the stack owns it from here, also
 * on failure (a full stack frees e). */
pt_status pt_stack_push(pt_stack *s, pt_strategy e);
/* Free every entry, last first; the stack is empty after. */
void pt_stack_free(pt_stack *s);
/* The entry named name, or NULL (tests wrap entries by name). */
pt_strategy *pt_stack_find(pt_stack *s, const char *name);
/* The points, in the order rule above. */
pt_status pt_stack_begin(pt_stack *s, pt_step_begin *b);
pt_status pt_stack_point(pt_stack *s, pt_point k, const pt_hook_point *p);
/* The end point, every entry's even after an error (a failed step's
 * requests must complete before their buffers go): the first error. */
pt_status pt_stack_end(pt_stack *s, const pt_step_begin *b);
/* sync then update (each in stack order); u->reduce_norm is the stack's
 * norm entries when any has one. */
pt_status pt_stack_update(pt_stack *s, pt_update *u);
void pt_stack_stats(pt_stack *s, pt_sync_stats *out);
/* Every entry's counts, added to k. */
void pt_stack_counts(pt_stack *s, pt_comm_counts *k);
/* Every entry's state slot in stack order (a checkpoint's save, load or
 * restart); the first error stops it. */
pt_status pt_stack_state(pt_stack *s, pt_state_visit *v);
/* An entry constructor's start: *out cleared (an entry that holds nothing
 * at this layout leaves it so) and `size` zeroed bytes for the entry; NULL
 * with the error set, naming `what`, when out of memory. */
void *pt_strategy_entry_new(pt_strategy *out, size_t size, const char *what);

/* The entries that are not a synchronizer's own (strategies.c):
 *   optimizer  AdamW or SGD over the whole flat buffer (one worker, sync
 *              data parallel, stale, local SGD): the update point clips by
 *              the global norm and steps on u->grads. opt lent. Its state
 *              (the parameters, its moments) is held as `share` says: alike
 *              on every dp rank (sync, stale delayed: {-1, dp index, dp})
 *              or each rank's own (local SGD, dga: {dp index, 0, 1}).
 *   tp norm    the split tensors' part of the norm summed over the tp group
 *   pp norm    the whole sum summed over the pipeline's stages
 * Each returns an empty entry (ops NULL) where its group is NULL. */
typedef struct {
    int replica, copy, copies; /* as in pt_state_region */
} pt_state_share;
pt_status pt_optimizer_strategy(pt_strategy *out, pt_adamw *opt, pt_model *m, pt_trace *trace,
                                pt_state_share share);
pt_status pt_tp_norm_strategy(pt_strategy *out, pt_comm *tp);
pt_status pt_pp_norm_strategy(pt_strategy *out, pt_comm *pp);
/* The tied embedding's sync across a pipeline, "tied" (tied.c): the head's
 * stage keeps a copy of wte. Collective over pp (lent; NULL: no entry):
 * emb_stage and head_stage are the pp ranks holding modules 0 and L+1; an
 * empty entry where they coincide or this rank is neither. With opt (the
 * stage's optimizer over its whole flat buffer, lent; hp its rule) the two
 * stages split wte's update by rows (tied_split.c: each updates half,
 * exchanging the gradient's and the parameters' halves); with opt NULL
 * (data parallelism, ZeRO) the embedding's stage updates all of it: the
 * copy is refreshed from it before each step's (and validation's) first
 * forward, and the head's gradient goes back after its last backward, to
 * be added before module 0's gradient is final. */
pt_status pt_tied_strategy(pt_strategy *out, pt_model *m, pt_comm *pp, int emb_stage,
                           int head_stage, pt_adamw *opt, const pt_adamw_hparams *hp);
/* Rows of wte's (local) rows the first stage updates under the split: the
 * first half, rounded up; the last stage updates the rest. */
size_t pt_tied_split_rows(int rows);
/* tied_split.c's entry over c (given up: the entry owns it, also on failure). */
pt_status pt_tied_split_new(pt_strategy *out, pt_model *m, pt_comm *c, int emb_here, int peer,
                            pt_adamw *opt, const pt_adamw_hparams *hp);
/* The stack entry "trace" (empty for a NULL t): one event per module
 * pass, "fwd h.3 mb1", "bwd head" (B under split), "W h.0"; pushed last so
 * that its clock starts after the other entries' before points. */
pt_status pt_trace_strategy(pt_strategy *out, pt_trace *t, const pt_model *m, int microbatches,
                            int split);
/* The clip-and-step helper the optimizer entries share: the global norm of
 * grads (n floats of the flat layout starting at off) through u->reduce_norm,
 * clipped by u->clip, then opt's step on params. */
pt_status pt_update_apply(pt_update *u, pt_adamw *opt, const pt_model *m, float *params,
                          const float *grads, size_t off, size_t n);

/* ---- bucketed gradient synchronization ------------------------------------------- */
typedef struct pt_ddp pt_ddp;

typedef struct {
    size_t bucket_bytes; /* target bucket size (a bucket may split a module); >= 4 */
    int nslots;          /* in-flight rounds (1: synchronous; k+1: staleness k) */
    int in_place;        /* 1: slot 0 IS the model's gradient buffer (nslots must be 1);
                            0: each slot owns a copy (PT_MEM_COMM), filled bucket by bucket */
    /* comm.grad_dtype = bf16: each bucket's sum travels in bf16, half the
     * bytes (ddp.c says how); blocking, at the bucket's launch */
    int bf16;
} pt_ddp_options;

/* Buckets for model m over communicator c (both lent, must outlive d). */
pt_status pt_ddp_new(pt_ddp **out, pt_model *m, pt_comm *c, const pt_ddp_options *opt);
void pt_ddp_free(pt_ddp *d);

int pt_ddp_num_buckets(const pt_ddp *d);
/* Bucket i covers [*offset, *offset + *count) of the flat buffers and is
 * complete after module *ready_module's backward. Bucket 0 is the highest. */
void pt_ddp_bucket(const pt_ddp *d, int i, size_t *offset, size_t *count, int *ready_module);
/* The gradient buffer of slot s (the model's for an in-place slot). */
float *pt_ddp_slot_grads(pt_ddp *d, int s);

/* Start a round in slot s (which must be idle): with launch = 1 the
 * following pt_ddp_module_done calls launch buckets as they complete; with 0
 * nothing is launched before pt_ddp_wait / pt_ddp_launch_all. step labels
 * trace events. */
void pt_ddp_begin(pt_ddp *d, int s, int launch, long step);
/* Module i's gradient is final in the active round: launches (copying into
 * the slot first when not in place) every bucket it completes. */
pt_status pt_ddp_module_done(pt_ddp *d, int module);
/* Launch every bucket of the active round not yet launched (its gradients
 * must be final), and end the round: slot s keeps running. */
pt_status pt_ddp_launch_all(pt_ddp *d);
/* Wait for every bucket of slot s (launching what is left first when s is
 * the active round). The slot's buffer then holds the SUM over ranks, and
 * the slot is idle: waiting for it again returns at once with the buffer
 * untouched (a checkpoint completes stale rounds early this way, and a
 * resume refills idle slots' buffers from the checkpoint). */
pt_status pt_ddp_wait(pt_ddp *d, int s);
/* 1 when slot s has a round launched and not yet waited for. */
int pt_ddp_slot_busy(const pt_ddp *d, int s);
/* Record waits and all-reduces in t (lent; NULL: none). */
void pt_ddp_set_trace(pt_ddp *d, pt_trace *t);
/* Copy and reset the statistics. */
void pt_ddp_take_stats(pt_ddp *d, pt_sync_stats *out);

/* The data-parallel synchronizers as stack entries (ddp_sync.c), over the
 * dp group (lent):
 *   staleness 0  "ddp": one round in place, armed before the step's last
 *                micro-batch's first backward, each bucket launched as its
 *                modules' gradients become final (overlap; else all at the
 *                sync point), waited for at the sync point. The optimizer
 *                entry (or ZeRO-1's) applies the sum.
 *   staleness k  "stale": step s's round in its own slot, applied at step
 *                s + k (the first k steps apply nothing), or with dga the
 *                correction of delayed gradient averaging (the local
 *                gradient corrected by the average of k steps ago).
 * *handle (may be NULL) is lent (the buckets, for the trainer's log). Its
 * checkpoint state (the state slot): the rounds in flight, each one's
 * all-reduced sum (alike on every rank) and dga's local gradient of it
 * (each rank's own), and the step its pipeline started at. */
typedef struct pt_dp_sync pt_dp_sync;
typedef struct {
    size_t bucket_bytes;
    int overlap;      /* launch buckets during backward */
    int microbatches; /* M: the round opens at micro-batch M-1's first backward */
    int staleness;    /* 0: sync */
    int dga;          /* staleness > 0: delayed gradient averaging */
    int grad_bf16;    /* comm.grad_dtype = bf16 (pt_ddp_options.bf16) */
} pt_dp_sync_options;
pt_status pt_dp_sync_strategy(pt_strategy *out, pt_dp_sync **handle, pt_model *m, pt_comm *dp,
                              const pt_dp_sync_options *o, pt_trace *trace);
pt_ddp *pt_dp_sync_ddp(pt_dp_sync *s);

/* ---- sharded data parallel (ZeRO stages 1, 2, 3 / FSDP; HSDP) ------------------------
 * Sharding unit: each MODULE's region of the flat buffers is split over the
 * shard group per pt_comm_shard (uneven sizes: the first count % g ranks
 * hold one element more), so that a rank's shard of a module is a slice and
 * the in-place sharded collectives of comm.h apply to the module's region
 * (or to a unit buffer laid out like it). A rank keeps AdamW moments only for
 * its slices (one pt_adamw per module, segments cut at tensor boundaries, so
 * each tensor keeps its weight-decay flag where the shard boundary cuts it).
 *
 *   stage 1: gradients all-reduced (the trainer's pt_ddp buckets), then
 *            pt_zero_step: global norm from partial squares (all-reduce),
 *            AdamW on the rank's slices, all-gather of every module.
 *   stage 2: the model's flat gradient buffer is dropped: each module
 *            accumulates into a unit buffer, reduce-scattered (non-blocking)
 *            after its backward (pt_zero_module_done) into the rank's
 *            gradient slices; pt_zero_step then as stage 1.
 *   stage 3: the flat parameters are dropped too: a module's parameters
 *            are all-gathered into a unit buffer before its forward and
 *            backward (the next module's all-gather prefetched), released
 *            after (options.keep_params: kept from forward to backward); the
 *            step updates the parameter slices, nothing is all-gathered.
 *            A module marked whole (options.whole) keeps its full
 *            parameters resident instead and is run as in stage 2: its
 *            gradient reduce-scattered, its slice updated in place, the
 *            whole all-gathered after the step.
 * Hybrid (HSDP): with group < world the shard group is `group` consecutive
 * ranks; stages 2 and 3 reduce-scatter gradients inside it, then all-reduce
 * the slices across groups (ranks with the same index in their group);
 * stage 1's gradients are all-reduced over the whole world by the trainer's
 * buckets already, so its step only shards the optimizer inside the group.
 *
 * Lifecycle: pt_zero_new (after pt_model_draw_weights: it takes the slices) -> the
 * model's hooks call pt_zero_before_forward / _after_forward /
 * _before_backward / _module_done for every module, every micro-batch ->
 * pt_zero_step -> pt_zero_free. A forward without backward (validation)
 * under keep_params is followed by pt_zero_release_params. Every rank must
 * run the same passes (the hooks issue collectives). */
typedef struct pt_zero pt_zero;

typedef struct {
    int stage;       /* 1, 2 or 3 */
    int group;       /* shard group size; 0 or the world size: shard over all ranks */
    int overlap;     /* stage >= 2: reduce-scatter during backward (0: wait for each at once) */
    int keep_params; /* stage 3: keep gathered parameters from forward to backward */
    int per_step;    /* stage >= 2: reduce-scatter each unit's gradient ONCE per step, after
                        its last micro-batch (pipelines, split backwards), its buffer held
                        through the step; 0: after every micro-batch's backward */
    const unsigned char *whole; /* stage 3, per module (lent, read by pt_zero_new; NULL:
                                   none): 1 keeps its parameters whole on every rank, as
                                   stage 2 does (parallel.zero_whole) */
} pt_zero_options;

/* Over model m and communicator world (both lent, must outlive z): the
 * mesh's dp group in the trainer (pt_mesh), so that HSDP's shard and
 * replicate groups are split inside it. Splits the group (and cross-group)
 * communicators, collective over world; drops
 * the model's flat buffers as the stage allows. */
pt_status pt_zero_new(pt_zero **out, pt_model *m, pt_comm *world, const pt_zero_options *opt,
                      const pt_adamw_hparams *hp);
void pt_zero_free(pt_zero *z);
/* The points (the stack entry calls them; pt_zero_strategy), module i. */
pt_status pt_zero_before_forward(pt_zero *z, int module);
pt_status pt_zero_after_forward(pt_zero *z, int module);
pt_status pt_zero_before_backward(pt_zero *z, int module);
/* After module i's backward of a micro-batch (its W under a split backward);
 * last: the step's last one of the module. */
pt_status pt_zero_module_done(pt_zero *z, int module, int last);
/* Stage 3: return every gathered unit to the pool. */
pt_status pt_zero_release_params(pt_zero *z);
/* Wait for the gradients, clip to u->clip by the global norm (the ranks'
 * partial squares summed over the group, then u->reduce_norm), the
 * optimizer on this rank's slices with u->lr, all-gather the parameters
 * (stages 1, 2). u->norm gets the global norm before clipping. */
pt_status pt_zero_step(pt_zero *z, pt_update *u);
/* Bytes this rank sent on the zero communicators since the last call. */
uint64_t pt_zero_take_bytes(pt_zero *z);
/* Time the hooks spent blocked on all-gathers / reduce-scatters since the
 * last call (exposed communication of stages 2 and 3). */
uint64_t pt_zero_take_wait_ns(pt_zero *z);
/* Add the zero communicators' counters to k's PT_GROUP_ZERO. */
void pt_zero_counts(const pt_zero *z, pt_comm_counts *k);
/* Collective over the group: a full-length buffer (n floats, the
 * caller's) receives the full parameters on every rank. */
pt_status pt_zero_gather_params(pt_zero *z, float *full);
/* The checkpoint state (the entry's state slot, pt_state_visit): per
 * module, this rank's parameters (the whole module's where it holds them
 * whole: stages 1, 2 and modules kept whole, written a part per dp rank;
 * else its shard) and its shards of the moments, HSDP's groups splitting
 * the writing of their copies. */
pt_status pt_zero_state(pt_zero *z, pt_state_visit *v);
/* ZeRO as a stack entry "zero" over the dp group (zero_strategy.c): its
 * points gather, release and reduce-scatter; its update is the sharded
 * optimizer step (in place of the optimizer entry); its state slot is
 * pt_zero_state's. *handle (may be NULL) is lent (the test seam's gather
 * of the parameters). */
pt_status pt_zero_strategy(pt_strategy *out, pt_zero **handle, pt_model *m, pt_comm *dp,
                           const pt_zero_options *o, const pt_adamw_hparams *hp, pt_trace *trace);
/* Bytes of AdamW state this rank holds. */
size_t pt_zero_optim_bytes(const pt_zero *z);
/* Record the hooks' all-gathers / reduce-scatters (comm track) and waits
 * (main track) in t (lent; NULL: none), labelled with the step last noted. */
void pt_zero_set_trace(pt_zero *z, pt_trace *t);
void pt_zero_note_step(pt_zero *z, long step);

/* ---- device mesh -------------------------------------------------------------------
 * The world's ranks as a 3-D grid dp x tp x pp (Megatron's order): rank r
 * has coordinates (pp_i, dp_i, tp_i) with tp varying fastest, then dp, then
 * pp,
 *     r = (pp_i * dp + dp_i) * tp + tp_i,
 * so that a tensor-parallel group is tp consecutive ranks (one host). Groups
 * of this rank, each ordered by the coordinate that varies inside it:
 *   PT_MESH_TP  same (pp_i, dp_i): tp ranks, index tp_i
 *   PT_MESH_DP  same (pp_i, tp_i): dp ranks, index dp_i (data parallel, ZeRO
 *               and HSDP's shard / replicate groups live inside it)
 *   PT_MESH_PP  same (dp_i, tp_i): pp ranks, index pp_i (pipeline stages)
 *   PT_MESH_MP  same dp_i: tp x pp ranks, index pp_i * tp + tp_i (the model
 *               replica: what a global norm or a checkpoint gather spans)
 * A group of one rank has NO communicator (pt_mesh_comm returns NULL, its
 * index is 0): a size-1 group needs no communication, and NULL is the
 * trainer's convention for "one worker" already; callers test for it rather
 * than pay a split, an arena region and (per-group progress) a thread for
 * nothing. Every group of more than one rank is a communicator of its own,
 * made once by pt_comm_split in pt_mesh_new, even when it spans the whole
 * world: the world itself stays for job-level things (agreement on errors,
 * rank-0 logging, the heartbeat), and its counters do not mix with a group's.
 *
 * Lifecycle: pt_mesh_new (collective over world) -> pt_mesh_comm per group
 * -> pt_mesh_free (before the world). */
typedef struct pt_mesh pt_mesh;

typedef enum { PT_MESH_TP = 0, PT_MESH_DP, PT_MESH_PP, PT_MESH_MP, PT_MESH_NGROUPS } pt_mesh_group;

/* world rank <-> coordinates of a dp x tp x pp mesh (pure functions). */
int pt_mesh_rank_at(int dp, int tp, int pp, int pp_i, int dp_i, int tp_i);
void pt_mesh_coords_of(int rank, int dp, int tp, int pp, int *pp_i, int *dp_i, int *tp_i);

/* The mesh over world (lent, must outlive the mesh; NULL: a world of one).
 * dp, tp, pp >= 1 and dp x tp x pp must equal the world's size (else
 * PT_ERR_INVALID naming the three values and the world size). Collective
 * over world: every rank calls it with the same dp, tp, pp. */
pt_status pt_mesh_new(pt_mesh **out, pt_comm *world, int dp, int tp, int pp);
/* Frees the group communicators. NULL is a no-op. */
void pt_mesh_free(pt_mesh *m);
/* The group's communicator (owned by the mesh), NULL for a group of one. */
pt_comm *pt_mesh_comm(const pt_mesh *m, pt_mesh_group g);
/* Ranks in the group, and this rank's index in it (its rank in pt_mesh_comm). */
int pt_mesh_size(const pt_mesh *m, pt_mesh_group g);
int pt_mesh_index(const pt_mesh *m, pt_mesh_group g);
/* This rank's world rank and world size. */
int pt_mesh_world_rank(const pt_mesh *m);
int pt_mesh_world_size(const pt_mesh *m);

/* ---- local SGD with an outer optimizer ---------------------------------------- */
typedef struct pt_local_sgd pt_local_sgd;

/* Over n parameters starting from params (copied as the anchor). nesterov = 0:
 * plain averaging (outer_lr and momentum unused); 1: DiLoCo's outer step
 * anchor -= outer_lr * (delta + momentum * u), u = momentum * u + delta,
 * delta = anchor - average. Buffers in PT_MEM_OPTIM. */
pt_status pt_local_sgd_new(pt_local_sgd **out, const float *params, size_t n, int nesterov,
                           float outer_lr, float momentum);
void pt_local_sgd_free(pt_local_sgd *l);
/* Collective: average params over c (all-reduce), apply the outer step and
 * write the new parameters to params on every rank. */
pt_status pt_local_sgd_sync(pt_local_sgd *l, pt_comm *c, float *params);
/* Local SGD as a stack entry "local_sgd" over the dp group, after the
 * optimizer entry: each rank weighs its loss by its own tokens and steps on
 * its own; every sync_every steps (and at the last) the parameters are
 * averaged. Its checkpoint state (the state slot): the outer anchor and
 * momentum (nesterov), alike on every rank. *handle (may be NULL) is
 * lent. */
typedef struct {
    int sync_every;
    int nesterov;
    float outer_lr, outer_momentum;
} pt_local_sgd_options;
pt_status pt_local_sgd_strategy(pt_strategy *out, pt_local_sgd **handle, pt_model *m, pt_comm *dp,
                                const pt_local_sgd_options *o, pt_trace *trace);

#ifdef __cplusplus
}
#endif
#endif
