/* The shm backend: ranks on one machine talk through one shared arena.
 *
 * Arena (one mapping per job: anonymous MAP_SHARED made by the launcher
 * before fork, or a named 0600 segment for pt_comm_shm_attach):
 *
 *   [job header: per-rank state, pid, current op, step, heartbeat, whom it
 *    waits for, first error; abort word and verdict; futex word; bump
 *    pointer and free extents] [world region] [regions of sub-communicators ...]
 *
 * A region (one per communicator, made by the lowest member at split time
 * from the pool: a freed extent that fits, else the bump pointer; when the
 * last member frees it, its pages go back with MADV_REMOVE and its range to
 * the pool) holds, for its n members:
 *   ctl[n]          384 bytes per member: its sync flag (an epoch
 *                   counter), the pipelined all-reduce's counters, the
 *                   split fields, the single-copy buffer address
 *   stage[n][2]     two halves of PT_SHM_STAGE bytes per member: the
 *                   staging buffers of the collectives (double buffered)
 *   ring[n][n]      a byte ring per ordered pair (ring_bytes_for(n))
 *                   (send/recv), head and tail on their own cache lines
 *
 * Collectives (no allocation per call; every rank of a communicator runs the
 * same sequence of "rounds", each using one staging half, alternating):
 *   sync        every member stores ++epoch into its flag (release) and
 *               waits until all flags reach it (acquire): a barrier.
 *   single-copy from PT_SHM_CMA_MIN bytes on, when the ranks may read each
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
 *               out (see allreduce_pipelined). The reduction is split
 *               evenly across ranks (reduce-scatter + all-gather through
 *               shared memory).
 *   reduce_scatter  rounds of n slices through the halves: copy the
 *               others' slices in, sync, reduce mine (one sync per round).
 *   allgather   copy my shard slice in, sync, copy the others out.
 *   broadcast   root copies a chunk in, sync, the others copy it out.
 * Sums run over ranks in order 0..n-1 everywhere, so every rank gets the
 * bitwise same result. Why two halves: a rank may start round k+1 while a
 * slow rank still reads round k; it cannot start round k+2 before the slow
 * rank has posted a flag in round k+1, i.e. finished round k.
 *
 * Waiting: spin (an adaptive budget, see wait_until), then
 * sched_yield, then sleep on a futex word shared by the job (posters wake
 * only when someone sleeps). Every wait checks the job's abort word (set by
 * the launcher when a rank dies or on Ctrl-C, or by a rank's verdict), the
 * awaited peer's state (exited, or its pid gone when there is no launcher),
 * every rank's heartbeat (liveness: a thread per rank process beats, so a
 * busy rank is alive and a SIGSTOPped one is not), and the progress
 * timeout. The first rank to notice a fault publishes the verdict naming
 * the culprit (blame_chain: the rank the waits lead to), and every wait of
 * every rank returns it at once.
 *
 * Not here: the launcher (shm_launch.c), argument checks and counters
 * (comm.c). */
#include "shm.h"
#include "ticker.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Staging half per member. 256 KiB keeps a round of 2 ranks in L2/L3 and
 * makes the two syncs per round cheap next to the copy (see docs/comm.md). */
#define PT_SHM_STAGE (512u << 10)
/* Slice of a pipelined all-reduce chunk and slots of its ring (see
 * allreduce_pipelined for the measurements). */
#define PT_SHM_SLICE (32u << 10)
#define PT_SHM_SLOTS 2
/* All-reduce at or below this many bytes uses the one-sync algorithm. */
#define PT_SHM_SMALL (16u << 10)
/* Collectives of at least this many bytes go single-copy when the ranks can
 * reach each other's memory, in chunks of PT_SHM_CMA_CHUNK bytes per peer
 * (see "single-copy collectives" for the measurements). */
#define PT_SHM_CMA_MIN   (16u << 10)
#define PT_SHM_CMA_CHUNK (128u << 10)
/* Bytes of each send/recv ring: a send that fits completes without the
 * receiver (eager), a larger one waits for it. 1 MiB covers pipeline
 * activations of small models; address space is n^2 rings per region, so
 * large jobs get smaller rings (pages are touched only when used). */
static size_t ring_bytes_for(int n) {
    return n <= 16 ? (size_t)1 << 20 : (size_t)128 << 10;
}
#define SHM_MAGIC 0x7074736du
#define OP_SPLIT  PT_OP_COUNT /* op code of split, for messages */

enum { RANK_NONE = 0, RANK_RUNNING, RANK_EXITED, RANK_FAILED };
enum { ABORT_NONE = 0, ABORT_DIED, ABORT_INTERRUPTED, ABORT_FAULT };
/* shm_rank_info.beat of a rank that has no heartbeat any more (its world was
 * freed): never stale. 0: not started yet, not checked either. */
#define BEAT_OFF UINT64_MAX
/* Free extents of the sub-communicator pool (reused by later splits). */
#define PT_SHM_FREE_MAX 256

typedef struct {
    _Atomic int state;
    _Atomic int wstatus;
    _Atomic int pid;
    _Atomic int cur_op;
    _Atomic int last_op;
    _Atomic long step;
    /* Liveness, separate from progress: the rank's heartbeat thread stores
     * pt_time_ns() here every beat period, whatever its main thread does
     * (a slow disk write is alive, a SIGSTOPped process is not). */
    _Atomic uint64_t beat;
    _Atomic int waiting_on; /* world rank one of its threads waits for, -1 none */
    char err[224];          /* the rank's first comm error, for the launcher's summary */
} shm_rank_info;

typedef struct {
    uint64_t off, bytes;
} shm_extent;

struct pt_shm_job {
    uint32_t magic;
    int nranks;
    uint64_t total;
    double timeout_s;
    uint64_t stage_bytes; /* staging half of every region */
    uint64_t world_off;
    _Atomic uint64_t next_off; /* bump pointer for sub-communicator regions */
    _Atomic int pool_lock;     /* spin lock of the free extents below */
    int nfree;
    shm_extent free_ext[PT_SHM_FREE_MAX]; /* freed regions, reused by split */
    _Atomic int aborted;
    _Atomic int dead_rank;
    /* The job's verdict on a fault a rank noticed (a stalled or silent
     * rank): the first to notice writes it (verdict_lock) and then sets
     * aborted = ABORT_FAULT, so that every wait of every rank returns it. */
    _Atomic int verdict_lock;
    int culprit, noticed_by, verdict_st;
    char verdict[200];
    char pad1[64];
    _Atomic uint32_t futex; /* bumped and woken when a sleeper may care */
    _Atomic int sleepers;
    char pad2[64];
    shm_rank_info ranks[PT_SHM_MAX_RANKS];
};

typedef struct {
    int n;
    _Atomic int refs;
    uint64_t stage_bytes, ring_bytes;
    int world_rank[PT_SHM_MAX_RANKS];
} shm_region;

/* The member's counters, each on its own line: the owner writes, the others
 * poll, and a poll of one counter must not stall the owner's next post. */
typedef struct {
    _Atomic uint64_t flag; /* syncs done (epoch) */
    char pad[56];
    _Atomic uint64_t staged; /* pipelined all-reduce: chunks staged, */
    char pad3[56];
    _Atomic uint64_t reduced; /* chunks reduced (my result slice is in my slot), */
    char pad4[56];
    _Atomic uint64_t done; /* chunks copied out (I no longer read others' slots) */
    char pad5[56];
    int split_color, split_key;
    uint64_t split_off;
    char pad2[48];
    void *cma_addr; /* single-copy collectives: my buffer (my address space), */
    int cma_ok;     /* and whether I can reach every member's memory */
    char pad6[52];
} shm_ctl;

typedef struct {
    _Atomic uint64_t head;
    char pad[56];
    _Atomic uint64_t tail;
    char pad2[56];
} shm_ring;

/* This process's mapping of the arena, shared by its communicators. */
typedef struct {
    pt_shm_job *job;
    size_t total;
    _Atomic int refs;
} shm_map;

typedef struct shm_unexpected shm_unexpected;

typedef struct {
    shm_map *map;
    pt_shm_job *job;
    shm_region *reg;
    uint64_t reg_off;
    shm_ctl *ctl;
    char *stage;
    char *rings;
    int rank, n, wrank;
    double timeout_s; /* progress: a live peer that does not take part (pt_comm_set_timeout) */
    double live_s;    /* liveness: a peer without a heartbeat (the job's comm timeout) */
    uint64_t spin_ns; /* most spinning per wait */
    _Atomic uint64_t spin_cur; /* current spin budget (adaptive) */
    uint64_t epoch;            /* syncs done */
    uint64_t round;            /* rounds done: selects the staging half */
    uint64_t chunks;           /* chunks of pipelined all-reduces done */
    size_t pipe_c, pipe_q;     /* floats per slice and slots of a pipelined chunk */
    uint64_t want;             /* epoch being waited for */
    int scan;                  /* first member not yet seen at `want` */
    int is_world;
    int launched;   /* under pt_launch: its summary line reports job faults */
    int cma;        /* single-copy collectives: 0 not probed yet, 1 on, -1 off */
    size_t cma_min; /* bytes from which collectives go single-copy */
    size_t cma_c;   /* floats per chunk */
    float *cma_tmp; /* n-1 chunks: the peers' slices being reduced */
    int cma_pid[PT_SHM_MAX_RANKS];
    void *cma_buf[PT_SHM_MAX_RANKS];              /* this op's buffer of each member */
    shm_unexpected *unexpected[PT_SHM_MAX_RANKS]; /* per peer, in arrival order */
} shm_ctx;

static size_t round_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

/* ---- region layout ---------------------------------------------------------- */

static size_t ctl_off(void) {
    return round_up(sizeof(shm_region), 64);
}
static size_t stage_off(int n) {
    return round_up(ctl_off() + (size_t)n * sizeof(shm_ctl), 4096);
}
static size_t ring_stride(int n) {
    return sizeof(shm_ring) + ring_bytes_for(n);
}
static size_t ring_off(int n, size_t stage) {
    return stage_off(n) + (size_t)n * 2 * stage;
}
static size_t region_size(int n, size_t stage) {
    return round_up(ring_off(n, stage) + (size_t)n * n * ring_stride(n), 4096);
}

/* PT_SHM_STAGE_KB overrides the staging half (for tuning; 64 KiB..64 MiB). */
static size_t stage_bytes_default(void) {
    const char *e = getenv("PT_SHM_STAGE_KB");
    long kb = e ? atol(e) : 0;
    if (kb >= 64 && kb <= 65536) return (size_t)kb << 10;
    return PT_SHM_STAGE;
}

static char *stage_of(const shm_ctx *x, int member, int half) {
    return x->stage + ((size_t)member * 2 + (size_t)half) * x->reg->stage_bytes;
}
static shm_ring *ring_of(const shm_ctx *x, int src, int dst) {
    return (shm_ring *)(x->rings + ((size_t)src * x->n + (size_t)dst) * ring_stride(x->n));
}

/* ---- jobs: anonymous (launcher) or named (attach) -------------------------- */

static size_t job_total(int nranks) {
    size_t world = region_size(nranks, stage_bytes_default());
    /* Room for sub-communicators: address space only, pages are touched
     * when used and returned when the sub-communicator is freed. */
    size_t pool = 16 * world;
    if (pool < ((size_t)512 << 20)) pool = (size_t)512 << 20;
    return round_up(sizeof(pt_shm_job), 4096) + world + pool;
}

static void job_init(pt_shm_job *job, int nranks, size_t total, double timeout_s) {
    job->magic = SHM_MAGIC;
    job->nranks = nranks;
    job->total = total;
    job->timeout_s = timeout_s;
    job->world_off = round_up(sizeof(pt_shm_job), 4096);
    job->stage_bytes = stage_bytes_default();
    atomic_store(&job->next_off, job->world_off + region_size(nranks, job->stage_bytes));
    job->culprit = -1;
    for (int r = 0; r < PT_SHM_MAX_RANKS; r++) {
        atomic_store(&job->ranks[r].waiting_on, -1);
        atomic_store(&job->ranks[r].cur_op, -1);
        atomic_store(&job->ranks[r].last_op, -1);
        atomic_store(&job->ranks[r].step, -1);
    }
    shm_region *w = (shm_region *)((char *)job + job->world_off);
    w->n = nranks;
    w->stage_bytes = job->stage_bytes;
    w->ring_bytes = ring_bytes_for(nranks);
    atomic_store(&w->refs, nranks);
    for (int r = 0; r < nranks; r++) w->world_rank[r] = r;
}

static pt_status check_nranks(int nranks) {
    if (nranks < 1 || nranks > PT_SHM_MAX_RANKS)
        return pt_error_set(PT_ERR_INVALID, "shm: %d ranks is outside 1..%d", nranks,
                            PT_SHM_MAX_RANKS);
    return PT_OK;
}

pt_status pt_shm_job_map_anon(int nranks, double timeout_s, pt_shm_job **out) {
    *out = NULL;
    PT_CHECK(check_nranks(nranks));
    size_t total = job_total(nranks);
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return pt_error_set(PT_ERR_NOMEM, "shm: cannot map a %zu-byte arena: %s", total,
                            strerror(errno));
    job_init(p, nranks, total, timeout_s);
    *out = p;
    return PT_OK;
}

void pt_shm_job_unmap(pt_shm_job *job) {
    if (job) munmap(job, job->total);
}

pt_status pt_shm_job_create(int nranks, double timeout_s, char *name, size_t name_len) {
    PT_CHECK(check_nranks(nranks));
    if (!name || name_len < PT_SHM_NAME_MAX)
        return pt_error_set(PT_ERR_INVALID, "shm: name buffer must hold %d bytes", PT_SHM_NAME_MAX);
    size_t total = job_total(nranks);
    for (int attempt = 0; attempt < 16; attempt++) {
        unsigned long rnd = (unsigned long)pt_time_ns() ^ ((unsigned long)getpid() << 20) ^
                            ((unsigned long)attempt * 0x9e3779b97f4a7c15ul);
        snprintf(name, name_len, "/partrain-%d-%lx", (int)getpid(), rnd);
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) return pt_error_set(PT_ERR_IO, "shm: shm_open %s: %s", name, strerror(errno));
        if (ftruncate(fd, (off_t)total) != 0) {
            int e = errno;
            close(fd);
            shm_unlink(name);
            return pt_error_set(PT_ERR_NOMEM, "shm: ftruncate %s to %zu bytes: %s", name, total,
                                strerror(e));
        }
        void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
        int e = errno;
        close(fd);
        if (p == MAP_FAILED) {
            shm_unlink(name);
            return pt_error_set(PT_ERR_NOMEM, "shm: mmap %s: %s", name, strerror(e));
        }
        job_init(p, nranks, total, timeout_s);
        munmap(p, total);
        return PT_OK;
    }
    return pt_error_set(PT_ERR_IO, "shm: no free segment name after 16 tries");
}

pt_status pt_shm_job_unlink(const char *name) {
    if (!name) return pt_error_set(PT_ERR_INVALID, "shm: name is NULL");
    if (shm_unlink(name) != 0 && errno != ENOENT)
        return pt_error_set(PT_ERR_IO, "shm: shm_unlink %s: %s", name, strerror(errno));
    return PT_OK;
}

/* ---- waking and waiting ------------------------------------------------------------ */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    /* Not FUTEX_PRIVATE: the word is shared between processes. */
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void wake_all(pt_shm_job *job) {
    atomic_fetch_add(&job->futex, 1);
    futex(&job->futex, FUTEX_WAKE, INT_MAX, NULL);
}

/* After publishing a flag or a ring pointer: wake sleepers, if any. The
 * fence pairs with the one in wait_until (a sleeper either sees the new
 * value or is seen here). */
static void wake(shm_ctx *x) {
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&x->job->sleepers, memory_order_relaxed) > 0) wake_all(x->job);
}

static const char *op_name(int op) {
    return op == OP_SPLIT ? "split" : pt_comm_op_name((pt_comm_op)op);
}

static void describe_status(int ws, char *out, size_t len) {
    if (WIFSIGNALED(ws)) {
        const char *abbr = sigabbrev_np(WTERMSIG(ws));
        snprintf(out, len, "killed by signal %d (SIG%s)", WTERMSIG(ws), abbr ? abbr : "?");
    } else if (WIFEXITED(ws)) {
        snprintf(out, len, "exited with code %d", WEXITSTATUS(ws));
    } else {
        snprintf(out, len, "stopped (status 0x%x)", ws);
    }
}

/* "rank 2" or "rank 1 (world rank 5)". */
static void name_member(const shm_ctx *x, int m, char *out, size_t len) {
    int w = x->reg->world_rank[m];
    if (x->is_world || w == m)
        snprintf(out, len, "rank %d", m);
    else
        snprintf(out, len, "rank %d (world rank %d)", m, w);
}

/* Error for a job the launcher stopped, or PT_OK. */
static pt_status check_abort(shm_ctx *x, int op) {
    int a = atomic_load_explicit(&x->job->aborted, memory_order_acquire);
    if (a == ABORT_NONE) return PT_OK;
    if (a == ABORT_INTERRUPTED)
        return pt_error_set(PT_ERR_INTERRUPTED, "%s: job interrupted", op_name(op));
    if (a == ABORT_FAULT)
        return pt_error_set(x->job->verdict_st, "%s: %s (noticed by rank %d); job stopped",
                            op_name(op), x->job->verdict, x->job->noticed_by);
    int d = atomic_load(&x->job->dead_rank);
    char why[96];
    describe_status(atomic_load(&x->job->ranks[d].wstatus), why, sizeof why);
    return pt_error_set(PT_ERR_COMM, "%s: world rank %d %s; job stopped", op_name(op), d, why);
}

/* Error when member m is gone (exited, or its pid vanished), else PT_OK. */
static pt_status check_peer(shm_ctx *x, int m, int op) {
    int w = x->reg->world_rank[m];
    shm_rank_info *ri = &x->job->ranks[w];
    int state = atomic_load_explicit(&ri->state, memory_order_acquire);
    char who[64], why[96];
    name_member(x, m, who, sizeof who);
    if (state == RANK_EXITED || state == RANK_FAILED) {
        describe_status(atomic_load(&ri->wstatus), why, sizeof why);
        return pt_error_set(PT_ERR_COMM, "%s: %s %s before taking part", op_name(op), who, why);
    }
    int pid = atomic_load(&ri->pid);
    if (state == RANK_RUNNING && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
        return pt_error_set(PT_ERR_COMM, "%s: %s (pid %d) is gone", op_name(op), who, pid);
    return PT_OK;
}

/* Make `reason` (about world rank culprit) the job's verdict unless another
 * rank was first, and return the job's verdict as this rank's error: every
 * rank then fails with the same line, and the launcher's summary names the
 * culprit (not the rank that happened to exit first). */
static pt_status publish_verdict(shm_ctx *x, int culprit, pt_status st, int op,
                                 const char *reason) {
    pt_shm_job *job = x->job;
    int expected = 0;
    if (atomic_compare_exchange_strong(&job->verdict_lock, &expected, 1)) {
        job->culprit = culprit;
        job->noticed_by = x->wrank;
        job->verdict_st = st;
        snprintf(job->verdict, sizeof job->verdict, "%s", reason);
        expected = ABORT_NONE;
        atomic_compare_exchange_strong(&job->aborted, &expected, ABORT_FAULT);
        wake_all(job);
    }
    pt_status e = check_abort(x, op);
    /* Another abort (a death the launcher saw, Ctrl-C) came first: that one. */
    return e != PT_OK ? e : pt_error_set(st, "%s: %s", op_name(op), reason);
}

/* A rank whose heartbeat stopped more than live_s ago (SIGSTOP, a frozen
 * host process): -1 if none. *age_s gets its silence. */
static int stale_rank(shm_ctx *x, uint64_t now, double *age_s) {
    uint64_t live_ns = (uint64_t)(x->live_s * 1e9);
    for (int r = 0; r < x->job->nranks; r++) {
        if (r == x->wrank) continue;
        shm_rank_info *ri = &x->job->ranks[r];
        if (atomic_load_explicit(&ri->state, memory_order_acquire) != RANK_RUNNING) continue;
        uint64_t b = atomic_load_explicit(&ri->beat, memory_order_acquire);
        if (b == 0 || b == BEAT_OFF || now <= b + live_ns) continue;
        *age_s = (double)(now - b) * 1e-9;
        return r;
    }
    return -1;
}

/* Whom to blame when world rank w did not take part in time: follow what
 * each rank waits for (w may itself wait for another) to a rank that waits
 * for nobody, the one holding everyone up. */
static int blame_chain(shm_ctx *x, int w) {
    for (int hops = 0; hops < x->job->nranks; hops++) {
        int next = atomic_load_explicit(&x->job->ranks[w].waiting_on, memory_order_acquire);
        if (next < 0 || next == x->wrank || next == w) break;
        w = next;
    }
    return w;
}

/* check_peer's finding about world rank w, as a verdict names it (world
 * ranks, so that the launcher's line names the process). */
static const char *gone_reason(shm_ctx *x, int w) {
    static _Thread_local char out[160];
    shm_rank_info *ri = &x->job->ranks[w];
    int state = atomic_load_explicit(&ri->state, memory_order_acquire);
    if (state == RANK_EXITED || state == RANK_FAILED) {
        char why[96];
        describe_status(atomic_load(&ri->wstatus), why, sizeof why);
        snprintf(out, sizeof out, "rank %d %s before taking part", w, why);
    } else {
        snprintf(out, sizeof out, "rank %d (pid %d) is gone", w, atomic_load(&ri->pid));
    }
    return out;
}

typedef int (*pending_fn)(shm_ctx *x, const void *arg);

/* Wait until pending() returns -1; it otherwise returns the member being
 * waited for, whom errors name. */
static pt_status wait_until(shm_ctx *x, pending_fn pending, const void *arg, int op) {
    int who = pending(x, arg);
    if (who < 0) return PT_OK;
    uint64_t t0 = pt_time_ns(), now = t0;
    uint64_t timeout_ns = (uint64_t)(x->timeout_s * 1e9);
    uint64_t next_peer_check = t0 + 50000000ull;
    _Atomic int *my_wait = &x->job->ranks[x->wrank].waiting_on;
    int waiting_on = -1; /* what this wait published in my_wait */
    /* Adaptive spin: a wait that ends within the spin budget grows it (up to
     * spin_ns), one that has to yield halves it. On a loaded machine the
     * peer often needs the very core we would spin on (measured, 2 ranks on
     * 2 busy cores: 8-byte all-reduce median 1 ms with a fixed 1 ms spin,
     * 1.6 us with none; on free cores 0.35 us with 50 us of spin). */
    uint64_t spin = atomic_load_explicit(&x->spin_cur, memory_order_relaxed);
    for (unsigned i = 1;; i++) {
        who = pending(x, arg);
        if (who < 0) {
            if (waiting_on >= 0) atomic_compare_exchange_strong(my_wait, &waiting_on, -1);
            uint64_t grown = spin + spin / 4 + 500, halved = spin / 2 > 500 ? spin / 2 : 500;
            if (now - t0 < spin)
                atomic_store_explicit(&x->spin_cur, grown < x->spin_ns ? grown : x->spin_ns,
                                      memory_order_relaxed);
            else
                atomic_store_explicit(&x->spin_cur, halved, memory_order_relaxed);
            return PT_OK;
        }
        if ((i & 63) == 0 || now - t0 >= spin) {
            pt_status a = check_abort(x, op);
            if (a != PT_OK) {
                if (waiting_on >= 0) atomic_compare_exchange_strong(my_wait, &waiting_on, -1);
                return a;
            }
            now = pt_time_ns();
        }
        if (now - t0 < spin) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        int ww = x->reg->world_rank[who];
        if (ww != waiting_on) { /* for blame_chain in the other ranks */
            atomic_store_explicit(my_wait, ww, memory_order_release);
            waiting_on = ww;
        }
        pt_status fault = PT_OK;
        if (now >= next_peer_check) {
            next_peer_check = now + 50000000ull;
            if (check_peer(x, who, op) != PT_OK) {
                /* It may have finished its part and then exited. */
                if (pending(x, arg) < 0) continue;
                fault = check_peer(x, who, op);
                fault = publish_verdict(x, ww, fault, op, gone_reason(x, ww));
            }
            double age = 0;
            int st = fault == PT_OK ? stale_rank(x, now, &age) : -1;
            if (st >= 0) {
                char reason[200];
                snprintf(reason, sizeof reason,
                         "rank %d stopped responding: no heartbeat for %.1f s (stopped, frozen "
                         "or overloaded; comm.timeout %.3g s)",
                         st, age, x->live_s);
                fault = publish_verdict(x, st, PT_ERR_TIMEOUT, op, reason);
            }
        }
        if (fault == PT_OK && now - t0 > timeout_ns) {
            int c = blame_chain(x, ww);
            char reason[200];
            /* Silent for over half the liveness timeout (ten beat periods): it
             * is frozen, not merely elsewhere. */
            uint64_t b = atomic_load(&x->job->ranks[c].beat);
            double age = b && b != BEAT_OFF && now > b ? (double)(now - b) * 1e-9 : 0;
            if (age > x->live_s / 2)
                snprintf(reason, sizeof reason,
                         "rank %d stopped responding: no heartbeat for %.1f s (stopped, frozen "
                         "or overloaded; comm.timeout %.3g s)",
                         c, age, x->live_s);
            else
                snprintf(reason, sizeof reason, "rank %d did not take part within %.3g s", c,
                         x->timeout_s);
            fault = publish_verdict(x, c, PT_ERR_TIMEOUT, op, reason);
        }
        if (fault != PT_OK) {
            if (waiting_on >= 0) atomic_compare_exchange_strong(my_wait, &waiting_on, -1);
            return fault;
        }
        if (now - t0 < spin + 1000000ull) {
            sched_yield();
            continue;
        }
        /* Sleep until someone posts (or 10 ms, to re-check peers). */
        atomic_fetch_add(&x->job->sleepers, 1);
        uint32_t gen = atomic_load(&x->job->futex);
        atomic_thread_fence(memory_order_seq_cst);
        if (pending(x, arg) >= 0 && atomic_load(&x->job->aborted) == ABORT_NONE) {
            struct timespec ts = {0, 10000000};
            futex(&x->job->futex, FUTEX_WAIT, gen, &ts);
        }
        atomic_fetch_sub(&x->job->sleepers, 1);
    }
}

/* ---- sync -------------------------------------------------------------------------- */

static int pending_flags(shm_ctx *x, const void *arg) {
    (void)arg;
    for (; x->scan < x->n; x->scan++)
        if (atomic_load_explicit(&x->ctl[x->scan].flag, memory_order_acquire) < x->want)
            return x->scan;
    return -1;
}

static pt_status sync_all(shm_ctx *x, int op) {
    uint64_t e = ++x->epoch;
    atomic_store_explicit(&x->ctl[x->rank].flag, e, memory_order_release);
    wake(x);
    x->want = e;
    x->scan = 0;
    return wait_until(x, pending_flags, NULL, op);
}

static void op_begin(shm_ctx *x, int op) {
    atomic_store_explicit(&x->job->ranks[x->wrank].cur_op, op, memory_order_relaxed);
}

static pt_status op_end(shm_ctx *x, int op, pt_status st) {
    shm_rank_info *ri = &x->job->ranks[x->wrank];
    if (st != PT_OK && ri->err[0] == '\0')
        snprintf(ri->err, sizeof ri->err, "%s", pt_error_message());
    atomic_store_explicit(&x->job->ranks[x->wrank].last_op, op, memory_order_relaxed);
    atomic_store_explicit(&x->job->ranks[x->wrank].cur_op, -1, memory_order_relaxed);
    return st;
}

/* ---- reductions -------------------------------------------------------------------- */

/* dst[0:k] = sum over j of src[j][0:k] in order j = 0..n-1 (divided by n for
 * AVG). Blocks keep the partial sum in L1; the loops vectorize. */
static void reduce_into(float *dst, const float *const *src, int n, size_t k, int avg) {
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

/* reduce_into, also writing the result to dst2 (which aliases no source):
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
        reduce_into(dst + o, s, n, m, avg);
        memcpy(dst2 + o, dst + o, m * sizeof(float));
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
    PT_CHECK(sync_all(x, PT_OP_ALLREDUCE));
    const float *src[PT_SHM_MAX_RANKS];
    for (int j = 0; j < x->n; j++) src[j] = (const float *)stage_of(x, j, h);
    reduce_into(buf, src, x->n, count, avg);
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
        PT_CHECK(sync_all(x, op));
        if (k < len[me]) {
            size_t m = len[me] - k < c ? len[me] - k : c;
            for (int j = 0; j < n; j++) src[j] = (const float *)stage_of(x, j, h) + (size_t)me * c;
            src[me] = buf + off[me] + k; /* dst too: element-wise in place */
            reduce_into(buf + off[me] + k, src, n, m, avg);
            if (gather) memcpy(mine + (size_t)me * c, buf + off[me] + k, m * sizeof(float));
        }
        if (!gather) continue;
        PT_CHECK(sync_all(x, op));
        for (int j = 0; j < n; j++) {
            if (j == me || k >= len[j]) continue;
            size_t m = len[j] - k < c ? len[j] - k : c;
            memcpy(buf + off[j] + k, (const float *)stage_of(x, j, h) + (size_t)j * c,
                   m * sizeof(float));
        }
    }
    return PT_OK;
}

/* ---- pipelined all-reduce ------------------------------------------------------------
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
 * and waits (spin, yield, sleep: wait_until) only when none can run. A rank
 * thus stages ahead while its peer is late instead of idling, and with a
 * small ring the slots stay in L2 between the producer's write and the
 * consumer's read (measured, 2 ranks: 2 slots of 32-64 KiB slices beat 8
 * slots by 1.3-1.6x at 512 KiB-8 MiB; 16 KiB slices lose to the counters'
 * overhead).
 * The call starts with a sync (nobody still reads a stage of an earlier
 * op) and ends when every peer is done (nobody reads my slots afterwards),
 * so the other collectives' two-half rounds need not know about it. */

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
    return wait_until(x, pending_counter, &w, PT_OP_ALLREDUCE);
}

static void post_counter(shm_ctx *x, size_t field, uint64_t v) {
    atomic_store_explicit(counter_of(x, x->rank, field), v, memory_order_release);
    wake(x);
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

static pt_status allreduce_pipelined(shm_ctx *x, float *buf, size_t count, int avg) {
    int n = x->n, me = x->rank;
    pipe_plan pp;
    pp.buf = buf;
    pp.c = x->pipe_c;
    pp.Q = x->pipe_q;
    for (int j = 0; j < n; j++) pt_comm_shard(count, n, j, &pp.off[j], &pp.len[j]);
    size_t c = pp.c;
    pipe_state ps = {x->chunks, (pp.len[0] + c - 1) / c, 0, 0, 0};
    PT_CHECK(sync_all(x, PT_OP_ALLREDUCE));
    const float *src[PT_SHM_MAX_RANKS];
    while (ps.o < ps.nch) {
        int step = pipe_next(x, &ps);
        if (step == 0) {
            PT_CHECK(wait_until(x, pending_pipe, &ps, PT_OP_ALLREDUCE));
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

/* ---- single-copy collectives ------------------------------------------------------------
 * The staged algorithms move every byte twice, into the arena and out of
 * it, because a rank's buffer is private memory. From cma_min bytes up the
 * ranks instead copy straight between their buffers with cross-memory attach
 * (shm_cma.c): every rank posts its buffer's address and syncs; rank r then
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
 * that). */

static int cma_wanted(void) {
    const char *e = getenv("PT_SHM_CMA");
    return !(e && !strcmp(e, "0"));
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
    name_member(x, m, who, sizeof who);
    /* A peer that left the operation because the job stopped (its buffer
     * may be gone: EFAULT): the job's reason, not the copy's. */
    PT_CHECK(check_abort(x, op));
    if (err == ESRCH || pid_dead(x->cma_pid[m])) {
        /* Give the launcher a moment to reap it: its verdict names the
         * signal or exit code (as every other wait does). */
        for (int i = 0; i < 1000; i++) {
            PT_CHECK(check_abort(x, op));
            PT_CHECK(check_peer(x, m, op));
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
        return pt_error_set(PT_ERR_COMM, "%s: %s (pid %d) died", op_name(op), who, x->cma_pid[m]);
    }
    if (err == EFAULT)
        return pt_error_set(PT_ERR_COMM,
                            "%s: %zu bytes of %s's buffer are not mapped (do the counts agree "
                            "across ranks?)",
                            op_name(op), bytes, who);
    return pt_error_set(PT_ERR_COMM, "%s: copying from/to %s: %s", op_name(op), who, strerror(err));
}

static pt_status cma_read(shm_ctx *x, int m, void *dst, size_t off, size_t bytes, int op) {
    int e = pt_shm_cma_read(x->cma_pid[m], dst, (char *)x->cma_buf[m] + off, bytes);
    return e ? cma_error(x, m, e, bytes, op) : PT_OK;
}

static pt_status cma_write(shm_ctx *x, int m, const void *src, size_t off, size_t bytes, int op) {
    int e = pt_shm_cma_write(x->cma_pid[m], src, (char *)x->cma_buf[m] + off, bytes);
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
        if (m != x->rank && pt_shm_cma_read(x->cma_pid[m], &byte, x->cma_buf[m], 1) != 0) ok = 0;
    }
    x->ctl[x->rank].cma_ok = ok;
    PT_CHECK(sync_all(x, op));
    int all = 1;
    for (int m = 0; m < x->n; m++) all &= x->ctl[m].cma_ok;
    x->cma = all ? 1 : -1;
    PT_DEBUG("shm: single-copy collectives %s (a communicator of %d)", all ? "on" : "off", x->n);
    return PT_OK;
}

/* `want` (the same on every member): this call would go single-copy. Post
 * my buffer and learn the others'; *use: go single-copy (else the staged
 * algorithm, on every member alike). */
static pt_status cma_enter(shm_ctx *x, void *buf, int want, int op, int *use) {
    *use = 0;
    if (x->cma < 0 || !want) return PT_OK;
    x->ctl[x->rank].cma_addr = buf;
    PT_CHECK(sync_all(x, op));
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
static pt_status cma_reduce(shm_ctx *x, float *buf, size_t count, int avg, int gather, int op) {
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
        reduce_into(d, src, n, m, avg);
        for (int j = 0; gather && j < n; j++)
            if (j != me) PT_CHECK(cma_write(x, j, d, at, m * sizeof(float), op));
    }
    return sync_all(x, op);
}

static pt_status cma_allgather(shm_ctx *x, float *buf, size_t count) {
    for (int j = 0; j < x->n; j++) {
        size_t off, len;
        pt_comm_shard(count, x->n, j, &off, &len);
        if (j != x->rank && len)
            PT_CHECK(cma_read(x, j, buf + off, off * sizeof(float), len * sizeof(float),
                              PT_OP_ALLGATHER));
    }
    return sync_all(x, PT_OP_ALLGATHER);
}

/* A rank's kernel copies run at ~10 GB/s here against ~15 for memcpy, so
 * the root does not idle: it writes the last 1/n of the buffer into every
 * other rank while they read the rest (2 ranks: each copies half). */
static pt_status cma_broadcast(shm_ctx *x, char *buf, size_t bytes, int root) {
    size_t tail = bytes / (size_t)x->n, head = bytes - tail;
    if (x->rank != root) PT_CHECK(cma_read(x, root, buf, 0, head, PT_OP_BROADCAST));
    for (int j = 0; x->rank == root && tail && j < x->n; j++)
        if (j != root) PT_CHECK(cma_write(x, j, buf + head, head, tail, PT_OP_BROADCAST));
    return sync_all(x, PT_OP_BROADCAST);
}

static pt_status shm_allreduce(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    shm_ctx *x = ctx;
    if (x->n == 1 || count == 0) return PT_OK;
    op_begin(x, PT_OP_ALLREDUCE);
    int avg = op == PT_REDUCE_AVG, cma = 0;
    size_t bytes = count * sizeof(float);
    if (bytes <= PT_SHM_SMALL)
        return op_end(x, PT_OP_ALLREDUCE, allreduce_small(x, buf, count, avg));
    pt_status st = cma_enter(x, buf, bytes >= x->cma_min, PT_OP_ALLREDUCE, &cma);
    if (st == PT_OK)
        st = cma ? cma_reduce(x, buf, count, avg, 1, PT_OP_ALLREDUCE)
                 : allreduce_pipelined(x, buf, count, avg);
    return op_end(x, PT_OP_ALLREDUCE, st);
}

static pt_status shm_reduce_scatter(void *ctx, float *buf, size_t count, pt_reduce_op op) {
    shm_ctx *x = ctx;
    if (x->n == 1 || count == 0) return PT_OK;
    op_begin(x, PT_OP_REDUCE_SCATTER);
    int avg = op == PT_REDUCE_AVG, cma;
    pt_status st =
        cma_enter(x, buf, count * sizeof(float) >= x->cma_min, PT_OP_REDUCE_SCATTER, &cma);
    if (st == PT_OK)
        st = cma ? cma_reduce(x, buf, count, avg, 0, PT_OP_REDUCE_SCATTER)
                 : reduce_rounds(x, buf, count, avg, 0, PT_OP_REDUCE_SCATTER);
    return op_end(x, PT_OP_REDUCE_SCATTER, st);
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
        PT_CHECK(sync_all(x, PT_OP_ALLGATHER));
        for (int j = 0; j < n; j++) {
            if (j == me || k >= len[j]) continue;
            memcpy(buf + off[j] + k, stage_of(x, j, h),
                   (len[j] - k < c ? len[j] - k : c) * sizeof(float));
        }
    }
    return PT_OK;
}

static pt_status shm_allgather(void *ctx, float *buf, size_t count) {
    shm_ctx *x = ctx;
    if (x->n == 1 || count == 0) return PT_OK;
    op_begin(x, PT_OP_ALLGATHER);
    int cma;
    pt_status st =
        cma_enter(x, buf, x->n == 2 && count * sizeof(float) >= x->cma_min, PT_OP_ALLGATHER, &cma);
    if (st == PT_OK) st = cma ? cma_allgather(x, buf, count) : allgather_rounds(x, buf, count);
    return op_end(x, PT_OP_ALLGATHER, st);
}

static pt_status broadcast_rounds(shm_ctx *x, char *buf, size_t bytes, int root) {
    size_t c = x->reg->stage_bytes;
    for (size_t k = 0; k < bytes; k += c) {
        int h = (int)(x->round++ & 1);
        size_t m = bytes - k < c ? bytes - k : c;
        if (x->rank == root) memcpy(stage_of(x, root, h), buf + k, m);
        PT_CHECK(sync_all(x, PT_OP_BROADCAST));
        if (x->rank != root) memcpy(buf + k, stage_of(x, root, h), m);
    }
    return PT_OK;
}

static pt_status shm_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    shm_ctx *x = ctx;
    if (x->n == 1 || bytes == 0) return PT_OK;
    op_begin(x, PT_OP_BROADCAST);
    int cma;
    pt_status st = cma_enter(x, buf, x->n == 2 && bytes >= x->cma_min, PT_OP_BROADCAST, &cma);
    if (st == PT_OK)
        st = cma ? cma_broadcast(x, buf, bytes, root) : broadcast_rounds(x, buf, bytes, root);
    return op_end(x, PT_OP_BROADCAST, st);
}

static pt_status shm_barrier(void *ctx) {
    shm_ctx *x = ctx;
    if (x->n == 1) return PT_OK;
    op_begin(x, PT_OP_BARRIER);
    return op_end(x, PT_OP_BARRIER, sync_all(x, PT_OP_BARRIER));
}

/* ---- send/recv: one byte ring per ordered pair -------------------------------------------
 * A message is a 16-byte header (tag, bytes) then the payload, streamed
 * through the ring as space frees up. A recv takes the first message from
 * the peer with its tag; messages with other tags read on the way are kept
 * (allocated) for later recvs. A size that differs from the recv's is an
 * error. */

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
        PT_CHECK(wait_until(x, pending_space, &w, op));
        uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
        uint64_t space = R - (head - atomic_load_explicit(&r->tail, memory_order_acquire));
        size_t k = bytes < space ? bytes : space;
        size_t pos = head % R, first = R - pos < k ? R - pos : k;
        memcpy(ring_data(r) + pos, p, first);
        memcpy(ring_data(r), p + first, k - first);
        atomic_store_explicit(&r->head, head + k, memory_order_release);
        wake(x);
        p += k;
        bytes -= k;
    }
    return PT_OK;
}

static pt_status ring_read(shm_ctx *x, shm_ring *r, int peer, char *p, size_t bytes, int op) {
    const uint64_t R = x->reg->ring_bytes;
    while (bytes > 0) {
        ring_wait w = {r, peer, 1};
        PT_CHECK(wait_until(x, pending_data, &w, op));
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        uint64_t avail = atomic_load_explicit(&r->head, memory_order_acquire) - tail;
        size_t k = bytes < avail ? bytes : avail;
        size_t pos = tail % R, first = R - pos < k ? R - pos : k;
        memcpy(p, ring_data(r) + pos, first);
        memcpy(p + first, ring_data(r), k - first);
        atomic_store_explicit(&r->tail, tail + k, memory_order_release);
        wake(x);
        p += k;
        bytes -= k;
    }
    return PT_OK;
}

typedef struct {
    int64_t tag;
    uint64_t bytes;
} msg_header;

static pt_status shm_send(void *ctx, const void *buf, size_t bytes, int peer, int tag) {
    shm_ctx *x = ctx;
    op_begin(x, PT_OP_SEND);
    msg_header hd = {tag, bytes};
    shm_ring *r = ring_of(x, x->rank, peer);
    pt_status st = ring_write(x, r, peer, (const char *)&hd, sizeof hd, PT_OP_SEND);
    if (st == PT_OK) st = ring_write(x, r, peer, buf, bytes, PT_OP_SEND);
    return op_end(x, PT_OP_SEND, st);
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
    name_member(x, peer, who, sizeof who);
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

static pt_status shm_recv(void *ctx, void *buf, size_t bytes, int peer, int tag) {
    shm_ctx *x = ctx;
    op_begin(x, PT_OP_RECV);
    return op_end(x, PT_OP_RECV, recv_matching(x, buf, bytes, peer, tag));
}

/* ---- contexts, split, free -------------------------------------------------------------- */

static const pt_comm_backend shm_backend;

static uint64_t spin_ns_for(int nranks) {
    /* Spinning only pays when every rank has a core of its own. */
    const char *e = getenv("PT_SHM_SPIN_US"); /* tuning */
    if (e && *e) return (uint64_t)(atof(e) * 1000);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus >= nranks ? 50000 : 2000;
}

/* Floats per slice of a pipelined all-reduce chunk (a multiple of 16) and
 * slots of its ring; PT_SHM_SLICE_KB and PT_SHM_SLOTS override them
 * (tuning). At least two slots must fit in the two staging halves. */
static void pipe_shape(shm_ctx *x) {
    const char *e = getenv("PT_SHM_SLICE_KB"), *q = getenv("PT_SHM_SLOTS");
    size_t slice = e && atol(e) > 0 ? (size_t)atol(e) << 10 : PT_SHM_SLICE;
    size_t area = 2 * x->reg->stage_bytes; /* both halves */
    size_t max = area / 2 / (size_t)x->n;
    if (slice > max) slice = max;
    x->pipe_c = slice / sizeof(float) & ~(size_t)15;
    x->pipe_q = area / ((size_t)x->n * x->pipe_c * sizeof(float));
    size_t want = q && atol(q) >= 2 ? (size_t)atol(q) : PT_SHM_SLOTS;
    if (want < x->pipe_q) x->pipe_q = want;
}

/* Single-copy threshold and chunk; PT_SHM_CMA_MIN_KB and PT_SHM_CMA_CHUNK_KB
 * override them (tuning; every rank must see the same values). */
static void cma_shape(shm_ctx *x) {
    const char *e = getenv("PT_SHM_CMA_MIN_KB"), *c = getenv("PT_SHM_CMA_CHUNK_KB");
    x->cma_min = e && *e ? (size_t)atol(e) << 10 : PT_SHM_CMA_MIN;
    size_t chunk = c && atol(c) > 0 ? (size_t)atol(c) << 10 : PT_SHM_CMA_CHUNK;
    x->cma_c = chunk / sizeof(float) & ~(size_t)15;
    if (x->cma_c == 0) x->cma_c = 16;
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
    pipe_shape(x);
    cma_shape(x);
    x->is_world = is_world;
    /* A sub-communicator's flags start at 0 (fresh region); the world's too. */
    atomic_fetch_add(&map->refs, 1);
    *out = x;
    return PT_OK;
}

/* ---- heartbeat: one thread per rank process with a world of several ----
 * Stores pt_time_ns() into the rank's beat every period (live_s / 20, from
 * 5 to 200 ms), independently of the main and progress threads, on the comm
 * layer's ticker (ticker.h). Waiters compare it with their clock (one
 * host: one monotonic clock). */
static struct {
    pt_ticker tick;
    shm_rank_info *ri;
} hb;

static void hb_beat(void *arg) {
    (void)arg;
    atomic_store_explicit(&hb.ri->beat, pt_time_ns(), memory_order_release);
}

/* A child forked while a heartbeat ran has no such thread. */
static void hb_after_fork(void) {
    pt_ticker_forget(&hb.tick);
}

static pt_status hb_start(pt_shm_job *job, int wrank, double live_s) {
    if (job->nranks < 2 || hb.tick.running) return PT_OK;
    static int atfork_set;
    if (!atfork_set) atfork_set = pthread_atfork(NULL, NULL, hb_after_fork) == 0;
    double p = live_s / 20;
    p = p < 0.005 ? 0.005 : p > 0.2 ? 0.2 : p;
    hb.ri = &job->ranks[wrank];
    atomic_store(&hb.ri->beat, pt_time_ns());
    return pt_ticker_start(&hb.tick, (uint64_t)(p * 1e9), hb_beat, NULL, "shm heartbeat");
}

/* The world is freed: no heartbeat from here on, and none is expected. */
static void hb_stop(void) {
    if (!hb.tick.running) return;
    pt_ticker_stop(&hb.tick);
    atomic_store(&hb.ri->beat, BEAT_OFF);
}

/* ---- the sub-communicator pool: freed regions are reused ---- */

static void pool_lock(pt_shm_job *job) {
    int expected = 0;
    while (!atomic_compare_exchange_weak(&job->pool_lock, &expected, 1)) {
        expected = 0;
        sched_yield();
    }
}
static void pool_unlock(pt_shm_job *job) {
    atomic_store_explicit(&job->pool_lock, 0, memory_order_release);
}

/* Offset of `need` bytes for a new region (first fit among freed extents,
 * else from the bump pointer), 0 when the arena is full. */
static uint64_t pool_take(pt_shm_job *job, uint64_t need) {
    pool_lock(job);
    uint64_t off = 0;
    for (int i = 0; i < job->nfree && !off; i++) {
        shm_extent *e = &job->free_ext[i];
        if (e->bytes < need) continue;
        off = e->off;
        e->off += need;
        e->bytes -= need;
        if (e->bytes == 0) job->free_ext[i] = job->free_ext[--job->nfree];
    }
    if (!off) {
        uint64_t o = atomic_load(&job->next_off);
        if (o + need <= job->total) {
            off = o;
            atomic_store(&job->next_off, o + need);
        }
    }
    pool_unlock(job);
    return off;
}

/* Give [off, off + bytes) back, merged with free neighbours; the extent at
 * the bump pointer lowers it instead. A full table drops the extent (its
 * address space is lost to this job, nothing else). */
static void pool_give(pt_shm_job *job, uint64_t off, uint64_t bytes) {
    pool_lock(job);
    for (int merged = 1; merged;) {
        merged = 0;
        for (int i = 0; i < job->nfree; i++) {
            shm_extent *e = &job->free_ext[i];
            if (e->off + e->bytes == off || off + bytes == e->off) {
                if (e->off < off) off = e->off;
                bytes += e->bytes;
                job->free_ext[i] = job->free_ext[--job->nfree];
                merged = 1;
                break;
            }
        }
    }
    if (off + bytes == atomic_load(&job->next_off))
        atomic_store(&job->next_off, off);
    else if (job->nfree < PT_SHM_FREE_MAX)
        job->free_ext[job->nfree++] = (shm_extent){off, bytes};
    pool_unlock(job);
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
    if (x->is_world && hb.tick.running && hb.ri == &x->job->ranks[x->wrank]) hb_stop();
    if (!x->is_world && atomic_fetch_sub(&x->reg->refs, 1) == 1) {
        /* The last member: give the pages back (they read as zeros when
         * reused, as a fresh region's flags must) and the range to the pool. */
        size_t bytes = region_size(x->n, x->reg->stage_bytes);
        if (madvise(x->reg, bytes, MADV_REMOVE) != 0) memset(x->reg, 0, bytes);
        pool_give(x->job, x->reg_off, bytes);
    }
    for (int p = 0; p < x->n; p++)
        while (x->unexpected[p]) {
            shm_unexpected *u = x->unexpected[p];
            x->unexpected[p] = u->next;
            pt_mem_free(u);
        }
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

static void shm_note_step(void *ctx, long step) {
    shm_ctx *x = ctx;
    atomic_store_explicit(&x->job->ranks[x->wrank].step, step, memory_order_relaxed);
}

static pt_status shm_split(void *ctx, int color, int key, void **out_ctx, int *rank, int *size) {
    shm_ctx *x = ctx;
    *out_ctx = NULL;
    op_begin(x, OP_SPLIT);
    x->ctl[x->rank].split_color = color;
    x->ctl[x->rank].split_key = key;
    pt_status st = sync_all(x, OP_SPLIT);
    if (st != PT_OK) return op_end(x, OP_SPLIT, st);

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
        uint64_t off = pool_take(x->job, need);
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
    st = sync_all(x, OP_SPLIT);
    if (st != PT_OK) return op_end(x, OP_SPLIT, st);
    uint64_t off = x->ctl[leader].split_off;
    if (off == 0)
        return op_end(x, OP_SPLIT,
                      pt_error_set(PT_ERR_NOMEM,
                                   "split: the shm arena has no room for another "
                                   "sub-communicator (%llu bytes reserved)",
                                   (unsigned long long)x->job->total));
    shm_ctx *y;
    st = ctx_new(x->map, off, me, x->timeout_s, x->live_s, 0, &y);
    if (st != PT_OK) return op_end(x, OP_SPLIT, st);
    y->launched = x->launched;
    *out_ctx = y;
    *rank = me;
    *size = m;
    return op_end(x, OP_SPLIT, PT_OK);
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
    .concurrent_p2p = 1, /* recv touches only the rings toward this rank */
};

/* ---- world constructors ----------------------------------------------------------------- */

static struct {
    pt_shm_job *job;
    int rank;
} adopted = {NULL, -1};

/* Out of line: GCC 12 misjudges the size of a freshly mmapped job inline. */
static __attribute__((noinline)) void mark_running(pt_shm_job *job, int rank, int pid) {
    atomic_store(&job->ranks[rank].pid, pid);
    atomic_store(&job->ranks[rank].state, RANK_RUNNING);
}

void pt_shm_job_adopt(pt_shm_job *job, int rank, int pid) {
    adopted.job = job;
    adopted.rank = rank;
    mark_running(job, rank, pid);
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
    double t = job->timeout_s > 0 ? job->timeout_s : timeout_s > 0 ? timeout_s : 10.0;
    pt_status st = ctx_new(map, job->world_off, rank, t, t, 1, &x);
    map_release(map); /* the context holds it now (or, on failure, nobody) */
    if (st != PT_OK) return st;
    st = hb_start(job, rank, t);
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

pt_status pt_comm_shm_world(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                            int *rank, int *size) {
    if (!adopted.job)
        return pt_error_set(PT_ERR_UNSUPPORTED, "shm: this process was not started by pt_launch");
    pt_shm_job *job = adopted.job;
    adopted.job = NULL; /* one world per launched rank */
    return world_from(job, job->total, adopted.rank, opt->timeout_s, 1, be, ctx, rank, size);
}

pt_status pt_comm_shm_self(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
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
    PT_CHECK(check_nranks(size));
    if (rank < 0 || rank >= size)
        return pt_error_set(PT_ERR_INVALID, "shm attach: rank %d is outside 0..%d", rank, size - 1);
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0)
        return pt_error_set(PT_ERR_IO, "shm attach: shm_open %s: %s", name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (size_t)sb.st_size < sizeof(pt_shm_job)) {
        close(fd);
        return pt_error_set(PT_ERR_FORMAT, "shm attach: %s is too small", name);
    }
    size_t total = (size_t)sb.st_size;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return pt_error_set(PT_ERR_NOMEM, "shm attach: mmap %s: %s", name, strerror(e));
    pt_shm_job *job = p;
    if (job->magic != SHM_MAGIC || job->total != total || job->nranks != size) {
        int n = job->nranks;
        munmap(p, total);
        return pt_error_set(PT_ERR_FORMAT, "shm attach: %s is not a partrain job of %d ranks (%d)",
                            name, size, n);
    }
    mark_running(job, rank, (int)getpid());
    pt_comm_options o = {opt ? opt->backend : NULL,
                         opt && opt->timeout_s > 0 ? opt->timeout_s : 10};
    const char *env = getenv("PT_COMM_TIMEOUT");
    if (env && atof(env) > 0) o.timeout_s = atof(env);
    const pt_comm_backend *be;
    void *ctx;
    int r, s;
    PT_CHECK(
        world_from(job, total, rank, o.timeout_s, 0, &be, &ctx, &r, &s)); /* unmaps on failure */
    return pt_comm_wrap(be, ctx, r, s, out);
}

/* ---- launcher side --------------------------------------------------------------------- */

void pt_shm_job_mark_exit(pt_shm_job *job, int rank, int wait_status, int abort_job) {
    int ok = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
    atomic_store(&job->ranks[rank].wstatus, wait_status);
    atomic_store(&job->ranks[rank].state, ok ? RANK_EXITED : RANK_FAILED);
    if (abort_job) {
        atomic_store(&job->dead_rank, rank);
        int expected = ABORT_NONE;
        atomic_compare_exchange_strong(&job->aborted, &expected, ABORT_DIED);
    }
    wake_all(job);
}

void pt_shm_job_interrupt(pt_shm_job *job) {
    int expected = ABORT_NONE;
    atomic_compare_exchange_strong(&job->aborted, &expected, ABORT_INTERRUPTED);
    wake_all(job);
}

int pt_shm_job_verdict(const pt_shm_job *job, int *culprit, int *noticed_by, const char **reason) {
    pt_shm_job *j = (pt_shm_job *)job;
    if (atomic_load_explicit(&j->aborted, memory_order_acquire) != ABORT_FAULT) return 0;
    *culprit = j->culprit;
    *noticed_by = j->noticed_by;
    *reason = j->verdict;
    return 1;
}

void pt_shm_job_rank_info(const pt_shm_job *job, int rank, int *cur_op, int *last_op, long *step,
                          const char **err) {
    pt_shm_job *j = (pt_shm_job *)job;
    *err = j->ranks[rank].err;
    *cur_op = atomic_load(&j->ranks[rank].cur_op);
    *last_op = atomic_load(&j->ranks[rank].last_op);
    *step = atomic_load(&j->ranks[rank].step);
}
