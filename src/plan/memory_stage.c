/* A pipeline stage as the memory model reads it (plan_memory_impl.h):
 * its chunks, its pass list's counts and its table-only model, and the
 * cache that keeps what layouts share of them (stage cuts, pass list
 * counts, stage models) across a search's calls. A stage's model is the
 * model's slice that the stage holds, shortened in the cache to the
 * stage's own blocks (shorten()).
 *
 * Not here: the sizes counted from them (memory.c). */
#include "partrain/parallel.h"

#include "plan_memory_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A rank's list, summed up; then freed. */
static void sched_sum_of(sched_sum *u, pt_schedule *sc, int p) {
    memset(u, 0, sizeof *u);
    u->virtual_stages = sc->virtual_stages;
    u->split = sc->split;
    u->in_flight = sc->in_flight;
    u->pending_w = pt_schedule_pending_w(sc);
    for (int ch = 0; ch < PT_SCHEDULE_MAX_VIRTUAL; ch++)
        u->chunk_in_flight[ch] = sc->chunk_in_flight[ch];
    for (int ch = 0; ch < sc->virtual_stages && p > 1; ch++)
        u->vstage[ch] = pt_schedule_virtual_stage(sc, ch);
    u->bytes = pt_schedule_bytes(sc);
    pt_schedule_free(sc);
}

/* Every pipeline rank's list (p > 1) or the whole model's (p 1), summed
 * up into u[0..p-1]. */
static pt_status sched_sums(sched_sum *u, const char *name, int m, int p, int v) {
    pt_schedule *sc = calloc((size_t)p, sizeof *sc);
    if (!sc) return pt_error_set(PT_ERR_NOMEM, "plan: %d pass lists", p);
    pt_status st =
        p > 1 ? pt_schedule_build_all(sc, name, m, p, v) : pt_schedule_build(sc, name, m);
    for (int r = 0; st == PT_OK && r < p; r++) sched_sum_of(&u[r], &sc[r], p);
    free(sc);
    return st;
}

static model_sum *model_sum_new(const pt_model *m, int L) {
    model_sum *u = malloc(sizeof *u + sizeof u->cnt[0] * ((size_t)L + 2));
    if (!u) return NULL;
    u->params_bytes = pt_model_buffer_bytes(m, 0, PT_MEM_PARAMS);
    u->n = pt_model_num_params(m);
    for (int i = 0; i < L + 2; i++) {
        size_t off;
        pt_model_module_region(m, i, &off, &u->cnt[i]);
    }
    return u;
}

void pt_plan_stage_free(stage_info *s) {
    free(s->glob);
    if (!s->own) return;
    pt_model_free(s->m);
    free((model_sum *)s->u);
}

/* ---- the cache (plan_memory_impl.h) ----
 * Open addressing on byte keys, the table doubled at half full. */
typedef struct {
    uint64_t h;
    size_t klen;
    unsigned char *key; /* NULL: empty */
    void *val;
} slot;
typedef struct {
    slot *s;
    size_t cap, n;
} table;

#ifndef MODEL_CACHE_MAX
#define MODEL_CACHE_MAX 1024
#endif

struct pt_plan_memory_cache {
    pt_model_config model; /* what every entry was computed for */
    int have_model;
    long hits;    /* lookups answered (pt_plan_memory_cache_hits) */
    table cuts;   /* "schedule/p/v/stage_layers" -> p x v pt_stage */
    table scheds; /* "schedule/m/p/v" -> p sched_sum */
    table models; /* fp32: (tp, sp, recompute, whole, owned[L + 2]) -> pt_model */
    table sums;   /* bf16: the same key -> model_sum */
};

static uint64_t bytes_hash(const void *key, size_t n) {
    const unsigned char *b = key;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void *table_get(const table *t, const void *key, size_t klen, uint64_t h) {
    for (size_t i = t->cap ? h & (t->cap - 1) : 0; t->cap; i = (i + 1) & (t->cap - 1)) {
        const slot *e = &t->s[i];
        if (!e->key) return NULL;
        if (e->h == h && e->klen == klen && !memcmp(e->key, key, klen)) return e->val;
    }
    return NULL;
}

/* Takes val (freed with the table) unless it fails. */
static pt_status table_put(table *t, const void *key, size_t klen, uint64_t h, void *val) {
    if (2 * (t->n + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        slot *s = calloc(cap, sizeof *s);
        if (!s) return pt_error_set(PT_ERR_NOMEM, "plan: memory cache");
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->s[i].key) continue;
            size_t j = t->s[i].h & (cap - 1);
            while (s[j].key) j = (j + 1) & (cap - 1);
            s[j] = t->s[i];
        }
        free(t->s);
        t->s = s, t->cap = cap;
    }
    unsigned char *k = malloc(klen);
    if (!k) return pt_error_set(PT_ERR_NOMEM, "plan: memory cache");
    memcpy(k, key, klen);
    size_t j = h & (t->cap - 1);
    while (t->s[j].key) j = (j + 1) & (t->cap - 1);
    t->s[j] = (slot){.h = h, .klen = klen, .key = k, .val = val};
    t->n++;
    return PT_OK;
}

static void table_clear(table *t, int models) {
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->s[i].key) continue;
        free(t->s[i].key);
        if (models)
            pt_model_free(t->s[i].val);
        else
            free(t->s[i].val);
    }
    free(t->s);
    memset(t, 0, sizeof *t);
}

pt_status pt_plan_memory_cache_new(pt_plan_memory_cache **out) {
    *out = calloc(1, sizeof **out);
    return *out ? PT_OK : pt_error_set(PT_ERR_NOMEM, "plan: memory cache");
}

long pt_plan_memory_cache_hits(const pt_plan_memory_cache *k) {
    return k ? k->hits : 0;
}

void pt_plan_memory_cache_free(pt_plan_memory_cache *k) {
    if (!k) return;
    table_clear(&k->cuts, 0);
    table_clear(&k->scheds, 0);
    table_clear(&k->models, 1);
    table_clear(&k->sums, 0);
    free(k);
}

void pt_plan_memory_cache_model(pt_plan_memory_cache *k, const pt_model_config *m) {
    if (!k || (k->have_model && !memcmp(&k->model, m, sizeof *m))) return;
    /* another model: nothing kept holds */
    table_clear(&k->cuts, 0);
    table_clear(&k->scheds, 0);
    table_clear(&k->models, 1);
    table_clear(&k->sums, 0);
    k->model = *m, k->have_model = 1;
}

/* The stage cut of c (p x v entries) into *cut: k's, or computed into buf. */
pt_status pt_plan_stage_cut(pt_plan_memory_cache *k, const pt_config *c, pt_stage *buf,
                            const pt_stage **cut) {
    int p = c->parallel.pp, v = pt_config_virtual_stages(c), m = c->parallel.microbatches;
    const char *name = pt_config_schedule(c);
    char key[sizeof c->parallel.stage_layers + 64];
    size_t n = 0;
    if (k) {
        /* the micro-batches weigh only a cut of several chunks a rank */
        n = (size_t)snprintf(key, sizeof key, "%s/%d/%d/%d/%s/%d/%d/%s", name, p, v, v > 1 ? m : 0,
                             c->parallel.stage_layers, c->parallel.dp, c->train.batch_size,
                             c->train.optimizer);
        if (n >= sizeof key) n = sizeof key - 1;
        const pt_stage *hit = table_get(&k->cuts, key, n, bytes_hash(key, n));
        if (hit) {
            k->hits++;
            *cut = hit;
            return PT_OK;
        }
    }
    pt_stage_step step = pt_config_stage_step(c, c->parallel.dp); /* the trainer's cut */
    PT_CHECK(pt_stage_split_step(&c->model, &step, name, p, v, m, c->parallel.stage_layers, buf));
    *cut = buf;
    if (!k) return PT_OK;
    pt_stage *own = malloc(sizeof *own * (size_t)p * (size_t)v);
    if (!own) return pt_error_set(PT_ERR_NOMEM, "plan: memory cache");
    memcpy(own, buf, sizeof *own * (size_t)p * (size_t)v);
    pt_status st = table_put(&k->cuts, key, n, bytes_hash(key, n), own);
    if (st != PT_OK) free(own);
    *cut = st == PT_OK ? own : buf;
    return st;
}

/* The p ranks' pass list summaries of c: k's, or computed into buf. */
pt_status pt_plan_stage_scheds(pt_plan_memory_cache *k, const pt_config *c, sched_sum *buf,
                               const sched_sum **out) {
    int p = c->parallel.pp, v = pt_config_virtual_stages(c), m = c->parallel.microbatches;
    const char *name = pt_config_schedule(c);
    char key[96];
    size_t n = 0;
    if (k) {
        n = (size_t)snprintf(key, sizeof key, "%s/%d/%d/%d", name, m, p, v);
        if (n >= sizeof key) n = sizeof key - 1;
        const sched_sum *hit = table_get(&k->scheds, key, n, bytes_hash(key, n));
        if (hit) {
            k->hits++;
            *out = hit;
            return PT_OK;
        }
    }
    PT_CHECK(sched_sums(buf, name, m, p, v));
    *out = buf;
    if (!k) return PT_OK;
    sched_sum *own = malloc(sizeof *own * (size_t)p);
    if (!own) return pt_error_set(PT_ERR_NOMEM, "plan: memory cache");
    memcpy(own, buf, sizeof *own * (size_t)p);
    pt_status st = table_put(&k->scheds, key, n, bytes_hash(key, n), own);
    if (st != PT_OK) free(own);
    *out = st == PT_OK ? own : buf;
    return st;
}

/* The table-only model of o's slice of model mc into s: fp32 the model,
 * bf16 its summary; k's (lent) or new (s->own). */
static pt_status model_of(pt_plan_memory_cache *k, const pt_model_config *mc,
                          const pt_model_options *o, int gpu, stage_info *s) {
    int L = mc->n_layer;
    size_t n = 4 * sizeof(int) + (size_t)L + 2;
    unsigned char *key = NULL;
    uint64_t h = 0;
    table *t = k ? gpu ? &k->sums : &k->models : NULL;
    if (k) {
        key = calloc(n, 1);
        if (!key) return pt_error_set(PT_ERR_NOMEM, "plan: memory cache");
        int head[4] = {o->tp, o->sp, (int)o->recompute, o->owned == NULL};
        memcpy(key, head, sizeof head);
        if (o->owned) memcpy(key + sizeof head, o->owned, (size_t)L + 2);
        h = bytes_hash(key, n);
        void *hit = table_get(t, key, n, h);
        if (hit) {
            k->hits++;
            if (gpu)
                s->u = hit;
            else
                s->m = hit;
            free(key);
            return PT_OK;
        }
    }
    s->own = 1;
    pt_model *m;
    pt_status st = pt_model_new_opts(&m, mc, 0, o);
    if (st != PT_OK) {
        free(key);
        return st;
    }
    void *val = m;
    if (gpu) {
        model_sum *u = model_sum_new(m, L);
        pt_model_free(m);
        if (!u) {
            free(key);
            return pt_error_set(PT_ERR_NOMEM, "plan: stage tables");
        }
        s->u = u, val = u;
    } else {
        s->m = m;
    }
    /* the fp32 models bounded: forgotten all at once (a model is lent for
     * one stage only); a failed put leaves the stage its own */
    if (k && !gpu && t->n >= MODEL_CACHE_MAX) table_clear(t, 1);
    if (k && table_put(t, key, n, h, val) == PT_OK) s->own = 0;
    free(key);
    return PT_OK;
}

/* The stage whose modules are own[] (L + 2 flags) as a model of fewer
 * blocks, each run of blocks it does not hold shortened to one, into
 * own2[] and glob[] (the model's index of each; L + 2 room): returns its
 * blocks. What the memory model reads of a stage -- its modules' tensors
 * and regions, its chunks' slots and scratch, whether it holds every
 * module -- is the same there: a block the stage does not hold has no
 * tensor and no context, and a run of them only says where the chunks
 * end and that the stage is not the whole model, which one block says
 * as well. Its tables are the stage's size, not the model's (a
 * table-only model of 1,000 blocks is 2.2 MB, whatever it holds), and
 * the stages of one shape at different places share one model. */
static int shorten(const unsigned char *own, int L, unsigned char *own2, int *glob) {
    int n = 0;
    own2[0] = own[0], glob[0] = 0;
    for (int i = 1; i <= L; i++) {
        if (!own[i] && i > 1 && !own[i - 1]) continue; /* the run's first stands for it */
        n++;
        own2[n] = own[i], glob[n] = i;
    }
    own2[n + 1] = own[L + 1], glob[n + 1] = L + 1;
    return n;
}

/* glob's index of the model's module i (glob strictly increasing, n long). */
static int local_index(const int *glob, int n, int i) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (glob[mid] < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Pipeline rank r's stage: its chunks, and its model from k (shortened)
 * or built whole (k NULL: pt_plan_memory, the reference that
 * test_plan_memory_cache holds the shortened one to). */
pt_status pt_plan_stage_new(stage_info *s, const pt_config *c, const pt_stage *cut, int r,
                            pt_recompute rc, const sched_sum *sum, int gpu,
                            pt_plan_memory_cache *k) {
    memset(s, 0, sizeof *s);
    int p = c->parallel.pp, v = pt_config_virtual_stages(c), L = c->model.n_layer;
    const char *name = pt_config_schedule(c);
    s->sched = *sum;
    s->L = L;
    pt_model_config mc = c->model;
    unsigned char *own = NULL;
    if (p > 1) {
        own = calloc(2 * ((size_t)L + 2), 1);
        if (!own) return pt_error_set(PT_ERR_NOMEM, "plan: stage tables");
        for (int ch = 0; ch < v; ch++) {
            const pt_stage *g = &cut[s->sched.vstage[ch]];
            s->first[ch] = g->first;
            s->last[ch] = g->last;
            for (int i = g->first; i <= g->last; i++) own[i] = 1;
            int nb = g->last - g->first + 1, nm = nb;
            nb -= (g->first == 0) + (g->last == L + 1);
            s->blocks[ch] = nb;
            if (nm > s->most_modules) s->most_modules = nm;
            if (g->last == L + 1) s->head_chunk = ch;
        }
        int c0, cl;
        int r_emb = pt_schedule_locate(name, p, v, 0, &c0);
        int r_head = pt_schedule_locate(name, p, v, p * v - 1, &cl);
        s->emb_here = r_emb == r;
        s->head_here = r_head == r;
        s->tied_peer = r_emb != r_head && (s->emb_here || s->head_here);
        if (k) {
            s->glob = malloc(sizeof *s->glob * ((size_t)L + 2));
            if (!s->glob) {
                free(own);
                return pt_error_set(PT_ERR_NOMEM, "plan: stage tables");
            }
            unsigned char *own2 = own + L + 2;
            s->L = mc.n_layer = shorten(own, L, own2, s->glob);
            for (int ch = 0; ch < v; ch++) {
                s->first[ch] = local_index(s->glob, s->L + 2, s->first[ch]);
                s->last[ch] = local_index(s->glob, s->L + 2, s->last[ch]);
            }
            memmove(own, own2, (size_t)s->L + 2);
        }
    } else {
        s->first[0] = 0;
        s->last[0] = L + 1;
        s->emb_here = s->head_here = 1;
        s->blocks[0] = L;
        s->most_modules = L + 2;
    }
    pt_model_options o = {.tp = c->parallel.tp,
                          .sp = c->parallel.sequence_parallel,
                          .owned = own,
                          .recompute = rc,
                          .no_slot = 1}; /* the trainer's executor holds the activations */
    pt_status st = model_of(k, &mc, &o, gpu, s);
    free(own);
    return st;
}
