/* partrain calibrate: measure this machine into a profile (plan.h's
 * pt_profile) and write it as a cluster description of this machine
 * (docs/plan.md), which the planner reads like any other cluster file.
 *
 * What is measured, each with the code the trainer runs (kernels, model
 * passes, collectives): matrix products by shape class and thread count;
 * per module kind and model shape, forward, input-gradient (B) and
 * weight-gradient (W) seconds per micro-batch and the extra backward time
 * of selective and full recomputation, alone, with a rank on every core,
 * and as tp 2 and 4 shards in a real group (ranks forked by pt_launch); a
 * streaming copy (memory bandwidth), an elementwise pass, AdamW and SGD
 * per parameter; the shm backend's collectives and point-to-point per size
 * and group size; every figure but the collectives scaled to a speed
 * probe's median over the run (kernels.h's pt_speed_probe; a figure on n
 * threads to the median of probes on n cores at once).
 *
 * Lifecycle: pt_calibrate fills a pt_calibration (caller-owned) ->
 * pt_calibrate_write / pt_calibration_to_json -> pt_calibration_deinit.
 * pt_calibrate_cached does all of it behind a cache keyed by the CPU model,
 * the binary and the options.
 *
 * Not here: reading cluster files (plan.h's pt_cluster_load_file), the
 * planner's use of the numbers. Layer: above train (it runs the model and
 * the comm layer); the planner library does not depend on it. */
#ifndef PARTRAIN_CALIBRATE_H
#define PARTRAIN_CALIBRATE_H

#include <stdio.h>

#include "partrain/model.h"
#include "partrain/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PT_CALIBRATE_MAX_MODELS 16

typedef struct {
    /* Model shapes whose modules are timed (lent; n_layer is ignored: each
     * module kind is timed once). NULL: the built-in default (C192 NH6 V256
     * T128, configs/default.json's), small (C384 NH6 V256 T256) and gpt2
     * (C768 NH12 V50257 T1024). At most PT_CALIBRATE_MAX_MODELS. */
    const pt_model_config *models;
    int n_models;
    int quick;      /* a few seconds: the first shape only, fewer sizes and repetitions */
    int threads;    /* most BLAS threads timed; 0: the cores this process may run on */
    FILE *progress; /* one line per phase as it starts (NULL: quiet) */
} pt_calibrate_options;

/* What pt_calibrate measured. cluster is this machine as docs/plan.md
 * describes it (one node, devices_per_node = cores, the device one core),
 * cluster.profile points at profile; the tables are malloc'd and freed by
 * pt_calibration_deinit. */
typedef struct {
    pt_cluster cluster;
    pt_profile profile;
    double seconds;    /* wall time of the whole measurement */
    double phase_s[5]; /* of each phase: comm, memory+elementwise+optimizer, gemm, modules,
                          tensor-parallel shards */
    /* The backward's transposed products (input gradient dout W^T, weight
     * gradient inp^T dout) at 512 rows on one thread: their rate over the
     * forward's at the same shape, lowest and highest over the shapes (the
     * profile keeps only the forward's; the modules' times include them). */
    double transpose_lo[2], transpose_hi[2];
    /* The one-core speed probe over the run: slowest and fastest rate, how
     * many (profile.probe_flops_s holds their median, to which every
     * one-thread figure was scaled). */
    double probe_lo, probe_hi;
    int n_probes;
    /* The median of the probes on the most threads timed, all at once (the
     * slowest core's rate each; 0 when only one thread was timed). */
    double probe_all;
    int probe_all_cores;
    /* The groups' micro-batch sizes timed a second time, their entries
     * outliers against the neighbouring sizes' (a slow spell of the host). */
    int n_retimed;
} pt_calibration;

/* Measure this machine. Runs ranks with pt_launch (so call it from a
 * single-threaded process, before anything starts threads of its own) and
 * leaves the kernels' thread count as it found it. Errors: bad options
 * (one line naming the field and value), allocation, a rank that failed. */
pt_status pt_calibrate(const pt_calibrate_options *o, pt_calibration *out);
void pt_calibration_deinit(pt_calibration *c);

/* The speed probe alone, repeated for `seconds` (at least 5 times): its
 * median, slowest and fastest rate in flop/s, to set against a profile's
 * probe_flops_s (how fast this machine is now against when it was
 * calibrated). */
pt_status pt_calibrate_probe(double seconds, double *median, double *lo, double *hi);

/* The calibration as docs/plan.md's JSON, pt_cluster_to_json's (malloc'd;
 * NULL when out of memory). */
char *pt_calibration_to_json(const pt_calibration *c);
/* Whether path can take the profile (pt_file_check_output: a regular file
 * or nothing yet, in a folder that exists and is writable). One line
 * naming the path otherwise. Cheap: called before measuring, so that a bad
 * --out fails at once. */
pt_status pt_calibrate_check_out(const char *path);
/* Write the JSON to path atomically (pt_file_write_atomic: a temporary
 * beside it, then rename): on any error, one line naming path, which is
 * untouched, and no temporary is left. */
pt_status pt_calibrate_write(const pt_calibration *c, const char *path);

/* The cache file for these options on this machine and binary:
 * $XDG_CACHE_HOME/partrain/profile-<hash>.json, else
 * $HOME/.cache/partrain/...; the hash covers the CPU model, the binary
 * (size and modification time of /proc/self/exe), the model shapes, quick
 * and threads. Creates the cache folder when missing. Errors: neither
 * variable set, the path longer than n, a folder that cannot be made. */
pt_status pt_calibrate_cache_path(const pt_calibrate_options *o, char *path, size_t n);
/* The cache path (as pt_calibrate_cache_path) holding a valid profile for
 * these options: one already there (it parses, and its profile's cpu and
 * binary are this machine's and this binary's: pt_cluster_load_file
 * accepts it and its profile names both) or a new measurement written
 * there. *measured: 1 when it measured (NULL: not
 * wanted). */
pt_status pt_calibrate_cached(const pt_calibrate_options *o, char *path, size_t n, int *measured);

/* This process's identity as the profile records it: the CPU model
 * ("model name" of /proc/cpuinfo) and the binary. */
void pt_calibrate_identity(char cpu[PT_PLAN_NAME_MAX], char binary[PT_PLAN_NAME_MAX]);

#ifdef __cplusplus
}
#endif

#endif
