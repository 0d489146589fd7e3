/* The pipeline schedules' list generators, one file each (gpipe.c,
 * onef1b.c, interleaved.c, zb1.c, zbv.c), behind schedule.c's dispatcher.
 * Each writes rank r's passes into out (room for 3 * m * v) and returns
 * their count (-1 when out of memory, the last error set); arguments are already checked
 * (schedule.c). Pure functions of (m, p, r[, v]): every rank computes its own list, no
 * communication.
 *
 * Not here: validation, in_flight and last_pass (schedule.c counts them
 * from the list). */
#ifndef PARTRAIN_PIPELINE_IMPL_H
#define PARTRAIN_PIPELINE_IMPL_H

#include "partrain/parallel.h"

int pt_pipe_none(pt_pass *out, int m);
int pt_pipe_gpipe(pt_pass *out, int m, int p, int r);
int pt_pipe_1f1b(pt_pass *out, int m, int p, int r);
int pt_pipe_interleaved(pt_pass *out, int m, int p, int r, int v);
int pt_pipe_zb1(pt_pass *out, int m, int p, int r);
int pt_pipe_zbv(pt_pass *out, int m, int p, int r);
/* zbv's lists of every rank from one simulation: out[k] (room for 6 m, or
 * NULL: not kept) and its count n[k]; 0, or -1 when out of memory. */
int pt_pipe_zbv_all(pt_pass *const *out, int *n, int m, int p);

/* The simulator over given lists (schedule.c): s[0..p-1] are ranks 0..p-1
 * of one schedule (name, m, p, v from s[0]), lent. What
 * pt_schedule_simulate runs once it has built them; tests hand it broken
 * lists; the stage cut (stages.c) weighs cuts with it. scale: NULL, or p x
 * v factors, virtual stage g's passes taking scale[g] times tf, tb, tw. */
pt_status pt_pipe_simulate(const pt_schedule *s, double tf, double tb, double tw,
                           const double *scale, double *makespan, double *busy);

#endif
