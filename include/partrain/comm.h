/* partrain communication: the one interface through which every strategy
 * talks to other ranks. Backends (shm, mpi; later nccl) live behind it and
 * are chosen at run time; a strategy never includes a backend's header.
 *
 * Lifecycle: pt_comm_new (world) -> pt_comm_split (groups of a mesh) ->
 * operations -> pt_comm_free (sub-communicators before the world).
 *
 * Data: reductions are over float32. Sharded collectives work IN PLACE on a
 * full-length buffer whose shards follow pt_comm_shard: the first
 * (count % size) ranks hold one element more. So a ZeRO bucket, shard or unit
 * is a slice of a flat buffer, never a copy.
 *
 * Ordering: like MPI and NCCL, every rank of a communicator must issue that
 * communicator's operations in the same order. Non-blocking operations are
 * queued and run in order by the communicator's own progress thread:
 * operations of different communicators never wait behind each other, and
 * ranks may interleave the operations of different communicators in any
 * order without deadlock. A blocking call on a communicator first lets that
 * communicator's queued operations finish.
 * Where the backend allows it (shm), queued receives run on a second
 * progress thread: an isend/irecv exchange of any size then progresses, a
 * blocking send does not wait for queued receives, nor a blocking receive
 * for other queued operations. Elsewhere (mpi) exchange large messages in
 * an order that cannot deadlock (even ranks send first).
 *
 * Failure: no call waits forever. When a peer dies, stalls (no heartbeat:
 * every rank process beats from a thread of its own, so a slow disk write
 * is alive and a SIGSTOPped process is not) or stops taking part for longer
 * than the timeout, the call returns PT_ERR_COMM or PT_ERR_TIMEOUT and the
 * last-error message names the rank at fault and the operation. The first
 * rank to notice a fault decides the verdict for the whole job: the others'
 * waits return at once with the same message. After an error the
 * communicator is unusable except for pt_comm_free.
 *
 * Flight recorder: every communicator keeps a ring of its last operations
 * (sequence number, op, bytes, peer, state, start and end time), always
 * on, and every rank publishes how far it got in each group. When a job
 * fault ends an operation, the job's one line names the laggards (the
 * ranks that never arrived) with the group, the op and its sequence
 * number, and what each laggard last completed; with pt_comm_set_flight
 * every surviving rank writes its rings (one JSON file per rank,
 * `partrain flight` merges them). docs/comm.md, "Flight recorder". */
#ifndef PARTRAIN_COMM_H
#define PARTRAIN_COMM_H

#include "partrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pt_comm pt_comm;
typedef struct pt_comm_req pt_comm_req;

typedef enum { PT_REDUCE_SUM, PT_REDUCE_AVG } pt_reduce_op;

/* The operations, for counters, timing and messages. */
typedef enum {
    PT_OP_ALLREDUCE,
    PT_OP_REDUCE_SCATTER,
    PT_OP_ALLGATHER,
    PT_OP_BROADCAST,
    PT_OP_SEND,
    PT_OP_RECV,
    PT_OP_BARRIER,
    PT_OP_COUNT
} pt_comm_op;

/* A communicator's settings, given once at creation (pt_comm_new,
 * pt_launch) and passed down to the backend and the launcher: nothing in
 * the comm layer reads them from the environment. `partrain train` fills
 * them from --backend and the config key comm.timeout. */
typedef struct {
    const char *backend; /* "auto" (NULL too), "shm", "mpi"; auto: shm under pt_launch, mpi
                            under mpirun, else a world of one */
    double timeout_s;    /* seconds before a silent peer is an error; <= 0: default 10 */
} pt_comm_options;

/* ---- lifecycle ---------------------------------------------------------------- */

/* The world communicator of this process. Under the shm launcher the rank and
 * size come from the launcher; under mpirun from MPI; otherwise it is a world
 * of one. Logs the backend chosen. */
pt_status pt_comm_new(pt_comm **out, const pt_comm_options *opt);
/* Split into sub-communicators: ranks with the same color form one, ordered
 * by (key, rank). Collective over c. *out is owned by the caller. */
pt_status pt_comm_split(pt_comm *c, int color, int key, pt_comm **out);
/* Bytes of PT_MEM_COMM every communicator holds from its creation (the
 * generic collectives' piece buffer): what the planner counts per group. */
size_t pt_comm_scratch_bytes(void);
/* Bytes of PT_MEM_COMM that backend `backend` ("shm", "mpi"; NULL or
 * "auto": the first in the registry, shm, which `partrain train --nproc`
 * runs) adds to a communicator of `size` ranks, once, at its first
 * collective `op` of `bytes` bytes: for the planner, which counts what the
 * runtime allocates. Every backend answers (shm: the single-copy chunk
 * scratch when that call goes single-copy, else 0); a backend that
 * allocates nothing lazily, or a name the build lacks, answers 0. */
size_t pt_comm_lazy_bytes(const char *backend, int size, pt_comm_op op, size_t bytes);
/* Waits for queued operations, then frees. NULL is a no-op. */
void pt_comm_free(pt_comm *c);

/* Where every surviving rank of this process's job writes its flight
 * recorder after a job fault (and on SIGTERM): a directory (ending in '/',
 * or one that exists: DIR/flight-rankR.json, made when missing) or a path
 * prefix (PREFIX-rankR.json); NULL or "": nowhere (the default). Copied;
 * for the whole process. `partrain train` passes the config key
 * log.flight. */
void pt_comm_set_flight(pt_comm *world, const char *path);
/* comm.check_order, a debug mode: before every collective on c (split
 * included) its members compare (op, bytes, root, sequence number) and
 * stop the job at the first mismatch, naming both ranks and both
 * operations (one small all-gather per collective). Communicators split
 * from c afterwards inherit it. Every member sets it alike, before its
 * next operation on c. PT_ERR_NOMEM when the exchange's buffer cannot be
 * had. */
pt_status pt_comm_set_check_order(pt_comm *c, int on);
/* Name c by its role in the job, for the flight recorder and failure
 * messages: role (at most 8 characters: "world", "aux", "dp", "tp", "pp",
 * "mp", ...) and the index of the group among the groups of that role
 * (< 0: none), so that c reads "dp group 1" or "aux". Every member names
 * its group alike. A communicator nobody named is called after its parent
 * and the split that made it ("world.3", "pp group 0.2"); the world is
 * "world". */
void pt_comm_set_name(pt_comm *c, const char *role, int index);

int pt_comm_rank(const pt_comm *c);
int pt_comm_size(const pt_comm *c);
const char *pt_comm_backend_name(const pt_comm *c);
/* 1 when st, which an operation of this process returned, is a job fault (a
 * peer died, stalled or stopped taking part, or the job was interrupted)
 * that another party reports in one line naming the rank at fault: the shm
 * launcher's summary, or under mpi the rank that noticed it first. The
 * caller then prints nothing of its own, so that the job shows one line.
 * 0: print the error as usual. */
int pt_comm_fault_reported(const pt_comm *c, pt_status st);
/* 1 when st, which an operation of this process returned (its message
 * the thread's last error), is a job fault that a restart may get past: a
 * rank died, stalled or did not take part. 0 for operations out of order
 * (comm.check_order: a restart meets them again), Ctrl-C, and any other
 * error. `partrain train` exits 3 for them under mpirun
 * (scripts/mpirun-restart.sh restarts on it). */
int pt_comm_fault_restartable(pt_status st);
/* Whether this process prints the job's error line: 1 for the first rank
 * of a launched shm job to ask (later ones get 0 and print nothing, so
 * that the job shows one line however many ranks hit the same error), and
 * the launcher then adds no summary of its own for a rank that exited
 * with a code (a rank killed by a signal is still named by it). 1 where
 * nothing arbitrates: a world of one, mpi, NULL. Ask only when about to
 * print. */
int pt_comm_claim_error_line(pt_comm *c);
/* Tell the communicator the caller's current training step (any value); a
 * failure report (the launcher's summary line) then names it. Cheap. */
void pt_comm_note_step(pt_comm *c, long step);
/* Seconds before a live peer that does not take part is an error on c (and
 * only c), from the next operation on; waits for c's queued operations
 * first; *old (may be NULL) gets the previous value. For phases where one
 * rank legitimately keeps the others waiting, such as rank 0 writing a
 * checkpoint. Liveness is separate and keeps the world's timeout: a dead
 * rank is reported at once, and a stalled one (its heartbeat stopped:
 * SIGSTOP, a frozen host) within pt_comm_options.timeout_s, whatever this
 * is set to. seconds <= 0: PT_ERR_INVALID. */
pt_status pt_comm_set_timeout(pt_comm *c, double seconds, double *old);

/* Shard of a count-element buffer held by `rank` of `size`: [*offset, *offset + *n). */
void pt_comm_shard(size_t count, int size, int rank, size_t *offset, size_t *n);

/* ---- blocking operations ---------------------------------------------------------- */

/* buf (count) := sum (or average) over ranks of buf. */
pt_status pt_comm_allreduce(pt_comm *c, float *buf, size_t count, pt_reduce_op op);
/* On return this rank's shard of buf (pt_comm_shard) holds the reduction of
 * everyone's buf over that shard; the rest of buf is unspecified. */
pt_status pt_comm_reduce_scatter(pt_comm *c, float *buf, size_t count, pt_reduce_op op);
/* On entry each rank's shard of buf is valid; on return all of buf is. */
pt_status pt_comm_allgather(pt_comm *c, float *buf, size_t count);
/* bytes of buf on root copied to every rank. */
pt_status pt_comm_broadcast(pt_comm *c, void *buf, size_t bytes, int root);
/* Point-to-point; messages between a pair with the same tag arrive in order. */
pt_status pt_comm_send(pt_comm *c, const void *buf, size_t bytes, int peer, int tag);
pt_status pt_comm_recv(pt_comm *c, void *buf, size_t bytes, int peer, int tag);
pt_status pt_comm_barrier(pt_comm *c);
/* Collective over c: every rank passes its own status and all return the
 * same one: PT_OK when every rank's was PT_OK, else the status of the
 * lowest rank that failed with that rank's message, marked shared
 * (pt_error_is_shared: print it once). Put one before and after a sequence
 * of collectives that a rank may fail to enter (an allocation that failed
 * on one rank), so that nobody waits in a collective the others skipped.
 * When the agreement itself cannot complete (a peer is gone), the comm
 * error, or this rank's own failure if it had one. */
pt_status pt_comm_agree(pt_comm *c, pt_status local);

/* ---- non-blocking operations -------------------------------------------------------
 * Same meaning as the blocking ones. The operation owns its buffer until
 * pt_comm_wait returns (or pt_comm_test reports done): do not touch it. */
pt_status pt_comm_iallreduce(pt_comm *c, float *buf, size_t count, pt_reduce_op op,
                             pt_comm_req **req);
pt_status pt_comm_ireduce_scatter(pt_comm *c, float *buf, size_t count, pt_reduce_op op,
                                  pt_comm_req **req);
pt_status pt_comm_iallgather(pt_comm *c, float *buf, size_t count, pt_comm_req **req);
pt_status pt_comm_ibroadcast(pt_comm *c, void *buf, size_t bytes, int root, pt_comm_req **req);
pt_status pt_comm_isend(pt_comm *c, const void *buf, size_t bytes, int peer, int tag,
                        pt_comm_req **req);
pt_status pt_comm_irecv(pt_comm *c, void *buf, size_t bytes, int peer, int tag, pt_comm_req **req);
/* Waits for completion, returns the operation's status and frees req. */
pt_status pt_comm_wait(pt_comm_req *req);
/* pt_comm_wait on *req and clear it; PT_OK when *req is NULL (nothing
 * posted, or waited for already). */
pt_status pt_comm_wait_once(pt_comm_req **req);
/* pt_comm_wait that also reports when the progress thread started and
 * finished the operation (pt_time_ns clock; either pointer may be NULL), for
 * traces and the time the communication thread spent on it. */
pt_status pt_comm_wait_timed(pt_comm_req *req, uint64_t *start_ns, uint64_t *end_ns);
/* *done := 1 when complete (then call pt_comm_wait to collect and free). */
pt_status pt_comm_test(pt_comm_req *req, int *done);

/* ---- measurement -------------------------------------------------------------------- */

typedef struct {
    uint64_t calls[PT_OP_COUNT];
    uint64_t bytes_sent[PT_OP_COUNT]; /* bytes this rank wrote toward others */
    uint64_t bytes_recv[PT_OP_COUNT]; /* bytes this rank read from others */
    uint64_t ns[PT_OP_COUNT];         /* time from start to completion */
    /* time the calling threads spent blocked in this communicator's
     * blocking calls and in pt_comm_wait(_timed) on its requests: its
     * exposed communication (ns above also counts the progress lanes' time,
     * hidden or not) */
    uint64_t blocked_ns;
} pt_comm_stats;

const char *pt_comm_op_name(pt_comm_op op);
/* Seconds per operation of op (allreduce, reduce_scatter, allgather,
 * broadcast from rank 0, or PT_OP_SEND: a message between ranks 0 and 1,
 * half a ping-pong's round trip) on bytes of buf: a few warm-up
 * operations, a barrier, iters timed ones; the mean over the ranks that ran
 * it, the same on every rank. Collective over c (every rank calls it with
 * the same arguments); buf's contents are overwritten. The measurement of
 * `partrain bench comm` and `partrain calibrate`. */
pt_status pt_comm_time(pt_comm *c, pt_comm_op op, float *buf, size_t bytes, int iters,
                       double *seconds);
/* Counters of this communicator since creation (or the last reset). */
void pt_comm_get_stats(const pt_comm *c, pt_comm_stats *out);
void pt_comm_reset_stats(pt_comm *c);
/* Bytes this rank has sent on c since its creation (or the last reset):
 * the sum of bytes_sent over every operation. NULL: 0. */
uint64_t pt_comm_sent_bytes(const pt_comm *c);
/* The bytes sent on c since *seen's reading of pt_comm_sent_bytes; *seen
 * becomes the new reading (a step's traffic, counted once). */
uint64_t pt_comm_sent_since(const pt_comm *c, uint64_t *seen);

/* ---- launcher (shm backend) ----------------------------------------------------------
 * Forks nproc ranks on this machine, each running fn(arg) with the shm world
 * prepared so that pt_comm_new in the child finds it. opt->timeout_s > 0
 * is the job's timeout (it wins over the ranks' own options, so that every
 * rank agrees); <= 0 (or opt NULL): the ranks' options decide. The parent supervises:
 * when a rank exits non-zero or is killed, it stops the others, prints one
 * summary line (rank, signal or exit code, last operation; for a fault a rank
 * noticed, such as a stalled or silent rank, the rank at fault, which it
 * kills), and removes the shared memory. Ctrl-C stops every rank. *exit_code is 0 when all ranks
 * exited 0. Called from a single-threaded parent. */
typedef int (*pt_rank_main)(void *arg);
pt_status pt_launch(int nproc, pt_rank_main fn, void *arg, const pt_comm_options *opt,
                    int *exit_code);

/* How a launched job ended, for a launcher that restarts failed jobs. */
typedef struct {
    int exit_code; /* as pt_launch's */
    int fault;     /* 1: a rank died (a signal, or a non-zero exit without an error line of its
                      own), stalled or stopped taking part: a restart may help. 0: success,
                      Ctrl-C, or an error a rank reported (it would happen again) */
    int culprit;   /* the world rank at fault (the first to die, or the verdict's), -1: none */
} pt_launch_result;
/* pt_launch, telling how the job ended in *res. */
pt_status pt_launch_job(int nproc, pt_rank_main fn, void *arg, const pt_comm_options *opt,
                        pt_launch_result *res);

/* The fault-injection knob PT_FAULT (docs/architecture.md, "Debugging
 * knobs") is ignored from here on, in this process and the ranks it forks
 * later: a restarted job runs clean. */
void pt_comm_faults_off(void);

#ifdef __cplusplus
}
#endif
#endif
