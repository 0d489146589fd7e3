/* The cluster description (docs/plan.md): a JSON file of the hardware, and
 * the optional measured profile of `partrain calibrate`, into pt_cluster;
 * and back to JSON. Every field is checked where it is read: a missing,
 * mistyped, non-finite or out-of-range value, an unknown or duplicate key
 * is one error line naming the file and the dotted field and the range
 * ("cluster.json: links.inter_node.bw must be in [1e6, 1e15] bytes/s (got
 * -1)"). Every physical quantity has a plausible range (docs/plan.md's
 * table, the field lists below): a rate of 1e-300 made the plan's step
 * times infinite, a count of 2^31 ranks was planned. Integers print as
 * integers.
 *
 * Not here: what the numbers mean to the models (memory.c, time.c). */
#include "partrain/plan.h"

#include "plan_json_impl.h"

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

const char *pt_plan_json_kind(const cJSON *it) {
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
                            *path ? path : "the top level", pt_plan_json_kind(obj));
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

/* A number's plausible range: lo <= v <= hi, or 0 too (zero_ok: "absent"
 * or "none", as the field says), in unit. */
typedef struct {
    double lo, hi;
    int zero_ok;
    const char *unit; /* "" for none */
} range;

/* The ranges (docs/plan.md, "The cluster description"). */
static const range R_FLOPS = {1e6, 1e18, 0, " flop/s"};
static const range R_FLOPS0 = {1e6, 1e18, 1, " flop/s"}; /* bf16: 0 is "none" */
static const range R_BYTES = {1e6, 1e15, 0, " bytes"};
static const range R_BW = {1e6, 1e15, 0, " bytes/s"};
static const range R_LATENCY = {1e-9, 1, 0, " s"};
static const range R_FRACTION = {0.01, 1, 1, ""};      /* 0: the default */
static const range R_PER_ITEM = {1e-15, 1, 0, " s"};   /* a float's or a parameter's pass */
static const range R_SECONDS = {1e-12, 1e6, 0, " s"};  /* a measured pass or collective */
static const range R_SECONDS0 = {1e-12, 1e6, 1, " s"}; /* 0: nothing to time */
static const range R_MSG = {1, 1e15, 0, " bytes"};
static const range R_WORLD = {1, PT_PLAN_MAX_WORLD, 0, ""};
static const range R_CORES = {1, 65536, 0, ""};
static const range R_DIM = {1, 16777216, 0, ""}; /* a product's m, n, k */
static const range R_EMBD = {1, 65536, 0, ""};   /* the config table's limits */
static const range R_HEADS = {1, 4096, 0, ""};
static const range R_SEQ = {1, 1048576, 0, ""};
static const range R_VOCAB = {1, PT_VOCAB_MAX, 0, ""};
static const range R_TOKENS = {1, 1073741824, 0, ""};

/* %g of v without its exponent's + and leading 0s ("1e6", "1e-9"). */
static void g_text(double v, char *buf, size_t n) {
    char g[64];
    snprintf(g, sizeof g, "%g", v);
    char *e = strchr(g, 'e');
    if (!e) {
        snprintf(buf, n, "%s", g);
        return;
    }
    const char *x = e + 1;
    int neg = *x == '-';
    if (*x == '+' || *x == '-') x++;
    while (*x == '0' && x[1]) x++;
    snprintf(buf, n, "%.*se%s%s", (int)(e - g), g, neg ? "-" : "", x);
}

/* A value as the messages print it: an integer as one ("2147483648", not
 * "2.14748e+09"), else g_text. */
static void num_text(double v, char *buf, size_t n) {
    if (isfinite(v) && v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, n, "%.0f", v);
    else
        g_text(v, buf, n);
}

/* A limit: g_text where that is exact ("1e6"), else every digit. */
static void limit_text(double v, char *buf, size_t n) {
    char g[64];
    snprintf(g, sizeof g, "%g", v);
    if (strtod(g, NULL) == v)
        g_text(v, buf, n);
    else
        snprintf(buf, n, "%.0f", v);
}

/* "in [1e6, 1e18] flop/s" (with "0 or " where 0 is taken) */
static void range_text(const range *g, int integer, char *buf, size_t n) {
    char lo[32], hi[32];
    limit_text(g->lo, lo, sizeof lo);
    limit_text(g->hi, hi, sizeof hi);
    snprintf(buf, n, "%s%s in [%s, %s]%s", g->zero_ok && g->lo > 0 ? "0 or " : "",
             integer ? "an integer" : "a number", lo, hi, g->unit);
}

static pt_status out_of_range(const reader *r, const char *key, const range *g, int integer,
                              const cJSON *it) {
    char name[256], want[96], got[64];
    field_name(r, key, name, sizeof name);
    range_text(g, integer, want, sizeof want);
    if (cJSON_IsNumber(it))
        num_text(it->valuedouble, got, sizeof got);
    else
        snprintf(got, sizeof got, "%s", pt_plan_json_kind(it));
    return pt_error_set(PT_ERR_INVALID, "%s: %s must be %s (got %s)", r->what, name, want, got);
}

static pt_status read_num(const reader *r, const char *key, int required, const range *g,
                          double *out) {
    const cJSON *it;
    PT_CHECK(get_item(r, key, required, &it));
    if (!it) return PT_OK;
    double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!(isfinite(v) && ((v >= g->lo && v <= g->hi) || (g->zero_ok && v == 0))))
        return out_of_range(r, key, g, 0, it);
    *out = v;
    return PT_OK;
}

/* An integer in g (absent and optional: *out unchanged). */
static pt_status read_int(const reader *r, const char *key, int required, const range *g,
                          int *out) {
    const cJSON *it;
    PT_CHECK(get_item(r, key, required, &it));
    if (!it) return PT_OK;
    double v = cJSON_IsNumber(it) ? it->valuedouble : NAN;
    if (!(isfinite(v) && v == floor(v) && v >= g->lo && v <= g->hi))
        return out_of_range(r, key, g, 1, it);
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
                            pt_plan_json_kind(it));
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
                            pt_plan_json_kind(*arr));
    }
    *n = cJSON_GetArraySize(*arr);
    return PT_OK;
}

static const char *const module_kinds[] = {"embedding", "block", "head"};
static const char *const op_names[PT_PROFILE_NOPS] = {"allreduce", "allgather", "reduce_scatter",
                                                      "broadcast", "p2p"};

/* ---- the profile: one field list per table, for reading and writing ---- */

typedef enum {
    F_INT,     /* int in rg */
    F_INT_OPT, /* int in rg, or absent (0) */
    F_NUM,     /* double in rg */
    F_ENUM,    /* int: the index of the string among `names` */
    F_STR,     /* char[len] among `choices` (NULL: any) */
    F_TRIPLE   /* double[3], each in rg (recompute_s: none, selective, full) */
} field_kind;

typedef struct {
    const char *key;
    field_kind kind;
    size_t off;
    const range *rg;          /* F_INT, F_INT_OPT, F_NUM, F_TRIPLE */
    const char *choices;      /* F_ENUM, F_STR: "a|b|c" */
    const char *const *names; /* F_ENUM: in index order */
    size_t len;               /* F_STR: the buffer */
} field;

#define FLD(T, key, kind, m, rg)                                                                   \
    { key, kind, offsetof(T, m), &rg, NULL, NULL, 0 }
#define FLD_ENUM(T, key, m, c, n)                                                                  \
    { key, F_ENUM, offsetof(T, m), NULL, c, n, 0 }
#define FLD_STR(T, key, m, c)                                                                      \
    { key, F_STR, offsetof(T, m), NULL, c, NULL, sizeof(((T *)0)->m) }
#define NFIELD(a) ((int)(sizeof a / sizeof a[0]))

static const field gemm_fields[] = {
    FLD(pt_profile_gemm, "m", F_INT, m, R_DIM),
    FLD(pt_profile_gemm, "n", F_INT, n, R_DIM),
    FLD(pt_profile_gemm, "k", F_INT, k, R_DIM),
    FLD(pt_profile_gemm, "threads", F_INT, threads, R_CORES),
    FLD(pt_profile_gemm, "flops_s", F_NUM, flops_s, R_FLOPS),
};
static const field module_fields[] = {
    FLD_ENUM(pt_profile_module, "kind", kind, "embedding|block|head", module_kinds),
    FLD(pt_profile_module, "n_embd", F_INT, n_embd, R_EMBD),
    FLD(pt_profile_module, "n_head", F_INT, n_head, R_HEADS),
    FLD(pt_profile_module, "seq_len", F_INT, seq_len, R_SEQ),
    FLD(pt_profile_module, "vocab_size", F_INT, vocab_size, R_VOCAB),
    FLD(pt_profile_module, "tp", F_INT, tp, R_WORLD),
    FLD(pt_profile_module, "tokens", F_INT, tokens, R_TOKENS),
    FLD(pt_profile_module, "threads", F_INT, threads, R_CORES),
    FLD(pt_profile_module, "ranks", F_INT_OPT, ranks, R_WORLD),
    FLD(pt_profile_module, "fwd_s", F_NUM, fwd_s, R_SECONDS),
    /* the embedding has no input gradient: 0 is a measurement */
    FLD(pt_profile_module, "bgrad_s", F_NUM, bgrad_s, R_SECONDS0),
    FLD(pt_profile_module, "wgrad_s", F_NUM, wgrad_s, R_SECONDS0),
    FLD(pt_profile_module, "recompute_s", F_TRIPLE, recompute_s, R_SECONDS0),
};
static const field comm_fields[] = {
    FLD_STR(pt_profile_comm, "backend", backend, "shm|mpi"),
    FLD_ENUM(pt_profile_comm, "op", op, "allreduce|allgather|reduce_scatter|broadcast|p2p",
             op_names),
    FLD(pt_profile_comm, "ranks", F_INT, ranks, R_WORLD),
    FLD(pt_profile_comm, "bytes", F_NUM, bytes, R_MSG),
    FLD(pt_profile_comm, "seconds", F_NUM, seconds, R_SECONDS),
};
/* the profile's own scalars (version, checked apart, and the tables follow) */
static const field profile_fields[] = {
    FLD_STR(pt_profile, "cpu", cpu, NULL),
    FLD_STR(pt_profile, "binary", binary, NULL),
    FLD(pt_profile, "cores", F_INT, cores, R_CORES),
    FLD(pt_profile, "memory_bw", F_NUM, memory_bw, R_BW),
    FLD(pt_profile, "elementwise_s", F_NUM, elementwise_s, R_PER_ITEM),
    FLD(pt_profile, "adamw_s", F_NUM, adamw_s, R_PER_ITEM),
    FLD(pt_profile, "sgd_s", F_NUM, sgd_s, R_PER_ITEM),
};

static pt_status read_triple(const reader *r, const char *key, const range *g, double *out) {
    const cJSON *rc;
    PT_CHECK(get_item(r, key, 1, &rc));
    char name[256], want[96];
    field_name(r, key, name, sizeof name);
    range_text(g, 0, want, sizeof want);
    if (!cJSON_IsArray(rc) || cJSON_GetArraySize(rc) != 3)
        return pt_error_set(PT_ERR_INVALID,
                            "%s: %s must be an array of 3 numbers (none, selective, full), each "
                            "%s",
                            r->what, name, want);
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetArrayItem(rc, i);
        char at[280];
        snprintf(at, sizeof at, "%s[%d]", key, i);
        double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
        if (!(isfinite(x) && ((x >= g->lo && x <= g->hi) || (g->zero_ok && x == 0))))
            return out_of_range(r, at, g, 0, v);
        out[i] = x;
    }
    return PT_OK;
}

/* Every field of the list, required, into the struct at dst. */
static pt_status read_fields(const reader *r, const field *f, int n, void *dst) {
    for (int i = 0; i < n; i++) {
        char *at = (char *)dst + f[i].off;
        switch (f[i].kind) {
        case F_INT:
            PT_CHECK(read_int(r, f[i].key, 1, f[i].rg, (int *)at));
            break;
        case F_INT_OPT:
            PT_CHECK(read_int(r, f[i].key, 0, f[i].rg, (int *)at));
            break;
        case F_NUM:
            PT_CHECK(read_num(r, f[i].key, 1, f[i].rg, (double *)at));
            break;
        case F_STR:
            PT_CHECK(read_str(r, f[i].key, f[i].choices, at, f[i].len));
            break;
        case F_TRIPLE:
            PT_CHECK(read_triple(r, f[i].key, f[i].rg, (double *)at));
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
    static const range any_version = {1, 1e9, 0, ""};
    double version = 0;
    PT_CHECK(read_num(r, "version", 1, &any_version, &version));
    if (version != 1)
        return pt_error_set(PT_ERR_UNSUPPORTED, "%s: profile.version %g is not supported (1)",
                            r->what, version);
    PT_CHECK(read_fields(r, profile_fields, NFIELD(profile_fields), p));
    PT_CHECK(read_num(r, "probe_flops_s", 0, &R_FLOPS, &p->probe_flops_s));
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
    /* what calibrate measures, and what "measured" means to the planner:
     * without them it would model every pass from the peak and say that
     * it modelled them from the product table */
    if (p->n_gemm == 0 || p->n_module == 0)
        return pt_error_set(PT_ERR_INVALID,
                            "%s: %s %s empty: a calibrate profile holds the measured matrix "
                            "products and module passes (partrain calibrate writes them); "
                            "without a profile the plan is modelled from the datasheet figures",
                            r->what,
                            !p->n_gemm && !p->n_module ? "profile.gemm and profile.modules"
                            : !p->n_gemm               ? "profile.gemm"
                                                       : "profile.modules",
                            !p->n_gemm && !p->n_module ? "are" : "is");
    st = read_table(r, "comm", comm_fields, NFIELD(comm_fields), sizeof *p->comm, &t, &p->n_comm);
    p->comm = t;
    return st;
}

static pt_status read_link(const reader *r, const char *key, pt_link *l) {
    static const char *const link_keys[] = {"bw", "latency", NULL};
    reader s;
    int present;
    PT_CHECK(read_obj(r, key, 1, link_keys, &s, &present));
    PT_CHECK(read_num(&s, "bw", 1, &R_BW, &l->bw));
    return read_num(&s, "latency", 1, &R_LATENCY, &l->latency);
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
    PT_CHECK(read_int(&top, "nodes", 1, &R_WORLD, &c->nodes));
    PT_CHECK(read_int(&top, "devices_per_node", 1, &R_WORLD, &c->devices_per_node));
    if ((double)c->nodes * c->devices_per_node > PT_PLAN_MAX_WORLD)
        return pt_error_set(PT_ERR_INVALID,
                            "%s: nodes x devices_per_node (%d x %d = %.0f ranks) must be at most "
                            "%d ranks (the planner's world, as --world's)",
                            what, c->nodes, c->devices_per_node,
                            (double)c->nodes * c->devices_per_node, PT_PLAN_MAX_WORLD);
    PT_CHECK(read_obj(&top, "device", 1, device_keys, &dev, &present));
    PT_CHECK(read_str(&dev, "name", NULL, c->device.name, sizeof c->device.name));
    PT_CHECK(read_obj(&dev, "peak_flops", 1, flops_keys, &fl, &present));
    PT_CHECK(read_num(&fl, "fp32", 1, &R_FLOPS, &c->device.peak_flops_fp32));
    /* absent or 0: the device has no bf16 (a CPU profile) */
    PT_CHECK(read_num(&fl, "bf16", 0, &R_FLOPS0, &c->device.peak_flops_bf16));
    PT_CHECK(read_num(&dev, "memory_bytes", 1, &R_BYTES, &c->device.memory_bytes));
    PT_CHECK(read_num(&dev, "memory_bw", 1, &R_BW, &c->device.memory_bw));
    PT_CHECK(read_obj(&top, "links", 1, links_keys, &links, &present));
    PT_CHECK(read_link(&links, "intra_node", &c->intra_node));
    PT_CHECK(read_link(&links, "inter_node", &c->inter_node));
    c->efficiency = (pt_efficiency){EFF_MATMUL, EFF_ELEMENTWISE, EFF_COMM};
    PT_CHECK(read_obj(&top, "efficiency", 0, eff_keys, &eff, &present));
    if (present) {
        /* 0 (as the template in docs/plan.md writes): the default */
        double v[3] = {0, 0, 0};
        PT_CHECK(read_num(&eff, "matmul", 0, &R_FRACTION, &v[0]));
        PT_CHECK(read_num(&eff, "elementwise", 0, &R_FRACTION, &v[1]));
        PT_CHECK(read_num(&eff, "comm", 0, &R_FRACTION, &v[2]));
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
        case F_NUM:
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
    if (!s) {
        pt_error_set(PT_ERR_NOMEM, "cluster: out of memory writing its JSON");
        return NULL;
    }
    /* what is written loads: a number out of its range or not finite
     * (cJSON writes null) is refused here, with the loader's line */
    pt_cluster *back = NULL;
    if (pt_cluster_load_string(&back, s, "the cluster's JSON") != PT_OK) {
        free(s);
        return NULL;
    }
    pt_cluster_free(back);
    return s;
}
