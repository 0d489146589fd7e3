/* Private to partrain calibrate (calibrate*.c): one run's effort and
 * state, and what its parts share. calibrate.c runs the whole measurement
 * and owns the efforts and the built-in shapes; calibrate_time.c times a
 * pass (repetitions, cache eviction, a group's lockstep) and keeps the
 * speed probe; calibrate_comm.c measures the collectives,
 * calibrate_kernels.c the memory bandwidth, elementwise and optimizer
 * rates and the matrix products, calibrate_modules.c the modules' passes
 * alone, under load and as tensor-parallel shards; calibrate_cache.c
 * writes the profile and keeps the cache.
 *
 * Not here: the public interface (partrain/calibrate.h). */
#ifndef PT_CALIBRATE_IMPL_H
#define PT_CALIBRATE_IMPL_H

#include <stdint.h>

#include "partrain/calibrate.h"
#include "partrain/comm.h"

/* The effort of one run: quick (tests, a few seconds) or full (< 2 min on
 * 2 cores; calibrate.c's effort_of). */
typedef struct {
    int quick;
    double target_s;                  /* repeat a measurement until this much time has passed */
    int min_reps;                     /* and at least this often */
    double gemm_max_flop;             /* skip products dearer than this (2 m n k) */
    double fwd_max_flop;              /* skip micro-batches whose block + head forward is dearer */
    int max_mult;                     /* tokens = seq_len x 1, 2, 4, .. max_mult */
    size_t comm_max_bytes, comm_step; /* sizes 4 KiB, x step, .. max */
    size_t p2p_max_bytes;             /* and the point-to-point's beyond, to this */
    int comm_rounds;
    size_t stream_floats; /* copy, elementwise and optimizer buffers: beyond
                           * the caches, as a model's state is (32 MiB ones
                           * copied at 62 GB/s on an AMD EPYC host, where
                           * gpt2's update moved 35) */
} effort;

typedef void (*pass_fn)(void *arg);
/* Seconds of fn(arg) by one of the timers below. */
typedef double (*timer_fn)(const effort *e, pass_fn fn, void *arg);

/* One run's state: the tables as measured, and the speed probe's. */
typedef struct {
    const effort *e;
    pt_profile *p;
    pt_calibration *c;
    int cap_gemm, cap_module, cap_comm;
    int threads[8]; /* thread counts timed: 1, 2, 4, .., max */
    int n_threads;
    /* the speed probe: its buffers, every rate it measured (and on how many
     * cores at once), and the rate beside each table entry (parallel to
     * gemm[] and module[]), on the entry's threads */
    float *probe_buf;
    struct probe_rec {
        double rate;
        int cores;
    } * probes;
    double *probe_gemm, *probe_module, probe_stream;
    int n_probes, cap_probes, cap_probe_gemm, cap_probe_module, n_gemm_probed, n_module_probed;
} calib;

/* ---- timing (calibrate_time.c) ---- */

/* Fastest seconds of fn(arg): repeated until e's time target, at least
 * min_reps times, after a warm-up (once, no warm-up, when quick). */
double pt_calib_time_min(const effort *e, pass_fn fn, void *arg);
/* fb's time over fa's, the two run in alternation: the median of the
 * pairs' differences (reps pairs when > 0, else as pt_calib_time_min). */
double pt_calib_time_paired(const effort *e, int reps, pass_fn fa, void *aa, pass_fn fb, void *ab);
/* How often a group's passes run (after a warm-up), the same on every rank. */
int pt_calib_fixed_reps(const effort *e);
/* Every timed repetition after a write to more than a last-level cache
 * (on), or not; its buffer freed (a forked rank's, the run's at its end). */
void pt_calib_set_evict(int on);
void pt_calib_evict(void);
void pt_calib_evict_free(void);
/* A group's ranks start each timed run together (a barrier on c; NULL
 * outside a group); the first barrier's failure, for the rank's exit. */
void pt_calib_set_lockstep(pt_comm *c);
pt_status pt_calib_lockstep_err(void);
void pt_calib_start_together(void);
int pt_calib_cmp_double(const void *a, const void *b);
/* n pseudo-random floats of seed in [-0.05, 0.05). */
void pt_calib_fill(float *x, size_t n, uint32_t seed);
/* item (size bytes) appended to the growing array *arr of *n (*cap room). */
pt_status pt_calib_push(void **arr, int *n, int *cap, size_t size, const void *item);

/* ---- the speed probe (calibrate_time.c) ---- */

pt_status pt_calib_probe_init(calib *k);
void pt_calib_probe_free(calib *k);
/* A rate the probe measured on `cores` cores at once, kept. */
pt_status pt_calib_keep_probe(calib *k, int cores, double rate);
/* The probe's rate now on `cores` cores at once (the slowest's), kept. */
pt_status pt_calib_probe(calib *k, int cores, double *rate);
/* Every probed figure scaled to the median of the probes on as many cores. */
pt_status pt_calib_probe_rescale(calib *k);

/* ---- the measurements ---- */

/* The shm backend's collectives and point-to-point, 2 and 4 forked ranks
 * (calibrate_comm.c). */
pt_status pt_calib_measure_comm(calib *k);
/* Memory bandwidth, elementwise and optimizer rates on one thread; the
 * matrix products of the models' linears by row count and thread count
 * (calibrate_kernels.c). */
pt_status pt_calib_measure_stream(calib *k);
pt_status pt_calib_measure_gemm(calib *k, const pt_model_config *models, int n_models);
/* A shape's modules alone; as tp shards in groups and under load, before
 * any thread of the parent starts (calibrate_modules.c). */
pt_status pt_calib_measure_model(calib *k, const pt_model_config *shape);
pt_status pt_calib_measure_groups(calib *k, const pt_model_config *shape);

/* The shapes a run times (the options' or the built-in ones; calibrate.c). */
void pt_calib_models_of(const pt_calibrate_options *o, const pt_model_config **models, int *n);

#endif
