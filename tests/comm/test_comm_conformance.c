/* Conformance of a comm backend: every operation, blocking and not, against
 * values computed in double precision.
 *
 *   test_comm_conformance --backend shm --nproc N [--max-count C]
 *       launches N ranks itself (pt_launch)
 *   mpirun -np N test_comm_conformance --backend mpi [--max-count C]
 *       each process is a rank
 *
 * Every rank runs the same cases and exits non-zero if one failed; failed
 * checks print both values. The oracle: rank r's input element i is
 * val(r, i) > 0; the reference sum is accumulated in double. */
#include "partrain/comm.h"
#include "pt_test.h"

#include <stdlib.h>
#include <string.h>

static pt_comm *world;
static size_t max_count = 1u << 20;

static float val(int rank, size_t i) {
    return 0.25f + (float)rank * 0.5f + (float)(i % 1013) * (1.0f / 1024.0f);
}

static double ref_sum(int n, size_t i, const int *ranks) {
    double s = 0;
    for (int r = 0; r < n; r++) s += val(ranks ? ranks[r] : r, i);
    return s;
}

/* Tolerance: every input is positive, so a float32 sum of n terms in any
 * order is within (n-1) * 2^-24 * sum (relative) of the exact sum of the
 * same float inputs (Higham, Accuracy and Stability, 4.2), plus one rounding
 * of the division for AVG; n * 2^-22 covers both with margin. */
static double rtol_for(int n) {
    return (double)n * 0x1p-22;
}

/* First element of buf[lo, hi) off the reference, or hi. */
static size_t check_reduced(const float *buf, size_t lo, size_t hi, int n, const int *ranks,
                            int avg) {
    for (size_t i = lo; i < hi; i++) {
        double want = ref_sum(n, i, ranks) / (avg ? n : 1);
        if (!(fabs(buf[i] - want) <= rtol_for(n) * want)) return i;
    }
    return hi;
}

static const size_t counts[] = {
    1, 2, 3, 7, 17, 1000, 4095, 4096, 4097, 65536 + 3, 262144 + 11, (1u << 20) + 5, (3u << 19) + 1};
#define NCOUNTS (sizeof counts / sizeof counts[0])

static float *buf_new(size_t n) {
    float *b = pt_mem_alloc(PT_MEM_SCRATCH, (n ? n : 1) * sizeof(float));
    PT_ASSERT(b);
    return b;
}

static void fill(float *b, size_t n, int rank) {
    for (size_t i = 0; i < n; i++) b[i] = val(rank, i);
}

static void test_allreduce(void) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    for (size_t k = 0; k < NCOUNTS && counts[k] <= max_count; k++) {
        size_t c = counts[k];
        float *b = buf_new(c);
        for (int avg = 0; avg < 2; avg++) {
            fill(b, c, me);
            CHECK_OK(pt_comm_allreduce(world, b, c, avg ? PT_REDUCE_AVG : PT_REDUCE_SUM));
            size_t bad = check_reduced(b, 0, c, n, NULL, avg);
            if (bad < c) {
                fprintf(stderr, "allreduce count %zu avg %d at %zu\n", c, avg, bad);
                CHECK_NEAR(b[bad], ref_sum(n, bad, NULL) / (avg ? n : 1), 0, rtol_for(n));
            }
        }
        pt_mem_free(b);
    }
}

static void test_reduce_scatter(void) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    for (size_t k = 0; k < NCOUNTS && counts[k] <= max_count; k++) {
        size_t c = counts[k], off, len;
        pt_comm_shard(c, n, me, &off, &len);
        float *b = buf_new(c);
        for (int avg = 0; avg < 2; avg++) {
            fill(b, c, me);
            CHECK_OK(pt_comm_reduce_scatter(world, b, c, avg ? PT_REDUCE_AVG : PT_REDUCE_SUM));
            size_t bad = check_reduced(b, off, off + len, n, NULL, avg);
            if (bad < off + len) {
                fprintf(stderr, "reduce_scatter count %zu avg %d at %zu\n", c, avg, bad);
                CHECK_NEAR(b[bad], ref_sum(n, bad, NULL) / (avg ? n : 1), 0, rtol_for(n));
            }
        }
        pt_mem_free(b);
    }
}

static void test_allgather(void) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    for (size_t k = 0; k < NCOUNTS && counts[k] <= max_count; k++) {
        size_t c = counts[k], off, len;
        pt_comm_shard(c, n, me, &off, &len);
        float *b = buf_new(c);
        for (size_t i = 0; i < c; i++) b[i] = -1.0f;
        for (size_t i = off; i < off + len; i++) b[i] = val(0, i);
        CHECK_OK(pt_comm_allgather(world, b, c));
        size_t bad = c;
        for (size_t i = 0; i < c && bad == c; i++)
            if (b[i] != val(0, i)) bad = i;
        if (bad < c) {
            fprintf(stderr, "allgather count %zu at %zu\n", c, bad);
            CHECK_NEAR(b[bad], val(0, bad), 0, 0);
        }
        pt_mem_free(b);
    }
}

static void test_broadcast(void) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    const size_t sizes[] = {1, 13, 4096, 300001, (4u << 20) + 3};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t bytes = sizes[k];
        if (bytes > max_count * 4) break;
        unsigned char *b = pt_mem_alloc(PT_MEM_SCRATCH, bytes);
        for (int root = 0; root < n; root++) {
            for (size_t i = 0; i < bytes; i++)
                b[i] = me == root ? (unsigned char)(i * 7 + root) : 0xee;
            CHECK_OK(pt_comm_broadcast(world, b, bytes, root));
            size_t bad = bytes;
            for (size_t i = 0; i < bytes && bad == bytes; i++)
                if (b[i] != (unsigned char)(i * 7 + root)) bad = i;
            if (bad < bytes) fprintf(stderr, "broadcast %zu from %d at %zu\n", bytes, root, bad);
            CHECK_EQ(bad, bytes);
        }
        pt_mem_free(b);
    }
}

/* Ring: everyone sends to the right and receives from the left. A send may
 * wait for its receiver (shm: when the message does not fit the pair's
 * ring), so even ranks send first and odd ranks receive first. Small
 * messages (and on shm, one repetition of every size) also go non-blocking:
 * isend then irecv, waited together. */
static void test_sendrecv(void) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    const size_t sizes[] = {0, 5, 64, 100003, (2u << 20) + 1};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t bytes = sizes[k];
        if (bytes > max_count * 4) break;
        if (n == 1 && bytes > 32768) break; /* a blocking send to oneself must fit */
        unsigned char *out = pt_mem_alloc(PT_MEM_SCRATCH, bytes + 1);
        unsigned char *in = pt_mem_alloc(PT_MEM_SCRATCH, bytes + 1);
        int right = (me + 1) % n, left = (me + n - 1) % n;
        for (int rep = 0; rep < 3; rep++) {
            for (size_t i = 0; i < bytes; i++) out[i] = (unsigned char)(i + me * 31 + rep);
            memset(in, 0, bytes + 1);
            /* Large non-blocking exchanges only where isend and irecv
             * progress at the same time (shm); with a single in-order
             * progress thread they deadlock past the eager size. */
            int nb_ok = bytes <= 64 || (!strcmp(pt_comm_backend_name(world), "shm") && n > 1);
            if (nb_ok && (bytes <= 64 || rep == 1)) {
                pt_comm_req *qs = NULL, *qr = NULL;
                CHECK_OK(pt_comm_isend(world, out, bytes, right, rep + 1, &qs));
                CHECK_OK(pt_comm_irecv(world, in, bytes, left, rep + 1, &qr));
                CHECK_OK(pt_comm_wait(qs));
                CHECK_OK(pt_comm_wait(qr));
            } else if (me % 2 == 0) {
                CHECK_OK(pt_comm_send(world, out, bytes, right, rep + 1));
                CHECK_OK(pt_comm_recv(world, in, bytes, left, rep + 1));
            } else {
                CHECK_OK(pt_comm_recv(world, in, bytes, left, rep + 1));
                CHECK_OK(pt_comm_send(world, out, bytes, right, rep + 1));
            }
            size_t bad = bytes;
            for (size_t i = 0; i < bytes && bad == bytes; i++)
                if (in[i] != (unsigned char)(i + left * 31 + rep)) bad = i;
            CHECK_EQ(bad, bytes);
        }
        pt_mem_free(in);
        pt_mem_free(out);
    }
    CHECK_OK(pt_comm_barrier(world));
}

/* Tags are matched, not just checked: two messages to the right neighbour
 * with tags 5 then 6 are received 6 first. Small messages (eager on every
 * backend), so the blocking sends complete before the receives. */
static void test_tags(void) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    int right = (me + 1) % n, left = (me + n - 1) % n;
    int a[16], b[4], ra[16] = {0}, rb[4] = {0};
    for (int i = 0; i < 16; i++) a[i] = me * 100 + i;
    for (int i = 0; i < 4; i++) b[i] = -me - i;
    CHECK_OK(pt_comm_send(world, a, sizeof a, right, 5));
    CHECK_OK(pt_comm_send(world, b, sizeof b, right, 6));
    CHECK_OK(pt_comm_recv(world, rb, sizeof rb, left, 6));
    CHECK_OK(pt_comm_recv(world, ra, sizeof ra, left, 5));
    for (int i = 0; i < 16; i++) CHECK_EQ(ra[i], left * 100 + i);
    for (int i = 0; i < 4; i++) CHECK_EQ(rb[i], -left - i);
    CHECK_OK(pt_comm_barrier(world));
}

/* Several non-blocking operations in flight at once, polled with test. */
static void test_nonblocking(void) {
    int me = pt_comm_rank(world), n = pt_comm_size(world);
    size_t c1 = 1000, c2 = max_count < 200003 ? max_count : 200003, c3 = 77;
    float *a = buf_new(c1), *b = buf_new(c2), *g = buf_new(c3), *r = buf_new(c2);
    int bc = me == n - 1 ? 42 : 0;
    fill(a, c1, me);
    fill(b, c2, me);
    fill(r, c2, me);
    size_t goff, glen;
    pt_comm_shard(c3, n, me, &goff, &glen);
    for (size_t i = 0; i < c3; i++) g[i] = i >= goff && i < goff + glen ? val(1, i) : 0;
    pt_comm_req *q[5];
    CHECK_OK(pt_comm_iallreduce(world, a, c1, PT_REDUCE_SUM, &q[0]));
    CHECK_OK(pt_comm_iallreduce(world, b, c2, PT_REDUCE_AVG, &q[1]));
    CHECK_OK(pt_comm_iallgather(world, g, c3, &q[2]));
    CHECK_OK(pt_comm_ibroadcast(world, &bc, sizeof bc, n - 1, &q[3]));
    CHECK_OK(pt_comm_ireduce_scatter(world, r, c2, PT_REDUCE_SUM, &q[4]));
    int done = 0;
    for (int spins = 0; !done && spins < 1000000; spins++) CHECK_OK(pt_comm_test(q[4], &done));
    for (int i = 0; i < 5; i++) CHECK_OK(pt_comm_wait(q[i]));
    CHECK_EQ(check_reduced(a, 0, c1, n, NULL, 0), c1);
    CHECK_EQ(check_reduced(b, 0, c2, n, NULL, 1), c2);
    size_t roff, rlen;
    pt_comm_shard(c2, n, me, &roff, &rlen);
    CHECK_EQ(check_reduced(r, roff, roff + rlen, n, NULL, 0), roff + rlen);
    for (size_t i = 0; i < c3; i++)
        if (g[i] != val(1, i)) {
            CHECK_NEAR(g[i], val(1, i), 0, 0);
            break;
        }
    CHECK_EQ(bc, 42);
    pt_mem_free(r);
    pt_mem_free(g);
    pt_mem_free(b);
    pt_mem_free(a);
}

/* rows x cols mesh: row and column groups used at the same time. */
static void test_mesh(int rows, int cols) {
    int me = pt_comm_rank(world);
    int row = me / cols, col = me % cols;
    pt_comm *rc = NULL, *cc = NULL;
    CHECK_OK(pt_comm_split(world, row, me, &rc));
    CHECK_OK(pt_comm_split(world, col, -me, &cc)); /* key reverses the order */
    if (!rc || !cc) return;
    CHECK_EQ(pt_comm_size(rc), cols);
    CHECK_EQ(pt_comm_rank(rc), col);
    CHECK_EQ(pt_comm_size(cc), rows);
    CHECK_EQ(pt_comm_rank(cc), rows - 1 - row);
    int row_ranks[8], col_ranks[8];
    for (int j = 0; j < cols; j++) row_ranks[j] = row * cols + j;
    for (int i = 0; i < rows; i++) col_ranks[i] = i * cols + col;
    for (size_t c = 5; c <= max_count; c = c * 61 + 3) {
        float *a = buf_new(c), *b = buf_new(c);
        fill(a, c, me);
        fill(b, c, me);
        pt_comm_req *qa, *qb;
        CHECK_OK(pt_comm_iallreduce(rc, a, c, PT_REDUCE_SUM, &qa));
        CHECK_OK(pt_comm_iallreduce(cc, b, c, PT_REDUCE_SUM, &qb));
        CHECK_OK(pt_comm_wait(qa));
        CHECK_OK(pt_comm_wait(qb));
        CHECK_EQ(check_reduced(a, 0, c, cols, row_ranks, 0), c);
        CHECK_EQ(check_reduced(b, 0, c, rows, col_ranks, 0), c);
        /* blocking, interleaved with the world */
        fill(a, c, me);
        CHECK_OK(pt_comm_allreduce(cc, a, c, PT_REDUCE_AVG));
        CHECK_EQ(check_reduced(a, 0, c, rows, col_ranks, 1), c);
        CHECK_OK(pt_comm_barrier(world));
        size_t off, len;
        fill(b, c, me);
        pt_comm_shard(c, cols, col, &off, &len);
        CHECK_OK(pt_comm_reduce_scatter(rc, b, c, PT_REDUCE_SUM));
        CHECK_EQ(check_reduced(b, off, off + len, cols, row_ranks, 0), off + len);
        pt_mem_free(a);
        pt_mem_free(b);
    }
    /* point-to-point inside a column group */
    int peer = (pt_comm_rank(cc) + 1) % rows, from = (pt_comm_rank(cc) + rows - 1) % rows;
    int out = me, in = -1;
    pt_comm_req *q;
    CHECK_OK(pt_comm_isend(cc, &out, sizeof out, peer, 9, &q));
    CHECK_OK(pt_comm_recv(cc, &in, sizeof in, from, 9));
    CHECK_OK(pt_comm_wait(q));
    CHECK_EQ(in, (rows - 1 - from) * cols + col);
    pt_comm_free(cc);
    pt_comm_free(rc);
}

static void test_meshes(void) {
    int n = pt_comm_size(world);
    if (n == 4) test_mesh(2, 2);
    if (n == 8) {
        test_mesh(2, 4);
        test_mesh(4, 2);
    }
    if (n == 6) test_mesh(2, 3);
}

static void test_invalid_args(void) {
    int n = pt_comm_size(world);
    float x = 1;
    CHECK_EQ(pt_comm_send(world, &x, 4, n, 0), PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "peer") != NULL);
    CHECK_EQ(pt_comm_recv(world, &x, 4, -1, 0), PT_ERR_INVALID);
    CHECK_EQ(pt_comm_broadcast(world, &x, 4, n), PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "root") != NULL);
    CHECK_EQ(pt_comm_allreduce(world, NULL, 3, PT_REDUCE_SUM), PT_ERR_INVALID);
    CHECK(strstr(pt_error_message(), "buf") != NULL);
    CHECK_EQ(pt_comm_allreduce(world, &x, 1, (pt_reduce_op)7), PT_ERR_INVALID);
    CHECK_EQ(pt_comm_send(world, &x, 4, 0, -3), PT_ERR_INVALID);
    pt_comm_req *q = (pt_comm_req *)&x;
    CHECK_EQ(pt_comm_iallgather(world, NULL, 2, &q), PT_ERR_INVALID);
    CHECK(q == NULL);
    CHECK_OK(pt_comm_allreduce(world, NULL, 0, PT_REDUCE_SUM)); /* nothing to do */
}

static void test_stats(void) {
    int n = pt_comm_size(world);
    pt_comm_reset_stats(world);
    float b[256];
    for (int i = 0; i < 256; i++) b[i] = 1;
    CHECK_OK(pt_comm_allreduce(world, b, 256, PT_REDUCE_SUM));
    CHECK_OK(pt_comm_barrier(world));
    pt_comm_stats s;
    pt_comm_get_stats(world, &s);
    CHECK_EQ(s.calls[PT_OP_ALLREDUCE], 1);
    CHECK_EQ(s.calls[PT_OP_BARRIER], 1);
    CHECK_EQ(s.bytes_sent[PT_OP_ALLREDUCE], 2 * (uint64_t)(n - 1) * 1024 / n);
    CHECK_EQ(s.calls[PT_OP_SEND], 0);
    CHECK_NEAR(b[17], n, 0, 0);
    /* the one sum of bytes_sent that the trainer and strategies use */
    uint64_t sent = 0;
    for (int k = 0; k < PT_OP_COUNT; k++) sent += s.bytes_sent[k];
    CHECK_EQ(pt_comm_sent_bytes(world), sent);
    CHECK_EQ(pt_comm_sent_bytes(NULL), 0);
}

/* The planner's question, answered by every backend's descriptor: shm's
 * chunk scratch only where a call goes single-copy, nothing from mpi or a
 * backend the build lacks. */
static void test_lazy_bytes(void) {
    size_t big = (size_t)1 << 20;
    CHECK_EQ(pt_comm_lazy_bytes("mpi", 4, PT_OP_ALLREDUCE, big), 0);
    CHECK_EQ(pt_comm_lazy_bytes("nccl", 4, PT_OP_ALLREDUCE, big), 0);
    CHECK_EQ(pt_comm_lazy_bytes("shm", 1, PT_OP_ALLREDUCE, big), 0); /* no peers */
    CHECK_EQ(pt_comm_lazy_bytes("shm", 4, PT_OP_ALLREDUCE, 64), 0);  /* staged */
    CHECK_EQ(pt_comm_lazy_bytes("shm", 4, PT_OP_ALLGATHER, big), 0); /* 2 ranks only */
    CHECK_EQ(pt_comm_lazy_bytes(NULL, 4, PT_OP_ALLREDUCE, big),
             pt_comm_lazy_bytes("shm", 4, PT_OP_ALLREDUCE, big)); /* the default: shm */
    size_t want = pt_knob_int("PT_SHM_CMA") ? 3 * ((size_t)pt_knob_int("PT_SHM_CMA_CHUNK_KB") << 10)
                                            : 0; /* (n-1) chunks */
    CHECK_EQ(pt_comm_lazy_bytes("shm", 4, PT_OP_ALLREDUCE, big), want);
}

typedef struct {
    const char *backend;
    double timeout_s;
} config;

static int rank_main(void *arg) {
    const config *cfg = arg;
    pt_comm_options opt = {cfg->backend, cfg->timeout_s};
    pt_status st = pt_comm_new(&world, &opt);
    if (st != PT_OK) {
        fprintf(stderr, "pt_comm_new: %s\n", pt_error_message());
        return 2;
    }
    RUN(test_allreduce);
    RUN(test_reduce_scatter);
    RUN(test_allgather);
    RUN(test_broadcast);
    RUN(test_sendrecv);
    RUN(test_tags);
    RUN(test_nonblocking);
    RUN(test_meshes);
    RUN(test_invalid_args);
    RUN(test_stats);
    RUN(test_lazy_bytes);
    CHECK_OK(pt_comm_barrier(world));
    int rank = pt_comm_rank(world), size = pt_comm_size(world);
    pt_comm_free(world);
    if (rank == 0 || pt_test_failed_) {
        printf("rank %d of %d (%s): ", rank, size, cfg->backend);
        return TEST_DONE();
    }
    return pt_test_failed_ ? 1 : 0;
}

int main(int argc, char **argv) {
    config cfg = {"shm", 10};
    int nproc = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            cfg.backend = argv[++i];
        else if (!strcmp(argv[i], "--nproc") && i + 1 < argc)
            nproc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-count") && i + 1 < argc)
            max_count = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            cfg.timeout_s = atof(argv[++i]); /* <= 0: the default */
        else {
            fprintf(stderr,
                    "usage: %s [--backend shm|mpi] [--nproc N] [--max-count C] [--timeout S]\n",
                    argv[0]);
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
