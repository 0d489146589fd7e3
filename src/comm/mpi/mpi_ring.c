/* The mpi backend's ring collectives, on point-to-point with the MPI_Test
 * deadline of every wait: reduce-scatter (its shard travels in segments,
 * so that summing one overlaps receiving the next), all-gather, and
 * all-reduce as the two in a row. Used from PT_MPI_RING_MIN_KB (256 KiB)
 * on: libnbc's non-blocking all-reduce moves the whole buffer to one rank
 * and back, the ring 2 (n-1)/n of it each way (docs/mpi.md).
 *
 * Not here: the choice between the ring, the non-blocking MPI call and the
 * watched blocking one (mpi_ops.c), deadlines (mpi_watch.c). */
#include "mpi_impl.h"

#include <stdlib.h>

/* Ring collectives (ring.* below) from PT_MPI_RING_MIN_KB (256 KiB) on,
 * and count >= size: all-reduce, reduce-scatter and all-gather. The knob
 * is for comparing with libnbc's (0: always; a huge value: never); every
 * rank must see the same value. */
static size_t ring_min(void) {
    return (size_t)pt_knob_int("PT_MPI_RING_MIN_KB") * 1024;
}

int pt_mpi_use_ring(const mpi_ctx *c, size_t count) {
    return c->size > 1 && count >= (size_t)c->size && count * sizeof(float) >= ring_min();
}

/* One step of a ring: send n_s floats at s to the right neighbour and
 * receive n_r floats at r from the left one, both posted before either is
 * waited for (so the ring cannot deadlock). */
static pt_status ring_step(mpi_ctx *c, const char *op, const float *s, size_t n_s, float *r,
                           size_t n_r) {
    int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    MPI_Request rq[2];
    pt_mpi_lock();
    int rc = MPI_Irecv(r, (int)n_r, MPI_FLOAT, left, c->tag_ub, c->comm, &rq[0]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(s, (int)n_s, MPI_FLOAT, right, c->tag_ub, c->comm, &rq[1]);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, op, -1);
    PT_CHECK(pt_mpi_wait_req(c, &rq[0], op, left, n_r * sizeof(float), NULL));
    return pt_mpi_wait_req(c, &rq[1], op, right, n_s * sizeof(float), NULL);
}

/* d += t; restrict: the two never overlap (t is the scratch), so the loop
 * vectorizes without a runtime overlap check. */
static void add_into(float *restrict d, const float *restrict t, size_t m) {
    for (size_t j = 0; j < m; j++) d[j] += t[j];
}

/* A reduce-scatter step of the ring: like ring_step, but the shard travels
 * in segments (at most RING_SEGS, of at least RING_SEG floats; both sides
 * cut the same count the same way, and messages of one tag arrive in
 * order), so that summing segment i overlaps receiving the next ones and
 * reads it while it is still in cache (measured: 16 MiB all-reduce 0.86x
 * Open MPI's own unsegmented, see docs/comm.md). */
#define RING_SEG  (256u << 10) /* floats: 1 MiB */
#define RING_SEGS 64
static size_t ring_seg(size_t n) {
    return n > (size_t)RING_SEG * RING_SEGS ? (n + RING_SEGS - 1) / RING_SEGS : RING_SEG;
}

static pt_status ring_reduce_step(mpi_ctx *c, const char *op, const float *s, size_t n_s,
                                  float *dst, size_t n_r) {
    int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    MPI_Request rq[RING_SEGS], sq[RING_SEGS];
    size_t gr = ring_seg(n_r), gs = ring_seg(n_s);
    int kr = (int)((n_r + gr - 1) / gr), ks = (int)((n_s + gs - 1) / gs), rc = MPI_SUCCESS;
    float *tmp = c->ring_tmp;
    pt_mpi_lock();
    for (int i = 0; i < kr && rc == MPI_SUCCESS; i++) {
        size_t o = (size_t)i * gr, m = n_r - o < gr ? n_r - o : gr;
        rc = MPI_Irecv(tmp + o, (int)m, MPI_FLOAT, left, c->tag_ub, c->comm, &rq[i]);
    }
    for (int i = 0; i < ks && rc == MPI_SUCCESS; i++) {
        size_t o = (size_t)i * gs, m = n_s - o < gs ? n_s - o : gs;
        rc = MPI_Isend(s + o, (int)m, MPI_FLOAT, right, c->tag_ub, c->comm, &sq[i]);
    }
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, op, -1);
    for (int i = 0; i < kr; i++) {
        size_t o = (size_t)i * gr, m = n_r - o < gr ? n_r - o : gr;
        PT_CHECK(pt_mpi_wait_req(c, &rq[i], op, left, m * sizeof(float), NULL));
        add_into(dst + o, tmp + o, m);
    }
    for (int i = 0; i < ks; i++)
        PT_CHECK(pt_mpi_wait_req(c, &sq[i], op, right, gs * sizeof(float), NULL));
    return PT_OK;
}

/* Reduce-scatter as a ring on point-to-point with the MPI_Test deadline:
 * in step k rank r sends shard r-k-1 and adds shard r-k-2 from its left
 * neighbour, so that after n-1 steps it holds shard r reduced, in place
 * (the other shards hold partial sums). Each shard is summed once, by one
 * chain. Every rank sends and receives (n-1)/n of the buffer: for 2 ranks
 * 3.4-5.7x the bandwidth of Open MPI's MPI_Reduce_scatter_block and of
 * its non-blocking MPI_Ireduce_scatter (libnbc) at 1-16 MiB
 * (docs/benchmarks.md). The tag is the top
 * of the reserved range (the generic collectives' -1), never in use at the
 * same time on this communicator: its operations run one at a time. */
pt_status pt_mpi_ring_reduce_scatter(mpi_ctx *c, const char *op, float *buf, size_t count) {
    int n = c->size, r = c->rank;
    pt_mpi_fill_shards(c, count);
    size_t most = (size_t)c->counts[0]; /* the first shards are the largest */
    if (most > c->ring_cap) {
        /* Grows once, then reused; pt_mem_alloc puts it on huge pages (the
         * kernel's copy into it and the sum read it: 512x fewer TLB entries). */
        pt_mem_free(c->ring_tmp);
        c->ring_cap = 0;
        c->ring_tmp = pt_mem_alloc(PT_MEM_COMM, most * sizeof(float));
        if (!c->ring_tmp)
            return pt_error_set(PT_ERR_NOMEM, "mpi %s: %zu floats of scratch", op, most);
        c->ring_cap = most;
    }
    for (int k = 0; k < n - 1; k++) {
        int si = (r - k - 1 + 2 * n) % n, ri = (r - k - 2 + 2 * n) % n;
        PT_CHECK(ring_reduce_step(c, op, buf + c->displs[si], (size_t)c->counts[si],
                                  buf + c->displs[ri], (size_t)c->counts[ri]));
    }
    return PT_OK;
}

/* All-gather as a ring (shards as pt_mpi_fill_shards left them): in step k rank r
 * passes shard r-k on and receives shard r-k-1, straight into place. */
pt_status pt_mpi_ring_allgather(mpi_ctx *c, const char *op, float *buf) {
    int n = c->size, r = c->rank;
    for (int k = 0; k < n - 1; k++) {
        int si = (r - k + n) % n, ri = (r - k - 1 + n) % n;
        PT_CHECK(ring_step(c, op, buf + c->displs[si], (size_t)c->counts[si], buf + c->displs[ri],
                           (size_t)c->counts[ri]));
    }
    return PT_OK;
}

/* All-reduce as the ring reduce-scatter then the ring all-gather: every
 * rank sends and receives 2 (n-1)/n of the buffer, as Open MPI's blocking
 * MPI_Allreduce does (redscat_allgather), where its non-blocking one
 * (libnbc, in place) moves the whole buffer to one rank and back. Each
 * shard is summed once and copied to all: every rank gets the bitwise same
 * result. */
pt_status pt_mpi_ring_allreduce(mpi_ctx *c, float *buf, size_t count) {
    PT_CHECK(pt_mpi_ring_reduce_scatter(c, "allreduce", buf, count));
    return pt_mpi_ring_allgather(c, "allreduce", buf);
}
