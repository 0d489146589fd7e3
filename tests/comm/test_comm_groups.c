/* Progress per group: queued operations of different communicators never
 * wait behind each other, and no order in which ranks queue operations of
 * two groups can deadlock (comm.h, Ordering). On any backend:
 *
 *   test_comm_groups --backend shm --nproc N     launches N ranks itself
 *   mpirun -np N test_comm_groups --backend mpi  each process is a rank
 *   ... --case a|b                               only (a) or only (b)
 *
 * Groups: a split of the world (all ranks) and the world itself; each case
 * runs with A = the split, B = the world, then the other way round.
 *
 * (a) Opposite orders. Even ranks queue a large all-reduce on A, then a
 *     small one on B; odd ranks queue the small one on B, wait for it, and
 *     only then queue the large one on A. It must complete (no deadlock)
 *     within the comm timeout, with the right sums. On the even ranks the
 *     small operation must have started before the large one ended: their
 *     A cannot complete before the odd ranks join it, which they do only
 *     after B completed, which needs the even ranks in B (a structural
 *     order, not a timing: the progress thread stamps an operation's start
 *     before it runs and its end after). Not "ended first": a lane thread
 *     preempted between finishing B and stamping its end can stamp it after
 *     A's (seen once in CI, by 0.08 ms). With one progress queue per
 *     process the even ranks' B waits behind their A, which waits for the
 *     odd ranks' A, which waits for B: a deadlock that the timeout ends.
 * (b) A large operation does not delay a small one. Every rank queues a
 *     64 MiB all-reduce on A, then a small all-reduce on B, in the same
 *     order, in each of 3 rounds. With one queue per process the small one
 *     starts only after the large one ended, every time: a single round in
 *     which it ended first (the progress threads' end times,
 *     pt_comm_wait_timed) is proof that it did not wait behind it, and the
 *     test asks for one. Not every round: the large one takes a few
 *     milliseconds, about a scheduler time slice, and with more busy
 *     threads than cores (ctest -j on 2 cores) the small one's lane may
 *     get no core until it ends (seen once in CI: started 4.9 ms into a
 *     5.5 ms all-reduce, ended 15 us after it).
 *
 * Oracle: rank r's element i is val(r, i); the sums are checked in double. */
#include "partrain/comm.h"
#include "pt_test.h"

#include <stdlib.h>
#include <string.h>

static pt_comm *world;

static float val(int rank, size_t i) {
    return 0.25f + (float)rank * 0.5f + (float)(i % 1013) * (1.0f / 1024.0f);
}

static void fill(float *b, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) b[i] = val(rank, i);
}

static int off_sum(const float *b, size_t i, int size) {
    double want = 0;
    for (int r = 0; r < size; r++) want += val(r, i);
    return !(fabs(b[i] - want) <= (double)size * 0x1p-22 * want);
}

/* Index of the first element of b[0, n) that is not the sum over ranks
 * (of every stride-th element and the last), or n. */
static size_t check_sum(const float *b, size_t n, int size, size_t stride) {
    for (size_t i = 0; i < n; i += stride)
        if (off_sum(b, i, size)) return i;
    return n && off_sum(b, n - 1, size) ? n - 1 : n;
}

static float *buf_new(size_t n) {
    float *b = pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float));
    PT_ASSERT(b);
    return b;
}

#define SMALL 256

static void test_opposite_orders(pt_comm *a, pt_comm *b) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    size_t big = (size_t)4 << 20; /* 16 MiB */
    float *x = buf_new(big), *y = buf_new(SMALL);
    fill(x, big, me);
    fill(y, SMALL, me);
    pt_comm_req *ra = NULL, *rb = NULL;
    uint64_t a_end = 0, b_start = 0;
    if (me % 2 == 0) {
        CHECK_OK(pt_comm_iallreduce(a, x, big, PT_REDUCE_SUM, &ra));
        CHECK_OK(pt_comm_iallreduce(b, y, SMALL, PT_REDUCE_SUM, &rb));
        CHECK_OK(pt_comm_wait_timed(rb, &b_start, NULL));
        CHECK_OK(pt_comm_wait_timed(ra, NULL, &a_end));
        if (!(b_start < a_end))
            fprintf(stderr,
                    "rank %d: the small operation on B started %.3f ms after the large one "
                    "on A ended\n",
                    me, (double)(b_start - a_end) * 1e-6);
        CHECK(b_start < a_end);
    } else {
        CHECK_OK(pt_comm_iallreduce(b, y, SMALL, PT_REDUCE_SUM, &rb));
        CHECK_OK(pt_comm_wait(rb));
        CHECK_OK(pt_comm_iallreduce(a, x, big, PT_REDUCE_SUM, &ra));
        CHECK_OK(pt_comm_wait(ra));
    }
    CHECK_EQ(check_sum(x, big, n, 997), big);
    CHECK_EQ(check_sum(y, SMALL, n, 1), (size_t)SMALL);
    pt_mem_free(x);
    pt_mem_free(y);
}

static void test_large_does_not_delay_small(pt_comm *a, pt_comm *b) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    size_t big = (size_t)16 << 20; /* 64 MiB */
    float *x = buf_new(big), *y = buf_new(SMALL);
    int first = 0; /* rounds in which the small one ended first */
    for (int round = 0; round < 3; round++) {
        fill(x, big, me);
        fill(y, SMALL, me);
        CHECK_OK(pt_comm_barrier(world));
        pt_comm_req *ra = NULL, *rb = NULL;
        uint64_t a_start = 0, a_end = 0, b_start = 0, b_end = 0;
        CHECK_OK(pt_comm_iallreduce(a, x, big, PT_REDUCE_SUM, &ra));
        CHECK_OK(pt_comm_iallreduce(b, y, SMALL, PT_REDUCE_SUM, &rb));
        CHECK_OK(pt_comm_wait_timed(rb, &b_start, &b_end));
        CHECK_OK(pt_comm_wait_timed(ra, &a_start, &a_end));
        if (!(b_end < a_end))
            fprintf(stderr,
                    "rank %d round %d: large on A ran %.3f ms, small on B started %.3f ms and "
                    "ended %.3f ms after it started\n",
                    me, round, (double)(a_end - a_start) * 1e-6,
                    ((double)b_start - (double)a_start) * 1e-6,
                    ((double)b_end - (double)a_start) * 1e-6);
        first += b_end < a_end;
        CHECK_EQ(check_sum(x, big, n, 4099), big);
        CHECK_EQ(check_sum(y, SMALL, n, 1), (size_t)SMALL);
    }
    CHECK(first > 0);
    pt_mem_free(x);
    pt_mem_free(y);
}

static pt_comm *group_a, *group_b;

/* Both ways round: the large operation on the split, then on the world
 * (backends may treat the world apart: mpi's blocking path). */
static void test_opposite(void) {
    test_opposite_orders(group_a, group_b);
    test_opposite_orders(group_b, group_a);
}
static void test_no_delay(void) {
    test_large_does_not_delay_small(group_a, group_b);
    test_large_does_not_delay_small(group_b, group_a);
}

typedef struct {
    const char *backend;
    double timeout_s;
    const char *only; /* --case a|b: one of the two (showing each fail alone) */
} config;

static int rank_main(void *arg) {
    const config *cfg = arg;
    pt_comm_options opt = {cfg->backend, cfg->timeout_s};
    if (pt_comm_new(&world, &opt) != PT_OK) {
        fprintf(stderr, "pt_comm_new: %s\n", pt_error_message());
        return 2;
    }
    CHECK_OK(pt_comm_split(world, 0, pt_comm_rank(world), &group_a));
    group_b = world;
    if (pt_comm_size(world) >= 2) {
        if (!cfg->only || !strcmp(cfg->only, "a")) RUN(test_opposite);
        if (!cfg->only || !strcmp(cfg->only, "b")) RUN(test_no_delay);
    }
    CHECK_OK(pt_comm_barrier(world));
    int rank = pt_comm_rank(world), size = pt_comm_size(world);
    pt_comm_free(group_a);
    pt_comm_free(world);
    if (rank == 0 || pt_test_failed_) {
        printf("rank %d of %d (%s): ", rank, size, cfg->backend);
        return TEST_DONE();
    }
    return 0;
}

int main(int argc, char **argv) {
    config cfg = {"shm", 5, NULL};
    int nproc = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            cfg.backend = argv[++i];
        else if (!strcmp(argv[i], "--nproc") && i + 1 < argc)
            nproc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--case") && i + 1 < argc)
            cfg.only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--backend shm|mpi] [--nproc N] [--case a|b]\n", argv[0]);
            return 2;
        }
    }
    if (strcmp(cfg.backend, "shm") != 0) return rank_main(&cfg); /* started by mpirun */
    int code = 1;
    pt_comm_options opt = {"shm", cfg.timeout_s};
    if (pt_launch(nproc, rank_main, &cfg, &opt, &code) != PT_OK) {
        fprintf(stderr, "pt_launch: %s\n", pt_error_message());
        return 2;
    }
    return code;
}
