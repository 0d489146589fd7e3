/* pt_comm_time: seconds per operation of one collective or of a
 * point-to-point message, the measurement that `partrain bench comm` prints
 * and `partrain calibrate` stores, written once so that both time the same
 * loop (warm-up, barrier, timed operations, mean over ranks).
 *
 * Not here: choosing sizes or iteration counts, rounds, medians, printing
 * (the callers'). */
#include "partrain/comm.h"

/* Tag of the ping-pong; user tags are >= 0 and the generic collectives'
 * are below -1. */
enum { TAG_PINGPONG = 0x7e11 };

static pt_status run_once(pt_comm *c, pt_comm_op op, float *buf, size_t bytes) {
    size_t count = bytes / sizeof(float);
    int rank = pt_comm_rank(c);
    switch (op) {
    case PT_OP_ALLREDUCE:
        return pt_comm_allreduce(c, buf, count, PT_REDUCE_SUM);
    case PT_OP_REDUCE_SCATTER:
        return pt_comm_reduce_scatter(c, buf, count, PT_REDUCE_SUM);
    case PT_OP_ALLGATHER:
        return pt_comm_allgather(c, buf, count);
    case PT_OP_BROADCAST:
        return pt_comm_broadcast(c, buf, bytes, 0);
    case PT_OP_SEND: /* one round trip between ranks 0 and 1 */
        if (rank == 0) {
            PT_CHECK(pt_comm_send(c, buf, bytes, 1, TAG_PINGPONG));
            return pt_comm_recv(c, buf, bytes, 1, TAG_PINGPONG);
        }
        if (rank == 1) {
            PT_CHECK(pt_comm_recv(c, buf, bytes, 0, TAG_PINGPONG));
            return pt_comm_send(c, buf, bytes, 0, TAG_PINGPONG);
        }
        return PT_OK;
    default:
        return pt_error_set(PT_ERR_INVALID, "pt_comm_time: op %s is not timed",
                            pt_comm_op_name(op));
    }
}

pt_status pt_comm_time(pt_comm *c, pt_comm_op op, float *buf, size_t bytes, int iters,
                       double *seconds) {
    *seconds = 0;
    int size = pt_comm_size(c);
    if (iters < 1 || bytes == 0 || (op == PT_OP_SEND && size < 2))
        return pt_error_set(PT_ERR_INVALID,
                            "pt_comm_time: %s of %zu bytes, %d iterations, %d ranks",
                            pt_comm_op_name(op), bytes, iters, size);
    int warm = 1 + iters / 10;
    if (warm > 5) warm = 5;
    for (int i = 0; i < warm; i++) PT_CHECK(run_once(c, op, buf, bytes));
    PT_CHECK(pt_comm_barrier(c));
    uint64_t t0 = pt_time_ns();
    for (int i = 0; i < iters; i++) PT_CHECK(run_once(c, op, buf, bytes));
    double t = (double)(pt_time_ns() - t0) / 1e9 / iters;
    /* p2p: half the round trip, averaged over the two ranks that ran it */
    int busy = op == PT_OP_SEND ? 2 : size;
    if (op == PT_OP_SEND) t = pt_comm_rank(c) < 2 ? t / 2 : 0;
    float f = (float)t;
    PT_CHECK(pt_comm_allreduce(c, &f, 1, PT_REDUCE_SUM));
    *seconds = f / busy;
    return PT_OK;
}
