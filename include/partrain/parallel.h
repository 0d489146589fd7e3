/* partrain parallel: the data-parallel strategies that sit between the model,
 * the optimizer and the communicator, and that the trainer drives at the
 * model's plug points (model.h, pt_model_hooks):
 *
 *   pt_ddp       gradient synchronization in BUCKETS: slices of the flat
 *                gradient buffer, in reverse module order, each all-reduced
 *                (non-blocking) the moment the modules it covers have
 *                finished backward. Several in-flight SLOTS, each with its own
 *                buffer, give bounded-stale synchronization (step t's
 *                all-reduce runs while step t+1 computes).
 *   pt_local_sgd parameter averaging every few steps, with an optional outer
 *                Nesterov optimizer on the averaged delta (DiLoCo).
 *   pt_zero      sharded data parallel (ZeRO 1, 2, 3 / FSDP; HSDP): optimizer
 *                state, gradients and parameters split per module over the
 *                ranks, reduce-scatter and all-gather per module.
 *   pt_trace     a recorder of timed events (Chrome trace), filled by the
 *                trainer's hooks and by pt_ddp's and pt_zero's waits.
 *   pt_mesh      the device mesh dp x tp x pp over the world: this rank's
 *                coordinates and the communicator of every group it belongs
 *                to (tp, dp, pp, model-parallel), each made once by split.
 *                The strategies above run on the dp group, never the world.
 *
 * Lifecycle of a synchronous data-parallel step (one slot, in place):
 *   pt_ddp_new(&d, model, comm, {bucket_bytes, 1 slot, in_place = 1})
 *   per step: zero grads; micro-batches 1..M-1 forward/backward (no launch);
 *             pt_ddp_begin(d, 0, overlap); last micro-batch forward/backward
 *             (the hook calls pt_ddp_module_done(d, i) after module i);
 *             pt_ddp_wait(d, 0)  (launches what is left, waits for all)
 *             clip + optimizer step on pt_ddp_slot_grads(d, 0).
 * ZeRO stage 1 uses these buckets for its all-reduce; stages 2 and 3 shard
 * per module instead (a module is an FSDP unit), see pt_zero below.
 *
 * Not here: data sharding, loss reduction, metrics files (train). */
#ifndef PARTRAIN_PARALLEL_H
#define PARTRAIN_PARALLEL_H

#include "partrain/comm.h"
#include "partrain/core.h"
#include "partrain/model.h"
#include "partrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pt_trace pt_trace; /* the trace recorder (below) */

/* ---- schedules: the passes of one rank's step ------------------------------- */
/* A step's forward and backward passes over its micro-batches, in the order
 * one rank runs them (schedule.c, pipeline/); the trainer's step is a driver
 * over the list. With the whole model on one rank (pt_schedule_build):
 *   none   F0 B0 F1 B1 ... : one micro-batch of activations in flight;
 *   gpipe  F0 F1 ... B0 B1 ... : every micro-batch's activations held.
 * Both give the same gradient (the sum over micro-batches).
 *
 * Pipeline schedules (pt_schedule_build_stage) give rank r of p its own list
 * over its v chunks (virtual stages). The model's G = p*v virtual stages
 * g = 0..G-1 (0 holds the embedding, G-1 the head) map to (rank, chunk):
 *   gpipe, 1f1b, zb1  v = 1, g = r;
 *   interleaved       chunk c of rank r is g = c*p + r (Megatron's);
 *   zbv               v = 2, chunk 0 is g = r, chunk 1 is g = 2p-1-r (a V).
 * gpipe, 1f1b and interleaved run BACKWARD passes (input and weight
 * gradients together); zb1 and zbv split each into BACKWARD_INPUT (B, on the
 * critical path) and BACKWARD_WEIGHT (W, moved to fill the bubble).
 * Dependencies: F(mb, g) after F(mb, g-1); the backward (BW or B) of
 * (mb, g) after F(mb, g) and the backward of (mb, g+1); W(mb, g) after
 * B(mb, g). A chunk's activations of a micro-batch are held from its F until
 * its last backward pass (BW, or W). Every list holds each pass its rank owns
 * exactly once, and a chunk's backwards run in increasing micro-batch order.
 * Lifecycle: build, read pass[], pt_schedule_free. */
#define PT_SCHEDULE_MAX_MICRO   1024
#define PT_SCHEDULE_MAX_VIRTUAL 8
typedef enum {
    PT_PASS_FORWARD,
    PT_PASS_BACKWARD,        /* input and weight gradients together (BW) */
    PT_PASS_BACKWARD_INPUT,  /* B: the input gradient, sent upstream */
    PT_PASS_BACKWARD_WEIGHT, /* W: the weight gradients, after B */
} pt_pass_kind;
typedef struct {
    pt_pass_kind kind;
    int micro;
    int chunk; /* 0..virtual_stages-1 (0 when positional {kind, micro}) */
} pt_pass;
typedef struct {
    char name[16];
    int microbatches;   /* m */
    int stages;         /* p */
    int stage;          /* r, this rank */
    int virtual_stages; /* v, chunks per rank */
    int split;          /* 1: backwards are B + W passes */
    int npass;
    pt_pass *pass; /* owned: pt_schedule_free */
    int in_flight; /* max over time of (mb, chunk) activations held, all chunks */
    int chunk_in_flight[PT_SCHEDULE_MAX_VIRTUAL]; /* the same per chunk */
    /* index in pass[] of chunk c's last backward pass of the step: its
     * gradients are final after it (the BW, or the W when split) */
    int last_pass[PT_SCHEDULE_MAX_VIRTUAL];
} pt_schedule;

/* Bytes of PT_MEM_SCRATCH a built schedule holds (its pass list). */
size_t pt_schedule_bytes(const pt_schedule *s);
/* The most weight-gradient passes the list has pending at once (their B
 * run, not they; at least 1): the deferred scratch sets a split schedule
 * needs. */
int pt_schedule_pending_w(const pt_schedule *s);
/* A pipeline rank's activation blocks, which the trainer carves once
 * (trainer_pipe.c) and the planner's memory model counts: chunk c of the
 * v holds a micro-batch in fl[c] floats. in_flight blocks shared by the
 * chunks, each the largest chunk's size; or, with several chunks where
 * that is less, each chunk's own: as many as its list holds at once
 * (chunk_in_flight[c]), each its own size. Returns the floats in all;
 * *per_chunk (1: the chunks' own) and *nblocks may be NULL. */
size_t pt_schedule_blocks(int v, int in_flight, const int *chunk_in_flight, const size_t *fl,
                          int *per_chunk, int *nblocks);
/* The schedule `name` (parallel.schedule) over `microbatches` micro-batches
 * with the whole model on this rank: none or gpipe (p = 1, v = 1); one line
 * naming an unknown or unsupported schedule. */
pt_status pt_schedule_build(pt_schedule *s, const char *name, int microbatches);
/* Rank `stage` of `stages`' list of the pipeline schedule `name` (gpipe,
 * 1f1b, interleaved, zb1, zbv; none only at stages = 1), virtual_stages
 * chunks per rank; the same checks as pt_schedule_check (nmodules not
 * checked). s->pass is allocated (scratch); on failure s is zeroed. */
pt_status pt_schedule_build_stage(pt_schedule *s, const char *name, int microbatches, int stages,
                                  int stage, int virtual_stages);
/* Every rank's list, s[0..stages-1] (rank r into s[r]); zbv's from one run
 * of its list scheduler rather than one a rank. On failure every s[r] is
 * zeroed. */
pt_status pt_schedule_build_all(pt_schedule *s, const char *name, int microbatches, int stages,
                                int virtual_stages);
/* Frees s->pass and zeroes s; NULL-safe and idempotent. */
void pt_schedule_free(pt_schedule *s);
/* Whether the configuration is valid, before anything is allocated: one
 * line naming the key (parallel.schedule, parallel.microbatches,
 * parallel.virtual_stages, parallel.pp) and its value. nmodules: the
 * model's modules (L + 2), each virtual stage needing at least one. */
pt_status pt_schedule_check(const char *name, int microbatches, int stages, int virtual_stages,
                            int nmodules);
/* The virtual stage g of chunk `chunk` on s's rank. */
int pt_schedule_virtual_stage(const pt_schedule *s, int chunk);
/* The rank holding virtual stage g under `name`'s mapping, its chunk there
 * in *chunk (may be NULL); -1 for g outside [0, stages * virtual_stages). */
int pt_schedule_locate(const char *name, int stages, int virtual_stages, int g, int *chunk);
/* The bubble of the whole step, idle / (idle + busy) averaged over the
 * ranks, with F, B and W passes taking tf, tb and tw (BW = tb + tw). Closed
 * forms (checked against the simulator in test_schedule.c):
 *   gpipe, 1f1b   (p-1) / (m+p-1), at any times;
 *   interleaved   (p-1) / (v*m+p-1), at any times;
 *   zb1           (p-1)(tf+tb-tw) / (m(tf+tb+tw) + (p-1)(tf+tb-tw)) when
 *                 m >= p and tw <= min(tf, tb); else the simulator;
 *   zbv           the simulator (6m + about p-1 at unit times, m >= 2p).
 * Returns a negative value (and sets the last error) for an invalid
 * configuration. */
double pt_schedule_bubble(const char *name, int m, int p, int v, double tf, double tb, double tw);
/* Runs all p ranks' lists with passes taking tf, tb, tw (BW = tb + tw):
 * each rank runs its list in order, a pass starting when the rank is free
 * and its dependencies are done (zero latency). *makespan: the step's end;
 * busy: p entries of busy time (may be NULL). PT_ERR_INTERNAL with one line
 * on a deadlock or a pass missing or duplicated. */
pt_status pt_schedule_simulate(const char *name, int m, int p, int v, double tf, double tb,
                               double tw, double *makespan, double *busy);

/* ---- pipeline stages (stages.c) ----------------------------------------------- */
/* Stage k of a p-stage pipeline holds modules [first, last] (0 the
 * embedding, 1..L the blocks, L+1 the head). cost: the modules' forward and
 * backward work in flops per sequence (stages.c's model); params: floats
 * held, the last stage's copy of the tied wte included. */
typedef struct {
    int first, last;
    double cost;
    size_t params;
} pt_stage;

/* Cut cfg's modules into p contiguous stages (out: p entries): as layers
 * says when non-empty (blocks per stage, "3,3,2", a list of numbers in
 * core.h's comma-list grammar; the embedding joins the first stage, the
 * head the last), else balanced (the largest stage's cost is the smallest
 * any cut gives). One line for p outside [1, L + 2], a layers string that
 * breaks the grammar, has an entry over L, does not name p stages, does
 * not add up to L, or leaves a middle stage empty. */
pt_status pt_stage_split(const pt_model_config *cfg, int p, const char *layers, pt_stage *out);
/* The cut a pipeline runs: p x v virtual stages for schedule `name` over m
 * micro-batches (pt_schedule_locate maps them to ranks). With one chunk a
 * rank, or with layers given, pt_stage_split's; with several, the cut
 * whose most loaded RANK (the sum of its chunks) is the lightest (every
 * cut tried, up to 2e6 of them; past that, the per-stage cut); of those,
 * the one whose step the schedule's simulator at m ends first, each
 * stage's passes as long as its cost (the 64 with the lightest largest
 * stage simulated, of up to 4096, at p <= 64; past that, the lightest
 * largest stage); ties to the lightest largest stage. Errors:
 * pt_stage_split's, naming p x v as parallel.pp x parallel.virtual_stages
 * chunks when v > 1, and pt_schedule_build_stage's for the m given. */
pt_status pt_stage_split_for(const pt_model_config *cfg, const char *name, int p, int v, int m,
                             const char *layers, pt_stage *out);
/* "embedding + 3 blocks | 3 blocks | 2 blocks + head" into buf. */
void pt_stage_describe(const pt_model_config *cfg, int p, const pt_stage *s, char *buf, size_t n);

/* ---- the executor (pipeline/runtime.c) -----------------------------------------
 * Every step, at every layout, is a schedule run by this one executor:
 * this rank's list (pt_schedule: F, BW, or B and W passes per micro-batch
 * and chunk) over its chunks of the cut (pt_stage, p x v virtual stages),
 * in activation blocks of its own (pt_schedule_blocks). With one stage
 * (pp NULL) the whole model is one chunk and nothing is sent; with several
 * the chunks' inputs and output gradients travel by non-blocking
 * point-to-point on splits of pp. Strategies act at the model's hook
 * points, where the trainer installs its stack; the executor knows none.
 * Lifecycle: pt_pipeline_new (collective over pp) -> per step
 * pt_pipeline_step; validation pt_pipeline_forward -> pt_pipeline_free. */
typedef struct pt_pipeline pt_pipeline;

/* Over model m (whose options owned the rank's modules; lent), this rank's
 * list s and the cut (both lent, must outlive the pipeline), pp (lent;
 * NULL with one stage). The model must have no slot of its own (a
 * pipeline stage, or pt_model_options.no_slot). */
pt_status pt_pipeline_new(pt_pipeline **out, pt_model *m, const pt_schedule *s,
                          const pt_stage *stages, pt_comm *pp);
void pt_pipeline_free(pt_pipeline *q);
/* Floats of one activation block of the chunk of modules [first, last] for
 * micro-batches of max_B: its slot, the output gradient it receives unless
 * it ends with the head and the input gradient it sends unless it starts
 * with the embedding, rounded to 64 bytes. Any model of the layout
 * answers, the table-only one too (the planner's). pt_schedule_blocks
 * then counts a rank's blocks. */
size_t pt_pipeline_block_floats(const pt_model *m, int first, int last, int max_B);
/* Record each pass (its work, and its wait for a neighbour) in t (lent;
 * NULL: none). */
void pt_pipeline_set_trace(pt_pipeline *q, pt_trace *t);

/* One step's input on this rank: M micro-batches of B x T tokens, micro-batch
 * mb at tokens + mb B T (targets likewise), each position's loss weighed by
 * dloss. */
typedef struct {
    const int *tokens, *targets;
    int B, T;
    float dloss;
    long step; /* labels trace events */
} pt_pipeline_batch;

/* The list's passes in order; *loss_sum gets the sum of the head's
 * micro-batch losses (the head's stage only). An error stops the list
 * where it happens; the requests in flight are completed either way. */
pt_status pt_pipeline_step(pt_pipeline *q, const pt_pipeline_batch *b, double *loss_sum);
/* One micro-batch's forward through every stage (validation): *loss on the
 * head's stage, 0 elsewhere. */
pt_status pt_pipeline_forward(pt_pipeline *q, const pt_batch *b, float *loss);

typedef struct {
    uint64_t busy_ns;    /* the last step's passes' work (their waits excluded) */
    uint64_t span_ns;    /* its first pass to the end of its last send */
    uint64_t wait_ns;    /* waiting for neighbours inside it */
    uint64_t sent_bytes; /* to other stages since the pipeline was made */
} pt_pipeline_stats;
void pt_pipeline_get_stats(const pt_pipeline *q, pt_pipeline_stats *s);
/* Whether this rank holds the head; the pp rank that does. */
int pt_pipeline_has_head(const pt_pipeline *q);
int pt_pipeline_head_stage(const pt_pipeline *q);

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
 * update), update, stats -> pt_stack_free (frees the entries in reverse). */

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
    float norm; /* out: the global gradient norm before clipping */
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
/* Every entry's state slot in stack order (a checkpoint's save, load or
 * restart); the first error stops it. */
pt_status pt_stack_state(pt_stack *s, pt_state_visit *v);

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
 * stage keeps a copy of wte, refreshed from the embedding's stage before
 * each step's (and validation's) first forward; the head's gradient of it
 * goes back after its last backward and is added to the embedding's before
 * module 0's gradient is final. Collective over pp (lent; NULL: no entry):
 * emb_stage and head_stage are the pp ranks holding modules 0 and L+1; an
 * empty entry where they coincide or this rank is neither. */
pt_status pt_tied_strategy(pt_strategy *out, pt_model *m, pt_comm *pp, int emb_stage,
                           int head_stage);
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
