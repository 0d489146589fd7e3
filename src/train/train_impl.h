/* Private to the train layer: the checkpoint directory protocol used by the
 * trainer (checkpoint.c) and the per-rank state files of the asynchronous
 * data-parallel modes (rank_state.c). */
#ifndef PT_TRAIN_IMPL_H
#define PT_TRAIN_IMPL_H

#include <cjson/cJSON.h>

#include "partrain/comm.h"
#include "partrain/train.h"

/* mkdir -p */
pt_status pt_mkdir_p(const char *dir);

/* ---- the step directory, in three moves ----
 * pt_ckpt_begin makes a fresh temporary directory DIR/.tmp-step_NNNNNNNN-PID
 * (its path into tmp); files are written into it (pt_ckpt_write_main, rank
 * files); pt_ckpt_commit fsyncs it, renames it to DIR/step_NNNNNNNN (an
 * existing one moves aside first and goes only after the new one is in) and
 * points DIR/latest at it the same way; pt_ckpt_abort removes it. A crash
 * at any point leaves the previous checkpoint and `latest` intact. */
pt_status pt_ckpt_begin(const char *dir, int step, char *tmp, size_t n);
/* model.safetensors (params: full-length, laid out like m's flat buffer),
 * optim_m.safetensors when adam_m is non-NULL, optim_v.safetensors when
 * adam_v is (sgd: its momentum buffer as m, or neither), state.json. */
pt_status pt_ckpt_write_main(const char *tmp, const pt_model *m, const float *params,
                             const float *adam_m, const float *adam_v, const char *state_json);
pt_status pt_ckpt_commit(const char *dir, int step, const char *tmp);
void pt_ckpt_abort(const char *tmp);
/* Parse a step directory's state.json (caller deletes *out). */
pt_status pt_ckpt_read_state(const char *stepdir, cJSON **out);

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
