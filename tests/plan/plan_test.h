/* Shared by the planner's tests: a hand-built cluster of nodes x dpn
 * devices (round numbers, every efficiency 0.5) so that expected times
 * and fits are computed in the test from the formula text. */
#ifndef PT_PLAN_TEST_H
#define PT_PLAN_TEST_H

#include <stdio.h>
#include <string.h>

#include "partrain/plan.h"

static inline pt_cluster plan_test_cluster(int nodes, int dpn, double mem) {
    pt_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "hand");
    c.nodes = nodes, c.devices_per_node = dpn;
    c.device.peak_flops_fp32 = 1e12, c.device.peak_flops_bf16 = 1e13;
    c.device.memory_bytes = mem, c.device.memory_bw = 1e11;
    c.intra_node = (pt_link){1e10, 1e-6};
    c.inter_node = (pt_link){1e9, 1e-5};
    c.efficiency = (pt_efficiency){0.5, 0.5, 0.5};
    return c;
}

#endif
