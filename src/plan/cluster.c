/* The cluster description (docs/plan.md): a JSON file of the hardware, and
 * the optional measured profile of `partrain calibrate`, into pt_cluster;
 * and back to JSON. Every field is checked where it is read: a missing,
 * mistyped, non-finite or out-of-range value, an unknown or duplicate key
 * is one error line naming the file and the dotted field
 * ("cluster.json: links.inter_node.bw must be a positive number (got -1)").
 *
 * Not here: what the numbers mean to the models (memory.c, time.c). */
#include "partrain/plan.h"

#include "parse_impl.h" /* pt_json_first_nul_escape: the config loader's check */

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Defaults of the efficiency fractions (docs/plan.md gives the sources). */
#define EFF_MATMUL      0.75
#define EFF_ELEMENTWISE 0.8
#define EFF_COMM        0.8

/* Integers in JSON are doubles: keep them exact and inside int. */
#define INT_FIELD_MAX 2147483647.0

/* A JSON object being read: its dotted name for messages and the keys it
 * may hold (NULL-terminated), checked once when it is opened. */
typedef struct {
    const char *what; /* the file */
    char path[200];   /* dotted name of this object ("" at the top) */
    const cJSON *obj;
} reader;

/* "links.inter_node" + "bw" */
static void field_name(const reader *r, const char *key, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s", r->path, *r->path ? "." : "", key);
}

static const char *json_kind(const cJSON *it) {
    return cJSON_IsNumber(it)   ? "a number"
           : cJSON_IsString(it) ? "a string"
           : cJSON_IsBool(it)   ? "a boolean"
           : cJSON_IsArray(it)  ? "an array"
           : cJSON_IsObject(it) ? "an object"
                                : "null";
}

/* Open obj (named path under parent) as a reader: it must be an object whose
 * keys are all in `allowed`, each once. */
static pt_status reader_open(reader *r, const char *what, const char *path, const cJSON *obj,
                             const char *const *allowed) {
    r->what = what;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->obj = obj;
    if (!cJSON_IsObject(obj))
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be an object (got %s)", what,
                            *path ? path : "the top level", json_kind(obj));
    for (const cJSON *it = obj->child; it; it = it->next) {
        char name[256];
        field_name(r, it->string, name, sizeof name);
        int known = 0;
        for (int i = 0; allowed[i]; i++) known |= !strcmp(allowed[i], it->string);
        if (!known) return pt_error_set(PT_ERR_INVALID, "%s: unknown key '%s'", what, name);
        for (const cJSON *prev = obj->child; prev != it; prev = prev->next)
            if (!strcmp(prev->string, it->string))
                return pt_error_set(PT_ERR_INVALID, "%s: duplicate key '%s'", what, name);
    }
    return PT_OK;
}

static pt_status get_item(const reader *r, const char *key, int required, const cJSON **out) {
    *out = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if (!*out && required) {
        char name[256];
        field_name(r, key, name, sizeof name);
        return pt_error_set(PT_ERR_INVALID, "%s: %s is missing", r->what, name);
    }
    return PT_OK;
}

typedef enum { POSITIVE, NONNEG, FRACTION } num_range; /* > 0, >= 0, [0, 1] */

static pt_status read_num(const reader *r, const char *key, int required, num_range range,
                          double *out) {
    const cJSON *it;
    PT_CHECK(get_item(r, key, required, &it));
    if (!it) return PT_OK;
    char name[256];
    field_name(r, key, name, sizeof name);
    const char *want = range == POSITIVE ? "a positive number"
                       : range == NONNEG ? "a number >= 0"
                                         : "a number in [0, 1]";
    if (!cJSON_IsNumber(it))
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be %s (got %s)", r->what, name, want,
                            json_kind(it));
    double v = it->valuedouble;
    int ok = isfinite(v) && (range == POSITIVE ? v > 0 : v >= 0) && (range != FRACTION || v <= 1);
    if (!ok)
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be %s (got %g)", r->what, name, want, v);
    *out = v;
    return PT_OK;
}

static pt_status read_int(const reader *r, const char *key, int required, int *out) {
    double v = 0;
    PT_CHECK(read_num(r, key, required, POSITIVE, &v));
    if (v == 0) return PT_OK; /* absent and optional */
    if (v != floor(v) || v > INT_FIELD_MAX) {
        char name[256];
        field_name(r, key, name, sizeof name);
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be a positive integer (got %g)", r->what,
                            name, v);
    }
    *out = (int)v;
    return PT_OK;
}

/* A string into buf[n]; choices "a|b|c" or NULL. */
static pt_status read_str(const reader *r, const char *key, const char *choices, char *buf,
                          size_t n) {
    const cJSON *it;
    PT_CHECK(get_item(r, key, 1, &it));
    char name[256];
    field_name(r, key, name, sizeof name);
    if (!cJSON_IsString(it))
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be a string (got %s)", r->what, name,
                            json_kind(it));
    size_t len = strlen(it->valuestring);
    if (len >= n)
        return pt_error_set(PT_ERR_INVALID, "%s: %s is too long (%zu bytes, at most %zu)", r->what,
                            name, len, n - 1);
    if (choices) {
        int ok = 0;
        for (const char *p = choices; *p;) {
            const char *bar = strchr(p, '|');
            size_t k = bar ? (size_t)(bar - p) : strlen(p);
            ok |= k == len && !strncmp(p, it->valuestring, k);
            p += k + (bar ? 1 : 0);
        }
        if (!ok)
            return pt_error_set(PT_ERR_INVALID, "%s: %s must be one of %s (got '%s')", r->what,
                                name, choices, it->valuestring);
    }
    memcpy(buf, it->valuestring, len + 1);
    return PT_OK;
}

/* Open the sub-object key of r (required or not: *present says). */
static pt_status read_obj(const reader *r, const char *key, int required,
                          const char *const *allowed, reader *sub, int *present) {
    const cJSON *it;
    PT_CHECK(get_item(r, key, required, &it));
    *present = it != NULL;
    if (!it) return PT_OK;
    char name[256];
    field_name(r, key, name, sizeof name);
    return reader_open(sub, r->what, name, it, allowed);
}

/* The array r.key (absent: 0 entries); its entries are opened by the caller. */
static pt_status read_array(const reader *r, const char *key, const cJSON **arr, int *n) {
    PT_CHECK(get_item(r, key, 0, arr));
    *n = 0;
    if (!*arr) return PT_OK;
    if (!cJSON_IsArray(*arr)) {
        char name[256];
        field_name(r, key, name, sizeof name);
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be an array (got %s)", r->what, name,
                            json_kind(*arr));
    }
    *n = cJSON_GetArraySize(*arr);
    return PT_OK;
}

static const char *const module_kinds[] = {"embedding", "block", "head"};
static const char *const op_names[PT_PROFILE_NOPS] = {"allreduce", "allgather", "reduce_scatter",
                                                      "broadcast", "p2p"};

/* ---- the profile: one field list per table, for reading and writing ---- */

typedef enum {
    F_INT,     /* int, > 0 */
    F_INT_OPT, /* int, > 0, or absent (0) */
    F_POS,     /* double, > 0 */
    F_NONNEG,  /* double, >= 0 */
    F_ENUM,    /* int: the index of the string among `names` */
    F_STR,     /* char[len] among `choices` (NULL: any) */
    F_TRIPLE   /* double[3], each >= 0 (recompute_s: none, selective, full) */
} field_kind;

typedef struct {
    const char *key;
    field_kind kind;
    size_t off;
    const char *choices;      /* F_ENUM, F_STR: "a|b|c" */
    const char *const *names; /* F_ENUM: in index order */
    size_t len;               /* F_STR: the buffer */
} field;

#define FLD(T, key, kind, m)                                                                       \
    { key, kind, offsetof(T, m), NULL, NULL, 0 }
#define FLD_ENUM(T, key, m, c, n)                                                                  \
    { key, F_ENUM, offsetof(T, m), c, n, 0 }
#define FLD_STR(T, key, m, c)                                                                      \
    { key, F_STR, offsetof(T, m), c, NULL, sizeof(((T *)0)->m) }
#define NFIELD(a) ((int)(sizeof a / sizeof a[0]))

static const field gemm_fields[] = {
    FLD(pt_profile_gemm, "m", F_INT, m),
    FLD(pt_profile_gemm, "n", F_INT, n),
    FLD(pt_profile_gemm, "k", F_INT, k),
    FLD(pt_profile_gemm, "threads", F_INT, threads),
    FLD(pt_profile_gemm, "flops_s", F_POS, flops_s),
};
static const field module_fields[] = {
    FLD_ENUM(pt_profile_module, "kind", kind, "embedding|block|head", module_kinds),
    FLD(pt_profile_module, "n_embd", F_INT, n_embd),
    FLD(pt_profile_module, "n_head", F_INT, n_head),
    FLD(pt_profile_module, "seq_len", F_INT, seq_len),
    FLD(pt_profile_module, "vocab_size", F_INT, vocab_size),
    FLD(pt_profile_module, "tp", F_INT, tp),
    FLD(pt_profile_module, "tokens", F_INT, tokens),
    FLD(pt_profile_module, "threads", F_INT, threads),
    FLD(pt_profile_module, "ranks", F_INT_OPT, ranks),
    FLD(pt_profile_module, "fwd_s", F_POS, fwd_s),
    /* the embedding has no input gradient: 0 is a measurement */
    FLD(pt_profile_module, "bgrad_s", F_NONNEG, bgrad_s),
    FLD(pt_profile_module, "wgrad_s", F_NONNEG, wgrad_s),
    FLD(pt_profile_module, "recompute_s", F_TRIPLE, recompute_s),
};
static const field comm_fields[] = {
    FLD_STR(pt_profile_comm, "backend", backend, "shm|mpi"),
    FLD_ENUM(pt_profile_comm, "op", op, "allreduce|allgather|reduce_scatter|broadcast|p2p",
             op_names),
    FLD(pt_profile_comm, "ranks", F_INT, ranks),
    FLD(pt_profile_comm, "bytes", F_POS, bytes),
    FLD(pt_profile_comm, "seconds", F_POS, seconds),
};
/* the profile's own scalars (version, checked apart, and the tables follow) */
static const field profile_fields[] = {
    FLD_STR(pt_profile, "cpu", cpu, NULL),
    FLD_STR(pt_profile, "binary", binary, NULL),
    FLD(pt_profile, "cores", F_INT, cores),
    FLD(pt_profile, "memory_bw", F_POS, memory_bw),
    FLD(pt_profile, "elementwise_s", F_POS, elementwise_s),
    FLD(pt_profile, "adamw_s", F_POS, adamw_s),
    FLD(pt_profile, "sgd_s", F_POS, sgd_s),
};

static pt_status read_triple(const reader *r, const char *key, double *out) {
    const cJSON *rc;
    PT_CHECK(get_item(r, key, 1, &rc));
    char name[256];
    field_name(r, key, name, sizeof name);
    if (!cJSON_IsArray(rc) || cJSON_GetArraySize(rc) != 3)
        return pt_error_set(PT_ERR_INVALID,
                            "%s: %s must be an array of 3 numbers >= 0 (none, selective, full)",
                            r->what, name);
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetArrayItem(rc, i);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
            return pt_error_set(PT_ERR_INVALID, "%s: %s[%d] must be a number >= 0", r->what, name,
                                i);
        out[i] = v->valuedouble;
    }
    return PT_OK;
}

/* Every field of the list, required, into the struct at dst. */
static pt_status read_fields(const reader *r, const field *f, int n, void *dst) {
    for (int i = 0; i < n; i++) {
        char *at = (char *)dst + f[i].off;
        switch (f[i].kind) {
        case F_INT:
            PT_CHECK(read_int(r, f[i].key, 1, (int *)at));
            break;
        case F_INT_OPT:
            PT_CHECK(read_int(r, f[i].key, 0, (int *)at));
            break;
        case F_POS:
            PT_CHECK(read_num(r, f[i].key, 1, POSITIVE, (double *)at));
            break;
        case F_NONNEG:
            PT_CHECK(read_num(r, f[i].key, 1, NONNEG, (double *)at));
            break;
        case F_STR:
            PT_CHECK(read_str(r, f[i].key, f[i].choices, at, f[i].len));
            break;
        case F_TRIPLE:
            PT_CHECK(read_triple(r, f[i].key, (double *)at));
            break;
        case F_ENUM: {
            char s[32];
            PT_CHECK(read_str(r, f[i].key, f[i].choices, s, sizeof s));
            int k = 0;
            while (strcmp(f[i].names[k], s) != 0) k++; /* read_str checked the choices */
            *(int *)at = k;
            break;
        }
        }
    }
    return PT_OK;
}

/* The entry's keys: the field list's, NULL-terminated, into keys[]. */
#define MAX_FIELDS 16
static void field_keys(const field *f, int n, const char **keys) {
    PT_ASSERT(n < MAX_FIELDS);
    for (int i = 0; i < n; i++) keys[i] = f[i].key;
    keys[n] = NULL;
}

/* Each entry of table `key` (an array of objects with exactly the fields
 * of f) into *out, a calloc'd array of `size`-byte elements, set as soon as
 * it is allocated so that the caller frees it on every path. */
static pt_status read_table(const reader *r, const char *key, const field *f, int nf, size_t size,
                            void **out, int *n) {
    const cJSON *arr;
    *out = NULL;
    PT_CHECK(read_array(r, key, &arr, n));
    if (*n == 0) return PT_OK;
    char *buf = calloc((size_t)*n, size);
    if (!buf) return pt_error_set(PT_ERR_NOMEM, "%s: profile.%s: out of memory", r->what, key);
    *out = buf;
    const char *keys[MAX_FIELDS];
    field_keys(f, nf, keys);
    int i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
        char name[256];
        snprintf(name, sizeof name, "%s.%s[%d]", r->path, key, i);
        reader e;
        PT_CHECK(reader_open(&e, r->what, name, it, keys));
        PT_CHECK(read_fields(&e, f, nf, buf + (size_t)i * size));
    }
    return PT_OK;
}

static pt_status read_profile(const reader *r, pt_profile *p) {
    double version = 0;
    PT_CHECK(read_num(r, "version", 1, POSITIVE, &version));
    if (version != 1)
        return pt_error_set(PT_ERR_UNSUPPORTED, "%s: profile.version %g is not supported (1)",
                            r->what, version);
    PT_CHECK(read_fields(r, profile_fields, NFIELD(profile_fields), p));
    PT_CHECK(read_num(r, "probe_flops_s", 0, POSITIVE, &p->probe_flops_s));
    void *t;
    pt_status st =
        read_table(r, "gemm", gemm_fields, NFIELD(gemm_fields), sizeof *p->gemm, &t, &p->n_gemm);
    p->gemm = t;
    PT_CHECK(st);
    st = read_table(r, "modules", module_fields, NFIELD(module_fields), sizeof *p->module, &t,
                    &p->n_module);
    p->module = t;
    PT_CHECK(st);
    for (int i = 0; i < p->n_module; i++) /* absent: a shard's own group */
        if (p->module[i].ranks == 0) p->module[i].ranks = p->module[i].tp;
    st = read_table(r, "comm", comm_fields, NFIELD(comm_fields), sizeof *p->comm, &t, &p->n_comm);
    p->comm = t;
    return st;
}

static pt_status read_link(const reader *r, const char *key, pt_link *l) {
    static const char *const link_keys[] = {"bw", "latency", NULL};
    reader s;
    int present;
    PT_CHECK(read_obj(r, key, 1, link_keys, &s, &present));
    PT_CHECK(read_num(&s, "bw", 1, POSITIVE, &l->bw));
    return read_num(&s, "latency", 1, POSITIVE, &l->latency);
}

static pt_status read_cluster(const char *what, const cJSON *root, pt_cluster *c) {
    static const char *const top_keys[] = {"name",  "nodes",      "devices_per_node", "device",
                                           "links", "efficiency", "profile",          NULL};
    static const char *const device_keys[] = {"name", "peak_flops", "memory_bytes", "memory_bw",
                                              NULL};
    static const char *const flops_keys[] = {"fp32", "bf16", NULL};
    static const char *const links_keys[] = {"intra_node", "inter_node", NULL};
    static const char *const eff_keys[] = {"matmul", "elementwise", "comm", NULL};
    static const char *const profile_keys[] = {
        "version",       "cpu",     "binary", "cores",         "memory_bw",
        "elementwise_s", "adamw_s", "sgd_s",  "probe_flops_s", "gemm",
        "modules",       "comm",    NULL};
    reader top, dev, fl, links, eff, prof;
    int present;
    PT_CHECK(reader_open(&top, what, "", root, top_keys));
    PT_CHECK(read_str(&top, "name", NULL, c->name, sizeof c->name));
    PT_CHECK(read_int(&top, "nodes", 1, &c->nodes));
    PT_CHECK(read_int(&top, "devices_per_node", 1, &c->devices_per_node));
    PT_CHECK(read_obj(&top, "device", 1, device_keys, &dev, &present));
    PT_CHECK(read_str(&dev, "name", NULL, c->device.name, sizeof c->device.name));
    PT_CHECK(read_obj(&dev, "peak_flops", 1, flops_keys, &fl, &present));
    PT_CHECK(read_num(&fl, "fp32", 1, POSITIVE, &c->device.peak_flops_fp32));
    /* absent or 0: the device has no bf16 (a CPU profile) */
    PT_CHECK(read_num(&fl, "bf16", 0, NONNEG, &c->device.peak_flops_bf16));
    PT_CHECK(read_num(&dev, "memory_bytes", 1, POSITIVE, &c->device.memory_bytes));
    PT_CHECK(read_num(&dev, "memory_bw", 1, POSITIVE, &c->device.memory_bw));
    PT_CHECK(read_obj(&top, "links", 1, links_keys, &links, &present));
    PT_CHECK(read_link(&links, "intra_node", &c->intra_node));
    PT_CHECK(read_link(&links, "inter_node", &c->inter_node));
    c->efficiency = (pt_efficiency){EFF_MATMUL, EFF_ELEMENTWISE, EFF_COMM};
    PT_CHECK(read_obj(&top, "efficiency", 0, eff_keys, &eff, &present));
    if (present) {
        /* 0 (as the template in docs/plan.md writes): the default */
        double v[3] = {0, 0, 0};
        PT_CHECK(read_num(&eff, "matmul", 0, FRACTION, &v[0]));
        PT_CHECK(read_num(&eff, "elementwise", 0, FRACTION, &v[1]));
        PT_CHECK(read_num(&eff, "comm", 0, FRACTION, &v[2]));
        if (v[0] > 0) c->efficiency.matmul = v[0];
        if (v[1] > 0) c->efficiency.elementwise = v[1];
        if (v[2] > 0) c->efficiency.comm = v[2];
    }
    PT_CHECK(read_obj(&top, "profile", 0, profile_keys, &prof, &present));
    if (present) {
        c->profile = calloc(1, sizeof *c->profile);
        if (!c->profile) return pt_error_set(PT_ERR_NOMEM, "%s: profile: out of memory", what);
        PT_CHECK(read_profile(&prof, c->profile));
    }
    return PT_OK;
}

pt_status pt_cluster_load_string(pt_cluster **out, const char *json, const char *what) {
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t line = 1;
        for (const char *p = json; at && p < at && *p; p++) line += *p == '\n';
        return pt_error_set(PT_ERR_FORMAT, "%s: invalid JSON near line %zu", what, line);
    }
    size_t tail = (size_t)(end - json);
    while (json[tail] && strchr(" \t\r\n", json[tail])) tail++;
    pt_status st = PT_OK;
    pt_cluster *c = NULL;
    if (pt_json_first_nul_escape(json, tail) < tail)
        st = pt_error_set(PT_ERR_FORMAT, "%s: a \\u0000 escape (a NUL inside a string)", what);
    else if (json[tail])
        st = pt_error_set(PT_ERR_FORMAT, "%s: content after the top-level JSON object", what);
    else if (!(c = calloc(1, sizeof *c)))
        st = pt_error_set(PT_ERR_NOMEM, "%s: out of memory", what);
    else
        st = read_cluster(what, root, c);
    cJSON_Delete(root);
    if (st != PT_OK) {
        pt_cluster_free(c);
        return st;
    }
    *out = c;
    return PT_OK;
}

pt_status pt_cluster_load_file(pt_cluster **out, const char *path) {
    *out = NULL;
    char *text;
    PT_CHECK(pt_read_text_file(path, (size_t)64 << 20, &text));
    pt_status st = pt_cluster_load_string(out, text, path);
    free(text);
    return st;
}

void pt_cluster_free(pt_cluster *c) {
    if (!c) return;
    if (c->profile) {
        free(c->profile->gemm);
        free(c->profile->module);
        free(c->profile->comm);
        free(c->profile);
    }
    free(c);
}

/* ---- to JSON ---- */

/* cJSON's Add* return NULL when out of memory; `ok` collects that. */
static cJSON *add_num(cJSON *o, const char *k, double v, int *ok) {
    cJSON *it = cJSON_AddNumberToObject(o, k, v);
    *ok &= it != NULL;
    return it;
}

static cJSON *add_obj(cJSON *o, const char *k, int *ok) {
    cJSON *it = o ? cJSON_AddObjectToObject(o, k) : NULL;
    *ok &= it != NULL;
    return it;
}

static void add_str(cJSON *o, const char *k, const char *v, int *ok) {
    *ok &= o && cJSON_AddStringToObject(o, k, v) != NULL;
}

static void add_link(cJSON *links, const char *k, const pt_link *l, int *ok) {
    cJSON *o = add_obj(links, k, ok);
    if (!o) return;
    add_num(o, "bw", l->bw, ok);
    add_num(o, "latency", l->latency, ok);
}

static cJSON *table_entry(cJSON *arr, int *ok) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !arr || !cJSON_AddItemToArray(arr, o)) {
        cJSON_Delete(o);
        *ok = 0;
        return NULL;
    }
    return o;
}

static void add_fields(cJSON *o, const field *f, int n, const void *src, int *ok) {
    for (int i = 0; i < n && *ok; i++) {
        const char *at = (const char *)src + f[i].off;
        switch (f[i].kind) {
        case F_INT:
            add_num(o, f[i].key, *(const int *)at, ok);
            break;
        case F_INT_OPT:
            if (*(const int *)at > 0) add_num(o, f[i].key, *(const int *)at, ok);
            break;
        case F_POS:
        case F_NONNEG:
            add_num(o, f[i].key, *(const double *)at, ok);
            break;
        case F_STR:
            add_str(o, f[i].key, at, ok);
            break;
        case F_ENUM:
            add_str(o, f[i].key, f[i].names[*(const int *)at], ok);
            break;
        case F_TRIPLE: {
            cJSON *a = cJSON_CreateDoubleArray((const double *)at, 3);
            *ok &= a && cJSON_AddItemToObject(o, f[i].key, a);
            break;
        }
        }
    }
}

static void add_table(cJSON *o, const char *key, const field *f, int nf, const void *rows,
                      size_t size, int n, int *ok) {
    cJSON *arr = cJSON_AddArrayToObject(o, key);
    for (int i = 0; i < n && *ok; i++) {
        cJSON *e = table_entry(arr, ok);
        if (e) add_fields(e, f, nf, (const char *)rows + (size_t)i * size, ok);
    }
}

static void add_profile(cJSON *root, const pt_profile *p, int *ok) {
    cJSON *o = add_obj(root, "profile", ok);
    if (!o) return;
    add_num(o, "version", 1, ok);
    add_fields(o, profile_fields, NFIELD(profile_fields), p, ok);
    if (p->probe_flops_s > 0) add_num(o, "probe_flops_s", p->probe_flops_s, ok);
    add_table(o, "gemm", gemm_fields, NFIELD(gemm_fields), p->gemm, sizeof *p->gemm, p->n_gemm, ok);
    add_table(o, "modules", module_fields, NFIELD(module_fields), p->module, sizeof *p->module,
              p->n_module, ok);
    add_table(o, "comm", comm_fields, NFIELD(comm_fields), p->comm, sizeof *p->comm, p->n_comm, ok);
}

char *pt_cluster_to_json(const pt_cluster *c) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    int ok = 1;
    add_str(root, "name", c->name, &ok);
    add_num(root, "nodes", c->nodes, &ok);
    add_num(root, "devices_per_node", c->devices_per_node, &ok);
    cJSON *dev = add_obj(root, "device", &ok);
    add_str(dev, "name", c->device.name, &ok);
    cJSON *fl = add_obj(dev, "peak_flops", &ok);
    if (fl) {
        add_num(fl, "fp32", c->device.peak_flops_fp32, &ok);
        add_num(fl, "bf16", c->device.peak_flops_bf16, &ok);
    }
    if (dev) {
        add_num(dev, "memory_bytes", c->device.memory_bytes, &ok);
        add_num(dev, "memory_bw", c->device.memory_bw, &ok);
    }
    cJSON *links = add_obj(root, "links", &ok);
    add_link(links, "intra_node", &c->intra_node, &ok);
    add_link(links, "inter_node", &c->inter_node, &ok);
    cJSON *eff = add_obj(root, "efficiency", &ok);
    if (eff) {
        add_num(eff, "matmul", c->efficiency.matmul, &ok);
        add_num(eff, "elementwise", c->efficiency.elementwise, &ok);
        add_num(eff, "comm", c->efficiency.comm, &ok);
    }
    if (c->profile && ok) add_profile(root, c->profile, &ok);
    char *s = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return s;
}
