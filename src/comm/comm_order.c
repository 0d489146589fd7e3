/* comm.check_order (pt_comm_options.check_order): a debug mode in which,
 * before every collective (split included), the members of the group
 * exchange what they are about to run, (op, bytes, root, #N, world rank,
 * how many collectives they ran on it before),
 * with one small all-gather through the backend, and stop the job at the
 * first mismatch, naming both ranks and both operations:
 *
 *   rank 2 issued dp group 0 broadcast #5 (4 B) where rank 0 issued
 *   allreduce #5 (1 MiB): operations out of order (comm.check_order)
 *
 * Every member decides on the same gathered records, so they all stop at
 * the same operation with the same words; the job's verdict (the
 * backend's verdict slot) makes it the one line of the job. The group is
 * the communicator the exchange runs on: members of different groups
 * never exchange. A skipped or swapped collective whose neighbour has the
 * same (op, bytes, root) cannot be told apart here (the data would be
 * another tensor's): the mode catches what changes the shape of the
 * traffic. Point-to-point operations are not checked (their order is per
 * peer and tag, and differs between ranks by design).
 *
 * Encoding: 16-bit pieces as floats (exact), so that the exchange is an
 * ordinary float all-gather on every backend.
 *
 * Not here: the recorder (comm_flight.c), the verdict (the backends). */
#include "communicator_impl.h"

#include <stdio.h>
#include <string.h>

enum {
    O_OP,
    O_WR,
    O_SEQ = O_WR + 2,
    O_POS = O_SEQ + 4,
    O_BYTES = O_POS + 4,
    O_ARG = O_BYTES + 4,
    O_END
};
_Static_assert(O_END <= ORDER_FLOATS, "check_order record");

typedef struct {
    int op, wrank, arg;
    uint64_t seq, pos, bytes; /* pos: the collectives this rank ran on c, this one included */
} order_rec;

static void put16(float *f, uint64_t v, int pieces) {
    for (int i = 0; i < pieces; i++) f[i] = (float)((v >> (16 * i)) & 0xffff);
}

static uint64_t get16(const float *f, int pieces) {
    uint64_t v = 0;
    for (int i = 0; i < pieces; i++) v |= (uint64_t)f[i] << (16 * i);
    return v;
}

static order_rec decode(const float *f) {
    order_rec r;
    r.op = (int)get16(f + O_OP, 1);
    r.wrank = (int)get16(f + O_WR, 2);
    r.seq = get16(f + O_SEQ, 4);
    r.pos = get16(f + O_POS, 4);
    r.bytes = get16(f + O_BYTES, 4);
    r.arg = (int)get16(f + O_ARG, 1) - 1;
    return r;
}

static int same(const order_rec *a, const order_rec *b) {
    return a->op == b->op && a->seq == b->seq && a->bytes == b->bytes && a->arg == b->arg;
}

/* "allreduce #5 (1 MiB)", "broadcast #5 (4 B) from rank 1" */
static void describe(const order_rec *r, char *out, size_t len) {
    char b[32];
    pt_flight_bytes(r->bytes, b, sizeof b);
    if (r->arg >= 0)
        snprintf(out, len, "%s #%llu (%s, root %d)", pt_flight_op_name(r->op),
                 (unsigned long long)r->seq, b, r->arg);
    else
        snprintf(out, len, "%s #%llu (%s)", pt_flight_op_name(r->op), (unsigned long long)r->seq,
                 b);
}

pt_status comm_order_check(pt_comm *c, uint64_t k, int op, uint64_t bytes, int arg) {
    int n = c->size;
    if (n < 2 || !c->order_buf) return PT_OK;
    float *buf = c->order_buf, *mine = buf + (size_t)c->rank * ORDER_FLOATS;
    memset(mine, 0, ORDER_FLOATS * sizeof(float));
    put16(mine + O_OP, (uint64_t)op, 1);
    put16(mine + O_WR, (uint64_t)comm_flight_world_rank(), 2);
    put16(mine + O_SEQ, comm_flight_seq(c, k, NULL, NULL), 4);
    put16(mine + O_POS, ++c->fl.ran, 4);
    put16(mine + O_BYTES, bytes, 4);
    put16(mine + O_ARG, (uint64_t)(arg + 1), 1);
    size_t count = (size_t)n * ORDER_FLOATS; /* shards of ORDER_FLOATS each */
    const pt_comm_backend *be = c->generic ? &c->p2p_only : c->be;
    pt_status st = be->allgather ? be->allgather(c->ctx, buf, count)
                                 : pt_comm_generic_allgather(be, c->ctx, c->rank, n, buf, count);
    if (st != PT_OK) return st;
    /* The expected record: the most common one (the lowest member's of
     * equals) among the members that run their operations in the order
     * they issued them (#N is their N-th here); a rank that runs #6 as its
     * 5th (a swap) is the odd one, even in a group of two. */
    int ref = 0, ref_n = 0, odd = -1, in_order = 0;
    for (int m = 0; m < n; m++) {
        order_rec a = decode(buf + (size_t)m * ORDER_FLOATS);
        in_order += a.seq == a.pos;
    }
    for (int m = 0; m < n; m++) {
        order_rec a = decode(buf + (size_t)m * ORDER_FLOATS);
        if (in_order && a.seq != a.pos) continue;
        int cnt = 0;
        for (int j = 0; j < n; j++) {
            order_rec b = decode(buf + (size_t)j * ORDER_FLOATS);
            cnt += same(&a, &b);
        }
        if (cnt > ref_n) ref = m, ref_n = cnt;
    }
    if (ref_n == n) return PT_OK;
    order_rec want = decode(buf + (size_t)ref * ORDER_FLOATS);
    for (int m = 0; m < n && odd < 0; m++) {
        order_rec b = decode(buf + (size_t)m * ORDER_FLOATS);
        if (!same(&want, &b)) odd = m;
    }
    order_rec got = decode(buf + (size_t)odd * ORDER_FLOATS);
    char name[64], a[96], b[96], reason[400];
    comm_flight_name(c, name, sizeof name);
    describe(&got, a, sizeof a);
    describe(&want, b, sizeof b);
    snprintf(
        reason, sizeof reason,
        "rank %d issued %s %s where rank %d issued %s: operations out of order " COMM_ORDER_MARK,
        got.wrank, name, a, want.wrank, b);
    int noticer = got.wrank; /* every member decides alike: the lowest one speaks */
    for (int m = 0; m < n; m++) {
        order_rec r = decode(buf + (size_t)m * ORDER_FLOATS);
        if (r.wrank < noticer) noticer = r.wrank;
    }
    if (c->be->verdict) return c->be->verdict(c->ctx, got.wrank, noticer, PT_ERR_COMM, reason);
    return pt_error_set(PT_ERR_COMM, "%s", reason);
}
