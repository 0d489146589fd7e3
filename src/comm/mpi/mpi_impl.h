/* Private to the mpi backend: the process-wide MPI state shared by the
 * backend (mpi_backend.c) and Open MPI's own collectives for the benchmark
 * (mpi_native.c). Includes mpi.h, so nothing outside src/comm/mpi includes
 * this header. */
#ifndef PT_COMM_MPI_IMPL_H
#define PT_COMM_MPI_IMPL_H

#include "comm_impl.h"

#include <mpi.h>

typedef struct {
    int initialized_here; /* we called MPI_Init_thread, so we finalize */
    int thread_level;     /* the level MPI provided */
    int serialize;        /* 1: every MPI call under pt_mpi_lock (level < MULTIPLE) */
    int failed;           /* an operation failed: skip MPI_Finalize */
    int finalized;
    int live; /* backend contexts not yet freed */
} pt_mpi_state;

extern pt_mpi_state pt_mpi_g;

/* Around every MPI call: a no-op under MPI_THREAD_MULTIPLE, else one
 * process-wide mutex (see mpi_backend.c). Never held across a wait. */
void pt_mpi_lock(void);
void pt_mpi_unlock(void);

/* 1 when this process was started by an MPI launcher (mpirun, or PMIx). */
int pt_mpi_under_mpirun(void);
/* Initialize MPI once per process (MPI_THREAD_MULTIPLE requested);
 * PT_ERR_UNSUPPORTED after MPI_Finalize. */
pt_status pt_mpi_start(void);

/* mpi_native.c: free its communicator; called before MPI_Finalize. */
void pt_mpi_native_release(void);

#endif
