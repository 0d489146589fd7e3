/* The GPT-2 model as a list of modules: config validation, the tensor table
 * (GPT-2 names and shapes, flat layout module by module), allocation of
 * parameters, gradients and activations up front, layout-independent init,
 * and the whole-model forward/backward that chains the modules. A model
 * can hold one tensor-parallel rank's slices (pt_model_new_slice, split as
 * shard.c describes); its passes are then modules_tp.c's.
 *
 * Not here: the modules' own math (modules.c), the optimizer, files. */
#include "model_impl.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"

pt_status pt_model_config_validate(const pt_model_config *c) {
    const struct {
        const char *name;
        int v;
    } pos[] = {{"model.n_layer", c->n_layer},
               {"model.n_embd", c->n_embd},
               {"model.n_head", c->n_head},
               {"model.vocab_size", c->vocab_size},
               {"model.seq_len", c->seq_len}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0)
            return pt_error_set(PT_ERR_INVALID, "%s must be > 0 (got %d)", pos[i].name, pos[i].v);
    if (c->n_embd % c->n_head != 0)
        return pt_error_set(PT_ERR_INVALID,
                            "model.n_embd (%d) must be divisible by model.n_head (%d)", c->n_embd,
                            c->n_head);
    if (c->vocab_size > 65536)
        return pt_error_set(PT_ERR_INVALID, "model.vocab_size must be <= 65536 (got %d)",
                            c->vocab_size);
    return PT_OK;
}

size_t pt_model_config_num_params(const pt_model_config *c) {
    size_t C = (size_t)c->n_embd, V = (size_t)c->vocab_size, T = (size_t)c->seq_len;
    size_t block =
        2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return V * C + T * C + (size_t)c->n_layer * block + 2 * C;
}

/* ---- tensor table ---- */

/* Tensor `name` of global shape (d0, d1) (d1 0: a vector): its slice of
 * this model's tp rank takes the next numel floats. */
static void add_tensor(pt_model *m, int module, const char *name, int64_t d0, int64_t d1,
                       int decay) {
    pt_param_info *p = &m->tensors[m->ntensors++];
    snprintf(p->name, sizeof p->name, "%s", name);
    /* pt_model_new_slice checked the split: describing cannot fail, and the
     * description's shape must be the table's */
    pt_status st = pt_shard_describe(&p->shard, &m->cfg, name, m->tp, m->tp_rank);
    PT_ASSERT(st == PT_OK);
    PT_ASSERT_EQ(p->shard.shape[0], d0);
    PT_ASSERT_EQ(p->shard.shape[1], d1 > 0 ? d1 : 0);
    p->ndim = p->shard.ndim;
    pt_shard_local_shape(&p->shard, p->shape);
    p->numel = pt_shard_local_numel(&p->shard);
    p->offset = m->nparams;
    p->decay = decay;
    p->module = module;
    m->nparams += p->numel;
}

/* Module i's tensors (only those of held modules are in the table). */
static void add_module(pt_model *m, int mod) {
    const pt_model_config *c = &m->cfg;
    int64_t C = c->n_embd;
    char name[PT_PARAM_NAME_MAX];
    m->mod_offset[mod] = m->nparams;
    m->mod_first[mod] = m->owned[mod] ? m->ntensors : -1;
    if (!m->owned[mod]) return;
    if (mod == 0) {
        add_tensor(m, mod, "wte.weight", c->vocab_size, C, 1);
        add_tensor(m, mod, "wpe.weight", c->seq_len, C, 1);
    } else if (mod <= c->n_layer) {
        static const struct {
            const char *suffix;
            int rows, cols; /* multiples of C; cols 0 = vector */
            int decay;
        } blk[BLK_NTENSORS] = {
            {"ln_1.weight", 1, 0, 0},        {"ln_1.bias", 1, 0, 0},
            {"attn.c_attn.weight", 1, 3, 1}, {"attn.c_attn.bias", 3, 0, 0},
            {"attn.c_proj.weight", 1, 1, 1}, {"attn.c_proj.bias", 1, 0, 0},
            {"ln_2.weight", 1, 0, 0},        {"ln_2.bias", 1, 0, 0},
            {"mlp.c_fc.weight", 1, 4, 1},    {"mlp.c_fc.bias", 4, 0, 0},
            {"mlp.c_proj.weight", 4, 1, 1},  {"mlp.c_proj.bias", 1, 0, 0},
        };
        for (int k = 0; k < BLK_NTENSORS; k++) {
            snprintf(name, sizeof name, "h.%d.%s", mod - 1, blk[k].suffix);
            add_tensor(m, mod, name, blk[k].rows * C, blk[k].cols * C, blk[k].decay);
        }
    } else {
        add_tensor(m, mod, "ln_f.weight", C, 0, 0);
        add_tensor(m, mod, "ln_f.bias", C, 0, 0);
    }
    m->mod_count[mod] = m->nparams - m->mod_offset[mod];
}

static void build_table(pt_model *m) {
    for (int i = 0; i < m->cfg.n_layer + 2; i++) add_module(m, i);
}

int pt_model_first_tensor(const pt_model *m, int i) {
    PT_ASSERT(m->mod_first[i] >= 0);
    return m->mod_first[i];
}

int pt_model_owns(const pt_model *m, int i) {
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2);
    return m->owned[i];
}

void pt_model_tied_wte(pt_model *m, float **params, float **grads, size_t *n) {
    *params = m->tied_p;
    *grads = m->tied_g;
    *n = m->tied_p ? m->wte_numel : 0;
}

/* ---- lifecycle ---- */

size_t pt_block_carve(const pt_model *m, int max_B, unsigned which, float *p, pt_module_ctx *c) {
    /* the whole-width buffers (LayerNorms, residual) and this rank's share
     * of the split ones (tp: heads, MLP columns) */
    size_t t = (size_t)m->tp, T = (size_t)m->cfg.seq_len, N = (size_t)max_B * T;
    size_t C = (size_t)m->cfg.n_embd, Cl = C / t, NHl = (size_t)m->cfg.n_head / t;
    size_t R = m->sp ? N / t : N; /* rows of the LayerNorm and residual regions held */
    const struct {
        float **ptr;
        size_t n;
        unsigned kind;
    } buf[] = {
        {&c->ln1, R * C, PT_ACTS_KEPT},
        {&c->ln1_mean, R, PT_ACTS_KEPT},
        {&c->ln1_rstd, R, PT_ACTS_KEPT},
        {&c->qkv, N * 3 * Cl, PT_ACTS_KEPT},
        {&c->att, (size_t)max_B * NHl * T * T, PT_ACTS_DROPPED},
        {&c->atty, N * Cl, PT_ACTS_KEPT},
        {&c->res2, R * C, PT_ACTS_KEPT},
        {&c->ln2, R * C, PT_ACTS_KEPT},
        {&c->ln2_mean, R, PT_ACTS_KEPT},
        {&c->ln2_rstd, R, PT_ACTS_KEPT},
        {&c->fch, N * 4 * Cl, PT_ACTS_KEPT},
        {&c->fch_gelu, N * 4 * Cl, PT_ACTS_DROPPED},
    };
    size_t total = 0;
    for (size_t k = 0; k < sizeof buf / sizeof buf[0]; k++) {
        if (!(buf[k].kind & which)) continue;
        if (p) *buf[k].ptr = p + total;
        total += buf[k].n;
    }
    return total;
}

/* What a block's context keeps under each recompute mode. */
static unsigned block_kept(const pt_model *m) {
    return m->recompute == PT_RECOMPUTE_FULL        ? 0
           : m->recompute == PT_RECOMPUTE_SELECTIVE ? PT_ACTS_KEPT
                                                    : PT_ACTS_ALL;
}

/* Floats of module i's context for batches up to max_B (0: none), rounded
 * up to 16 (64 bytes) so that contexts carved one after another stay
 * aligned. */
static size_t ctx_floats(const pt_model *m, int i, int max_B) {
    /* the whole-width buffers (LayerNorms, residual) and this rank's share
     * of the split ones (tp: heads, MLP columns, vocabulary rows) */
    size_t t = (size_t)m->tp, T = (size_t)m->cfg.seq_len, N = (size_t)max_B * T;
    size_t C = (size_t)m->cfg.n_embd;
    size_t Vl = m->tp > 1 ? (size_t)m->vl : (size_t)m->cfg.vocab_size;
    size_t xent = m->tp > 1 ? N * (PT_VOCAB_XENT_STATS + t) : 0;
    size_t R = m->sp ? N / t : N; /* rows of the LayerNorm and residual regions held */
    size_t total = 0;
    pt_module_ctx dummy = {0};
    pt_module_kind kind = pt_model_module_kind(m, i);
    if (kind == PT_MODULE_BLOCK)
        total = pt_block_carve(m, max_B, block_kept(m), NULL, &dummy);
    else if (kind == PT_MODULE_HEAD)
        total = R * C + 2 * R + N * Vl + N + xent;
    return (total + 15) & ~(size_t)15;
}

/* A context on mem (ctx_floats(m, i, max_B) floats; NULL: allocated). */
static pt_status ctx_make(pt_module_ctx **out, const pt_model *m, int i, int max_B, float *mem) {
    *out = NULL;
    PT_ASSERT(i >= 0 && i < pt_model_num_modules(m) && max_B > 0);
    pt_module_ctx *c = calloc(1, sizeof *c);
    if (!c) return pt_error_set(PT_ERR_NOMEM, "module context");
    c->module = i;
    c->kind = pt_model_module_kind(m, i);
    c->max_B = max_B;
    size_t t = (size_t)m->tp, T = (size_t)m->cfg.seq_len, N = (size_t)max_B * T;
    size_t C = (size_t)m->cfg.n_embd;
    size_t Vl = m->tp > 1 ? (size_t)m->vl : (size_t)m->cfg.vocab_size;
    size_t xent = m->tp > 1 ? N * (PT_VOCAB_XENT_STATS + t) : 0;
    size_t R = m->sp ? N / t : N;
    size_t total = ctx_floats(m, i, max_B);
    if (total && mem) {
        c->buf = mem;
    } else if (total) {
        c->buf = pt_mem_alloc(PT_MEM_ACTS, total * sizeof(float));
        c->own_buf = 1;
        if (!c->buf) {
            free(c);
            return PT_ERR_NOMEM;
        }
    }
    float *p = c->buf;
#define TAKE(ptr, n)                                                                               \
    do {                                                                                           \
        (ptr) = p;                                                                                 \
        p += (n);                                                                                  \
    } while (0)
    if (c->kind == PT_MODULE_BLOCK) {
        if (total) p += pt_block_carve(m, max_B, block_kept(m), p, c);
    } else if (c->kind == PT_MODULE_HEAD) {
        TAKE(c->lnf, R * C);
        TAKE(c->lnf_mean, R);
        TAKE(c->lnf_rstd, R);
        TAKE(c->logits, N * Vl);
        TAKE(c->losses, N);
        if (xent) TAKE(c->xent, xent);
    }
#undef TAKE
    PT_ASSERT((size_t)(p - c->buf) <= total);
    *out = c;
    return PT_OK;
}

pt_status pt_module_ctx_new(pt_module_ctx **out, const pt_model *m, int i, int max_B) {
    return ctx_make(out, m, i, max_B, NULL);
}

void pt_module_ctx_free(pt_module_ctx *c) {
    if (!c) return;
    if (c->own_buf) pt_mem_free(c->buf);
    free(c);
}

/* ---- backward scratch and slots ---- */

static pt_status scratch_make(pt_module_scratch **out, const pt_model *m, int max_B);
static pt_status scratch_make_deferred(pt_module_scratch **out, const pt_model *m, int max_B,
                                       unsigned kinds);

pt_status pt_module_scratch_new(pt_module_scratch **out, const pt_model *m, int max_B) {
    return scratch_make(out, m, max_B);
}

pt_status pt_module_scratch_new_deferred(pt_module_scratch **out, const pt_model *m, int max_B,
                                         unsigned kinds) {
    PT_ASSERT(m->scratch && max_B <= m->scratch->max_B);
    PT_ASSERT(kinds && !(kinds >> (PT_MODULE_HEAD + 1)));
    return scratch_make_deferred(out, m, max_B, kinds);
}

int pt_block_stash_fit(const pt_model *m) {
    /* att holds max_B NHl T^2 floats, an (N,C) gradient max_B T C */
    size_t T = (size_t)m->cfg.seq_len, NHl = (size_t)(m->cfg.n_head / m->tp);
    size_t fit = NHl * T / (size_t)m->cfg.n_embd;
    return fit < 4 ? (int)fit : 4;
}

/* A block's recompute region for max_B (0 under NONE). */
static size_t recomp_floats(const pt_model *m, int max_B) {
    pt_module_ctx dummy = {0};
    unsigned region = PT_ACTS_ALL & ~block_kept(m);
    return region ? pt_block_carve(m, max_B, region, NULL, &dummy) : 0;
}

/* A deferred scratch's floats for kinds: rem (the embedding's d_out, the
 * head's d_ln, a block's stash overflow: the largest of those of kinds),
 * then a block's recompute region rc. */
static void deferred_parts(const pt_model *m, int max_B, unsigned kinds, size_t *rem, size_t *rc) {
    size_t NC = (size_t)max_B * (size_t)m->cfg.seq_len * (size_t)m->cfg.n_embd;
    unsigned ends = (1u << PT_MODULE_EMBEDDING) | (1u << PT_MODULE_HEAD);
    int blocks = (kinds >> PT_MODULE_BLOCK) & 1;
    size_t over = blocks ? (size_t)(4 - pt_block_stash_fit(m)) * NC : 0;
    *rem = kinds & ends ? NC : 0;
    if (over > *rem) *rem = over;
    *rc = blocks ? recomp_floats(m, max_B) : 0;
}

size_t pt_module_scratch_bytes(const pt_model *m, int max_B, unsigned deferred_kinds) {
    size_t C = (size_t)m->cfg.n_embd, Cl = C / (size_t)m->tp;
    size_t N = (size_t)max_B * (size_t)m->cfg.seq_len, rem, rc;
    if (deferred_kinds) {
        deferred_parts(m, max_B, deferred_kinds, &rem, &rc);
        return (rem + rc) * sizeof(float);
    }
    /* whole width: d_res2, d_ln, d_out, d_ln1; this rank's heads and MLP
     * columns: the rest; the attention backward's workspace, sequence
     * parallelism's gathered rows and LayerNorm partial gradient */
    size_t att = pt_attention_scratch_floats(max_B, m->cfg.seq_len, m->cfg.n_embd / m->tp,
                                             m->cfg.n_head / m->tp);
    size_t sp = m->sp ? N * C + 2 * C : 0;
    return (N * C * 4 + N * Cl + N * 3 * Cl + N * 4 * Cl + att + sp + recomp_floats(m, max_B)) *
           sizeof(float);
}

static pt_status scratch_make(pt_module_scratch **out, const pt_model *m, int max_B) {
    *out = NULL;
    PT_ASSERT(max_B > 0);
    const pt_model_config *cfg = &m->cfg;
    pt_module_scratch *s = calloc(1, sizeof *s);
    if (!s) return pt_error_set(PT_ERR_NOMEM, "backward scratch");
    size_t C = (size_t)cfg->n_embd, Cl = C / (size_t)m->tp;
    size_t N = (size_t)max_B * (size_t)cfg->seq_len;
    size_t att =
        pt_attention_scratch_floats(max_B, cfg->seq_len, cfg->n_embd / m->tp, cfg->n_head / m->tp);
    size_t sp = m->sp ? N * C + 2 * C : 0; /* full, ln_g */
    size_t rc = recomp_floats(m, max_B);
    s->buf = pt_mem_alloc(PT_MEM_ACTS, pt_module_scratch_bytes(m, max_B, 0));
    if (!s->buf) {
        free(s);
        return PT_ERR_NOMEM;
    }
    float *p = s->buf;
    s->d_res2 = p, p += N * C;
    s->d_ln = p, p += N * C;
    s->d_out = p, p += N * C;
    s->d_ln1 = p, p += N * C;
    s->d_atty = p, p += N * Cl;
    s->d_qkv = p, p += N * 3 * Cl;
    s->d_fch = p, p += N * 4 * Cl;
    s->att = p, p += att;
    if (sp) {
        s->full = p, p += N * C;
        s->ln_g = p, p += 2 * C;
    }
    s->max_B = max_B;
    if (rc) s->recomp = p;
    *out = s;
    return PT_OK;
}

/* rem: the embedding's d_out, the head's d_ln, a block's stash overflow
 * (the largest of those of kinds), then a block's recompute region; the
 * buffers one pass reads while it runs (the attention backward's workspace,
 * sequence parallelism's gathered rows and LayerNorm partial gradient) are
 * the model's scratch's. */
static pt_status scratch_make_deferred(pt_module_scratch **out, const pt_model *m, int max_B,
                                       unsigned kinds) {
    *out = NULL;
    PT_ASSERT(max_B > 0);
    pt_module_scratch *s = calloc(1, sizeof *s);
    if (!s) return pt_error_set(PT_ERR_NOMEM, "backward scratch");
    unsigned ends = (1u << PT_MODULE_EMBEDDING) | (1u << PT_MODULE_HEAD);
    size_t rem, rc;
    deferred_parts(m, max_B, kinds, &rem, &rc);
    if (rem + rc) {
        s->buf = pt_mem_alloc(PT_MEM_ACTS, (rem + rc) * sizeof(float));
        if (!s->buf) {
            free(s);
            return PT_ERR_NOMEM;
        }
    }
    s->deferred = 1;
    s->rem = rem ? s->buf : NULL;
    if (kinds & ends) s->d_out = s->d_ln = s->rem;
    if (rc) s->recomp = s->buf + rem;
    s->att = m->scratch->att;
    s->full = m->scratch->full;
    s->ln_g = m->scratch->ln_g;
    s->max_B = max_B;
    *out = s;
    return PT_OK;
}

void pt_module_scratch_free(pt_module_scratch *s) {
    if (!s) return;
    pt_mem_free(s->buf);
    free(s);
}

void pt_module_ctx_set_scratch(pt_module_ctx *c, pt_module_scratch *s) {
    c->scratch = s;
}

void pt_model_slot_free(pt_model_slot *s) {
    if (!s) return;
    if (s->ctx)
        for (int i = s->nmod - 1; i >= 0; i--) pt_module_ctx_free(s->ctx[i]);
    free(s->ctx);
    free(s->resid);
    if (s->own_stream) pt_mem_free(s->stream);
    free(s);
}

pt_status pt_model_slot_new(pt_model_slot **out, pt_model *m) {
    return pt_model_slot_new_range(out, m, 0, m->cfg.n_layer + 1);
}

/* The stream buffers a range reads and writes: its input resid[first - 1]
 * and its modules' outputs resid[first..last], of the held modules only. */
static int stream_needed(const pt_model *m, int last, int j) {
    return m->owned[j] || (j + 1 <= last && m->owned[j + 1]);
}

/* Floats of a range slot's stream for batches of max_B (rounded to 16). */
static size_t stream_floats(const pt_model *m, int first, int last, int max_B) {
    int L = m->cfg.n_layer, lo = first > 0 ? first - 1 : 0, hi = last < L ? last : L, nres = 0;
    for (int j = lo; j <= hi; j++) nres += stream_needed(m, last, j);
    int head = last == L + 1 && m->owned[L + 1];
    size_t C = (size_t)m->cfg.n_embd, N = (size_t)max_B * (size_t)m->cfg.seq_len;
    size_t R = m->sp ? N / (size_t)m->tp : N; /* rows of the residual stream held */
    return (R * C * (size_t)nres + (head ? N : 0) + 15) & ~(size_t)15;
}

size_t pt_model_slot_bytes_at(const pt_model *m, int first, int last, int max_B) {
    size_t n = stream_floats(m, first, last, max_B);
    for (int i = first; i <= last; i++)
        if (m->owned[i]) n += ctx_floats(m, i, max_B);
    return n * sizeof(float);
}

size_t pt_model_slot_bytes(const pt_model *m, int first, int last) {
    return pt_model_slot_bytes_at(m, first, last, m->max_B);
}

static pt_status slot_make(pt_model_slot **out, pt_model *m, int first, int last, float *mem) {
    *out = NULL;
    int L = m->cfg.n_layer;
    PT_ASSERT(m->max_B > 0 && first >= 0 && first <= last && last <= L + 1);
    pt_status st = PT_OK;
    pt_model_slot *s = calloc(1, sizeof *s);
    if (!s) return pt_error_set(PT_ERR_NOMEM, "model slot");
    s->nmod = L + 2;
    s->ctx = calloc((size_t)s->nmod, sizeof *s->ctx);
    s->resid = calloc((size_t)L + 1, sizeof *s->resid);
    if (!s->ctx || !s->resid) {
        st = pt_error_set(PT_ERR_NOMEM, "model slot");
        goto fail;
    }
    int lo = first > 0 ? first - 1 : 0, hi = last < L ? last : L;
    int head = last == L + 1 && m->owned[L + 1];
    size_t C = (size_t)m->cfg.n_embd, N = (size_t)m->max_B * (size_t)m->cfg.seq_len;
    size_t R = m->sp ? N / (size_t)m->tp : N;
    size_t total = stream_floats(m, first, last, m->max_B);
    if (total && mem) {
        s->stream = mem;
        mem += total;
    } else if (total) {
        s->stream = pt_mem_alloc(PT_MEM_ACTS, total * sizeof(float));
        s->own_stream = 1;
        if (!s->stream) {
            st = PT_ERR_NOMEM;
            goto fail;
        }
    }
    float *p = s->stream;
    for (int j = lo; j <= hi; j++)
        if (stream_needed(m, last, j)) s->resid[j] = p, p += R * C;
    if (head) s->losses = p;
    for (int i = first; i <= last; i++) {
        if (!m->owned[i]) continue;
        PT_CHECK_GOTO(st, ctx_make(&s->ctx[i], m, i, m->max_B, mem), fail);
        if (mem) mem += ctx_floats(m, i, m->max_B);
    }
    *out = s;
    return PT_OK;
fail:
    pt_model_slot_free(s);
    return st;
}

pt_status pt_model_slot_new_range(pt_model_slot **out, pt_model *m, int first, int last) {
    return slot_make(out, m, first, last, NULL);
}

pt_status pt_model_slot_new_range_in(pt_model_slot **out, pt_model *m, int first, int last,
                                     void *mem) {
    PT_ASSERT(mem && ((uintptr_t)mem & 63) == 0);
    return slot_make(out, m, first, last, mem);
}

float *pt_model_slot_stream(pt_model_slot *s, int j) {
    PT_ASSERT(j >= 0 && j < s->nmod - 1 && s->resid[j]);
    return s->resid[j];
}

pt_model_slot *pt_model_own_slot(pt_model *m) {
    return m->own;
}

pt_module_ctx *pt_model_slot_ctx(pt_model_slot *s, int i) {
    PT_ASSERT(i >= 0 && i < s->nmod && s->ctx[i]);
    return s->ctx[i];
}

void pt_model_free(pt_model *m) {
    if (!m) return;
    pt_model_slot_free(m->own);
    pt_mem_free(m->tied_g);
    pt_mem_free(m->tied_p);
    free(m->mod_first);
    free(m->owned);
    pt_mem_free(m->dstream_buf);
    pt_module_scratch_free(m->scratch);
    pt_mem_free(m->grads);
    pt_mem_free(m->params);
    free(m->mod_g);
    free(m->mod_p);
    free(m->mod_count);
    free(m->mod_offset);
    free(m->tensors);
    free(m);
}

pt_status pt_model_new(pt_model **out, const pt_model_config *cfg, int max_B) {
    *out = NULL;
    if (max_B <= 0) {
        PT_CHECK(pt_model_config_validate(cfg));
        return pt_error_set(PT_ERR_INVALID, "batch size must be > 0 (got %d)", max_B);
    }
    return pt_model_new_slice(out, cfg, max_B, 1, 0);
}

pt_status pt_model_new_slice(pt_model **out, const pt_model_config *cfg, int max_B, int tp,
                             int tp_rank) {
    pt_model_options o = {.tp = tp, .tp_rank = tp_rank};
    return pt_model_new_opts(out, cfg, max_B, &o);
}

pt_status pt_model_new_sp(pt_model **out, const pt_model_config *cfg, int max_B, int tp,
                          int tp_rank) {
    pt_model_options o = {.tp = tp, .tp_rank = tp_rank, .sp = 1};
    return pt_model_new_opts(out, cfg, max_B, &o);
}

pt_status pt_model_new_opts(pt_model **out, const pt_model_config *cfg, int max_B,
                            const pt_model_options *o) {
    *out = NULL;
    PT_CHECK(pt_model_config_validate(cfg));
    int tp = o->tp > 0 ? o->tp : 1, tp_rank = o->tp_rank, sp = o->sp;
    if (max_B < 0)
        return pt_error_set(PT_ERR_INVALID, "batch size must be >= 0 (got %d; 0: the table only)",
                            max_B);
    if (sp && (tp < 2 || cfg->seq_len % tp != 0))
        return pt_error_set(PT_ERR_INVALID,
                            "sequence parallelism needs parallel.tp > 1 dividing model.seq_len "
                            "(got tp %d, seq_len %d)",
                            tp, cfg->seq_len);
    PT_CHECK(pt_shard_check(cfg, tp));
    if (tp_rank < 0 || tp_rank >= tp)
        return pt_error_set(PT_ERR_INVALID, "tensor-parallel rank %d outside [0, %d)", tp_rank, tp);
    if (o->recompute < PT_RECOMPUTE_NONE || o->recompute > PT_RECOMPUTE_FULL)
        return pt_error_set(PT_ERR_INVALID, "model.recompute: unknown mode %d", (int)o->recompute);
    pt_status st = PT_OK;
    pt_model *m = calloc(1, sizeof *m);
    if (!m) return pt_error_set(PT_ERR_NOMEM, "model");
    m->cfg = *cfg;
    m->max_B = max_B;
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->sp = sp;
    m->recompute = o->recompute;
    m->no_slot = o->no_slot;
    int L = cfg->n_layer, nmod = L + 2;
    m->tensors =
        calloc((size_t)(EMB_NTENSORS + BLK_NTENSORS * L + HEAD_NTENSORS), sizeof *m->tensors);
    m->mod_offset = calloc((size_t)nmod, sizeof(size_t));
    m->mod_count = calloc((size_t)nmod, sizeof(size_t));
    m->mod_p = calloc((size_t)nmod, sizeof(float *));
    m->mod_g = calloc((size_t)nmod, sizeof(float *));
    m->owned = malloc((size_t)nmod);
    m->mod_first = malloc((size_t)nmod * sizeof(int));
    if (!m->tensors || !m->mod_offset || !m->mod_count || !m->mod_p || !m->mod_g || !m->owned ||
        !m->mod_first) {
        st = pt_error_set(PT_ERR_NOMEM, "model tables");
        goto fail;
    }
    int whole = 1;
    for (int i = 0; i < nmod; i++) {
        m->owned[i] = o->owned ? o->owned[i] != 0 : 1;
        whole &= m->owned[i];
    }
    build_table(m);
    PT_ASSERT(tp > 1 || !whole || m->nparams == pt_model_config_num_params(cfg));
    {
        pt_shard w;
        st = pt_shard_describe(&w, cfg, "wte.weight", tp, tp_rank);
        PT_ASSERT(st == PT_OK);
        m->v0 = (int)w.piece[0].offset;
        m->vl = (int)(w.piece[0].extent + w.pad);
        m->vreal = (int)w.piece[0].extent;
        m->wte_numel = pt_shard_local_numel(&w);
    }
    if (max_B == 0) { /* the table only */
        *out = m;
        return PT_OK;
    }

    m->params = pt_mem_alloc(PT_MEM_PARAMS, (m->nparams ? m->nparams : 1) * sizeof(float));
    m->grads = pt_mem_alloc(PT_MEM_GRADS, (m->nparams ? m->nparams : 1) * sizeof(float));
    if (!m->params || !m->grads) {
        st = PT_ERR_NOMEM;
        goto fail;
    }
    if (m->owned[L + 1] && !m->owned[0]) { /* the head's copy of the tied wte */
        m->tied_p = pt_mem_alloc(PT_MEM_PARAMS, m->wte_numel * sizeof(float));
        m->tied_g = pt_mem_alloc(PT_MEM_GRADS, m->wte_numel * sizeof(float));
        if (!m->tied_p || !m->tied_g) {
            st = PT_ERR_NOMEM;
            goto fail;
        }
        memset(m->tied_p, 0, m->wte_numel * sizeof(float));
        memset(m->tied_g, 0, m->wte_numel * sizeof(float));
    }
    for (int i = 0; i < nmod; i++) pt_model_set_module_buffers(m, i, NULL, NULL);

    PT_CHECK_GOTO(st, pt_module_scratch_new(&m->scratch, m, max_B), fail);
    size_t C = (size_t)cfg->n_embd, N = (size_t)max_B * (size_t)cfg->seq_len;
    size_t R = sp ? N / (size_t)tp : N; /* rows of the residual stream held */
    m->dstream_buf = pt_mem_alloc(PT_MEM_ACTS, 2 * R * C * sizeof(float));
    if (!m->dstream_buf) {
        st = PT_ERR_NOMEM;
        goto fail;
    }
    m->dstream[0] = m->dstream_buf;
    m->dstream[1] = m->dstream_buf + R * C;
    /* a stage's passes run in the pipeline's slots, not in one of its own */
    if (whole && !o->no_slot) PT_CHECK_GOTO(st, pt_model_slot_new(&m->own, m), fail);
    *out = m;
    return PT_OK;
fail:
    pt_model_free(m);
    return st;
}

size_t pt_model_buffer_bytes(const pt_model *m, int max_B, pt_mem_cat c) {
    int L = m->cfg.n_layer, whole = !m->no_slot;
    for (int i = 0; i < L + 2; i++) whole &= m->owned[i];
    size_t flat = (m->nparams ? m->nparams : 1) * sizeof(float);
    size_t tied = m->owned[L + 1] && !m->owned[0] ? m->wte_numel * sizeof(float) : 0;
    if (c == PT_MEM_PARAMS || c == PT_MEM_GRADS) return flat + tied;
    if (c != PT_MEM_ACTS || max_B <= 0) return 0;
    size_t N = (size_t)max_B * (size_t)m->cfg.seq_len;
    size_t R = m->sp ? N / (size_t)m->tp : N;
    return pt_module_scratch_bytes(m, max_B, 0) + 2 * R * (size_t)m->cfg.n_embd * sizeof(float) +
           (whole ? pt_model_slot_bytes_at(m, 0, L + 1, max_B) : 0);
}

void pt_model_tp(const pt_model *m, int *size, int *rank) {
    *size = m->tp;
    *rank = m->tp_rank;
}
int pt_model_sequence_parallel(const pt_model *m) {
    return m->sp;
}
void pt_model_set_tp_comm(pt_model *m, pt_comm *tp) {
    PT_ASSERT(!tp || (pt_comm_size(tp) == m->tp && pt_comm_rank(tp) == m->tp_rank));
    m->tp_comm = tp;
}
void pt_model_test_skip_f(pt_model *m, int on) {
    m->skip_f = on;
}
pt_status pt_model_take_error(pt_model *m) {
    pt_status st = m->tp_err;
    if (st == PT_OK) return PT_OK;
    m->tp_err = PT_OK;
    return pt_error_set(st, "%s", m->tp_errmsg);
}
const pt_model_config *pt_model_config_of(const pt_model *m) {
    return &m->cfg;
}
int pt_model_max_batch(const pt_model *m) {
    return m->max_B;
}
float *pt_model_params(pt_model *m) {
    return m->params;
}
float *pt_model_grads(pt_model *m) {
    return m->grads;
}
size_t pt_model_num_params(const pt_model *m) {
    return m->nparams;
}
void pt_model_zero_grads(pt_model *m) {
    if (m->grads) memset(m->grads, 0, m->nparams * sizeof(float));
    if (m->tied_g) memset(m->tied_g, 0, m->wte_numel * sizeof(float));
}

void pt_model_set_module_buffers(pt_model *m, int i, float *params, float *grads) {
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2);
    m->mod_p[i] = params ? params : m->params ? m->params + m->mod_offset[i] : NULL;
    m->mod_g[i] = grads ? grads : m->grads ? m->grads + m->mod_offset[i] : NULL;
}

float *pt_model_module_params(pt_model *m, int i) {
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2);
    return m->mod_p[i];
}
float *pt_model_module_grads(pt_model *m, int i) {
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2);
    return m->mod_g[i];
}

void pt_model_drop_flat(pt_model *m, int params, int grads) {
    int nmod = m->cfg.n_layer + 2;
    for (int i = 0; i < nmod; i++) {
        if (params && m->params && m->mod_p[i] == m->params + m->mod_offset[i]) m->mod_p[i] = NULL;
        if (grads && m->grads && m->mod_g[i] == m->grads + m->mod_offset[i]) m->mod_g[i] = NULL;
    }
    if (params) {
        pt_mem_free(m->params);
        m->params = NULL;
    }
    if (grads) {
        pt_mem_free(m->grads);
        m->grads = NULL;
    }
}
int pt_model_num_tensors(const pt_model *m) {
    return m->ntensors;
}
const pt_param_info *pt_model_tensor(const pt_model *m, int i) {
    PT_ASSERT(i >= 0 && i < m->ntensors);
    return &m->tensors[i];
}
const pt_param_info *pt_model_find(const pt_model *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}
int pt_model_num_modules(const pt_model *m) {
    return m->cfg.n_layer + 2;
}
pt_module_kind pt_model_module_kind(const pt_model *m, int i) {
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2);
    if (i == 0) return PT_MODULE_EMBEDDING;
    if (i <= m->cfg.n_layer) return PT_MODULE_BLOCK;
    return PT_MODULE_HEAD;
}
void pt_model_module_region(const pt_model *m, int i, size_t *offset, size_t *count) {
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2);
    *offset = m->mod_offset[i];
    *count = m->mod_count[i];
}
pt_module_ctx *pt_model_ctx(pt_model *m, int i) {
    return pt_model_slot_ctx(m->own, i);
}

/* ---- init ---- */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* normal(0, std) by GLOBAL element index, run by run of the slice (t = 1:
 * every run has global = local) */
static void draw_normal(float *w, const pt_shard *sh, uint64_t key, float std) {
    size_t nruns = pt_shard_num_runs(sh);
    for (size_t k = 0; k < nruns; k++) {
        size_t g, l, len;
        pt_shard_run(sh, k, &g, &l, &len);
        pt_fill_normal(w + l, (long)len, key, g, std);
    }
}

void pt_model_draw_weights(pt_model *m, uint64_t seed) {
    PT_ASSERT(m->params);
    float proj_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->ntensors; i++) {
        const pt_param_info *t = &m->tensors[i];
        float *w = m->params + t->offset;
        if (t->ndim == 1) {
            /* LayerNorm weights 1; every bias and LayerNorm bias 0 */
            float v = ends_with(t->name, "ln_1.weight") || ends_with(t->name, "ln_2.weight") ||
                              !strcmp(t->name, "ln_f.weight")
                          ? 1.0f
                          : 0.0f;
            for (size_t j = 0; j < t->numel; j++) w[j] = v;
            continue;
        }
        draw_normal(w, &t->shard, pt_rng_key(seed, t->name),
                    ends_with(t->name, ".c_proj.weight") ? proj_std : 0.02f);
    }
    if (m->tied_p) { /* the head's copy: the embedding's draw */
        pt_shard w;
        pt_status st = pt_shard_describe(&w, &m->cfg, "wte.weight", m->tp, m->tp_rank);
        PT_ASSERT(st == PT_OK);
        draw_normal(m->tied_p, &w, pt_rng_key(seed, "wte.weight"), 0.02f);
    }
}

/* ---- whole model ---- */

void pt_model_set_hooks(pt_model *m, const pt_model_hooks *h) {
    if (h)
        m->hooks = *h;
    else
        memset(&m->hooks, 0, sizeof m->hooks);
}

/* The installed hook at point k of module i's pass in context c. */
static pt_status hook(pt_model *m, pt_hook_kind k, int i, const pt_batch *b, pt_module_ctx *c) {
    if (!m->hooks.fn) return PT_OK;
    pt_hook_point p = {i, b->micro, b->last, c};
    return m->hooks.fn(m->hooks.arg, k, &p);
}

pt_status pt_model_forward_range(pt_model *m, pt_model_slot *s, const pt_batch *b, int first,
                                 int last, float *loss) {
    PT_ASSERT(b->B > 0 && b->B <= m->max_B && b->T > 0 && b->T <= m->cfg.seq_len);
    int L = m->cfg.n_layer;
    s->last = *b;
    s->have_targets = b->targets != NULL;
    for (int i = first; i <= last; i++) {
        const float *in = i == 0 ? NULL : s->resid[i <= L ? i - 1 : L];
        float *out = i <= L ? s->resid[i] : b->targets ? s->losses : NULL;
        /* before the buffers are read: ZeRO-3's hook gathers them */
        PT_CHECK(hook(m, PT_HOOK_BEFORE_FORWARD, i, b, s->ctx[i]));
        pt_module_forward(m, i, s->ctx[i], b, in, out);
        PT_CHECK(pt_model_take_error(m)); /* a tensor-parallel collective's */
        PT_CHECK(hook(m, PT_HOOK_AFTER_FORWARD, i, b, s->ctx[i]));
    }
    if (last == L + 1 && b->targets && loss) {
        size_t N = (size_t)b->B * (size_t)b->T;
        double sum = 0;
        for (size_t i = 0; i < N; i++) sum += s->losses[i];
        *loss = (float)(sum / (double)N);
    }
    return PT_OK;
}

pt_status pt_model_backward_range(pt_model *m, pt_model_slot *s, int first, int last,
                                  const float *dy, float *dx, int split) {
    PT_ASSERT(s->have_targets);
    int L = m->cfg.n_layer;
    const pt_batch *b = &s->last;
    const float *d = dy;
    int k = 0;
    for (int i = last; i >= first; i--) {
        float *din = i == 0 ? NULL : i == first ? dx : m->dstream[k];
        PT_CHECK(hook(m, PT_HOOK_BEFORE_BACKWARD, i, b, s->ctx[i]));
        if (split)
            pt_module_backward_input(m, i, s->ctx[i], b, i == L + 1 ? NULL : d, din);
        else
            pt_module_backward(m, i, s->ctx[i], b, i == L + 1 ? NULL : d, din);
        PT_CHECK(pt_model_take_error(m));
        PT_CHECK(hook(m, PT_HOOK_AFTER_BACKWARD, i, b, s->ctx[i]));
        d = din;
        k ^= 1;
    }
    return PT_OK;
}

pt_status pt_model_backward_weight_range(pt_model *m, pt_model_slot *s, int first, int last) {
    for (int i = last; i >= first; i--) {
        PT_CHECK(hook(m, PT_HOOK_BEFORE_WEIGHT, i, &s->last, s->ctx[i]));
        pt_module_backward_weight(m, i, s->ctx[i], &s->last);
        PT_CHECK(pt_model_take_error(m));
        PT_CHECK(hook(m, PT_HOOK_AFTER_WEIGHT, i, &s->last, s->ctx[i]));
    }
    return PT_OK;
}

pt_status pt_model_recompute_range(pt_model *m, pt_model_slot *s, int first, int last) {
    for (int i = last; i >= first; i--) pt_module_recompute(m, i, s->ctx[i], &s->last);
    return pt_model_take_error(m);
}

pt_status pt_model_forward_in(pt_model *m, pt_model_slot *s, const pt_batch *b, float *loss) {
    return pt_model_forward_range(m, s, b, 0, m->cfg.n_layer + 1, loss);
}

pt_status pt_model_backward_in(pt_model *m, pt_model_slot *s) {
    return pt_model_backward_range(m, s, 0, m->cfg.n_layer + 1, NULL, NULL, 0);
}

pt_status pt_model_forward(pt_model *m, const pt_batch *b, float *loss) {
    PT_ASSERT(m->own); /* not a model of pt_model_options.no_slot */
    return pt_model_forward_in(m, m->own, b, loss);
}

pt_status pt_model_backward(pt_model *m) {
    return pt_model_backward_in(m, m->own);
}

const float *pt_model_logits(const pt_model *m) {
    return m->own->ctx[m->cfg.n_layer + 1]->logits;
}
