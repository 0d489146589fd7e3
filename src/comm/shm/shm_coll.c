/* The shm backend's collectives: the reduction every algorithm uses, the
 * staged algorithms, and the entry points of the function table, which pick
 * the algorithm. No allocation per call; every rank of a communicator runs
 * the same sequence of "rounds", each using one staging half, alternating:
 *   sync        every member stores ++epoch into its flag (release) and
 *               waits until all flags reach it (acquire): a barrier
 *               (shm_wait.c).
 *   single-copy from PT_SHM_CMA_MIN_KB on, when the ranks may read each
 *               other's memory (probed once per communicator): ranks post
 *               their buffers' addresses and copy straight between them
 *               with process_vm_readv/writev (shm_cma.c); rank r reduces
 *               shard r and writes it into every peer (all-reduce: one
 *               memcpy's worth per rank). Otherwise, the staged ones:
 *   allreduce   <= PT_SHM_SMALL bytes: copy the buffer into my half, sync,
 *               every rank sums all halves (one sync: latency). Larger:
 *               pipelined chunks of n slices (one per rank's pt_comm_shard
 *               range) through a ring of small slots, with per-chunk
 *               counters instead of syncs: copy the others' slices in,
 *               rank r reduces slice r from its own buffer and the n-1 other
 *               slots into its buffer and its slot, copy the other slices
 *               out (shm_pipe.c). The reduction is split evenly across
 *               ranks (reduce-scatter + all-gather through shared memory).
 *   reduce_scatter  rounds of n slices through the halves: copy the
 *               others' slices in, sync, reduce mine (one sync per round).
 *   allgather   copy my shard slice in, sync, copy the others out.
 *   broadcast   root copies a chunk in, sync, the others copy it out.
 * Sums run over ranks in order 0..n-1 everywhere, so every rank gets the
 * bitwise same result. Why two halves: a rank may start round k+1 while a
 * slow rank still reads round k; it cannot start round k+2 before the slow
 * rank has posted a flag in round k+1, i.e. finished round k.
 *
 * Not here: waiting and sync (shm_wait.c), the pipelined all-reduce
 * (shm_pipe.c), the single-copy algorithms (shm_cma.c), send/recv
 * (shm_p2p.c), argument checks and counters (comm.c). */
#include "shm_impl.h"

#include <string.h>

/* ---- reductions -------------------------------------------------------------------- */

/* dst[0:k] = sum over j of src[j][0:k] in order j = 0..n-1 (divided by n for
 * AVG). Blocks keep the partial sum in L1; the loops vectorize. */
void shm_reduce_into(float *dst, const float *const *src, int n, size_t k, int avg) {
    enum { BLK = 2048 };
    float tmp[BLK] __attribute__((aligned(64)));
    float fn = (float)n;
    for (size_t o = 0; o < k; o += BLK) {
        size_t m = k - o < BLK ? k - o : BLK;
        const float *a = src[0] + o, *b = src[1] + o;
        if (n == 2 && !avg) { /* d may be a or b (in place): no restrict */
            float *d = dst + o;
            for (size_t i = 0; i < m; i++) d[i] = a[i] + b[i];
            continue;
        }
        for (size_t i = 0; i < m; i++) tmp[i] = a[i] + b[i];
        for (int j = 2; j < n; j++) {
            const float *restrict c = src[j] + o;
            for (size_t i = 0; i < m; i++) tmp[i] += c[i];
        }
        float *restrict d = dst + o;
        if (avg) {
            for (size_t i = 0; i < m; i++) d[i] = tmp[i] / fn;
        } else {
            memcpy(d, tmp, m * sizeof(float));
        }
    }
}

/* Floats per shard slice in one round of n slices (multiple of 16). */
static size_t slice_floats(const shm_ctx *x) {
    size_t c = x->reg->stage_bytes / sizeof(float) / (size_t)x->n;
    return c & ~(size_t)15;
}

/* ---- collectives ----------------------------------------------------------------------- */

static pt_status allreduce_small(shm_ctx *x, float *buf, size_t count, int avg) {
    int h = (int)(x->round++ & 1);
    memcpy(stage_of(x, x->rank, h), buf, count * sizeof(float));
    PT_CHECK(shm_sync_all(x, PT_OP_ALLREDUCE));
    const float *src[PT_SHM_MAX_RANKS];
    for (int j = 0; j < x->n; j++) src[j] = (const float *)stage_of(x, j, h);
    shm_reduce_into(buf, src, x->n, count, avg);
    return PT_OK;
}

/* Rounds of n slices, one per shard; `gather` = 0 stops after the reduction
 * (reduce-scatter), 1 shares the reduced slices (all-reduce). */
static pt_status reduce_rounds(shm_ctx *x, float *buf, size_t count, int avg, int gather, int op) {
    int n = x->n, me = x->rank;
    size_t c = slice_floats(x);
    size_t off[PT_SHM_MAX_RANKS], len[PT_SHM_MAX_RANKS];
    for (int j = 0; j < n; j++) pt_comm_shard(count, n, j, &off[j], &len[j]);
    const float *src[PT_SHM_MAX_RANKS];
    for (size_t k = 0; k < len[0]; k += c) { /* shard 0 is the longest */
        int h = (int)(x->round++ & 1);
        float *mine = (float *)stage_of(x, me, h);
        for (int j = 0; j < n; j++) /* my own slice is reduced from buf */
            if (j != me && k < len[j])
                memcpy(mine + (size_t)j * c, buf + off[j] + k,
                       (len[j] - k < c ? len[j] - k : c) * sizeof(float));
        PT_CHECK(shm_sync_all(x, op));
        if (k < len[me]) {
            size_t m = len[me] - k < c ? len[me] - k : c;
            for (int j = 0; j < n; j++) src[j] = (const float *)stage_of(x, j, h) + (size_t)me * c;
            src[me] = buf + off[me] + k; /* dst too: element-wise in place */
            shm_reduce_into(buf + off[me] + k, src, n, m, avg);
            if (gather) memcpy(mine + (size_t)me * c, buf + off[me] + k, m * sizeof(float));
        }
        if (!gather) continue;
        PT_CHECK(shm_sync_all(x, op));
        for (int j = 0; j < n; j++) {
            if (j == me || k >= len[j]) continue;
            size_t m = len[j] - k < c ? len[j] - k : c;
            memcpy(buf + off[j] + k, (const float *)stage_of(x, j, h) + (size_t)j * c,
                   m * sizeof(float));
        }
    }
    return PT_OK;
}

pt_status shm_allreduce(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    shm_ctx *x = ctx;
    if (x->n == 1 || count == 0) return PT_OK;
    shm_op_begin(x, PT_OP_ALLREDUCE);
    int avg = op == PT_REDUCE_AVG, cma = 0;
    size_t bytes = count * sizeof(float);
    if (bytes <= PT_SHM_SMALL)
        return shm_op_end(x, PT_OP_ALLREDUCE, allreduce_small(x, buf, count, avg));
    pt_status st = shm_cma_enter(x, buf, bytes >= x->cma_min, PT_OP_ALLREDUCE, &cma);
    if (st == PT_OK)
        st = cma ? shm_cma_reduce(x, buf, count, avg, 1, PT_OP_ALLREDUCE)
                 : shm_pipe_allreduce(x, buf, count, avg);
    return shm_op_end(x, PT_OP_ALLREDUCE, st);
}

pt_status shm_reduce_scatter(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    shm_ctx *x = ctx;
    if (x->n == 1 || count == 0) return PT_OK;
    shm_op_begin(x, PT_OP_REDUCE_SCATTER);
    int avg = op == PT_REDUCE_AVG, cma;
    pt_status st =
        shm_cma_enter(x, buf, count * sizeof(float) >= x->cma_min, PT_OP_REDUCE_SCATTER, &cma);
    if (st == PT_OK)
        st = cma ? shm_cma_reduce(x, buf, count, avg, 0, PT_OP_REDUCE_SCATTER)
                 : reduce_rounds(x, buf, count, avg, 0, PT_OP_REDUCE_SCATTER);
    return shm_op_end(x, PT_OP_REDUCE_SCATTER, st);
}

static pt_status allgather_rounds(shm_ctx *x, float *buf, size_t count) {
    int n = x->n, me = x->rank;
    size_t c = x->reg->stage_bytes / sizeof(float);
    size_t off[PT_SHM_MAX_RANKS], len[PT_SHM_MAX_RANKS];
    for (int j = 0; j < n; j++) pt_comm_shard(count, n, j, &off[j], &len[j]);
    for (size_t k = 0; k < len[0]; k += c) {
        int h = (int)(x->round++ & 1);
        if (k < len[me])
            memcpy(stage_of(x, me, h), buf + off[me] + k,
                   (len[me] - k < c ? len[me] - k : c) * sizeof(float));
        PT_CHECK(shm_sync_all(x, PT_OP_ALLGATHER));
        for (int j = 0; j < n; j++) {
            if (j == me || k >= len[j]) continue;
            memcpy(buf + off[j] + k, stage_of(x, j, h),
                   (len[j] - k < c ? len[j] - k : c) * sizeof(float));
        }
    }
    return PT_OK;
}

pt_status shm_allgather(void *ctx, float *buf, size_t count) {
    shm_ctx *x = ctx;
    if (x->n == 1 || count == 0) return PT_OK;
    shm_op_begin(x, PT_OP_ALLGATHER);
    int cma;
    pt_status st = shm_cma_enter(x, buf, x->n == 2 && count * sizeof(float) >= x->cma_min,
                                 PT_OP_ALLGATHER, &cma);
    if (st == PT_OK) st = cma ? shm_cma_allgather(x, buf, count) : allgather_rounds(x, buf, count);
    return shm_op_end(x, PT_OP_ALLGATHER, st);
}

static pt_status broadcast_rounds(shm_ctx *x, char *buf, size_t bytes, int root) {
    size_t c = x->reg->stage_bytes;
    for (size_t k = 0; k < bytes; k += c) {
        int h = (int)(x->round++ & 1);
        size_t m = bytes - k < c ? bytes - k : c;
        if (x->rank == root) memcpy(stage_of(x, root, h), buf + k, m);
        PT_CHECK(shm_sync_all(x, PT_OP_BROADCAST));
        if (x->rank != root) memcpy(buf + k, stage_of(x, root, h), m);
    }
    return PT_OK;
}

pt_status shm_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    shm_ctx *x = ctx;
    if (x->n == 1 || bytes == 0) return PT_OK;
    shm_op_begin(x, PT_OP_BROADCAST);
    int cma;
    pt_status st = shm_cma_enter(x, buf, x->n == 2 && bytes >= x->cma_min, PT_OP_BROADCAST, &cma);
    if (st == PT_OK)
        st = cma ? shm_cma_broadcast(x, buf, bytes, root) : broadcast_rounds(x, buf, bytes, root);
    return shm_op_end(x, PT_OP_BROADCAST, st);
}

pt_status shm_barrier(void *ctx) {
    shm_ctx *x = ctx;
    if (x->n == 1) return PT_OK;
    shm_op_begin(x, PT_OP_BARRIER);
    return shm_op_end(x, PT_OP_BARRIER, shm_sync_all(x, PT_OP_BARRIER));
}
