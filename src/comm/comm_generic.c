/* Generic collectives built only on a backend's blocking send/recv, so that a
 * backend is correct as soon as its point-to-point is (STYLE rule 5). The
 * wrappers in comm.c call these for NULL collective slots.
 *
 * Algorithms: ring reduce-scatter and ring all-gather over the shard layout
 * of pt_comm_shard (all-reduce is the two in a row), linear broadcast from
 * the root, gather-release barrier. Blocking sends may wait for the receiver
 * (rendezvous), so in every ring step even ranks send first and odd ranks
 * receive first: some rank always receives first and the ring drains.
 * Received pieces of at most PT_COMM_GENERIC_PIECE floats go through the
 * communicator's scratch: nothing is allocated per call.
 *
 * Not here: anything faster (backends override the slots). */
#include "comm_impl.h"

/* Tags below zero are reserved for these algorithms. */
enum { TAG_RS = -2, TAG_AG = -3, TAG_BCAST = -4, TAG_BARRIER = -5 };

static pt_status send_chunk(const pt_comm_backend *be, void *ctx, const float *p, size_t n,
                            int peer) {
    for (size_t o = 0; o < n; o += PT_COMM_GENERIC_PIECE) {
        size_t k = n - o < PT_COMM_GENERIC_PIECE ? n - o : PT_COMM_GENERIC_PIECE;
        PT_CHECK(be->send(ctx, p + o, k * sizeof(float), peer, TAG_RS));
    }
    return PT_OK;
}

static pt_status recv_add_chunk(const pt_comm_backend *be, void *ctx, float *scratch, float *p,
                                size_t n, int peer) {
    for (size_t o = 0; o < n; o += PT_COMM_GENERIC_PIECE) {
        size_t k = n - o < PT_COMM_GENERIC_PIECE ? n - o : PT_COMM_GENERIC_PIECE;
        PT_CHECK(be->recv(ctx, scratch, k * sizeof(float), peer, TAG_RS));
        float *d = p + o;
        for (size_t i = 0; i < k; i++) d[i] += scratch[i];
    }
    return PT_OK;
}

pt_status pt_comm_generic_reduce_scatter(const pt_comm_backend *be, void *ctx, int rank, int size,
                                         float *scratch, float *buf, size_t count,
                                         pt_reduce_op op) {
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int s = 0; s < size - 1; s++) {
        /* After step s this rank holds s+2 contributions of chunk b; after
         * size-1 steps, all of chunk rank. */
        int a = ((rank - s - 1) % size + size) % size;
        int b = ((rank - s - 2) % size + size) % size;
        size_t ao, an, bo, bn;
        pt_comm_shard(count, size, a, &ao, &an);
        pt_comm_shard(count, size, b, &bo, &bn);
        if (rank % 2 == 0) {
            PT_CHECK(send_chunk(be, ctx, buf + ao, an, right));
            PT_CHECK(recv_add_chunk(be, ctx, scratch, buf + bo, bn, left));
        } else {
            PT_CHECK(recv_add_chunk(be, ctx, scratch, buf + bo, bn, left));
            PT_CHECK(send_chunk(be, ctx, buf + ao, an, right));
        }
    }
    if (op == PT_REDUCE_AVG && size > 1) {
        size_t o, n;
        pt_comm_shard(count, size, rank, &o, &n);
        for (size_t i = 0; i < n; i++) buf[o + i] /= (float)size;
    }
    return PT_OK;
}

pt_status pt_comm_generic_allgather(const pt_comm_backend *be, void *ctx, int rank, int size,
                                    float *buf, size_t count) {
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int s = 0; s < size - 1; s++) {
        int a = ((rank - s) % size + size) % size;
        int b = ((rank - s - 1) % size + size) % size;
        size_t ao, an, bo, bn;
        pt_comm_shard(count, size, a, &ao, &an);
        pt_comm_shard(count, size, b, &bo, &bn);
        if (rank % 2 == 0) {
            PT_CHECK(be->send(ctx, buf + ao, an * sizeof(float), right, TAG_AG));
            PT_CHECK(be->recv(ctx, buf + bo, bn * sizeof(float), left, TAG_AG));
        } else {
            PT_CHECK(be->recv(ctx, buf + bo, bn * sizeof(float), left, TAG_AG));
            PT_CHECK(be->send(ctx, buf + ao, an * sizeof(float), right, TAG_AG));
        }
    }
    return PT_OK;
}

pt_status pt_comm_generic_allreduce(const pt_comm_backend *be, void *ctx, int rank, int size,
                                    float *scratch, float *buf, size_t count, pt_reduce_op op) {
    PT_CHECK(pt_comm_generic_reduce_scatter(be, ctx, rank, size, scratch, buf, count, op));
    return pt_comm_generic_allgather(be, ctx, rank, size, buf, count);
}

pt_status pt_comm_generic_broadcast(const pt_comm_backend *be, void *ctx, int rank, int size,
                                    void *buf, size_t bytes, int root) {
    if (rank != root) return be->recv(ctx, buf, bytes, root, TAG_BCAST);
    for (int p = 0; p < size; p++)
        if (p != root) PT_CHECK(be->send(ctx, buf, bytes, p, TAG_BCAST));
    return PT_OK;
}

pt_status pt_comm_generic_barrier(const pt_comm_backend *be, void *ctx, int rank, int size) {
    char token = 0;
    if (rank != 0) {
        PT_CHECK(be->send(ctx, &token, 1, 0, TAG_BARRIER));
        return be->recv(ctx, &token, 1, 0, TAG_BARRIER);
    }
    for (int p = 1; p < size; p++) PT_CHECK(be->recv(ctx, &token, 1, p, TAG_BARRIER));
    for (int p = 1; p < size; p++) PT_CHECK(be->send(ctx, &token, 1, p, TAG_BARRIER));
    return PT_OK;
}
