/* The arena of an shm job (layout: shm_impl.h): making it (an anonymous
 * mapping for the launcher, a named segment for pt_comm_shm_attach),
 * mapping a named one, the launcher's view of its ranks' state, and the
 * pool of address space that sub-communicators' regions come from.
 *
 * Not here: what runs in a region (shm_coll.c, shm_pipe.c, shm_cma.c,
 * shm_p2p.c), waiting (shm_wait.c), contexts and split (shm.c). */
#include "shm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHM_MAGIC 0x7074736du

/* Staging half per member: PT_SHM_STAGE_KB, by default 512 KiB, which keeps
 * a round of 2 ranks in L2/L3 and makes the two syncs per round cheap next
 * to the copy (see docs/comm.md). */
static size_t stage_bytes_default(void) {
    return (size_t)pt_knob_int("PT_SHM_STAGE_KB") << 10; /* 64 KiB..64 MiB */
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
    atomic_store(&job->error_line, -1);
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

pt_status shm_check_nranks(int nranks) {
    if (nranks < 1 || nranks > PT_SHM_MAX_RANKS)
        return pt_error_set(PT_ERR_INVALID, "shm: %d ranks is outside 1..%d", nranks,
                            PT_SHM_MAX_RANKS);
    return PT_OK;
}

pt_status pt_shm_job_map_anon(int nranks, double timeout_s, pt_shm_job **out) {
    *out = NULL;
    PT_CHECK(shm_check_nranks(nranks));
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
    PT_CHECK(shm_check_nranks(nranks));
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

pt_status shm_job_map_named(const char *name, int size, pt_shm_job **out) {
    *out = NULL;
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
    *out = job;
    return PT_OK;
}

/* Out of line: GCC 12 misjudges the size of a freshly mmapped job inline. */
__attribute__((noinline)) void shm_job_mark_running(pt_shm_job *job, int rank, int pid) {
    atomic_store(&job->ranks[rank].pid, pid);
    atomic_store(&job->ranks[rank].state, RANK_RUNNING);
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
uint64_t shm_pool_take(pt_shm_job *job, uint64_t need) {
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
void shm_pool_give(pt_shm_job *job, uint64_t off, uint64_t bytes) {
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

/* ---- the launcher's view of the job
 * --------------------------------------------------------------------- */

void pt_shm_job_mark_exit(pt_shm_job *job, int rank, int wait_status, int abort_job) {
    int ok = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
    atomic_store(&job->ranks[rank].wstatus, wait_status);
    atomic_store(&job->ranks[rank].state, ok ? RANK_EXITED : RANK_FAILED);
    if (abort_job) {
        atomic_store(&job->dead_rank, rank);
        int expected = ABORT_NONE;
        atomic_compare_exchange_strong(&job->aborted, &expected, ABORT_DIED);
    }
    shm_wake_all(job);
}

void pt_shm_job_interrupt(pt_shm_job *job) {
    int expected = ABORT_NONE;
    atomic_compare_exchange_strong(&job->aborted, &expected, ABORT_INTERRUPTED);
    shm_wake_all(job);
}

int pt_shm_job_verdict(const pt_shm_job *job, int *culprit, int *noticed_by, const char **reason) {
    pt_shm_job *j = (pt_shm_job *)job;
    if (atomic_load_explicit(&j->aborted, memory_order_acquire) != ABORT_FAULT) return 0;
    *culprit = j->culprit;
    *noticed_by = j->noticed_by;
    *reason = j->verdict;
    return 1;
}

double pt_shm_job_silence(const pt_shm_job *job, int w) {
    uint64_t b = atomic_load(&((pt_shm_job *)job)->ranks[w].beat), now = pt_time_ns();
    return b == 0 || b == BEAT_OFF || now <= b ? 0 : (double)(now - b) * 1e-9;
}

const pt_flight_table *pt_shm_job_flight(const pt_shm_job *job, int w) {
    return w >= 0 && w < job->nranks ? &job->flight[w] : NULL;
}

int pt_shm_job_verdict_named(const pt_shm_job *job) {
    return job->verdict_named;
}

int pt_shm_job_error_line(const pt_shm_job *job) {
    return atomic_load(&((pt_shm_job *)job)->error_line);
}

void pt_shm_job_rank_info(const pt_shm_job *job, int rank, int *cur_op, int *last_op, long *step,
                          const char **err) {
    pt_shm_job *j = (pt_shm_job *)job;
    *err = j->ranks[rank].err;
    *cur_op = atomic_load(&j->ranks[rank].cur_op);
    *last_op = atomic_load(&j->ranks[rank].last_op);
    *step = atomic_load(&j->ranks[rank].step);
}
