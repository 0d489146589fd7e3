/* The speed probe: how fast this core (or these cores) multiplies right now.
 *
 * A shared host's speed moves from one second to the next (on the 2-core
 * development machine a one-thread 512^3 product's fastest of five went
 * between 42 and 99 GFLOP/s within a minute, with no steal time reported),
 * so a time measured at one moment says little about another. The probe is
 * a fixed one-thread product through pt_matmul_forward, short enough (about
 * 10 ms) to take beside every measurement: calibrate scales its figures to
 * the probes' median, and a training run with log.probe logs it after each
 * step, so that a slow step can be told from a slow machine.
 *
 * The cores' speeds move apart: on the same machine each core went between
 * about 66 and 81 GFLOP/s on its own, every few seconds, the two cores in
 * no common rhythm (bench_cores). A product split over n threads waits for
 * its slowest part, so pt_speed_probe_cores runs n probes at once, a
 * thread each, and reports the slowest: the speed an n-thread measurement
 * saw, where the one-thread probe saw one core's. */
#include "partrain/kernels.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "kernels_impl.h"
#include "partrain/core.h"

enum { PROBE_M = 256, PROBE_N = 1152, PROBE_K = 384 }; /* the small config's qkv */

size_t pt_speed_probe_floats(void) {
    return (size_t)PROBE_M * PROBE_N + (size_t)PROBE_M * PROBE_K + (size_t)PROBE_K * PROBE_N;
}

/* One probe at one thread (the caller's): its rate. */
static double probe_once(float *buf) {
    float *out = buf, *inp = out + (size_t)PROBE_M * PROBE_N, *w = inp + (size_t)PROBE_M * PROBE_K;
    double best = 0;
    for (int r = 0; r < 4; r++) { /* the first warms the caches */
        double t0 = pt_time_s();
        pt_matmul_forward(out, inp, w, NULL, PROBE_M, PROBE_K, PROBE_N);
        double t = pt_time_s() - t0;
        if (r == 1 || (r > 1 && t < best)) best = t;
    }
    return 2.0 * PROBE_M * PROBE_N * PROBE_K / (best > 0 ? best : 1e-9);
}

double pt_speed_probe(float *buf) {
    return pt_speed_probe_cores(buf, 1);
}

typedef struct {
    float *buf;
    atomic_int *go;
    double rate;
} probe_arg;

static void *probe_thread(void *arg) {
    probe_arg *a = arg;
    while (!atomic_load_explicit(a->go, memory_order_acquire)) sched_yield();
    a->rate = probe_once(a->buf);
    return NULL;
}

double pt_speed_probe_cores(float *buf, int n) {
    if (n < 1) n = 1;
    if (n > PT_KERNELS_MAX_THREADS) n = PT_KERNELS_MAX_THREADS;
    int threads = pt_kernels_threads();
    pt_kernels_set_threads(1); /* each probe's product on its own thread alone */
    probe_arg a[PT_KERNELS_MAX_THREADS];
    pthread_t tid[PT_KERNELS_MAX_THREADS];
    atomic_int go = 0;
    int started = 1; /* threads 1 .. started - 1 run; where one cannot start, fewer probes */
    for (; started < n; started++) {
        a[started] = (probe_arg){.buf = buf + (size_t)started * pt_speed_probe_floats(), .go = &go};
        if (pthread_create(&tid[started], NULL, probe_thread, &a[started]) != 0) break;
    }
    atomic_store_explicit(&go, 1, memory_order_release); /* all at once */
    double slowest = probe_once(buf);
    for (int i = 1; i < started; i++) {
        pthread_join(tid[i], NULL);
        if (a[i].rate < slowest) slowest = a[i].rate;
    }
    pt_kernels_set_threads(threads);
    return slowest;
}
