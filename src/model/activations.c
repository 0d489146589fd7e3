/* Activations: what a module keeps from its forward for its backward (a
 * context per module, carved by recompute mode), the backward scratch that
 * lives while a backward runs (or from a deferred B to its W), the slots
 * that hold one micro-batch in flight, the model's own buffers of those
 * kinds, and their sizes -- one function per size, which the allocation
 * and the planner (src/plan/memory.c) both call, so that the planner
 * counts what the runtime allocates, to the byte.
 *
 * Not here: what the modules compute in them (modules.c), parameters and
 * gradients (model.c). */
#include "model_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"

/* ---- contexts ---- */

/* One buffer of a carve: an activation in the model's precision (act) or
 * an fp32 one (ptr). */
typedef struct {
    pt_act *act;
    float **ptr;
    size_t n;
    unsigned kind;
    int only;    /* 0: in both precisions; 1: fp32 only; 2: bf16 only */
    pt_bf16 **h; /* a bf16 buffer (only 2) */
} carve_buf;

/* Carve bufs' `which` ones from p (NULL: count only); their floats. */
static size_t carve(const pt_model *m, const carve_buf *buf, size_t nbuf, unsigned which,
                    float *p) {
    size_t total = 0;
    for (size_t k = 0; k < nbuf; k++) {
        if (!(buf[k].kind & which) || buf[k].only == (m->bf16 ? 1 : 2)) continue;
        int half = (buf[k].act && m->bf16) || buf[k].h;
        if (p && buf[k].h)
            *buf[k].h = (pt_bf16 *)(p + total);
        else if (p && buf[k].act && half)
            *buf[k].act = (pt_act){NULL, (pt_bf16 *)(p + total)};
        else if (p && buf[k].act)
            *buf[k].act = (pt_act){p + total, NULL};
        else if (p)
            *buf[k].ptr = p + total;
        total += half ? pt_half_floats(buf[k].n) : buf[k].n;
    }
    return total;
}

size_t pt_block_carve(const pt_model *m, int max_B, unsigned which, float *p, pt_module_ctx *c) {
    /* the whole-width buffers (LayerNorms, residual) and this rank's share
     * of the split ones (tp: heads, MLP columns); bf16 keeps the attention
     * probabilities packed (only the causal blocks) */
    size_t t = (size_t)m->tp, T = (size_t)m->cfg.seq_len, N = (size_t)max_B * T;
    size_t C = (size_t)m->cfg.n_embd, Cl = C / t, NHl = (size_t)m->cfg.n_head / t;
    size_t R = m->sp ? N / t : N; /* rows of the LayerNorm and residual regions held */
    size_t att = m->bf16 ? pt_attention16_att_elems((int)T) : T * T;
    const carve_buf buf[] = {
        {&c->ln1, NULL, R * C, PT_ACTS_KEPT, 0, NULL},
        {NULL, &c->ln1_mean, R, PT_ACTS_KEPT, 0, NULL},
        {NULL, &c->ln1_rstd, R, PT_ACTS_KEPT, 0, NULL},
        {&c->qkv, NULL, N * 3 * Cl, PT_ACTS_KEPT, 0, NULL},
        {&c->att, NULL, (size_t)max_B * NHl * att, PT_ACTS_DROPPED, 0, NULL},
        {&c->atty, NULL, N * Cl, PT_ACTS_KEPT, 0, NULL},
        {NULL, &c->res2, R * C, PT_ACTS_KEPT, 1, NULL},
        {&c->ln2, NULL, R * C, PT_ACTS_KEPT, 1, NULL},
        {NULL, NULL, R * C, PT_ACTS_KEPT, 2, &c->xhat2},
        {NULL, &c->ln2_mean, R, PT_ACTS_KEPT, 0, NULL},
        {NULL, &c->ln2_rstd, R, PT_ACTS_KEPT, 0, NULL},
        {&c->fch, NULL, N * 4 * Cl, PT_ACTS_KEPT, 0, NULL},
        {&c->fch_gelu, NULL, N * 4 * Cl, PT_ACTS_DROPPED, 0, NULL},
    };
    return carve(m, buf, sizeof buf / sizeof buf[0], which, p);
}

/* The head's context: ln_f's output and statistics, the logits (bf16: the
 * blocked cross-entropy's kept values and block maxima), the losses, and
 * the cross-entropy's reductions (fp32: tp > 1 only, the fused kernel
 * needs none at t = 1). */
static size_t head_carve(const pt_model *m, int max_B, float *p, pt_module_ctx *c) {
    size_t t = (size_t)m->tp, N = (size_t)max_B * (size_t)m->cfg.seq_len;
    size_t C = (size_t)m->cfg.n_embd;
    size_t Vl = m->tp > 1 ? (size_t)m->vl : (size_t)m->cfg.vocab_size;
    size_t R = m->sp ? N / t : N;
    size_t nblk = m->bf16 ? ((size_t)m->vl + pt_xent_block_cols(m) - 1) / pt_xent_block_cols(m) : 0;
    size_t xent = m->bf16 ? N * (8 + t) : m->tp > 1 ? N * (PT_VOCAB_XENT_STATS + t) : 0;
    const carve_buf buf[] = {
        {&c->lnf, NULL, R * C, 1, 0, NULL},     {NULL, &c->lnf_mean, R, 1, 0, NULL},
        {NULL, &c->lnf_rstd, R, 1, 0, NULL},    {&c->logits, NULL, N * Vl, 1, 0, NULL},
        {NULL, &c->bmax, N * nblk, 1, 0, NULL}, {NULL, &c->losses, N, 1, 0, NULL},
        {NULL, &c->xent, xent, 1, 0, NULL},
    };
    size_t n = carve(m, buf, sizeof buf / sizeof buf[0], 1, p);
    if (p && !nblk) c->bmax = NULL;
    if (p && !xent) c->xent = NULL;
    return n;
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
    size_t total = 0;
    pt_module_ctx dummy = {0};
    pt_module_kind kind = pt_kind_of(m, i);
    if (kind == PT_MODULE_BLOCK)
        total = pt_block_carve(m, max_B, block_kept(m), NULL, &dummy);
    else if (kind == PT_MODULE_HEAD)
        total = head_carve(m, max_B, NULL, &dummy);
    return (total + 15) & ~(size_t)15;
}

/* A context on mem (ctx_floats(m, i, max_B) floats; NULL: allocated). */
static pt_status ctx_make(pt_module_ctx **out, const pt_model *m, int i, int max_B, float *mem) {
    *out = NULL;
    PT_ASSERT(i >= 0 && i < m->cfg.n_layer + 2 && max_B > 0);
    pt_module_ctx *c = calloc(1, sizeof *c);
    if (!c) return pt_error_set(PT_ERR_NOMEM, "module context");
    c->module = i;
    c->kind = pt_kind_of(m, i);
    c->max_B = max_B;
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
    if (total && c->kind == PT_MODULE_BLOCK)
        p += pt_block_carve(m, max_B, block_kept(m), p, c);
    else if (c->kind == PT_MODULE_HEAD)
        p += head_carve(m, max_B, p, c);
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
    /* bf16: the dead buffers are bf16, the gradients fp32: all in rem */
    if (m->bf16) return 0;
    /* att holds max_B NHl T^2 floats, an (N,C) gradient max_B T C */
    size_t T = (size_t)m->cfg.seq_len, NHl = (size_t)(m->cfg.n_head / m->tp);
    size_t fit = NHl * T / (size_t)m->cfg.n_embd;
    return fit < 4 ? (int)fit : 4;
}

size_t pt_block_stash_extra(const pt_model *m, int max_B) {
    size_t N = (size_t)max_B * (size_t)m->cfg.seq_len, Cl = (size_t)(m->cfg.n_embd / m->tp);
    return m->bf16 ? N * 3 * Cl + N * 4 * Cl : 0;
}

/* The attention backward's workspace, in the model's precision. */
static size_t att_scratch_floats(const pt_model *m, int max_B) {
    int T = m->cfg.seq_len, Cl = m->cfg.n_embd / m->tp, NHl = m->cfg.n_head / m->tp;
    return m->bf16 ? pt_attention16_scratch_floats(max_B, T, Cl, NHl)
                   : pt_attention_scratch_floats(max_B, T, Cl, NHl);
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
    if (blocks && m->bf16) /* d_qkv and d_fch too (pt_block_stash_extra) */
        over += pt_block_stash_extra(m, max_B);
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
    size_t att = att_scratch_floats(m, max_B);
    size_t sp = m->sp ? N * C + 2 * C : 0;
    size_t ln16 = m->bf16 ? pt_half_floats(N * C) : 0;
    return (N * C * 4 + N * Cl + N * 3 * Cl + N * 4 * Cl + att + sp + ln16 +
            recomp_floats(m, max_B)) *
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
    size_t att = att_scratch_floats(m, max_B);
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
    if (m->bf16) s->ln16 = (pt_bf16 *)p, p += pt_half_floats(N * C);
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
    s->ln16 = m->scratch->ln16;
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

/* ---- the model's own ---- */

/* The gradient ping-pong of the whole-model backward: (R,C) x 2, R the rows
 * of the residual stream held. */
static size_t dstream_floats(const pt_model *m, int max_B) {
    size_t N = (size_t)max_B * (size_t)m->cfg.seq_len;
    size_t R = m->sp ? N / (size_t)m->tp : N;
    return 2 * R * (size_t)m->cfg.n_embd;
}

/* Whether the model keeps a slot of its own: the whole model, unless the
 * caller runs its passes in slots of its own (pt_model_options.no_slot). */
static int whole_model(const pt_model *m) {
    int whole = !m->no_slot;
    for (int i = 0; i < m->cfg.n_layer + 2; i++) whole &= m->owned[i];
    return whole;
}

pt_status pt_model_acts_alloc(pt_model *m) {
    PT_CHECK(pt_module_scratch_new(&m->scratch, m, m->max_B));
    size_t n = dstream_floats(m, m->max_B);
    m->dstream_buf = pt_mem_alloc(PT_MEM_ACTS, n * sizeof(float));
    if (!m->dstream_buf) return PT_ERR_NOMEM;
    m->dstream[0] = m->dstream_buf;
    m->dstream[1] = m->dstream_buf + n / 2;
    /* a stage's passes run in the pipeline's slots, not in one of its own */
    if (whole_model(m)) PT_CHECK(pt_model_slot_new(&m->own, m));
    return PT_OK;
}

void pt_model_acts_free(pt_model *m) {
    pt_model_slot_free(m->own);
    pt_mem_free(m->dstream_buf);
    pt_module_scratch_free(m->scratch);
    m->own = NULL;
    m->dstream_buf = NULL;
    m->scratch = NULL;
}

size_t pt_model_acts_bytes(const pt_model *m, int max_B) {
    int L = m->cfg.n_layer;
    return pt_module_scratch_bytes(m, max_B, 0) + dstream_floats(m, max_B) * sizeof(float) +
           (whole_model(m) ? pt_model_slot_bytes_at(m, 0, L + 1, max_B) : 0);
}
