/* The pipeline schedules' list generators, one file each (gpipe.c,
 * onef1b.c, interleaved.c, zb1.c, zbv.c), which schedule.c's descriptor
 * table (pt_sched.list, .lists) points at. Each writes rank r's passes
 * into out (room for 3 * m * v) and returns their count (-1 when out of
 * memory, the last error set); arguments are already checked
 * (pt_schedule_check). Pure functions of (m, p, r, v): every rank computes
 * its own list, no communication; a schedule of one chunk a rank ignores v.
 *
 * Not here: validation, in_flight and last_pass (schedule.c counts them
 * from the list), the simulator (simulate.c). */
#ifndef PARTRAIN_PIPELINE_IMPL_H
#define PARTRAIN_PIPELINE_IMPL_H

#include "partrain/pipeline.h"

int pt_sched_none(pt_pass *out, int m, int p, int r, int v);
int pt_sched_gpipe(pt_pass *out, int m, int p, int r, int v);
int pt_sched_1f1b(pt_pass *out, int m, int p, int r, int v);
int pt_sched_interleaved(pt_pass *out, int m, int p, int r, int v);
int pt_sched_zb1(pt_pass *out, int m, int p, int r, int v);
int pt_sched_zbv(pt_pass *out, int m, int p, int r, int v);
/* zbv's lists of every rank from one simulation: out[k] (room for 6 m, or
 * NULL: not kept) and its count n[k]; 0, or -1 when out of memory. */
int pt_sched_zbv_all(pt_pass *const *out, int *n, int m, int p, int v);

/* The stage maps (pipeline.h, pt_sched.stage and .rank): chunk c of rank r
 * is virtual stage c p + r in order (interleaved.c; c = 0 at one chunk a
 * rank), or r then 2p-1-r in a V (zbv.c). */
int pt_sched_stage_seq(int p, int r, int c);
int pt_sched_rank_seq(int p, int g, int *c);
int pt_sched_stage_v(int p, int r, int c);
int pt_sched_rank_v(int p, int g, int *c);

#endif
