/* partrain calibrate: timing a pass and the speed probe (calibrate_impl.h;
 * the file comment of calibrate.c says why each is measured this way). A
 * measurement is the fastest of repetitions after one warm-up, repeated
 * until a time target is reached; a module's repetitions each begin with
 * the caches evicted; a group's ranks start each repetition together; a
 * recompute's extra is the median of paired differences. Every figure but
 * the collectives is scaled, at the end, to the probe's median on as many
 * cores as it kept busy.
 *
 * Not here: what is measured (the other calibrate files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate_impl.h"
#include "partrain/kernels.h"

/* A step runs every module in turn, so when one runs again the others have
 * pushed its weights and activations out of the caches (gpt2's 12 blocks
 * hold 340 MB of weights). Timed over and over, a module finds them warm:
 * gpt2's block at 256 tokens and 2 threads (AMD EPYC) took 8.70 ms a
 * forward and 16.6 ms a backward timed warm, 9.7 and 19.2 inside a
 * step's trace, 9.48 and 18.5 with the caches evicted before each
 * repetition. So while modules are timed (evict_on), every timed
 * repetition comes after a write to each line of EVICT_BYTES: more than a
 * last-level cache (sysconf's figure is the host's, not the core's, in a
 * VM: 508 MiB here). */
#define EVICT_BYTES ((size_t)256 << 20)
static int evict_on;    /* pt_calib_set_evict */
static char *evict_buf; /* this process's, from its first eviction on */

void pt_calib_evict(void) {
    if (!evict_on) return;
    if (!evict_buf && !(evict_buf = malloc(EVICT_BYTES))) {
        evict_on = 0; /* no memory for it: warm figures rather than a failure */
        return;
    }
    for (size_t i = 0; i < EVICT_BYTES; i += 64) evict_buf[i]++;
    __asm__ volatile("" : : "r"(evict_buf) : "memory"); /* keep the writes */
}

void pt_calib_set_evict(int on) {
    evict_on = on;
}

void pt_calib_evict_free(void) {
    free(evict_buf);
    evict_buf = NULL;
}

/* Fastest seconds of fn(arg) (see the file comment). */
double pt_calib_time_min(const effort *e, pass_fn fn, void *arg) {
    double w0 = pt_time_s();
    fn(arg);
    if (e->quick) return pt_time_s() - w0; /* the tests': one run, no warm-up */
    int min_reps = pt_time_s() - w0 > e->target_s ? 1 : e->min_reps;
    double best = 0, start = pt_time_s();
    for (int n = 0; n < 64 && (n < min_reps || pt_time_s() - start < e->target_s); n++) {
        pt_calib_evict();
        double t0 = pt_time_s();
        fn(arg);
        double t = pt_time_s() - t0;
        if (n == 0 || t < best) best = t;
    }
    return best;
}

int pt_calib_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* How often the groups' passes run (after a warm-up), the same on every rank. */
int pt_calib_fixed_reps(const effort *e) {
    return e->quick ? 1 : 2;
}

/* A group's ranks start each timed run together, after each one's cache
 * eviction (256 MiB written, tens of ms on a core). Otherwise rank 0 may
 * start while the others still evict: under load (a rank per core, no
 * collectives) part of its pass then runs with the other cores doing
 * something else than the same pass, and in a tp group it shares the
 * cores with the evictions and waits for them at its first collective,
 * timing both. NULL outside a group. */
static pt_comm *lockstep;
static pt_status lockstep_err; /* the first barrier's failure, for the rank's exit */

void pt_calib_set_lockstep(pt_comm *c) {
    lockstep = c;
}

pt_status pt_calib_lockstep_err(void) {
    return lockstep_err;
}

void pt_calib_start_together(void) {
    if (lockstep && lockstep_err == PT_OK) lockstep_err = pt_comm_barrier(lockstep);
}

/* fb's time over fa's, fa and fb run in alternation (one warm-up each):
 * the median of the pairs' differences, so that a slow spell of the host,
 * which slows a pair's two runs alike, cancels, and an outlier pair does
 * not count. `reps` pairs when reps > 0 (every rank of a group runs the
 * same passes), else as pt_calib_time_min repeats. */
double pt_calib_time_paired(const effort *e, int reps, pass_fn fa, void *aa, pass_fn fb, void *ab) {
    if (!e->quick) fa(aa), fb(ab);
    int n_min = reps > 0 ? reps : e->quick ? 1 : e->min_reps;
    int timed = reps == 0 && !e->quick; /* then also until twice the target */
    double d[64], start = pt_time_s();
    int n = 0;
    while (n < 64 && (n < n_min || (timed && pt_time_s() - start < 2 * e->target_s))) {
        pt_calib_evict();
        pt_calib_start_together();
        double t0 = pt_time_s();
        fa(aa);
        double ta = pt_time_s() - t0;
        pt_calib_evict();
        pt_calib_start_together();
        double t1 = pt_time_s();
        fb(ab);
        d[n++] = (pt_time_s() - t1) - ta;
    }
    qsort(d, (size_t)n, sizeof d[0], pt_calib_cmp_double);
    return n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]);
}

void pt_calib_fill(float *x, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
}

pt_status pt_calib_push(void **arr, int *n, int *cap, size_t size, const void *item) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 32;
        void *p = realloc(*arr, (size_t)nc * size);
        if (!p) return pt_error_set(PT_ERR_NOMEM, "calibrate: out of memory for the tables");
        *arr = p;
        *cap = nc;
    }
    memcpy((char *)*arr + (size_t)*n * size, item, size);
    (*n)++;
    return PT_OK;
}

pt_status pt_calib_probe_init(calib *k) {
    int cores = k->n_threads > 0 ? k->threads[k->n_threads - 1] : 1;
    size_t n = pt_speed_probe_floats() * (size_t)cores;
    k->probe_buf = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * n);
    if (!k->probe_buf) return pt_error_set(PT_ERR_NOMEM, "calibrate: probe buffers");
    pt_calib_fill(k->probe_buf, n, 9);
    return PT_OK;
}

void pt_calib_probe_free(calib *k) {
    pt_mem_free(k->probe_buf);
    free(k->probes);
    free(k->probe_gemm);
    free(k->probe_module);
}

/* A rate the probe measured on `cores` cores at once, into k->probes. */
pt_status pt_calib_keep_probe(calib *k, int cores, double rate) {
    struct probe_rec rec = {rate, cores};
    return pt_calib_push((void **)&k->probes, &k->n_probes, &k->cap_probes, sizeof rec, &rec);
}

/* The probe's rate now (flop/s) on `cores` cores at once (the slowest's:
 * what a measurement on as many threads sees), kept. Quick runs (the
 * tests', under the sanitizers too, where a probe costs a second) measure
 * it once and reuse it: nothing is scaled. */
pt_status pt_calib_probe(calib *k, int cores, double *rate) {
    *rate = k->e->quick && k->n_probes > 0 ? k->probes[0].rate
                                           : pt_speed_probe_cores(k->probe_buf, cores);
    return pt_calib_keep_probe(k, k->e->quick ? 1 : cores, *rate);
}

/* The median of the probes taken on `cores` cores at once (0: none), and
 * their lowest and highest. */
static double probe_median(const calib *k, int cores, double *lo, double *hi) {
    double *sorted = malloc(sizeof(double) * (size_t)(k->n_probes ? k->n_probes : 1));
    int n = 0;
    for (int i = 0; sorted && i < k->n_probes; i++)
        if (k->probes[i].cores == cores) sorted[n++] = k->probes[i].rate;
    if (n == 0) {
        free(sorted);
        return 0;
    }
    qsort(sorted, (size_t)n, sizeof(double), pt_calib_cmp_double);
    double med = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    if (lo) *lo = sorted[0], *hi = sorted[n - 1];
    free(sorted);
    return med;
}

static int clamp_cores(int t, int ncores) {
    return t < 1 ? 1 : t > ncores ? ncores : t;
}

/* Scale every probed figure to the median of the probes taken on as many
 * cores as it kept busy (the machine at its median speed for that many; the
 * one-core median is profile.probe_flops_s). */
pt_status pt_calib_probe_rescale(calib *k) {
    pt_profile *p = k->p;
    double lo = 0, hi = 0, ref = probe_median(k, 1, &lo, &hi);
    if (!(ref > 0)) return PT_OK; /* unscaled: still a measurement */
    k->c->probe_lo = lo;
    k->c->probe_hi = hi;
    k->c->n_probes = 0;
    for (int i = 0; i < k->n_probes; i++) k->c->n_probes += k->probes[i].cores == 1;
    p->probe_flops_s = ref;
    /* med[t]: the median on t cores at once, else the one-core median */
    int ncores = p->cores > 1 ? p->cores : 1;
    double *med = malloc(sizeof(double) * (size_t)(ncores + 1));
    if (!med) return pt_error_set(PT_ERR_NOMEM, "calibrate: probe medians");
    for (int t = 1; t <= ncores; t++) {
        double r = probe_median(k, t, NULL, NULL);
        med[t] = r > 0 ? r : ref;
        if (t > 1 && r > 0) k->c->probe_all = r, k->c->probe_all_cores = t;
    }
    /* an entry without a probe beside it (0: quick) stays as measured */
    for (int i = 0; i < p->n_gemm; i++)
        if (k->probe_gemm[i] > 0)
            p->gemm[i].flops_s *= med[clamp_cores(p->gemm[i].threads, ncores)] / k->probe_gemm[i];
    for (int i = 0; i < p->n_module; i++) {
        pt_profile_module *m = &p->module[i];
        if (!(k->probe_module[i] > 0)) continue;
        /* slow probe: the time came out long. To the median speed of the
         * cores the entry kept busy: a rank among others (the groups' entries,
         * probed on rank 0's core) ends its step when the slowest does */
        int busy = m->threads * (m->ranks > 0 ? m->ranks : 1);
        double f = k->probe_module[i] / med[clamp_cores(busy, ncores)];
        m->fwd_s *= f, m->bgrad_s *= f, m->wgrad_s *= f;
        for (int r = 0; r < 3; r++) m->recompute_s[r] *= f;
    }
    if (k->probe_stream > 0) {
        double f = k->probe_stream / ref;
        p->memory_bw /= f;
        p->elementwise_s *= f, p->adamw_s *= f, p->sgd_s *= f;
    }
    free(med);
    return PT_OK;
}
