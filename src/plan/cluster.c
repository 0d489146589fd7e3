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

static int index_of(const char *const *names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static pt_status read_gemm(const reader *r, pt_profile_gemm *g) {
    PT_CHECK(read_int(r, "m", 1, &g->m));
    PT_CHECK(read_int(r, "n", 1, &g->n));
    PT_CHECK(read_int(r, "k", 1, &g->k));
    PT_CHECK(read_int(r, "threads", 1, &g->threads));
    return read_num(r, "flops_s", 1, POSITIVE, &g->flops_s);
}

static pt_status read_module(const reader *r, pt_profile_module *m) {
    char kind[16];
    PT_CHECK(read_str(r, "kind", "embedding|block|head", kind, sizeof kind));
    m->kind = index_of(module_kinds, 3, kind); /* PT_MODULE_* in this order */
    PT_CHECK(read_int(r, "n_embd", 1, &m->n_embd));
    PT_CHECK(read_int(r, "n_head", 1, &m->n_head));
    PT_CHECK(read_int(r, "seq_len", 1, &m->seq_len));
    PT_CHECK(read_int(r, "vocab_size", 1, &m->vocab_size));
    PT_CHECK(read_int(r, "tp", 1, &m->tp));
    PT_CHECK(read_int(r, "tokens", 1, &m->tokens));
    PT_CHECK(read_int(r, "threads", 1, &m->threads));
    PT_CHECK(read_num(r, "fwd_s", 1, POSITIVE, &m->fwd_s));
    /* the embedding has no input gradient: 0 is a measurement */
    PT_CHECK(read_num(r, "bgrad_s", 1, NONNEG, &m->bgrad_s));
    PT_CHECK(read_num(r, "wgrad_s", 1, NONNEG, &m->wgrad_s));
    const cJSON *rc;
    PT_CHECK(get_item(r, "recompute_s", 1, &rc));
    char name[256];
    field_name(r, "recompute_s", name, sizeof name);
    if (!cJSON_IsArray(rc) || cJSON_GetArraySize(rc) != 3)
        return pt_error_set(PT_ERR_INVALID,
                            "%s: %s must be an array of 3 numbers >= 0 (none, selective, full)",
                            r->what, name);
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetArrayItem(rc, i);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
            return pt_error_set(PT_ERR_INVALID, "%s: %s[%d] must be a number >= 0", r->what, name,
                                i);
        m->recompute_s[i] = v->valuedouble;
    }
    return PT_OK;
}

static pt_status read_comm(const reader *r, pt_profile_comm *c) {
    PT_CHECK(read_str(r, "backend", "shm|mpi", c->backend, sizeof c->backend));
    char op[32];
    PT_CHECK(read_str(r, "op", "allreduce|allgather|reduce_scatter|broadcast|p2p", op, sizeof op));
    c->op = index_of(op_names, PT_PROFILE_NOPS, op);
    PT_CHECK(read_int(r, "ranks", 1, &c->ranks));
    PT_CHECK(read_num(r, "bytes", 1, POSITIVE, &c->bytes));
    return read_num(r, "seconds", 1, POSITIVE, &c->seconds);
}

/* Each entry of table `key` read by fn into a calloc'd array of `size`-byte
 * elements. */
typedef pt_status (*entry_fn)(const reader *r, void *dst);
static pt_status read_table(const reader *r, const char *key, const char *const *allowed,
                            size_t size, entry_fn fn, void **out, int *n) {
    const cJSON *arr;
    PT_CHECK(read_array(r, key, &arr, n));
    *out = NULL;
    if (*n == 0) return PT_OK;
    char *buf = calloc((size_t)*n, size);
    if (!buf) return pt_error_set(PT_ERR_NOMEM, "%s: profile.%s: out of memory", r->what, key);
    *out = buf;
    int i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
        char name[256];
        snprintf(name, sizeof name, "%s.%s[%d]", r->path, key, i);
        reader e;
        PT_CHECK(reader_open(&e, r->what, name, it, allowed));
        PT_CHECK(fn(&e, buf + (size_t)i * size));
    }
    return PT_OK;
}

static pt_status gemm_fn(const reader *r, void *d) {
    return read_gemm(r, d);
}
static pt_status module_fn(const reader *r, void *d) {
    return read_module(r, d);
}
static pt_status comm_fn(const reader *r, void *d) {
    return read_comm(r, d);
}

static pt_status read_profile(const reader *r, pt_profile *p) {
    double version = 0;
    PT_CHECK(read_num(r, "version", 1, POSITIVE, &version));
    if (version != 1)
        return pt_error_set(PT_ERR_UNSUPPORTED, "%s: profile.version %g is not supported (1)",
                            r->what, version);
    PT_CHECK(read_str(r, "cpu", NULL, p->cpu, sizeof p->cpu));
    PT_CHECK(read_str(r, "binary", NULL, p->binary, sizeof p->binary));
    PT_CHECK(read_int(r, "cores", 1, &p->cores));
    PT_CHECK(read_num(r, "memory_bw", 1, POSITIVE, &p->memory_bw));
    PT_CHECK(read_num(r, "elementwise_s", 1, POSITIVE, &p->elementwise_s));
    PT_CHECK(read_num(r, "adamw_s", 1, POSITIVE, &p->adamw_s));
    PT_CHECK(read_num(r, "sgd_s", 1, POSITIVE, &p->sgd_s));
    static const char *const gemm_keys[] = {"m", "n", "k", "threads", "flops_s", NULL};
    static const char *const module_keys[] = {
        "kind",    "n_embd", "n_head",  "seq_len", "vocab_size",  "tp", "tokens",
        "threads", "fwd_s",  "bgrad_s", "wgrad_s", "recompute_s", NULL};
    static const char *const comm_keys[] = {"backend", "op", "ranks", "bytes", "seconds", NULL};
    void *t;
    PT_CHECK(read_table(r, "gemm", gemm_keys, sizeof *p->gemm, gemm_fn, &t, &p->n_gemm));
    p->gemm = t;
    PT_CHECK(read_table(r, "modules", module_keys, sizeof *p->module, module_fn, &t, &p->n_module));
    p->module = t;
    PT_CHECK(read_table(r, "comm", comm_keys, sizeof *p->comm, comm_fn, &t, &p->n_comm));
    p->comm = t;
    return PT_OK;
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
    static const char *const profile_keys[] = {"version",   "cpu",           "binary",  "cores",
                                               "memory_bw", "elementwise_s", "adamw_s", "sgd_s",
                                               "gemm",      "modules",       "comm",    NULL};
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

static void add_profile(cJSON *root, const pt_profile *p, int *ok) {
    cJSON *o = add_obj(root, "profile", ok);
    if (!o) return;
    add_num(o, "version", 1, ok);
    add_str(o, "cpu", p->cpu, ok);
    add_str(o, "binary", p->binary, ok);
    add_num(o, "cores", p->cores, ok);
    add_num(o, "memory_bw", p->memory_bw, ok);
    add_num(o, "elementwise_s", p->elementwise_s, ok);
    add_num(o, "adamw_s", p->adamw_s, ok);
    add_num(o, "sgd_s", p->sgd_s, ok);
    cJSON *arr = cJSON_AddArrayToObject(o, "gemm");
    for (int i = 0; i < p->n_gemm && *ok; i++) {
        const pt_profile_gemm *g = &p->gemm[i];
        cJSON *e = table_entry(arr, ok);
        if (!e) break;
        add_num(e, "m", g->m, ok);
        add_num(e, "n", g->n, ok);
        add_num(e, "k", g->k, ok);
        add_num(e, "threads", g->threads, ok);
        add_num(e, "flops_s", g->flops_s, ok);
    }
    arr = cJSON_AddArrayToObject(o, "modules");
    for (int i = 0; i < p->n_module && *ok; i++) {
        const pt_profile_module *m = &p->module[i];
        cJSON *e = table_entry(arr, ok);
        if (!e) break;
        add_str(e, "kind", module_kinds[m->kind], ok);
        add_num(e, "n_embd", m->n_embd, ok);
        add_num(e, "n_head", m->n_head, ok);
        add_num(e, "seq_len", m->seq_len, ok);
        add_num(e, "vocab_size", m->vocab_size, ok);
        add_num(e, "tp", m->tp, ok);
        add_num(e, "tokens", m->tokens, ok);
        add_num(e, "threads", m->threads, ok);
        add_num(e, "fwd_s", m->fwd_s, ok);
        add_num(e, "bgrad_s", m->bgrad_s, ok);
        add_num(e, "wgrad_s", m->wgrad_s, ok);
        cJSON *rc = cJSON_CreateDoubleArray(m->recompute_s, 3);
        *ok &= rc && cJSON_AddItemToObject(e, "recompute_s", rc);
    }
    arr = cJSON_AddArrayToObject(o, "comm");
    for (int i = 0; i < p->n_comm && *ok; i++) {
        const pt_profile_comm *c = &p->comm[i];
        cJSON *e = table_entry(arr, ok);
        if (!e) break;
        add_str(e, "backend", c->backend, ok);
        add_str(e, "op", op_names[c->op], ok);
        add_num(e, "ranks", c->ranks, ok);
        add_num(e, "bytes", c->bytes, ok);
        add_num(e, "seconds", c->seconds, ok);
    }
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
