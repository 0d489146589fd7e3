/* Checkpoints: safetensors files with GPT-2's tensor names and shapes, and
 * reading a step directory's state.json and config.
 *
 * safetensors: 8-byte little-endian header length, a JSON header mapping
 * each name to {"dtype": "F32", "shape": [...], "data_offsets": [begin,
 * end]} (offsets relative to the end of the header; "__metadata__" allowed),
 * padded with spaces to 8 bytes, then the raw data. Our tensors are written
 * in flat-buffer order, so the data section is the flat buffer itself; a
 * file of several groups (rank<r>.safetensors) holds one such flat buffer
 * per group, its tensors named "<prefix>.<GPT-2 name>".
 *
 * Loading trusts nothing: the header is checked by the parsers of parse.c
 * (UTF-8, JSON, dtype, shape, offsets that tile the data section,
 * duplicates), then matched against the model (missing and unexpected
 * names, shapes); each failure is one line naming the file and the tensor.
 * This file only opens and reads. Assumes a little-endian host (x86-64,
 * arm64), as safetensors files are little-endian. Every file we write
 * states n_head in __metadata__ (a string, as the format requires), the one
 * architecture number that no tensor shape carries.
 *
 * Not here: the directory protocol (ckpt_dir.c: temporary directory,
 * renames, `latest`, lock, pruning), what goes into state.json and the rank
 * files (the trainer decides), moving per-rank state to rank 0
 * (rank_state.c). */
#include "parse_impl.h"
#include "train_impl.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- safetensors ---- */

/* "<prefix>.<name>", or the bare name for prefix "". */
static void group_name(char *out, size_t n, const char *prefix, const char *name) {
    if (prefix[0])
        snprintf(out, n, "%s.%s", prefix, name);
    else
        snprintf(out, n, "%s", name);
}

unsigned char *pt_st_header_bytes(const pt_model *m, const char *const *meta,
                                  const pt_ckpt_group *groups, int ng, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(md, "format", "pt");
    char nh[16];
    snprintf(nh, sizeof nh, "%d", pt_model_config_of(m)->n_head);
    cJSON_AddStringToObject(md, "n_head", nh);
    for (int i = 0; meta && meta[i] && meta[i + 1]; i += 2)
        cJSON_AddStringToObject(md, meta[i], meta[i + 1]);
    int n = pt_model_num_tensors(m);
    size_t P = pt_model_num_params(m);
    char name[160];
    for (int g = 0; g < ng; g++)
        for (int i = 0; i < n; i++) {
            const pt_param_info *t = pt_model_tensor(m, i);
            group_name(name, sizeof name, groups[g].prefix, t->name);
            cJSON *e = cJSON_AddObjectToObject(root, name);
            cJSON_AddStringToObject(e, "dtype", "F32");
            cJSON *shape = cJSON_AddArrayToObject(e, "shape");
            for (int d = 0; d < t->ndim; d++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
            size_t at = (size_t)g * P + t->offset;
            cJSON *off = cJSON_AddArrayToObject(e, "data_offsets");
            cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at * sizeof(float))));
            cJSON_AddItemToArray(off,
                                 cJSON_CreateNumber((double)((at + t->numel) * sizeof(float))));
        }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return NULL;
    size_t jlen = strlen(json), hlen = (jlen + 7) / 8 * 8;
    unsigned char *head = malloc(8 + hlen);
    if (head) {
        uint64_t h = hlen;
        for (int i = 0; i < 8; i++) head[i] = (unsigned char)(h >> (8 * i));
        memcpy(head + 8, json, jlen);
        memset(head + 8 + jlen, ' ', hlen - jlen);
        *len = 8 + hlen;
    }
    free(json);
    return head;
}

/* The header, then each group's flat buffer, into path through pt_out (a
 * temporary beside it, every write checked, fsynced, renamed over path); a
 * failure removes the temporary and names path. */
pt_status pt_st_write_groups(const char *path, const pt_model *m, const char *const *meta,
                             const pt_ckpt_group *groups, int ng) {
    size_t hlen = 0;
    unsigned char *head = pt_st_header_bytes(m, meta, groups, ng, &hlen);
    if (!head) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    pt_out *o = NULL;
    pt_status st = pt_out_open(&o, path);
    if (st == PT_OK) st = pt_out_write(o, head, hlen);
    free(head);
    size_t P = pt_model_num_params(m);
    for (int g = 0; st == PT_OK && g < ng; g++)
        st = pt_out_write(o, groups[g].buf, P * sizeof(float));
    if (st != PT_OK) {
        pt_out_abort(o);
        return st;
    }
    return pt_out_commit(o);
}

pt_status pt_safetensors_save(const char *path, const pt_model *m, const float *buf) {
    pt_ckpt_group g = {"", (float *)buf};
    return pt_st_write_groups(path, m, NULL, &g, 1);
}

pt_status pt_safetensors_load(const char *path, const pt_model *m, float *buf) {
    pt_ckpt_group g = {"", buf};
    return pt_st_read_groups(path, m, NULL, &g, 1);
}

pt_status pt_st_read_header(const char *path, FILE **fp, pt_st_header *h) {
    memset(h, 0, sizeof *h);
    *fp = NULL;
    FILE *f = NULL;
    uint64_t size = 0, hlen = 0;
    PT_CHECK(pt_file_open_regular(path, &f, &size));
    pt_status st = PT_OK;
    char *header = NULL;
    unsigned char lenb[8];
    if (size < 8 || fread(lenb, 1, 8, f) != 8) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: truncated (%llu bytes): not a safetensors file", path,
                          (unsigned long long)size);
        goto done;
    }
    PT_CHECK_GOTO(st, pt_st_header_len(path, lenb, size, &hlen), done);
    header = malloc(hlen + 1);
    if (!header) {
        st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (fread(header, 1, hlen, f) != hlen) {
        st = pt_error_set(PT_ERR_IO, "%s: read error in the header", path);
        goto done;
    }
    header[hlen] = '\0';
    st = pt_st_header_parse(path, header, (size_t)hlen, size, h);
done:
    free(header);
    if (st == PT_OK)
        *fp = f;
    else
        fclose(f);
    return st;
}

pt_status pt_st_read_groups(const char *path, const pt_model *m, const char *const *meta_want,
                            const pt_ckpt_group *groups, int ng) {
    FILE *f = NULL;
    pt_st_header h;
    PT_CHECK(pt_st_read_header(path, &f, &h));
    pt_status st = pt_st_match(path, &h, m, meta_want, groups, ng);
    /* entries are sorted by offset: one forward pass over the file */
    for (int i = 0; st == PT_OK && i < h.n; i++) {
        const pt_st_entry *e = &h.entries[i];
        if (!e->dst) continue;
        size_t count = (size_t)(e->end - e->begin) / sizeof(float);
        if (fseeko(f, (off_t)(h.data_start + e->begin), SEEK_SET) != 0 ||
            fread(e->dst, sizeof(float), count, f) != count)
            st = pt_error_set(PT_ERR_IO, "%s: read error in tensor '%s'", path, e->name);
    }
    pt_st_header_deinit(&h);
    fclose(f);
    return st;
}

/* ---- step directories' contents ---- */

pt_status pt_ckpt_parse_state(const char *text, const char *path, cJSON **out) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, NULL, 1); /* 1: nothing after the object */
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return pt_error_set(PT_ERR_FORMAT, "%s: corrupt (not one JSON object)", path);
    }
    *out = root;
    return PT_OK;
}

pt_status pt_ckpt_read_state(const char *stepdir, cJSON **out) {
    *out = NULL;
    char path[PT_CONFIG_STR_MAX + 64], *text;
    snprintf(path, sizeof path, "%s/state.json", stepdir);
    PT_CHECK(pt_read_text_file(path, (size_t)16 << 20, &text));
    pt_status st = pt_ckpt_parse_state(text, path, out);
    free(text);
    return st;
}

/* 1..16 hex digits, as state_json writes them (strtoull alone would take
 * a sign or leading blanks) */
static int parse_hex64(const cJSON *s, uint64_t *out) {
    if (!cJSON_IsString(s)) return 0;
    size_t n = strspn(s->valuestring, "0123456789abcdefABCDEF");
    if (n == 0 || n > 16 || s->valuestring[n]) return 0;
    *out = strtoull(s->valuestring, NULL, 16);
    return 1;
}

static int json_int(const cJSON *o, const char *name, int lo, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble >= 2e9) return 0;
    *out = (int)v->valuedouble;
    return 1;
}

pt_status pt_ckpt_state_fields(const cJSON *root, const char *path, pt_ckpt_state *s) {
    memset(s, 0, sizeof *s);
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "data_rng");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rank_state");
    const char *bad = NULL;
    if (!json_int(root, "step", 0, &s->step))
        bad = "step (an integer, 0 or more)";
    else if (!cJSON_IsObject(rng) ||
             !parse_hex64(cJSON_GetObjectItemCaseSensitive(rng, "key"), &s->key) ||
             !parse_hex64(cJSON_GetObjectItemCaseSensitive(rng, "counter"), &s->counter))
        bad = "data_rng (key and counter, 1 to 16 hex digits each)";
    else if (rs && !(cJSON_IsObject(rs) && json_int(rs, "ranks", 1, &s->ranks) &&
                     json_int(rs, "pipeline_start", 0, &s->pipe_start) && s->pipe_start <= s->step))
        bad = "rank_state (ranks 1 or more, pipeline_start no later than step)";
    if (bad) return pt_error_set(PT_ERR_FORMAT, "%s: missing or bad %s", path, bad);
    s->rank_state = rs != NULL;
    /* optim_t: AdamW's update count (stale delayed applies nothing in its
     * first k steps); older checkpoints lack it: the step */
    if (!json_int(root, "optim_t", 0, &s->optim_t)) s->optim_t = s->step;
    return PT_OK;
}

/* A rank-state file's name: "sync" or "replica<d>", d < 2^20. */
static int valid_file_name(const char *s) {
    if (!strcmp(s, "sync")) return 1;
    if (strncmp(s, "replica", 7) != 0) return 0;
    size_t n = strspn(s + 7, "0123456789");
    return n >= 1 && n <= 7 && !s[7 + n] && (n == 1 || s[7] != '0');
}

/* A group's name: what the strategies name their state ("params",
 * "stale.step_12.sum", "outer.anchor"): letters, digits, '.', '_'. */
static int valid_group_name(const char *s) {
    size_t n = strlen(s);
    return n >= 1 && n < PT_CKPT_PREFIX_MAX &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._") == n;
}

pt_status pt_ckpt_state_files(const cJSON *root, const char *path, pt_ckpt_files *out,
                              int *legacy) {
    memset(out, 0, sizeof *out);
    *legacy = 0;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rank_state");
    const cJSON *files = cJSON_IsObject(rs) ? cJSON_GetObjectItemCaseSensitive(rs, "files") : NULL;
    if (!files) return PT_OK;
    if (cJSON_IsString(files)) { /* rank<r>.safetensors: written before sliced checkpoints */
        *legacy = 1;
        return PT_OK;
    }
    int nf = cJSON_IsObject(files) ? cJSON_GetArraySize(files) : -1;
    if (nf < 0 || nf > 4096)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: rank_state.files is not an object of at most 4096 "
                            "files",
                            path);
    out->f = calloc((size_t)nf + 1, sizeof *out->f);
    if (!out->f) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    for (const cJSON *f = files->child; f; f = f->next) {
        const char *bad = NULL;
        int ng = cJSON_IsArray(f) ? cJSON_GetArraySize(f) : -1;
        if (strlen(f->string) >= PT_CKPT_FILE_MAX || !valid_file_name(f->string))
            bad = "a file name (sync or replica<d>)";
        else if (ng < 1 || ng > PT_CKPT_GROUP_MAX)
            bad = "an array of 1 to 160 group names";
        for (int i = 0; i < out->nf && !bad; i++)
            if (!strcmp(out->f[i].name, f->string)) bad = "a file named once";
        if (bad) {
            pt_ckpt_files_deinit(out);
            return pt_error_set(PT_ERR_FORMAT, "%s: rank_state.files: '%.64s' is not %s", path,
                                f->string, bad);
        }
        pt_ckpt_file *e = &out->f[out->nf++];
        snprintf(e->name, sizeof e->name, "%s", f->string);
        e->group = calloc((size_t)ng, sizeof *e->group);
        if (!e->group) {
            pt_ckpt_files_deinit(out);
            return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
        }
        for (const cJSON *g = f->child; g; g = g->next) {
            if (!cJSON_IsString(g) || !valid_group_name(g->valuestring)) {
                pt_ckpt_files_deinit(out);
                return pt_error_set(PT_ERR_FORMAT,
                                    "%s: rank_state.files: %s: a group is not a name of letters, "
                                    "digits, '.' and '_' under %d bytes",
                                    path, e->name, PT_CKPT_PREFIX_MAX);
            }
            snprintf(e->group[e->ng++], PT_CKPT_PREFIX_MAX, "%s", g->valuestring);
        }
    }
    return PT_OK;
}

pt_status pt_ckpt_state_config(const cJSON *root, const char *path, pt_config *cfg) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "config");
    char *text = cJSON_IsObject(c) ? cJSON_PrintUnformatted(c) : NULL;
    if (!text) return pt_error_set(PT_ERR_FORMAT, "%s: no \"config\" object", path);
    pt_config_defaults(cfg);
    pt_status st = pt_config_load_string(cfg, text, path);
    free(text);
    return st;
}

/* A bare safetensors checkpoint (GPT-2's published files have no
 * state.json): the architecture from the tensors' shapes and the head
 * count from __metadata__ (pt_st_model_config). */
static pt_status infer_config(const char *stepdir, pt_config *cfg) {
    char path[PT_CONFIG_STR_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", stepdir);
    FILE *f = NULL;
    pt_st_header h;
    pt_status st = pt_st_read_header(path, &f, &h);
    if (st != PT_OK) {
        if (st != PT_ERR_IO) return st;
        char why[512]; /* the message names model.safetensors: add why it was opened */
        snprintf(why, sizeof why, "%s", pt_error_message());
        return pt_error_set(PT_ERR_IO, "%s (and no state.json beside it)", why);
    }
    fclose(f);
    pt_config_defaults(cfg);
    st = pt_st_model_config(path, &h, &cfg->model);
    pt_st_header_deinit(&h);
    if (st != PT_OK) return st;
    PT_INFO("%s: no state.json; GPT-2 shapes: n_layer %d, n_embd %d, n_head %d, vocab %d, seq %d",
            stepdir, cfg->model.n_layer, cfg->model.n_embd, cfg->model.n_head,
            cfg->model.vocab_size, cfg->model.seq_len);
    return PT_OK;
}

pt_status pt_checkpoint_read_config(const char *stepdir, pt_config *cfg) {
    char state[PT_CONFIG_STR_MAX + 64];
    snprintf(state, sizeof state, "%s/state.json", stepdir);
    if (access(state, F_OK) != 0 && errno == ENOENT) return infer_config(stepdir, cfg);
    cJSON *root = NULL;
    PT_CHECK(pt_ckpt_read_state(stepdir, &root));
    pt_status st = pt_ckpt_state_config(root, state, cfg);
    cJSON_Delete(root);
    return st;
}
