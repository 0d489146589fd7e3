/* The shm backend: ranks on one machine talk through one shared arena
 * (shm_impl.h: its layout and the backend's files). This file holds the
 * contexts (one per communicator: this process's view of a region), split
 * (a new region from the pool for each color), free, the world
 * constructors (a launched rank, a world of one, a named segment), the
 * backend's function table and its descriptor for the registry.
 *
 * Not here: the algorithms (shm_coll.c, shm_pipe.c, shm_cma.c, shm_p2p.c),
 * waiting (shm_wait.c), the arena and the pool (shm_region.c), the
 * heartbeat (shm_heartbeat.c), the launcher (shm_launch.c), argument checks
 * and counters (comm.c). */
#include "shm_impl.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- contexts, split, free ---- */

static const pt_comm_backend shm_backend;

static uint64_t spin_ns_for(int nranks) {
    /* Spinning only pays when every rank has a core of its own. */
    double us = pt_knob_float("PT_SHM_SPIN_US"); /* tuning; -1: automatic */
    if (us >= 0) return (uint64_t)(us * 1000);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus >= nranks ? 50000 : 2000;
}

static pt_status ctx_new(shm_map *map, uint64_t reg_off, int rank, double timeout_s, double live_s,
                         int is_world, shm_ctx **out) {
    shm_ctx *x = calloc(1, sizeof *x);
    if (!x) return pt_error_set(PT_ERR_NOMEM, "shm: out of memory for a context");
    x->map = map;
    x->job = map->job;
    x->reg_off = reg_off;
    x->reg = (shm_region *)((char *)map->job + reg_off);
    x->ctl = (shm_ctl *)((char *)x->reg + ctl_off());
    x->n = x->reg->n;
    x->stage = (char *)x->reg + stage_off(x->n);
    x->rings = (char *)x->reg + ring_off(x->n, x->reg->stage_bytes);
    x->rank = rank;
    x->wrank = x->reg->world_rank[rank];
    x->timeout_s = timeout_s;
    x->live_s = live_s;
    x->spin_ns = spin_ns_for(map->job->nranks);
    atomic_store(&x->spin_cur, x->spin_ns);
    shm_pipe_shape(x);
    shm_cma_shape(x);
    x->is_world = is_world;
    /* A sub-communicator's flags start at 0 (fresh region); the world's too. */
    atomic_fetch_add(&map->refs, 1);
    *out = x;
    return PT_OK;
}

static void map_release(shm_map *map) {
    if (atomic_fetch_sub(&map->refs, 1) == 1) {
        munmap(map->job, map->total);
        free(map);
    }
}

static void shm_free(void *ctx) {
    shm_ctx *x = ctx;
    if (!x) return;
    if (x->is_world) shm_hb_stop(&x->job->ranks[x->wrank]);
    if (!x->is_world && atomic_fetch_sub(&x->reg->refs, 1) == 1) {
        /* The last member: give the pages back (they read as zeros when
         * reused, as a fresh region's flags must) and the range to the pool. */
        size_t bytes = region_size(x->n, x->reg->stage_bytes);
        if (madvise(x->reg, bytes, MADV_REMOVE) != 0) memset(x->reg, 0, bytes);
        shm_pool_give(x->job, x->reg_off, bytes);
    }
    shm_p2p_free(x);
    pt_mem_free(x->cma_tmp);
    map_release(x->map);
    free(x);
}

int pt_shm_single_copy(const pt_comm *c) {
    if (pt_comm_backend_of(c) != &shm_backend) return 0;
    return ((const shm_ctx *)pt_comm_ctx(c))->cma;
}

static double shm_set_timeout(void *ctx, double seconds) {
    shm_ctx *x = ctx;
    double old = x->timeout_s;
    x->timeout_s = seconds;
    return old;
}

static int shm_fault_reported(void *ctx, pt_status st) {
    shm_ctx *x = ctx;
    if (!x->launched || x->job->nranks < 2) return 0;
    if (st != PT_ERR_COMM && st != PT_ERR_TIMEOUT && st != PT_ERR_INTERRUPTED) return 0;
    return atomic_load(&x->job->aborted) != ABORT_NONE;
}

/* The first rank of a launched job to ask prints the job's error line. */
static int shm_claim_error_line(void *ctx) {
    shm_ctx *x = ctx;
    if (!x->launched) return 1;
    int none = -1;
    if (atomic_compare_exchange_strong(&x->job->error_line, &none, x->wrank)) return 1;
    return none == x->wrank; /* asked twice: still this rank's */
}

static pt_flight_table *shm_flight_table(void *ctx, int w) {
    shm_ctx *x = ctx;
    if (w < 0) w = x->wrank;
    return w < x->job->nranks ? &x->job->flight[w] : NULL;
}

static int shm_world_rank(void *ctx, int m) {
    shm_ctx *x = ctx;
    return m >= 0 && m < x->n ? x->reg->world_rank[m] : -1;
}

static pt_status shm_core_verdict(void *ctx, int culprit, int noticer, pt_status st,
                                  const char *reason) {
    (void)noticer; /* the arena's lock makes the first the one */
    return shm_verdict(ctx, culprit, st, -1, reason, 1);
}

static void shm_note_step(void *ctx, long step) {
    shm_ctx *x = ctx;
    atomic_store_explicit(&x->job->ranks[x->wrank].step, step, memory_order_relaxed);
}

static pt_status shm_split(void *ctx, int color, int key, void **out_ctx, int *rank, int *size) {
    shm_ctx *x = ctx;
    *out_ctx = NULL;
    shm_op_begin(x, OP_SPLIT);
    x->ctl[x->rank].split_color = color;
    x->ctl[x->rank].split_key = key;
    pt_status st = shm_sync_all(x, OP_SPLIT);
    if (st != PT_OK) return shm_op_end(x, OP_SPLIT, st);

    /* Members: same color, ordered by (key, parent rank). */
    int members[PT_SHM_MAX_RANKS], m = 0;
    for (int j = 0; j < x->n; j++) {
        if (x->ctl[j].split_color != color) continue;
        int pos = m++;
        while (pos > 0) {
            int p = members[pos - 1];
            if (x->ctl[p].split_key <= x->ctl[j].split_key) break;
            members[pos] = p;
            pos--;
        }
        members[pos] = j;
    }
    int leader = members[0], me = -1;
    for (int i = 0; i < m; i++)
        if (members[i] == x->rank) me = i;
    PT_ASSERT(me >= 0);
    if (leader == x->rank) {
        uint64_t need = region_size(m, x->job->stage_bytes);
        uint64_t off = shm_pool_take(x->job, need);
        if (off == 0) {
            x->ctl[x->rank].split_off = 0;
        } else {
            shm_region *r = (shm_region *)((char *)x->job + off);
            r->n = m;
            r->stage_bytes = x->job->stage_bytes;
            r->ring_bytes = ring_bytes_for(m);
            atomic_store(&r->refs, m);
            for (int i = 0; i < m; i++) r->world_rank[i] = x->reg->world_rank[members[i]];
            x->ctl[x->rank].split_off = off;
        }
    }
    st = shm_sync_all(x, OP_SPLIT);
    if (st != PT_OK) return shm_op_end(x, OP_SPLIT, st);
    uint64_t off = x->ctl[leader].split_off;
    if (off == 0)
        return shm_op_end(x, OP_SPLIT,
                          pt_error_set(PT_ERR_NOMEM,
                                       "split: the shm arena has no room for another "
                                       "sub-communicator (%llu bytes reserved)",
                                       (unsigned long long)x->job->total));
    shm_ctx *y;
    st = ctx_new(x->map, off, me, x->timeout_s, x->live_s, 0, &y);
    if (st != PT_OK) return shm_op_end(x, OP_SPLIT, st);
    y->launched = x->launched;
    *out_ctx = y;
    *rank = me;
    *size = m;
    return shm_op_end(x, OP_SPLIT, PT_OK);
}

static const pt_comm_backend shm_backend = {
    .name = "shm",
    .send = shm_send,
    .recv = shm_recv,
    .allreduce = shm_allreduce,
    .reduce_scatter = shm_reduce_scatter,
    .allgather = shm_allgather,
    .broadcast = shm_broadcast,
    .barrier = shm_barrier,
    .split = shm_split,
    .free = shm_free,
    .note_step = shm_note_step,
    .set_timeout = shm_set_timeout,
    .fault_reported = shm_fault_reported,
    .claim_error_line = shm_claim_error_line,
    .flight_table = shm_flight_table,
    .world_rank = shm_world_rank,
    .verdict = shm_core_verdict,
    .concurrent_p2p = 1, /* recv touches only the rings toward this rank */
};

/* ---- world constructors ----------------------------------------------------------------- */

static struct {
    pt_shm_job *job;
    int rank;
} adopted = {NULL, -1};

void pt_shm_job_adopt(pt_shm_job *job, int rank, int pid) {
    adopted.job = job;
    adopted.rank = rank;
    shm_job_mark_running(job, rank, pid);
}

static pt_status world_from(pt_shm_job *job, size_t total, int rank, double timeout_s, int launched,
                            const pt_comm_backend **be, void **ctx, int *out_rank, int *size) {
    shm_map *map = calloc(1, sizeof *map);
    if (!map) return pt_error_set(PT_ERR_NOMEM, "shm: out of memory for a mapping");
    map->job = job;
    map->total = total;
    atomic_store(&map->refs, 1); /* held until the world context is made */
    shm_ctx *x;
    /* The launcher's (or creator's) timeout wins: every rank then agrees. */
    double t = job->timeout_s > 0 ? job->timeout_s
               : timeout_s > 0    ? timeout_s
                                  : PT_COMM_DEFAULT_TIMEOUT_S;
    pt_status st = ctx_new(map, job->world_off, rank, t, t, 1, &x);
    map_release(map); /* the context holds it now (or, on failure, nobody) */
    if (st != PT_OK) return st;
    st = shm_hb_start(job, rank, t);
    if (st != PT_OK) {
        shm_free(x);
        return st;
    }
    *be = &shm_backend;
    x->launched = launched;
    *ctx = x;
    *out_rank = rank;
    *size = job->nranks;
    return PT_OK;
}

static int shm_available(void) {
    return adopted.job != NULL;
}

static pt_status shm_world(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                           int *rank, int *size) {
    if (!adopted.job)
        return pt_error_set(PT_ERR_UNSUPPORTED, "shm: this process was not started by pt_launch");
    pt_shm_job *job = adopted.job;
    adopted.job = NULL; /* one world per launched rank */
    return world_from(job, job->total, adopted.rank, opt->timeout_s, 1, be, ctx, rank, size);
}

/* A world of one in this process (no launcher, nothing shared). */
static pt_status shm_self(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                          int *rank, int *size) {
    pt_shm_job *job;
    PT_CHECK(pt_shm_job_map_anon(1, 0, &job));
    pt_shm_job_adopt(job, 0, (int)getpid());
    adopted.job = NULL;
    return world_from(job, job->total, 0, opt->timeout_s, 0, be, ctx, rank, size);
}

pt_status pt_comm_shm_attach(const char *name, int rank, int size, const pt_comm_options *opt,
                             pt_comm **out) {
    if (!out) return pt_error_set(PT_ERR_INVALID, "shm attach: out is NULL");
    *out = NULL;
    if (!name) return pt_error_set(PT_ERR_INVALID, "shm attach: name is NULL");
    PT_CHECK(shm_check_nranks(size));
    if (rank < 0 || rank >= size)
        return pt_error_set(PT_ERR_INVALID, "shm attach: rank %d is outside 0..%d", rank, size - 1);
    pt_shm_job *job;
    PT_CHECK(shm_job_map_named(name, size, &job));
    size_t total = job->total;
    shm_job_mark_running(job, rank, (int)getpid());
    pt_comm_options o = pt_comm_options_resolve(opt);
    const pt_comm_backend *be = NULL;
    void *ctx = NULL;
    int r = 0, s = 0;
    PT_CHECK(
        world_from(job, total, rank, o.timeout_s, 0, &be, &ctx, &r, &s)); /* unmaps on failure */
    return pt_comm_wrap(be, ctx, r, s, out);
}

const pt_comm_backend_desc pt_comm_shm_desc = {
    .name = "shm",
    .available = shm_available,
    .world = shm_world,
    .self = shm_self,
    .launch = shm_launch,
    .lazy_bytes = shm_lazy_bytes,
};
