/* The pipeline schedules' list generators, one file each (gpipe.c,
 * onef1b.c, interleaved.c, zb1.c, zbv.c), behind schedule.c's dispatcher.
 * Each writes rank r's passes into out (room for 3 * m * v) and returns
 * their count (-1 when out of memory, the last error set); arguments are already checked
 * (schedule.c). Pure functions of (m, p, r[, v]): every rank computes its own list, no
 * communication.
 *
 * Not here: validation, in_flight and last_pass (schedule.c counts them
 * from the list), the simulator. */
#ifndef PARTRAIN_PIPELINE_IMPL_H
#define PARTRAIN_PIPELINE_IMPL_H

#include "partrain/parallel.h"

int pt_pipe_none(pt_pass *out, int m);
int pt_pipe_gpipe(pt_pass *out, int m, int p, int r);
int pt_pipe_1f1b(pt_pass *out, int m, int p, int r);
int pt_pipe_interleaved(pt_pass *out, int m, int p, int r, int v);
int pt_pipe_zb1(pt_pass *out, int m, int p, int r);
int pt_pipe_zbv(pt_pass *out, int m, int p, int r);

#endif
