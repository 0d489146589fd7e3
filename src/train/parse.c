/* Parsers of untrusted bytes, from memory: strict UTF-8, and safetensors
 * headers (the format's rules, then the match against the model, then the
 * model shape of a bare GPT-2 file). checkpoint.c reads files and calls
 * these; fuzz/ calls them on arbitrary bytes.
 *
 * The safetensors rules are the reference implementation's
 * (huggingface/safetensors, tensor.rs validate()): the header is UTF-8
 * JSON, an object starting with '{', names unique, "__metadata__" a map of
 * strings to strings, each tensor {dtype, shape, data_offsets} with
 * end - begin = numel x dtype size, and the tensors, sorted by offset,
 * tile the data section exactly: the first begins at 0, each begins where
 * the previous ends, the last ends at the end of the file. So no byte is
 * read twice (an aliased tensor) and none is hidden (a polyglot file).
 *
 * Not here: opening files (checkpoint.c), what the tensors mean beyond
 * their names and shapes. */
#include "parse_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Integers in JSON reach us as doubles: above 2^53 they are no longer
 * exact, so nothing larger is a valid size or offset. */
#define JSON_INT_MAX 9007199254740992.0

size_t pt_text_first_bad(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c == 0) return i;
        if (c < 0x80) {
            i++;
            continue;
        }
        /* Unicode 15, table 3-7: the second byte's range depends on the
         * first (no overlong forms, surrogates, or code points > U+10FFFF) */
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return i;
        if (n - i < len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
        i += len;
    }
    return n;
}

/* ---- safetensors: the format ---- */

static size_t dtype_size(const char *d) {
    static const struct {
        const char *name;
        size_t size;
    } t[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
             {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
             {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(t[i].name, d)) return t[i].size;
    return 0;
}

/* x as an exact non-negative integer <= 2^53; 0 if it is not one. The
 * range and integrality are checked on the double, before converting. */
static int json_u64(const cJSON *x, uint64_t *out) {
    if (!cJSON_IsNumber(x)) return 0;
    double v = x->valuedouble;
    if (!(v >= 0 && v <= JSON_INT_MAX) || v != floor(v)) return 0;
    *out = (uint64_t)v;
    return 1;
}

pt_status pt_st_header_len(const char *what, const unsigned char first8[8], uint64_t file_size,
                           uint64_t *hlen) {
    uint64_t h = 0;
    for (int i = 0; i < 8; i++) h |= (uint64_t)first8[i] << (8 * i);
    *hlen = h;
    if (file_size < 8 || h < 2 || h > PT_ST_MAX_HEADER || h > file_size - 8)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: corrupt header length %llu (file has %llu bytes): not a "
                            "safetensors file or truncated",
                            what, (unsigned long long)h, (unsigned long long)file_size);
    return PT_OK;
}

void pt_st_header_deinit(pt_st_header *h) {
    cJSON_Delete(h->root);
    free(h->entries);
    memset(h, 0, sizeof *h);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int by_offset(const void *a, const void *b) {
    const pt_st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* One tensor entry: dtype known, shape of exact integers, offsets that
 * agree with dtype x shape (no overflow on the way). */
static pt_status parse_entry(const char *what, const cJSON *e, pt_st_entry *t) {
    const char *name = t->name;
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
        !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: corrupt header entry for '%s' (needs dtype, shape, "
                            "data_offsets [begin, end])",
                            what, name);
    size_t esize =
        strlen(dtype->valuestring) < sizeof t->dtype ? dtype_size(dtype->valuestring) : 0;
    if (!esize)
        return pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%.16s'", what, name,
                            dtype->valuestring);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype->valuestring);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > PT_ST_MAX_DIMS)
        return pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s' has %d dimensions (at most %d)", what,
                            name, ndim, PT_ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *x = shape->child; x; x = x->next, d++) {
        uint64_t v;
        if (!json_u64(x, &v))
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: tensor '%s': shape entry %d is not an integer in [0, 2^53]",
                                what, name, d);
        t->shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel))
            return pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s': shape too large", what, name);
    }
    uint64_t bytes;
    if (__builtin_mul_overflow(numel, (uint64_t)esize, &bytes))
        return pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s': shape too large", what, name);
    if (!json_u64(offs->child, &t->begin) || !json_u64(offs->child->next, &t->end))
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: tensor '%s': data offsets are not integers in [0, 2^53]", what,
                            name);
    if (t->end < t->begin || t->end - t->begin != bytes)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: tensor '%s' has data offsets [%llu, %llu], not matching its "
                            "dtype and shape (%llu bytes)",
                            what, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                            (unsigned long long)bytes);
    return PT_OK;
}

pt_status pt_st_header_parse(const char *what, const char *json, size_t hlen, uint64_t file_size,
                             pt_st_header *h) {
    memset(h, 0, sizeof *h);
    pt_status st = PT_OK;
    const char **names = NULL;
    size_t bad = pt_text_first_bad((const unsigned char *)json, hlen);
    if (bad < hlen) {
        /* the file offset: after the 8 length bytes */
        return pt_error_set(
            PT_ERR_FORMAT, "%s: header byte %zu (0x%02x) is %s: the header must be UTF-8 JSON",
            what, 8 + bad, (unsigned char)json[bad], json[bad] ? "not valid UTF-8" : "a NUL");
    }
    size_t esc = pt_json_first_nul_escape(json, hlen);
    if (esc < hlen)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: header byte %zu: a \\u0000 escape (a NUL inside a name or "
                            "string)",
                            what, 8 + esc);
    if (json[0] != '{')
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: corrupt header (does not start with '{'): not a safetensors file",
                            what);
    const char *end = NULL;
    h->root = cJSON_ParseWithLengthOpts(json, hlen, &end, 0);
    if (!h->root || !cJSON_IsObject(h->root)) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: corrupt header (not a JSON object)", what);
        goto fail;
    }
    /* padding after the object: whitespace only (we pad with spaces) */
    for (const char *p = end; p < json + hlen; p++)
        if (!strchr(" \t\r\n", *p)) {
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: content after the header's JSON object at byte %zu", what,
                              (size_t)(8 + (p - json)));
            goto fail;
        }
    h->data_start = 8 + hlen;
    h->data_size = file_size - 8 - hlen;
    int count = 0;
    for (const cJSON *e = h->root->child; e; e = e->next) count++;
    names = malloc(((size_t)count + 1) * sizeof *names);
    h->entries = calloc((size_t)count + 1, sizeof *h->entries);
    if (!names || !h->entries) {
        st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", what);
        goto fail;
    }
    int k = 0;
    for (const cJSON *e = h->root->child; e; e = e->next) names[k++] = e->string;
    qsort(names, (size_t)count, sizeof *names, by_name);
    for (int i = 1; i < count; i++)
        if (!strcmp(names[i], names[i - 1])) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s' appears twice", what, names[i]);
            goto fail;
        }
    for (const cJSON *e = h->root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) {
                st = pt_error_set(PT_ERR_FORMAT, "%s: __metadata__ is not an object", what);
                goto fail;
            }
            for (const cJSON *v = e->child; v; v = v->next)
                if (!cJSON_IsString(v)) {
                    st = pt_error_set(PT_ERR_FORMAT,
                                      "%s: __metadata__ '%s' is not a string (it maps strings to "
                                      "strings)",
                                      what, v->string);
                    goto fail;
                }
            h->meta = e;
            continue;
        }
        pt_st_entry *t = &h->entries[h->n];
        t->name = e->string;
        PT_CHECK_GOTO(st, parse_entry(what, e, t), fail);
        h->n++;
    }
    /* the tiling */
    qsort(h->entries, (size_t)h->n, sizeof *h->entries, by_offset);
    uint64_t at = 0;
    for (int i = 0; i < h->n; i++) {
        const pt_st_entry *t = &h->entries[i];
        if (t->begin != at) {
            if (t->begin < at)
                st = pt_error_set(PT_ERR_FORMAT,
                                  "%s: tensor '%s' (data offsets [%llu, %llu]) overlaps tensor "
                                  "'%s' (which ends at %llu): tensors must not share bytes",
                                  what, t->name, (unsigned long long)t->begin,
                                  (unsigned long long)t->end, h->entries[i - 1].name,
                                  (unsigned long long)at);
            else
                st = pt_error_set(PT_ERR_FORMAT,
                                  "%s: %llu unused data bytes before tensor '%s' (data offsets "
                                  "[%llu, %llu]): tensors must cover the data section without "
                                  "gaps",
                                  what, (unsigned long long)(t->begin - at), t->name,
                                  (unsigned long long)t->begin, (unsigned long long)t->end);
            goto fail;
        }
        at = t->end;
    }
    if (at != h->data_size) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: the tensors cover %llu data bytes but the file holds %llu "
                          "(truncated, or bytes that belong to no tensor)",
                          what, (unsigned long long)at, (unsigned long long)h->data_size);
        goto fail;
    }
    free(names);
    return PT_OK;
fail:
    free(names);
    pt_st_header_deinit(h);
    return st;
}

/* ---- safetensors: the match against the model ---- */

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

/* "<prefix>.<name>", or the bare name for prefix "". */
static void group_name(char *out, size_t n, const char *prefix, const char *name) {
    if (prefix[0])
        snprintf(out, n, "%s.%s", prefix, name);
    else
        snprintf(out, n, "%s", name);
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

pt_status pt_st_match(const char *what, pt_st_header *h, const pt_model *m,
                      const char *const *meta_want, const pt_ckpt_group *groups, int ng) {
    for (int i = 0; meta_want && meta_want[i] && meta_want[i + 1]; i += 2) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(h->meta, meta_want[i]);
        const char *have = cJSON_IsString(v) ? v->valuestring : "(none)";
        if (strcmp(have, meta_want[i + 1]) != 0)
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: metadata %s is %s, expected %s (a file of another rank or "
                                "checkpoint)",
                                what, meta_want[i], have, meta_want[i + 1]);
    }
    int n = pt_model_num_tensors(m);
    unsigned char *seen = calloc((size_t)n * (size_t)ng + 1, 1); /* + 1: no groups */
    if (!seen) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", what);
    pt_status st = PT_OK;
    for (int j = 0; j < h->n; j++) {
        pt_st_entry *e = &h->entries[j];
        const char *name = e->name;
        e->dst = NULL;
        e->tensor = -1;
        int g = 0, idx = find_tensor(m, groups, ng, name, &g);
        if (idx < 0) {
            if (!strncmp(name, "transformer.", 12)) name += 12;
            if (is_ignored_buffer(name)) continue;
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: unexpected tensor '%s' (a checkpoint of another model shape?)",
                              what, name);
            goto done;
        }
        const pt_param_info *t = pt_model_tensor(m, idx);
        /* "wte.weight" and "transformer.wte.weight" name the same tensor */
        if (seen[(size_t)g * (size_t)n + (size_t)idx]) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s' appears twice", what, name);
            goto done;
        }
        seen[(size_t)g * (size_t)n + (size_t)idx] = 1;
        if (strcmp(e->dtype, "F32") != 0) {
            st = pt_error_set(PT_ERR_FORMAT, "%s: tensor '%s' has dtype %s (only F32 is supported)",
                              what, name, e->dtype);
            goto done;
        }
        int shape_ok = e->ndim == t->ndim;
        for (int d = 0; shape_ok && d < t->ndim; d++) shape_ok = e->shape[d] == t->shape[d];
        if (!shape_ok) {
            char a[160], b[96];
            shape_str(a, sizeof a, e->shape, e->ndim);
            shape_str(b, sizeof b, t->shape, t->ndim);
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: tensor '%s' has shape %s, expected %s (a checkpoint of another "
                              "model shape)",
                              what, name, a, b);
            goto done;
        }
        e->tensor = idx;
        e->group = g;
        e->dst = groups[g].buf ? groups[g].buf + t->offset : NULL;
    }
    for (size_t i = 0; i < (size_t)n * (size_t)ng; i++)
        if (!seen[i]) {
            char name[160];
            group_name(name, sizeof name, groups[i / (size_t)n].prefix,
                       pt_model_tensor(m, (int)(i % (size_t)n))->name);
            st = pt_error_set(PT_ERR_FORMAT,
                              "%s: missing tensor '%s' (a checkpoint of another model shape?)",
                              what, name);
            goto done;
        }
done:
    free(seen);
    return st;
}

pt_status pt_st_load_buffer(const char *what, const unsigned char *buf, size_t len,
                            const pt_model *m, const char *const *meta_want,
                            const pt_ckpt_group *groups, int ng) {
    if (len < 8)
        return pt_error_set(PT_ERR_FORMAT, "%s: truncated (%zu bytes): not a safetensors file",
                            what, len);
    uint64_t hlen;
    PT_CHECK(pt_st_header_len(what, buf, len, &hlen));
    /* a NUL-terminated copy, as the file reader has */
    char *json = malloc((size_t)hlen + 1);
    if (!json) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", what);
    memcpy(json, buf + 8, (size_t)hlen);
    json[hlen] = '\0';
    pt_st_header h;
    pt_status st = pt_st_header_parse(what, json, (size_t)hlen, len, &h);
    free(json);
    if (st != PT_OK) return st;
    st = pt_st_match(what, &h, m, meta_want, groups, ng);
    for (int i = 0; st == PT_OK && i < h.n; i++)
        if (h.entries[i].dst)
            memcpy(h.entries[i].dst, buf + h.data_start + h.entries[i].begin,
                   (size_t)(h.entries[i].end - h.entries[i].begin));
    pt_st_header_deinit(&h);
    return st;
}

/* ---- safetensors: the shape of a bare GPT-2 file ---- */

/* The layer number of "h.<N>.<rest>", -1 for other names, or a value
 * above max when N is larger (parsed without overflow). */
static long layer_of(const char *name, long max) {
    if (strncmp(name, "h.", 2) != 0) return -1;
    const char *p = name + 2;
    long v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        if (v <= max) v = v * 10 + (*p - '0'); /* v <= max < LONG_MAX / 10 */
    if (!digits || *p != '.') return -1;
    return v;
}

pt_status pt_st_model_config(const char *what, const pt_st_header *h, pt_model_config *mc) {
    const long max_layers = 1000; /* model.n_layer's range */
    int64_t wte[2] = {0, 0}, wpe[2] = {0, 0};
    long L = 0;
    for (int i = 0; i < h->n; i++) {
        const pt_st_entry *e = &h->entries[i];
        const char *name = e->name;
        if (!strncmp(name, "transformer.", 12)) name += 12;
        int64_t *dst = !strcmp(name, "wte.weight") ? wte : !strcmp(name, "wpe.weight") ? wpe : NULL;
        if (dst && e->ndim == 2) {
            dst[0] = e->shape[0];
            dst[1] = e->shape[1];
        }
        long layer = layer_of(name, max_layers);
        if (layer >= max_layers)
            return pt_error_set(PT_ERR_FORMAT,
                                "%s: tensor '%.64s': layer number out of range (at most %ld "
                                "layers)",
                                what, e->name, max_layers);
        if (layer + 1 > L) L = layer + 1;
    }
    if (wte[0] <= 0 || wte[1] <= 0 || wpe[0] <= 0 || wpe[1] != wte[1] || L <= 0 ||
        wte[0] > PT_VOCAB_MAX || wte[1] > 65536 || wpe[0] > (1 << 20))
        return pt_error_set(PT_ERR_FORMAT, "%s: no GPT-2 model in it (wte, wpe, h.0...)", what);
    /* The head count is not in any shape (c_attn is C x 3C whatever NH is):
     * it must be stated. */
    const cJSON *nh = cJSON_GetObjectItemCaseSensitive(h->meta, "n_head");
    if (!cJSON_IsString(nh))
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: no state.json beside it and no __metadata__ \"n_head\": the head "
                            "count cannot be read from the tensor shapes (write a state.json "
                            "holding {\"config\": {\"model\": {...}}} beside it)",
                            what);
    const char *s = nh->valuestring;
    long v = 0;
    int digits = 0;
    for (; *s >= '0' && *s <= '9' && v <= 4096; s++, digits++) v = v * 10 + (*s - '0');
    if (!digits || *s || v < 1 || v > 4096 || wte[1] % v != 0)
        return pt_error_set(PT_ERR_FORMAT,
                            "%s: __metadata__ n_head '%.32s' is not a head count dividing n_embd "
                            "%lld",
                            what, nh->valuestring, (long long)wte[1]);
    mc->vocab_size = (int)wte[0];
    mc->n_embd = (int)wte[1];
    mc->seq_len = (int)wpe[0];
    mc->n_layer = (int)L;
    mc->n_head = (int)v;
    return PT_OK;
}
