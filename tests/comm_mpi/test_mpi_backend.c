/* The mpi backend tested directly through its table (comm_impl.h), launched
 * by mpirun: every collective against a reference computed in double
 * precision, uneven counts, sub-communicators of a 2 x (n/2) mesh used at the
 * same time, point-to-point in a ring, two threads issuing operations on two
 * communicators at once (the progress-thread model), and fault modes for the
 * failure tests:
 *
 *   test_mpi_backend                    the checks; exit 0 when all pass
 *   test_mpi_backend --max-count N      largest element count (default 1M + 3)
 *   test_mpi_backend --kill R [--after K]    rank R SIGKILLs itself in the K-th all-reduce
 *   test_mpi_backend --stall R          rank R never joins the all-reduce loop
 *   test_mpi_backend --stop R [--after K]   rank R SIGSTOPs itself in the K-th all-reduce
 *   test_mpi_backend --wedge-stop R     at the 30th all-reduce rank R (> 0) joins one on a
 *                                       communicator of its own with rank 0 late (0.4
 *                                       timeouts) and SIGSTOPs 0.5 s into it: at the
 *                                       others' deadline every rank waits in a collective
 *                                       and R has been silent for less than half the
 *                                       timeout (a rank stopped soon after it joined)
 *   test_mpi_backend --stop-save        a save as the trainer does it (a long progress
 *                                       timeout while rank 0 writes): a slow save of 3
 *                                       timeouts passes, then rank 0 SIGSTOPs in the next
 * A fault prints one line: the rank that notices it (the backend's verdict), the
 * others nothing (fault_reported).
 *   test_mpi_backend --loop S           all-reduce of 1 MiB for S seconds (link-cut test)
 *   ... --timeout S                     the comm timeout (pt_comm_options.timeout_s; default 10)
 *   ... --tag WORD                      ignored; lets a test script find its processes
 *
 * In the fault modes the surviving ranks must report PT_ERR_TIMEOUT (or
 * PT_ERR_COMM) naming the operation and exit 3; mpirun then ends the job.
 * The shared conformance test (tests/comm/test_comm_conformance.c) checks the
 * same through the public wrappers; this one does not need them. */
#include "comm_impl.h"
#include "pt_test.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const pt_comm_backend *be;
static void *world;
static int me, np;
static size_t max_count = (1u << 20) + 3;

/* The shard rule of comm.h, written out as the oracle (the wrappers' own
 * pt_comm_shard is tested in tests/comm). */
static void shard(size_t count, int size, int rank, size_t *off, size_t *n) {
    size_t base = count / (size_t)size, extra = count % (size_t)size, r = (size_t)rank;
    *n = base + (r < extra);
    *off = r * base + (r < extra ? r : extra);
}

static float val(int rank, size_t i) {
    return pt_rng_uniform_at(1000u + (uint64_t)rank, i) - 0.5f;
}

static void fill(float *b, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) b[i] = val(rank, i);
}

static double ref_sum(int size, size_t i, const int *ranks) {
    double s = 0;
    for (int r = 0; r < size; r++) s += val(ranks ? ranks[r] : r, i);
    return s;
}

/* Every collective on ctx (rank r of n; ranks[] maps its ranks to world
 * ranks for the reference, NULL = identity) for one count. */
static void check_collectives(void *ctx, int r, int n, const int *ranks, size_t count, float *buf) {
    int wr = ranks ? ranks[r] : r;
    for (int avg = 0; avg < 2; avg++) {
        pt_reduce_op op = avg ? PT_REDUCE_AVG : PT_REDUCE_SUM;
        double k = avg ? 1.0 / n : 1.0;
        fill(buf, count, wr);
        CHECK_OK(be->allreduce(ctx, buf, count, op));
        int bad = 0;
        for (size_t i = 0; i < count && bad < 3; i++) {
            double want = k * ref_sum(n, i, ranks);
            if (!(fabs(buf[i] - want) <= 1e-5 + 1e-5 * fabs(want))) {
                fprintf(stderr, "rank %d: allreduce %s count %zu [%zu] = %.9g, want %.9g\n", me,
                        avg ? "avg" : "sum", count, i, buf[i], want);
                bad++;
            }
        }
        CHECK_EQ(bad, 0);

        fill(buf, count, wr);
        CHECK_OK(be->reduce_scatter(ctx, buf, count, op));
        size_t off, m;
        shard(count, n, r, &off, &m);
        bad = 0;
        for (size_t i = off; i < off + m && bad < 3; i++) {
            double want = k * ref_sum(n, i, ranks);
            if (!(fabs(buf[i] - want) <= 1e-5 + 1e-5 * fabs(want))) {
                fprintf(stderr, "rank %d: reduce_scatter count %zu [%zu] = %.9g, want %.9g\n", me,
                        count, i, buf[i], want);
                bad++;
            }
        }
        CHECK_EQ(bad, 0);
    }
    /* all-gather: each rank's shard holds its own values. */
    for (size_t i = 0; i < count; i++) buf[i] = -1e9f;
    size_t off, m;
    shard(count, n, r, &off, &m);
    for (size_t i = off; i < off + m; i++) buf[i] = val(wr, i);
    CHECK_OK(be->allgather(ctx, buf, count));
    int bad = 0;
    for (int q = 0; q < n; q++) {
        shard(count, n, q, &off, &m);
        for (size_t i = off; i < off + m && bad < 3; i++)
            if (buf[i] != val(ranks ? ranks[q] : q, i)) {
                fprintf(stderr, "rank %d: allgather count %zu [%zu] = %g, want %g\n", me, count, i,
                        buf[i], val(ranks ? ranks[q] : q, i));
                bad++;
            }
    }
    CHECK_EQ(bad, 0);
    /* broadcast from the last rank, of bytes (odd sizes too). */
    size_t bytes = count * sizeof(float) - (count > 1 ? 1 : 0);
    int root = n - 1;
    if (r == root)
        fill(buf, count, 77);
    else
        memset(buf, 0, count * sizeof(float));
    CHECK_OK(be->broadcast(ctx, buf, bytes, root));
    float want[1];
    fill(want, 1, 77);
    CHECK(memcmp(buf, want, sizeof(float) < bytes ? sizeof(float) : bytes) == 0);
    CHECK_OK(be->barrier(ctx));
}

static void test_world(void) {
    void *w = world;
    float *buf = pt_mem_alloc(PT_MEM_COMM, max_count * sizeof(float));
    PT_ASSERT(buf);
    size_t counts[] = {1, 2, 3, 5, 7, 8, 13, 1000, 4097, 65537, max_count};
    for (size_t j = 0; j < sizeof counts / sizeof counts[0]; j++)
        if (counts[j] <= max_count) check_collectives(w, me, np, NULL, counts[j], buf);
    pt_mem_free(buf);
}

/* Ring send/recv with two tags. (Received in sending order: a blocking MPI
 * send of a large message may wait for its matching receive.) */
static void test_p2p(void) {
    void *w = world;
    if (np < 2) return;
    int next = (me + 1) % np, prev = (me + np - 1) % np;
    enum { N = 5000 };
    static int a[N], b[N], ra[N], rb[N];
    for (int i = 0; i < N; i++) a[i] = me * 100000 + i, b[i] = -a[i];
    /* Even ranks send first; odd receive first (no deadlock for any n). */
    if (me % 2 == 0) {
        CHECK_OK(be->send(w, a, sizeof a, next, 1));
        CHECK_OK(be->send(w, b, sizeof b, next, 2));
        CHECK_OK(be->recv(w, ra, sizeof ra, prev, 1));
        CHECK_OK(be->recv(w, rb, sizeof rb, prev, 2));
    } else {
        CHECK_OK(be->recv(w, ra, sizeof ra, prev, 1));
        CHECK_OK(be->recv(w, rb, sizeof rb, prev, 2));
        CHECK_OK(be->send(w, a, sizeof a, next, 1));
        CHECK_OK(be->send(w, b, sizeof b, next, 2));
    }
    CHECK_EQ(ra[N - 1], prev * 100000 + N - 1);
    CHECK_EQ(rb[7], -(prev * 100000 + 7));
    /* Errors are values: a bad peer or tag is PT_ERR_INVALID, not an abort. */
    CHECK_EQ(be->send(w, a, 4, np, 0), PT_ERR_INVALID);
    CHECK_EQ(be->recv(w, a, 4, 0, -17), PT_ERR_INVALID); /* -16..-1: the generic collectives' */
}

typedef struct {
    void *ctx;
    int rank, size;
    int *ranks;
    size_t count;
    float *buf;
} job;

static void *thread_main(void *arg) {
    job *j = arg;
    for (int it = 0; it < 3; it++)
        check_collectives(j->ctx, j->rank, j->size, j->ranks, j->count, j->buf);
    return NULL;
}

/* A 2 x (np/2) mesh: rows (color = rank / cols) and columns (rank % cols)
 * used at the same time from two threads, as the progress thread and the
 * main thread do. */
static void test_split(void) {
    void *w = world;
    if (np < 4 || np % 2) return;
    int cols = np / 2;
    void *row, *col;
    int rr, rs, cr, cs;
    CHECK_OK(be->split(w, me / cols, me, &row, &rr, &rs));
    CHECK_OK(be->split(w, me % cols, -me, &col, &cr, &cs)); /* key reverses the order */
    CHECK_EQ(rs, cols);
    CHECK_EQ(cs, 2);
    CHECK_EQ(rr, me % cols);
    CHECK_EQ(cr, 1 - me / cols);
    int rowranks[64], colranks[2];
    for (int q = 0; q < cols; q++) rowranks[q] = (me / cols) * cols + q;
    colranks[0] = cols + me % cols; /* key -me: the higher world rank first */
    colranks[1] = me % cols;
    size_t n = 100003;
    float *b1 = pt_mem_alloc(PT_MEM_COMM, n * sizeof(float));
    float *b2 = pt_mem_alloc(PT_MEM_COMM, n * sizeof(float));
    PT_ASSERT(b1 && b2);
    job jr = {row, rr, rs, rowranks, n, b1}, jc = {col, cr, cs, colranks, n, b2};
    pthread_t t;
    PT_ASSERT(pthread_create(&t, NULL, thread_main, &jr) == 0);
    thread_main(&jc);
    pthread_join(t, NULL);
    pt_mem_free(b1);
    pt_mem_free(b2);
    be->free(row);
    be->free(col);
}

/* An error line unless the backend's verdict is the job's one line. */
static void report(void *w, pt_status s) {
    if (be->fault_reported && be->fault_reported(w, s)) return;
    fprintf(stderr, "rank %d: error: %s: %s\n", me, pt_status_name(s), pt_error_message());
}

/* The job's progress timeout (--timeout, else the default 10 s). */
static double timeout_s = 10;
static double comm_timeout(void) {
    return timeout_s;
}

/* Two saves: rank 0 writes for 3 timeouts (alive) while the others wait
 * under a long progress timeout, which must pass; in the second rank 0
 * stops, which must be noticed within the (liveness) timeout. */
static int stop_save(void *w) {
    double timeout = comm_timeout();
    for (int save = 0; save < 2; save++) {
        double old = be->set_timeout(w, 600);
        if (me == 0 && save == 0) usleep((useconds_t)(3 * timeout * 1e6));
        if (me == 0 && save == 1) {
            fprintf(stderr, "rank 0: SIGSTOP while saving\n");
            raise(SIGSTOP);
        }
        pt_status s = be->barrier(w);
        if (s != PT_OK) {
            report(w, s);
            be->free(w);
            return 3;
        }
        be->set_timeout(w, old);
        if (save == 0) fprintf(stderr, "rank %d: slow save passed\n", me);
    }
    be->free(w);
    return 4; /* must not finish */
}

static void *stop_soon(void *arg) {
    (void)arg;
    usleep(500000); /* its next beats say where it waits */
    kill(getpid(), SIGSTOP);
    return NULL;
}

/* --wedge-stop R: every rank waits in a collective (R in one on {R, 0},
 * the others on the world, so neither completes); R stops. One line must
 * name R, as stopped or as not taking part (fault_test.sh says when each
 * is right), not a timeout line per rank. */
static int wedge_stop(void *w, int r) {
    double timeout = comm_timeout();
    void *pair;
    int pr, ps;
    PT_ASSERT(be->split(w, me == r || me == 0 ? 0 : 1, me, &pair, &pr, &ps) == PT_OK);
    float buf[1024] = {0};
    for (int it = 0;; it++) {
        pt_status s;
        if (me == r && it == 30) {
            fprintf(stderr, "rank %d: late, in a collective the others are not in, then SIGSTOP\n",
                    me);
            usleep((useconds_t)(0.4 * timeout * 1e6));
            pthread_t t;
            PT_ASSERT(pthread_create(&t, NULL, stop_soon, NULL) == 0);
            pthread_detach(t);
            s = be->allreduce(pair, buf, 1024, PT_REDUCE_SUM);
        } else {
            s = be->allreduce(w, buf, 1024, PT_REDUCE_SUM);
        }
        if (s != PT_OK) {
            report(w, s);
            be->free(pair);
            be->free(w);
            return 3;
        }
        if (it > 60) break; /* should never get here */
    }
    be->free(pair);
    be->free(w);
    return 4; /* must not finish */
}

/* Fault modes: all-reduce 1 MiB in a loop. Returns the process exit code. */
static int fault_loop(void *w, int kill_rank, int after, int stall_rank, int stop_rank,
                      double seconds) {
    size_t n = (1u << 20) / sizeof(float);
    float *buf = pt_mem_alloc(PT_MEM_COMM, n * sizeof(float));
    PT_ASSERT(buf);
    if (me == stall_rank) {
        fprintf(stderr, "rank %d: stalling (never joins the all-reduce)\n", me);
        sleep(3600);
    }
    double t0 = pt_time_s();
    for (long it = 0;; it++) {
        if (seconds > 0 && pt_time_s() - t0 > seconds) break;
        if (kill_rank >= 0 && pt_time_s() - t0 > 20) break; /* should never get here */
        if (me == kill_rank && it == after) {
            fprintf(stderr, "rank %d: SIGKILL in all-reduce %ld\n", me, it);
            raise(SIGKILL);
        }
        if (me == stop_rank && it == after) {
            fprintf(stderr, "rank %d: SIGSTOP in all-reduce %ld\n", me, it);
            raise(SIGSTOP);
        }
        pt_status s = be->allreduce(w, buf, n, PT_REDUCE_AVG);
        if (s != PT_OK) {
            report(w, s);
            be->free(w);
            return 3;
        }
        if (seconds > 0 && me == 0 && it % 200 == 0)
            fprintf(stderr, "rank 0: %ld all-reduces, %.1f s\n", it, pt_time_s() - t0);
    }
    pt_mem_free(buf);
    be->free(w);
    /* a fault mode must not finish */
    return (kill_rank >= 0 || stall_rank >= 0 || stop_rank >= 0) ? 4 : 0;
}

int main(int argc, char **argv) {
    int kill_rank = -1, after = 20, stall_rank = -1, stop_rank = -1, stop_in_save = 0;
    int wedge = -1;
    double seconds = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-count") && i + 1 < argc)
            max_count = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--kill") && i + 1 < argc)
            kill_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--after") && i + 1 < argc)
            after = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stall") && i + 1 < argc)
            stall_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stop") && i + 1 < argc)
            stop_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--wedge-stop") && i + 1 < argc)
            wedge = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stop-save"))
            stop_in_save = 1;
        else if (!strcmp(argv[i], "--loop") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc && atof(argv[i + 1]) > 0)
            timeout_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tag") && i + 1 < argc)
            i++; /* ignored: marks the processes of one test run for pgrep */
        else {
            fprintf(stderr,
                    "usage: %s [--max-count N] [--kill R [--after K]] [--stall R] [--stop R] "
                    "[--wedge-stop R] [--stop-save] [--loop S] [--timeout S]\n",
                    argv[0]);
            return 2;
        }
    }
    pt_comm_options opt = {.backend = "mpi", .timeout_s = timeout_s};
    void *w;
    pt_status s = pt_comm_mpi_desc.world(&opt, &be, &w, &me, &np);
    if (s != PT_OK) {
        fprintf(stderr, "mpi world: %s: %s\n", pt_status_name(s), pt_error_message());
        return s == PT_ERR_UNSUPPORTED ? 77 : 1;
    }
    if (stop_in_save) return stop_save(w);
    if (wedge > 0 && wedge < np) return wedge_stop(w, wedge);
    if (kill_rank >= 0 || stall_rank >= 0 || stop_rank >= 0 || seconds > 0)
        return fault_loop(w, kill_rank, after, stall_rank, stop_rank, seconds);

    world = w;
    RUN(test_world);
    RUN(test_p2p);
    RUN(test_split);
    int failed = pt_test_failed_ > 0;
    /* Every rank agrees on the verdict. */
    float f = (float)failed;
    CHECK_OK(be->allreduce(w, &f, 1, PT_REDUCE_SUM));
    be->free(w);
    if (me == 0)
        printf("test_mpi_backend: %d ranks, %d passed, %d failed on rank 0; %s\n", np,
               pt_test_passed_, pt_test_failed_,
               f > 0 ? "FAILED on some rank" : "all ranks passed");
    return f > 0 ? 1 : 0;
}
