/* `partrain bench comm`: latency and bus bandwidth of the collectives, per
 * backend, side by side in ONE run:
 *
 *   shm         partrain's shared-memory backend
 *   mpi         partrain's mpi backend (Open MPI underneath)
 *   mpi_native  Open MPI's own MPI_Allreduce & co., in place, straight calls
 *   memcpy      one process copying the same number of bytes: the ceiling
 *
 * Definitions follow nccl-tests (doc/PERFORMANCE.md): for a buffer of S
 * bytes and time t per operation, algbw = S / t and busbw = algbw x f with
 * f = 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather
 * (S is the whole buffer), 1 for broadcast and memcpy. GB/s are 1e9 bytes/s.
 * The time of one measurement is the mean over ranks of each rank's time.
 *
 * Why interleaved: two launches of the same binary on this machine differ by
 * up to 2x, so for each size every backend is measured in turn, for several
 * rounds, and the median round is reported.
 *
 * How shm and mpi share one process group: without Open MPI built in, the
 * shm launcher forks the ranks (pt_launch) and only shm and memcpy run.
 * With it, `partrain bench comm --nproc N` re-executes itself under
 * `mpirun -np N`; each process then makes the mpi world and also attaches an
 * shm world among the same processes (mpi_native.h). The CLI never sees
 * mpi.h: Open MPI's calls are behind src/comm/mpi/mpi_native.h, whose
 * functions are weak (NULL when the mpi backend is not built).
 *
 * Not here: the collectives themselves, any tuning. */
#include "cli_impl.h"
#include "partrain/comm.h"
#include "../comm/mpi/mpi_native.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { BE_SHM, BE_MPI, BE_NATIVE, BE_MEMCPY, BE_COUNT };
static const char *const be_names[BE_COUNT] = {"shm", "mpi", "mpi_native", "memcpy"};

static const pt_comm_op bench_ops[] = {PT_OP_ALLREDUCE, PT_OP_REDUCE_SCATTER, PT_OP_ALLGATHER,
                                       PT_OP_BROADCAST};
#define NBENCH_OPS (int)(sizeof bench_ops / sizeof bench_ops[0])

typedef struct {
    int nproc, json, iters, rounds;
    size_t min_bytes, max_bytes;
    int op_on[NBENCH_OPS];
    int be_on[BE_COUNT];
    double timeout_s;
} bench_args;

/* Per-rank state of one run. */
typedef struct {
    const bench_args *a;
    int rank, size;
    pt_comm *shm, *mpi; /* NULL when not measured */
    int native;         /* mpi_native available (under mpirun) */
    pt_comm *ctl;       /* barrier / time averaging when native is absent */
    float *buf;
    char *src, *dst; /* memcpy, rank 0 */
} bench_run;

static void usage(FILE *f) {
    fprintf(
        f, "usage: partrain bench comm [--nproc N] [--json] [--ops LIST] [--backends LIST]\n"
           "                           [--min-bytes B] [--max-bytes B] [--iters K] [--rounds R]\n"
           "                           [--timeout S]\n\n"
           "Latency and bus bandwidth (nccl-tests definitions) of the collectives, every backend\n"
           "measured in turn for each size, R rounds, the median reported.\n\n"
           "  --nproc N        ranks (default 2); with Open MPI built in, re-runs itself under\n"
           "                   `mpirun -np N` so shm, mpi and mpi_native share the processes\n"
           "  --json           one JSON object per measurement per line: op, backend, ranks,\n"
           "                   bytes, iters, usec, algbw_gbps, busbw_gbps\n"
           "  --ops LIST       comma-separated: allreduce,reduce_scatter,allgather,broadcast\n"
           "                   (default all)\n"
           "  --backends LIST  comma-separated: shm,mpi,mpi_native,memcpy (default all available)\n"
           "  --min-bytes B    smallest buffer (default 8); suffixes K, M, G (powers of 1024)\n"
           "  --max-bytes B    largest buffer (default 64M); sizes double from min to max\n"
           "  --iters K        operations per measurement (default: 32 MiB / size, in 10..1000)\n"
           "  --rounds R       measurements per size and backend, median reported (default 5)\n"
           "  --timeout S      communication timeout in seconds (default 10)\n");
}

static int parse_bytes(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return -1;
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v == 0) return -1;
    *out = (size_t)v;
    return 0;
}

/* Sets on[i] for each comma-separated name in s; -1 naming the bad one. */
static int parse_list(const char *s, const char *const *names, int n, int *on, const char *what) {
    for (int i = 0; i < n; i++) on[i] = 0;
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", s);
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(t, names[i])) on[i] = found = 1;
        if (!found) {
            fprintf(stderr, "partrain bench comm: --%s: unknown name '%s'\n", what, t);
            return -1;
        }
    }
    return 0;
}

static int parse_args(int argc, char **argv, bench_args *a) {
    *a = (bench_args){.nproc = 2, .rounds = 5, .min_bytes = 8, .max_bytes = 64u << 20};
    for (int i = 0; i < NBENCH_OPS; i++) a->op_on[i] = 1;
    for (int i = 0; i < BE_COUNT; i++) a->be_on[i] = 1;
    const char *op_names[NBENCH_OPS];
    for (int i = 0; i < NBENCH_OPS; i++) op_names[i] = pt_comm_op_name(bench_ops[i]);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = strcmp(o, "--json") != 0;
        if (takes && !v) {
            fprintf(stderr, "partrain bench comm: %s needs a value (see --help)\n", o);
            return -1;
        }
        if (!strcmp(o, "--json")) {
            a->json = 1;
        } else if (!strcmp(o, "--nproc")) {
            a->nproc = atoi(v);
            if (a->nproc < 1 || a->nproc > 64) {
                fprintf(stderr, "partrain bench comm: --nproc %s: expected 1..64\n", v);
                return -1;
            }
        } else if (!strcmp(o, "--iters")) {
            a->iters = atoi(v);
            if (a->iters < 1) {
                fprintf(stderr, "partrain bench comm: --iters %s: expected >= 1\n", v);
                return -1;
            }
        } else if (!strcmp(o, "--rounds")) {
            a->rounds = atoi(v);
            if (a->rounds < 1 || a->rounds > 99) {
                fprintf(stderr, "partrain bench comm: --rounds %s: expected 1..99\n", v);
                return -1;
            }
        } else if (!strcmp(o, "--timeout")) {
            a->timeout_s = atof(v);
            if (!(a->timeout_s > 0)) {
                fprintf(stderr, "partrain bench comm: --timeout %s: expected seconds > 0\n", v);
                return -1;
            }
        } else if (!strcmp(o, "--min-bytes") || !strcmp(o, "--max-bytes")) {
            size_t *dst = o[2] == 'm' && o[3] == 'i' ? &a->min_bytes : &a->max_bytes;
            if (parse_bytes(v, dst)) {
                fprintf(stderr, "partrain bench comm: %s %s: expected bytes like 8, 64K, 64M\n", o,
                        v);
                return -1;
            }
        } else if (!strcmp(o, "--ops")) {
            if (parse_list(v, op_names, NBENCH_OPS, a->op_on, "ops")) return -1;
        } else if (!strcmp(o, "--backends")) {
            if (parse_list(v, be_names, BE_COUNT, a->be_on, "backends")) return -1;
        } else {
            fprintf(stderr, "partrain bench comm: unknown option '%s' (see --help)\n", o);
            return -1;
        }
        if (takes) i++;
    }
    if (a->min_bytes > a->max_bytes) {
        fprintf(stderr, "partrain bench comm: --min-bytes %zu is above --max-bytes %zu\n",
                a->min_bytes, a->max_bytes);
        return -1;
    }
    if (a->max_bytes > ((size_t)1 << 31)) {
        fprintf(stderr, "partrain bench comm: --max-bytes %zu: at most 2G\n", a->max_bytes);
        return -1;
    }
    return 0;
}

/* ---- measuring ------------------------------------------------------------------------- */

static double busbw_factor(pt_comm_op op, int n) {
    switch (op) {
    case PT_OP_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case PT_OP_REDUCE_SCATTER:
    case PT_OP_ALLGATHER:
        return (double)(n - 1) / n;
    default:
        return 1.0;
    }
}

static int iters_for(const bench_args *a, size_t bytes) {
    if (a->iters) return a->iters;
    size_t k = ((size_t)32 << 20) / bytes;
    return k < 10 ? 10 : k > 1000 ? 1000 : (int)k;
}

/* mpi_native's collectives; partrain's backends go through pt_comm_time. */
static pt_status run_native(pt_comm_op op, float *buf, size_t bytes) {
    return pt_mpi_native_run(op, buf, bytes);
}

/* The barrier of the native and memcpy measurements. */
static pt_status barrier(bench_run *r) {
    if (r->native) return pt_mpi_native_run(PT_OP_BARRIER, NULL, 0);
    return pt_comm_barrier(r->ctl);
}

/* Mean over ranks of *t. */
static pt_status time_mean(bench_run *r, double *t) {
    if (r->native) return pt_mpi_native_time_avg(t);
    float f = (float)*t;
    PT_CHECK(pt_comm_allreduce(r->ctl, &f, 1, PT_REDUCE_AVG));
    *t = f;
    return PT_OK;
}

/* Microseconds per operation of backend be (mean over ranks). */
static pt_status measure(bench_run *r, int be, pt_comm_op op, size_t bytes, int iters,
                         double *usec) {
    if (be == BE_MEMCPY) {
        /* One process copies; the others wait (they would share its memory
         * bandwidth otherwise). */
        PT_CHECK(barrier(r));
        double t = 0;
        if (r->rank == 0) {
            memcpy(r->dst, r->src, bytes); /* warm */
            uint64_t t0 = pt_time_ns();
            for (int i = 0; i < iters; i++) {
                memcpy(r->dst, r->src, bytes);
                __asm__ volatile("" : : "r"(r->dst) : "memory"); /* keep every copy */
            }
            t = (double)(pt_time_ns() - t0) / 1e3 / iters;
        }
        PT_CHECK(barrier(r));
        *usec = t; /* rank 0's: the only one reported */
        return PT_OK;
    }
    if (be == BE_SHM || be == BE_MPI) {
        double s;
        PT_CHECK(pt_comm_time(be == BE_SHM ? r->shm : r->mpi, op, r->buf, bytes, iters, &s));
        *usec = s * 1e6;
        return PT_OK;
    }
    int warm = 1 + iters / 10;
    if (warm > 5) warm = 5;
    for (int i = 0; i < warm; i++) PT_CHECK(run_native(op, r->buf, bytes));
    PT_CHECK(barrier(r));
    uint64_t t0 = pt_time_ns();
    for (int i = 0; i < iters; i++) PT_CHECK(run_native(op, r->buf, bytes));
    double t = (double)(pt_time_ns() - t0) / 1e3 / iters;
    PT_CHECK(time_mean(r, &t));
    *usec = t;
    return PT_OK;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static void print_header(const bench_run *r, pt_comm_op op, const int *on) {
    printf("\n# %s, %d ranks, median of %d rounds: time per operation (usec) and bus bandwidth "
           "(GB/s)\n",
           pt_comm_op_name(op), r->size, r->a->rounds);
    printf("%10s", "");
    for (int b = 0; b < BE_COUNT; b++)
        if (on[b]) printf(" | %-19s", be_names[b]);
    if (on[BE_SHM] && on[BE_NATIVE]) printf(" | shm/mpi_native");
    printf("\n%10s", "bytes");
    for (int b = 0; b < BE_COUNT; b++)
        if (on[b]) printf(" | %9s %9s", "usec", b == BE_MEMCPY ? "GB/s" : "busbw");
    if (on[BE_SHM] && on[BE_NATIVE]) printf(" | %14s", "busbw ratio");
    printf("\n");
}

static pt_status bench_all(bench_run *r) {
    const bench_args *a = r->a;
    int on[BE_COUNT];
    on[BE_SHM] = a->be_on[BE_SHM] && r->shm;
    on[BE_MPI] = a->be_on[BE_MPI] && r->mpi;
    on[BE_NATIVE] = a->be_on[BE_NATIVE] && r->native;
    on[BE_MEMCPY] = a->be_on[BE_MEMCPY];
    double samples[99];
    for (int oi = 0; oi < NBENCH_OPS; oi++) {
        if (!a->op_on[oi]) continue;
        pt_comm_op op = bench_ops[oi];
        if (r->rank == 0 && !a->json) print_header(r, op, on);
        for (size_t bytes = a->min_bytes; bytes <= a->max_bytes; bytes *= 2) {
            size_t nb = op == PT_OP_BROADCAST ? bytes : bytes / sizeof(float) * sizeof(float);
            if (nb == 0) continue;
            int iters = iters_for(a, nb);
            double med[BE_COUNT] = {0};
            double per[BE_COUNT][99];
            for (int round = 0; round < a->rounds; round++)
                for (int b = 0; b < BE_COUNT; b++)
                    if (on[b]) PT_CHECK(measure(r, b, op, nb, iters, &per[b][round]));
            for (int b = 0; b < BE_COUNT; b++) {
                if (!on[b]) continue;
                memcpy(samples, per[b], sizeof(double) * a->rounds);
                qsort(samples, a->rounds, sizeof(double), cmp_double);
                med[b] = samples[a->rounds / 2];
            }
            if (r->rank != 0) continue;
            if (!a->json) printf("%10zu", nb);
            for (int b = 0; b < BE_COUNT; b++) {
                if (!on[b]) continue;
                double algbw = med[b] > 0 ? (double)nb / (med[b] * 1e3) : 0; /* GB/s */
                double busbw = algbw * (b == BE_MEMCPY ? 1.0 : busbw_factor(op, r->size));
                if (a->json)
                    printf("{\"op\":\"%s\",\"backend\":\"%s\",\"ranks\":%d,\"bytes\":%zu,"
                           "\"iters\":%d,\"usec\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f}\n",
                           pt_comm_op_name(op), be_names[b], b == BE_MEMCPY ? 1 : r->size, nb,
                           iters, med[b], algbw, busbw);
                else
                    printf(" | %9.3f %9.3f", med[b], busbw);
            }
            if (!a->json && on[BE_SHM] && on[BE_NATIVE])
                printf(" | %13.2fx", med[BE_SHM] > 0 ? med[BE_NATIVE] / med[BE_SHM] : 0);
            if (!a->json) printf("\n");
            fflush(stdout);
        }
    }
    return PT_OK;
}

static pt_status alloc_buffers(bench_run *r) {
    size_t n = r->a->max_bytes + sizeof(float);
    r->buf = pt_mem_alloc(PT_MEM_COMM, n);
    if (!r->buf) return PT_ERR_NOMEM;
    memset(r->buf, 0, n); /* zeros: sums stay 0, no overflow or denormals; pages faulted in */
    if (r->rank == 0 && r->a->be_on[BE_MEMCPY]) {
        r->src = pt_mem_alloc(PT_MEM_SCRATCH, n);
        r->dst = pt_mem_alloc(PT_MEM_SCRATCH, n);
        if (!r->src || !r->dst) return PT_ERR_NOMEM;
        memset(r->src, 1, n);
        memset(r->dst, 2, n);
    }
    return PT_OK;
}

static void free_buffers(bench_run *r) {
    pt_mem_free(r->buf);
    pt_mem_free(r->src);
    pt_mem_free(r->dst);
}

static int fail(const bench_run *r, pt_status s) {
    fprintf(stderr, "partrain bench comm: rank %d: %s: %s\n", r->rank, pt_status_name(s),
            pt_error_message());
    return 1;
}

/* ---- under mpirun: shm + mpi + mpi_native in the same processes ------------------------ */

static int rank_main_mpi(const bench_args *a) {
    bench_run r = {.a = a};
    pt_comm_options o = {.backend = "mpi", .timeout_s = a->timeout_s};
    /* The mpi world first: it initializes MPI, and freeing it finalizes. */
    pt_status s = pt_comm_new(&r.mpi, &o);
    if (s != PT_OK) return fail(&r, s);
    r.rank = pt_comm_rank(r.mpi);
    r.size = pt_comm_size(r.mpi);
    int nr, ns;
    s = pt_mpi_native_init(&nr, &ns);
    if (s != PT_OK) {
        pt_comm_free(r.mpi);
        return fail(&r, s);
    }
    r.native = 1;
    if (a->be_on[BE_SHM]) {
        pt_comm_options so = {.backend = "shm", .timeout_s = a->timeout_s};
        s = pt_mpi_native_shm_world ? pt_mpi_native_shm_world(&so, &r.shm) : PT_ERR_UNSUPPORTED;
        if (s != PT_OK && r.rank == 0)
            fprintf(stderr, "partrain bench comm: shm not measured: %s\n", pt_error_message());
    }
    int rc = 0;
    s = alloc_buffers(&r);
    if (s == PT_OK) s = bench_all(&r);
    if (s != PT_OK) rc = fail(&r, s);
    free_buffers(&r);
    pt_comm_free(r.shm);
    pt_comm_free(r.mpi); /* measured or not, it owns MPI_Finalize */
    return rc;
}

/* Re-run this command under mpirun -np N (only returns on failure). */
static void reexec_under_mpirun(const bench_args *a, int argc, char **argv) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    char np[16];
    snprintf(np, sizeof np, "%d", a->nproc);
    char **v = calloc((size_t)argc + 12, sizeof *v);
    if (!v) return;
    int k = 0;
    v[k++] = "mpirun";
    v[k++] = "-np";
    v[k++] = np;
    v[k++] = "--oversubscribe";
    v[k++] = "--bind-to";
    v[k++] = "none";
    v[k++] = self;
    v[k++] = "bench";
    for (int i = 0; i < argc; i++) v[k++] = argv[i]; /* "comm" and its options */
    v[k] = NULL;
    if (geteuid() == 0) { /* Open MPI refuses root unless told */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    }
    setenv("PT_BENCH_UNDER_MPIRUN", "1", 1);
    fflush(stdout);
    fflush(stderr);
    execvp("mpirun", v);
    fprintf(stderr, "partrain bench comm: cannot run mpirun (%s); measuring shm and memcpy only\n",
            strerror(errno));
    free(v);
}

/* ---- the shm launcher: shm (and memcpy) only --------------------------------------------- */

static int rank_main_shm(void *arg) {
    const bench_args *a = arg;
    bench_run r = {.a = a};
    pt_comm_options o = {.backend = "shm", .timeout_s = a->timeout_s};
    pt_status s = pt_comm_new(&r.shm, &o);
    if (s != PT_OK) return fail(&r, s);
    r.ctl = r.shm;
    r.rank = pt_comm_rank(r.shm);
    r.size = pt_comm_size(r.shm);
    int rc = 0;
    s = alloc_buffers(&r);
    if (s == PT_OK) s = bench_all(&r);
    if (s != PT_OK) rc = fail(&r, s);
    free_buffers(&r);
    pt_comm_free(r.shm);
    return rc;
}

int pt_cli_bench_comm(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    bench_args a;
    if (parse_args(argc, argv, &a)) return 2;
    if (!pt_knob_is_set("PT_LOG")) pt_log_set_level(PT_LOG_WARN);
    int have_mpi = pt_mpi_native_init != NULL;
    if (have_mpi && (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK")))
        return rank_main_mpi(&a);
    if (have_mpi && !getenv("PT_BENCH_UNDER_MPIRUN") &&
        (a.be_on[BE_MPI] || a.be_on[BE_NATIVE] || a.be_on[BE_SHM]))
        reexec_under_mpirun(&a, argc, argv);
    else if (!have_mpi && (a.be_on[BE_MPI] || a.be_on[BE_NATIVE]))
        fprintf(stderr, "partrain bench comm: built without Open MPI: measuring shm and memcpy\n");
    a.be_on[BE_MPI] = a.be_on[BE_NATIVE] = 0;
    pt_comm_options o = {.backend = "shm", .timeout_s = a.timeout_s};
    int exit_code = 1;
    pt_status s = pt_launch(a.nproc, rank_main_shm, &a, &o, &exit_code);
    if (s != PT_OK) {
        fprintf(stderr, "partrain bench comm: %s\n", pt_error_message());
        return 1;
    }
    return exit_code;
}
