/* Private to the train layer: the checkpoint directory protocol used by the
 * trainer (ckpt_dir.c), the safetensors files of several groups
 * (checkpoint.c) and the per-rank state files of the asynchronous
 * data-parallel modes (rank_state.c). */
#ifndef PT_TRAIN_IMPL_H
#define PT_TRAIN_IMPL_H

#include <cjson/cJSON.h>

#include "partrain/comm.h"
#include "partrain/train.h"

/* mkdir -p */
pt_status pt_mkdir_p(const char *dir);

/* ---- the checkpoint directory (ckpt_dir.c) ----
 * pt_ckpt_dir_open, before step 1, on the writer (rank 0): creates DIR if
 * missing, checks that it is a writable directory, takes an exclusive flock
 * on DIR/.lock (its fd into *lock_fd, held until pt_ckpt_dir_close; a
 * second job on DIR is refused, naming the holder's pid), then repairs what
 * killed saves left: `latest` naming a step directory that a fallback save
 * moved aside gets it back, and DIR/.tmp-*, .old-*, .del-* and
 * .latest.tmp* go. */
pt_status pt_ckpt_dir_open(const char *dir, int *lock_fd);
void pt_ckpt_dir_close(int lock_fd); /* -1: no-op */

/* ---- the step directory, in three moves ----
 * pt_ckpt_begin makes a fresh temporary directory DIR/.tmp-step_NNNNNNNN-PID
 * (its path into tmp); files are written into it (pt_ckpt_write_main,
 * pt_ckpt_write_state, rank files); pt_ckpt_commit fsyncs it, renames it to DIR/step_NNNNNNNN (an
 * existing one is swapped out atomically, or moved aside where the file
 * system cannot swap) and points DIR/latest at it; pt_ckpt_abort removes it.
 * A crash at any point leaves `latest` naming a complete step directory
 * (ckpt_dir.c's opening comment walks through every point). */
pt_status pt_ckpt_begin(const char *dir, int step, char *tmp, size_t n);
/* Hands out tensor i (in order, 0 first) of the model being written:
 * its numel floats, valid until the next call. */
typedef pt_status (*pt_st_tensor_source)(void *arg, int i, const float **data);

/* One main file: model.safetensors, optim_m or optim_v.safetensors (sgd:
 * its momentum buffer as m, or neither), from buf (full-length, laid out
 * like m's flat buffer) or, buf NULL, tensor by tensor from src. One at a
 * time, so that a save gathers and writes one tensor set (or one tensor)
 * before the next. Then state.json. */
typedef enum { PT_CKPT_MODEL, PT_CKPT_OPTIM_M, PT_CKPT_OPTIM_V } pt_ckpt_file;
pt_status pt_ckpt_write_main(const char *tmp, pt_ckpt_file which, const pt_model *m,
                             const float *buf, pt_st_tensor_source src, void *arg);
pt_status pt_ckpt_write_state(const char *tmp, const char *state_json);
pt_status pt_ckpt_commit(const char *dir, int step, const char *tmp);
void pt_ckpt_abort(const char *tmp);
/* checkpoint.keep: remove all but the `keep` newest step directories
 * (highest steps) of dir, never the one `latest` names; 0 keeps all.
 * Failures are warnings: a save that worked stays a success. */
void pt_ckpt_prune(const char *dir, int keep);

/* Tests only: the points of a save, in order, at which a test can make the
 * process die (_exit(PT_CKPT_CRASH_EXIT), no cleanup), as a kill would. */
typedef enum {
    PT_CKPT_AT_BEGUN = 1,          /* the temporary directory exists, empty */
    PT_CKPT_AT_PARTIAL,            /* model.safetensors written, the rest not */
    PT_CKPT_AT_SYNCED,             /* every file and the directory fsynced */
    PT_CKPT_AT_MOVED_ASIDE,        /* fallback re-save: old copy at .old-*, new not in place */
    PT_CKPT_AT_IN_PLACE,           /* step_N is the new directory */
    PT_CKPT_AT_DIR_SYNCED,         /* ... and DIR fsynced */
    PT_CKPT_AT_OLD_HALF_REMOVED,   /* re-save: one file of the old copy removed */
    PT_CKPT_AT_LATEST_WRITTEN,     /* DIR/.latest.tmp<pid>.<n> written, not renamed */
    PT_CKPT_AT_LATEST,             /* DIR/latest names the new step */
    PT_CKPT_AT_PRUNE_HALF_REMOVED, /* checkpoint.keep: one file of a pruned step removed */
    PT_CKPT_AT_COUNT
} pt_ckpt_point;
#define PT_CKPT_CRASH_EXIT 86
/* crash_at: a pt_ckpt_point, or -1 for none; never_exchange: 1 takes the
 * fallback path (as on a file system without RENAME_EXCHANGE). */
void pt_ckpt_test_hooks(int crash_at, int never_exchange);

/* Parse a step directory's state.json (caller deletes *out); _parse:
 * from its text, path naming it in messages. Then what it says: its
 * "config" (from the defaults, as pt_config_load_string), and the rest. */
pt_status pt_ckpt_read_state(const char *stepdir, cJSON **out);
pt_status pt_ckpt_parse_state(const char *text, const char *path, cJSON **out);
pt_status pt_ckpt_state_config(const cJSON *root, const char *path, pt_config *cfg);
typedef struct {
    int step, optim_t;
    uint64_t key, counter; /* data_rng */
    int rank_state;        /* 1: rank<r>.safetensors are there */
    int ranks, pipe_start;
} pt_ckpt_state;
pt_status pt_ckpt_state_fields(const cJSON *root, const char *path, pt_ckpt_state *s);

/* ---- safetensors files of several flat buffers ----
 * A group is one buffer laid out like the model's flat parameters, stored
 * as every model tensor under "<prefix>.<GPT-2 name>" (prefix "": the bare
 * names, as in model.safetensors). Group g's data follows group g-1's. */
#define PT_CKPT_GROUP_MAX  160 /* 3 + 2 x 64 (staleness at most 64) + 2, with room */
#define PT_CKPT_PREFIX_MAX 48
typedef struct {
    char prefix[PT_CKPT_PREFIX_MAX];
    float *buf; /* lent */
} pt_ckpt_group;

/* Hands out group g's data (the model's parameter count of floats) while
 * writing; *data stays valid until the next call. */
typedef pt_status (*pt_ckpt_source)(void *arg, int g, const float **data);

/* Write groups to path atomically (temp + fsync + rename). meta: key,
 * value, ... NULL: strings added to __metadata__. src NULL: each group's
 * buf. */
pt_status pt_st_write_groups(const char *path, const pt_model *m, const char *const *meta,
                             const pt_ckpt_group *groups, int ng, pt_ckpt_source src, void *arg);
/* pt_safetensors_save's file, tensor by tensor from src. */
pt_status pt_safetensors_save_from(const char *path, const pt_model *m, pt_st_tensor_source src,
                                   void *arg);
/* Read every tensor of every group into its buf; everything is validated as
 * in pt_safetensors_load, and __metadata__ must hold the key, value pairs
 * of meta_want (NULL-terminated; NULL: no check). */
pt_status pt_st_read_groups(const char *path, const pt_model *m, const char *const *meta_want,
                            const pt_ckpt_group *groups, int ng);

/* ---- per-rank state (rank_state.c) ----
 * Under stale and local_sgd the ranks hold state that differs, or that the
 * main files do not carry: it goes to one file per rank, rankR.safetensors,
 * in the step directory, written by rank 0 (each rank sends it its groups on
 * aux) so that the files join the checkpoint through the same temporary
 * directory and rename. Metadata: rank, ranks, step. */

/* Collective over aux: every rank passes its own groups (at most
 * PT_CKPT_GROUP_MAX); rank 0 writes tmp/rank<r>.safetensors for every r.
 * On rank 0, tmp NULL means the save already failed: the others' data is
 * received and dropped, so that no rank is left waiting. */
pt_status pt_ckpt_gather_rank_files(pt_comm *aux, const char *tmp, const pt_model *m, int step,
                                    const pt_ckpt_group *mine, int ng);
/* Read this rank's stepdir/rank<rank>.safetensors into groups, checking
 * its metadata (rank, ranks, step). Local: no communication. */
pt_status pt_ckpt_read_rank_file(const char *stepdir, const pt_model *m, int rank, int nranks,
                                 int step, const pt_ckpt_group *groups, int ng);
/* Collective over aux (NULL: returns st): every rank learns whether every
 * rank's st was PT_OK; if not, every rank returns the lowest failing rank's
 * status and message, so that all of them report the same one line. */
pt_status pt_ckpt_agree(pt_comm *aux, pt_status st);

#endif
