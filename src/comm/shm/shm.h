/* Private to the comm layer: what the shm backend offers beyond its world
 * constructor (comm_impl.h). Two ways to form an shm job:
 *
 *  1. pt_launch (comm.h; shm_launch) maps an anonymous MAP_SHARED arena
 *     before forking the ranks: invisible to other processes, gone when the
 *     last rank exits. pt_comm_new in a launched rank finds it (the
 *     descriptor's world, pt_comm_shm_desc).
 *  2. Processes started by someone else (the `partrain bench comm` ranks
 *     under mpirun) form an shm world through a NAMED segment:
 *
 *        rank 0:      pt_shm_job_create(size, timeout, name, sizeof name)
 *        all:         broadcast name (e.g. MPI_Bcast of PT_SHM_NAME_MAX bytes)
 *        all:         pt_comm_shm_attach(name, rank, size, &opt, &comm)
 *        all:         barrier (e.g. MPI_Barrier) -- every rank has mapped it
 *        rank 0:      pt_shm_job_unlink(name)   -- nothing left in /dev/shm
 *        ...          pt_comm_* on comm ...
 *        all:         pt_comm_free(comm)        -- unmaps
 *
 *     The creator owns the name and must unlink it on every path, error paths
 *     included (unlink right after the barrier keeps the window small). In
 *     this mode there is no launcher: a dead peer is noticed by its pid
 *     vanishing (kill(pid, 0)) or by the timeout.
 *
 * Not here: the backend itself (its files and private declarations:
 * shm_impl.h) and the launcher (shm_launch.c). */
#ifndef PT_COMM_SHM_H
#define PT_COMM_SHM_H

#include "comm_impl.h"

/* Longest segment name including the NUL. */
#define PT_SHM_NAME_MAX 64
/* Largest job the shm backend forms. */
#define PT_SHM_MAX_RANKS 64

/* Create a named segment (O_EXCL, mode 0600, random name "/partrain-...")
 * for a job of nranks ranks and write its name into name[name_len]
 * (name_len >= PT_SHM_NAME_MAX). timeout_s <= 0: the ranks' own options
 * decide. The caller owns the name: pt_shm_job_unlink it. */
pt_status pt_shm_job_create(int nranks, double timeout_s, char *name, size_t name_len);
/* Map the named segment as rank `rank` of `size` (size must equal the
 * creator's nranks) and return its world communicator (caller frees). */
pt_status pt_comm_shm_attach(const char *name, int rank, int size, const pt_comm_options *opt,
                             pt_comm **out);
/* Remove the name (existing mappings stay valid). */
pt_status pt_shm_job_unlink(const char *name);

/* ---- between the backend and shm_launch.c ---- */
typedef struct pt_shm_job pt_shm_job;
/* Map an anonymous arena for nranks (launcher, or a world of one). */
pt_status pt_shm_job_map_anon(int nranks, double timeout_s, pt_shm_job **out);
void pt_shm_job_unmap(pt_shm_job *job);
/* Launcher: record that a rank died / exited and wake every waiter. */
void pt_shm_job_mark_exit(pt_shm_job *job, int rank, int wait_status, int abort_job);
/* Launcher: stop the job (Ctrl-C): every waiter returns PT_ERR_INTERRUPTED. */
void pt_shm_job_interrupt(pt_shm_job *job);
/* Launcher: the operation and step rank was in, and its first comm error
 * ("" if none), for the summary line. */
void pt_shm_job_rank_info(const pt_shm_job *job, int rank, int *cur_op, int *last_op, long *step,
                          const char **err);
/* Launcher: 1 when a rank published the job's verdict on a fault it
 * noticed (a rank stalled, silent, or gone): *culprit is the world rank at
 * fault, *reason one sentence naming it. 0 otherwise. */
int pt_shm_job_verdict(const pt_shm_job *job, int *culprit, int *noticed_by, const char **reason);
/* Launcher: seconds since world rank w's last heartbeat (0: none yet, or
 * it stopped beating on purpose). */
double pt_shm_job_silence(const pt_shm_job *job, int w);
/* Launcher: world rank w's flight recorder progress table (NULL outside
 * the job). */
const pt_flight_table *pt_shm_job_flight(const pt_shm_job *job, int w);
/* Launcher: 1 when the verdict names the operation itself (no flight
 * analysis to add). */
int pt_shm_job_verdict_named(const pt_shm_job *job);
/* Launcher: the rank that printed the job's error line
 * (pt_comm_claim_error_line), -1 if none did. */
int pt_shm_job_error_line(const pt_shm_job *job);
/* In a forked rank: make the world constructor find this job as `rank`. */
void pt_shm_job_adopt(pt_shm_job *job, int rank, int pid);
/* The descriptor's launch: pt_launch_job (comm.h) on this machine. */
pt_status shm_launch(int nproc, pt_rank_main fn, void *arg, const pt_comm_options *opt,
                     pt_launch_result *res);

/* Single-copy collectives on shm communicator c: 1 on, -1 off (a member may
 * not read another's memory, or PT_SHM_CMA=0), 0 not decided yet (no
 * collective above 16 KiB so far); 0 for other backends. For tests. */
int pt_shm_single_copy(const pt_comm *c);

#endif
