/* Reading a sliced checkpoint back (ckpt_impl.h): every file the rank
 * needs is validated whole, as pt_safetensors_load validates a file (the
 * header's parsers, then every tensor of every group present with the
 * whole model's shape, nothing unexpected, the data section tiled to the
 * file's end, so that a truncated or foreign file is one line before any
 * read), and then only the runs of this rank's regions are read (pread),
 * at the offsets the header states (a GPT-2 file of another tensor order
 * loads too). A ZeRO rank reads its shard and nothing around it.
 *
 * Not here: which regions (ckpt_plan.c), the decision whether per-replica
 * state carries over (trainer_ckpt.c). */
#include "ckpt_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    FILE *f;
    const char *path;
    uint64_t *begin; /* [group x tensors + tensor]: the tensor's first byte in the file */
    int *group_of;   /* the set's slot -> group in this file (-1: another file) */
    int ntensors;
    uint64_t bytes;
} in_file;

static pt_status pread_all(const in_file *in, char *dst, uint64_t len, uint64_t off, int tensor,
                           const pt_model *full) {
    int fd = fileno(in->f);
    while (len) {
        size_t chunk = len > ((uint64_t)1 << 30) ? (size_t)1 << 30 : (size_t)len;
        ssize_t r = pread(fd, dst, chunk, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return pt_error_set(PT_ERR_IO, "%s: read error in tensor '%s': %s", in->path,
                                pt_model_tensor(full, tensor)->name,
                                r < 0 ? strerror(errno) : "file ends early (truncated)");
        dst += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return PT_OK;
}

typedef struct {
    in_file *in;
    const pt_ckpt_set *c;
} read_arg;

static pt_status read_run(void *arg, int slot, int tensor, size_t at, float *data, size_t len) {
    read_arg *a = arg;
    int g = a->in->group_of[slot];
    uint64_t off = a->in->begin[(size_t)g * (size_t)a->in->ntensors + (size_t)tensor] +
                   (uint64_t)at * sizeof(float);
    uint64_t bytes = (uint64_t)len * sizeof(float);
    a->in->bytes += bytes;
    return pread_all(a->in, (char *)data, bytes, off, tensor, a->c->full);
}

/* The groups file `name` holds: "" for a main file, else state.json's. */
static pt_status groups_of(const char *stepdir, const char *name, const pt_ckpt_files *declared,
                           pt_ckpt_group **out, int *ng) {
    *out = NULL;
    *ng = 0;
    const pt_ckpt_file *d = NULL;
    for (int i = 0; declared && i < declared->nf && !d; i++)
        if (!strcmp(declared->f[i].name, name)) d = &declared->f[i];
    if (!pt_ckpt_is_main(name) && !d)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s/state.json: its rank_state lists no %s.safetensors, which this "
                            "run's state needs (a checkpoint whose files disagree with it)",
                            stepdir, name);
    int n = d ? d->ng : 1;
    *out = calloc((size_t)n, sizeof **out);
    if (!*out) return pt_error_set(PT_ERR_NOMEM, "checkpoint: groups");
    for (int g = 0; d && g < n; g++)
        snprintf((*out)[g].prefix, sizeof(*out)[g].prefix, "%s", d->group[g]);
    *ng = n;
    return PT_OK;
}

/* Open and check file `name`; map the set's slots in it to its groups. */
static pt_status open_file(const char *stepdir, const char *name, const pt_ckpt_set *c,
                           const pt_ckpt_files *declared, int step, char *path, size_t pathn,
                           in_file *in) {
    memset(in, 0, sizeof *in);
    snprintf(path, pathn, "%s/%s.safetensors", stepdir, name);
    in->path = path;
    pt_ckpt_group *groups = NULL;
    int ng = 0;
    PT_CHECK(groups_of(stepdir, name, declared, &groups, &ng));
    pt_status st = PT_OK;
    in->group_of = malloc((size_t)(c->ns ? c->ns : 1) * sizeof *in->group_of);
    if (!in->group_of) st = pt_error_set(PT_ERR_NOMEM, "checkpoint: groups");
    for (int s = 0; st == PT_OK && s < c->ns; s++) {
        in->group_of[s] = -1;
        if (strcmp(c->s[s].file, name) != 0) continue;
        for (int g = 0; g < ng; g++)
            if (!strcmp(groups[g].prefix, c->s[s].group)) in->group_of[s] = g;
        if (in->group_of[s] < 0)
            st =
                pt_error_set(PT_ERR_FORMAT,
                             "%s/state.json: its rank_state lists no group '%s' in %s.safetensors, "
                             "which this run's state needs",
                             stepdir, c->s[s].group, name);
    }
    char s[16];
    snprintf(s, sizeof s, "%d", step);
    const char *want[] = {"partrain", "rank_state", "file", name, "step", s, NULL};
    pt_st_header h;
    memset(&h, 0, sizeof h);
    if (st == PT_OK) st = pt_st_read_header(path, &in->f, &h);
    if (st == PT_OK)
        st = pt_st_match(path, &h, c->full, pt_ckpt_is_main(name) ? NULL : want, groups, ng);
    in->ntensors = pt_model_num_tensors(c->full);
    size_t nb = (size_t)ng * (size_t)in->ntensors;
    if (st == PT_OK && !(in->begin = calloc(nb ? nb : 1, sizeof *in->begin)))
        st = pt_error_set(PT_ERR_NOMEM, "checkpoint: tensor offsets");
    for (int e = 0; st == PT_OK && e < h.n; e++) {
        const pt_st_entry *en = &h.entries[e];
        if (en->tensor >= 0)
            in->begin[(size_t)en->group * (size_t)in->ntensors + (size_t)en->tensor] =
                h.data_start + en->begin;
    }
    pt_st_header_deinit(&h);
    free(groups);
    return st;
}

static void close_file(in_file *in) {
    if (in->f) fclose(in->f);
    free(in->begin);
    free(in->group_of);
    memset(in, 0, sizeof *in);
}

pt_status pt_ckpt_read(const char *stepdir, const pt_ckpt_set *c, const pt_ckpt_files *declared,
                       int step, uint64_t *bytes_read) {
    pt_status st = PT_OK;
    uint64_t total = 0;
    for (int s = 0; st == PT_OK && s < c->ns; s++) {
        int seen = 0; /* each file once, at its first slot */
        for (int q = 0; q < s && !seen; q++) seen = !strcmp(c->s[q].file, c->s[s].file);
        if (seen) continue;
        char path[PT_CONFIG_STR_MAX + 128];
        in_file in;
        st = open_file(stepdir, c->s[s].file, c, declared, step, path, sizeof path, &in);
        read_arg a = {&in, c};
        for (int i = 0; st == PT_OK && i < c->nr; i++) {
            if (in.group_of[c->r[i].slot] < 0) continue;
            st = pt_ckpt_walk(c, i, 0, read_run, &a);
            pt_ckpt_zero_padding(c, i);
        }
        total += in.bytes;
        close_file(&in);
    }
    if (bytes_read) *bytes_read = total;
    return st;
}
