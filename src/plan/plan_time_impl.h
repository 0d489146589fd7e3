/* Private to the planner's time model, search and simulated trace: the
 * per-stage pass times of a layout and the pipeline's simulated timeline,
 * shared so that the search can reuse one simulation across the layouts
 * that differ only in ZeRO (which moves no pass) and the trace can draw the
 * same timeline the prediction measured.
 *
 * Not here: memory (memory.c), the public API (partrain/plan.h). */
#ifndef PT_PLAN_TIME_IMPL_H
#define PT_PLAN_TIME_IMPL_H

#include "partrain/parallel.h"
#include "partrain/plan.h"

/* The pipeline part of a prediction: what ZeRO does not change. */
typedef struct {
    int G; /* virtual stages p x v */
    double f[PT_PLAN_MAX_STAGES *
             PT_SCHEDULE_MAX_VIRTUAL]; /* per virtual stage, seconds a micro-batch */
    double b[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];  /* input gradient (+ recompute) */
    double w[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];  /* weight gradient */
    double tp[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL]; /* of f + b: tp collectives */
    /* f, b, w while the other pipeline ranks wait (= f, b, w unless
     * `alone`: pt_sched_times.f_alone) */
    double fa[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    double ba[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    double wa[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    /* and with every core just busy, none shared (between the two: where
     * a pipeline rank's ranks alone leave cores free; else = fa, ba, wa) */
    double fc[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    double bc[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    double wc[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    double p2p_intra, p2p_inter; /* one activation transfer between stages, per link */
    /* the tied wte where the embedding's and the head's pipeline ranks
     * differ (trainer_pipe.c), else 0: each way's transfer, and the add of
     * the head's gradient into the embedding's */
    double tied_s, tied_add;
    /* where the two stages split wte's update (dp 1, tied_split.c; tied_s
     * and tied_add are then 0): the exchange after the passes, each way a
     * half of the gradient and of the rows, and the half's add; and wte's
     * floats a rank holds (tp shard), of which the head's rows */
    int tied_split;
    double tied_x, wte, wte_hi;
    int p, v, m, stride, dpn; /* pipeline shape; mesh stride of pp; devices a node */
    int rank_of[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL]; /* virtual stage -> pp rank */
    double makespan;                         /* the pipeline's step, passes and p2p */
    double makespan_nop2p;                   /* the same with instant transfers */
    int crit;                                /* the busiest pipeline rank */
    double busy[PT_PLAN_MAX_STAGES];         /* per rank: seconds in passes */
    double busy_lo[PT_PLAN_MAX_STAGES];      /* per rank: its passes at their shortest */
    double tp_busy[PT_PLAN_MAX_STAGES];      /* per rank: of which tp collectives */
    double last_bw[PT_PLAN_MAX_STAGES];      /* per rank: its last backward's length (dp overlap) */
    double stage_params[PT_PLAN_MAX_STAGES]; /* per rank: parameters it holds (tp shard) */
    int first[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL]; /* modules of each virtual stage */
    int last[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    const pt_schedule *lists; /* NULL, or the p ranks' pass lists, lent (the search's cache) */
    int threads;              /* BLAS threads per rank */
    double slow;              /* oversubscription factor (>= 1) */
    /* p > 1 and a pass's time depends on how many ranks compute: ranks
     * share the devices (slow > 1), or a measured machine (its cores share
     * caches and memory bandwidth); the simulator's shared run */
    int alone;
} pt_plan_pipe;

/* The pipeline part of l's step in two halves: the pass times (and each
 * rank's busy seconds, parameters, transfer times), then the simulated
 * schedule (makespan with and without transfers); _predict is both. */
pt_status pt_plan_pipe_times(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                             pt_plan_pipe *pp);
/* _times with the stage cut given (pt_stage_split_for's, p x v entries). */
pt_status pt_plan_pipe_times_split(const pt_config *c, const pt_plan_layout *l,
                                   const pt_cluster *cl, const pt_stage *st, pt_plan_pipe *pp);
pt_status pt_plan_pipe_run(const pt_plan_layout *l, pt_plan_pipe *pp);
/* _run with transfers only (makespan_nop2p set to the same): the search's,
 * which splits the transfers out for the layouts it keeps. */
pt_status pt_plan_pipe_run_fast(const pt_plan_layout *l, pt_plan_pipe *pp);
pt_status pt_plan_pipe_predict(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                               pt_plan_pipe *pp);
/* The rest: data-parallel and ZeRO traffic, optimizer, totals. */
void pt_plan_time_finish(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                         const pt_plan_pipe *pp, pt_plan_time *out);

/* Simulate l's schedule with pp's times (transfers instant unless
 * with_p2p) into *makespan and pp->busy: the schedules' own simulator
 * (pt_sched_simulate) over pp->lists, or lists built here; when slots is
 * not NULL, every pass placed into *slots (malloc'd, *nslots of them; the
 * caller frees). */
pt_status pt_plan_pipe_simulate(const pt_plan_layout *l, pt_plan_pipe *pp, int with_p2p,
                                double *makespan, pt_sched_slot **slots, int *nslots);

/* ---- one micro-batch's passes (time_passes.c) ---- */

/* What a rank computes and moves at, for pt_plan_module_times. */
typedef struct {
    double flops_s, bytes_s; /* the rank's matrix and elementwise rates */
    double el;               /* bytes an element */
    double tp_bw, tp_lat;    /* the tp group's link */
    double slow;             /* ranks beyond the devices: they share them */
    int cores;               /* a measured machine's (the profile's), else 1 */
} pt_plan_rates;

/* Module `kind`'s (pt_module_kind) F, B, W seconds of one micro-batch (N
 * rows) under recompute mode rec in layout l, measured (cl's profile) or
 * modelled at rates r, and the tp collectives among them (*tpc). */
void pt_plan_module_times(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                          const pt_plan_rates *r, int kind, double N, int rec, double *f, double *b,
                          double *w, double *tpc);
/* A dp or ZeRO group's collective (op: PT_PROFILE_ALLREDUCE, _ALLGATHER or
 * _REDUCE_SCATTER, in place on `bytes`) over n ranks linked by k, or a
 * point-to-point (PT_PROFILE_P2P, n 2): the profile's own table on a
 * measured machine, scaled to the layout's oversubscription `slow`; else
 * the ring over the link. */
double pt_plan_coll_s(const pt_cluster *cl, double slow, int op, int n, double bytes,
                      const pt_link *k);
/* A link's bandwidth at the cluster's comm efficiency. */
double pt_plan_link_bw(const pt_cluster *cl, const pt_link *k);

/* Ring collective seconds over n ranks of `bytes` (the whole buffer), on a
 * link with bandwidth bw (already times the comm efficiency) and latency. */
double pt_plan_allreduce_s(int n, double bytes, double bw, double lat);
double pt_plan_allgather_s(int n, double bytes, double bw, double lat);
/* The link a group of n ranks at stride `stride` in the mesh crosses. */
const pt_link *pt_plan_group_link(const pt_cluster *cl, int n, int stride);
/* Bytes of an element of activations and gradients: 2 for bf16, 4 fp32. */
int pt_plan_bf16(const pt_config *c);
/* Model flops of one step (the MFU numerator; formula in time.c). */
double pt_plan_model_flops(const pt_config *c);

#endif
