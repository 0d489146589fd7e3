/* partrain pipeline: the parallel layer's pipeline half, its own header
 * because parallel.h (which includes it) would pass 700 lines with it.
 *
 *   pt_sched     a schedule's descriptor: one static table of every
 *                schedule (schedule.c) that every caller asks rather than
 *                compare names.
 *   pt_schedule  one rank's list of a step's passes, built by the
 *                schedule's generator (pipeline/, one file each).
 *   pt_sched_simulate  the one simulator of every rank's list: for the
 *                schedules' checks, the stage cut and the planner's time
 *                model (pipeline/simulate.c).
 *   pt_stage     the model's modules cut into pipeline stages (stages.c).
 *   pt_pipeline  the executor: every step, at every layout, is a schedule
 *                run by it (pipeline/runtime.c).
 *
 * Not here: the strategies the executor's hook points serve (parallel.h). */
#ifndef PARTRAIN_PIPELINE_H
#define PARTRAIN_PIPELINE_H

#include "partrain/comm.h"
#include "partrain/core.h"
#include "partrain/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pt_trace pt_trace; /* the trace recorder (parallel.h) */

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

/* A schedule's descriptor: all that a caller asks of a schedule by its
 * name (parallel.schedule), one entry of schedule.c's one static table.
 * Config validation, the stage cut, the executor, the planner's space and
 * bench schedule read these fields rather than compare names; the
 * functions are the schedule's own (the builders and pt_schedule_locate
 * call them after pt_schedule_check). */
typedef struct {
    const char *name;
    int split;               /* 1: backwards are B + W passes */
    int whole;               /* 1: runs with the whole model on one rank (pp 1): none, gpipe */
    int pipeline;            /* 1: runs a pipeline (pp > 1): all but none */
    const char *as_pipeline; /* what parallel.schedule = name runs at pp > 1 (none: 1f1b) */
    int v_min, v_max;        /* chunks a rank it runs with (parallel.virtual_stages) */
    int v_default;           /* and the one parallel.virtual_stages = 0 gives: the fewest */
    int m_per_p;             /* 1: micro-batches a multiple of pp (interleaved's groups of p) */
    /* Rank r's list into out (room for 3 m v): its count, -1 when out of
     * memory (pipeline/, one file per schedule). */
    int (*list)(pt_pass *out, int m, int p, int r, int v);
    /* Every rank's list from one run where that is cheaper than one each
     * (zbv's list scheduler): out[r] (NULL: not kept), counts into n;
     * 0, or -1 when out of memory. NULL: list, rank by rank. */
    int (*lists)(pt_pass *const *out, int *n, int m, int p, int v);
    /* The stage map: the virtual stage of chunk c of rank r, and the rank
     * holding virtual stage g in [0, p v) (its chunk into *c). */
    int (*stage)(int p, int r, int c);
    int (*rank)(int p, int g, int *c);
    /* The step's bubble in closed form (pt_schedule_bubble), or < 0 where
     * only the simulator knows it at these times. */
    double (*bubble)(int m, int p, int v, double tf, double tb, double tw);
    /* Micro-batch activations rank r holds at once, its chunks together:
     * the schedule's formula, which its lists meet (pt_schedule.in_flight;
     * test_schedule.c). */
    int (*in_flight)(int m, int p, int r, int v);
} pt_sched;

/* The descriptor of schedule `name`; NULL for an unknown one (NULL too). */
const pt_sched *pt_sched_find(const char *name);
/* The table in order (none, gpipe, 1f1b, interleaved, zb1, zbv): entry i,
 * NULL past the last. */
const pt_sched *pt_sched_at(int i);

typedef struct {
    char name[16];
    const pt_sched *sched; /* the descriptor */
    int microbatches;      /* m */
    int stages;            /* p */
    int stage;             /* r, this rank */
    int virtual_stages;    /* v, chunks per rank */
    int split;             /* 1: backwards are B + W passes */
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
 * in *chunk (may be NULL); -1 for g outside [0, stages * virtual_stages)
 * or an unknown name. */
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

/* ---- the schedule simulator (pipeline/simulate.c) ---------------------------
 * The one simulator of a step's passes, for the schedules' own checks and
 * the stage cut (pt_schedule_simulate), and for the planner's time model,
 * which hands it every pass's time on its cluster: each virtual stage's F,
 * B and W (BW = B + W), the transfer between neighbouring stages on two
 * ranks, the tied embedding's wte between its two ranks, and a machine
 * whose devices the pipeline ranks share (the planner's ranks beyond the
 * cluster's devices, or a measured machine's cores). */
typedef struct {
    /* Per virtual stage g (p x v entries): F, B, W of one micro-batch with
     * every pipeline rank computing. */
    const double *f, *b, *w;
    /* A shared machine (NULL: a pass takes f, b, w whatever the others
     * do): the same passes with their rank alone computing, and with the
     * devices just full, none shared. With n of the p ranks computing the
     * devices' load is x = n load / p; a pass runs at its alone time at
     * x = load / p, its just-full time at x = 1 and its f, b, w at
     * x = load, linearly between (where load / p >= 1: from the alone
     * time at x = load / p to f, b, w at x = load). Its length is
     * re-read whenever a rank starts or ends a pass. */
    const double *f_alone, *b_alone, *w_alone;
    const double *f_full, *b_full, *w_full;
    double load; /* the devices' load with every rank computing (>= 1) */
    /* hop[g]: an activation's (or its gradient's) transfer between virtual
     * stages g and g + 1 (p v - 1 entries; NULL: instant). */
    const double *hop;
    /* The tied wte where the embedding's and the head's ranks differ
     * (trainer_pipe.c), else 0: the embedding's rank's first forward
     * takes tied_send longer (its send to the head's); its last weight
     * pass ends no earlier than the head's gradient lands (tied_send after
     * the head's last weight pass), then adds it (tied_add > 0). */
    double tied_send, tied_add;
    /* Per rank (p entries; NULL: none): its optimizer update after the
     * step's passes. The gradient norm's all-reduce over the pipeline joins
     * the ranks first, so the step ends at the passes' end plus the
     * longest update (pt_sched_step_end): a stage's whole step is its
     * passes and its update, the tied wte's share included. */
    const double *update;
} pt_sched_times;

/* A pass as the simulator placed it. */
typedef struct {
    int rank, kind, micro, chunk; /* kind: pt_pass_kind */
    double start, end;
} pt_sched_slot;

typedef struct {
    double makespan;      /* out: the last pass's end */
    double step;          /* out: the step's end, updates included (pt_sched_step_end) */
    double *busy;         /* in: NULL, or p entries for each rank's seconds in passes */
    pt_sched_slot *slots; /* in: NULL, or room for every rank's passes */
    int nslots;           /* out: the passes placed into slots */
} pt_sched_result;

/* Runs s[0..p-1] (every rank's list of one schedule, as pt_schedule_build_all
 * gives them; lent) at the times t (lent) into out: each rank runs its
 * list in order, a pass starting when the rank is free and the passes it
 * depends on have ended and their transfers landed. PT_ERR_INTERNAL with
 * one line naming the stuck ranks' passes on a deadlock, or a pass missing,
 * duplicated or of a kind the schedule does not run. */
pt_status pt_sched_simulate(const pt_schedule *s, const pt_sched_times *t, pt_sched_result *out);
/* The step's end from the passes' end and each of p ranks' update (NULL:
 * none): makespan + the longest update (pt_sched_times.update). */
double pt_sched_step_end(double makespan, const double *update, int p);

/* ---- pipeline stages (stages.c) ----------------------------------------------- */
/* Stage k of a p-stage pipeline holds modules [first, last] (0 the
 * embedding, 1..L the blocks, L+1 the head). cost: the modules' forward and
 * backward work in flops per sequence (stages.c's model); params: floats
 * held, the last stage's copy of the tied wte included. */
typedef struct {
    int first, last;
    double cost;   /* passes, plus the update where the cut weighs the step */
    double update; /* of which the update (pt_stage_split_step; else 0) */
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
/* A pipeline rank's step beside its passes, for the cut that balances the
 * whole step: update, the flops per sequence (the passes' units) that
 * updating one parameter costs; tied_split, whether the first and the last
 * stage update half of the tied wte each (tied_split.c), else the first
 * all of it. */
typedef struct {
    double update;
    int tied_split;
} pt_stage_step;
/* The step over `sequences` a step per pipeline (a dp rank's batch), for
 * AdamW (sgd 0) or SGD, at dp ranks (the wte update is split at dp 1). */
pt_stage_step pt_stage_step_of(int sgd, double sequences, int dp);
/* pt_stage_split_for with each module's cost its whole step's: its passes
 * and its share of the update (step NULL: the passes only, as
 * pt_stage_split_for). The cut the trainer runs and the planner weighs. */
pt_status pt_stage_split_step(const pt_model_config *cfg, const pt_stage_step *step,
                              const char *name, int p, int v, int m, const char *layers,
                              pt_stage *out);
/* Parameters (floats) of module i of cfg (0 the embedding, 1..L the
 * blocks, L + 1 the head; the tied wte not in the head's, which a stage
 * of its own adds: pt_stage.params). */
size_t pt_stage_module_params(const pt_model_config *cfg, int i);
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
    uint64_t busy_ns; /* the last step's passes' work (their waits excluded) */
    uint64_t span_ns; /* its first pass to the end of its last send */
    uint64_t wait_ns; /* waiting for neighbours inside it */
    /* of the span, before its first pass's work began (its input) and
     * after its last pass's work ended (its sends completing) */
    uint64_t lead_ns, tail_ns;
    uint64_t sent_bytes; /* to other stages since the pipeline was made */
    uint64_t comm_ns;    /* its transfers' time, start to completion, since it was made */
} pt_pipeline_stats;
void pt_pipeline_get_stats(const pt_pipeline *q, pt_pipeline_stats *s);
/* Whether this rank holds the head; the pp rank that does. */
int pt_pipeline_has_head(const pt_pipeline *q);
int pt_pipeline_head_stage(const pt_pipeline *q);

#ifdef __cplusplus
}
#endif
#endif
