/* The run configuration: ONE table of every key (name, type, default, range,
 * doc) that drives defaults, JSON parsing, --set overrides, range validation,
 * the --help text and the JSON saved in checkpoints. Cross-key rules follow
 * the table in pt_config_validate.
 *
 * Not here: what the keys do (trainer, model). */
#include "parse_impl.h"

#include "partrain/parallel.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* K_BOOL: an int 0/1. K_LIST: a string in the comma-list grammar (core.h,
 * pt_list), held in a 128-byte field; what its entries mean is checked by
 * pt_config_validate. */
typedef enum { K_INT, K_FLOAT, K_STRING, K_BOOL, K_LIST } key_type;

typedef struct {
    const char *name;
    key_type type;
    size_t offset;
    const char *def;     /* default, in --set syntax */
    double min, max;     /* numbers: inclusive range */
    const char *choices; /* strings: "a|b|c", or NULL for any */
    const char *doc;
} key_def;

#define OFF(field) offsetof(pt_config, field)
#define STR_MAXLEN (PT_CONFIG_STR_MAX - 1)
static const key_def keys[] = {
    {"model.n_layer", K_INT, OFF(model.n_layer), "4", 1, 1000, NULL, "transformer blocks (L)"},
    {"model.n_embd", K_INT, OFF(model.n_embd), "128", 1, 65536, NULL, "channels (C)"},
    {"model.n_head", K_INT, OFF(model.n_head), "4", 1, 4096, NULL,
     "attention heads (NH); must divide n_embd"},
    {"model.vocab_size", K_INT, OFF(model.vocab_size), "256", 1, PT_VOCAB_MAX, NULL,
     "vocabulary (V); 256 for byte-level text; up to 2147483647 (a token id is an int32; ids "
     "above 65535 need llm.c's uint32 token files)"},
    {"model.seq_len", K_INT, OFF(model.seq_len), "128", 1, 1 << 20, NULL,
     "sequence length (T), also the number of learned positions"},
    {"model.recompute", K_STRING, OFF(train.recompute), "none", 0, 0, "none|selective|full",
     "activation recomputation: none (keep every activation), selective (drop attention's "
     "probabilities and the GELU output, recomputed in backward), full (a block keeps only its "
     "input and reruns its forward in backward); gradients bitwise none's"},
    {"model.stage_recompute", K_LIST, OFF(train.stage_recompute), "", 0, 0, NULL,
     "recompute mode per pipeline rank, e.g. \"full,selective,none\" (one per "
     "parallel.pp, each of none|selective|full; a rank's mode covers all its chunks; empty: "
     "model.recompute on every rank)"},
    {"data.train", K_STRING, OFF(data.train), "", 0, 0, NULL,
     "training data: UTF-8 text (bytes) or llm.c tokens (magic 20240520; required for *.bin)"},
    {"data.val", K_STRING, OFF(data.val), "", 0, 0, NULL,
     "validation data (same formats); empty: no validation"},
    {"train.steps", K_INT, OFF(train.steps), "300", 1, 1e9, NULL, "optimizer steps"},
    {"train.batch_size", K_INT, OFF(train.batch_size), "16", 1, 1 << 20, NULL,
     "GLOBAL sequences per optimizer step (same for every layout)"},
    {"train.lr", K_FLOAT, OFF(train.lr), "1e-3", 0, 10, NULL, "peak learning rate"},
    {"train.min_lr", K_FLOAT, OFF(train.min_lr), "1e-4", 0, 10, NULL,
     "learning rate at the end of the cosine decay"},
    {"train.warmup_steps", K_INT, OFF(train.warmup_steps), "20", 0, 1e9, NULL,
     "linear warm-up steps"},
    {"train.weight_decay", K_FLOAT, OFF(train.weight_decay), "0.1", 0, 10, NULL,
     "AdamW decoupled weight decay (matrices only)"},
    {"train.beta1", K_FLOAT, OFF(train.beta1), "0.9", 0, 0.999999, NULL, "AdamW beta1"},
    {"train.beta2", K_FLOAT, OFF(train.beta2), "0.95", 0, 0.999999, NULL, "AdamW beta2"},
    {"train.optimizer", K_STRING, OFF(train.optimizer), "adamw", 0, 0, "adamw|sgd",
     "update rule: adamw, or sgd (p -= lr * (g + weight_decay * p) on the same tensors, "
     "with train.momentum)"},
    {"train.momentum", K_FLOAT, OFF(train.momentum), "0", 0, 0.999999, NULL,
     "sgd: heavy-ball momentum (0: none, and no optimizer state)"},
    {"train.grad_clip", K_FLOAT, OFF(train.grad_clip), "1.0", 0, 1e9, NULL,
     "clip the global gradient norm to this (0: off)"},
    {"train.precision", K_STRING, OFF(train.precision), "fp32", 0, 0, "fp32|bf16",
     "number format: fp32, or bf16 matrix products (summed in fp32) with fp32 master weights, "
     "optimizer state, gradients, LayerNorm, softmax and loss; bf16 activations kept for "
     "backward"},
    {"train.seed", K_INT, OFF(train.seed), "1337", 0, 2147483647, NULL,
     "seed of init and batch sampling"},
    {"train.val_every", K_INT, OFF(train.val_every), "50", 0, 1e9, NULL,
     "validation every N steps (0: only at start and end)"},
    {"train.val_batches", K_INT, OFF(train.val_batches), "8", 1, 1e6, NULL,
     "batches of consecutive windows per validation"},
    {"train.threads", K_INT, OFF(train.threads), "0", 0, 1024, NULL,
     "threads for kernels and BLAS per rank (0: max(1, cores / ranks))"},
    {"parallel.dp", K_INT, OFF(parallel.dp), "1", 1, 1 << 20, NULL, "data-parallel ranks"},
    {"parallel.tp", K_INT, OFF(parallel.tp), "1", 1, 1 << 20, NULL,
     "tensor-parallel ranks (Megatron: heads, MLP columns and vocabulary rows split; must divide "
     "model.n_head)"},
    {"parallel.sequence_parallel", K_BOOL, OFF(parallel.sequence_parallel), "false", 0, 1, NULL,
     "tp > 1: LayerNorm and residual regions split by rows too (model.seq_len divisible by tp)"},
    {"parallel.pp", K_INT, OFF(parallel.pp), "1", 1, 1 << 20, NULL, "pipeline stages"},
    {"parallel.zero", K_INT, OFF(parallel.zero), "0", 0, 3, NULL,
     "ZeRO stage (0-3) inside data parallelism"},
    {"parallel.zero_group", K_INT, OFF(parallel.zero_group), "0", 0, 1 << 20, NULL,
     "ZeRO: shard inside groups of this many ranks, replicate across groups (HSDP; 0: all)"},
    {"parallel.zero_keep_params", K_BOOL, OFF(parallel.zero_keep_params), "false", 0, 1, NULL,
     "ZeRO-3: keep a unit's gathered parameters from its forward to its backward"},
    {"parallel.zero_whole", K_LIST, OFF(parallel.zero_whole), "", 0, 0, NULL,
     "ZeRO-3: modules whose parameters stay whole on every rank (as ZeRO-2: gradients "
     "reduce-scattered, optimizer state sharded, the update all-gathered), e.g. "
     "\"embedding,head,h.0\" (h.N: block N, 0-based, N a list number; a module on another "
     "pipeline stage is ignored there)"},
    {"parallel.microbatches", K_INT, OFF(parallel.microbatches), "1", 1, 1 << 20, NULL,
     "micro-batches per rank and step (dp x microbatches must divide batch_size)"},
    {"parallel.schedule", K_STRING, OFF(parallel.schedule), "none", 0, 0,
     "none|gpipe|1f1b|interleaved|zb1|zbv",
     "order of a step's passes (none: each micro-batch's backward after its forward, and 1f1b "
     "at pp > 1; gpipe: every forward, then every backward; 1f1b, interleaved, zb1, zbv: "
     "pipeline schedules, pp > 1)"},
    {"parallel.virtual_stages", K_INT, OFF(parallel.virtual_stages), "0", 0,
     PT_SCHEDULE_MAX_VIRTUAL, NULL,
     "model chunks per pipeline rank (interleaved: >= 2; zbv: 2; 0: the schedule's own, 2 for "
     "interleaved and zbv, 1 for the others)"},
    {"parallel.stage_layers", K_LIST, OFF(parallel.stage_layers), "", 0, 0, NULL,
     "blocks per pipeline stage, e.g. \"3,3,2\": one per stage, or with "
     "parallel.virtual_stages one per chunk (parallel.pp x virtual_stages of them, in "
     "pipeline order), each at most model.n_layer, adding up to it (empty: balanced by cost)"},
    {"parallel.sync", K_STRING, OFF(parallel.sync), "sync", 0, 0, "sync|local_sgd|stale",
     "gradient synchronization"},
    {"parallel.sync_every", K_INT, OFF(parallel.sync_every), "4", 1, 1e9, NULL,
     "local_sgd: steps between parameter averagings"},
    {"parallel.staleness", K_INT, OFF(parallel.staleness), "1", 1, 64, NULL,
     "stale: step t's gradient all-reduce is applied at step t+staleness"},
    {"parallel.stale_mode", K_STRING, OFF(parallel.stale_mode), "dga", 0, 0, "dga|delayed",
     "stale: dga (fresh local gradient, corrected by the average of step t-staleness) or "
     "delayed (apply the average of step t-staleness as is)"},
    {"parallel.bucket_mb", K_FLOAT, OFF(parallel.bucket_mb), "4", 1e-6, 1e6, NULL,
     "gradient all-reduce bucket size in MiB (buckets may split modules)"},
    {"parallel.overlap", K_BOOL, OFF(parallel.overlap), "true", 0, 1, NULL,
     "launch each bucket's all-reduce during backward (false: after it, for measurement)"},
    {"parallel.outer", K_STRING, OFF(parallel.outer), "avg", 0, 0, "avg|nesterov",
     "local_sgd outer step: plain average, or Nesterov momentum on the averaged delta"},
    {"parallel.outer_lr", K_FLOAT, OFF(parallel.outer_lr), "0.7", 0, 10, NULL,
     "local_sgd nesterov: outer learning rate"},
    {"parallel.outer_momentum", K_FLOAT, OFF(parallel.outer_momentum), "0.5", 0, 0.999999, NULL,
     "local_sgd nesterov: outer momentum"},
    {"checkpoint.dir", K_STRING, OFF(checkpoint.dir), "", 0, 0, NULL,
     "checkpoint directory (empty: no checkpoints)"},
    {"checkpoint.every", K_INT, OFF(checkpoint.every), "0", 0, 1e9, NULL,
     "save every N steps (0: only at the end)"},
    {"checkpoint.keep", K_INT, OFF(checkpoint.keep), "3", 0, 1e9, NULL,
     "keep the newest K step directories, delete older ones (0: keep all; the one 'latest' "
     "names is always kept)"},
    {"checkpoint.async", K_BOOL, OFF(checkpoint.async), "false", 0, 1, NULL,
     "save in the background: the step copies this rank's slices aside and a writer thread "
     "writes them while training goes on (the next save and the end of the run wait for it)"},
    {"checkpoint.drop_rank_state", K_BOOL, OFF(checkpoint.drop_rank_state), "false", 0, 1, NULL,
     "resume: when the checkpoint's per-rank state (stale rounds, dga's local gradients, "
     "local_sgd's per-rank parameters) cannot carry over to this layout, continue from dp "
     "index 0's model with that state restarted (not the uninterrupted run) instead of "
     "refusing"},
    {"comm.timeout", K_FLOAT, OFF(comm.timeout), "10", 0.1, 1e6, NULL,
     "seconds before a rank that stopped (no heartbeat) or stopped taking part ends the job, "
     "naming it; saves wait for rank 0's writes as long as it is alive"},
    {"comm.grad_dtype", K_STRING, OFF(comm.grad_dtype), "fp32", 0, 0, "fp32|bf16",
     "data parallelism's gradient sum on the wire: fp32, or bf16 (half the bytes: each rank's "
     "gradient rounded to bf16, summed in fp32, the sum rounded to bf16; parallel.zero 0 or 1; "
     "the gradient norm is computed in fp32 from the sum either way)"},
    {"comm.check_order", K_BOOL, OFF(comm.check_order), "false", 0, 1, NULL,
     "debug: before every collective its group compares (op, bytes, sequence number) across "
     "its ranks and stops the job at the first mismatch, naming both ranks and both operations "
     "(one small all-gather per collective)"},
    {"log.metrics", K_STRING, OFF(log.metrics), "", 0, 0, NULL,
     "JSON-lines metrics file (empty: none)"},
    {"log.trace", K_STRING, OFF(log.trace), "", 0, 0, NULL,
     "Chrome trace JSON (one track per rank and one per comm thread; empty: none)"},
    {"log.flight", K_STRING, OFF(log.flight), "", 0, 0, NULL,
     "after a job fault (a rank died, stalled or stopped taking part) every surviving rank "
     "writes its flight recorder here: a directory (DIR/ : DIR/flight-rankR.json) or a prefix "
     "(PREFIX-rankR.json); partrain flight merges them (empty: none)"},
    {"log.every", K_INT, OFF(log.every), "10", 1, 1e9, NULL, "progress line every N steps"},
    {"log.probe", K_BOOL, OFF(log.probe), "false", 0, 1, NULL,
     "after each step rank 0 times the speed probe (a one-thread product, about 10 ms, outside "
     "step_ms) and logs its rate as probe_flops_s: on a shared host, tells a slow step from a "
     "slow machine"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

static const key_def *find_key(const char *name) {
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i].name, name)) return &keys[i];
    return NULL;
}

static const char *type_name(key_type t) {
    return t == K_INT     ? "an integer"
           : t == K_FLOAT ? "a number"
           : t == K_BOOL  ? "true or false"
                          : "a string";
}

/* A list key's value s in the list grammar (none of its entries empty;
 * what each means: pt_config_validate), written into out (n bytes, n >
 * strlen(s)) in its one spelling: the entries without the blanks around
 * them, joined by bare commas. So every reader of the config (the trainer,
 * the planner, a layout's name, the JSON saved in checkpoints) sees
 * "1,3" for " 1 , 3". `what` prefixes the message. */
static pt_status canonical_list(const key_def *k, const char *s, char *out, size_t n,
                                const char *what) {
    pt_list l;
    pt_list_init(&l, k->name, s);
    size_t at = 0;
    int r;
    out[0] = '\0';
    while ((r = pt_list_next(&l)) > 0)
        at += (size_t)snprintf(out + at, n - at, "%s%s", at ? "," : "", l.item);
    if (r == 0) return PT_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set((pt_status)r, "%s: %s", what, msg);
}

/* A number of key k as its messages print it: an integer key's limits and
 * integral values in full ("1048576", "100000000000", not "1.04858e+06",
 * "1e+11"), anything else as %g. */
static void number_text(const key_def *k, double v, char *buf, size_t n) {
    if (k->type != K_FLOAT && v == floor(v) && fabs(v) < 1e18)
        snprintf(buf, n, "%.0f", v);
    else
        snprintf(buf, n, "%g", v);
}

/* "KEY must be in [MIN, MAX] (got V)", limits and value printed for k's
 * type; `what` ("config.json", "--set") prefixes it when not NULL. */
static pt_status out_of_range(const key_def *k, double v, const char *what) {
    char lo[32], hi[32], got[32];
    number_text(k, k->min, lo, sizeof lo);
    number_text(k, k->max, hi, sizeof hi);
    number_text(k, v, got, sizeof got);
    return pt_error_set(PT_ERR_INVALID, "%s%s%s must be in [%s, %s] (got %s)", what ? what : "",
                        what ? ": " : "", k->name, lo, hi, got);
}

/* Store a value already converted; checks the range / choices. `what` names
 * the source for messages ("config.json", "--set"). */
static pt_status store_number(pt_config *c, const key_def *k, double v, const char *what) {
    if (!isfinite(v) || v < k->min || v > k->max) return out_of_range(k, v, what);
    if (k->type == K_INT || k->type == K_BOOL) {
        if (v != floor(v))
            return pt_error_set(PT_ERR_INVALID, "%s: %s must be an integer (got %g)", what, k->name,
                                v);
        *(int *)((char *)c + k->offset) = (int)v;
    } else {
        *(double *)((char *)c + k->offset) = v;
    }
    return PT_OK;
}

static pt_status store_string(pt_config *c, const key_def *k, const char *s, const char *what) {
    size_t len = strlen(s);
    /* the per-part lists live in 128-byte fields, the other short strings
     * in 16 */
    size_t cap = k->type == K_LIST ? 127 : !strncmp(k->name, "parallel.", 9) ? 15 : STR_MAXLEN;
    if (len > cap)
        return pt_error_set(PT_ERR_INVALID, "%s: %s is too long (%zu bytes, at most %zu)", what,
                            k->name, len, cap);
    char canon[PT_LIST_ITEM_MAX];
    if (k->type == K_LIST) {
        PT_CHECK(canonical_list(k, s, canon, sizeof canon, what));
        s = canon;
        len = strlen(s);
    }
    if (k->choices) {
        int ok = 0;
        const char *p = k->choices;
        while (*p) {
            const char *bar = strchr(p, '|');
            size_t n = bar ? (size_t)(bar - p) : strlen(p);
            if (n == len && !strncmp(p, s, n)) ok = 1;
            p += n + (bar ? 1 : 0);
        }
        if (!ok)
            return pt_error_set(PT_ERR_INVALID, "%s: %s must be one of %s (got '%s')", what,
                                k->name, k->choices, s);
    }
    memcpy((char *)c + k->offset, s, len + 1);
    return PT_OK;
}

static pt_status set_text(pt_config *c, const key_def *k, const char *value, const char *what) {
    if (k->type == K_STRING || k->type == K_LIST) return store_string(c, k, value, what);
    if (k->type == K_BOOL) {
        if (!strcmp(value, "true") || !strcmp(value, "1")) return store_number(c, k, 1, what);
        if (!strcmp(value, "false") || !strcmp(value, "0")) return store_number(c, k, 0, what);
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be true or false (got '%s')", what,
                            k->name, value);
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (end == value || *end != '\0' || errno == ERANGE)
        return pt_error_set(PT_ERR_INVALID, "%s: %s must be %s (got '%s')", what, k->name,
                            type_name(k->type), value);
    return store_number(c, k, v, what);
}

void pt_config_defaults(pt_config *c) {
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NKEYS; i++) {
        pt_status st = set_text(c, &keys[i], keys[i].def, "default");
        PT_ASSERT(st == PT_OK);
    }
}

pt_status pt_config_set(pt_config *c, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return pt_error_set(PT_ERR_INVALID, "--set %s: expected key=value", assignment);
    char name[128];
    size_t n = (size_t)(eq - assignment);
    if (n >= sizeof name)
        return pt_error_set(PT_ERR_INVALID, "--set: unknown key '%.*s'", (int)n, assignment);
    memcpy(name, assignment, n);
    name[n] = '\0';
    const key_def *k = find_key(name);
    if (!k) return pt_error_set(PT_ERR_INVALID, "--set: unknown key '%s'", name);
    return set_text(c, k, eq + 1, "--set");
}

/* seen[i]: keys[i] was already given in this document. A key may be
 * spelled nested ({"train": {"lr": ..}}) or dotted ("train.lr") at any
 * level; every spelling counts, so that no value silently replaces
 * another. */
static pt_status apply_json(pt_config *c, const cJSON *obj, const char *prefix, const char *what,
                            unsigned char *seen) {
    for (const cJSON *it = obj->child; it; it = it->next) {
        char name[160];
        if (!it->string) return pt_error_set(PT_ERR_FORMAT, "%s: expected an object of keys", what);
        if (snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", it->string) >=
            (int)sizeof name)
            return pt_error_set(PT_ERR_INVALID, "%s: unknown key '%.100s'", what, it->string);
        /* the same name twice in one object (a section too: its keys would
         * merge silently) */
        for (const cJSON *prev = obj->child; prev != it; prev = prev->next)
            if (!strcmp(prev->string, it->string))
                return pt_error_set(PT_ERR_INVALID, "%s: duplicate key '%s'", what, name);
        const key_def *k = find_key(name);
        if (!k) {
            /* a section: its keys must exist under it */
            int section = 0;
            size_t len = strlen(name);
            for (size_t i = 0; i < NKEYS; i++)
                if (!strncmp(keys[i].name, name, len) && keys[i].name[len] == '.') section = 1;
            if (!section) return pt_error_set(PT_ERR_INVALID, "%s: unknown key '%s'", what, name);
            if (!cJSON_IsObject(it))
                return pt_error_set(PT_ERR_INVALID, "%s: %s must be an object of keys", what, name);
            PT_CHECK(apply_json(c, it, name, what, seen));
            continue;
        }
        if (seen[k - keys])
            return pt_error_set(PT_ERR_INVALID,
                                "%s: duplicate key '%s' (given twice, nested or dotted)", what,
                                name);
        seen[k - keys] = 1;
        if (k->type == K_STRING || k->type == K_LIST) {
            if (!cJSON_IsString(it))
                return pt_error_set(PT_ERR_INVALID, "%s: %s must be a string", what, name);
            PT_CHECK(store_string(c, k, it->valuestring, what));
        } else if (k->type == K_BOOL) {
            if (!cJSON_IsBool(it))
                return pt_error_set(PT_ERR_INVALID, "%s: %s must be true or false", what, name);
            PT_CHECK(store_number(c, k, cJSON_IsTrue(it) ? 1 : 0, what));
        } else {
            if (!cJSON_IsNumber(it))
                return pt_error_set(PT_ERR_INVALID, "%s: %s must be %s", what, name,
                                    type_name(k->type));
            PT_CHECK(store_number(c, k, it->valuedouble, what));
        }
    }
    return PT_OK;
}

/* 1-based line of json + at. */
static size_t line_of(const char *json, size_t at) {
    size_t line = 1;
    for (size_t i = 0; i < at && json[i]; i++) line += json[i] == '\n';
    return line;
}

pt_status pt_config_load_string(pt_config *c, const char *json, const char *what) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t line = at ? line_of(json, (size_t)(at - json)) : 1;
        return pt_error_set(PT_ERR_FORMAT, "%s: invalid JSON near line %zu", what, line);
    }
    pt_status st = PT_OK;
    /* one document: after it, only whitespace */
    size_t tail = (size_t)(end - json);
    while (json[tail] && strchr(" \t\r\n", json[tail])) tail++;
    size_t esc = pt_json_first_nul_escape(json, tail);
    if (esc < tail) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: a \\u0000 escape (a NUL inside a string) at line %zu (byte offset "
                          "%zu)",
                          what, line_of(json, esc), esc);
    } else if (json[tail]) {
        st = pt_error_set(PT_ERR_FORMAT,
                          "%s: content after the top-level JSON object at line %zu (byte offset "
                          "%zu)",
                          what, line_of(json, tail), tail);
    } else if (!cJSON_IsObject(root)) {
        st = pt_error_set(PT_ERR_FORMAT, "%s: expected a JSON object at the top", what);
    } else {
        unsigned char seen[NKEYS] = {0};
        st = apply_json(c, root, "", what, seen);
    }
    cJSON_Delete(root);
    return st;
}

pt_status pt_config_load_file(pt_config *c, const char *path) {
    char *text;
    PT_CHECK(pt_read_text_file(path, (size_t)64 << 20, &text));
    pt_status st = pt_config_load_string(c, text, path);
    free(text);
    return st;
}

pt_status pt_config_validate(const pt_config *c) {
    /* bf16 under sequence parallelism all-gathers a rank's bf16 rows as
     * floats, two to one */
    if (!strcmp(c->train.precision, "bf16") && c->parallel.sequence_parallel &&
        c->model.n_embd % 2 != 0)
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "train.precision = bf16 with parallel.sequence_parallel needs an even "
                            "model.n_embd (got %d)",
                            c->model.n_embd);
    if (!strcmp(c->comm.grad_dtype, "bf16") &&
        (c->parallel.zero >= 2 || !strcmp(c->parallel.sync, "local_sgd")))
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "comm.grad_dtype = bf16 is data parallelism's bucketed gradient sum "
                            "(parallel.zero 0 or 1, sync or stale): not with %s",
                            c->parallel.zero >= 2 ? "parallel.zero >= 2 (its reduce-scatter)"
                                                  : "parallel.sync = local_sgd");
    return pt_config_validate_layout(c);
}

pt_status pt_config_validate_layout(const pt_config *c) {
    /* ranges (values set through the table are already checked; this also
     * covers structs filled in by code) */
    for (size_t i = 0; i < NKEYS; i++) {
        const key_def *k = &keys[i];
        if (k->type == K_STRING || k->type == K_LIST) continue;
        double v = k->type != K_FLOAT ? *(const int *)((const char *)c + k->offset)
                                      : *(const double *)((const char *)c + k->offset);
        if (!(v >= k->min && v <= k->max)) return out_of_range(k, v, NULL);
    }
    PT_CHECK(pt_model_config_validate(&c->model));
    if (c->train.momentum > 0 && strcmp(c->train.optimizer, "sgd") != 0)
        return pt_error_set(PT_ERR_INVALID,
                            "train.momentum (%g) applies to train.optimizer = sgd only (got %s)",
                            c->train.momentum, c->train.optimizer);
    if (c->train.min_lr > c->train.lr)
        return pt_error_set(PT_ERR_INVALID, "train.min_lr (%g) must be <= train.lr (%g)",
                            c->train.min_lr, c->train.lr);
    /* Uneven shares are rejected (not padded): every rank runs the same
     * micro-batch shape, so the per-rank work and memory are equal. */
    if (c->train.batch_size % (c->parallel.dp * c->parallel.microbatches) != 0)
        return pt_error_set(PT_ERR_INVALID,
                            "train.batch_size (%d) must be divisible by parallel.dp x "
                            "parallel.microbatches (%d x %d): each rank takes an equal share of "
                            "the global batch",
                            c->train.batch_size, c->parallel.dp, c->parallel.microbatches);
    /* kernels index activations with int: keep every activation tensor of
     * one micro-batch below 2^31 elements */
    double mB = (double)c->train.batch_size / c->parallel.microbatches / c->parallel.dp,
           T = c->model.seq_len;
    double widest = 4.0 * c->model.n_embd > c->model.vocab_size ? 4.0 * c->model.n_embd
                                                                : (double)c->model.vocab_size;
    if (mB * T * widest >= 2147483648.0 || mB * c->model.n_head * T * T >= 2147483648.0)
        return pt_error_set(PT_ERR_INVALID,
                            "train.batch_size / parallel.microbatches (%g) x model.seq_len (%d) is "
                            "too large for this model (an activation would exceed 2^31 elements)",
                            mB, c->model.seq_len);
    /* tensor parallelism splits whole heads (then C and 4C split too); the
     * vocabulary is padded */
    PT_CHECK(pt_shard_check(&c->model, c->parallel.tp));
    if (c->parallel.sequence_parallel && c->parallel.tp < 2)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.sequence_parallel needs parallel.tp > 1 (got %d): it splits "
                            "the tensor-parallel group's work by rows",
                            c->parallel.tp);
    if (c->parallel.sequence_parallel && c->model.seq_len % c->parallel.tp != 0)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.sequence_parallel: model.seq_len (%d) must be divisible by "
                            "parallel.tp (%d)",
                            c->model.seq_len, c->parallel.tp);
    PT_CHECK(pt_config_check_pipeline(c));
    PT_CHECK(pt_config_check_stage_recompute(c));
    PT_CHECK(pt_config_check_zero_whole(c));
    if (c->parallel.zero > 0 && c->parallel.dp > 1 && strcmp(c->parallel.sync, "sync") != 0)
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "parallel.zero = %d needs parallel.sync = sync (got %s): sharded "
                            "state is updated by every rank in the same step",
                            c->parallel.zero, c->parallel.sync);
    if (c->parallel.zero_group > 0 &&
        (c->parallel.zero_group > c->parallel.dp || c->parallel.dp % c->parallel.zero_group != 0))
        return pt_error_set(PT_ERR_INVALID, "parallel.zero_group (%d) must divide parallel.dp (%d)",
                            c->parallel.zero_group, c->parallel.dp);
    return PT_OK;
}

char *pt_config_to_json(const pt_config *c) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    for (size_t i = 0; i < NKEYS; i++) {
        const key_def *k = &keys[i];
        char section[64];
        const char *dot = strchr(k->name, '.');
        size_t n = (size_t)(dot - k->name);
        memcpy(section, k->name, n);
        section[n] = '\0';
        cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, section);
        if (!sec) sec = cJSON_AddObjectToObject(root, section);
        const char *p = (const char *)c + k->offset;
        cJSON *item =
            k->type == K_STRING || k->type == K_LIST ? cJSON_AddStringToObject(sec, dot + 1, p)
            : k->type == K_BOOL ? cJSON_AddBoolToObject(sec, dot + 1, *(const int *)p)
            : k->type == K_INT  ? cJSON_AddNumberToObject(sec, dot + 1, *(const int *)p)
                                : cJSON_AddNumberToObject(sec, dot + 1, *(const double *)p);
        if (!item) {
            cJSON_Delete(root);
            return NULL;
        }
    }
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

void pt_config_print_help(FILE *f) {
    fprintf(f, "config keys (JSON file: nested objects; --set key=value):\n"
               "  a list is a string of entries separated by commas, blanks around an entry\n"
               "  ignored, none empty (\"\" is the empty list); a number in a list is decimal\n"
               "  digits, no sign, no leading zero\n");
    for (size_t i = 0; i < NKEYS; i++) {
        const key_def *k = &keys[i];
        char def[64];
        snprintf(def, sizeof def, k->type == K_STRING || k->type == K_LIST ? "\"%s\"" : "%s",
                 k->def);
        fprintf(f, "  %-22s %-6s %-10s %s", k->name,
                k->type == K_INT     ? "int"
                : k->type == K_FLOAT ? "float"
                : k->type == K_BOOL  ? "bool"
                : k->type == K_LIST  ? "list"
                                     : "string",
                def, k->doc);
        if (k->choices) fprintf(f, " (%s)", k->choices);
        fputc('\n', f);
    }
}

/* Markdown text with '|' escaped, for a table cell. */
static void md_cell(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

/* The same table as markdown: docs/reference.md's "Config keys" section is
 * this text, checked by tests/cli/test_docs.sh. */
void pt_config_print_markdown(FILE *f) {
    fprintf(f, "| key | type | default | meaning |\n| --- | --- | --- | --- |\n");
    for (size_t i = 0; i < NKEYS; i++) {
        const key_def *k = &keys[i];
        fprintf(f, "| `%s` | %s | ", k->name,
                k->type == K_INT     ? "int"
                : k->type == K_FLOAT ? "float"
                : k->type == K_BOOL  ? "bool"
                : k->type == K_LIST  ? "list"
                                     : "string");
        if (k->type == K_STRING || k->type == K_LIST)
            fprintf(f, "`\"%s\"` | ", k->def);
        else
            fprintf(f, "`%s` | ", k->def);
        md_cell(f, k->doc);
        if (k->choices) {
            fputs(" (", f);
            md_cell(f, k->choices);
            fputc(')', f);
        }
        fputs(" |\n", f);
    }
}

void pt_config_layout(const pt_config *c, char *buf, size_t n) {
    int g = c->parallel.zero_group;
    const char *sp = c->parallel.sequence_parallel ? "-sp" : "";
    if (c->parallel.zero > 0 && g > 0 && g < c->parallel.dp) /* HSDP: shard group size */
        snprintf(buf, n, "dp%d-tp%d%s-pp%d-zero%d-g%d", c->parallel.dp, c->parallel.tp, sp,
                 c->parallel.pp, c->parallel.zero, g);
    else
        snprintf(buf, n, "dp%d-tp%d%s-pp%d-zero%d", c->parallel.dp, c->parallel.tp, sp,
                 c->parallel.pp, c->parallel.zero);
}
