/* Open MPI's own collectives, straight MPI calls on a duplicate of
 * MPI_COMM_WORLD, for `partrain bench comm` (backend name `mpi_native`): the
 * reference that partrain's backends are compared with. Nothing in training
 * uses this. The header does not include mpi.h, so the CLI can include it.
 *
 * The mpi backend is built only when Open MPI is found, so outside
 * mpi_native.c these are WEAK declarations: in a build without MPI their
 * addresses are NULL, and a caller checks `if (pt_mpi_native_init)` first.
 * (They live in mpi_native.o, which a weak reference does not pull out of
 * the library: mpi_backend.c's free calls pt_mpi_native_release, and the
 * comm registry always links mpi_backend.o in when the backend exists.) */
#ifndef PT_MPI_NATIVE_H
#define PT_MPI_NATIVE_H

#include "partrain/comm.h"

#ifdef PT_MPI_NATIVE_DEFINE
#define PT_MPI_NATIVE_WEAK
#else
#define PT_MPI_NATIVE_WEAK __attribute__((weak))
/* The shm world formed among these mpirun processes (rank and size as in
 * MPI_COMM_WORLD), so that shm and mpi can be measured side by side in one
 * run. Collective; nothing is left in /dev/shm. *out is the caller's. */
PT_MPI_NATIVE_WEAK pt_status pt_mpi_native_shm_world(const pt_comm_options *opt, pt_comm **out);

#endif

/* Initialize MPI if needed (under mpirun only; else PT_ERR_UNSUPPORTED) and
 * make the native communicator; sets this process's rank and the size. */
PT_MPI_NATIVE_WEAK pt_status pt_mpi_native_init(int *rank, int *size);
/* One in-place MPI collective over `bytes` of buf on all ranks: allreduce
 * (float sum), reduce_scatter (MPI_Reduce_scatter_block, bytes/size each),
 * allgather (MPI_Allgather in place), broadcast (root 0), barrier. */
PT_MPI_NATIVE_WEAK pt_status pt_mpi_native_run(pt_comm_op op, void *buf, size_t bytes);
/* *t := mean of *t over ranks (MPI_Allreduce on a double). */
PT_MPI_NATIVE_WEAK pt_status pt_mpi_native_time_avg(double *t);

/* The shm world formed among these mpirun processes (rank and size as in
 * MPI_COMM_WORLD), so that shm and mpi can be measured side by side in one
 * run. Collective; nothing is left in /dev/shm. *out is the caller's. */
PT_MPI_NATIVE_WEAK pt_status pt_mpi_native_shm_world(const pt_comm_options *opt, pt_comm **out);

#endif
