/* The GPT-2 model as a list of modules: config validation, the tensor table
 * (GPT-2 names and shapes, flat layout module by module), the parameter and
 * gradient buffers, allocated up front, and layout-independent init. A
 * model can hold one tensor-parallel rank's slices (pt_model_new_slice,
 * split as shard.c describes).
 *
 * Not here: the modules' own math (modules.c), their activations
 * (activations.c), the passes over them (passes.c), the optimizer,
 * files. */
#include "model_impl.h"
#include "model_test.h"

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
    return PT_OK; /* vocab_size <= PT_VOCAB_MAX: an int holds no more */
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

int pt_model_owns(const pt_model *m, int i) {
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2);
    return m->owned[i];
}

void pt_model_tied_wte(pt_model *m, float **params, float **grads, size_t *n) {
    *params = m->tied_p;
    *grads = m->tied_g;
    *n = m->tied_p ? m->wte_numel : 0;
}

/* ---- bf16 weight copies (pt_model_options.bf16) ---- */

/* The bf16 copies' elements: each held block's region, the head's wte. */
static size_t w16_elems(const pt_model *m) {
    if (!m->bf16) return 0;
    size_t n = 0, C = (size_t)m->cfg.n_embd;
    for (int i = 1; i <= m->cfg.n_layer; i++)
        if (m->owned[i]) n += m->mod_count[i] + 4 * C; /* ln_2's 2C floats as 4C bf16 */
    return (n + (m->owned[m->cfg.n_layer + 1] ? m->wte_numel : 0) + 1) & ~(size_t)1;
}

static pt_status w16_alloc(pt_model *m) {
    size_t n = w16_elems(m);
    if (!n) return PT_OK;
    int L = m->cfg.n_layer;
    m->w16 = calloc((size_t)L + 2, sizeof *m->w16);
    m->ln2p = calloc((size_t)L + 2, sizeof *m->ln2p);
    m->w16_buf = pt_mem_alloc(PT_MEM_PARAMS, n * sizeof(pt_bf16));
    if (!m->w16 || !m->ln2p || !m->w16_buf) return pt_error_set(PT_ERR_NOMEM, "bf16 weights");
    float *f = (float *)m->w16_buf; /* the fp32 ln_2 copies first: aligned */
    for (int i = 1; i <= L; i++)
        if (m->owned[i]) m->ln2p[i] = f, f += 2 * (size_t)m->cfg.n_embd;
    pt_bf16 *p = (pt_bf16 *)f;
    for (int i = 1; i <= L; i++)
        if (m->owned[i]) m->w16[i] = p, p += m->mod_count[i];
    if (m->owned[L + 1]) m->wte16 = p;
    return PT_OK;
}

void pt_model_round_weights(pt_model *m, int i) {
    if (!m->bf16) return;
    pt_module_kind k = pt_kind_of(m, i);
    if (k == PT_MODULE_BLOCK) {
        size_t C = (size_t)m->cfg.n_embd;
        pt_bf16_from_f32(m->w16[i], m->mod_p[i], m->mod_count[i]);
        memcpy(m->ln2p[i], W(m, i, BLK_LN2_W), C * sizeof(float));
        memcpy(m->ln2p[i] + C, W(m, i, BLK_LN2_B), C * sizeof(float));
    }
    if (k == PT_MODULE_HEAD) pt_bf16_from_f32(m->wte16, HEAD_WTE(m), m->wte_numel);
}

int pt_model_bf16(const pt_model *m) {
    return m->bf16;
}

/* ---- lifecycle ---- */

void pt_model_free(pt_model *m) {
    if (!m) return;
    pt_model_acts_free(m);
    pt_mem_free(m->w16_buf);
    free(m->ln2p);
    free(m->w16);
    pt_mem_free(m->tied_g);
    pt_mem_free(m->tied_p);
    free(m->mod_first);
    free(m->owned);
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
    m->bf16 = o->bf16;
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
    PT_CHECK_GOTO(st, w16_alloc(m), fail);
    PT_CHECK_GOTO(st, pt_model_acts_alloc(m), fail);
    *out = m;
    return PT_OK;
fail:
    pt_model_free(m);
    return st;
}

size_t pt_model_buffer_bytes(const pt_model *m, int max_B, pt_mem_cat c) {
    int L = m->cfg.n_layer;
    size_t flat = (m->nparams ? m->nparams : 1) * sizeof(float);
    size_t tied = m->owned[L + 1] && !m->owned[0] ? m->wte_numel * sizeof(float) : 0;
    if (c == PT_MEM_PARAMS) return flat + tied + w16_elems(m) * sizeof(pt_bf16);
    if (c == PT_MEM_GRADS) return flat + tied;
    if (c != PT_MEM_ACTS || max_B <= 0) return 0;
    return pt_model_acts_bytes(m, max_B);
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
    return pt_kind_of(m, i);
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
