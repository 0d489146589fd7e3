/* The shm backend's pipelined all-reduce (above PT_SHM_SMALL bytes when the
 * single-copy path is off or not worth it, shm_coll.c).
 *
 * The staging area of a member (both halves) is a ring of Q slots; chunk i
 * is one slice of c floats from every shard and uses slot i % Q of every
 * member: slice j != me holds my input for reducer j, slice me my result.
 * Instead of two barriers per round, every member posts three counters
 * per chunk (staged, reduced, done) and runs whichever step its peers'
 * counters allow, the oldest chunk first:
 *   copyout(o)  every peer reduced chunk o: copy their result slices from
 *               their slots into buf, post done
 *   reduce(r)   every peer staged chunk r: my slice from buf and the peers'
 *               slots, into buf and my slot in one pass, post reduced
 *   stage(s)    every peer is done with chunk s-Q (slot free): copy the
 *               others' slices of chunk s from buf into my slot, post staged
 * and waits (spin, yield, sleep: shm_wait_until) only when none can run. A rank
 * thus stages ahead while its peer is late instead of idling, and with a
 * small ring the slots stay in L2 between the producer's write and the
 * consumer's read (measured, 2 ranks: 2 slots of 32-64 KiB slices beat 8
 * slots by 1.3-1.6x at 512 KiB-8 MiB; 16 KiB slices lose to the counters'
 * overhead).
 * The call starts with a sync (nobody still reads a stage of an earlier
 * op) and ends when every peer is done (nobody reads my slots afterwards),
 * so the other collectives' two-half rounds need not know about it.
 *
 * Not here: the choice of algorithm and the other collectives (shm_coll.c),
 * waiting (shm_wait.c). */
#include "shm_impl.h"

#include <stdlib.h>
#include <string.h>

/* shm_reduce_into, also writing the result to dst2 (which aliases no source):
 * one pass instead of a reduction and a copy. */
static void reduce_into2(float *dst, float *restrict dst2, const float *const *src, int n, size_t k,
                         int avg) {
    enum { BLK = 2048 };
    if (n == 2 && !avg) {
        const float *a = src[0], *b = src[1];
        for (size_t i = 0; i < k; i++) {
            float v = a[i] + b[i];
            dst[i] = v;
            dst2[i] = v;
        }
        return;
    }
    for (size_t o = 0; o < k; o += BLK) {
        size_t m = k - o < BLK ? k - o : BLK;
        const float *s[PT_SHM_MAX_RANKS];
        for (int j = 0; j < n; j++) s[j] = src[j] + o;
        shm_reduce_into(dst + o, s, n, m, avg);
        memcpy(dst2 + o, dst + o, m * sizeof(float));
    }
}

typedef struct {
    size_t field; /* offsetof(shm_ctl, counter) */
    uint64_t want;
} counter_wait;

static _Atomic uint64_t *counter_of(shm_ctx *x, int m, size_t field) {
    return (_Atomic uint64_t *)((char *)&x->ctl[m] + field);
}

static int pending_counter(shm_ctx *x, const void *arg) {
    const counter_wait *w = arg;
    for (int m = 0; m < x->n; m++)
        if (m != x->rank &&
            atomic_load_explicit(counter_of(x, m, w->field), memory_order_acquire) < w->want)
            return m;
    return -1;
}

static pt_status wait_counter(shm_ctx *x, size_t field, uint64_t want) {
    counter_wait w = {field, want};
    return shm_wait_until(x, pending_counter, &w, PT_OP_ALLREDUCE);
}

static void post_counter(shm_ctx *x, size_t field, uint64_t v) {
    atomic_store_explicit(counter_of(x, x->rank, field), v, memory_order_release);
    shm_wake(x);
}

typedef struct {
    float *buf;
    size_t c, Q, off[PT_SHM_MAX_RANKS], len[PT_SHM_MAX_RANKS];
} pipe_plan;

static float *pipe_slot(const shm_ctx *x, const pipe_plan *pp, int m, size_t i) {
    return (float *)x->stage + ((size_t)m * pp->Q + i % pp->Q) * (size_t)x->n * pp->c;
}

/* Elements of shard j in chunk i. */
static size_t pipe_len(const pipe_plan *pp, int j, size_t i) {
    size_t k = i * pp->c;
    return k >= pp->len[j] ? 0 : pp->len[j] - k < pp->c ? pp->len[j] - k : pp->c;
}

/* Smallest counter of the other members. */
static uint64_t peers_min(shm_ctx *x, size_t field) {
    uint64_t v = UINT64_MAX;
    for (int m = 0; m < x->n; m++) {
        if (m == x->rank) continue;
        uint64_t c = atomic_load_explicit(counter_of(x, m, field), memory_order_acquire);
        if (c < v) v = c;
    }
    return v;
}

typedef struct {
    uint64_t base;
    size_t nch, s, r, o; /* chunks: total, staged, reduced, copied out */
} pipe_state;

/* Which step can run now: 3 copy-out, 2 reduce, 1 stage, 0 none. */
static int pipe_next(shm_ctx *x, const pipe_state *ps) {
    if (ps->o < ps->r && peers_min(x, offsetof(shm_ctl, reduced)) >= ps->base + ps->o + 1) return 3;
    if (ps->r < ps->s && peers_min(x, offsetof(shm_ctl, staged)) >= ps->base + ps->r + 1) return 2;
    if (ps->s < ps->nch && (ps->s < x->pipe_q || peers_min(x, offsetof(shm_ctl, done)) >=
                                                     ps->base + ps->s - x->pipe_q + 1))
        return 1;
    return 0;
}

static int pending_pipe(shm_ctx *x, const void *arg) {
    if (pipe_next(x, arg)) return -1;
    int who = -1; /* the member furthest behind, whom errors name */
    uint64_t least = UINT64_MAX;
    for (int m = 0; m < x->n; m++) {
        if (m == x->rank) continue;
        uint64_t v = atomic_load_explicit(&x->ctl[m].staged, memory_order_relaxed) +
                     atomic_load_explicit(&x->ctl[m].reduced, memory_order_relaxed) +
                     atomic_load_explicit(&x->ctl[m].done, memory_order_relaxed);
        if (v < least) least = v, who = m;
    }
    return who;
}

pt_status shm_pipe_allreduce(shm_ctx *x, float *buf, size_t count, int avg) {
    int n = x->n, me = x->rank;
    pipe_plan pp;
    pp.buf = buf;
    pp.c = x->pipe_c;
    pp.Q = x->pipe_q;
    for (int j = 0; j < n; j++) pt_comm_shard(count, n, j, &pp.off[j], &pp.len[j]);
    size_t c = pp.c;
    pipe_state ps = {x->chunks, (pp.len[0] + c - 1) / c, 0, 0, 0};
    PT_CHECK(shm_sync_all(x, PT_OP_ALLREDUCE));
    const float *src[PT_SHM_MAX_RANKS];
    while (ps.o < ps.nch) {
        int step = pipe_next(x, &ps);
        if (step == 0) {
            PT_CHECK(shm_wait_until(x, pending_pipe, &ps, PT_OP_ALLREDUCE));
            continue;
        }
        if (step == 3) { /* copy the others' results of chunk o out */
            size_t i = ps.o++;
            for (int j = 0; j < n; j++)
                if (j != me && pipe_len(&pp, j, i))
                    memcpy(buf + pp.off[j] + i * c, pipe_slot(x, &pp, j, i) + (size_t)j * c,
                           pipe_len(&pp, j, i) * sizeof(float));
            post_counter(x, offsetof(shm_ctl, done), ps.base + ps.o);
        } else if (step == 2) { /* reduce my slice of chunk r */
            size_t i = ps.r++, m = pipe_len(&pp, me, i);
            if (m) {
                float *d = buf + pp.off[me] + i * c;
                for (int j = 0; j < n; j++) src[j] = pipe_slot(x, &pp, j, i) + (size_t)me * c;
                src[me] = d; /* dst too: element-wise in place */
                reduce_into2(d, pipe_slot(x, &pp, me, i) + (size_t)me * c, src, n, m, avg);
            }
            post_counter(x, offsetof(shm_ctl, reduced), ps.base + ps.r);
        } else { /* stage the others' slices of chunk s */
            size_t i = ps.s++;
            float *mine = pipe_slot(x, &pp, me, i);
            for (int j = 0; j < n; j++)
                if (j != me && pipe_len(&pp, j, i))
                    memcpy(mine + (size_t)j * c, buf + pp.off[j] + i * c,
                           pipe_len(&pp, j, i) * sizeof(float));
            post_counter(x, offsetof(shm_ctl, staged), ps.base + ps.s);
        }
    }
    PT_CHECK(wait_counter(x, offsetof(shm_ctl, done), ps.base + ps.nch));
    x->chunks = ps.base + ps.nch;
    return PT_OK;
}

/* Floats per slice of a pipelined all-reduce chunk (a multiple of 16) and
 * slots of its ring: PT_SHM_SLICE_KB (32 KiB) and PT_SHM_SLOTS (2) (see
 * above for the measurements; knobs for tuning). At least two slots must
 * fit in the two staging halves. */
void shm_pipe_shape(shm_ctx *x) {
    size_t slice = (size_t)pt_knob_int("PT_SHM_SLICE_KB") << 10;
    size_t area = 2 * x->reg->stage_bytes; /* both halves */
    size_t max = area / 2 / (size_t)x->n;
    if (slice > max) slice = max;
    x->pipe_c = slice / sizeof(float) & ~(size_t)15;
    x->pipe_q = area / ((size_t)x->n * x->pipe_c * sizeof(float));
    size_t want = (size_t)pt_knob_int("PT_SHM_SLOTS"); /* >= 2 */
    if (want < x->pipe_q) x->pipe_q = want;
}
