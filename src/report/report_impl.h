/* Private to the report's files (report_read.c: the metrics parser;
 * report_data.c: the data for the page; report_html.c: the file): a run as
 * read, in fixed-size tables where the file's size does not matter and
 * growing series where it does. */
#ifndef PT_REPORT_IMPL_H
#define PT_REPORT_IMPL_H

#include <stdint.h>

#include "partrain/report.h"

#define RP_NPARTS    7  /* compute, dp, tp, pp, zero, optimizer, other (train.h) */
#define RP_NGROUPS   4  /* dp, tp, pp, zero */
#define RP_NMEM      7  /* params, grads, optim, acts, comm, scratch, total */
#define RP_MAX_RANKS 64 /* PT_STEP_MAX_RANKS: the most ranks a line lists */
#define RP_MAX_NOTES 16

extern const char *const rp_part_names[RP_NPARTS];
extern const char *const rp_group_names[RP_NGROUPS];
extern const char *const rp_mem_names[RP_NMEM];

typedef struct {
    double *v;
    size_t n, cap;
} rp_series;

/* The step-time parts and traffic of a run's steps, summed (means are
 * sums / n): per rank while the lines list ranks (world <= 64). */
typedef struct {
    size_t n;  /* steps added */
    int world; /* ranks of the per-rank sums (0: none) */
    double rank_part[RP_MAX_RANKS][RP_NPARTS], rank_step[RP_MAX_RANKS];
    double min[RP_NPARTS], max[RP_NPARTS], mean[RP_NPARTS];
    double step_min, step_max, step_mean;
    long slowest[RP_MAX_RANKS]; /* steps in which the rank's step was the longest */
    int has_group[RP_NGROUPS];
    double bytes[RP_NGROUPS], comm_ms[RP_NGROUPS], overlap_ms[RP_NGROUPS];
} rp_parts;

struct pt_report_run {
    char *name;   /* as given */
    char *dir;    /* the metrics file's folder ("" for parsed text) */
    char *record; /* the last run record's "run" object as JSON (NULL: none) */
    int records;  /* run records read (one per start: a resumed run has several) */
    char layout[80];
    int world;
    /* one entry per step line (NaN where a field is missing) */
    rp_series step, loss, lr, grad_norm, step_ms, tokens_per_s, elapsed_s, bubble;
    double bubble_formula; /* NaN: none */
    rp_series val_step, val_loss, val_elapsed;
    double val_ms, save_ms; /* summed over the validations and saves */
    long nval_ms, nsaves;
    /* the parts: `main` over the steps after each start's first; `warm`
     * over those first steps (used when there is nothing else) */
    rp_parts main, warm;
    int warm_next; /* the next step line is a start's first */
    /* memory peaks, max over steps: per rank (mem_world of them), and the
     * max over ranks of the lines' "mem" */
    int mem_world;
    double mem_rank[RP_MAX_RANKS][RP_NMEM], mem_max[RP_NMEM];
    int has_mem;
    /* reading */
    long lines, bad, first_bad, unknown, first_unknown;
    int cut; /* the last line had no newline and was not JSON */
    long layout_changes;
    char *trace; /* the trace file found (NULL: none) */
    double trace_bytes;
    char notes[RP_MAX_NOTES][320];
    int nnotes;
};

/* Append v (s grows; 0 when out of memory). */
int rp_push(rp_series *s, double v);

#endif
