/* Private to the sliced checkpoints of the train layer (ckpt_plan.c,
 * ckpt_write.c, ckpt_read.c, ckpt_async.c, trainer_ckpt.c): every rank
 * writes the slices it holds straight into the checkpoint's full-tensor
 * safetensors files at their offsets (pwrite), and reads back only what it
 * keeps (pread); nothing but metadata travels between ranks.
 *
 * The pieces, in order of use:
 *   set      what this rank holds: the strategies' regions (pt_state_visit
 *            over the stack) named by slot, a (file, group) pair;
 *   walk     a region as runs of consecutive elements of both layouts
 *            (pt_shard_run), all of it (loading) or this rank's write
 *            share of it (saving: its part of the region's dp copies, and
 *            of a tensor every tp rank holds whole, its tp part);
 *   pieces   the write shares as byte ranges of their groups, coalesced,
 *            made as they are written (nothing allocated), or staged
 *            (copied aside in walk order) for an asynchronous save;
 *   write    the collective save: the slots and byte counts to rank 0,
 *            which checks that they tile every file, creates the files
 *            (headers, sizes) in the protocol's temporary directory and
 *            sends back where every group lies; every rank pwrites and
 *            fsyncs its pieces; all agree; rank 0 commits (ckpt_dir.c);
 *   read     every file's header checked against the whole model's table,
 *            then every region's runs read.
 *
 * Not here: the directory protocol (ckpt_dir.c), what the trainer saves
 * beside the tensors (trainer_ckpt.c: state.json). */
#ifndef PT_CKPT_IMPL_H
#define PT_CKPT_IMPL_H

#include "parse_impl.h"
#include "train_impl.h"

#include "partrain/parallel.h"

/* Where a tensor set is stored: a file ("model", "optim_m", "optim_v",
 * "sync", "replica<d>") and a group in it (the prefix of its tensors'
 * names; "" in the three main files, whose names are GPT-2's). */
typedef struct {
    char file[PT_CKPT_FILE_MAX];
    char group[PT_CKPT_PREFIX_MAX];
} pt_ckpt_slot;

typedef struct {
    int slot;         /* into the set's slots */
    size_t off, n;    /* elements [off, off + n) of the local flat layout */
    float *data;      /* lent */
    int copy, copies; /* pt_state_region's */
} pt_ckpt_region;

/* This rank's state, by region. */
typedef struct {
    const pt_model *local, *full; /* lent: this rank's table and the whole model's */
    int tp, tp_rank;
    int *full_of; /* local tensor -> full tensor */
    pt_ckpt_region *r;
    int nr, rcap;
    pt_ckpt_slot *s;
    int ns, scap;
    /* 1: per-replica state to replica<d> (an exact continuation); 0: a
     * restart: every replica's params / optim_m / optim_v from the main
     * files, every other set left out */
    int per_replica;
} pt_ckpt_set;

pt_status pt_ckpt_set_init(pt_ckpt_set *c, const pt_model *local, const pt_model *full, int tp,
                           int tp_rank, int per_replica);
void pt_ckpt_set_deinit(pt_ckpt_set *c);
/* pt_state_visit's region callback (v->arg: the set). */
pt_status pt_ckpt_set_add(pt_state_visit *v, const pt_state_region *r);

/* Region i as runs: fn(arg, slot, full tensor, element index in the full
 * tensor, the run's local floats, count), in increasing local order.
 * share: only this rank's write share; else all of it. */
typedef pt_status (*pt_ckpt_run_fn)(void *arg, int slot, int tensor, size_t at, float *data,
                                    size_t len);
pt_status pt_ckpt_walk(const pt_ckpt_set *c, int i, int share, pt_ckpt_run_fn fn, void *arg);
/* Zero region i's padding (wte's rows past the vocabulary under tp): in no
 * file, so that a loaded slice does not depend on what the buffer held. */
void pt_ckpt_zero_padding(const pt_ckpt_set *c, int i);

/* ---- writing ---- */
/* A byte range of one group: this rank's, from src. */
typedef struct {
    int slot;
    uint64_t off, len; /* bytes into the slot's group */
    const char *src;   /* lent: the live buffer, or the staging buffer */
} pt_ckpt_piece;
typedef pt_status (*pt_ckpt_emit_fn)(void *arg, const pt_ckpt_piece *p);

/* This rank's write shares of every region of c as pieces, coalesced, in
 * walk order: from the live buffers (staging NULL), or from staging,
 * filled by pt_ckpt_stage. Nothing is allocated: a synchronous save holds
 * no copy of any tensor. */
pt_status pt_ckpt_emit(const pt_ckpt_set *c, const char *staging, pt_ckpt_emit_fn fn, void *arg);
/* The bytes this rank writes: in all (returned) and per slot (may be
 * NULL; c->ns entries). */
uint64_t pt_ckpt_share_bytes(const pt_ckpt_set *c, uint64_t *per_slot);
/* Copy the write shares into staging (pt_ckpt_share_bytes of them), in
 * walk order: what an asynchronous save writes from. */
void pt_ckpt_stage(const pt_ckpt_set *c, char *staging);

/* 1 for model, optim_m, optim_v: GPT-2's files, one group, "" */
int pt_ckpt_is_main(const char *file);

/* Rank 0, once every rank's pieces are written and synced: state.json
 * into tmp, then the commit (ckpt_dir.c). */
typedef pt_status (*pt_ckpt_commit_fn)(void *arg, const char *tmp, const pt_ckpt_files *files);

typedef struct {
    pt_comm *comm;   /* the ranks that write (NULL: one) */
    pt_status entry; /* this rank's status so far: a failure is every rank's, agreed before
                        anything is written (set and staging then unused) */
    const char *dir;
    int step;
    const pt_model *full;
    const pt_ckpt_set *set; /* this rank's regions and slots */
    const char *staging;    /* NULL: write from the live buffers */
    pt_ckpt_commit_fn commit;
    void *commit_arg;
    uint64_t *written; /* out (may be NULL): this rank's bytes */
} pt_ckpt_write_job;

/* The collective save (ckpt_write.c, the opening comment above): every
 * rank returns the same status, the first failing rank's one line. */
pt_status pt_ckpt_write(const pt_ckpt_write_job *j);

/* ---- reading ---- */
/* Fill every region of c from stepdir: each file the set names is checked
 * against the whole model (groups: "" for the main files, else as
 * state.json lists them in declared, whose __metadata__ must name the file
 * and the step), then only the set's runs are read; *bytes_read (may be
 * NULL) gets their bytes. Local: no communication. */
pt_status pt_ckpt_read(const char *stepdir, const pt_ckpt_set *c, const pt_ckpt_files *declared,
                       int step, uint64_t *bytes_read);

/* ---- asynchronous saves (ckpt_async.c) ----
 * A writer thread per save over its own communicator lane: the step
 * stages its pieces (pt_ckpt_pieces_stage) and hands the job over; the
 * next save, the end of the run and pt_trainer_free wait for it. */
typedef struct pt_ckpt_async pt_ckpt_async;
/* comm: the writers' lane (owned from here; NULL: one rank). */
pt_status pt_ckpt_async_new(pt_ckpt_async **out, pt_comm *comm);
void pt_ckpt_async_free(pt_ckpt_async *a); /* waits first */
pt_comm *pt_ckpt_async_comm(pt_ckpt_async *a);
/* The staging buffer for bytes (kept between saves, grown as needed;
 * PT_MEM_SCRATCH), NULL when out of memory. Only between saves. */
char *pt_ckpt_async_staging(pt_ckpt_async *a, uint64_t bytes);
/* Start j on the writer thread; the job's pointers (slots, pieces, commit
 * argument) are given up to it: job_free(job_arg) runs when it ends. */
pt_status pt_ckpt_async_start(pt_ckpt_async *a, const pt_ckpt_write_job *j,
                              void (*job_free)(void *), void *job_arg);
/* Wait for the save in flight; its status (PT_OK: none). */
pt_status pt_ckpt_async_wait(pt_ckpt_async *a);

#endif
