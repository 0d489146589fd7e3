/* partrain calibrate: the measurements behind calibrate.h, the profile's
 * JSON and the cache.
 *
 * Every number comes from the code a training run executes: pt_matmul_forward
 * for the matrix products, the model's one-module range passes
 * (pt_model_forward_range, _backward_range split, _backward_weight_range)
 * for the modules, the kernels' GELU and optimizer updates, pt_comm_time
 * over the shm backend for the collectives. A measurement is the fastest
 * of repetitions after one warm-up, repeated until a time target is reached
 * (at least three, or one after a warm-up that alone passed the target):
 * the fastest within that fraction of a second, because an interruption
 * only ever adds time. A module's repetitions each begin with the caches
 * evicted, as a step's modules find them (evict_caches).
 *
 * The speed probe (kernels.h's pt_speed_probe). A shared host's speed also
 * moves from one second to the next, and the fastest repetition of
 * whatever moment an item was measured in is not what a training run of
 * minutes sees. So each measurement is taken next to a probe and scaled, at
 * the end, to the probes' median over the whole run: the profile describes the machine at its
 * median speed, which is what a step's median measures, and records that median (probe_flops_s) so
 * that a later run can tell how fast the machine is against it (partrain calibrate --probe). The
 * cores' speeds move apart (bench/bench_cores), and a product on n threads waits for the slowest:
 * a measurement on n threads is probed on n cores at once (pt_speed_probe_cores, the slowest's
 * rate) and scaled to the median of such probes, so that it describes the median speed of n
 * threads, below one core's. The collectives are not scaled: they run in forked ranks, and copies
 * do not move with a product's rate.
 *
 * Tensor-parallel shards are timed in a real group of forked ranks, and
 * whole modules again with a rank on every core (the groups' section).
 *
 * This file runs the whole measurement (the phases in order, the cluster
 * description of this machine); the parts are calibrate_time.c (timing
 * and the probe), calibrate_comm.c, calibrate_kernels.c,
 * calibrate_modules.c and calibrate_cache.c (the profile's file and the
 * cache), behind calibrate_impl.h.
 *
 * Not here: the mpi backend, bf16 (partrain's CPU runtime has none:
 * peak_flops.bf16 is 0), sequence parallelism's own shard times (its
 * layouts take the plain shard's). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "calibrate_impl.h"
#include "partrain/kernels.h"

/* The shipped CPU configs' shapes: configs/default.json's, small.json's and
 * gpt2.json's (GPT-2 small at T 64). Until 2026-12-04 the third was GPT-2
 * small at T 1024, which no config uses: its head alone (80 GFLOP a
 * forward) took half of a run that then passed two minutes on a slow
 * host (121 s), while configs/gpt2.json was planned from the products. */
static const pt_model_config builtin_models[] = {
    {.n_layer = 4, .n_embd = 192, .n_head = 6, .vocab_size = 256, .seq_len = 128},
    {.n_layer = 6, .n_embd = 384, .n_head = 6, .vocab_size = 256, .seq_len = 256},
    {.n_layer = 12, .n_embd = 768, .n_head = 12, .vocab_size = 50257, .seq_len = 64},
};
#define N_BUILTIN (int)(sizeof builtin_models / sizeof builtin_models[0])

/* A run's effort, each knob's quick and full value side by side: quick
 * for the tests (a few seconds), full under two minutes on 2 cores. */
static effort effort_of(int quick) {
    return (effort){.quick = quick,
                    .target_s = quick ? 0.005 : 0.10,
                    .min_reps = quick ? 0 : 3,
                    .gemm_max_flop = quick ? 0.3e9 : 10e9,
                    .fwd_max_flop = quick ? 0.5e9 : 40e9,
                    .max_mult = quick ? 2 : 8,
                    .comm_max_bytes = quick ? 1u << 20 : 16u << 20,
                    .comm_step = quick ? 16 : 4,
                    .p2p_max_bytes = quick ? 1u << 20 : 256u << 20,
                    .comm_rounds = quick ? 1 : 3,
                    .stream_floats = quick ? 1u << 20 : 64u << 20};
}

static int count_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void pt_calibrate_identity(char cpu[PT_PLAN_NAME_MAX], char binary[PT_PLAN_NAME_MAX]) {
    pt_cpu_model_name(cpu, PT_PLAN_NAME_MAX);
    struct stat st;
    if (stat("/proc/self/exe", &st) == 0)
        snprintf(binary, PT_PLAN_NAME_MAX, "size %lld mtime %lld.%09ld", (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    else
        snprintf(binary, PT_PLAN_NAME_MAX, "unknown binary");
}

static void progress(const pt_calibrate_options *o, const char *what) {
    if (!o->progress) return;
    fprintf(o->progress, "partrain calibrate: %s\n", what);
    fflush(o->progress);
}

void pt_calib_models_of(const pt_calibrate_options *o, const pt_model_config **models, int *n) {
    *models = o->models ? o->models : builtin_models;
    *n = o->models ? o->n_models : N_BUILTIN;
    if (o->quick && *n > 1) *n = 1;
}

static pt_status check_options(const pt_calibrate_options *o) {
    if (o->models && (o->n_models < 1 || o->n_models > PT_CALIBRATE_MAX_MODELS))
        return pt_error_set(PT_ERR_INVALID, "calibrate: %d model shapes (expected 1..%d)",
                            o->n_models, PT_CALIBRATE_MAX_MODELS);
    if (o->threads < 0 || o->threads > 1024)
        return pt_error_set(PT_ERR_INVALID, "calibrate: threads %d (expected 0..1024)", o->threads);
    for (int i = 0; o->models && i < o->n_models; i++) {
        pt_model_config mc = o->models[i];
        mc.n_layer = 1;
        PT_CHECK(pt_model_config_validate(&mc));
    }
    return PT_OK;
}

static void fill_cluster(pt_calibration *c) {
    pt_profile *p = &c->profile;
    pt_cluster *cl = &c->cluster;
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(cl->name, sizeof cl->name, "%s (calibrated)", host);
    cl->nodes = 1;
    cl->devices_per_node = p->cores;
    snprintf(cl->device.name, sizeof cl->device.name, "%s", p->cpu);
    for (int i = 0; i < p->n_gemm; i++) /* one device is one core */
        if (p->gemm[i].threads == 1 && p->gemm[i].flops_s > cl->device.peak_flops_fp32)
            cl->device.peak_flops_fp32 = p->gemm[i].flops_s;
    cl->device.peak_flops_bf16 = 0; /* the CPU runtime has no bf16 */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    cl->device.memory_bytes = pages > 0 && page > 0 ? (double)pages * page / p->cores : 0;
    cl->device.memory_bw = p->memory_bw;
    /* links from shm's point-to-point: latency of the smallest message,
     * bandwidth of the largest */
    double lat = 0, bw = 0, small = 0, large = 0;
    for (int i = 0; i < p->n_comm; i++) {
        const pt_profile_comm *e = &p->comm[i];
        if (e->op != PT_PROFILE_P2P) continue;
        if (small == 0 || e->bytes < small) small = e->bytes, lat = e->seconds;
        if (e->bytes > large) large = e->bytes, bw = e->bytes / e->seconds;
    }
    cl->intra_node = cl->inter_node = (pt_link){.bw = bw, .latency = lat};
    cl->profile = p;
}

pt_status pt_calibrate(const pt_calibrate_options *o, pt_calibration *out) {
    memset(out, 0, sizeof *out);
    PT_CHECK(check_options(o));
    double t_start = pt_time_s();
    int threads_before = pt_kernels_threads();
    effort ef = effort_of(o->quick); /* the forked ranks' copies of this stack read it too */
    calib k = {.e = &ef, .p = &out->profile, .c = out};
    pt_profile *p = &out->profile;
    pt_calibrate_identity(p->cpu, p->binary);
    p->cores = count_cores();
    int max_t = o->threads ? o->threads : p->cores;
    for (int t = 1; t < max_t && k.n_threads < 7; t *= 2) k.threads[k.n_threads++] = t;
    k.threads[k.n_threads++] = max_t;
    const pt_model_config *models;
    int n_models;
    pt_calib_models_of(o, &models, &n_models);

    /* the probe's buffers now, for the forked group ranks too; its first
     * product comes after the forks: pt_launch wants a parent without
     * threads of its own, and a product may start BLAS threads */
    pt_status st = pt_calib_probe_init(&k);
    double t0 = pt_time_s();
    progress(o, "collectives and point-to-point (shm, 2 and 4 ranks)");
    if (st == PT_OK) st = pt_calib_measure_comm(&k);
    out->phase_s[0] = pt_time_s() - t0;
    t0 = pt_time_s();
    for (int i = 0; st == PT_OK && i < n_models; i++) {
        char what[160];
        snprintf(what, sizeof what,
                 "modules of C%d NH%d V%d T%d on every core, tensor-parallel shards of 2 and 4",
                 models[i].n_embd, models[i].n_head, models[i].vocab_size, models[i].seq_len);
        progress(o, what);
        st = pt_calib_measure_groups(&k, &models[i]);
    }
    out->phase_s[4] = pt_time_s() - t0;
    if (st == PT_OK) {
        t0 = pt_time_s();
        progress(o, "memory bandwidth, elementwise, optimizers");
        st = pt_calib_measure_stream(&k);
        out->phase_s[1] = pt_time_s() - t0;
    }
    if (st == PT_OK) {
        t0 = pt_time_s();
        progress(o, "matrix products");
        st = pt_calib_measure_gemm(&k, models, n_models);
        out->phase_s[2] = pt_time_s() - t0;
    }
    t0 = pt_time_s();
    for (int i = 0; st == PT_OK && i < n_models; i++) {
        char what[128];
        snprintf(what, sizeof what, "modules of C%d NH%d V%d T%d", models[i].n_embd,
                 models[i].n_head, models[i].vocab_size, models[i].seq_len);
        progress(o, what);
        st = pt_calib_measure_model(&k, &models[i]);
    }
    out->phase_s[3] = pt_time_s() - t0;
    pt_calib_evict_free();
    pt_kernels_set_threads(threads_before);
    if (st == PT_OK) st = pt_calib_probe_rescale(&k);
    pt_calib_probe_free(&k);
    if (st != PT_OK) {
        pt_calibration_deinit(out);
        return st;
    }
    fill_cluster(out);
    out->seconds = pt_time_s() - t_start;
    return PT_OK;
}

pt_status pt_calibrate_probe(double seconds, double *median, double *lo, double *hi) {
    if (!(seconds > 0 && seconds <= 3600))
        return pt_error_set(PT_ERR_INVALID, "calibrate: probe seconds %g (expected (0, 3600])",
                            seconds);
    pt_profile p = {0};
    pt_calibration c = {0};
    effort ef = effort_of(0);
    calib k = {.e = &ef, .p = &p, .c = &c};
    pt_status st = pt_calib_probe_init(&k);
    double start = pt_time_s(), r;
    while (st == PT_OK && (k.n_probes < 5 || pt_time_s() - start < seconds))
        st = pt_calib_probe(&k, 1, &r);
    if (st == PT_OK) st = pt_calib_probe_rescale(&k); /* no tables: only the median */
    pt_calib_probe_free(&k);
    PT_CHECK(st);
    *median = p.probe_flops_s, *lo = c.probe_lo, *hi = c.probe_hi;
    return PT_OK;
}

void pt_calibration_deinit(pt_calibration *c) {
    if (!c) return;
    free(c->profile.gemm);
    free(c->profile.module);
    free(c->profile.comm);
    memset(c, 0, sizeof *c);
}
