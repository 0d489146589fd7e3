/* The mpi backend's operations: each one mapped onto the MPI call of the
 * same meaning, started non-blocking and waited for with the
 * communicator's deadline (pt_mpi_wait_req, mpi_watch.c):
 *  - all-reduce: SUM, then a local scale for AVG; from 256 KiB the ring
 *    (mpi_ring.c), below it MPI_Iallreduce in place;
 *  - reduce-scatter with uneven per-rank counts from pt_comm_shard's rule
 *    (MPI_Ireduce_scatter, or the ring), the result moved to the rank's
 *    shard offset; all-gather in place through MPI_Iallgatherv (or the
 *    ring); broadcast MPI_Ibcast; barrier MPI_Ibarrier;
 *  - tagged send/recv (MPI_Isend / MPI_Irecv of bytes), the generic
 *    collectives' negative tags mapped to the top of MPI's tag range;
 *  - opt-in (PT_MPI_BLOCKING), collectives as Open MPI's blocking calls
 *    under the watchdog (mpi_watch.c).
 * MPI errors become values: MPI_ERRORS_RETURN on every communicator, and
 * MPI_Error_string in the message. Nothing is allocated per call: the
 * count/displacement arrays of the uneven collectives belong to the
 * context.
 *
 * Not here: contexts and the table (mpi_backend.c), the ring (mpi_ring.c),
 * waiting (mpi_watch.c). */
#include "mpi_impl.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* An MPI error code as a status with a message naming the operation. */
pt_status pt_mpi_fail(mpi_ctx *c, int rc, const char *op, int peer) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    if (c) c->failed = 1;
    pt_mpi_g.failed = 1;
    if (peer >= 0)
        return pt_error_set(PT_ERR_COMM, "mpi %s with peer rank %d failed on rank %d of %d: %s", op,
                            peer, c ? c->rank : -1, c ? c->size : -1, s);
    return pt_error_set(PT_ERR_COMM, "mpi %s failed on rank %d of %d: %s", op, c ? c->rank : -1,
                        c ? c->size : -1, s);
}

/* After a failure anywhere in this process nothing enters MPI again: a
 * request left pending by a timeout cannot be cancelled, and MPI's progress
 * engine would go on moving its (by then maybe freed) buffer. */
pt_status pt_mpi_check_usable(mpi_ctx *c, const char *op) {
    if (pt_mpi_hb_has_verdict()) return pt_mpi_verdict_error(c, op);
    if (c->failed || pt_mpi_g.failed)
        return pt_error_set(PT_ERR_COMM,
                            "mpi %s on rank %d: an operation failed earlier in this process; only "
                            "free is allowed",
                            op, c->rank);
    return PT_OK;
}

static pt_status check_count(mpi_ctx *c, size_t n, const char *op) {
    if (n > INT_MAX)
        return pt_error_set(PT_ERR_INVALID,
                            "mpi %s on rank %d: %zu elements exceed MPI's int count", op, c->rank,
                            n);
    return PT_OK;
}

void pt_mpi_sleep_us(long us) {
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

static void scale(float *p, size_t n, float s) {
    for (size_t i = 0; i < n; i++) p[i] *= s;
}

/* ---- point-to-point ------------------------------------------------------------------ */

/* Tags: callers get 0..tag_ub - RESERVED_TAGS; the generic collectives'
 * negative tags (comm_generic.c, -RESERVED_TAGS..-1) map to the top of
 * MPI's range, so they never meet a caller's. */
#define RESERVED_TAGS 16

static pt_status check_p2p(mpi_ctx *c, size_t bytes, int peer, int tag, const char *op,
                           int *mpi_tag) {
    PT_CHECK(pt_mpi_check_usable(c, op));
    PT_CHECK(check_count(c, bytes, op));
    if (peer < 0 || peer >= c->size)
        return pt_error_set(PT_ERR_INVALID,
                            "mpi %s: peer %d is not a rank of this communicator (size %d)", op,
                            peer, c->size);
    if (tag < -RESERVED_TAGS || tag > c->tag_ub - RESERVED_TAGS)
        return pt_error_set(PT_ERR_INVALID, "mpi %s: tag %d outside 0..%d", op, tag,
                            c->tag_ub - RESERVED_TAGS);
    *mpi_tag = tag >= 0 ? tag : c->tag_ub + (tag + 1); /* no overflow at INT_MAX */
    return PT_OK;
}

pt_status pt_mpi_send(void *ctx, const void *buf, size_t bytes, int peer, int tag) {
    mpi_ctx *c = ctx;
    int mtag = 0;
    PT_CHECK(check_p2p(c, bytes, peer, tag, "send", &mtag));
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, mtag, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "send", peer);
    return pt_mpi_wait_req(c, &req, "send", peer, bytes, NULL);
}

pt_status pt_mpi_recv(void *ctx, void *buf, size_t bytes, int peer, int tag) {
    mpi_ctx *c = ctx;
    int mtag = 0;
    PT_CHECK(check_p2p(c, bytes, peer, tag, "recv", &mtag));
    MPI_Request req;
    MPI_Status st;
    pt_mpi_lock();
    int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, mtag, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "recv", peer);
    PT_CHECK(pt_mpi_wait_req(c, &req, "recv", peer, bytes, &st));
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if ((size_t)got != bytes) {
        c->failed = 1;
        return pt_error_set(PT_ERR_COMM,
                            "mpi recv from peer rank %d (tag %d): got %d bytes, expected %zu", peer,
                            tag, got, bytes);
    }
    return PT_OK;
}

/* pt_comm_shard's rule (comm.h), restated here so the backend stands alone:
 * the first count % size ranks hold one element more. */
static void shard(size_t count, int size, int rank, size_t *off, size_t *n) {
    size_t base = count / (size_t)size, extra = count % (size_t)size, r = (size_t)rank;
    *n = base + (r < extra);
    *off = r * base + (r < extra ? r : extra);
}

/* Per-rank counts (and displacements) of a count-element buffer. */
void pt_mpi_fill_shards(mpi_ctx *c, size_t count) {
    for (int r = 0; r < c->size; r++) {
        size_t off, n;
        shard(count, c->size, r, &off, &n);
        c->counts[r] = (int)n;
        c->displs[r] = (int)off;
    }
}

/* ---- collectives ---- */

pt_status pt_mpi_allreduce(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    mpi_ctx *c = ctx;
    PT_CHECK(pt_mpi_check_usable(c, "allreduce"));
    PT_CHECK(check_count(c, count, "allreduce"));
    if (count == 0) return PT_OK;
    int w =
        pt_mpi_watch_enabled(c) ? pt_mpi_watch_begin(c, "allreduce", count * sizeof(float)) : -1;
    if (w >= 0) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->comm);
        pt_mpi_watch_end(w);
        if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "allreduce", -1);
    } else if (pt_mpi_use_ring(c, count)) {
        PT_CHECK(pt_mpi_ring_allreduce(c, buf, count));
    } else {
        MPI_Request req;
        pt_mpi_lock();
        int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, c->comm, &req);
        pt_mpi_unlock();
        if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "allreduce", -1);
        PT_CHECK(pt_mpi_wait_req(c, &req, "allreduce", -1, count * sizeof(float), NULL));
    }
    if (op == PT_REDUCE_AVG && c->size > 1) scale(buf, count, 1.0f / (float)c->size);
    return PT_OK;
}

pt_status pt_mpi_reduce_scatter(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    mpi_ctx *c = ctx;
    PT_CHECK(pt_mpi_check_usable(c, "reduce_scatter"));
    PT_CHECK(check_count(c, count, "reduce_scatter"));
    if (count == 0) return PT_OK;
    pt_mpi_fill_shards(c, count);
    size_t off = (size_t)c->displs[c->rank], n = (size_t)c->counts[c->rank];
    int w = pt_mpi_watch_enabled(c) ? pt_mpi_watch_begin(c, "reduce_scatter", count * sizeof(float))
                                    : -1;
    if (w >= 0) {
        /* In place: the input is all of buf, the result lands at buf[0..n).
         * Even shards: the _block form, as Open MPI's own benchmarks use. */
        int rc =
            count % (size_t)c->size == 0
                ? MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, c->counts[0], MPI_FLOAT, MPI_SUM,
                                           c->comm)
                : MPI_Reduce_scatter(MPI_IN_PLACE, buf, c->counts, MPI_FLOAT, MPI_SUM, c->comm);
        pt_mpi_watch_end(w);
        if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "reduce_scatter", -1);
        if (off != 0 && n) memmove(buf + off, buf, n * sizeof(float));
    } else if (pt_mpi_use_ring(c, count)) {
        PT_CHECK(pt_mpi_ring_reduce_scatter(c, "reduce_scatter", buf, count)); /* lands in place */
    } else {
        MPI_Request req;
        pt_mpi_lock();
        int rc =
            MPI_Ireduce_scatter(MPI_IN_PLACE, buf, c->counts, MPI_FLOAT, MPI_SUM, c->comm, &req);
        pt_mpi_unlock();
        if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "reduce_scatter", -1);
        PT_CHECK(pt_mpi_wait_req(c, &req, "reduce_scatter", -1, count * sizeof(float), NULL));
        if (off != 0 && n) memmove(buf + off, buf, n * sizeof(float));
    }
    if (op == PT_REDUCE_AVG && c->size > 1) scale(buf + off, n, 1.0f / (float)c->size);
    return PT_OK;
}

pt_status pt_mpi_allgather(void *ctx, float *buf, size_t count) {
    mpi_ctx *c = ctx;
    PT_CHECK(pt_mpi_check_usable(c, "allgather"));
    PT_CHECK(check_count(c, count, "allgather"));
    if (count == 0) return PT_OK;
    pt_mpi_fill_shards(c, count);
    int w =
        pt_mpi_watch_enabled(c) ? pt_mpi_watch_begin(c, "allgather", count * sizeof(float)) : -1;
    if (w >= 0) {
        int rc = count % (size_t)c->size == 0
                     ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->counts[0],
                                     MPI_FLOAT, c->comm)
                     : MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->counts, c->displs,
                                      MPI_FLOAT, c->comm);
        pt_mpi_watch_end(w);
        return rc == MPI_SUCCESS ? PT_OK : pt_mpi_fail(c, rc, "allgather", -1);
    }
    if (pt_mpi_use_ring(c, count)) return pt_mpi_ring_allgather(c, "allgather", buf);
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, c->counts, c->displs,
                             MPI_FLOAT, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "allgather", -1);
    return pt_mpi_wait_req(c, &req, "allgather", -1, count * sizeof(float), NULL);
}

pt_status pt_mpi_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    mpi_ctx *c = ctx;
    PT_CHECK(pt_mpi_check_usable(c, "broadcast"));
    PT_CHECK(check_count(c, bytes, "broadcast"));
    if (root < 0 || root >= c->size)
        return pt_error_set(PT_ERR_INVALID, "mpi broadcast: root %d is not a rank (size %d)", root,
                            c->size);
    if (bytes == 0) return PT_OK;
    int w = pt_mpi_watch_enabled(c) ? pt_mpi_watch_begin(c, "broadcast", bytes) : -1;
    if (w >= 0) {
        int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, c->comm);
        pt_mpi_watch_end(w);
        return rc == MPI_SUCCESS ? PT_OK : pt_mpi_fail(c, rc, "broadcast", -1);
    }
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "broadcast", -1);
    return pt_mpi_wait_req(c, &req, "broadcast", -1, bytes, NULL);
}

pt_status pt_mpi_barrier(void *ctx) {
    mpi_ctx *c = ctx;
    PT_CHECK(pt_mpi_check_usable(c, "barrier"));
    int w = pt_mpi_watch_enabled(c) ? pt_mpi_watch_begin(c, "barrier", 0) : -1;
    if (w >= 0) {
        int rc = MPI_Barrier(c->comm);
        pt_mpi_watch_end(w);
        return rc == MPI_SUCCESS ? PT_OK : pt_mpi_fail(c, rc, "barrier", -1);
    }
    MPI_Request req;
    pt_mpi_lock();
    int rc = MPI_Ibarrier(c->comm, &req);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return pt_mpi_fail(c, rc, "barrier", -1);
    return pt_mpi_wait_req(c, &req, "barrier", -1, 0, NULL);
}
