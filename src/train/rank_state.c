/* Per-rank checkpoint state: the files rank<r>.safetensors that let the
 * asynchronous data-parallel modes (stale, local_sgd) resume bitwise, where
 * ranks hold parameters, moments, in-flight gradient sums or outer state
 * that the main files (rank 0's model and moments) do not carry.
 *
 * Rank 0 writes every file, so that they enter the checkpoint through its
 * temporary directory and one rename with the rest, and so that no shared
 * file system is needed for writing. Rank r sends, on aux, a header (its
 * group count and prefixes) and then each group's buffer; rank 0 streams
 * one group at a time through a scratch buffer of one flat size into the
 * file. Rank 0 always receives everything, even after a failed write, so
 * that a rank is never left blocked in a send.
 *
 * Not here: which state a mode needs (the trainer builds the groups). */
#include "train_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_HEADER = 11, TAG_DATA = 12 };

typedef struct {
    int32_t ng;
    char prefix[PT_CKPT_GROUP_MAX][PT_CKPT_PREFIX_MAX];
} wire_header;

/* Rank 0's side of one peer's transfer. */
typedef struct {
    pt_comm *aux;
    int peer;
    int received; /* groups received so far */
    float *scratch;
    size_t n;
    pt_status comm; /* a failed receive (the communicator is then unusable) */
} recv_source;

static pt_status recv_group(void *arg, int g, const float **data) {
    recv_source *rs = arg;
    PT_ASSERT(g == rs->received);
    rs->comm = pt_comm_recv(rs->aux, rs->scratch, rs->n * sizeof(float), rs->peer, TAG_DATA);
    PT_CHECK(rs->comm);
    rs->received++;
    *data = rs->scratch;
    return PT_OK;
}

static void meta_strings(char (*s)[16], int rank, int nranks, int step) {
    snprintf(s[0], 16, "%d", rank);
    snprintf(s[1], 16, "%d", nranks);
    snprintf(s[2], 16, "%d", step);
}

static void rank_path(char *out, size_t n, const char *dir, int rank) {
    snprintf(out, n, "%s/rank%d.safetensors", dir, rank);
}

static pt_status write_rank_file(const char *tmp, const pt_model *m, int rank, int nranks, int step,
                                 const pt_ckpt_group *groups, int ng, pt_ckpt_source src,
                                 void *arg) {
    char path[PT_CONFIG_STR_MAX + 128], s[3][16];
    rank_path(path, sizeof path, tmp, rank);
    meta_strings(s, rank, nranks, step);
    const char *meta[] = {"partrain", "rank_state", "rank", s[0], "ranks",
                          s[1],       "step",       s[2],   NULL};
    return pt_st_write_groups(path, m, meta, groups, ng, src, arg);
}

/* Rank 0: receive peer's groups and write its file into tmp (tmp NULL: the
 * save already failed, only receive). Returns the communication status;
 * *write_st gets the file's. */
static pt_status receive_rank_file(pt_comm *aux, const char *tmp, const pt_model *m, int peer,
                                   int step, float *scratch, pt_status *write_st) {
    *write_st = PT_OK;
    wire_header h;
    PT_CHECK(pt_comm_recv(aux, &h, sizeof h, peer, TAG_HEADER));
    if (h.ng < 0 || h.ng > PT_CKPT_GROUP_MAX)
        return pt_error_set(PT_ERR_INTERNAL, "checkpoint: rank %d sent %d groups", peer, h.ng);
    pt_ckpt_group groups[PT_CKPT_GROUP_MAX];
    for (int g = 0; g < h.ng; g++) {
        memcpy(groups[g].prefix, h.prefix[g], PT_CKPT_PREFIX_MAX);
        groups[g].prefix[PT_CKPT_PREFIX_MAX - 1] = '\0';
        groups[g].buf = NULL;
    }
    recv_source rs = {aux, peer, 0, scratch, pt_model_num_params(m), PT_OK};
    if (tmp)
        *write_st =
            write_rank_file(tmp, m, peer, pt_comm_size(aux), step, groups, h.ng, recv_group, &rs);
    if (rs.comm != PT_OK) return rs.comm;
    while (rs.received < h.ng) { /* drain what the write did not take */
        const float *ignored;
        PT_CHECK(recv_group(&rs, rs.received, &ignored));
    }
    return PT_OK;
}

pt_status pt_ckpt_gather_rank_files(pt_comm *aux, const char *tmp, const pt_model *m, int step,
                                    const pt_ckpt_group *mine, int ng) {
    PT_ASSERT(ng >= 0 && ng <= PT_CKPT_GROUP_MAX);
    int rank = pt_comm_rank(aux), nranks = pt_comm_size(aux);
    size_t n = pt_model_num_params(m);
    /* Rank 0's scratch first, and everyone learns whether it has one: a
     * rank 0 without it would leave the others blocked in their sends. */
    float *scratch = NULL;
    pt_status have = PT_OK;
    if (rank == 0) {
        scratch = pt_mem_alloc(PT_MEM_SCRATCH, n * sizeof(float));
        if (!scratch) have = pt_error_set(PT_ERR_NOMEM, "checkpoint: per-rank state buffer");
    }
    have = pt_comm_agree(aux, have);
    if (have != PT_OK) {
        pt_mem_free(scratch);
        return have;
    }
    if (rank != 0) {
        wire_header h;
        memset(&h, 0, sizeof h);
        h.ng = ng;
        for (int g = 0; g < ng; g++)
            snprintf(h.prefix[g], PT_CKPT_PREFIX_MAX, "%s", mine[g].prefix);
        PT_CHECK(pt_comm_send(aux, &h, sizeof h, 0, TAG_HEADER));
        for (int g = 0; g < ng; g++)
            PT_CHECK(pt_comm_send(aux, mine[g].buf, n * sizeof(float), 0, TAG_DATA));
        return PT_OK;
    }
    pt_status st = tmp ? write_rank_file(tmp, m, 0, nranks, step, mine, ng, NULL, NULL) : PT_OK;
    for (int r = 1; r < nranks; r++) {
        pt_status ws = PT_OK;
        pt_status e = receive_rank_file(aux, st == PT_OK ? tmp : NULL, m, r, step, scratch, &ws);
        if (e != PT_OK) {
            st = e;
            break;
        }
        if (st == PT_OK) st = ws;
    }
    pt_mem_free(scratch);
    return st;
}

pt_status pt_ckpt_read_rank_file(const char *stepdir, const pt_model *m, int rank, int nranks,
                                 int step, const pt_ckpt_group *groups, int ng) {
    char path[PT_CONFIG_STR_MAX + 128], s[3][16];
    rank_path(path, sizeof path, stepdir, rank);
    meta_strings(s, rank, nranks, step);
    const char *want[] = {"partrain", "rank_state", "rank", s[0], "ranks",
                          s[1],       "step",       s[2],   NULL};
    return pt_st_read_groups(path, m, want, groups, ng);
}

pt_status pt_ckpt_agree(pt_comm *aux, pt_status st) {
    if (!aux) return st;
    return pt_comm_agree(aux, st);
}
