/* partrain train: the run configuration (one table of keys), the data loader,
 * checkpoints (safetensors + state.json, written atomically) and the
 * single-worker trainer loop with its metrics.
 *
 * Lifecycle of a run:
 *   pt_config cfg; pt_config_defaults(&cfg);
 *   pt_config_load_file(&cfg, path); pt_config_set(&cfg, "train.lr=1e-3"); ...
 *   pt_config_validate(&cfg);
 *   pt_trainer_new(&tr, &cfg);      allocates everything, up front
 *   pt_trainer_resume(tr)           optional: continue from checkpoint.dir/latest
 *   pt_trainer_run(tr)              steps, validation, metrics, checkpoints
 *   pt_trainer_free(tr)
 * A benchmark builds a trainer from a config with data.train = "" and times
 * pt_trainer_step_batch on its own tokens.
 *
 * Data parallel (parallel.dp > 1): every rank builds its trainer with
 * pt_trainer_new_dist over the world communicator; each draws the same
 * GLOBAL batch from the same data RNG and computes its contiguous share;
 * gradients are synchronized per parallel.sync (parallel.h). Rank 0 writes
 * metrics, progress and the merged trace, every rank its slices of the
 * checkpoints; every rank takes part in validation (each its share of the
 * windows).
 *
 * ZeRO (parallel.zero 1-3, parallel.zero_group for HSDP): optimizer state,
 * gradients and parameters sharded over the dp ranks (parallel.h, pt_zero);
 * checkpoints still hold full tensors (each rank writes its shards).
 *
 * Tensor and pipeline parallelism (parallel.tp, parallel.pp) compose with
 * both over the mesh (parallel.h, pt_mesh); the pipeline's runtime is
 * trainer_pipe.c. Not here: choosing a layout (plan.h). */
#ifndef PARTRAIN_TRAIN_H
#define PARTRAIN_TRAIN_H

#include <stdio.h>

#include "partrain/comm.h"
#include "partrain/core.h"
#include "partrain/model.h"
#include "partrain/optim.h"
#include "partrain/pipeline.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration -------------------------------------------------------
 * Every key is declared once in config.c's table (name, type, default, range,
 * doc), which drives JSON parsing, --set, validation and --help. */
#define PT_CONFIG_STR_MAX 1024
typedef struct {
    pt_model_config model;
    struct {
        char train[PT_CONFIG_STR_MAX], val[PT_CONFIG_STR_MAX];
    } data;
    struct {
        int steps, batch_size, warmup_steps, val_every, val_batches, threads, seed;
        double lr, min_lr, weight_decay, beta1, beta2, grad_clip;
        double momentum;    /* sgd */
        char optimizer[16]; /* adamw | sgd */
        /* the key model.recompute (none | selective | full; pt_recompute):
         * here, since pt_model_config is the architecture only */
        char recompute[16];
        /* the key model.stage_recompute: one mode per pipeline rank,
         * "full,none" (empty: model.recompute everywhere) */
        char stage_recompute[128];
        char precision[16]; /* fp32 | bf16 (bf16: for planning GPU runs only) */
    } train;
    struct {
        int dp, tp, pp, zero, microbatches, sync_every, staleness, overlap;
        int zero_group, zero_keep_params;
        int sequence_parallel; /* tp > 1: LayerNorm and residual regions split by rows */
        int virtual_stages;    /* chunks per pipeline rank (0: the schedule's own) */
        char stage_layers[128];
        char zero_whole[128]; /* ZeRO-3 modules kept whole: "embedding,head,h.0" */
        double bucket_mb, outer_lr, outer_momentum;
        char schedule[16], sync[16], outer[16], stale_mode[16];
    } parallel;
    struct {
        char dir[PT_CONFIG_STR_MAX];
        int every;
        int keep;            /* newest step directories kept (0: all) */
        int async;           /* a writer thread saves while training goes on */
        int drop_rank_state; /* resume: restart per-rank state that cannot carry over */
    } checkpoint;
    struct {
        double timeout;  /* comm.timeout: seconds before a silent or stalled rank ends the job */
        int check_order; /* comm.check_order: every collective's (op, bytes, #) compared first */
        char grad_dtype[16]; /* comm.grad_dtype: fp32 | bf16 (the dp gradient reduction's wire) */
    } comm;
    struct {
        char metrics[PT_CONFIG_STR_MAX], trace[PT_CONFIG_STR_MAX];
        char flight[PT_CONFIG_STR_MAX]; /* log.flight: flight recorder dumps (dir/ or prefix) */
        int every;
        int probe; /* the speed probe after each step, in the metrics (kernels.h) */
    } log;
} pt_config;

/* Every key at its default. */
void pt_config_defaults(pt_config *c);
/* Apply a JSON file (nested objects, dotted keys also accepted). Unknown keys
 * and wrong types are errors naming the file and the key. */
pt_status pt_config_load_file(pt_config *c, const char *path);
/* Apply a JSON object given as text; `what` names it in messages. */
pt_status pt_config_load_string(pt_config *c, const char *json, const char *what);
/* Apply one "key=value" (the --set syntax). */
pt_status pt_config_set(pt_config *c, const char *assignment);
/* Ranges, cross-key rules (n_embd % n_head, batch_size % microbatches) and
 * not-yet-supported parallel settings: one message naming the key. Does not
 * require data.train (benchmarks run without data). */
pt_status pt_config_validate(const pt_config *c);
/* pt_config_validate without the runtime's own limits (train.precision =
 * bf16 is accepted): the model, batch and parallel.* rules a layout must
 * meet on any hardware, for the planner. */
pt_status pt_config_validate_layout(const pt_config *c);
/* The whole config as a JSON object (malloc'd text; caller frees). */
char *pt_config_to_json(const pt_config *c);
/* The --help table of keys: name, type, default, doc. */
void pt_config_print_help(FILE *f);
/* The same table as markdown (docs/reference.md; partrain train --help=markdown). */
void pt_config_print_markdown(FILE *f);
/* The schedule that runs (parallel.schedule; none means 1f1b at pp > 1),
 * and the chunks per pipeline rank (parallel.virtual_stages; 0 means the
 * schedule's own: 2 for interleaved and zbv, else 1). */
const char *pt_config_schedule(const pt_config *c);
int pt_config_virtual_stages(const pt_config *c);
/* What a pipeline rank's step holds beside its passes, for the stage cut
 * (pt_stage_split_step) at dp ranks: train.batch_size / dp sequences a
 * step, train.optimizer's update. */
pt_stage_step pt_config_stage_step(const pt_config *c, int dp);
/* The recompute mode of pipeline rank pp_rank: its entry of
 * model.stage_recompute, or model.recompute when that is empty. c valid. */
pt_recompute pt_config_stage_recompute(const pt_config *c, int pp_rank);
/* parallel.zero_whole as flags per module (model.n_layer + 2 of them, in
 * the model's order: embedding, h.0 .. h.L-1, head): 1 for a module kept
 * whole. Errors (one line naming the key): a name that is no module, one
 * given twice. */
pt_status pt_config_zero_whole(const pt_config *c, unsigned char *whole);
/* "dp1-tp1-pp1-zero0" */
void pt_config_layout(const pt_config *c, char *buf, size_t n);

/* ---- data ------------------------------------------------------------------
 * A token file held in memory: UTF-8 text as bytes (vocab 256), or llm.c's
 * .bin (256 int32 header: magic, version, token count; then the tokens):
 * magic 20240520 with version 1 holds uint16 tokens, magic 20240801 with
 * version 7 (llm.c's Llama 3 files) uint32 tokens, for vocabularies above
 * 65,536. Detected by the magic: a file with either magic is tokens
 * whatever its name, a *.bin name needs one, and anything else must be
 * UTF-8 without NUL (docs/untrusted.md, "Data files"). */
typedef struct pt_data pt_data;

/* Errors name the file (missing, unreadable, empty, truncated, a token >=
 * vocab_size, a NUL or invalid UTF-8 byte in text: with its offset). */
pt_status pt_data_open(pt_data **out, const char *path, int vocab_size);
void pt_data_free(pt_data *d);
size_t pt_data_num_tokens(const pt_data *d);
const char *pt_data_path(const pt_data *d);
/* B random windows of T+1 tokens drawn from rng (advances it): inputs (B,T)
 * and targets (B,T) shifted by one. Needs num_tokens >= T+1. */
void pt_data_sample(const pt_data *d, pt_rng *rng, int B, int T, int *inputs, int *targets);
/* Window w of the consecutive, non-overlapping windows of T+1 tokens
 * (w < pt_data_num_windows). */
size_t pt_data_num_windows(const pt_data *d, int T);
void pt_data_window(const pt_data *d, size_t w, int T, int *inputs, int *targets);
/* Write tokens[0, n) as an llm.c .bin file at path (atomically: a
 * temporary, fsync, rename): the uint16 file when every token is below
 * 65,536, else the uint32 one. Errors: n outside [1, 2^31), a negative
 * token, an unwritable path. */
pt_status pt_data_write(const char *path, const int *tokens, size_t n);

/* ---- checkpoints -------------------------------------------------------------
 * A checkpoint is a directory DIR/step_NNNNNNNN holding model.safetensors
 * (GPT-2 names and shapes, F32), optim_m.safetensors and optim_v.safetensors
 * (AdamW moments under the same names; train.optimizer = sgd: only
 * optim_m, its momentum buffer, and neither without momentum) and
 * state.json (step, optimizer update count, data RNG, config). DIR/latest
 * names the newest one. Saving writes a temporary directory, fsyncs,
 * renames it into place (atomically swapping out a step directory that
 * exists), then replaces DIR/latest the same way: a crash at any point
 * leaves latest naming a complete checkpoint. Rank 0 locks DIR (DIR/.lock)
 * from pt_trainer_new_dist to pt_trainer_free: a second trainer on it is
 * refused; checkpoint.keep prunes old steps.
 *
 * Every rank writes the slices it holds straight into these files at
 * their offsets (tensor-parallel slices, pipeline stages, ZeRO shards;
 * replicas share the writing; only metadata travels) and reads back only
 * what it keeps, so any layout resumes a checkpoint of any other;
 * checkpoint.async writes from a copy on a thread of its own. Under
 * parallel.sync = stale / local_sgd with dp > 1 the ranks hold state the
 * main files lack (the stale rounds in flight, dga's local gradients, each
 * dp index's own parameters and moments, the outer Nesterov state): it
 * goes, in full-tensor terms too, to sync.safetensors (what every rank
 * holds alike) and replica<d>.safetensors (dp index d's own), groups of
 * the model's tensors under "<group>.<GPT-2 name>" that state.json's
 * "rank_state" lists. It continues exactly where it means the same (the
 * same mode and dp at any tp and pp; stale delayed at any dp) and is
 * refused in one line elsewhere unless checkpoint.drop_rank_state;
 * docs/parallel.md ("Checkpoints") has the details. */

/* Write buf, laid out like the model's parameters (the parameters
 * themselves, or an optimizer moment), as a safetensors file with the model's
 * tensor names and shapes, n_head in __metadata__; atomically (temp + fsync +
 * rename). */
pt_status pt_safetensors_save(const char *path, const pt_model *m, const float *buf);
/* Read a safetensors file into buf (laid out like the model's parameters):
 * validates the header (UTF-8 JSON, exact integer shapes and offsets, the
 * tensors tiling the data section with no gap or overlap), dtypes and that
 * every tensor of the model is present with its shape; GPT-2's
 * non-parameter buffers (attn.bias,
 * attn.masked_bias) are ignored, any other extra tensor is an error. */
pt_status pt_safetensors_load(const char *path, const pt_model *m, float *buf);

/* By tensor-parallel slice (pt_model_new_slice; model.h "sharded tensors").
 * pt_safetensors_save / _load on a slice model would store the slices' own
 * shapes; these read and write the FULL tensors, GPT-2's file, instead.
 *
 * Write the full tensors of all t slices as pt_safetensors_save writes the
 * whole model's (the same bytes as the t = 1 file of the same values). m is
 * any slice model of the layout (its config and t); bufs[r], for every tp
 * rank r < t, is laid out like rank r's flat parameters (lent). A tensor
 * that every rank holds whole is taken from rank 0. Assembles the full
 * buffer in PT_MEM_SCRATCH while writing. */
pt_status pt_safetensors_save_slices(const char *path, const pt_model *m, const float *const *bufs);
/* Read m's slice of every tensor from a full-tensor safetensors file into
 * buf (laid out like m's flat parameters): the file is validated as by
 * pt_safetensors_load against the full model's names and shapes, then only
 * the slice's rows and columns are read (one seek per run of consecutive
 * elements). */
pt_status pt_safetensors_load_slice(const char *path, const pt_model *m, float *buf);

/* Resolve a checkpoint argument: DIR with a `latest` file -> DIR/<latest>
 * (or the copy a save that died moved aside, when <latest> is missing); a
 * step directory as is; DIR without `latest` -> its newest step_*. out gets
 * the step directory. Reads only. */
pt_status pt_checkpoint_resolve(const char *dir, char *out, size_t n);
/* Read the config saved in a step directory's state.json; without one, the
 * model shape of its model.safetensors (shapes, and n_head from
 * __metadata__: refused when absent). */
pt_status pt_checkpoint_read_config(const char *stepdir, pt_config *cfg);

/* ---- trainer ----------------------------------------------------------------- */
typedef struct pt_trainer pt_trainer;

#define PT_STEP_MAX_STAGES 64
/* The most ranks whose figures rank 0's pt_step_info keeps one by one (and
 * the metrics line lists); beyond it, min, max and mean only. */
#define PT_STEP_MAX_RANKS 64
/* The groups of the figures per group: dp, tp, pp, zero (parallel.h's
 * pt_group, in its order) */
#define PT_STEP_GROUPS 4

/* A step's wall time on a rank, split into DISJOINT parts that add up to it
 * (docs/report.md says how each is measured): the passes' own work; the
 * time the rank's thread was blocked on each group's communication (the
 * pipeline's part also holds its waits for neighbour stages); the
 * optimizer's update less its communication; the rest. */
typedef enum {
    PT_PART_COMPUTE,
    PT_PART_DP,   /* data parallel's buckets, local SGD's averaging */
    PT_PART_TP,   /* tensor parallel's collectives */
    PT_PART_PP,   /* waits for neighbour stages, the tied embedding, the norm over stages */
    PT_PART_ZERO, /* ZeRO's gathers and reduce-scatters */
    PT_PART_OPTIMIZER,
    PT_PART_OTHER,
    PT_NPARTS
} pt_step_part;
/* "compute", "dp", "tp", "pp", "zero", "optimizer", "other" */
const char *pt_step_part_name(pt_step_part k);

/* One figure over the ranks of a step (rank 0's pt_step_info). */
typedef struct {
    double min, max, mean;
    int max_rank; /* the first rank with the max: a straggler */
} pt_spread;

typedef struct {
    int step;   /* 1-based index of the step just taken */
    float loss; /* mean over the global batch */
    float lr;
    float grad_norm; /* before clipping */
    double step_ms;
    double tokens_per_s;
    /* log.probe: rank 0's speed probe after the step (kernels.h's
     * pt_speed_probe; not in step_ms), flop/s; 0 without it */
    double probe_flops_s;
    /* Data parallel (0 for one worker). Timings are this rank's. */
    double compute_ms;      /* step_ms minus the time blocked on communication */
    double comm_ms;         /* comm-thread (or blocking) time of the ops completed this step */
    double exposed_comm_ms; /* time this thread waited for communication */
    /* exposed_comm_ms = skew_ms + local_lag_ms + exposed_transfer_ms (rank 0 only: it
     * needs the peers' times; one host, one clock) */
    double skew_ms;             /* waiting before the last rank had launched the last bucket of
                                   the round waited for (a late peer, not transfer) */
    double local_lag_ms;        /* waiting after the first rank had completed it (this rank's
                                   comm thread finishing late, e.g. not scheduled) */
    double exposed_transfer_ms; /* the rest: every rank launched, none done */
    uint64_t comm_bytes;        /* bytes this rank sent for gradients / parameters this step
                                   (the dp group and ZeRO's groups) */
    uint64_t tp_comm_bytes;     /* bytes this rank sent on its tensor-parallel group this step
                                   (the modules' all-reduces and all-gather, the norm's
                                   reduction; 0 at tp = 1) */
    int applied;                /* 1 when an optimizer update was applied (stale delayed: not before
                                   step k) */
    /* Pipeline runs (pp > 1; rank 0's info holds every stage's): */
    double bubble;          /* mean over the ranks of the fraction of the step's passes spent
                               waiting for a neighbour stage */
    int stages;             /* pp */
    uint64_t pp_comm_bytes; /* bytes this rank sent to its neighbour stages this step */
    uint64_t stage_acts[PT_STEP_MAX_STAGES]; /* per stage: the largest PT_MEM_ACTS peak of
                                                its ranks this step (rank 0 only) */
    /* per stage: the most any of its ranks idled outside its passes this
     * step, ms (rank 0 only): waiting for its first pass's input, for its
     * last sends, and blocked before and after the passes (the tied wte's
     * exchange, the norm over the stages while another stage works) */
    double stage_idle_ms[PT_STEP_MAX_STAGES];
    /* Where the step's time went: this rank's parts (they add up to step_ms) */
    double part_ms[PT_NPARTS];
    /* Rank 0 only, over every rank of the world (nranks of them): each
     * rank's own step time (its parts' sum) and parts; each group's time on
     * the progress lanes not exposed (overlapped), bytes sent and the
     * operations' time (the sums over ranks, for the achieved bandwidth). */
    int nranks;
    pt_spread wall, part[PT_NPARTS], overlap[PT_STEP_GROUPS];
    uint64_t group_bytes[PT_STEP_GROUPS];
    double group_comm_ms[PT_STEP_GROUPS];
    /* the first min(nranks, PT_STEP_MAX_RANKS) ranks one by one: step time
     * (each rank's own clock, from the step's start to its update's end),
     * parts and memory peaks (PT_MEM_NCAT categories, then the total) */
    double rank_wall_ms[PT_STEP_MAX_RANKS];
    double rank_part_ms[PT_STEP_MAX_RANKS][PT_NPARTS];
    uint64_t rank_mem[PT_STEP_MAX_RANKS][PT_MEM_NCAT + 1];
} pt_step_info;

/* The config's output paths, before any work: log.metrics a regular file
 * or nothing yet (its missing folders are made), log.trace a regular file
 * or nothing yet in an existing folder, checkpoint.dir a directory or
 * nothing yet (pt_file_check_output, pt_dir_check_output); anything else (a
 * FIFO, device, socket, a directory for a file, a file for a directory) is
 * one line naming the key and the path. The CLI calls it before planning
 * or forking ranks; pt_trainer_new_dist calls it first thing. */
pt_status pt_trainer_check_outputs(const pt_config *cfg);

/* Build everything for cfg (validated here too): model (initialized from
 * train.seed), optimizer, data when data.train / data.val are set. The
 * output paths are checked first (pt_trainer_check_outputs). With
 * checkpoint.dir set, rank 0 creates and checks it, takes its lock and
 * removes what killed saves left (an error here, before step 1, when it is
 * a file, not writable, or in use by another job). Sets kernel threads to
 * train.threads. */
pt_status pt_trainer_new(pt_trainer **out, const pt_config *cfg);
/* Same, as one rank of data parallelism over world (lent; must outlive the
 * trainer; NULL: one worker). parallel.dp x parallel.tp x parallel.pp must
 * equal the world's size; the trainer builds the device mesh over world
 * (parallel.h, pt_mesh) and runs its strategies on the dp group. */
pt_status pt_trainer_new_dist(pt_trainer **out, const pt_config *cfg, pt_comm *world);
/* What the config alone decides about a run of nranks ranks, checked
 * without building anything: pt_config_validate, the mesh dp x tp x pp
 * being nranks, and with `resume` a checkpoint.dir to resume from. The
 * refusals of pt_trainer_new_dist and pt_trainer_resume that need no file
 * and no peer, for a launcher to say once, before it forks the ranks. */
pt_status pt_trainer_check(const pt_config *cfg, int nranks, int resume);
void pt_trainer_free(pt_trainer *t);

pt_model *pt_trainer_model(pt_trainer *t);
/* NULL under ZeRO (parallel.zero >= 1, dp > 1): each rank holds its shard. */
pt_adamw *pt_trainer_optim(pt_trainer *t);
/* The whole model's parameter count (pt_model_config_num_params: that of
 * every rank's model unless tensor parallelism slices it). */
size_t pt_trainer_num_params(const pt_trainer *t);
const pt_config *pt_trainer_config(const pt_trainer *t);
int pt_trainer_step_count(const pt_trainer *t); /* optimizer steps taken */

/* One optimizer step on the next batch from data.train (needs data). */
pt_status pt_trainer_step(pt_trainer *t, pt_step_info *info);
/* One optimizer step on caller tokens: inputs and targets (batch_size, T)
 * ints in [0, V), lent: the GLOBAL batch (every rank passes the same; each
 * computes its share). Allocates nothing after the first step. */
pt_status pt_trainer_step_batch(pt_trainer *t, const int *inputs, const int *targets,
                                pt_step_info *info);
/* Mean loss over the first train.val_batches batches of consecutive windows
 * of data.val (needs data.val). */
pt_status pt_trainer_validate(pt_trainer *t, float *val_loss);

/* Save a checkpoint of the current state to checkpoint.dir. Collective
 * (every rank calls it and writes its own slices; stale rounds in flight
 * are completed first); every rank gets the same status, the first failing
 * rank's. With checkpoint.async it returns once this rank's slices are
 * copied aside (after waiting for the previous save, whose status it
 * returns), and a writer thread saves them. */
pt_status pt_trainer_save(pt_trainer *t);
/* Wait for the asynchronous save in flight: its status, the same on every
 * rank (PT_OK when none). pt_trainer_run waits at its end, and
 * pt_trainer_free waits too (a failure is then only logged). */
pt_status pt_trainer_save_wait(pt_trainer *t);
/* Load checkpoint.dir/latest (model, optimizer, step, data position, and
 * the per-rank state where it carries over), each rank reading only the
 * bytes it keeps. Collective: when any rank fails, every rank returns that
 * rank's one-line message. */
pt_status pt_trainer_resume(pt_trainer *t);

/* What the run was planned to be (train --plan, --layout auto): a JSON
 * object, written as "plan" in the run record, the metrics' first line
 * (docs/report.md); its "predicted" entry's step_ms and mem.total are
 * printed beside the measured ones at the end of the run. json lent
 * (copied). Errors: not a JSON object. */
pt_status pt_trainer_set_plan(pt_trainer *t, const char *json);

/* The loop: from the current step to train.steps, with the progress line on
 * stderr, metrics, validation every val_every steps (and at the start and
 * the end) and checkpoints every checkpoint.every steps and at the end (when
 * checkpoint.dir is set). Opens log.metrics (rank 0); a failed metrics or
 * trace write is a PT_ERR_IO naming the file. Stops early with
 * PT_ERR_INTERRUPTED on SIGINT after saving. */
pt_status pt_trainer_run(pt_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
