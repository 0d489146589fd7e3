/* The shm backend's single-copy collectives. Transfers between the private
 * memory of two ranks use Linux cross-memory attach (process_vm_readv/writev,
 * Linux 3.2+): the kernel copies straight from one process's pages into the
 * other's, so a byte moves once instead of twice through the shared arena.
 * Allowed between processes of the same user unless a policy forbids it
 * (Yama ptrace_scope >= 1 for non-descendants, seccomp in some containers,
 * PR_SET_DUMPABLE 0): a communicator probes first and falls back to the
 * staged algorithms (shm_coll.c, shm_pipe.c).
 *
 * The staged algorithms move every byte twice, into the arena and out of
 * it, because a rank's buffer is private memory. From cma_min bytes up the
 * ranks instead copy straight between their buffers with cross-memory attach
 * (below): every rank posts its buffer's address and syncs; rank r then
 * reads shard r of each peer's buffer, a chunk at a time, into an L2-sized
 * scratch, reduces the chunk into its own buffer (ranks in order 0..n-1, as
 * everywhere: the same bits as the staged paths) and, for an all-reduce,
 * writes the result into shard r of every peer's buffer; a closing sync
 * keeps every buffer in use until no peer touches it. Shard r of any buffer
 * is read and written by rank r alone, so no two ranks touch the same bytes
 * concurrently. A rank moves about one memcpy of the buffer (the pipelined
 * path: two and a half). All-gather and broadcast read the others' parts
 * straight into place, but only with 2 ranks: a kernel copy runs at ~10 GB/s
 * here against ~15 for memcpy, and from 3 ranks on the (n-1)/n of the buffer
 * that each rank then copies costs as much as the staged path's whole
 * buffer (measured, 4 ranks: all-gather 0.6-0.8x the staged path).
 * Measured (partrain bench comm, 2 ranks, all-reduce bus bandwidth at 8 MiB
 * / 32 MiB): chunks of 64 KiB 9.7 / 8.2 GB/s, 128 KiB 12.6 / 8.9, 256 KiB
 * 11.7 / 7.1; the pipelined path 7.6 / 7.2; memcpy 13.0 / 11.2. At 32 KiB
 * single-copy takes 3.7 us, the pipelined path 8.2.
 * The first such call on a communicator probes whether every member can
 * read every other one (a policy may forbid it: Yama, seccomp); if one
 * cannot, the communicator keeps the staged algorithms (PT_SHM_CMA=0 forces
 * that).
 *
 * Not here: when a collective may go single-copy (shm_coll.c), waiting and
 * sync (shm_wait.c). */
#include "shm_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

/* The kernel may move fewer bytes than asked (it stops at the first page it
 * cannot pin); continue from there. */
static int cma_move(int pid, char *local, char *remote, size_t bytes, int write) {
    while (bytes > 0) {
        struct iovec l = {local, bytes}, r = {remote, bytes};
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                            : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (got == 0) return EFAULT;
        local += got;
        remote += got;
        bytes -= (size_t)got;
    }
    return 0;
}

static int cma_pid_read(int pid, void *dst, const void *remote, size_t bytes) {
    return cma_move(pid, dst, (char *)remote, bytes, 0);
}

static int cma_pid_write(int pid, const void *src, void *remote, size_t bytes) {
    return cma_move(pid, (char *)src, remote, bytes, 1);
}

static int cma_wanted(void) {
    return pt_knob_int("PT_SHM_CMA") != 0;
}

/* Gone, or a zombie: a killed process loses its memory before it is reaped. */
static int pid_dead(int pid) {
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t got = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[got] = '\0';
    const char *p = strrchr(stat, ')'); /* "pid (comm) S ...": comm may hold ')' */
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static pt_status cma_error(shm_ctx *x, int m, int err, size_t bytes, int op) {
    char who[64];
    shm_name_member(x, m, who, sizeof who);
    /* A peer that left the operation because the job stopped (its buffer
     * may be gone: EFAULT): the job's reason, not the copy's. */
    PT_CHECK(shm_check_abort(x, op));
    if (err == ESRCH || pid_dead(x->cma_pid[m])) {
        /* Give the launcher a moment to reap it: its verdict names the
         * signal or exit code (as every other wait does), and makes this
         * rank's error the job's fault, which the launcher alone prints.
         * The peer's own state is looked at only after that: between the
         * launcher's waitpid and its mark the pid is gone but the rank not
         * yet marked, and this rank printed a line of its own (seen in CI:
         * "rank 1 (pid ...) is gone" beside the launcher's line). */
        for (int i = 0; i < 1000; i++) {
            PT_CHECK(shm_check_abort(x, op));
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
        PT_CHECK(shm_check_peer(x, m, op));
        return pt_error_set(PT_ERR_COMM, "%s: %s (pid %d) died", shm_op_name(op), who,
                            x->cma_pid[m]);
    }
    if (err == EFAULT)
        return pt_error_set(PT_ERR_COMM,
                            "%s: %zu bytes of %s's buffer are not mapped (do the counts agree "
                            "across ranks?)",
                            shm_op_name(op), bytes, who);
    return pt_error_set(PT_ERR_COMM, "%s: copying from/to %s: %s", shm_op_name(op), who,
                        strerror(err));
}

static pt_status cma_read(shm_ctx *x, int m, void *dst, size_t off, size_t bytes, int op) {
    int e = cma_pid_read(x->cma_pid[m], dst, (char *)x->cma_buf[m] + off, bytes);
    return e ? cma_error(x, m, e, bytes, op) : PT_OK;
}

static pt_status cma_write(shm_ctx *x, int m, const void *src, size_t off, size_t bytes, int op) {
    int e = cma_pid_write(x->cma_pid[m], src, (char *)x->cma_buf[m] + off, bytes);
    return e ? cma_error(x, m, e, bytes, op) : PT_OK;
}

/* First single-copy call: can I read every member, and can they all? */
static pt_status cma_probe(shm_ctx *x, int op) {
    int ok = cma_wanted();
    if (ok && !x->cma_tmp) {
        x->cma_tmp = pt_mem_alloc(PT_MEM_COMM, (size_t)(x->n - 1) * x->cma_c * sizeof(float));
        ok = x->cma_tmp != NULL;
    }
    for (int m = 0; ok && m < x->n; m++) {
        char byte;
        if (m != x->rank && cma_pid_read(x->cma_pid[m], &byte, x->cma_buf[m], 1) != 0) ok = 0;
    }
    x->ctl[x->rank].cma_ok = ok;
    PT_CHECK(shm_sync_all(x, op));
    int all = 1;
    for (int m = 0; m < x->n; m++) all &= x->ctl[m].cma_ok;
    x->cma = all ? 1 : -1;
    PT_DEBUG("shm: single-copy collectives %s (a communicator of %d)", all ? "on" : "off", x->n);
    return PT_OK;
}

/* `want` (the same on every member): this call would go single-copy. Post
 * my buffer and learn the others'; *use: go single-copy (else the staged
 * algorithm, on every member alike). */
pt_status shm_cma_enter(shm_ctx *x, void *buf, int want, int op, int *use) {
    *use = 0;
    if (x->cma < 0 || !want) return PT_OK;
    x->ctl[x->rank].cma_addr = buf;
    PT_CHECK(shm_sync_all(x, op));
    for (int m = 0; m < x->n; m++) {
        x->cma_buf[m] = x->ctl[m].cma_addr;
        x->cma_pid[m] = atomic_load(&x->job->ranks[x->reg->world_rank[m]].pid);
    }
    if (x->cma == 0) PT_CHECK(cma_probe(x, op));
    *use = x->cma > 0;
    return PT_OK;
}

/* Reduce my shard from every buffer into mine; `gather` also writes it into
 * every peer's (all-reduce), else stop there (reduce-scatter). */
pt_status shm_cma_reduce(shm_ctx *x, float *buf, size_t count, int avg, int gather, int op) {
    int n = x->n, me = x->rank;
    size_t off, len, c = x->cma_c;
    pt_comm_shard(count, n, me, &off, &len);
    const float *src[PT_SHM_MAX_RANKS];
    for (size_t k = 0; k < len; k += c) {
        size_t m = len - k < c ? len - k : c, at = (off + k) * sizeof(float);
        float *d = buf + off + k, *t = x->cma_tmp;
        for (int j = 0; j < n; j++) {
            if (j == me) {
                src[j] = d; /* dst too: element-wise in place */
                continue;
            }
            PT_CHECK(cma_read(x, j, t, at, m * sizeof(float), op));
            src[j] = t;
            t += c;
        }
        shm_reduce_into(d, src, n, m, avg);
        for (int j = 0; gather && j < n; j++)
            if (j != me) PT_CHECK(cma_write(x, j, d, at, m * sizeof(float), op));
    }
    return shm_sync_all(x, op);
}

pt_status shm_cma_allgather(shm_ctx *x, float *buf, size_t count) {
    for (int j = 0; j < x->n; j++) {
        size_t off, len;
        pt_comm_shard(count, x->n, j, &off, &len);
        if (j != x->rank && len)
            PT_CHECK(cma_read(x, j, buf + off, off * sizeof(float), len * sizeof(float),
                              PT_OP_ALLGATHER));
    }
    return shm_sync_all(x, PT_OP_ALLGATHER);
}

/* A rank's kernel copies run at ~10 GB/s here against ~15 for memcpy, so
 * the root does not idle: it writes the last 1/n of the buffer into every
 * other rank while they read the rest (2 ranks: each copies half). */
pt_status shm_cma_broadcast(shm_ctx *x, char *buf, size_t bytes, int root) {
    size_t tail = bytes / (size_t)x->n, head = bytes - tail;
    if (x->rank != root) PT_CHECK(cma_read(x, root, buf, 0, head, PT_OP_BROADCAST));
    for (int j = 0; x->rank == root && tail && j < x->n; j++)
        if (j != root) PT_CHECK(cma_write(x, j, buf + head, head, tail, PT_OP_BROADCAST));
    return shm_sync_all(x, PT_OP_BROADCAST);
}

size_t shm_lazy_bytes(int size, pt_comm_op op, size_t bytes) {
    shm_ctx x = {0};
    x.n = size;
    shm_cma_shape(&x);
    /* shm_coll.c's choices: which calls go single-copy */
    int want = bytes >= x.cma_min;
    if (op == PT_OP_ALLREDUCE) want &= bytes > PT_SHM_SMALL;
    if (op == PT_OP_ALLGATHER || op == PT_OP_BROADCAST) want &= size == 2;
    if (size < 2 || !want || !cma_wanted()) return 0;
    return (size_t)(size - 1) * x.cma_c * sizeof(float); /* cma_probe's scratch */
}

/* Collectives of at least PT_SHM_CMA_MIN_KB (16 KiB) go single-copy when the
 * ranks can reach each other's memory, in chunks of PT_SHM_CMA_CHUNK_KB
 * (128 KiB) per peer (see above for the measurements; knobs for tuning,
 * every rank must see the same values). */
void shm_cma_shape(shm_ctx *x) {
    x->cma_min = (size_t)pt_knob_int("PT_SHM_CMA_MIN_KB") << 10;
    size_t chunk = (size_t)pt_knob_int("PT_SHM_CMA_CHUNK_KB") << 10;
    x->cma_c = chunk / sizeof(float) & ~(size_t)15;
    if (x->cma_c == 0) x->cma_c = 16;
}
