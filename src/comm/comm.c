/* The communicator's wrappers, the functions every strategy calls: they
 * check arguments, count bytes and time, run the backend's slot or the
 * generic fallback for a NULL collective slot (comm_generic.c), and hand
 * non-blocking operations to the communicator's progress lanes; and the
 * communicator's life: wrap a backend context, split, free, agree.
 *
 * Not here: any algorithm (backends, comm_generic.c), the lanes
 * (comm_lanes.c), which backends exist and which one a process gets
 * (comm_registry.c). */
#include "communicator_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- names, shards, stats ------------------------------------------------- */

const char *pt_comm_op_name(pt_comm_op op) {
    static const char *names[PT_OP_COUNT] = {
        "allreduce", "reduce_scatter", "allgather", "broadcast", "send", "recv", "barrier"};
    return (unsigned)op < PT_OP_COUNT ? names[op] : "unknown";
}

void pt_comm_shard(size_t count, int size, int rank, size_t *offset, size_t *n) {
    if (size <= 0 || rank < 0 || rank >= size) { /* no such shard: empty */
        *offset = *n = 0;
        return;
    }
    size_t q = count / (size_t)size, r = count % (size_t)size, k = (size_t)rank;
    *n = q + (k < r);
    *offset = k * q + (k < r ? k : r);
}

void pt_comm_get_stats(const pt_comm *c, pt_comm_stats *out) {
    if (!c) {
        memset(out, 0, sizeof *out);
        return;
    }
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    *out = c->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
}

uint64_t pt_comm_sent_bytes(const pt_comm *c) {
    if (!c) return 0;
    pt_comm_stats s;
    pt_comm_get_stats(c, &s);
    uint64_t b = 0;
    for (int k = 0; k < PT_OP_COUNT; k++) b += s.bytes_sent[k];
    return b;
}

uint64_t pt_comm_sent_since(const pt_comm *c, uint64_t *seen) {
    uint64_t now = pt_comm_sent_bytes(c), d = now - *seen;
    *seen = now;
    return d;
}

void pt_comm_reset_stats(pt_comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    memset(&c->stats, 0, sizeof c->stats);
    pthread_mutex_unlock(&c->mu);
}

/* Bytes moved, counted as the algorithm-independent volumes that
 * nccl-tests' bus bandwidth uses: all-reduce 2(n-1)/n of the buffer each
 * way, reduce-scatter and all-gather (n-1)/n, broadcast the buffer once out
 * of the root and once into each other rank. */
static void count(pt_comm *c, pt_comm_op op, size_t bytes, int root, uint64_t ns) {
    uint64_t n = (uint64_t)c->size, b = bytes, sent = 0, recv = 0;
    switch (op) {
    case PT_OP_ALLREDUCE:
        sent = recv = 2 * (n - 1) * b / n;
        break;
    case PT_OP_REDUCE_SCATTER:
    case PT_OP_ALLGATHER:
        sent = recv = (n - 1) * b / n;
        break;
    case PT_OP_BROADCAST:
        if (n > 1 && c->rank == root) sent = b;
        if (n > 1 && c->rank != root) recv = b;
        break;
    case PT_OP_SEND:
        sent = b;
        break;
    case PT_OP_RECV:
        recv = b;
        break;
    default:
        break;
    }
    pthread_mutex_lock(&c->mu);
    c->stats.calls[op]++;
    c->stats.bytes_sent[op] += sent;
    c->stats.bytes_recv[op] += recv;
    c->stats.ns[op] += ns;
    pthread_mutex_unlock(&c->mu);
}

static pt_status check_comm(const pt_comm *c, pt_comm_op op);

/* ---- dispatch: backend slot or generic fallback ---------------------------- */

int comm_job_fault(pt_status st) {
    return st == PT_ERR_COMM || st == PT_ERR_TIMEOUT || st == PT_ERR_INTERRUPTED;
}

static pt_status dispatch(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag) {
    /* With generic set, only send/recv of the backend are used (testing). */
    const pt_comm_backend *be = c->generic ? &c->p2p_only : c->be;
    switch (op) {
    case PT_OP_ALLREDUCE:
        return be->allreduce ? be->allreduce(c->ctx, buf, n, (pt_reduce_op)arg)
                             : pt_comm_generic_allreduce(be, c->ctx, c->rank, c->size, c->scratch,
                                                         buf, n, (pt_reduce_op)arg);
    case PT_OP_REDUCE_SCATTER:
        return be->reduce_scatter
                   ? be->reduce_scatter(c->ctx, buf, n, (pt_reduce_op)arg)
                   : pt_comm_generic_reduce_scatter(be, c->ctx, c->rank, c->size, c->scratch, buf,
                                                    n, (pt_reduce_op)arg);
    case PT_OP_ALLGATHER:
        return be->allgather ? be->allgather(c->ctx, buf, n)
                             : pt_comm_generic_allgather(be, c->ctx, c->rank, c->size, buf, n);
    case PT_OP_BROADCAST:
        return be->broadcast ? be->broadcast(c->ctx, buf, n, arg)
                             : pt_comm_generic_broadcast(be, c->ctx, c->rank, c->size, buf, n, arg);
    case PT_OP_SEND:
        return be->send(c->ctx, buf, n, arg, tag);
    case PT_OP_RECV:
        return be->recv(c->ctx, buf, n, arg, tag);
    case PT_OP_BARRIER:
        return be->barrier ? be->barrier(c->ctx)
                           : pt_comm_generic_barrier(be, c->ctx, c->rank, c->size);
    default:
        return pt_error_set(PT_ERR_INTERNAL, "unknown comm op %d", (int)op);
    }
}

static size_t op_bytes(pt_comm_op op, size_t n) {
    return op == PT_OP_BROADCAST || op == PT_OP_SEND || op == PT_OP_RECV ? n : n * 4;
}

pt_status comm_run_op(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                      uint64_t k) {
    uint64_t t0 = pt_time_ns();
    size_t bytes = op_bytes(op, n);
    if (atomic_load(&c->broken)) {
        /* queued before the communicator failed: it never runs (and the
         * recorder says so: the others must read the operation that
         * failed, not the ones queued behind it) */
        comm_flight_end(c, k, t0, PT_ERR_COMM);
        return check_comm(c, op);
    }
    comm_flight_start(c, k, t0);
    pt_status st = PT_OK;
    if (c->check_order && op != PT_OP_SEND && op != PT_OP_RECV)
        st = comm_order_check(c, k, op, bytes, op == PT_OP_BROADCAST ? arg : -1);
    if (st == PT_OK) st = dispatch(c, op, buf, n, arg, tag);
    uint64_t t1 = pt_time_ns();
    comm_flight_end(c, k, t1, st);
    if (st == PT_OK) count(c, op, bytes, arg, t1 - t0);
    /* A failed operation leaves peers out of step: the communicator is
     * good only for pt_comm_free from here on (comm.h). A job fault: this
     * rank's flight recorder goes to disk (once, if asked for). */
    if (comm_job_fault(st)) {
        atomic_store(&c->broken, 1);
        if (st != PT_ERR_INTERRUPTED) comm_flight_dump(pt_error_message());
    }
    return st;
}

/* ---- argument checks --------------------------------------------------------- */

static pt_status check_comm(const pt_comm *c, pt_comm_op op) {
    if (!c) return pt_error_set(PT_ERR_INVALID, "%s: communicator is NULL", pt_comm_op_name(op));
    if (atomic_load(&((pt_comm *)c)->broken))
        return pt_error_set(PT_ERR_COMM,
                            "%s: the communicator failed earlier; only pt_comm_free "
                            "is allowed",
                            pt_comm_op_name(op));
    return PT_OK;
}

static pt_status check_buf(const pt_comm *c, pt_comm_op op, const void *buf, size_t n,
                           const char *what) {
    PT_CHECK(check_comm(c, op));
    if (!buf && n > 0)
        return pt_error_set(PT_ERR_INVALID, "%s: buf is NULL with %s %zu", pt_comm_op_name(op),
                            what, n);
    if (n > SIZE_MAX / 8)
        return pt_error_set(PT_ERR_INVALID, "%s: %s %zu is too large", pt_comm_op_name(op), what,
                            n);
    return PT_OK;
}

static pt_status check_rop(pt_comm_op op, pt_reduce_op rop) {
    if (rop != PT_REDUCE_SUM && rop != PT_REDUCE_AVG)
        return pt_error_set(PT_ERR_INVALID, "%s: reduce op %d is neither SUM nor AVG",
                            pt_comm_op_name(op), (int)rop);
    return PT_OK;
}

static pt_status check_rank(const pt_comm *c, pt_comm_op op, int r, const char *what) {
    if (r < 0 || r >= c->size)
        return pt_error_set(PT_ERR_INVALID, "%s: %s %d is outside 0..%d", pt_comm_op_name(op), what,
                            r, c->size - 1);
    return PT_OK;
}

static pt_status check_args(const pt_comm *c, pt_comm_op op, const void *buf, size_t n, int arg,
                            int tag) {
    switch (op) {
    case PT_OP_ALLREDUCE:
    case PT_OP_REDUCE_SCATTER:
        PT_CHECK(check_buf(c, op, buf, n, "count"));
        return check_rop(op, (pt_reduce_op)arg);
    case PT_OP_ALLGATHER:
        return check_buf(c, op, buf, n, "count");
    case PT_OP_BROADCAST:
        PT_CHECK(check_buf(c, op, buf, n, "bytes"));
        return check_rank(c, op, arg, "root");
    case PT_OP_SEND:
    case PT_OP_RECV:
        PT_CHECK(check_buf(c, op, buf, n, "bytes"));
        PT_CHECK(check_rank(c, op, arg, "peer"));
        if (tag < 0)
            return pt_error_set(PT_ERR_INVALID, "%s: tag %d is negative (reserved)",
                                pt_comm_op_name(op), tag);
        return PT_OK;
    default:
        return check_comm(c, op);
    }
}

static int peer_of(pt_comm_op op, int arg) {
    return op == PT_OP_BROADCAST || op == PT_OP_SEND || op == PT_OP_RECV ? arg : -1;
}

static pt_status blocking(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag) {
    PT_CHECK(check_args(c, op, buf, n, arg, tag));
    int f = comm_fault_at(c, op);
    if (f == FAULT_SKIP) return PT_OK;
    uint64_t k = comm_flight_issue(c, op, op_bytes(op, n), peer_of(op, arg), tag, 0);
    if (f == FAULT_HOLD) { /* runs later, after the next operation (a swap) */
        pt_comm_req *r = NULL;
        PT_CHECK(comm_enqueue_held(c, op, buf, n, arg, tag, k, 1, &r));
        comm_fault_hold(r);
        return PT_OK;
    }
    uint64_t t0 = pt_time_ns();
    comm_drain(c, comm_drain_mask(c, op));
    pt_status st = comm_run_op(c, op, buf, n, arg, tag, k);
    pthread_mutex_lock(&c->mu);
    c->stats.blocked_ns += pt_time_ns() - t0; /* the caller's exposed time */
    pthread_mutex_unlock(&c->mu);
    if (st == PT_OK)
        comm_fault_after();
    else
        comm_fault_drop_for(NULL); /* the job failed before the held one's turn */
    return st;
}

static pt_status nonblocking(pt_comm *c, pt_comm_op op, void *buf, size_t n, int arg, int tag,
                             pt_comm_req **req) {
    if (!req) return pt_error_set(PT_ERR_INVALID, "i%s: req is NULL", pt_comm_op_name(op));
    *req = NULL;
    PT_CHECK(check_args(c, op, buf, n, arg, tag));
    int f = comm_fault_at(c, op);
    if (f == FAULT_SKIP) return comm_req_done(c, op, req); /* never issued: done at once */
    uint64_t k = comm_flight_issue(c, op, op_bytes(op, n), peer_of(op, arg), tag, pt_time_ns());
    if (f == FAULT_HOLD) {
        PT_CHECK(comm_enqueue_held(c, op, buf, n, arg, tag, k, 0, req));
        comm_fault_hold(*req);
        return PT_OK;
    }
    PT_CHECK(comm_enqueue(c, op, buf, n, arg, tag, k, req));
    comm_fault_after();
    return PT_OK;
}

/* ---- public operations ---------------------------------------------------------- */

pt_status pt_comm_allreduce(pt_comm *c, float *buf, size_t count, pt_reduce_op op) {
    return blocking(c, PT_OP_ALLREDUCE, buf, count, (int)op, 0);
}
pt_status pt_comm_reduce_scatter(pt_comm *c, float *buf, size_t count, pt_reduce_op op) {
    return blocking(c, PT_OP_REDUCE_SCATTER, buf, count, (int)op, 0);
}
pt_status pt_comm_allgather(pt_comm *c, float *buf, size_t count) {
    return blocking(c, PT_OP_ALLGATHER, buf, count, 0, 0);
}
pt_status pt_comm_broadcast(pt_comm *c, void *buf, size_t bytes, int root) {
    return blocking(c, PT_OP_BROADCAST, buf, bytes, root, 0);
}
pt_status pt_comm_send(pt_comm *c, const void *buf, size_t bytes, int peer, int tag) {
    return blocking(c, PT_OP_SEND, (void *)buf, bytes, peer, tag);
}
pt_status pt_comm_recv(pt_comm *c, void *buf, size_t bytes, int peer, int tag) {
    return blocking(c, PT_OP_RECV, buf, bytes, peer, tag);
}
pt_status pt_comm_barrier(pt_comm *c) {
    return blocking(c, PT_OP_BARRIER, NULL, 0, 0, 0);
}

pt_status pt_comm_iallreduce(pt_comm *c, float *buf, size_t count, pt_reduce_op op,
                             pt_comm_req **req) {
    return nonblocking(c, PT_OP_ALLREDUCE, buf, count, (int)op, 0, req);
}
pt_status pt_comm_ireduce_scatter(pt_comm *c, float *buf, size_t count, pt_reduce_op op,
                                  pt_comm_req **req) {
    return nonblocking(c, PT_OP_REDUCE_SCATTER, buf, count, (int)op, 0, req);
}
pt_status pt_comm_iallgather(pt_comm *c, float *buf, size_t count, pt_comm_req **req) {
    return nonblocking(c, PT_OP_ALLGATHER, buf, count, 0, 0, req);
}
pt_status pt_comm_ibroadcast(pt_comm *c, void *buf, size_t bytes, int root, pt_comm_req **req) {
    return nonblocking(c, PT_OP_BROADCAST, buf, bytes, root, 0, req);
}
pt_status pt_comm_isend(pt_comm *c, const void *buf, size_t bytes, int peer, int tag,
                        pt_comm_req **req) {
    return nonblocking(c, PT_OP_SEND, (void *)buf, bytes, peer, tag, req);
}
pt_status pt_comm_irecv(pt_comm *c, void *buf, size_t bytes, int peer, int tag, pt_comm_req **req) {
    return nonblocking(c, PT_OP_RECV, buf, bytes, peer, tag, req);
}

/* ---- lifecycle ------------------------------------------------------------------- */

size_t pt_comm_scratch_bytes(void) {
    return PT_COMM_GENERIC_PIECE * sizeof(float);
}

/* The communicator around ctx, with its recorder's id and name. */
static pt_status wrap(const pt_comm_backend *be, void *ctx, int rank, int size, uint64_t id,
                      const char *role, int index, int sub, int check_order, pt_comm **out) {
    PT_ASSERT(be && out && rank >= 0 && rank < size);
    *out = NULL;
    pt_comm *c = aligned_alloc(64, sizeof *c); /* the flight ring's records are cache lines */
    if (c) memset(c, 0, sizeof *c);
    float *scratch = pt_mem_alloc(PT_MEM_COMM, pt_comm_scratch_bytes());
    float *order = check_order && size > 1
                       ? pt_mem_alloc(PT_MEM_COMM, (size_t)size * ORDER_FLOATS * sizeof(float))
                       : NULL;
    if (!c || !scratch || (check_order && size > 1 && !order)) {
        free(c);
        pt_mem_free(scratch);
        pt_mem_free(order);
        be->free(ctx);
        return pt_error_set(PT_ERR_NOMEM, "out of memory for a communicator");
    }
    c->be = be;
    c->ctx = ctx;
    c->rank = rank;
    c->size = size;
    c->scratch = scratch;
    c->check_order = order != NULL;
    c->order_buf = order;
    /* PT_COMM_GENERIC=1: run every collective through the generic versions
     * on the backend's send/recv (so that tests cover them on any backend). */
    c->generic = pt_knob_int("PT_COMM_GENERIC") == 1;
    c->p2p_only = (pt_comm_backend){.name = be->name,
                                    .send = be->send,
                                    .recv = be->recv,
                                    .split = be->split,
                                    .free = be->free,
                                    .set_timeout = be->set_timeout,
                                    .fault_reported = be->fault_reported,
                                    .claim_error_line = be->claim_error_line,
                                    .flight_table = be->flight_table,
                                    .world_rank = be->world_rank,
                                    .verdict = be->verdict};
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->idle, NULL);
    comm_lanes_init(c);
    comm_flight_init(c, id, role, index, sub);
    *out = c;
    return PT_OK;
}

/* The world's recorder id: the same on every rank of a job. */
#define WORLD_ID 0x776f726c64ull /* "world" */

pt_status pt_comm_wrap(const pt_comm_backend *be, void *ctx, int rank, int size, pt_comm **out) {
    return wrap(be, ctx, rank, size, WORLD_ID, "world", -1, 0, 0, out);
}

pt_status pt_comm_set_check_order(pt_comm *c, int on) {
    if (!c) return pt_error_set(PT_ERR_INVALID, "set_check_order: communicator is NULL");
    comm_drain(c, COMM_ALL_LANES);
    if (on && c->size > 1 && !c->order_buf) {
        c->order_buf = pt_mem_alloc(PT_MEM_COMM, (size_t)c->size * ORDER_FLOATS * sizeof(float));
        if (!c->order_buf)
            return pt_error_set(PT_ERR_NOMEM, "comm.check_order: %d ranks' records", c->size);
    }
    c->check_order = on && c->order_buf;
    return PT_OK;
}

pt_status pt_comm_split(pt_comm *c, int color, int key, pt_comm **out) {
    if (!out) return pt_error_set(PT_ERR_INVALID, "split: out is NULL");
    *out = NULL;
    if (!c) return pt_error_set(PT_ERR_INVALID, "split: communicator is NULL");
    comm_drain(c, COMM_ALL_LANES);
    uint64_t k = comm_flight_issue(c, FL_OP_SPLIT, 0, -1, color, 0);
    uint64_t t0 = pt_time_ns();
    comm_flight_start(c, k, t0);
    pt_status st = c->check_order ? comm_order_check(c, k, FL_OP_SPLIT, 0, -1) : PT_OK;
    void *ctx = NULL;
    int rank = 0, size = 0;
    if (st == PT_OK) st = c->be->split(c->ctx, color, key, &ctx, &rank, &size);
    comm_flight_end(c, k, pt_time_ns(), st);
    if (comm_job_fault(st)) {
        atomic_store(&c->broken, 1);
        comm_flight_dump(pt_error_message());
    }
    if (st != PT_OK) return st;
    uint64_t id = comm_flight_child_id(c, color);
    return wrap(c->be, ctx, rank, size, id, c->fl.role, c->fl.index, (int)c->fl.splits,
                c->check_order, out);
}

void pt_comm_free(pt_comm *c) {
    if (!c) return;
    comm_fault_drop_for(c); /* a held operation of c never runs */
    comm_lanes_deinit(c);   /* waits for the queued operations */
    comm_flight_deinit(c);
    c->be->free(c->ctx);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mu);
    pt_mem_free(c->scratch);
    pt_mem_free(c->order_buf);
    free(c);
}

const pt_comm_backend *pt_comm_backend_of(const pt_comm *c) {
    return c->be;
}
void *pt_comm_ctx(const pt_comm *c) {
    return c->ctx;
}

int pt_comm_rank(const pt_comm *c) {
    return c ? c->rank : 0;
}
int pt_comm_size(const pt_comm *c) {
    return c ? c->size : 1;
}
const char *pt_comm_backend_name(const pt_comm *c) {
    return c ? c->be->name : "none";
}
void pt_comm_note_step(pt_comm *c, long step) {
    if (c && c->be->note_step) c->be->note_step(c->ctx, step);
}

int pt_comm_fault_reported(const pt_comm *c, pt_status st) {
    if (!c || st == PT_OK || !c->be->fault_reported) return 0;
    return c->be->fault_reported(c->ctx, st);
}

int pt_comm_fault_restartable(pt_status st) {
    if (st != PT_ERR_COMM && st != PT_ERR_TIMEOUT) return 0;
    return !strstr(pt_error_message(), COMM_ORDER_MARK); /* every rank's words say so */
}

int pt_comm_claim_error_line(pt_comm *c) {
    if (!c || !c->be->claim_error_line) return 1;
    return c->be->claim_error_line(c->ctx);
}

pt_status pt_comm_agree(pt_comm *c, pt_status local) {
    if (!c) return pt_error_set(PT_ERR_INVALID, "agree: communicator is NULL");
    int n = c->size, me = c->rank;
    if (n == 1) return local;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", local != PT_OK ? pt_error_message() : "");
    /* One slot per rank: the failed ranks and their statuses in one
     * all-reduce (statuses are small negative integers, exact in float). */
    float stack[64], *bad = n <= 64 ? stack : pt_mem_alloc(PT_MEM_COMM, (size_t)n * sizeof(float));
    pt_status e = bad ? PT_OK : pt_error_set(PT_ERR_NOMEM, "agree: %d statuses", n);
    if (bad) {
        memset(bad, 0, (size_t)n * sizeof(float));
        bad[me] = (float)-local;
        e = pt_comm_allreduce(c, bad, (size_t)n, PT_REDUCE_SUM);
    }
    int first = -1;
    for (int r = 0; e == PT_OK && r < n && first < 0; r++)
        if (bad[r] != 0.0f) first = r;
    pt_status code = first >= 0 ? (pt_status)(-(int)bad[first]) : PT_OK;
    if (bad != stack) pt_mem_free(bad);
    if (e == PT_OK && first >= 0) e = pt_comm_broadcast(c, msg, sizeof msg, first);
    if (e != PT_OK) {
        if (local == PT_OK) return e;
        return pt_error_set(local, "%s", msg); /* my own failure says more */
    }
    if (first < 0) return PT_OK;
    msg[sizeof msg - 1] = '\0';
    pt_error_set(code, "%s", msg);
    pt_error_mark_shared(); /* every rank returns this message */
    return code;
}

pt_status pt_comm_set_timeout(pt_comm *c, double seconds, double *old) {
    if (!c) return pt_error_set(PT_ERR_INVALID, "set_timeout: communicator is NULL");
    if (!(seconds > 0))
        return pt_error_set(PT_ERR_INVALID, "set_timeout: %g s is not positive", seconds);
    comm_drain(c, COMM_ALL_LANES);
    double prev = c->be->set_timeout(c->ctx, seconds);
    if (old) *old = prev;
    return PT_OK;
}
