/* Sharded tensors: which slice of each GPT-2 parameter a tensor-parallel
 * rank holds (Megatron's split, model.h "sharded tensors"), and the slice as
 * runs of consecutive elements, which init and the checkpoint reader and
 * writer walk to map slice elements to global ones.
 *
 * A description is a pure function of (config, name, t, r), derived from the
 * name alone: model.c builds its tensor table through it and checks that
 * the shapes agree, so that the table and the split cannot drift apart.
 *
 * A vocabulary that t does not divide is padded (model.h): wte's slice has
 * `pad` rows past its real ones, which are in the local shape (the model
 * allocates them) but in no run (init and checkpoints never see them).
 *
 * Not here: the tensor-parallel compute (linears on slices, the all-reduces,
 * the vocabulary-parallel kernels), files. */
#include "model_impl.h"

#include <string.h>

pt_status pt_shard_check(const pt_model_config *c, int t) {
    if (t < 1) return pt_error_set(PT_ERR_INVALID, "parallel.tp must be >= 1 (got %d)", t);
    if (c->n_head % t != 0)
        return pt_error_set(PT_ERR_INVALID,
                            "parallel.tp (%d) must divide model.n_head (%d): every tensor-parallel "
                            "rank holds whole attention heads",
                            t, c->n_head);
    /* the vocabulary needs no check: it is padded to a multiple of t */
    return PT_OK;
}

/* How a tensor splits: its global shape in multiples (rows x C, cols x C;
 * cols 0: a vector), the split dimension (-1: whole) and the number of
 * equal blocks of that dimension that are split separately (c_attn's q, k,
 * v: 3). */
typedef struct {
    const char *suffix;
    int rows, cols;
    int split_dim, blocks;
} split_rule;

static const split_rule block_rules[] = {
    {"ln_1.weight", 1, 0, -1, 1},       {"ln_1.bias", 1, 0, -1, 1},
    {"attn.c_attn.weight", 1, 3, 1, 3}, {"attn.c_attn.bias", 3, 0, 0, 3},
    {"attn.c_proj.weight", 1, 1, 0, 1}, {"attn.c_proj.bias", 1, 0, -1, 1},
    {"ln_2.weight", 1, 0, -1, 1},       {"ln_2.bias", 1, 0, -1, 1},
    {"mlp.c_fc.weight", 1, 4, 1, 1},    {"mlp.c_fc.bias", 4, 0, 0, 1},
    {"mlp.c_proj.weight", 4, 1, 0, 1},  {"mlp.c_proj.bias", 1, 0, -1, 1},
};

/* The layer of "h.<i>.<rest>" with 0 <= i < L written as %d writes it (no
 * sign, no leading zero), *rest after the dot; -1 otherwise. */
static long layer_of(const char *name, int L, const char **rest) {
    if (strncmp(name, "h.", 2) != 0) return -1;
    const char *p = name + 2;
    long v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (digits && v == 0) return -1; /* leading zero */
        v = v * 10 + (*p - '0');
        if (v >= L) return -1;
    }
    if (!digits || *p != '.') return -1;
    *rest = p + 1;
    return v;
}

pt_status pt_shard_describe(pt_shard *out, const pt_model_config *c, const char *name, int t,
                            int r) {
    memset(out, 0, sizeof *out);
    PT_CHECK(pt_shard_check(c, t));
    if (r < 0 || r >= t)
        return pt_error_set(PT_ERR_INVALID, "tensor-parallel rank %d outside [0, %d)", r, t);
    int64_t C = c->n_embd;
    int64_t rows = 0, cols = 0;
    int split_dim = -1, blocks = 1;
    const char *rest = NULL;
    if (!strcmp(name, "wte.weight")) {
        rows = c->vocab_size, cols = C, split_dim = 0;
    } else if (!strcmp(name, "wpe.weight")) {
        rows = c->seq_len, cols = C;
    } else if (!strcmp(name, "ln_f.weight") || !strcmp(name, "ln_f.bias")) {
        rows = C;
    } else if (layer_of(name, c->n_layer, &rest) >= 0) {
        for (size_t i = 0; i < sizeof block_rules / sizeof block_rules[0]; i++)
            if (!strcmp(rest, block_rules[i].suffix)) {
                rows = block_rules[i].rows * C;
                cols = block_rules[i].cols * C;
                split_dim = block_rules[i].split_dim;
                blocks = block_rules[i].blocks;
            }
    }
    if (rows == 0)
        return pt_error_set(PT_ERR_INVALID, "'%s' is not a parameter of this model", name);
    out->ndim = cols ? 2 : 1;
    out->shape[0] = rows;
    out->shape[1] = cols;
    out->split_dim = split_dim;
    if (split_dim < 0) return PT_OK;
    if (!strcmp(name, "wte.weight")) {
        /* rows [r*Vl, (r+1)*Vl) of the vocabulary padded to Vp = t*Vl; the
         * real ones end at V (none on a rank past it) */
        int64_t V = rows, Vl = (V + t - 1) / t, lo = r * Vl, hi = lo + Vl < V ? lo + Vl : V;
        int64_t real = hi > lo ? hi - lo : 0;
        out->npieces = 1;
        out->piece[0].offset = lo;
        out->piece[0].extent = real;
        out->pad = Vl - real;
        return PT_OK;
    }
    /* each block of the split dimension splits t ways: pt_shard_check made
     * every extent divisible (n_head, hence C and 4C) */
    int64_t block = out->shape[split_dim] / blocks, part = block / t;
    PT_ASSERT(block * blocks == out->shape[split_dim] && part * t == block);
    out->npieces = blocks;
    for (int b = 0; b < blocks; b++) {
        out->piece[b].offset = b * block + r * part;
        out->piece[b].extent = part;
    }
    return PT_OK;
}

void pt_shard_local_shape(const pt_shard *s, int64_t shape[2]) {
    shape[0] = s->shape[0];
    shape[1] = s->shape[1];
    if (s->split_dim < 0) return;
    int64_t e = 0;
    for (int p = 0; p < s->npieces; p++) e += s->piece[p].extent;
    shape[s->split_dim] = e + s->pad;
}

size_t pt_shard_local_numel(const pt_shard *s) {
    int64_t shape[2];
    pt_shard_local_shape(s, shape);
    return (size_t)shape[0] * (size_t)(s->ndim == 2 ? shape[1] : 1);
}

size_t pt_shard_numel(const pt_shard *s) {
    return (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
}

int pt_shard_whole(const pt_shard *s) {
    return s->pad == 0 && pt_shard_local_numel(s) == pt_shard_numel(s);
}

/* Pieces of a row split with real rows (a rank of wte past the vocabulary
 * has none). Column splits are never padded nor empty. */
static size_t nonempty_pieces(const pt_shard *s) {
    size_t n = 0;
    for (int p = 0; p < s->npieces; p++) n += s->piece[p].extent > 0;
    return n;
}

size_t pt_shard_num_runs(const pt_shard *s) {
    if (s->split_dim < 0) return 1;
    if (s->split_dim == 0) return nonempty_pieces(s);
    PT_ASSERT(s->pad == 0);
    return (size_t)s->shape[0] * (size_t)s->npieces;
}

void pt_shard_run(const pt_shard *s, size_t k, size_t *global, size_t *local, size_t *len) {
    PT_ASSERT(k < pt_shard_num_runs(s));
    if (s->split_dim < 0) {
        *global = *local = 0;
        *len = pt_shard_local_numel(s);
        return;
    }
    if (s->split_dim == 0) {
        /* a row split: the k-th non-empty piece's rows, whole, are
         * contiguous in both; padding follows the last piece */
        size_t width = s->ndim == 2 ? (size_t)s->shape[1] : 1, before = 0, seen = 0;
        int p = 0;
        for (; p < s->npieces; p++) {
            if (s->piece[p].extent > 0 && seen++ == k) break;
            before += (size_t)s->piece[p].extent;
        }
        PT_ASSERT(p < s->npieces);
        *global = (size_t)s->piece[p].offset * width;
        *local = before * width;
        *len = (size_t)s->piece[p].extent * width;
        return;
    }
    /* a column split: piece p of row `row` */
    size_t np = (size_t)s->npieces, row = k / np, p = k % np, before = 0, lcols = 0;
    for (size_t q = 0; q < np; q++) {
        if (q < p) before += (size_t)s->piece[q].extent;
        lcols += (size_t)s->piece[q].extent;
    }
    *global = row * (size_t)s->shape[1] + (size_t)s->piece[p].offset;
    *local = row * lcols + before;
    *len = (size_t)s->piece[p].extent;
}
