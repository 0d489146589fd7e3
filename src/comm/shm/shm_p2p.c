/* The shm backend's send/recv: one byte ring per ordered pair of members
 * (shm_impl.h). A message is a 16-byte header (tag, bytes) then the payload, streamed
 * through the ring as space frees up. A recv takes the first message from
 * the peer with its tag; messages with other tags read on the way are kept
 * (allocated) for later recvs. A size that differs from the recv's is an
 * error.
 *
 * Not here: waiting (shm_wait.c), the collectives (shm_coll.c). */
#include "shm_impl.h"

#include <string.h>

typedef struct {
    shm_ring *r;
    int peer;
    uint64_t need; /* bytes of space (send) or data (recv) wanted */
} ring_wait;

static int pending_space(shm_ctx *x, const void *arg) {
    const ring_wait *w = arg;
    uint64_t used = atomic_load_explicit(&w->r->head, memory_order_relaxed) -
                    atomic_load_explicit(&w->r->tail, memory_order_acquire);
    return x->reg->ring_bytes - used >= w->need ? -1 : w->peer;
}

static int pending_data(shm_ctx *x, const void *arg) {
    const ring_wait *w = arg;
    uint64_t avail = atomic_load_explicit(&w->r->head, memory_order_acquire) -
                     atomic_load_explicit(&w->r->tail, memory_order_relaxed);
    (void)x;
    return avail >= w->need ? -1 : w->peer;
}

static char *ring_data(shm_ring *r) {
    return (char *)(r + 1);
}

static pt_status ring_write(shm_ctx *x, shm_ring *r, int peer, const char *p, size_t bytes,
                            int op) {
    const uint64_t R = x->reg->ring_bytes;
    while (bytes > 0) {
        ring_wait w = {r, peer, 1};
        PT_CHECK(shm_wait_until(x, pending_space, &w, op));
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
        uint64_t space = R - (head - atomic_load_explicit(&r->tail, memory_order_acquire));
        size_t k = bytes < space ? bytes : space;
        size_t pos = head % R, first = R - pos < k ? R - pos : k;
        memcpy(ring_data(r) + pos, p, first);
        memcpy(ring_data(r), p + first, k - first);
        atomic_store_explicit(&r->head, head + k, memory_order_release);
        shm_wake(x);
        p += k;
        bytes -= k;
    }
    return PT_OK;
}

static pt_status ring_read(shm_ctx *x, shm_ring *r, int peer, char *p, size_t bytes, int op) {
    const uint64_t R = x->reg->ring_bytes;
    while (bytes > 0) {
        ring_wait w = {r, peer, 1};
        PT_CHECK(shm_wait_until(x, pending_data, &w, op));
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        uint64_t avail = atomic_load_explicit(&r->head, memory_order_acquire) - tail;
        size_t k = bytes < avail ? bytes : avail;
        size_t pos = tail % R, first = R - pos < k ? R - pos : k;
        memcpy(p, ring_data(r) + pos, first);
        memcpy(p + first, ring_data(r), k - first);
        atomic_store_explicit(&r->tail, tail + k, memory_order_release);
        shm_wake(x);
        p += k;
        bytes -= k;
    }
    return PT_OK;
}

typedef struct {
    int64_t tag;
    uint64_t bytes;
} msg_header;

pt_status shm_send(void *ctx, const void *buf, size_t bytes, int peer, int tag) {
    shm_ctx *x = ctx;
    shm_op_begin(x, PT_OP_SEND);
    msg_header hd = {tag, bytes};
    shm_ring *r = ring_of(x, x->rank, peer);
    pt_status st = ring_write(x, r, peer, (const char *)&hd, sizeof hd, PT_OP_SEND);
    if (st == PT_OK) st = ring_write(x, r, peer, buf, bytes, PT_OP_SEND);
    return shm_op_end(x, PT_OP_SEND, st);
}

/* A message read off the ring ahead of the recv that matches its tag (only
 * when tags are received out of send order: the one case that allocates). */
struct shm_unexpected {
    int64_t tag;
    size_t bytes;
    shm_unexpected *next;
    char data[];
};

static pt_status size_mismatch(shm_ctx *x, int peer, int tag, size_t got, size_t want) {
    char who[64];
    shm_name_member(x, peer, who, sizeof who);
    return pt_error_set(PT_ERR_COMM,
                        "recv: message from %s with tag %d has %zu bytes, expected %zu", who, tag,
                        got, want);
}

/* Messages from a peer with one tag are received in the order sent; a
 * message with another tag found first is set aside for a later recv. */
static pt_status recv_matching(shm_ctx *x, void *buf, size_t bytes, int peer, int tag) {
    for (shm_unexpected **pp = &x->unexpected[peer]; *pp; pp = &(*pp)->next) {
        shm_unexpected *u = *pp;
        if (u->tag != tag) continue;
        if (u->bytes != bytes) return size_mismatch(x, peer, tag, u->bytes, bytes);
        memcpy(buf, u->data, bytes);
        *pp = u->next;
        pt_mem_free(u);
        return PT_OK;
    }
    shm_ring *r = ring_of(x, peer, x->rank);
    for (;;) {
        msg_header hd;
        PT_CHECK(ring_read(x, r, peer, (char *)&hd, sizeof hd, PT_OP_RECV));
        if (hd.tag == tag) {
            if (hd.bytes != bytes) return size_mismatch(x, peer, tag, hd.bytes, bytes);
            return ring_read(x, r, peer, buf, bytes, PT_OP_RECV);
        }
        shm_unexpected *u = pt_mem_alloc(PT_MEM_COMM, sizeof *u + hd.bytes);
        if (!u) return PT_ERR_NOMEM;
        u->tag = hd.tag;
        u->bytes = hd.bytes;
        u->next = NULL;
        pt_status st = ring_read(x, r, peer, u->data, hd.bytes, PT_OP_RECV);
        if (st != PT_OK) {
            pt_mem_free(u);
            return st;
        }
        shm_unexpected **tail = &x->unexpected[peer];
        while (*tail) tail = &(*tail)->next;
        *tail = u;
    }
}

pt_status shm_recv(void *ctx, void *buf, size_t bytes, int peer, int tag) {
    shm_ctx *x = ctx;
    shm_op_begin(x, PT_OP_RECV);
    return shm_op_end(x, PT_OP_RECV, recv_matching(x, buf, bytes, peer, tag));
}

void shm_p2p_free(shm_ctx *x) {
    for (int p = 0; p < x->n; p++)
        while (x->unexpected[p]) {
            shm_unexpected *u = x->unexpected[p];
            x->unexpected[p] = u->next;
            pt_mem_free(u);
        }
}
