/* Private to the train layer: the checkpoint directory protocol used by the
 * trainer (ckpt_dir.c), state.json and the safetensors files of several
 * groups (checkpoint.c). The sliced writing and reading of checkpoints is
 * ckpt_impl.h's. */
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
 * (its path into tmp); files are written into it (every rank its slices of
 * the tensor files, ckpt_write.c; then pt_ckpt_write_state);
 * pt_ckpt_commit fsyncs it, renames it to DIR/step_NNNNNNNN (an
 * existing one is swapped out atomically, or moved aside where the file
 * system cannot swap) and points DIR/latest at it; pt_ckpt_abort removes it.
 * A crash at any point leaves `latest` naming a complete step directory
 * (ckpt_dir.c's opening comment walks through every point). */
pt_status pt_ckpt_begin(const char *dir, int step, char *tmp, size_t n);
/* Hands out tensor i (in order, 0 first) of the model being written:
 * its numel floats, valid until the next call. */
typedef pt_status (*pt_st_tensor_source)(void *arg, int i, const float **data);

/* state.json into tmp (pt_out), once every tensor file is in. */
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
/* A save passes point p: the process dies there when a test asked. */
void pt_ckpt_reached(pt_ckpt_point p);

/* Parse a step directory's state.json (caller deletes *out); _parse:
 * from its text, path naming it in messages. Then what it says: its
 * "config" (from the defaults, as pt_config_load_string), and the rest. */
pt_status pt_ckpt_read_state(const char *stepdir, cJSON **out);
pt_status pt_ckpt_parse_state(const char *text, const char *path, cJSON **out);
pt_status pt_ckpt_state_config(const cJSON *root, const char *path, pt_config *cfg);
typedef struct {
    int step, optim_t;
    uint64_t key, counter; /* data_rng */
    int rank_state;        /* 1: state.json has a rank_state (per-rank state saved) */
    int ranks, pipe_start;
} pt_ckpt_state;
pt_status pt_ckpt_state_fields(const cJSON *root, const char *path, pt_ckpt_state *s);

#define PT_CKPT_GROUP_MAX  160 /* 3 + 2 x 64 (staleness at most 64) + 2, with room */
#define PT_CKPT_PREFIX_MAX 48

/* The files of a checkpoint beside the three main ones (model, optim_m,
 * optim_v), and the groups of each: what the writers agreed on (rank 0
 * decides: sync, then replica<d> by d; groups sorted by name), and what
 * state.json's rank_state.files lists. */
#define PT_CKPT_FILE_MAX 32 /* a file's name, without ".safetensors" */
typedef struct {
    char name[PT_CKPT_FILE_MAX];
    int ng;
    char (*group)[PT_CKPT_PREFIX_MAX]; /* malloc'd */
    uint64_t data_start;               /* the header's bytes (writing only) */
} pt_ckpt_file;
typedef struct {
    pt_ckpt_file *f;
    int nf;
} pt_ckpt_files;
void pt_ckpt_files_deinit(pt_ckpt_files *fs);
/* state.json's rank_state.files ({"sync": ["outer.anchor", ...],
 * "replica1": [...]}): each file "sync" or "replica<d>", named once, with
 * 1 to PT_CKPT_GROUP_MAX groups of letters, digits, '.' and '_'. None:
 * empty. *legacy: 1 for the string "rank<r>.safetensors" of checkpoints
 * written before sliced saves (their per-rank files are not read). */
pt_status pt_ckpt_state_files(const cJSON *root, const char *path, pt_ckpt_files *out, int *legacy);

/* ---- safetensors files of several flat buffers ----
 * A group is one buffer laid out like the model's flat parameters, stored
 * as every model tensor under "<prefix>.<GPT-2 name>" (prefix "": the bare
 * names, as in model.safetensors). Group g's data follows group g-1's. */
typedef struct {
    char prefix[PT_CKPT_PREFIX_MAX];
    float *buf; /* lent */
} pt_ckpt_group;

/* Write groups to path atomically (pt_out: temp + fsync + rename). meta:
 * key, value, ... NULL: strings added to __metadata__. */
pt_status pt_st_write_groups(const char *path, const pt_model *m, const char *const *meta,
                             const pt_ckpt_group *groups, int ng);
/* The safetensors header (8-byte length, then the JSON padded with spaces
 * to a multiple of 8) of ng groups of m's tensors, group g's data at g x
 * the flat size, tensors in flat order; meta: key, value, ... NULL added
 * to __metadata__ beside format and n_head. malloc'd (*len bytes), NULL
 * when out of memory. */
unsigned char *pt_st_header_bytes(const pt_model *m, const char *const *meta,
                                  const pt_ckpt_group *groups, int ng, size_t *len);
/* Read every tensor of every group into its buf; everything is validated as
 * in pt_safetensors_load, and __metadata__ must hold the key, value pairs
 * of meta_want (NULL-terminated; NULL: no check). */
pt_status pt_st_read_groups(const char *path, const pt_model *m, const char *const *meta_want,
                            const pt_ckpt_group *groups, int ng);

/* Collective over aux (NULL: returns st): every rank learns whether every
 * rank's st was PT_OK; if not, every rank returns the lowest failing rank's
 * status and message, so that all of them report the same one line. */
pt_status pt_ckpt_agree(pt_comm *aux, pt_status st);

/* ---- the pipeline keys' checks (config_stage.c), run by
 * pt_config_validate_layout: one line each ---- */
pt_status pt_config_check_pipeline(const pt_config *c);
pt_status pt_config_check_stage_recompute(const pt_config *c);
pt_status pt_config_check_zero_whole(const pt_config *c);

#endif
