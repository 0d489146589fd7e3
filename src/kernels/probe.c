/* The speed probe: how fast this core multiplies right now.
 *
 * A shared host's speed moves from one second to the next (on the 2-core
 * development machine a one-thread 512^3 product's fastest of five went
 * between 42 and 99 GFLOP/s within a minute, with no steal time reported),
 * so a time measured at one moment says little about another. The probe is
 * a fixed one-thread product through pt_matmul_forward, short enough (about
 * 10 ms) to take beside every measurement: calibrate scales its figures to
 * the probes' median, and a training run with log.probe logs it after each
 * step, so that a slow step can be told from a slow machine. */
#include "partrain/kernels.h"

#include "partrain/core.h"

enum { PROBE_M = 256, PROBE_N = 1152, PROBE_K = 384 }; /* the small config's qkv */

size_t pt_speed_probe_floats(void) {
    return (size_t)PROBE_M * PROBE_N + (size_t)PROBE_M * PROBE_K + (size_t)PROBE_K * PROBE_N;
}

double pt_speed_probe(float *buf) {
    int threads = pt_kernels_threads();
    pt_kernels_set_threads(1);
    float *out = buf, *inp = out + (size_t)PROBE_M * PROBE_N, *w = inp + (size_t)PROBE_M * PROBE_K;
    double best = 0;
    for (int r = 0; r < 4; r++) { /* the first warms the caches */
        double t0 = pt_time_s();
        pt_matmul_forward(out, inp, w, NULL, PROBE_M, PROBE_K, PROBE_N);
        double t = pt_time_s() - t0;
        if (r == 1 || (r > 1 && t < best)) best = t;
    }
    pt_kernels_set_threads(threads);
    return 2.0 * PROBE_M * PROBE_N * PROBE_K / (best > 0 ? best : 1e-9);
}
