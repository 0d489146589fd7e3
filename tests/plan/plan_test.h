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

/* The defaults with a GPT-2 shaped model of L layers, width C, NH heads,
 * vocabulary V, T tokens, and a global batch of B sequences. */
static inline pt_config plan_test_model(int L, int C, int NH, int V, int T, int B) {
    pt_config c;
    pt_config_defaults(&c);
    c.model =
        (pt_model_config){.n_layer = L, .n_embd = C, .n_head = NH, .vocab_size = V, .seq_len = T};
    c.train.batch_size = B;
    return c;
}

#endif
