/* Private to the comm layer: the flight recorder (docs/comm.md, "Flight
 * recorder"), its pieces that cross files.
 *
 * RING: every communicator keeps its last FL_RING operations, each with the
 * issue number (its place in the ring), the sequence number (#N: the N-th
 * collective of the communicator, the same on every member; point-to-point
 * operations are numbered apart, per rank), op, bytes, peer or root, tag,
 * state (queued, running, done, failed) and the times it was queued,
 * started and ended. The issuing thread fills a record, the thread that
 * runs the operation (the caller's, or a progress lane) moves its state:
 * a few plain stores, no lock (an operation is issued by one thread at a
 * time, comm.h).
 *
 * PROGRESS TABLE: one per rank (pt_flight_table), one slot per live
 * communicator of the process: what the other ranks need to tell who never
 * arrived. The collective # last entered (started) and completed (done),
 * the op and bytes of each, the last operation completed (any kind) and
 * when, the point-to-point in flight. Written by the rank's own threads
 * with relaxed atomic stores (a handful per operation), read by anyone at
 * fault time (a torn read there costs a word of a message, never a
 * decision). Where a rank's table lives is the backend's choice
 * (pt_comm_backend.flight_table): shm keeps every rank's in the job's
 * arena, where the launcher reads them after the job; mpi keeps its own in
 * process memory and sends it with every heartbeat, so that each rank
 * holds the others' as of their last beat. Without a backend table the
 * core keeps one in process memory.
 *
 * Not here: the wrappers that record (comm.c), the lanes (comm_lanes.c),
 * order checking (comm_order.c), fault injection (comm_fault.c). */
#ifndef PT_COMM_FLIGHT_IMPL_H
#define PT_COMM_FLIGHT_IMPL_H

#include "partrain/comm.h"

#include <stdatomic.h>
#include <stdint.h>

/* Records per communicator (a power of two). */
#define FL_RING 64
/* Slots of a rank's progress table: communicators alive at once. */
#define PT_FLIGHT_SLOTS 32
/* Longest role name (pt_comm_set_name), without the NUL. */
#define FL_ROLE_MAX 8

enum { FL_NONE = 0, FL_QUEUED, FL_RUNNING, FL_DONE, FL_FAILED };
/* split, as an operation of the recorder (a collective of the parent). */
#define FL_OP_SPLIT PT_OP_COUNT

/* ---- the progress table ---- */

typedef struct {
    _Atomic uint64_t id;   /* the communicator's id (the same on every member); 0: free */
    _Atomic uint64_t role; /* up to FL_ROLE_MAX characters, NUL-padded */
    _Atomic int32_t index, sub, size, rank; /* group index (-1: none), split number (0: none) */
    _Atomic uint64_t started;               /* collective # last entered */
    _Atomic int32_t cur_op, cur_state;      /* its op and state */
    _Atomic uint64_t cur_bytes, t_started;  /* its bytes, and when it started (pt_time_ns) */
    _Atomic uint64_t done;                  /* collective # last completed */
    _Atomic int32_t last_op, last_peer;     /* the last operation completed, any kind */
    _Atomic uint64_t last_seq, last_bytes, last_end;
    _Atomic int32_t p2p_op, p2p_state, p2p_peer; /* the point-to-point entered last */
    _Atomic int32_t freed; /* the communicator was freed: its last progress, kept while
                              the slot is not needed (a rank that left early shows so) */
    _Atomic uint64_t p2p_seq, p2p_bytes;
} pt_flight_slot;

typedef struct pt_flight_table {
    pt_flight_slot slot[PT_FLIGHT_SLOTS];
} pt_flight_table;

/* A slot as plain values (pt_flight_read), what the analysis works on and
 * what a heartbeat carries. */
typedef struct {
    uint64_t id;
    char role[FL_ROLE_MAX + 1];
    int32_t index, sub, size, rank;
    uint64_t started, cur_bytes, t_started, done;
    int32_t cur_op, cur_state;
    int32_t last_op, last_peer;
    uint64_t last_seq, last_bytes, last_end;
    int32_t p2p_op, p2p_state, p2p_peer, freed;
    uint64_t p2p_seq, p2p_bytes;
} pt_flight_snap;

/* s := slot's values; 0 when the slot was never used or is free. */
int pt_flight_read(const pt_flight_slot *slot, pt_flight_snap *s);
/* slot := s (a heartbeat's copy of a peer's slot). */
void pt_flight_write(pt_flight_slot *slot, const pt_flight_snap *s);
/* The used slots of t as snapshots, in slot order, into out[PT_FLIGHT_SLOTS]
 * (a heartbeat's payload); returns how many, up to the last used slot
 * (free ones in between have id 0). */
int pt_flight_pack(const pt_flight_table *t, pt_flight_snap *out);
/* t := the n snapshots of pt_flight_pack (the rest of t freed). */
void pt_flight_unpack(pt_flight_table *t, const pt_flight_snap *in, int n);

/* "dp group 1", "aux", "world.3" for a role, index and split number. */
void pt_flight_group_name(const char *role, int index, int sub, char *out, size_t len);
/* "4 MiB", "1.5 KiB", "12 B". */
void pt_flight_bytes(uint64_t bytes, char *out, size_t len);
/* The op's name, split included. */
const char *pt_flight_op_name(int op);

/* ---- what went wrong, in words (comm_flight_why.c) ---- */

/* World rank w's progress table as this process knows it (NULL: unknown). */
typedef const pt_flight_table *(*pt_flight_get)(void *arg, int w);
/* The stuck operation of a job, from the tables of its nranks ranks: of
 * the collectives in flight, the one most ranks wait in (the earliest
 * begun, of equals), then the laggards, the members that never entered it,
 * each with what it last completed and where it waits, e.g.
 *   "dp group 1: allreduce #4812 (4 MiB): ranks 5, 7 never arrived; rank 5
 *    last completed tp allreduce #9921, waits in aux allreduce #12"
 * When every member arrived: the members whose operation #N differs (out
 * of order), else "every rank arrived" and, culprit >= 0, that it stopped
 * there. With no collective in flight, the point-to-point one (whom it
 * waits for). Returns 0 (out "") when nothing is in flight anywhere. */
int pt_flight_describe(pt_flight_get get, void *arg, int nranks, int culprit, char *out,
                       size_t len);

/* The first laggard of the operation pt_flight_describe would name: the
 * lowest world rank that never entered the collective the most ranks wait
 * in; -1 when none (nothing in flight, or every member arrived). */
int pt_flight_culprit(pt_flight_get get, void *arg, int nranks);

/* ---- dumps (comm_flight_dump.c) ---- */

/* The process's world (the registry, at the world's creation), and where
 * dumps go (path: pt_comm_set_flight's, copied; NULL: as it was). */
void comm_flight_configure(const char *path, int world_rank, int world_size);
/* A backend's word at SIGTERM, before the dump (mpi: the job's line when
 * no rank said one). Not called in a process that was stopped until just
 * now (it is no survivor: no word, no dump). Set before the world is made
 * (its descriptor's world). */
void comm_flight_on_term(void (*fn)(void));
/* This process's world rank (-1 before a world exists). */
int comm_flight_world_rank(void);
/* Write every live communicator's ring to the flight path (one JSON file
 * for this rank, atomically), once per process; reason goes into the
 * file. No-op without a flight path or after the first dump. Errors: one
 * warning line. Any thread. */
void comm_flight_dump(const char *reason);

#endif
