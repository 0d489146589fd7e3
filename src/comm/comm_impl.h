/* Private to the comm layer: a backend is a static const table of functions
 * plus an opaque context (STYLE rule 3). Only the wrappers in comm.c call the
 * table: they check arguments, count bytes and time, queue non-blocking
 * operations on the progress thread, and supply the generic fallback
 * (comm_generic.c, built on send/recv) for every NULL collective slot.
 *
 * A backend is correct as soon as send/recv are: every collective slot is
 * optional. Timeouts are the backend's job (it knows how to notice a dead
 * peer); it reports them as PT_ERR_TIMEOUT/PT_ERR_COMM with a message that
 * names the peer and the operation. */
#ifndef PT_COMM_IMPL_H
#define PT_COMM_IMPL_H

#include "partrain/comm.h"

typedef struct pt_comm_backend {
    const char *name;

    /* Required. Blocking point-to-point of bytes with a peer rank of this
     * communicator; ordered per (peer, tag). */
    pt_status (*send)(void *ctx, const void *buf, size_t bytes, int peer, int tag);
    pt_status (*recv)(void *ctx, void *buf, size_t bytes, int peer, int tag);

    /* Optional collectives (NULL: generic version on send/recv). Same
     * contracts as the public functions in comm.h. */
    pt_status (*allreduce)(void *ctx, float *buf, size_t count, pt_reduce_op op);
    pt_status (*reduce_scatter)(void *ctx, float *buf, size_t count, pt_reduce_op op);
    pt_status (*allgather)(void *ctx, float *buf, size_t count);
    pt_status (*broadcast)(void *ctx, void *buf, size_t bytes, int root);
    pt_status (*barrier)(void *ctx);

    /* Required. New context for the sub-communicator of (color, key);
     * collective over the parent. Sets *rank and *size of the new one. */
    pt_status (*split)(void *ctx, int color, int key, void **out_ctx, int *rank, int *size);

    /* Required. Release the context (the communicator is idle). */
    void (*free)(void *ctx);
} pt_comm_backend;

/* Backends register a constructor for the world communicator. It returns
 * PT_ERR_UNSUPPORTED when it does not apply to this process (e.g. mpi when
 * not started by mpirun), so that the registry can try the next one. */
typedef pt_status (*pt_comm_backend_world)(const pt_comm_options *opt, const pt_comm_backend **be,
                                           void **ctx, int *rank, int *size);

pt_status pt_comm_shm_world(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                            int *rank, int *size);
#ifdef PT_HAVE_MPI
pt_status pt_comm_mpi_world(const pt_comm_options *opt, const pt_comm_backend **be, void **ctx,
                            int *rank, int *size);
#endif

#endif
