/* partrain plan: pick a layout from the model and the hardware, without
 * running the model (DESIGN: the planner).
 *
 *   cluster   a description of the hardware (JSON, docs/plan.md): nodes,
 *             devices per node, the device's peak rates and memory, the
 *             links, optional efficiency overrides and an optional measured
 *             profile (what `partrain calibrate` writes; that file is
 *             itself a cluster description of this machine);
 *   memory    per-rank peak bytes by category (the PT_MEM_* categories),
 *             for partrain's own CPU runtime (fp32: the runtime's exact
 *             allocations) or for a GPU run (bf16 with fp32 master weights:
 *             the ZeRO paper's 2 + 2 + 12 bytes a parameter and Korthikanti
 *             et al.'s activations);
 *   time      the step time: compute per pipeline stage (measured module
 *             times from the profile, else flops over the device's rate),
 *             the schedule's bubble from a simulation of the pass lists,
 *             the exposed communication of each group over the links it
 *             crosses, and the optimizer;
 *   search    every layout the config validator accepts for a world size,
 *             with the memory and time of each, rejected with the category
 *             that overflowed or ranked by step time.
 *
 * The layer reads pt_config (the model, batch, sequence length, optimizer,
 * precision and the fixed parallel.* keys) and allocates nothing
 * proportional to the model. */
#ifndef PARTRAIN_PLAN_H
#define PARTRAIN_PLAN_H

#include <stdio.h>

#include "partrain/core.h"
#include "partrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PT_PLAN_MAX_STAGES 64
#define PT_PLAN_NAME_MAX   128
/* The most ranks a plan is for: --world's cap, and a cluster's nodes x
 * devices_per_node */
#define PT_PLAN_MAX_WORLD (1 << 20)

/* ---- measured profile (calibrate) ------------------------------------------
 * Everything partrain calibrate measures, as read back from its JSON. Times
 * are seconds, rates per second. Each table is a list of points; the time
 * model interpolates (log-log in size) between neighbours of the same key
 * and extrapolates linearly beyond the last. */
typedef struct {
    int m, n, k;    /* C(m x n) = A(m x k) B(k x n), row-major, no transpose */
    int threads;    /* BLAS threads */
    double flops_s; /* 2 m n k / measured seconds */
} pt_profile_gemm;

/* One module's measured passes at one shape: seconds per micro-batch of
 * `tokens` tokens (rows). kind: PT_MODULE_EMBEDDING, _BLOCK, _HEAD. */
typedef struct {
    int kind;
    int n_embd, n_head, seq_len, vocab_size; /* the model shape it was measured at */
    int tp;                                  /* tensor-parallel degree of the shard timed */
    int tokens;                              /* rows of the micro-batch */
    int threads;
    /* ranks running at once while it was measured, each at `threads`: 1
     * alone, tp for a shard's group, the cores for tp 1 under load (every
     * core running the same passes). Optional in the file (default tp). */
    int ranks;
    double fwd_s, bgrad_s, wgrad_s; /* forward, input-gradient (B), weight-gradient (W) */
    double recompute_s[3];          /* extra backward time: none (0), selective, full */
} pt_profile_module;

typedef enum {
    PT_PROFILE_ALLREDUCE = 0,
    PT_PROFILE_ALLGATHER,
    PT_PROFILE_REDUCE_SCATTER,
    PT_PROFILE_BROADCAST,
    PT_PROFILE_P2P,
    PT_PROFILE_NOPS
} pt_profile_op;

typedef struct {
    char backend[8]; /* shm | mpi */
    int op;          /* pt_profile_op */
    int ranks;       /* group size (2 for p2p) */
    double bytes;    /* message bytes per rank (the full buffer for all-reduce) */
    double seconds;
} pt_profile_comm;

typedef struct {
    char cpu[PT_PLAN_NAME_MAX];    /* CPU model name (/proc/cpuinfo) */
    char binary[PT_PLAN_NAME_MAX]; /* identity of the partrain binary that measured */
    int cores;
    double memory_bw;      /* bytes/s, one thread, streaming copy */
    double elementwise_s;  /* seconds per float of a fused elementwise pass, one thread */
    double adamw_s, sgd_s; /* optimizer seconds per parameter, one thread */
    /* The speed probe's median rate over the run (calibrate.h), to which
     * every figure above and below was scaled; 0: not recorded. */
    double probe_flops_s;
    pt_profile_gemm *gemm;
    int n_gemm;
    pt_profile_module *module;
    int n_module;
    pt_profile_comm *comm;
    int n_comm;
} pt_profile;

/* ---- cluster description --------------------------------------------------- */
typedef struct {
    double bw;      /* bytes/s per device per direction */
    double latency; /* seconds */
} pt_link;

/* Fractions of peak that a real run reaches (docs/plan.md gives the
 * defaults and where each comes from); a cluster file may override them. */
typedef struct {
    double matmul;      /* large matrix products */
    double elementwise; /* of memory_bw, for LayerNorm, GELU, softmax, residuals */
    double comm;        /* of link bw, for collectives */
} pt_efficiency;

typedef struct {
    char name[PT_PLAN_NAME_MAX];
    int nodes, devices_per_node;
    struct {
        char name[PT_PLAN_NAME_MAX];
        double peak_flops_fp32, peak_flops_bf16; /* flop/s per device */
        double memory_bytes;                     /* per device */
        double memory_bw;                        /* bytes/s per device */
    } device;
    pt_link intra_node, inter_node;
    pt_efficiency efficiency;
    pt_profile *profile; /* NULL: costs modelled from the datasheet figures */
} pt_cluster;

/* Parse a cluster description (or a calibrate profile). A missing,
 * mistyped or out-of-range field (every number has a plausible range,
 * docs/plan.md), a world beyond PT_PLAN_MAX_WORLD or a profile without
 * measured products or modules is one error line naming the file and the
 * field. */
pt_status pt_cluster_load_file(pt_cluster **out, const char *path);
pt_status pt_cluster_load_string(pt_cluster **out, const char *json, const char *what);
void pt_cluster_free(pt_cluster *c);
/* The cluster as JSON (malloc'd text), profile included. NULL when out of
 * memory, or when the text would not load back (a number out of its
 * range, or not finite: pt_error_message names it): what is written
 * loads. */
char *pt_cluster_to_json(const pt_cluster *c);

/* ---- a layout ------------------------------------------------------------- */
typedef struct {
    int dp, tp, pp, zero, zero_group, sequence_parallel;
    int microbatches, virtual_stages; /* virtual_stages as the runtime runs it (>= 1) */
    char schedule[16];                /* as the runtime runs it: none | gpipe | 1f1b | ... */
    int recompute;                    /* pt_recompute, every stage */
    int threads;                      /* BLAS threads per rank */
    /* per part, as the config keys spell them (empty: the runtime's own):
     * parallel.stage_layers ("3,3,2"), model.stage_recompute (one mode per
     * pipeline rank: "full,selective,none"), parallel.zero_whole (ZeRO-3
     * modules kept whole: "embedding,head,h.0") */
    char stage_layers[128];
    char stage_recompute[128];
    char zero_whole[128];
} pt_plan_layout;

/* The layout's parallel.* (and model.recompute, train.threads) keys written
 * into a config; and read back from one. */
void pt_plan_layout_apply(const pt_plan_layout *l, pt_config *c);
void pt_plan_layout_from_config(pt_plan_layout *l, const pt_config *c);
/* "dp2-tp2-pp2-zero1-1f1b-m4-rnone" */
void pt_plan_layout_name(const pt_plan_layout *l, char *buf, size_t n);

/* ---- memory model ----------------------------------------------------------
 * Per-rank peak bytes of each PT_MEM_* category during a step, as the
 * trainer's metrics report them (the largest over ranks of each category;
 * `stage` the same per pipeline stage). slack: the stated headroom the
 * planner adds before comparing with the device (allocator fragmentation,
 * the runtime's own buffers), included in total. */
typedef struct {
    double cat[PT_MEM_NCAT];
    double slack;
    double total; /* the largest over ranks of the rank's sum */
    /* fp32: what a checkpoint save adds on top (not in total): nothing
     * for a synchronous save (every rank writes its slices from its own
     * buffers), the rank's staged write share under checkpoint.async; in
     * `max`, what the largest saving rank needs beyond max.total. bf16 (a
     * GPU's save goes through host memory): 0. A layout fits when total +
     * save does. */
    double save;
} pt_plan_mem_rank;

typedef struct {
    pt_plan_mem_rank max;                       /* per category: max over ranks */
    pt_plan_mem_rank stage[PT_PLAN_MAX_STAGES]; /* per pipeline stage (rank of that stage) */
    int n_stage;
} pt_plan_mem;

pt_status pt_plan_memory(const pt_config *model, const pt_plan_layout *l, const pt_cluster *cl,
                         pt_plan_mem *out);

/* What one rank of world may hold on cl. A device's memory is its own (a
 * GPU's): a rank gets memory_bytes, "the device has 80.0 GB", or where the
 * ranks outnumber the devices, the device's over the ranks that share one,
 * ceil(world / devices): "a rank has 40.0 GB (the device's 80.0 GB over 2
 * ranks)". A measured machine (cl->profile: this CPU host, a device a core
 * and memory_bytes RAM / cores) shares its RAM among the node's ranks,
 * ceil(world / nodes) of them: "a rank has 6.3 GB (the node's 25.2 GB over
 * 4 ranks)", and one rank has all of it. */
typedef struct {
    double bytes;   /* a rank's: the pool over the ranks that share it */
    int share;      /* those ranks (1: a pool of its own) */
    char what[128]; /* the phrase that says so */
} pt_plan_capacity;
void pt_plan_rank_capacity(const pt_cluster *cl, int world, pt_plan_capacity *out);

/* What a rank of m needs of its share: its step's total, and a checkpoint
 * save's scratch (m->save) over the ranks sharing the pool, since the
 * save's scratch lives on one of them while the others hold their steps'
 * state: the pool's sum is what must fit. */
double pt_plan_mem_need(const pt_plan_mem_rank *m, const pt_plan_capacity *cap);

/* Whether m (a rank's or the max over ranks) exceeds cap: 0 when it fits
 * (reason ""), else 1 with one line in reason naming the total, the
 * categories largest first, the slack, a save's scratch and the capacity:
 * "needs 93.1 GB a rank (optim 61.2 GB, params 15.3 GB, ...), the device
 * has 85.9 GB". */
int pt_plan_mem_overflow(const pt_plan_mem_rank *m, const pt_plan_capacity *cap, char *reason,
                         size_t n);

/* ---- time model ------------------------------------------------------------ */
typedef struct {
    double step_s;
    double compute_s; /* the busiest stage's passes */
    double bubble_s;  /* pipeline idle time on the critical rank */
    double comm_s[4]; /* exposed seconds per group: tp, dp, pp, mp (PT_MESH_*) */
    double optim_s;
    double bubble; /* fraction, as the metrics' bubble */
    double tokens_per_s;
    double mfu; /* model flops (6 N T + attention) / (world x peak x step_s) */
} pt_plan_time;

pt_status pt_plan_time_predict(const pt_config *model, const pt_plan_layout *l,
                               const pt_cluster *cl, pt_plan_time *out);

/* Whether profile p (NULL: no) measured the modules of model m's shape (n_embd,
 * n_head, seq_len; vocab_size for the embedding and head). Without them
 * the passes are modelled from the profile's product table, which misses
 * what a pass costs beyond its products (gpt2 at T 64 on one rank: m 4
 * predicted as m 1, 627 ms; measured 1323 and 693): plan says so. */
int pt_plan_profile_has_model(const pt_profile *p, const pt_model_config *m);

/* ---- search ---------------------------------------------------------------- */
typedef struct {
    pt_plan_layout layout;
    pt_plan_mem_rank mem; /* the max over ranks (pt_plan_memory gives per stage) */
    pt_plan_time time;
    int fits;
    char reason[256]; /* why it does not fit, naming the category */
    char why[4][256]; /* one line per per-part choice */
    int n_why;
} pt_plan_entry;

typedef struct {
    pt_plan_entry *entry; /* fitting first, by step time; then the rejected (the search may
                           * keep only some of those, smallest memory first) */
    int n, n_fit;
    long n_considered; /* valid layouts */
    long n_evaluated;  /* of which memory was predicted: the rest could not beat the kept
                        * ones on their lower bound (search.c) */
    long n_fitting;    /* of the evaluated, those that fit (n_fit of them kept: the fastest) */
} pt_plan_result;

/* Every layout of `world` ranks that the validator accepts with the
 * parallel.* keys that `fixed` marks (config key names, as given by --set)
 * held at base's values. Errors: no layout valid under the fixed keys (one
 * line naming them), none fitting (what the smallest needs and what the
 * cluster offers). */
pt_status pt_plan_search(const pt_config *base, const char *const *fixed, int n_fixed,
                         const pt_cluster *cl, int world, pt_plan_result *out);
void pt_plan_result_free(pt_plan_result *r);
/* Whether every number of e (memory by category, the step and its
 * breakdown, rates) is finite. The search asserts it of what it returns
 * (the cluster loader's ranges keep the models finite); what prints or
 * writes an entry refuses one that is not. */
int pt_plan_entry_finite(const pt_plan_entry *e);

/* ---- output (planfile.c, trace.c) ------------------------------------------ */
/* One layout as JSON (malloc'd text): layout, dp, tp, pp, zero, zero_group,
 * sequence_parallel, schedule, microbatches, virtual_stages, recompute,
 * stage_layers, stage_recompute, zero_whole, fits, reason, mem (bytes per
 * category, slack, total), and when it fits step_ms, tokens_per_s, mfu,
 * breakdown (compute_ms, bubble_ms, tp_ms, dp_ms, pp_ms, optim_ms, bubble);
 * why (the per-part choices). NULL when out of memory. */
char *pt_plan_entry_to_json(const pt_plan_entry *e);
/* A plan file (docs/plan.md): cfg with e's layout applied, as
 * pt_config_to_json writes it, under "config", and e's prediction and
 * reasons under "plan". Written atomically (a temporary renamed). */
pt_status pt_plan_write_file(const char *path, const pt_config *cfg, const pt_plan_entry *e);
/* Apply a plan file's "config" to c (as pt_config_load_string: unknown
 * keys and wrong types are errors naming the file and the key), after
 * checking its "plan": an object whose "layout" names the layout that the
 * config runs (pt_plan_layout_name of it), "predicted" (optional) an
 * object of the same layout, "why" (optional) an array of strings. Each
 * refusal is one line naming the file and the field. */
pt_status pt_plan_file_load(const char *path, pt_config *c);
/* The same from the file's text; name labels the messages. */
pt_status pt_plan_file_load_string(const char *text, const char *name, pt_config *c);
/* The simulated timeline of layout l (Chrome trace JSON, docs/plan.md):
 * one track per pipeline rank (passes, tp collectives, exposed dp traffic,
 * optimizer) and one per link. */
pt_status pt_plan_trace_write(const char *path, const pt_config *c, const pt_plan_layout *l,
                              const pt_cluster *cl);

#ifdef __cplusplus
}
#endif

#endif
