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
 * Not here: the mpi backend, bf16 (partrain's CPU runtime has none:
 * peak_flops.bf16 is 0), sequence parallelism's own shard times (its
 * layouts take the plain shard's). */
#include "partrain/calibrate.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "partrain/comm.h"
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

/* The effort of one run: quick (tests, a few seconds) or full (< 2 min on
 * 2 cores). */
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

static const effort effort_full = {.target_s = 0.10,
                                   .min_reps = 3,
                                   .gemm_max_flop = 10e9,
                                   .fwd_max_flop = 40e9,
                                   .max_mult = 8,
                                   .comm_max_bytes = 16u << 20,
                                   .comm_step = 4,
                                   .p2p_max_bytes = 256u << 20,
                                   .comm_rounds = 3,
                                   .stream_floats = 64u << 20};
static const effort effort_quick = {.quick = 1,
                                    .target_s = 0.005,
                                    .gemm_max_flop = 0.3e9,
                                    .fwd_max_flop = 0.5e9,
                                    .max_mult = 2,
                                    .comm_max_bytes = 1u << 20,
                                    .comm_step = 16,
                                    .p2p_max_bytes = 1u << 20,
                                    .comm_rounds = 1,
                                    .stream_floats = 1u << 20};

/* ---- identity ------------------------------------------------------------- */

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

/* ---- timing ------------------------------------------------------------- */

typedef void (*pass_fn)(void *arg);

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
static int evict_on;
static char *evict_buf; /* this process's, from its first eviction on */

static void evict_caches(void) {
    if (!evict_on) return;
    if (!evict_buf && !(evict_buf = malloc(EVICT_BYTES))) {
        evict_on = 0; /* no memory for it: warm figures rather than a failure */
        return;
    }
    for (size_t i = 0; i < EVICT_BYTES; i += 64) evict_buf[i]++;
    __asm__ volatile("" : : "r"(evict_buf) : "memory"); /* keep the writes */
}

static void evict_free(void) {
    free(evict_buf);
    evict_buf = NULL;
}

/* Fastest seconds of fn(arg) (see the file comment). */
static double time_min(const effort *e, pass_fn fn, void *arg) {
    double w0 = pt_time_s();
    fn(arg);
    if (e->quick) return pt_time_s() - w0; /* the tests': one run, no warm-up */
    int min_reps = pt_time_s() - w0 > e->target_s ? 1 : e->min_reps;
    double best = 0, start = pt_time_s();
    for (int n = 0; n < 64 && (n < min_reps || pt_time_s() - start < e->target_s); n++) {
        evict_caches();
        double t0 = pt_time_s();
        fn(arg);
        double t = pt_time_s() - t0;
        if (n == 0 || t < best) best = t;
    }
    return best;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* How often the groups' passes run (after a warm-up), the same on every rank. */
static int fixed_reps(const effort *e) {
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

static void start_together(void) {
    if (lockstep && lockstep_err == PT_OK) lockstep_err = pt_comm_barrier(lockstep);
}

/* fb's time over fa's, fa and fb run in alternation (one warm-up each):
 * the median of the pairs' differences, so that a slow spell of the host,
 * which slows a pair's two runs alike, cancels, and an outlier pair does
 * not count. `reps` pairs when reps > 0 (every rank of a group runs the
 * same passes), else as time_min repeats. */
static double time_paired_extra(const effort *e, int reps, pass_fn fa, void *aa, pass_fn fb,
                                void *ab) {
    if (!e->quick) fa(aa), fb(ab);
    int n_min = reps > 0 ? reps : e->quick ? 1 : e->min_reps;
    int timed = reps == 0 && !e->quick; /* then also until twice the target */
    double d[64], start = pt_time_s();
    int n = 0;
    while (n < 64 && (n < n_min || (timed && pt_time_s() - start < 2 * e->target_s))) {
        evict_caches();
        start_together();
        double t0 = pt_time_s();
        fa(aa);
        double ta = pt_time_s() - t0;
        evict_caches();
        start_together();
        double t1 = pt_time_s();
        fb(ab);
        d[n++] = (pt_time_s() - t1) - ta;
    }
    qsort(d, (size_t)n, sizeof d[0], cmp_double);
    return n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]);
}

static void fill(float *x, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
}

/* ---- the tables, grown as measured ---------------------------------------- */

static pt_status push(void **arr, int *n, int *cap, size_t size, const void *item) {
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

/* ---- the speed probe (see the file comment) -------------------------------- */

static pt_status probe_init(calib *k) {
    int cores = k->n_threads > 0 ? k->threads[k->n_threads - 1] : 1;
    size_t n = pt_speed_probe_floats() * (size_t)cores;
    k->probe_buf = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * n);
    if (!k->probe_buf) return pt_error_set(PT_ERR_NOMEM, "calibrate: probe buffers");
    fill(k->probe_buf, n, 9);
    return PT_OK;
}

static void probe_free(calib *k) {
    pt_mem_free(k->probe_buf);
    free(k->probes);
    free(k->probe_gemm);
    free(k->probe_module);
}

/* A rate the probe measured on `cores` cores at once, into k->probes. */
static pt_status keep_probe(calib *k, int cores, double rate) {
    struct probe_rec rec = {rate, cores};
    return push((void **)&k->probes, &k->n_probes, &k->cap_probes, sizeof rec, &rec);
}

/* The probe's rate now (flop/s) on `cores` cores at once (the slowest's:
 * what a measurement on as many threads sees), kept. Quick runs (the
 * tests', under the sanitizers too, where a probe costs a second) measure
 * it once and reuse it: nothing is scaled. */
static pt_status probe(calib *k, int cores, double *rate) {
    *rate = k->e->quick && k->n_probes > 0 ? k->probes[0].rate
                                           : pt_speed_probe_cores(k->probe_buf, cores);
    return keep_probe(k, k->e->quick ? 1 : cores, *rate);
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
    qsort(sorted, (size_t)n, sizeof(double), cmp_double);
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
static pt_status probe_rescale(calib *k) {
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

/* ---- collectives (forked ranks) ------------------------------------------- */

typedef struct {
    const effort *e;
    int ranks;
    pt_profile_comm *out; /* shared with the parent (MAP_SHARED) */
    int *n_out;
    int max_out;
} comm_job;

static const struct {
    pt_comm_op op;
    int profile_op;
} comm_ops[] = {{PT_OP_ALLREDUCE, PT_PROFILE_ALLREDUCE},
                {PT_OP_ALLGATHER, PT_PROFILE_ALLGATHER},
                {PT_OP_REDUCE_SCATTER, PT_PROFILE_REDUCE_SCATTER},
                {PT_OP_BROADCAST, PT_PROFILE_BROADCAST},
                {PT_OP_SEND, PT_PROFILE_P2P}};
#define N_COMM_OPS (int)(sizeof comm_ops / sizeof comm_ops[0])

static size_t comm_buf_bytes(const effort *e) {
    return e->p2p_max_bytes > e->comm_max_bytes ? e->p2p_max_bytes : e->comm_max_bytes;
}

static pt_status comm_measure(const comm_job *j, pt_comm *c, float *buf) {
    int rank = pt_comm_rank(c);
    for (int oi = 0; oi < N_COMM_OPS; oi++) {
        if (comm_ops[oi].op == PT_OP_SEND && j->ranks != 2) continue; /* p2p: a pair */
        /* the point-to-point up to a tied embedding's size (gpt2's wte: 154
         * MB), which moves from beyond the caches: in a pipeline step it
         * took 22 ms, 16 MiB's rate said 8.7 */
        size_t max = comm_ops[oi].op == PT_OP_SEND ? j->e->p2p_max_bytes : j->e->comm_max_bytes;
        for (size_t bytes = 4096; bytes <= max; bytes *= j->e->comm_step) {
            /* about 4 MiB moved per measurement (1 MiB quick), 3..100 operations */
            size_t budget = j->e->quick ? (1u << 20) : (4u << 20);
            size_t it = budget / bytes;
            int iters = it < 3 ? 3 : it > 100 ? 100 : (int)it;
            double r[8];
            for (int k = 0; k < j->e->comm_rounds; k++)
                PT_CHECK(pt_comm_time(c, comm_ops[oi].op, buf, bytes, iters, &r[k]));
            double best = r[0];
            for (int q = 1; q < j->e->comm_rounds; q++)
                if (r[q] < best) best = r[q];
            if (rank != 0) continue;
            if (*j->n_out >= j->max_out)
                return pt_error_set(PT_ERR_INTERNAL, "calibrate: comm table full");
            pt_profile_comm *pc = &j->out[(*j->n_out)++];
            memset(pc, 0, sizeof *pc);
            snprintf(pc->backend, sizeof pc->backend, "shm");
            pc->op = comm_ops[oi].profile_op;
            pc->ranks = j->ranks;
            pc->bytes = (double)bytes;
            pc->seconds = best;
        }
    }
    return PT_OK;
}

static int comm_rank_main(void *arg) {
    const comm_job *j = arg;
    pt_comm_options co = {.backend = "shm"};
    pt_comm *c = NULL;
    pt_status s = pt_comm_new(&c, &co);
    float *buf = NULL;
    if (s == PT_OK) {
        buf = pt_mem_alloc(PT_MEM_COMM, comm_buf_bytes(j->e));
        s = buf ? PT_OK : pt_error_set(PT_ERR_NOMEM, "calibrate: comm buffer");
    }
    if (s == PT_OK) {
        memset(buf, 0, comm_buf_bytes(j->e)); /* zeros: sums stay 0; pages faulted in */
        s = comm_measure(j, c, buf);
    }
    if (s != PT_OK)
        fprintf(stderr, "partrain calibrate: rank %d of %d: %s\n", c ? pt_comm_rank(c) : -1,
                j->ranks, pt_error_message());
    pt_mem_free(buf);
    pt_comm_free(c);
    return s == PT_OK ? 0 : 1;
}

static pt_status measure_comm(calib *k) {
    const int max_out = 256;
    size_t bytes = sizeof(int) * 16 + sizeof(pt_profile_comm) * max_out;
    void *shared = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED)
        return pt_error_set(PT_ERR_NOMEM, "calibrate: shared results: %s", strerror(errno));
    pt_status st = PT_OK;
    static const int group[] = {2, 4};
    for (int g = 0; g < 2 && st == PT_OK; g++) {
        int *n_out = shared;
        *n_out = 0;
        comm_job j = {.e = k->e,
                      .ranks = group[g],
                      .out = (pt_profile_comm *)((char *)shared + sizeof(int) * 16),
                      .n_out = n_out,
                      .max_out = max_out};
        pt_comm_options co = {.backend = "shm"};
        int exit_code = 1;
        st = pt_launch(group[g], comm_rank_main, &j, &co, &exit_code);
        if (st == PT_OK && exit_code != 0)
            st =
                pt_error_set(PT_ERR_COMM, "calibrate: the %d-rank shm measurement failed (exit %d)",
                             group[g], exit_code);
        for (int i = 0; st == PT_OK && i < *n_out; i++)
            st =
                push((void **)&k->p->comm, &k->p->n_comm, &k->cap_comm, sizeof j.out[i], &j.out[i]);
    }
    munmap(shared, bytes);
    return st;
}

/* ---- memory bandwidth, elementwise, optimizers (one thread) ----------------- */

typedef struct {
    float *a, *b, *c, *d;
    size_t n;
    int t;
} stream_arg;

static void pass_copy(void *arg) {
    stream_arg *s = arg;
    memcpy(s->b, s->a, s->n * sizeof(float));
    __asm__ volatile("" : : "r"(s->b) : "memory"); /* keep the copy */
}
static void pass_gelu(void *arg) {
    stream_arg *s = arg;
    pt_gelu_forward(s->b, s->a, s->n);
}
static void pass_adamw(void *arg) {
    stream_arg *s = arg;
    pt_adamw_update(s->a, s->b, s->c, s->d, (long)s->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++s->t,
                    1.0f);
}
static void pass_sgd(void *arg) {
    stream_arg *s = arg;
    pt_sgd_update(s->a, s->b, s->c, (long)s->n, 1e-4f, 0.9f, 0.0f, 1.0f);
}

static pt_status measure_stream(calib *k) {
    size_t n = k->e->stream_floats;
    stream_arg s = {.n = n};
    float **bufs[4] = {&s.a, &s.b, &s.c, &s.d};
    pt_status st = PT_OK;
    for (int i = 0; i < 4; i++) {
        *bufs[i] = pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float));
        if (!*bufs[i])
            st = pt_error_set(PT_ERR_NOMEM, "calibrate: %zu-float buffers", n);
        else
            fill(*bufs[i], n, (uint32_t)i + 1);
    }
    double p0 = 0, p1 = 0;
    if (st == PT_OK) st = probe(k, 1, &p0);
    if (st == PT_OK) {
        pt_kernels_set_threads(1);
        /* STREAM's copy convention: bytes read plus bytes written */
        k->p->memory_bw = 2.0 * (double)(n * sizeof(float)) / time_min(k->e, pass_copy, &s);
        k->p->elementwise_s = time_min(k->e, pass_gelu, &s) / (double)n;
        memset(s.c, 0, n * sizeof(float));
        memset(s.d, 0, n * sizeof(float));
        k->p->adamw_s = time_min(k->e, pass_adamw, &s) / (double)n;
        k->p->sgd_s = time_min(k->e, pass_sgd, &s) / (double)n;
        st = probe(k, 1, &p1);
        k->probe_stream = 0.5 * (p0 + p1);
    }
    for (int i = 0; i < 4; i++) pt_mem_free(*bufs[i]);
    return st;
}

/* ---- matrix products ------------------------------------------------------ */

typedef struct {
    float *out, *inp, *w, *bias;
    int m, n, k;
    int which; /* 0 the forward (NN), 1 the input gradient (NT), 2 the weight gradient (TN) */
} gemm_arg;

static void pass_gemm(void *arg) {
    gemm_arg *g = arg;
    if (g->which == 0)
        pt_matmul_forward(g->out, g->inp, g->w, g->bias, g->m, g->k, g->n);
    else if (g->which == 1)
        pt_matmul_backward_input_set(g->inp, g->out, g->w, g->m, g->k, g->n);
    else
        pt_matmul_backward_weight(g->w, NULL, g->out, g->inp, g->m, g->k, g->n);
}

/* The model's linears for width C and vocabulary V: (k, n) of qkv, attention
 * projection, MLP up, MLP down, LM head. */
static int linear_shapes(const pt_model_config *mc, int kn[5][2]) {
    int C = mc->n_embd;
    int s[5][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, mc->vocab_size}};
    memcpy(kn, s, sizeof s);
    return 5;
}

static pt_status measure_gemm_shape(calib *k, int m, int n, int kk) {
    double flop = 2.0 * m * n * kk;
    if (flop > k->e->gemm_max_flop) return PT_OK;
    for (int i = 0; i < k->p->n_gemm; i++) /* a shape two configs share: once */
        if (k->p->gemm[i].m == m && k->p->gemm[i].n == n && k->p->gemm[i].k == kk) return PT_OK;
    gemm_arg g = {.m = m, .n = n, .k = kk};
    g.out = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)m * n);
    g.inp = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)m * kk);
    g.w = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)kk * n);
    g.bias = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * (size_t)n);
    pt_status st = PT_OK;
    if (!g.out || !g.inp || !g.w || !g.bias)
        st = pt_error_set(PT_ERR_NOMEM, "calibrate: gemm %dx%dx%d buffers", m, n, kk);
    if (st == PT_OK) {
        fill(g.inp, (size_t)m * kk, 1);
        fill(g.w, (size_t)kk * n, 2);
        fill(g.bias, (size_t)n, 3);
    }
    double p0, p1; /* the probes before and after, on the product's threads */
    for (int t = 0; st == PT_OK && t < k->n_threads; t++) {
        pt_kernels_set_threads(k->threads[t]);
        pt_profile_gemm e = {.m = m, .n = n, .k = kk, .threads = k->threads[t]};
        if ((st = probe(k, k->threads[t], &p0)) != PT_OK) break;
        e.flops_s = flop / time_min(k->e, pass_gemm, &g);
        st = probe(k, k->threads[t], &p1);
        double pe = 0.5 * (p0 + p1);
        if (st == PT_OK)
            st = push((void **)&k->probe_gemm, &k->n_gemm_probed, &k->cap_probe_gemm, sizeof pe,
                      &pe);
        if (st == PT_OK) st = push((void **)&k->p->gemm, &k->p->n_gemm, &k->cap_gemm, sizeof e, &e);
        /* the backward's transposed products, at the medium row count on
         * one thread: the profile has no field for them (the modules'
         * bgrad_s and wgrad_s include them); how far they are from the
         * forward's rate goes to the summary */
        for (g.which = 1; st == PT_OK && m == 512 && k->threads[t] == 1 && g.which <= 2;
             g.which++) {
            double r = flop / time_min(k->e, pass_gemm, &g) / e.flops_s;
            double *lo = &k->c->transpose_lo[g.which - 1], *hi = &k->c->transpose_hi[g.which - 1];
            if (*lo == 0 || r < *lo) *lo = r;
            if (r > *hi) *hi = r;
        }
        g.which = 0;
    }
    pt_mem_free(g.bias);
    pt_mem_free(g.w);
    pt_mem_free(g.inp);
    pt_mem_free(g.out);
    return st;
}

static pt_status measure_gemm(calib *k, const pt_model_config *models, int n_models) {
    /* small, medium and large row counts: a short micro-batch to a long one */
    static const int rows_full[] = {128, 512, 2048}, rows_quick[] = {128, 512};
    const int *rows = k->e->quick ? rows_quick : rows_full;
    int n_rows = k->e->quick ? 2 : 3;
    for (int mi = 0; mi < n_models; mi++) {
        int kn[5][2];
        int ns = linear_shapes(&models[mi], kn);
        for (int r = 0; r < n_rows; r++)
            for (int s = 0; s < ns; s++)
                PT_CHECK(measure_gemm_shape(k, rows[r], kn[s][1], kn[s][0]));
    }
    return PT_OK;
}

/* ---- modules ---------------------------------------------------------------- */

enum { P_FWD, P_BGRAD, P_WGRAD, P_BW, P_RECOMPUTE };

typedef struct {
    pt_model *m;
    pt_model_slot *s;
    const pt_batch *b;
    int i, pass, last; /* module, pass, the model's head index */
    float *dy, *dx;
} module_arg;

static void pass_module(void *arg) {
    module_arg *a = arg;
    int i = a->i;
    const float *dy = i == a->last ? NULL : a->dy;
    float *dx = i == 0 ? NULL : a->dx;
    switch (a->pass) {
    case P_FWD: {
        float loss;
        pt_model_forward_range(a->m, a->s, a->b, i, i, i == a->last ? &loss : NULL);
        break;
    }
    case P_BGRAD:
        pt_model_backward_range(a->m, a->s, i, i, dy, dx, 1);
        break;
    case P_WGRAD:
        pt_model_backward_weight_range(a->m, a->s, i, i);
        break;
    case P_BW:
        pt_model_backward_range(a->m, a->s, i, i, dy, dx, 1);
        pt_model_backward_weight_range(a->m, a->s, i, i);
        break;
    default: /* what B recomputes first, alone */
        pt_model_recompute_range(a->m, a->s, i, i);
        break;
    }
}

/* Block + head forward flops of a micro-batch of N rows (the cost cap). */
static double forward_flop(const pt_model_config *c, double N) {
    double C = c->n_embd;
    return 24.0 * N * C * C + 4.0 * N * c->seq_len * C + 2.0 * N * C * c->vocab_size;
}

typedef struct {
    pt_model *m[3];         /* whole (recompute none), block-only selective, block-only full */
    pt_model_slot *slot[3]; /* the whole model's own; a block range slot of the others */
    int *tokens;
    float *dy, *dx;
} module_models;

static void module_models_free(module_models *mm) {
    for (int r = 1; r < 3; r++) pt_model_slot_free(mm->slot[r]);
    for (int r = 0; r < 3; r++) pt_model_free(mm->m[r]);
    free(mm->tokens);
    pt_mem_free(mm->dy);
    pt_mem_free(mm->dx);
}

/* The three models of one module each, of tp rank `rank` of t (tp_comm
 * its group's communicator; t 1: the whole modules, tp_comm NULL). */
static pt_status module_models_new(module_models *mm, const pt_model_config *mc, int max_B, int t,
                                   int rank, pt_comm *tp_comm) {
    memset(mm, 0, sizeof *mm);
    static const unsigned char block_only[3] = {0, 1, 0};
    for (int r = 0; r < 3; r++) {
        pt_model_options opt = {
            .recompute = (pt_recompute)r, .owned = r ? block_only : NULL, .tp = t, .tp_rank = rank};
        PT_CHECK(pt_model_new_opts(&mm->m[r], mc, max_B, &opt));
        if (t > 1) pt_model_set_tp_comm(mm->m[r], tp_comm);
        pt_model_draw_weights(mm->m[r], 1);
        if (r)
            PT_CHECK(pt_model_slot_new_range(&mm->slot[r], mm->m[r], 1, 1));
        else
            mm->slot[r] = pt_model_own_slot(mm->m[r]);
    }
    size_t N = (size_t)max_B * mc->seq_len;
    mm->tokens = malloc(sizeof(int) * N);
    mm->dy = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * N * mc->n_embd);
    mm->dx = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * N * mc->n_embd);
    if (!mm->tokens || !mm->dy || !mm->dx)
        return pt_error_set(PT_ERR_NOMEM, "calibrate: module buffers of %zu rows", N);
    for (size_t i = 0; i < N; i++) mm->tokens[i] = (int)((i * 7919u + 13u) % mc->vocab_size);
    fill(mm->dy, N * mc->n_embd, 4);
    return PT_OK;
}

/* The largest micro-batch (sequences, a power of 2) whose forward is
 * within the effort's cap (1 at least). */
static int module_max_B(const effort *e, const pt_model_config *mc) {
    int max_B = 1;
    for (int mult = 2; mult <= e->max_mult; mult *= 2)
        if (forward_flop(mc, (double)mult * mc->seq_len) <= e->fwd_max_flop) max_B = mult;
    return max_B;
}

typedef double (*timer_fn)(const effort *e, pass_fn fn, void *arg);

/* Each module's passes at micro-batch B (e[3]: embedding, block, head, of
 * tp shard t at `threads`), timed by `timer`; *probe_mean the speed probe's
 * mean before and after on as many cores, when probe_buf (else 0). */
static void time_modules(const effort *ef, timer_fn timer, module_models *mm,
                         const pt_model_config *mc, int B, int threads, int t, int ranks,
                         float *probe_buf, pt_profile_module e[3], double *probe_mean) {
    int T = mc->seq_len;
    pt_batch b = {.tokens = mm->tokens, .targets = mm->tokens, .B = B, .T = T};
    b.dloss = 1.0f / (float)(B * T);
    module_arg a = {.b = &b, .last = 2, .dy = mm->dy, .dx = mm->dx};
    double p0 = probe_buf ? pt_speed_probe_cores(probe_buf, threads) : 0;
    evict_on = !ef->quick; /* the tests' quick run: one repetition, no eviction */
    for (int r = 0; r < 3; r++) {
        a.m = mm->m[r];
        a.s = mm->slot[r];
        if (r) fill(pt_model_slot_stream(a.s, 0), (size_t)B * T * mc->n_embd, 5);
        /* one forward in order fills every module's input */
        for (int i = r ? 1 : 0; i <= (r ? 1 : 2); i++) {
            a.i = i;
            a.pass = P_FWD;
            pass_module(&a);
        }
        for (int i = r ? 1 : 0; i <= (r ? 1 : 2); i++) {
            a.i = i;
            if (r == 0) {
                e[i] = (pt_profile_module){.kind = i == 0   ? PT_MODULE_EMBEDDING
                                                   : i == 1 ? PT_MODULE_BLOCK
                                                            : PT_MODULE_HEAD,
                                           .n_embd = mc->n_embd,
                                           .n_head = mc->n_head,
                                           .seq_len = T,
                                           .vocab_size = mc->vocab_size,
                                           .tp = t,
                                           .tokens = B * T,
                                           .threads = threads,
                                           .ranks = ranks};
                a.pass = P_FWD;
                e[i].fwd_s = timer(ef, pass_module, &a);
                a.pass = P_BGRAD;
                e[i].bgrad_s = timer(ef, pass_module, &a);
                a.pass = P_WGRAD;
                e[i].wgrad_s = timer(ef, pass_module, &a);
            }
            if (i == 1 && r > 0) {
                a.pass = P_RECOMPUTE;
                e[1].recompute_s[r] = timer(ef, pass_module, &a);
            }
        }
    }
    /* Recomputation's extra backward time: B + W under the mode minus B + W
     * under none, paired runs' median difference, and never below the
     * recompute alone. B itself runs slower after a full recompute, so the
     * recompute alone falls short (small's block, 1024 tokens, 2 threads:
     * 15.0 ms alone, 18.5 ms of extra B + W); a difference of two minima
     * timed apart was noise (one entry: 14.3 ms, then 67.0 ms; some 0). */
    for (int r = 1; r < 3; r++) {
        module_arg none = a, mode = a;
        none.m = mm->m[0], none.s = mm->slot[0];
        mode.m = mm->m[r], mode.s = mm->slot[r];
        none.i = mode.i = 1;
        none.pass = mode.pass = P_BW;
        double extra = time_paired_extra(ef, timer == time_min ? 0 : fixed_reps(ef), pass_module,
                                         &none, pass_module, &mode);
        if (extra > e[1].recompute_s[r]) e[1].recompute_s[r] = extra;
    }
    evict_on = 0;
    *probe_mean = probe_buf ? 0.5 * (p0 + pt_speed_probe_cores(probe_buf, threads)) : 0;
}

/* Three module entries and the probe beside each (on their threads' cores)
 * into the tables; the block's probe joins the median. */
static pt_status push_modules(calib *k, const pt_profile_module e[3], const double probe[3]) {
    if (probe[1] > 0) PT_CHECK(keep_probe(k, e[1].threads, probe[1]));
    for (int i = 0; i < 3; i++) {
        PT_CHECK(push((void **)&k->probe_module, &k->n_module_probed, &k->cap_probe_module,
                      sizeof probe[i], &probe[i]));
        PT_CHECK(push((void **)&k->p->module, &k->p->n_module, &k->cap_module, sizeof e[i], &e[i]));
    }
    return PT_OK;
}

static pt_status measure_model(calib *k, const pt_model_config *shape) {
    pt_model_config mc = *shape;
    mc.n_layer = 1; /* one module of each kind */
    PT_CHECK(pt_model_config_validate(&mc));
    int max_B = module_max_B(k->e, &mc);
    module_models mm;
    pt_status st = module_models_new(&mm, &mc, max_B, 1, 0, NULL);
    for (int t = 0; st == PT_OK && t < k->n_threads; t++) {
        if (t > 0 && t < k->n_threads - 1) continue; /* modules: 1 and the most */
        pt_kernels_set_threads(k->threads[t]);
        for (int B = 1; st == PT_OK && B <= max_B; B *= 2) {
            pt_profile_module e[3];
            double pm;
            time_modules(k->e, time_min, &mm, &mc, B, k->threads[t], 1, 1,
                         k->e->quick ? NULL : k->probe_buf, e, &pm);
            st = push_modules(k, e, (double[3]){pm, pm, pm});
        }
    }
    module_models_free(&mm);
    return st;
}

/* ---- in groups: tensor-parallel shards, and tp 1 under load ---------------
 * A shard's passes run the group's collectives, so a shard is timed in a
 * group of t ranks forked by pt_launch (shm), one thread each: its times
 * hold the collectives, the ranks waiting for one another at each (the skew
 * of a shared machine) and t ranks sharing the cores (the planner scales by
 * its own oversubscription over this one). And whole modules are timed
 * again with every core running the same passes (a rank per core, no
 * collectives), what a data-parallel or pipeline rank sees: on the 2-core
 * development machine a one-thread step took 15-28% longer with a second
 * one on the other core (caches and memory bandwidth are shared). Every
 * rank runs the same passes the same number of times (a time
 * target would let the counts differ and the collectives pair wrongly): a
 * warm-up, then two, rank 0's faster kept (an outlier size timed again:
 * outlier_sizes; with more ranks than cores,
 * five and their median: time_over), with rank 0's probe beside them (the
 * groups take about 40% of the run's time as it is). */

enum { TP_MAX_OUT = 64 };

typedef struct {
    const effort *e;
    pt_model_config mc;  /* n_layer 1 */
    int t, ranks, max_B; /* the shard's tp (1: whole), ranks at once */
    int cores;           /* the machine's */
    float *probe_buf;    /* the parent's (its pages are the fork's) */
    /* shared with the parent (MAP_SHARED): rank 0's entries, 3 per B, the
     * probe beside each, and how many sizes were timed again */
    pt_profile_module out[TP_MAX_OUT];
    double probe[TP_MAX_OUT];
    int n_out, n_retimed;
} tp_job;

/* A warm-up, then `reps` timed runs of fn(arg) into t. */
static void time_runs(pass_fn fn, void *arg, int reps, double *t) {
    fn(arg);
    for (int n = 0; n < reps; n++) {
        evict_caches();
        start_together();
        double t0 = pt_time_s();
        fn(arg);
        t[n] = pt_time_s() - t0;
    }
}

static double time_fixed(const effort *e, pass_fn fn, void *arg) {
    double t[8];
    int reps = fixed_reps(e);
    time_runs(fn, arg, reps, t);
    double best = t[0];
    for (int n = 1; n < reps; n++) best = t[n] < best ? t[n] : best;
    return best;
}

/* More ranks than cores: a pass's time on rank 0 holds the waits for the
 * ranks that the scheduler left off the cores, a different draw each run
 * (gpt2's tp 4 block over 2 cores, 256 tokens: a forward of 9.4, 12.0 and
 * 13.5 ms in three calibrates, the head's weight gradient 23.4 and 52.9;
 * the fastest of two is a lucky draw, not a step's). So the median of
 * five, the same count on every rank. */
static double time_over(const effort *e, pass_fn fn, void *arg) {
    double t[5];
    int reps = e->quick ? 1 : 5;
    time_runs(fn, arg, reps, t);
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

/* An entry's time per token at the median speed (times the probe's rate:
 * rescaled alike, probe_rescale), the sum of its three passes. */
static double module_cost(const pt_profile_module *e, double probe) {
    return (e->fwd_s + e->bgrad_s + e->wgrad_s) * (probe > 0 ? probe : 1) / e->tokens;
}

/* The micro-batch sizes (bit b: the b-th, B = 2^b) whose entries look like
 * a slow spell of the host's rather than the machine: a spell that outlasts
 * both repetitions makes a whole entry slow (small's tp 2 block at 256
 * tokens cost 3.0x per token what it did at 512, in one calibrate of
 * three; the others 1.07x). Per token a block or a head costs more at
 * fewer tokens (smaller products; gpt2's tp 2 block at 64 tokens 1.2-1.35x
 * the 128's), not 1.5x, and no more at more tokens than at half as many,
 * bar 15% of noise. The embedding, a few copies and a collective's latency,
 * does cost 1.5-10x per token at its fewest tokens, and little in a step.
 * out: the entries, three per size (embedding, block, head). */
static uint32_t outlier_sizes(const pt_profile_module *out, const double *probe, int n_out) {
    uint32_t redo = 0;
    for (int i = 0; i + 3 < n_out; i++) {
        if (i % 3 == 0) continue;
        double now = module_cost(&out[i], probe[i]), next = module_cost(&out[i + 3], probe[i + 3]);
        if (now > 1.5 * next) redo |= 1u << (i / 3);
        if (next > 1.15 * now) redo |= 1u << (i / 3 + 1);
    }
    return redo;
}

static int tp_rank_main(void *arg) {
    tp_job *j = arg;
    pt_comm_options co = {.backend = "shm"};
    pt_comm *c = NULL;
    pt_status s = pt_comm_new(&c, &co);
    int rank = c ? pt_comm_rank(c) : -1;
    module_models mm = {0};
    /* the parent's buffers, a copy-on-write copy in this forked rank */
    float *probe_buf = rank == 0 && !j->e->quick ? j->probe_buf : NULL;
    if (s == PT_OK) s = module_models_new(&mm, &j->mc, j->max_B, j->t, j->t > 1 ? rank : 0, c);
    lockstep = c;
    pt_kernels_set_threads(1);
    timer_fn timer = j->ranks > j->cores ? time_over : time_fixed;
    for (int B = 1; s == PT_OK && B <= j->max_B; B *= 2) {
        pt_profile_module e[3];
        double pm;
        time_modules(j->e, timer, &mm, &j->mc, B, 1, j->t, j->ranks, probe_buf, e, &pm);
        for (int m = 0; m < 3; m++) s = s == PT_OK ? pt_model_take_error(mm.m[m]) : s;
        if (s == PT_OK && rank == 0 && j->n_out + 3 <= TP_MAX_OUT) {
            for (int m = 0; m < 3; m++) j->probe[j->n_out + m] = pm;
            memcpy(&j->out[j->n_out], e, sizeof e);
            j->n_out += 3;
        }
    }
    /* Outliers, timed again: rank 0 names them, every rank reruns them. */
    uint32_t redo = rank == 0 && !j->e->quick ? outlier_sizes(j->out, j->probe, j->n_out) : 0;
    if (s == PT_OK && !j->e->quick) s = pt_comm_broadcast(c, &redo, sizeof redo, 0);
    for (int b = 0, B = 1; s == PT_OK && B <= j->max_B; b++, B *= 2) {
        if (!(redo >> b & 1)) continue;
        j->n_retimed += rank == 0;
        pt_profile_module e[3];
        double pm;
        time_modules(j->e, timer, &mm, &j->mc, B, 1, j->t, j->ranks, probe_buf, e, &pm);
        for (int m = 0; m < 3; m++) s = s == PT_OK ? pt_model_take_error(mm.m[m]) : s;
        for (int m = 0; s == PT_OK && rank == 0 && m < 3; m++)
            if (3 * b + m < j->n_out &&
                module_cost(&e[m], pm) < module_cost(&j->out[3 * b + m], j->probe[3 * b + m]))
                j->out[3 * b + m] = e[m], j->probe[3 * b + m] = pm;
    }
    if (s == PT_OK) s = lockstep_err;
    lockstep = NULL;
    if (s != PT_OK)
        fprintf(stderr, "partrain calibrate: group rank %d of %d: %s\n", rank, j->ranks,
                pt_error_message());
    module_models_free(&mm);
    pt_comm_free(c);
    evict_free();
    return s == PT_OK ? 0 : 1;
}

/* The shape's shards at t = 2 and 4 (2 in quick), where the shape splits
 * that way, and whole modules on every core. Before any thread of the
 * parent's starts (pt_launch forks). */
static pt_status measure_groups(calib *k, const pt_model_config *shape) {
    tp_job *j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (j == MAP_FAILED)
        return pt_error_set(PT_ERR_NOMEM, "calibrate: shared results: %s", strerror(errno));
    pt_status st = PT_OK;
    const int groups[3][2] = {{1, k->p->cores}, {2, 2}, {4, 4}}; /* tp, ranks */
    for (int g = 0; st == PT_OK && g < (k->e->quick ? 2 : 3); g++) {
        int t = groups[g][0], ranks = groups[g][1];
        if (ranks < 2) continue; /* one core: under load is alone */
        memset(j, 0, sizeof *j);
        j->e = k->e;
        j->mc = *shape;
        j->mc.n_layer = 1;
        j->t = t;
        j->ranks = ranks;
        j->cores = k->p->cores;
        j->max_B = module_max_B(k->e, &j->mc);
        j->probe_buf = k->probe_buf;
        if (pt_model_config_validate(&j->mc) != PT_OK || pt_shard_check(&j->mc, t) != PT_OK) {
            pt_error_clear();
            continue; /* the shape does not split t ways */
        }
        pt_comm_options co = {.backend = "shm"};
        int exit_code = 1;
        st = pt_launch(ranks, tp_rank_main, j, &co, &exit_code);
        if (st == PT_OK && exit_code != 0)
            st = pt_error_set(PT_ERR_COMM,
                              "calibrate: the %d-rank measurement of tp %d failed "
                              "(exit %d)",
                              ranks, t, exit_code);
        k->c->n_retimed += j->n_retimed;
        for (int i = 0; st == PT_OK && i < j->n_out; i += 3)
            st = push_modules(k, &j->out[i], &j->probe[i]);
    }
    munmap(j, sizeof *j);
    return st;
}

/* ---- the whole measurement ------------------------------------------------ */

static void progress(const pt_calibrate_options *o, const char *what) {
    if (!o->progress) return;
    fprintf(o->progress, "partrain calibrate: %s\n", what);
    fflush(o->progress);
}

static void models_of(const pt_calibrate_options *o, const pt_model_config **models, int *n) {
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
    calib k = {.e = o->quick ? &effort_quick : &effort_full, .p = &out->profile, .c = out};
    pt_profile *p = &out->profile;
    pt_calibrate_identity(p->cpu, p->binary);
    p->cores = count_cores();
    int max_t = o->threads ? o->threads : p->cores;
    for (int t = 1; t < max_t && k.n_threads < 7; t *= 2) k.threads[k.n_threads++] = t;
    k.threads[k.n_threads++] = max_t;
    const pt_model_config *models;
    int n_models;
    models_of(o, &models, &n_models);

    /* the probe's buffers now, for the forked group ranks too; its first
     * product comes after the forks: pt_launch wants a parent without
     * threads of its own, and a product may start BLAS threads */
    pt_status st = probe_init(&k);
    double t0 = pt_time_s();
    progress(o, "collectives and point-to-point (shm, 2 and 4 ranks)");
    if (st == PT_OK) st = measure_comm(&k);
    out->phase_s[0] = pt_time_s() - t0;
    t0 = pt_time_s();
    for (int i = 0; st == PT_OK && i < n_models; i++) {
        char what[160];
        snprintf(what, sizeof what,
                 "modules of C%d NH%d V%d T%d on every core, tensor-parallel shards of 2 and 4",
                 models[i].n_embd, models[i].n_head, models[i].vocab_size, models[i].seq_len);
        progress(o, what);
        st = measure_groups(&k, &models[i]);
    }
    out->phase_s[4] = pt_time_s() - t0;
    if (st == PT_OK) {
        t0 = pt_time_s();
        progress(o, "memory bandwidth, elementwise, optimizers");
        st = measure_stream(&k);
        out->phase_s[1] = pt_time_s() - t0;
    }
    if (st == PT_OK) {
        t0 = pt_time_s();
        progress(o, "matrix products");
        st = measure_gemm(&k, models, n_models);
        out->phase_s[2] = pt_time_s() - t0;
    }
    t0 = pt_time_s();
    for (int i = 0; st == PT_OK && i < n_models; i++) {
        char what[128];
        snprintf(what, sizeof what, "modules of C%d NH%d V%d T%d", models[i].n_embd,
                 models[i].n_head, models[i].vocab_size, models[i].seq_len);
        progress(o, what);
        st = measure_model(&k, &models[i]);
    }
    out->phase_s[3] = pt_time_s() - t0;
    evict_free();
    pt_kernels_set_threads(threads_before);
    if (st == PT_OK) st = probe_rescale(&k);
    probe_free(&k);
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
    calib k = {.e = &effort_full, .p = &p, .c = &c};
    pt_status st = probe_init(&k);
    double start = pt_time_s(), r;
    while (st == PT_OK && (k.n_probes < 5 || pt_time_s() - start < seconds)) st = probe(&k, 1, &r);
    if (st == PT_OK) st = probe_rescale(&k); /* no tables: only the median */
    probe_free(&k);
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

/* ---- JSON (docs/plan.md) --------------------------------------------------- */

char *pt_calibration_to_json(const pt_calibration *c) {
    return pt_cluster_to_json(&c->cluster); /* cluster.c's writer: the loader's own format */
}

/* ---- files and the cache ------------------------------------------------------ */

/* The last error's message behind prefix (copied first: it is the buffer
 * being set). */
static pt_status prefix_error(pt_status st, const char *prefix) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "%s%s", prefix, msg);
}

pt_status pt_calibrate_check_out(const char *path) {
    if (!path || !*path) return pt_error_set(PT_ERR_INVALID, "calibrate: --out: empty path");
    pt_status st = pt_file_check_output(path, 0);
    return st == PT_OK ? PT_OK : prefix_error(st, "calibrate: --out ");
}

pt_status pt_calibrate_write(const pt_calibration *c, const char *path) {
    /* the path before the text: a directory or a missing folder is the
     * path's error, whatever the profile holds */
    pt_status st = pt_file_check_output(path, 0);
    if (st != PT_OK) return prefix_error(st, "calibrate: ");
    pt_error_clear();
    char *text = pt_calibration_to_json(c);
    if (!text && pt_error_message()[0]) /* the writer's refusal names the number */
        return prefix_error(PT_ERR_INVALID, "calibrate: the profile would not load back: ");
    if (!text) return pt_error_set(PT_ERR_NOMEM, "calibrate: the profile's JSON");
    size_t len = strlen(text);
    char *line = realloc(text, len + 2);
    if (!line) {
        free(text);
        return pt_error_set(PT_ERR_NOMEM, "calibrate: the profile's JSON");
    }
    line[len] = '\n';
    /* whole or not at all: a failure leaves path as it was and no temporary */
    st = pt_file_write_atomic(path, line, len + 1);
    free(line);
    return st == PT_OK ? PT_OK : prefix_error(st, "calibrate: ");
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The cache folder: $XDG_CACHE_HOME/partrain or $HOME/.cache/partrain. */
static pt_status cache_dir(char *dir, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int len;
    if (xdg && *xdg)
        len = snprintf(dir, n, "%s/partrain", xdg);
    else if (home && *home)
        len = snprintf(dir, n, "%s/.cache/partrain", home);
    else
        return pt_error_set(PT_ERR_INVALID,
                            "calibrate: no cache folder (XDG_CACHE_HOME and HOME unset)");
    if (len < 0 || (size_t)len >= n)
        return pt_error_set(PT_ERR_INVALID, "calibrate: cache folder path too long");
    return PT_OK;
}

/* mkdir -p of dir (the cache's folders). */
static pt_status make_dirs(const char *dir) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1;; p++) {
        int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return pt_error_set(PT_ERR_IO, "calibrate: cannot create %s: %s", tmp,
                                    strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    return PT_OK;
}

pt_status pt_calibrate_cache_path(const pt_calibrate_options *o, char *path, size_t n) {
    char dir[4096], cpu[PT_PLAN_NAME_MAX], binary[PT_PLAN_NAME_MAX];
    PT_CHECK(cache_dir(dir, sizeof dir));
    PT_CHECK(make_dirs(dir));
    pt_calibrate_identity(cpu, binary);
    uint64_t h = 14695981039346656037ull;
    h = fnv1a(h, cpu, strlen(cpu) + 1);
    h = fnv1a(h, binary, strlen(binary) + 1);
    const pt_model_config *models;
    int n_models;
    models_of(o, &models, &n_models);
    for (int i = 0; i < n_models; i++) {
        int s[4] = {models[i].n_embd, models[i].n_head, models[i].vocab_size, models[i].seq_len};
        h = fnv1a(h, s, sizeof s);
    }
    int q[2] = {o->quick, o->threads};
    h = fnv1a(h, q, sizeof q);
    int len = snprintf(path, n, "%s/profile-%016llx.json", dir, (unsigned long long)h);
    if (len < 0 || (size_t)len >= n)
        return pt_error_set(PT_ERR_INVALID, "calibrate: cache path too long");
    return PT_OK;
}

/* Whether path holds a profile measured by this binary on this CPU: the
 * cluster loader accepts it and its profile names both. */
static int cache_valid(const char *path) {
    pt_cluster *cl = NULL;
    if (pt_cluster_load_file(&cl, path) != PT_OK) {
        pt_error_clear();
        return 0;
    }
    char cpu[PT_PLAN_NAME_MAX], binary[PT_PLAN_NAME_MAX];
    pt_calibrate_identity(cpu, binary);
    int ok = cl->profile && !strcmp(cl->profile->cpu, cpu) && !strcmp(cl->profile->binary, binary);
    pt_cluster_free(cl);
    return ok;
}

pt_status pt_calibrate_cached(const pt_calibrate_options *o, char *path, size_t n, int *measured) {
    if (measured) *measured = 0;
    PT_CHECK(pt_calibrate_cache_path(o, path, n));
    if (cache_valid(path)) return PT_OK;
    PT_CHECK(pt_file_check_output(path, 0)); /* before a minute of measuring */
    pt_calibration c;
    PT_CHECK(pt_calibrate(o, &c));
    pt_status st = pt_calibrate_write(&c, path);
    pt_calibration_deinit(&c);
    if (st == PT_OK && measured) *measured = 1;
    return st;
}
