/* Checkpoints: safetensors files with GPT-2's tensor names and shapes, and
 * the directory protocol that makes saving atomic.
 *
 * safetensors: 8-byte little-endian header length, a JSON header mapping
 * each name to {"dtype": "F32", "shape": [...], "data_offsets": [begin,
 * end]} (offsets relative to the end of the header; "__metadata__" allowed),
 * padded with spaces to 8 bytes, then the raw data. Our tensors are written
 * in flat-buffer order, so the data section is the flat buffer itself; a
 * file of several groups (rank<r>.safetensors) holds one such flat buffer
 * per group, its tensors named "<prefix>.<GPT-2 name>".
 *
 * Loading trusts nothing: header length, JSON, dtype, shape, offsets
 * (inside the file, matching the shape), duplicates, missing and unexpected
 * names are all checked, and each failure is one line naming the file and
 * the tensor. Assumes a little-endian host (x86-64, arm64), as safetensors
 * files are little-endian.
 *
 * Step directories are written in three moves (begin: a fresh temporary
 * directory; the files; commit: fsync and rename into place, then
 * `latest`), so that files written by several parties (rank 0's main files,
 * the rank files) still appear at once.
 *
 * Not here: what goes into state.json and the rank files (the trainer
 * decides), moving per-rank state to rank 0 (rank_state.c). */
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

#define MAX_HEADER (100u << 20)

/* ---- small file helpers ---- */

static pt_status fsync_path(const char *path, int dir) {
    int fd = open(path, dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0) return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && !(dir && (err == EINVAL || err == EROFS)))
        return pt_error_set(PT_ERR_IO, "%s: fsync: %s", path, strerror(err));
    return PT_OK;
}

/* Write bytes to path, flush and fsync (not atomic by itself). */
static pt_status write_file(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    if (!f) return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    int ok = (na == 0 || fwrite(a, 1, na, f) == na) && (nb == 0 || fwrite(b, 1, nb, f) == nb) &&
             fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        unlink(path);
        return pt_error_set(PT_ERR_IO, "%s: write failed: %s", path, strerror(err));
    }
    return PT_OK;
}

pt_status pt_mkdir_p(const char *dir) {
    char buf[PT_CONFIG_STR_MAX + 64];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pt_error_set(PT_ERR_IO, "%s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return pt_error_set(PT_ERR_IO, "%s: %s", buf, strerror(errno));
    struct stat sb;
    if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return pt_error_set(PT_ERR_IO, "%s: not a directory", buf);
    return PT_OK;
}

/* Remove a directory holding only plain files (ours). */
static void remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[PT_CONFIG_STR_MAX + 512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* ---- safetensors ---- */

/* "<prefix>.<name>", or the bare name for prefix "". */
static void group_name(char *out, size_t n, const char *prefix, const char *name) {
    if (prefix[0])
        snprintf(out, n, "%s.%s", prefix, name);
    else
        snprintf(out, n, "%s", name);
}

/* The safetensors header (8-byte length + JSON padded to 8 bytes) of ng
 * groups of the model's tensors, group g's data at g x the flat size. */
static unsigned char *groups_header(const pt_model *m, const char *const *meta,
                                    const pt_ckpt_group *groups, int ng, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(md, "format", "pt");
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

/* Header, then each group's data as src hands it out, flushed and fsynced
 * (not atomic by itself). */
static pt_status write_groups_file(const char *path, const pt_model *m, const unsigned char *head,
                                   size_t hlen, const pt_ckpt_group *groups, int ng,
                                   pt_ckpt_source src, void *arg) {
    FILE *f = fopen(path, "wb");
    if (!f) return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    size_t P = pt_model_num_params(m);
    pt_status st = PT_OK;
    int ok = fwrite(head, 1, hlen, f) == hlen;
    for (int g = 0; ok && g < ng; g++) {
        const float *data = groups[g].buf;
        if (src && (st = src(arg, g, &data)) != PT_OK) break;
        ok = fwrite(data, sizeof(float), P, f) == P;
    }
    int err = errno;
    ok = ok && st == PT_OK && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    if (ok) return PT_OK;
    unlink(path);
    if (st != PT_OK) return st;
    return pt_error_set(PT_ERR_IO, "%s: write failed: %s", path, strerror(err));
}

pt_status pt_st_write_groups(const char *path, const pt_model *m, const char *const *meta,
                             const pt_ckpt_group *groups, int ng, pt_ckpt_source src, void *arg) {
    size_t hlen = 0;
    unsigned char *head = groups_header(m, meta, groups, ng, &hlen);
    if (!head) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    char tmp[PT_CONFIG_STR_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    pt_status st = write_groups_file(tmp, m, head, hlen, groups, ng, src, arg);
    free(head);
    if (st != PT_OK) return st;
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return pt_error_set(PT_ERR_IO, "%s: rename: %s", path, strerror(errno));
    }
    return PT_OK;
}

pt_status pt_safetensors_save(const char *path, const pt_model *m, const float *buf) {
    pt_ckpt_group g = {"", (float *)buf};
    return pt_st_write_groups(path, m, NULL, &g, 1, NULL, NULL);
}

/* GPT-2's checkpoints carry the attention mask as a buffer; it is not a
 * parameter. */
static int is_ignored_buffer(const char *name) {
    size_t n = strlen(name);
    static const char *const suffixes[] = {".attn.bias", ".attn.masked_bias"};
    for (size_t i = 0; i < 2; i++) {
        size_t k = strlen(suffixes[i]);
        if (n >= k && !strcmp(name + n - k, suffixes[i])) return 1;
    }
    return 0;
}

static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim) {
    size_t at = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < n) snprintf(buf + at, n - at, "]");
}

/* The tensor of groups that `name` stores: *g and the model tensor index, or
 * -1 when none does. */
static int find_tensor(const pt_model *m, const pt_ckpt_group *groups, int ng, const char *name,
                       int *g) {
    int n = pt_model_num_tensors(m);
    for (*g = 0; *g < ng; (*g)++) {
        const char *rest = name;
        size_t k = strlen(groups[*g].prefix);
        if (k) {
            if (strncmp(name, groups[*g].prefix, k) != 0 || name[k] != '.') continue;
            rest = name + k + 1;
        } else if (!strncmp(name, "transformer.", 12)) {
            rest = name + 12;
        }
        for (int i = 0; i < n; i++)
            if (!strcmp(pt_model_tensor(m, i)->name, rest)) return i;
    }
    return -1;
}

/* meta_want: key, value pairs (NULL-terminated) that __metadata__ must hold. */
static pt_status check_meta(const char *path, const cJSON *root, const char *const *meta_want) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    for (int i = 0; meta_want && meta_want[i] && meta_want[i + 1]; i += 2) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(md, meta_want[i]);
        const char *have = cJSON_IsString(v) ? v->valuestring : "(none)";
        if (strcmp(have, meta_want[i + 1]) != 0)
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: metadata %s is %s, expected %s (a file of another rank or "
                                "checkpoint)",
                                path, meta_want[i], have, meta_want[i + 1]);
    }
    return PT_OK;
}

pt_status pt_safetensors_load(const char *path, const pt_model *m, float *buf) {
    pt_ckpt_group g = {"", buf};
    return pt_st_read_groups(path, m, NULL, &g, 1);
}

pt_status pt_st_read_groups(const char *path, const pt_model *m, const char *const *meta_want,
                            const pt_ckpt_group *groups, int ng) {
    pt_status st = PT_OK;
    char *header = NULL;
    cJSON *root = NULL;
    unsigned char *seen = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return pt_error_set(PT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = pt_error_set(PT_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char lenb[8];
    if (size < 8 || fread(lenb, 1, 8, f) != 8) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: truncated (%llu bytes): not a safetensors file", path,
                          (unsigned long long)size);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)lenb[i] << (8 * i);
    if (hlen < 2 || hlen > MAX_HEADER || hlen > size - 8) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: corrupt header length %llu (file has %llu bytes): not a "
                          "safetensors file or truncated",
                          path, (unsigned long long)hlen, (unsigned long long)size);
        goto done;
    }
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
    root = cJSON_ParseWithLength(header, hlen);
    if (!root || !cJSON_IsObject(root)) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: corrupt header (not a JSON object)", path);
        goto done;
    }
    uint64_t data_size = size - 8 - hlen;
    int n = pt_model_num_tensors(m);
    PT_CHECK_GOTO(st, check_meta(path, root, meta_want), done);
    seen = calloc((size_t)n * (size_t)ng + 1, 1); /* + 1: a file of no groups */
    if (!seen) {
        st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__")) continue;
        int g = 0, idx = find_tensor(m, groups, ng, name, &g);
        if (idx < 0) {
            if (!strncmp(name, "transformer.", 12)) name += 12;
            if (is_ignored_buffer(name)) continue;
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: unexpected tensor '%s' (a checkpoint of another model shape?)",
                              path, name);
            goto done;
        }
        const pt_param_info *t = pt_model_tensor(m, idx);
        if (seen[(size_t)g * (size_t)n + (size_t)idx]) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s' appears twice", path, name);
            goto done;
        }
        seen[(size_t)g * (size_t)n + (size_t)idx] = 1;
        cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsObject(e) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
            !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: corrupt header entry for '%s'", path, name);
            goto done;
        }
        if (strcmp(dtype->valuestring, "F32") != 0) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s' has dtype %s (only F32 is supported)",
                              path, name, dtype->valuestring);
            goto done;
        }
        int64_t got[8];
        int ndim = cJSON_GetArraySize(shape);
        int shape_ok = ndim == t->ndim;
        for (int d = 0; d < ndim && d < 8; d++) {
            cJSON *x = cJSON_GetArrayItem(shape, d);
            got[d] = cJSON_IsNumber(x) ? (int64_t)x->valuedouble : -1;
            if (d < t->ndim && got[d] != t->shape[d]) shape_ok = 0;
        }
        if (!shape_ok) {
            char a[96], b[96];
            shape_str(a, sizeof a, got, ndim < 8 ? ndim : 8);
            shape_str(b, sizeof b, t->shape, t->ndim);
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: tensor '%s' has shape %s, expected %s (a checkpoint of another "
                              "model shape)",
                              path, name, a, b);
            goto done;
        }
        cJSON *b0 = cJSON_GetArrayItem(offs, 0), *b1 = cJSON_GetArrayItem(offs, 1);
        double begin = cJSON_IsNumber(b0) ? b0->valuedouble : -1;
        double end = cJSON_IsNumber(b1) ? b1->valuedouble : -1;
        if (begin < 0 || end < begin || end > (double)data_size ||
            end - begin != (double)(t->numel * sizeof(float))) {
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: tensor '%s' has data offsets [%.0f, %.0f] outside the %llu data "
                              "bytes or not matching its shape (truncated or corrupt)",
                              path, name, begin, end, (unsigned long long)data_size);
            goto done;
        }
        if (fseek(f, (long)(8 + hlen + (uint64_t)begin), SEEK_SET) != 0 ||
            fread(groups[g].buf + t->offset, sizeof(float), t->numel, f) != t->numel) {
            st = pt_error_set(PT_ERR_IO, "%s: read error in tensor '%s'", path, name);
            goto done;
        }
    }
    for (size_t i = 0; i < (size_t)n * (size_t)ng; i++)
        if (!seen[i]) {
            char name[160];
            group_name(name, sizeof name, groups[i / (size_t)n].prefix,
                       pt_model_tensor(m, (int)(i % (size_t)n))->name);
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: missing tensor '%s' (a checkpoint of another model shape?)",
                              path, name);
            goto done;
        }
done:
    free(seen);
    cJSON_Delete(root);
    free(header);
    fclose(f);
    return st;
}

/* ---- checkpoint directories ---- */

pt_status pt_ckpt_begin(const char *dir, int step, char *tmp, size_t n) {
    PT_CHECK(pt_mkdir_p(dir));
    if (snprintf(tmp, n, "%s/.tmp-step_%08d-%d", dir, step, (int)getpid()) >= (int)n)
        return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
    remove_flat_dir(tmp);
    if (mkdir(tmp, 0755) != 0) return pt_error_set(PT_ERR_IO, "%s: %s", tmp, strerror(errno));
    return PT_OK;
}

void pt_ckpt_abort(const char *tmp) {
    remove_flat_dir(tmp);
}

pt_status pt_ckpt_write_main(const char *tmp, const pt_model *m, const float *params,
                             const float *adam_m, const float *adam_v, const char *state_json) {
    char path[PT_CONFIG_STR_MAX + 128];
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    PT_CHECK(pt_safetensors_save(path, m, params));
    if (adam_m) {
        snprintf(path, sizeof path, "%s/optim_m.safetensors", tmp);
        PT_CHECK(pt_safetensors_save(path, m, adam_m));
    }
    if (adam_v) { /* sgd has m (momentum) at most */
        snprintf(path, sizeof path, "%s/optim_v.safetensors", tmp);
        PT_CHECK(pt_safetensors_save(path, m, adam_v));
    }
    snprintf(path, sizeof path, "%s/state.json", tmp);
    return write_file(path, state_json, strlen(state_json), "\n", 1);
}

pt_status pt_ckpt_commit(const char *dir, int step, const char *tmp) {
    char name[32], final[PT_CONFIG_STR_MAX + 64], old[PT_CONFIG_STR_MAX + 64];
    snprintf(name, sizeof name, "step_%08d", step);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    snprintf(old, sizeof old, "%s/.old-%s-%d", dir, name, (int)getpid());
    pt_status st = fsync_path(tmp, 1);
    if (st != PT_OK) goto fail;
    /* Into place. A step directory that already exists (saved again after a
     * resume) moves aside first and is deleted only after the new one is in. */
    int had_old = 0;
    if (access(final, F_OK) == 0) {
        remove_flat_dir(old);
        if (rename(final, old) != 0) {
            st = pt_error_set(PT_ERR_IO, "%s: rename: %s", final, strerror(errno));
            goto fail;
        }
        had_old = 1;
    }
    if (rename(tmp, final) != 0) {
        st = pt_error_set(PT_ERR_IO, "%s: rename: %s", final, strerror(errno));
        if (had_old) rename(old, final);
        goto fail;
    }
    PT_CHECK(fsync_path(dir, 1));
    if (had_old) remove_flat_dir(old);
    /* then `latest`, the same way */
    char latest[PT_CONFIG_STR_MAX + 64], latest_tmp[PT_CONFIG_STR_MAX + 64];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/.latest.tmp%d", dir, (int)getpid());
    PT_CHECK(write_file(latest_tmp, name, strlen(name), "\n", 1));
    if (rename(latest_tmp, latest) != 0) {
        unlink(latest_tmp);
        return pt_error_set(PT_ERR_IO, "%s: rename: %s", latest, strerror(errno));
    }
    return fsync_path(dir, 1);
fail:
    remove_flat_dir(tmp);
    return st;
}

pt_status pt_checkpoint_resolve(const char *dir, char *out, size_t n) {
    char path[PT_CONFIG_STR_MAX + 64];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        char name[256] = {0};
        size_t len = fread(name, 1, sizeof name - 1, f);
        fclose(f);
        while (len && (name[len - 1] == '\n' || name[len - 1] == ' ' || name[len - 1] == '\r'))
            name[--len] = '\0';
        if (!len || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
            return pt_error_set(PT_ERR_FORMAT, "%s: corrupt (expected a step directory name)",
                                path);
        if (snprintf(out, n, "%s/%s", dir, name) >= (int)n)
            return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
        return PT_OK;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (access(path, F_OK) == 0) {
        if (snprintf(out, n, "%s", dir) >= (int)n)
            return pt_error_set(PT_ERR_INVALID, "%s: path too long", dir);
        return PT_OK;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0) return pt_error_set(PT_ERR_IO, "%s: %s", dir, strerror(errno));
    return pt_error_set(PT_ERR_FORMAT, "%s: not a checkpoint (no 'latest' or model.safetensors)",
                        dir);
}

pt_status pt_ckpt_read_state(const char *stepdir, cJSON **out) {
    *out = NULL;
    char path[PT_CONFIG_STR_MAX + 64], *text;
    snprintf(path, sizeof path, "%s/state.json", stepdir);
    PT_CHECK(pt_read_text_file(path, (size_t)16 << 20, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return pt_error_set(PT_ERR_FORMAT, "%s: corrupt (not a JSON object)", path);
    }
    *out = root;
    return PT_OK;
}

/* A bare safetensors checkpoint (GPT-2's published files have no
 * state.json): the architecture from the tensors' shapes: V and C from wte,
 * T from wpe, L from the highest h.{i}; heads of 64 channels as in GPT-2. */
static pt_status infer_config(const char *stepdir, pt_config *cfg) {
    char path[PT_CONFIG_STR_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", stepdir);
    FILE *f = fopen(path, "rb");
    if (!f) return pt_error_set(PT_ERR_IO, "%s/state.json: %s", stepdir, strerror(ENOENT));
    unsigned char lenb[8];
    uint64_t hlen = 0;
    pt_status st = PT_OK;
    char *header = NULL;
    cJSON *root = NULL;
    if (fread(lenb, 1, 8, f) != 8) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: truncated: not a safetensors file", path);
        goto done;
    }
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)lenb[i] << (8 * i);
    if (hlen < 2 || hlen > MAX_HEADER || !(header = malloc(hlen + 1)) ||
        fread(header, 1, hlen, f) != hlen || !(root = cJSON_ParseWithLength(header, hlen)) ||
        !cJSON_IsObject(root)) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: corrupt header: not a safetensors file", path);
        goto done;
    }
    int64_t wte[2] = {0, 0}, wpe[2] = {0, 0};
    int L = 0;
    for (cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (!strncmp(name, "transformer.", 12)) name += 12;
        cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        int64_t *dst = !strcmp(name, "wte.weight") ? wte : !strcmp(name, "wpe.weight") ? wpe : NULL;
        if (dst && cJSON_GetArraySize(shape) == 2) {
            dst[0] = (int64_t)cJSON_GetArrayItem(shape, 0)->valuedouble;
            dst[1] = (int64_t)cJSON_GetArrayItem(shape, 1)->valuedouble;
        }
        int layer = -1;
        if (sscanf(name, "h.%d.", &layer) == 1 && layer + 1 > L) L = layer + 1;
    }
    if (wte[0] <= 0 || wte[1] <= 0 || wpe[0] <= 0 || wpe[1] != wte[1] || L <= 0 || wte[0] > 65536 ||
        wte[1] > 65536 || wpe[0] > (1 << 20) || L > 1000) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: no state.json, and no GPT-2 model (wte, wpe, h.0...) in %s", stepdir,
                          path);
        goto done;
    }
    pt_config_defaults(cfg);
    cfg->model.vocab_size = (int)wte[0];
    cfg->model.n_embd = (int)wte[1];
    cfg->model.seq_len = (int)wpe[0];
    cfg->model.n_layer = L;
    cfg->model.n_head = wte[1] % 64 == 0 ? (int)(wte[1] / 64) : 1;
    PT_INFO("%s: no state.json; GPT-2 shapes: n_layer %d, n_embd %d, n_head %d, vocab %d, seq %d",
            stepdir, L, cfg->model.n_embd, cfg->model.n_head, cfg->model.vocab_size,
            cfg->model.seq_len);
done:
    cJSON_Delete(root);
    free(header);
    fclose(f);
    return st;
}

pt_status pt_checkpoint_read_config(const char *stepdir, pt_config *cfg) {
    char state[PT_CONFIG_STR_MAX + 64];
    snprintf(state, sizeof state, "%s/state.json", stepdir);
    if (access(state, F_OK) != 0 && errno == ENOENT) return infer_config(stepdir, cfg);
    cJSON *root = NULL;
    PT_CHECK(pt_ckpt_read_state(stepdir, &root));
    char what[PT_CONFIG_STR_MAX + 64];
    snprintf(what, sizeof what, "%s/state.json", stepdir);
    pt_status st = PT_OK;
    cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "config");
    char *text = cJSON_IsObject(c) ? cJSON_PrintUnformatted(c) : NULL;
    if (!text) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: no \"config\" object", what);
    } else {
        pt_config_defaults(cfg);
        st = pt_config_load_string(cfg, text, what);
    }
    free(text);
    cJSON_Delete(root);
    return st;
}
