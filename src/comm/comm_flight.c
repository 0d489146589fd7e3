/* The flight recorder's ring and progress table (flight_impl.h): every
 * communicator's last operations and this rank's published progress,
 * recorded by the wrappers (comm.c) and the lanes at the issue, start and
 * end of every operation; communicator ids and names; the process's list
 * of live communicators, which dumps walk.
 *
 * Cost (always on): at issue a record of a few plain stores; at start and
 * end a few more and, for the table, relaxed atomic stores into this
 * rank's own slot (shm: its own lines of the arena, which nobody polls).
 * No lock, no system call, no clock read beyond the ones the wrappers
 * already make for the counters (a non-blocking operation's issue reads
 * the clock once). Measured: docs/comm.md, "Flight recorder".
 *
 * Not here: the analysis (comm_flight_why.c), dumps and SIGTERM
 * (comm_flight_dump.c), check_order (comm_order.c). */
#include "communicator_impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- the progress table ---------------------------------------------------- */

/* The process's own table, where no backend keeps one (a world of one
 * without a table slot). */
static pt_flight_table own_table;
static pthread_mutex_t fl_mu = PTHREAD_MUTEX_INITIALIZER; /* slots and the list */
static pt_comm *fl_list;

static uint64_t role_word(const char *role) {
    uint64_t w = 0;
    for (int i = 0; i < FL_ROLE_MAX && role[i]; i++)
        w |= (uint64_t)(unsigned char)role[i] << (8 * i);
    return w;
}

int pt_flight_read(const pt_flight_slot *slot, pt_flight_snap *s) {
    memset(s, 0, sizeof *s);
    pt_flight_slot *x = (pt_flight_slot *)slot;
    s->id = atomic_load_explicit(&x->id, memory_order_acquire);
    if (!s->id) return 0;
    uint64_t w = atomic_load_explicit(&x->role, memory_order_relaxed);
    for (int i = 0; i < FL_ROLE_MAX; i++) s->role[i] = (char)(w >> (8 * i));
#define LD(f) s->f = atomic_load_explicit(&x->f, memory_order_relaxed)
    LD(index), LD(sub), LD(size), LD(rank), LD(started), LD(cur_op), LD(cur_state);
    LD(cur_bytes), LD(t_started), LD(done), LD(last_op), LD(last_peer), LD(last_seq);
    LD(last_bytes), LD(last_end), LD(p2p_op), LD(p2p_state), LD(p2p_peer), LD(p2p_seq);
    LD(p2p_bytes), LD(freed);
#undef LD
    return 1;
}

void pt_flight_write(pt_flight_slot *x, const pt_flight_snap *s) {
#define ST(f) atomic_store_explicit(&x->f, s->f, memory_order_relaxed)
    ST(index), ST(sub), ST(size), ST(rank), ST(started), ST(cur_op), ST(cur_state);
    ST(cur_bytes), ST(t_started), ST(done), ST(last_op), ST(last_peer), ST(last_seq);
    ST(last_bytes), ST(last_end), ST(p2p_op), ST(p2p_state), ST(p2p_peer), ST(p2p_seq);
    ST(p2p_bytes), ST(freed);
#undef ST
    char role[FL_ROLE_MAX + 1];
    memcpy(role, s->role, sizeof role);
    role[FL_ROLE_MAX] = '\0';
    atomic_store_explicit(&x->role, role_word(role), memory_order_relaxed);
    atomic_store_explicit(&x->id, s->id, memory_order_release);
}

int pt_flight_pack(const pt_flight_table *t, pt_flight_snap *out) {
    int n = 0;
    for (int i = 0; i < PT_FLIGHT_SLOTS; i++)
        if (pt_flight_read(&t->slot[i], &out[i])) n = i + 1;
    return n;
}

void pt_flight_unpack(pt_flight_table *t, const pt_flight_snap *in, int n) {
    for (int i = 0; i < PT_FLIGHT_SLOTS; i++) {
        if (i < n && in[i].id)
            pt_flight_write(&t->slot[i], &in[i]);
        else
            atomic_store_explicit(&t->slot[i].id, 0, memory_order_release);
    }
}

/* ---- names ------------------------------------------------------------------- */

const char *pt_flight_op_name(int op) {
    return op == FL_OP_SPLIT ? "split" : pt_comm_op_name((pt_comm_op)op);
}

void pt_flight_group_name(const char *role, int index, int sub, char *out, size_t len) {
    int k = snprintf(out, len, "%s", role[0] ? role : "comm");
    if (index >= 0 && k >= 0 && (size_t)k < len)
        k += snprintf(out + k, len - (size_t)k, " group %d", index);
    if (sub > 0 && k >= 0 && (size_t)k < len) snprintf(out + k, len - (size_t)k, ".%d", sub);
}

void pt_flight_bytes(uint64_t b, char *out, size_t len) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0)
        snprintf(out, len, "%llu B", (unsigned long long)b);
    else if (v == (double)(uint64_t)v)
        snprintf(out, len, "%.0f %s", v, unit[u]);
    else
        snprintf(out, len, "%.3g %s", v, unit[u]);
}

void comm_flight_name(const pt_comm *c, char *out, size_t len) {
    pt_flight_group_name(c->fl.role, c->fl.index, c->fl.sub, out, len);
}

/* splitmix64's finalizer: ids of different (parent, split, color) differ. */
static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t comm_flight_child_id(pt_comm *c, int color) {
    /* every member splits c in the same order: the same count here */
    uint64_t id = mix(c->fl.id ^ mix(++c->fl.splits) ^ mix((uint64_t)(uint32_t)color << 1));
    return id ? id : 1;
}

void pt_comm_set_name(pt_comm *c, const char *role, int index) {
    if (!c || !role) return;
    snprintf(c->fl.role, sizeof c->fl.role, "%s", role);
    c->fl.index = index < 0 ? -1 : index;
    c->fl.sub = 0;
    pt_flight_slot *s = c->fl.slot;
    if (!s) return;
    atomic_store_explicit(&s->role, role_word(c->fl.role), memory_order_relaxed);
    atomic_store_explicit(&s->index, c->fl.index, memory_order_relaxed);
    atomic_store_explicit(&s->sub, 0, memory_order_relaxed);
}

/* ---- a communicator's recorder -------------------------------------------- */

void comm_flight_init(pt_comm *c, uint64_t id, const char *role, int index, int sub) {
    comm_flight *f = &c->fl;
    f->id = id;
    snprintf(f->role, sizeof f->role, "%s", role);
    f->index = index;
    f->sub = sub;
    f->pid = getpid();
    pt_flight_table *t = c->be->flight_table ? c->be->flight_table(c->ctx, -1) : NULL;
    if (!t) t = &own_table;
    pthread_mutex_lock(&fl_mu);
    /* a slot never used, else a freed one (its history goes): the freed
     * slot of the same id first, so that an id is in one slot */
    pt_flight_slot *pick = NULL;
    for (int pass = 0; pass < 3 && !pick; pass++)
        for (int i = 0; i < PT_FLIGHT_SLOTS && !pick; i++) {
            pt_flight_slot *s = &t->slot[i];
            uint64_t sid = atomic_load_explicit(&s->id, memory_order_relaxed);
            int freed = atomic_load_explicit(&s->freed, memory_order_relaxed);
            if ((pass == 0 && sid == id && freed) || (pass == 1 && !sid) || (pass == 2 && freed))
                pick = s;
        }
    if (pick) {
        pt_flight_snap z = {
            .id = id, .index = f->index, .sub = sub, .size = c->size, .rank = c->rank};
        memcpy(z.role, f->role, sizeof z.role);
        pt_flight_write(pick, &z);
        f->slot = pick;
    }
    f->next = fl_list;
    if (fl_list) fl_list->fl.prev = c;
    fl_list = c;
    pthread_mutex_unlock(&fl_mu);
}

void comm_flight_deinit(pt_comm *c) {
    comm_flight *f = &c->fl;
    pthread_mutex_lock(&fl_mu);
    if (f->pid == getpid()) {
        if (f->prev) f->prev->fl.next = f->next;
        if (f->next) f->next->fl.prev = f->prev;
        if (fl_list == c) fl_list = f->next;
    }
    /* The slot keeps the communicator's last progress, marked freed, until
     * a new communicator needs it: a launcher (shm) reads the tables after
     * the job, a peer (mpi) the last beat, and a rank that left early must
     * read as one that never arrived. A failed communicator's slot stays as
     * it is: the operation it failed in is what the others read. */
    if (f->slot && !atomic_load(&c->broken))
        atomic_store_explicit(&f->slot->freed, 1, memory_order_release);
    f->slot = NULL;
    pthread_mutex_unlock(&fl_mu);
}

void comm_flight_each(void (*fn)(const pt_comm *c, void *arg), void *arg) {
    pthread_mutex_lock(&fl_mu);
    for (pt_comm *c = fl_list; c; c = c->fl.next)
        if (c->fl.pid == getpid()) fn(c, arg);
    pthread_mutex_unlock(&fl_mu);
}

static int is_p2p(int op) {
    return op == PT_OP_SEND || op == PT_OP_RECV;
}

/* The world rank of member m of c (the tables name world ranks). */
static int world_of(const pt_comm *c, int m) {
    if (m < 0) return -1;
    return c->be->world_rank ? c->be->world_rank(c->ctx, m) : m;
}

uint64_t comm_flight_issue(pt_comm *c, int op, uint64_t bytes, int peer, int tag,
                           uint64_t t_queued) {
    comm_flight *f = &c->fl;
    /* one issuing thread at a time (comm.h): loads and stores, no RMW */
    uint64_t k = atomic_load_explicit(&f->issued, memory_order_relaxed) + 1;
    atomic_store_explicit(&f->issued, k, memory_order_relaxed);
    _Atomic uint64_t *ctr = is_p2p(op) ? &f->p2p : &f->coll;
    uint64_t seq = atomic_load_explicit(ctr, memory_order_relaxed) + 1;
    atomic_store_explicit(ctr, seq, memory_order_relaxed);
    fl_rec *r = &f->ring[k & (FL_RING - 1)];
    atomic_store_explicit(&r->n, 0, memory_order_relaxed);
    r->seq = seq;
    r->bytes = bytes;
    r->t_queued = t_queued; /* t_start and t_end mean something from their state on */
    r->op = op;
    r->peer = peer;
    r->tag = tag;
    atomic_store_explicit(&r->state, FL_QUEUED, memory_order_relaxed);
    atomic_store_explicit(&r->n, k, memory_order_release);
    return k;
}

uint64_t comm_flight_seq(const pt_comm *c, uint64_t k, int *op, uint64_t *bytes) {
    const fl_rec *r = &c->fl.ring[k & (FL_RING - 1)];
    if (atomic_load_explicit(&((fl_rec *)r)->n, memory_order_acquire) != k) return 0;
    if (op) *op = r->op;
    if (bytes) *bytes = r->bytes;
    return r->seq;
}

void comm_flight_start(pt_comm *c, uint64_t k, uint64_t t) {
    fl_rec *r = &c->fl.ring[k & (FL_RING - 1)];
    if (atomic_load_explicit(&r->n, memory_order_acquire) != k) return; /* overwritten */
    atomic_store_explicit(&r->t_start, t, memory_order_relaxed);
    atomic_store_explicit(&r->state, FL_RUNNING, memory_order_relaxed);
    pt_flight_slot *s = c->fl.slot;
    if (!s) return;
    if (is_p2p(r->op)) {
        atomic_store_explicit(&s->p2p_seq, r->seq, memory_order_relaxed);
        atomic_store_explicit(&s->p2p_op, r->op, memory_order_relaxed);
        atomic_store_explicit(&s->p2p_peer, world_of(c, r->peer), memory_order_relaxed);
        atomic_store_explicit(&s->p2p_bytes, r->bytes, memory_order_relaxed);
        atomic_store_explicit(&s->p2p_state, FL_RUNNING, memory_order_relaxed);
        return;
    }
    atomic_store_explicit(&s->cur_op, r->op, memory_order_relaxed);
    atomic_store_explicit(&s->cur_bytes, r->bytes, memory_order_relaxed);
    atomic_store_explicit(&s->t_started, t, memory_order_relaxed);
    atomic_store_explicit(&s->cur_state, FL_RUNNING, memory_order_relaxed);
    atomic_store_explicit(&s->started, r->seq, memory_order_release);
}

void comm_flight_end(pt_comm *c, uint64_t k, uint64_t t, pt_status st) {
    fl_rec *r = &c->fl.ring[k & (FL_RING - 1)];
    if (atomic_load_explicit(&r->n, memory_order_acquire) != k) return;
    int state = st == PT_OK ? FL_DONE : FL_FAILED;
    int ran = atomic_load_explicit(&r->state, memory_order_relaxed) == FL_RUNNING;
    atomic_store_explicit(&r->t_end, t, memory_order_relaxed);
    atomic_store_explicit(&r->state, state, memory_order_release);
    pt_flight_slot *s = c->fl.slot;
    if (!s || !ran) return; /* never started: the table is not about it */
    if (is_p2p(r->op))
        atomic_store_explicit(&s->p2p_state, state, memory_order_relaxed);
    else
        atomic_store_explicit(&s->cur_state, state, memory_order_relaxed);
    if (st != PT_OK) return;
    if (!is_p2p(r->op)) atomic_store_explicit(&s->done, r->seq, memory_order_relaxed);
    atomic_store_explicit(&s->last_op, r->op, memory_order_relaxed);
    atomic_store_explicit(&s->last_peer, is_p2p(r->op) ? world_of(c, r->peer) : -1,
                          memory_order_relaxed);
    atomic_store_explicit(&s->last_seq, r->seq, memory_order_relaxed);
    atomic_store_explicit(&s->last_bytes, r->bytes, memory_order_relaxed);
    atomic_store_explicit(&s->last_end, t, memory_order_release);
}
