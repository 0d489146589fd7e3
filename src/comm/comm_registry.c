/* The backend registry: which backends this build has, in preference
 * order (shm before mpi), and the functions that choose among them: the
 * world communicator of this process (pt_comm_new), the launcher
 * (pt_launch) and the planner's question about a backend's lazy memory
 * (pt_comm_lazy_bytes). Each backend offers one descriptor
 * (pt_comm_backend_desc, comm_impl.h); this file is the only one that
 * names them, and the only #ifdef of the comm layer.
 *
 * Not here: what a communicator does once made (comm.c), any backend's
 * own code. */
#include "communicator_impl.h"

#include <string.h>

#ifndef PT_HAVE_MPI
/* Built without Open MPI: the name stays known, so that asking for it
 * says why it is missing rather than that there is no such backend. */
static int mpi_absent_available(void) {
    return 0;
}
static pt_status mpi_absent_world(const pt_comm_options *opt, const pt_comm_backend **be,
                                  void **ctx, int *rank, int *size) {
    (void)opt, (void)be, (void)ctx, (void)rank, (void)size;
    return pt_error_set(PT_ERR_UNSUPPORTED, "backend mpi: partrain was built without Open MPI");
}
static const pt_comm_backend_desc mpi_absent = {
    .name = "mpi", .available = mpi_absent_available, .world = mpi_absent_world};
#endif

/* In preference order: `auto` takes the first available one. */
static const pt_comm_backend_desc *const registry[] = {
    &pt_comm_shm_desc,
#ifdef PT_HAVE_MPI
    &pt_comm_mpi_desc,
#else
    &mpi_absent,
#endif
};
#define NREG ((int)(sizeof registry / sizeof registry[0]))

static const pt_comm_backend_desc *find(const char *name) {
    for (int i = 0; i < NREG; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    return NULL;
}

pt_comm_options pt_comm_options_resolve(const pt_comm_options *opt) {
    pt_comm_options o = {"auto", PT_COMM_DEFAULT_TIMEOUT_S};
    if (opt && opt->backend) o.backend = opt->backend;
    if (opt && opt->timeout_s > 0) o.timeout_s = opt->timeout_s;
    return o;
}

static pt_status unknown_backend(const char *name) {
    char names[256] = "auto";
    size_t k = strlen(names);
    for (int i = 0; i < NREG && k < sizeof names; i++)
        k += (size_t)snprintf(names + k, sizeof names - k, ", %s", registry[i]->name);
    return pt_error_set(PT_ERR_INVALID, "backend \"%s\" is not one of %s", name, names);
}

/* The flight recorder learns this process's world rank. */
static void settle(pt_comm *w) {
    comm_flight_configure(NULL, pt_comm_rank(w), pt_comm_size(w));
}

/* Wrap the world that d made and say which backend this process got. */
static pt_status adopt(const pt_comm_backend *be, void *ctx, int rank, int size,
                       const pt_comm_options *o, pt_comm **out) {
    PT_CHECK(pt_comm_wrap(be, ctx, rank, size, out));
    settle(*out);
    pt_log_set_rank(rank);
    PT_INFO("comm: backend %s, rank %d of %d, timeout %.3g s", be->name, rank, size, o->timeout_s);
    return PT_OK;
}

/* A world of one: the first backend that can make one. */
static pt_status world_of_one(const pt_comm_options *o, pt_comm **out) {
    for (int i = 0; i < NREG; i++) {
        if (!registry[i]->self) continue;
        const pt_comm_backend *be = NULL;
        void *ctx = NULL;
        int rank = 0, size = 1;
        PT_CHECK(registry[i]->self(o, &be, &ctx, &rank, &size));
        PT_CHECK(pt_comm_wrap(be, ctx, rank, size, out));
        settle(*out);
        PT_INFO("comm: no launcher and no mpirun: a world of one (backend %s)", be->name);
        return PT_OK;
    }
    return pt_error_set(PT_ERR_UNSUPPORTED, "no backend makes a world of one");
}

pt_status pt_comm_new(pt_comm **out, const pt_comm_options *opt) {
    if (!out) return pt_error_set(PT_ERR_INVALID, "pt_comm_new: out is NULL");
    *out = NULL;
    pt_comm_options o = pt_comm_options_resolve(opt);
    const pt_comm_backend_desc *want = NULL;
    if (strcmp(o.backend, "auto") != 0 && !(want = find(o.backend)))
        return unknown_backend(o.backend);
    for (int i = 0; i < NREG; i++) {
        const pt_comm_backend_desc *d = registry[i];
        if (want ? d != want : !d->available()) continue;
        const pt_comm_backend *be = NULL;
        void *ctx = NULL;
        int rank = 0, size = 1;
        pt_status st = d->world(&o, &be, &ctx, &rank, &size);
        if (st == PT_OK) return adopt(be, ctx, rank, size, &o, out);
        /* Asked for by name but not how this process was started: a
         * backend that makes worlds of one (shm) falls through to one,
         * another says why not. */
        if (st != PT_ERR_UNSUPPORTED || (want && !d->self)) return st;
    }
    return world_of_one(&o, out);
}

pt_status pt_launch_job(int nproc, pt_rank_main fn, void *arg, const pt_comm_options *opt,
                        pt_launch_result *res) {
    if (!res) return pt_error_set(PT_ERR_INVALID, "pt_launch: the result is NULL");
    *res = (pt_launch_result){1, 0, -1};
    for (int i = 0; i < NREG; i++)
        if (registry[i]->launch) return registry[i]->launch(nproc, fn, arg, opt, res);
    return pt_error_set(PT_ERR_UNSUPPORTED, "pt_launch: no backend can start ranks");
}

pt_status pt_launch(int nproc, pt_rank_main fn, void *arg, const pt_comm_options *opt,
                    int *exit_code) {
    if (!exit_code) return pt_error_set(PT_ERR_INVALID, "pt_launch: exit_code is NULL");
    pt_launch_result r;
    pt_status st = pt_launch_job(nproc, fn, arg, opt, &r);
    *exit_code = r.exit_code;
    return st;
}

size_t pt_comm_lazy_bytes(const char *backend, int size, pt_comm_op op, size_t bytes) {
    const pt_comm_backend_desc *d =
        !backend || !strcmp(backend, "auto") ? registry[0] : find(backend);
    return d && d->lazy_bytes ? d->lazy_bytes(size, op, bytes) : 0;
}
