/* Open MPI's own collectives, straight calls on a duplicate of
 * MPI_COMM_WORLD, for `partrain bench comm` (backend `mpi_native`, see
 * mpi_native.h), and the shm world that the benchmark forms among the same
 * mpirun processes. Nothing on the training path uses this file.
 *
 * Not here: timeouts (a benchmark run under mpirun is torn down by mpirun
 * when a rank dies). */
#include "mpi_impl.h"
#define PT_MPI_NATIVE_DEFINE
#include "mpi_native.h"
/* The shm helper API lands beside this file in the same release; until a
 * tree has it, the benchmark runs without the shm backend. */
#if defined(__has_include)
#if __has_include("shm/shm.h")
#include "shm/shm.h"
#define PT_MPI_HAVE_SHM_ATTACH 1
#endif
#endif

#include <limits.h>

static MPI_Comm native = MPI_COMM_NULL;

static pt_status native_fail(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    return pt_error_set(PT_ERR_COMM, "mpi_native %s: %s", what, s);
}

void pt_mpi_native_release(void) {
    if (native != MPI_COMM_NULL && !pt_mpi_g.failed) MPI_Comm_free(&native);
    native = MPI_COMM_NULL;
}

pt_status pt_mpi_native_init(int *rank, int *size) {
    if (!pt_mpi_under_mpirun())
        return pt_error_set(PT_ERR_UNSUPPORTED, "mpi_native: not under mpirun");
    if (native == MPI_COMM_NULL) {
        PT_CHECK(pt_mpi_start());
        if (MPI_Comm_dup(MPI_COMM_WORLD, &native) != MPI_SUCCESS)
            return pt_error_set(PT_ERR_COMM, "mpi_native: MPI_Comm_dup failed");
        MPI_Comm_set_errhandler(native, MPI_ERRORS_RETURN);
    }
    MPI_Comm_rank(native, rank);
    MPI_Comm_size(native, size);
    return PT_OK;
}

pt_status pt_mpi_native_run(pt_comm_op op, void *buf, size_t bytes) {
    if (native == MPI_COMM_NULL)
        return pt_error_set(PT_ERR_INVALID, "mpi_native: pt_mpi_native_init first");
    if (bytes / sizeof(float) > INT_MAX)
        return pt_error_set(PT_ERR_INVALID, "mpi_native: %zu bytes too large", bytes);
    int n = 0, me = 0, rc;
    MPI_Comm_size(native, &n);
    MPI_Comm_rank(native, &me);
    int count = (int)(bytes / sizeof(float));
    pt_mpi_lock();
    switch (op) {
    case PT_OP_ALLREDUCE:
        rc = MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, native);
        break;
    case PT_OP_REDUCE_SCATTER: {
        /* Equal blocks (count / n each), as nccl-tests and Open MPI's own
         * benchmarks measure it. */
        rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, buf, count / n, MPI_FLOAT, MPI_SUM, native);
        break;
    }
    case PT_OP_ALLGATHER:
        rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count / n, MPI_FLOAT, native);
        break;
    case PT_OP_BROADCAST:
        rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, native);
        break;
    case PT_OP_BARRIER:
        rc = MPI_Barrier(native);
        break;
    default:
        pt_mpi_unlock();
        return pt_error_set(PT_ERR_INVALID, "mpi_native: op %d not benchmarked", (int)op);
    }
    pt_mpi_unlock();
    (void)me;
    if (rc != MPI_SUCCESS) return native_fail(rc, "collective");
    return PT_OK;
}

pt_status pt_mpi_native_time_avg(double *t) {
    if (native == MPI_COMM_NULL)
        return pt_error_set(PT_ERR_INVALID, "mpi_native: pt_mpi_native_init first");
    int n = 1;
    MPI_Comm_size(native, &n);
    pt_mpi_lock();
    int rc = MPI_Allreduce(MPI_IN_PLACE, t, 1, MPI_DOUBLE, MPI_SUM, native);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) return native_fail(rc, "time average");
    *t /= n;
    return PT_OK;
}

/* The shm world among the processes of this mpirun job (shm/shm.h, mode 2):
 * rank 0 creates the named segment, the name travels by MPI_Bcast, everyone
 * attaches, all agree on the outcome, and rank 0 unlinks the name at once,
 * on every path, so nothing is left in /dev/shm. */
pt_status pt_mpi_native_shm_world(const pt_comm_options *opt, pt_comm **out) {
    *out = NULL;
#ifndef PT_MPI_HAVE_SHM_ATTACH
    (void)opt;
    return pt_error_set(PT_ERR_UNSUPPORTED, "shm world under mpirun: this build has no shm attach");
#else
    if (native == MPI_COMM_NULL)
        return pt_error_set(PT_ERR_INVALID, "mpi_native: pt_mpi_native_init first");
    int rank, size;
    MPI_Comm_rank(native, &rank);
    MPI_Comm_size(native, &size);
    struct {
        int ok;
        char name[PT_SHM_NAME_MAX];
    } msg = {0, ""};
    pt_status st = PT_OK;
    if (rank == 0) {
        st = pt_shm_job_create(size, opt ? opt->timeout_s : 0, msg.name, sizeof msg.name);
        msg.ok = st == PT_OK;
    }
    pt_mpi_lock();
    int rc = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, native);
    pt_mpi_unlock();
    if (rc != MPI_SUCCESS) {
        if (rank == 0 && msg.ok) pt_shm_job_unlink(msg.name);
        return native_fail(rc, "shm name broadcast");
    }
    if (!msg.ok)
        return rank == 0
                   ? st
                   : pt_error_set(PT_ERR_COMM, "shm world: rank 0 could not create the segment");
    pt_comm *c = NULL;
    st = pt_comm_shm_attach(msg.name, rank, size, opt, &c);
    int ok = st == PT_OK, all_ok = 0;
    pt_mpi_lock();
    rc = MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, native); /* also the barrier */
    pt_mpi_unlock();
    if (rank == 0) pt_shm_job_unlink(msg.name);
    if (rc != MPI_SUCCESS || !all_ok) {
        pt_comm_free(c);
        if (st != PT_OK) return st;
        return rc != MPI_SUCCESS
                   ? native_fail(rc, "shm attach agreement")
                   : pt_error_set(PT_ERR_COMM, "shm world: another rank failed to attach");
    }
    *out = c;
    return PT_OK;
#endif
}
