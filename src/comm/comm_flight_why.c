/* What went wrong, in words: the stuck operation of a job and its laggards,
 * from every rank's progress table (pt_flight_describe, flight_impl.h). A
 * pure function of the tables: the shm launcher runs it on the arena after
 * the job, an mpi rank on the copies its peers' heartbeats brought.
 *
 * Which operation: of the collectives in flight (entered, not completed,
 * or failed), one that a member never entered before one that all did,
 * then the one the most ranks wait in, the earliest begun of equals. A rank that skipped a
 * collective, or issued two in the other order, or died or stopped before it, leaves the others
 * waiting in one operation while it waits (if at all) alone in another: the many name the
 * operation, the few are the laggards.
 *
 * Not here: the tables (comm_flight.c), the dumps and `partrain flight`,
 * which find the first mismatch in the rings rather than the tables. */
#include "communicator_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_CAND 64 /* distinct operations in flight considered */
#define MAX_LAG  4  /* laggards described one by one */

typedef struct {
    uint64_t id, seq, t;
    int waiters, op;
    uint64_t bytes;
    pt_flight_snap s; /* a waiter's slot: the group's name */
} cand;

static int in_flight(int state) {
    return state == FL_RUNNING || state == FL_FAILED;
}

/* Append to out (at *k of len). */
static void put(char *out, size_t len, size_t *k, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *out, size_t len, size_t *k, const char *fmt, ...) {
    if (*k >= len) return;
    va_list ap;
    va_start(ap, fmt);
    int r = vsnprintf(out + *k, len - *k, fmt, ap);
    va_end(ap);
    if (r > 0) *k = *k + (size_t)r < len ? *k + (size_t)r : len - 1;
}

static void snap_name(const pt_flight_snap *s, char *out, size_t len) {
    pt_flight_group_name(s->role, s->index, s->sub, out, len);
}

/* World rank w's slot of communicator id (0 when w has none; a live one
 * before a freed one). */
static int find_slot(pt_flight_get get, void *arg, int w, uint64_t id, pt_flight_snap *s) {
    const pt_flight_table *t = get(arg, w);
    int found = 0;
    pt_flight_snap x = {0};
    for (int i = 0; t && i < PT_FLIGHT_SLOTS; i++)
        if (pt_flight_read(&t->slot[i], &x) && x.id == id && (!found || s->freed) &&
            !(found && x.freed))
            *s = x, found = 1;
    return found;
}

/* The collectives in flight, deduplicated, into c[]; returns how many. */
static int gather(pt_flight_get get, void *arg, int nranks, cand *c) {
    int nc = 0;
    for (int w = 0; w < nranks; w++) {
        const pt_flight_table *t = get(arg, w);
        for (int i = 0; t && i < PT_FLIGHT_SLOTS; i++) {
            pt_flight_snap s;
            if (!pt_flight_read(&t->slot[i], &s) || s.freed || !in_flight(s.cur_state) ||
                s.started <= s.done)
                continue;
            int j = 0;
            while (j < nc && !(c[j].id == s.id && c[j].seq == s.started)) j++;
            if (j == nc) {
                if (nc == MAX_CAND) continue;
                c[nc++] = (cand){s.id, s.started, s.t_started, 0, s.cur_op, s.cur_bytes, s};
            }
            c[j].waiters++;
            if (s.t_started < c[j].t) c[j].t = s.t_started;
        }
    }
    return nc;
}

/* The members of collective (id, seq) that never entered it, as
 * "ranks 2, 3" into out; how many. */
static int missing(pt_flight_get get, void *arg, int nranks, uint64_t id, uint64_t seq, char *out,
                   size_t len) {
    int n = 0;
    size_t k = 0;
    out[0] = '\0';
    for (int w = 0; w < nranks; w++) {
        pt_flight_snap s = {0};
        if (!find_slot(get, arg, w, id, &s) || s.started >= seq) continue;
        if (n < 16) put(out, len, &k, "%s%d", n ? ", " : "", w);
        n++;
    }
    if (n > 16) put(out, len, &k, ", ... (%d ranks)", n);
    return n;
}

/* "; rank 5 last completed tp group 0 allreduce #9921, then entered aux
 * allreduce #12, where rank 7 never arrived" */
static void whereabouts(pt_flight_get get, void *arg, int nranks, int w, char *out, size_t len,
                        size_t *k) {
    const pt_flight_table *t = get(arg, w);
    pt_flight_snap last = {0}, wait = {0}, s;
    int have_last = 0, wait_p2p = 0, have_wait = 0;
    for (int i = 0; t && i < PT_FLIGHT_SLOTS; i++) {
        if (!pt_flight_read(&t->slot[i], &s)) continue;
        if (s.last_end && (!have_last || s.last_end > last.last_end)) last = s, have_last = 1;
        if (s.freed) continue;
        if (!have_wait && in_flight(s.cur_state) && s.started > s.done) wait = s, have_wait = 1;
        if (!have_wait && in_flight(s.p2p_state)) wait = s, have_wait = 1, wait_p2p = 1;
    }
    char name[64];
    if (!t) {
        put(out, len, k, "; rank %d: nothing known", w);
        return;
    }
    if (have_last) {
        snap_name(&last, name, sizeof name);
        put(out, len, k, "; rank %d last completed %s %s #%llu", w, name,
            pt_flight_op_name(last.last_op), (unsigned long long)last.last_seq);
    } else {
        put(out, len, k, "; rank %d completed nothing yet", w);
    }
    if (!have_wait) return;
    snap_name(&wait, name, sizeof name);
    if (wait_p2p) {
        put(out, len, k, ", then entered %s %s #%llu %s rank %d", name,
            pt_flight_op_name(wait.p2p_op), (unsigned long long)wait.p2p_seq,
            wait.p2p_op == PT_OP_SEND ? "to" : "from", wait.p2p_peer);
        return;
    }
    put(out, len, k, ", then entered %s %s #%llu", name, pt_flight_op_name(wait.cur_op),
        (unsigned long long)wait.started);
    char who[160];
    int n = missing(get, arg, nranks, wait.id, wait.started, who, sizeof who);
    if (n) put(out, len, k, ", where rank%s %s never arrived", n > 1 ? "s" : "", who);
}

/* World rank w's point-to-point in flight (1), into *s. */
static int p2p_wait(pt_flight_get get, void *arg, int w, pt_flight_snap *s) {
    const pt_flight_table *t = get(arg, w);
    for (int i = 0; t && i < PT_FLIGHT_SLOTS; i++)
        if (pt_flight_read(&t->slot[i], s) && !s->freed && in_flight(s->p2p_state)) return 1;
    return 0;
}

/* No collective in flight: a point-to-point one, and the chain of waits it
 * starts ("which waits for rank 2, which waits for rank 3"), to the rank
 * at its end. */
static int describe_p2p(pt_flight_get get, void *arg, int nranks, char *out, size_t len) {
    for (int w = 0; w < nranks; w++) {
        pt_flight_snap s;
        if (!p2p_wait(get, arg, w, &s)) continue;
        char name[64], b[32];
        size_t k = 0;
        snap_name(&s, name, sizeof name);
        pt_flight_bytes(s.p2p_bytes, b, sizeof b);
        put(out, len, &k, "%s: rank %d's %s #%llu (%s) %s rank %d", name, w,
            pt_flight_op_name(s.p2p_op), (unsigned long long)s.p2p_seq, b,
            s.p2p_op == PT_OP_SEND ? "to" : "from", s.p2p_peer);
        int end = s.p2p_peer;
        for (int hops = 0; hops < nranks && end >= 0 && end < nranks; hops++) {
            pt_flight_snap n;
            if (!p2p_wait(get, arg, end, &n) || n.p2p_peer == w || n.p2p_peer == end) break;
            put(out, len, &k, ", which waits for rank %d", n.p2p_peer);
            end = n.p2p_peer;
        }
        if (end >= 0 && end < nranks) whereabouts(get, arg, nranks, end, out, len, &k);
        return 1;
    }
    return 0;
}

/* Members of b's group whose table has no slot of it (under mpi: their last
 * heartbeat came before they made the group): named when the group is the
 * world's size (every rank a member), else counted. */
static void unheard(pt_flight_get get, void *arg, int nranks, const cand *b, int members, char *out,
                    size_t len, size_t *k) {
    int missing = b->s.size - members;
    if (b->s.size != nranks) {
        put(out, len, k, " (%d of its %d ranks not heard from)", missing, b->s.size);
        return;
    }
    put(out, len, k, "; rank%s ", missing > 1 ? "s" : "");
    for (int w = 0, n = 0; w < nranks && n < 16; w++) {
        pt_flight_snap s;
        if (find_slot(get, arg, w, b->id, &s)) continue;
        put(out, len, k, "%s%d", n++ ? ", " : "", w);
    }
    put(out, len, k, " not heard from in the group");
}

/* The collective most ranks wait in (the earliest begun of equals), among
 * those a member never entered when there are any: one that every member
 * entered is in flight only because the job was being stopped (a rank of
 * another group died while its members were still in it); -1: none in
 * flight. */
static int best_of(pt_flight_get get, void *arg, int nranks, const cand *c, int nc) {
    int best = -1, best_lags = 0;
    for (int j = 0; j < nc; j++) {
        char who[160];
        int lags = missing(get, arg, nranks, c[j].id, c[j].seq, who, sizeof who) > 0;
        if (best < 0 || lags > best_lags ||
            (lags == best_lags && (c[j].waiters > c[best].waiters ||
                                   (c[j].waiters == c[best].waiters && c[j].t < c[best].t))))
            best = j, best_lags = lags;
    }
    return best;
}

int pt_flight_culprit(pt_flight_get get, void *arg, int nranks) {
    cand c[MAX_CAND];
    int nc = gather(get, arg, nranks, c), best = best_of(get, arg, nranks, c, nc);
    if (best < 0) return -1;
    for (int w = 0; w < nranks; w++) {
        pt_flight_snap s = {0};
        if (find_slot(get, arg, w, c[best].id, &s) && s.started < c[best].seq) return w;
    }
    return -1;
}

int pt_flight_describe(pt_flight_get get, void *arg, int nranks, int culprit, char *out,
                       size_t len) {
    out[0] = '\0';
    cand c[MAX_CAND];
    int nc = gather(get, arg, nranks, c), best = best_of(get, arg, nranks, c, nc);
    if (best < 0) return describe_p2p(get, arg, nranks, out, len);
    const cand *b = &c[best];
    char name[64], bytes[32];
    snap_name(&b->s, name, sizeof name);
    pt_flight_bytes(b->bytes, bytes, sizeof bytes);
    size_t k = 0;
    put(out, len, &k, "%s: %s #%llu (%s)", name, pt_flight_op_name(b->op),
        (unsigned long long)b->seq, bytes);
    /* members: the ranks with a slot of this communicator */
    int lag[64], nlag = 0, odd = -1, members = 0, culprit_member = 0, culprit_lags = 0;
    pt_flight_snap odd_s = {0};
    for (int w = 0; w < nranks; w++) {
        pt_flight_snap s = {0};
        if (!find_slot(get, arg, w, b->id, &s)) continue;
        members++;
        if (w == culprit) culprit_member = 1;
        if (s.started < b->seq) {
            if (w == culprit) culprit_lags = 1;
            if (nlag < 64) lag[nlag] = w;
            nlag++;
        } else if (s.started == b->seq && odd < 0 &&
                   (s.cur_op != b->op || s.cur_bytes != b->bytes)) {
            odd = w, odd_s = s;
        }
    }
    if (culprit_lags && lag[0] != culprit) { /* the rank at fault first */
        int i = 1;
        while (i < nlag && i < 64 && lag[i] != culprit) i++;
        for (; i > 0 && i < 64; i--) lag[i] = lag[i - 1];
        lag[0] = culprit;
    }
    if (nlag > 0) {
        put(out, len, &k, ": rank%s ", nlag > 1 ? "s" : "");
        for (int i = 0; i < nlag && i < 16; i++) put(out, len, &k, "%s%d", i ? ", " : "", lag[i]);
        if (nlag > 16) put(out, len, &k, ", ... (%d ranks)", nlag);
        put(out, len, &k, " never arrived");
        for (int i = 0; i < nlag && i < MAX_LAG; i++)
            whereabouts(get, arg, nranks, lag[i], out, len, &k);
    } else if (odd >= 0) {
        pt_flight_bytes(odd_s.cur_bytes, bytes, sizeof bytes);
        put(out, len, &k, ": operations out of order: rank %d's #%llu is %s (%s)", odd,
            (unsigned long long)b->seq, pt_flight_op_name(odd_s.cur_op), bytes);
    } else {
        put(out, len, &k,
            members < b->s.size ? ": every rank heard from arrived" : ": every rank arrived");
        if (culprit >= 0 && culprit_member)
            put(out, len, &k, "; rank %d never finished it", culprit);
    }
    if (members < b->s.size) unheard(get, arg, nranks, b, members, out, len, &k);
    return 1;
}
