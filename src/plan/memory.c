/* The memory model: per-rank peak bytes of each PT_MEM_* category during a
 * training step, for a layout of a config, without building the model.
 *
 *   fp32 (train.precision = fp32, partrain's CPU runtime): the runtime's
 *        own allocations, counted from the same size functions its
 *        constructors use (pt_model_buffer_bytes, pt_model_slot_bytes_at,
 *        pt_module_scratch_bytes, pt_comm_scratch_bytes, pt_comm_shard,
 *        pt_schedule_bytes) on a table-only model of each stage's slice:
 *        every buffer is allocated up front, so the peak of a step is what
 *        the trainer holds when it starts (docs/plan.md lists the terms);
 *   bf16 (planning a GPU run): the ZeRO paper's 2 + 2 + 12 bytes a
 *        parameter split by stage (Rajbhandari et al. 2020, Fig. 1) and
 *        Korthikanti et al. 2022's activations per layer (Table 2), times
 *        the micro-batches the schedule holds.
 *
 * The search's calls go through a pt_plan_memory_cache (plan_memory_impl.h)
 * that keeps what layouts share: stage cuts, pass list counts, tables.
 *
 * Not here: whether it fits (pt_plan_mem_overflow, the search), time. */
#include "partrain/plan.h"

#include "partrain/comm.h"
#include "partrain/optim.h"
#include "partrain/parallel.h"

#include "plan_memory_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The GPU regime's stated headroom (docs/plan.md, "slack"): the CUDA
 * context, cuBLAS workspaces, NCCL's buffers and the caching allocator's
 * fragmentation. */
#define GPU_SLACK_BYTES (2.0 * 1073741824.0)

/* What the memory model reads of a rank's pass list (pt_schedule). */
typedef struct {
    int virtual_stages, split, in_flight, pending_w;
    int chunk_in_flight[PT_SCHEDULE_MAX_VIRTUAL];
    int vstage[PT_SCHEDULE_MAX_VIRTUAL]; /* pt_schedule_virtual_stage per chunk */
    size_t bytes;                        /* pt_schedule_bytes */
} sched_sum;

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

/* What the bf16 regime reads of a stage's table-only model: a few
 * hundred bytes where the model is tens of kB (a search keeps thousands). */
typedef struct {
    size_t params_bytes; /* pt_model_buffer_bytes(m, 0, PT_MEM_PARAMS) */
    size_t n;            /* pt_model_num_params */
    size_t cnt[];        /* L + 2: pt_model_module_region's counts */
} model_sum;

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

/* One pipeline stage's layout, shared by both regimes. */
typedef struct {
    sched_sum sched;
    pt_model *m;        /* fp32: table only (max_B 0), this stage's tp slice */
    const model_sum *u; /* bf16: the same model summed up */
    int own;            /* m or u is this stage's (else the cache's, lent) */
    int first[PT_SCHEDULE_MAX_VIRTUAL], last[PT_SCHEDULE_MAX_VIRTUAL];
    int emb_here, head_here, tied_peer;
    int blocks[PT_SCHEDULE_MAX_VIRTUAL]; /* blocks of each chunk */
    int most_modules;                    /* modules of the rank's largest chunk */
    int head_chunk;                      /* the chunk holding the head (head_here) */
} stage_info;

static void stage_free(stage_info *s) {
    if (!s->own) return;
    pt_model_free(s->m);
    free((model_sum *)s->u);
}

static pt_recompute recompute_of(int rc) {
    return rc == 2 ? PT_RECOMPUTE_FULL : rc == 1 ? PT_RECOMPUTE_SELECTIVE : PT_RECOMPUTE_NONE;
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

/* The stage cut of c (p x v entries) into *cut: k's, or computed into buf. */
static pt_status cut_of(pt_plan_memory_cache *k, const pt_config *c, pt_stage *buf,
                        const pt_stage **cut) {
    int p = c->parallel.pp, v = pt_config_virtual_stages(c), m = c->parallel.microbatches;
    const char *name = pt_config_schedule(c);
    char key[sizeof c->parallel.stage_layers + 64];
    size_t n = 0;
    if (k) {
        /* the micro-batches weigh only a cut of several chunks a rank */
        n = (size_t)snprintf(key, sizeof key, "%s/%d/%d/%d/%s", name, p, v, v > 1 ? m : 0,
                             c->parallel.stage_layers);
        if (n >= sizeof key) n = sizeof key - 1;
        const pt_stage *hit = table_get(&k->cuts, key, n, bytes_hash(key, n));
        if (hit) {
            k->hits++;
            *cut = hit;
            return PT_OK;
        }
    }
    PT_CHECK(pt_stage_split_for(&c->model, name, p, v, m, c->parallel.stage_layers, buf));
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
static pt_status scheds_of(pt_plan_memory_cache *k, const pt_config *c, sched_sum *buf,
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

/* The table-only model of o's slice of c's model into s: fp32 the model,
 * bf16 its summary; k's (lent) or new (s->own). */
static pt_status model_of(pt_plan_memory_cache *k, const pt_config *c, const pt_model_options *o,
                          int gpu, stage_info *s) {
    int L = c->model.n_layer;
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
    pt_status st = pt_model_new_opts(&m, &c->model, 0, o);
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

static pt_status stage_new(stage_info *s, const pt_config *c, const pt_stage *cut, int r,
                           pt_recompute rc, const sched_sum *sum, int gpu,
                           pt_plan_memory_cache *k) {
    memset(s, 0, sizeof *s);
    int p = c->parallel.pp, v = pt_config_virtual_stages(c), L = c->model.n_layer;
    const char *name = pt_config_schedule(c);
    s->sched = *sum;
    unsigned char *own = NULL;
    if (p > 1) {
        own = calloc((size_t)L + 2, 1);
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
    pt_status st = model_of(k, c, &o, gpu, s);
    free(own);
    return st;
}

/* ---- fp32: the runtime's allocations ---- */

/* Whether module i is in the comma list `whole` ("embedding,head,h.0"). */
static int kept_whole(const char *whole, int i, int L) {
    char name[16];
    if (i == 0)
        snprintf(name, sizeof name, "embedding");
    else if (i == L + 1)
        snprintf(name, sizeof name, "head");
    else
        snprintf(name, sizeof name, "h.%d", i - 1);
    size_t n = strlen(name);
    for (const char *p = whole; *p;) {
        const char *comma = strchr(p, ',');
        size_t k = comma ? (size_t)(comma - p) : strlen(p);
        if (k == n && !strncmp(p, name, n)) return 1;
        p += k + (comma ? 1 : 0);
    }
    return 0;
}

/* The communicators a rank holds (each with its generic-collective piece,
 * pt_comm_scratch_bytes): the world, the mesh's groups of more than one
 * rank (tp, dp, pp, and mp = tp x pp), the trainer's auxiliary copy of the
 * world, ZeRO's shard group (and the cross-group one under HSDP), and a
 * pipeline's act/grad groups per chunk plus the tied wte's. */
static int communicators(const pt_config *c, const stage_info *s, int zero_on, int g) {
    int dp = c->parallel.dp, tp = c->parallel.tp, pp = c->parallel.pp;
    if (dp * tp * pp == 1) return 0;
    int n = 1 + 1; /* world, aux */
    n += (tp > 1) + (dp > 1) + (pp > 1) + (tp * pp > 1);
    if (zero_on) n += 1 + (g < dp);
    /* the pipeline's by message kind and chunk; the tied wte's on the two
     * stages it joins (tied.c) */
    if (pp > 1) n += 2 * pt_config_virtual_stages(c) + s->tied_peer;
    return n;
}

static double max2(double a, double b) {
    return a > b ? a : b;
}

/* The shm backend's single-copy scratch, allocated on a group's first
 * large collective (pt_comm_lazy_bytes): per group, its largest
 * collectives of a step. */
static double lazy_comm(const pt_config *c, const stage_info *s, int zero, int g) {
    const pt_model *m = s->m;
    int dp = c->parallel.dp, tp = c->parallel.tp, L = c->model.n_layer;
    double total = 0;
    size_t n = pt_model_num_params(m), f = sizeof(float);
    size_t biggest = 0; /* the largest module region */
    for (int i = 0; i < L + 2; i++) {
        size_t off, cnt;
        pt_model_module_region(m, i, &off, &cnt);
        if (cnt > biggest) biggest = cnt;
    }
    if (dp > 1) {
        /* ddp.c's buckets: full ones of bucket_mb, cut from the top, the
         * open one closed at the embedding's boundary */
        double d = 0;
        if (!strcmp(c->parallel.sync, "local_sgd")) {
            d = (double)pt_comm_lazy_bytes(NULL, dp, PT_OP_ALLREDUCE, n * f);
        } else if (zero < 2) {
            size_t cap = (size_t)(c->parallel.bucket_mb * 1048576.0) / f, off, emb;
            if (cap < 1) cap = 1;
            pt_model_module_region(m, 0, &off, &emb);
            size_t above = n - emb, most = above >= cap || emb >= cap ? cap
                                           : above > emb              ? above
                                                                      : emb;
            d = (double)pt_comm_lazy_bytes(NULL, dp, PT_OP_ALLREDUCE, most * f);
        }
        total += d;
    }
    if (zero > 0) {
        /* the shard group: each module's parameters all-gathered (after the
         * update; ZeRO-3 before each pass), its gradients reduce-scattered
         * (stage >= 2); across groups (HSDP) the shards all-reduced */
        double z = (double)pt_comm_lazy_bytes(NULL, g, PT_OP_ALLGATHER, biggest * f);
        if (zero >= 2)
            z = max2(z, (double)pt_comm_lazy_bytes(NULL, g, PT_OP_REDUCE_SCATTER, biggest * f));
        total += z;
        if (g < dp && zero >= 2) {
            size_t so, sn;
            pt_comm_shard(biggest, g, 0, &so, &sn);
            total += (double)pt_comm_lazy_bytes(NULL, dp / g, PT_OP_ALLREDUCE, sn * f);
        }
    }
    if (tp > 1) {
        /* the blocks' collectives on the residual stream (N, C) */
        size_t nc = (size_t)(c->train.batch_size / dp / c->parallel.microbatches) *
                    (size_t)c->model.seq_len * (size_t)c->model.n_embd * f;
        total += c->parallel.sequence_parallel
                     ? max2((double)pt_comm_lazy_bytes(NULL, tp, PT_OP_REDUCE_SCATTER, nc),
                            (double)pt_comm_lazy_bytes(NULL, tp, PT_OP_ALLGATHER, nc))
                     : (double)pt_comm_lazy_bytes(NULL, tp, PT_OP_ALLREDUCE, nc);
    }
    return total;
}

/* Rank (stage s, shard rank grank of g) of an fp32 run into cat[]. */
static void cpu_rank(const pt_config *c, const stage_info *s, const char *whole, int grank, int g,
                     double *cat) {
    const pt_model *m = s->m;
    int L = c->model.n_layer, dp = c->parallel.dp, M = c->parallel.microbatches;
    int mB = c->train.batch_size / dp / M;
    size_t T = (size_t)c->model.seq_len;
    size_t n = pt_model_num_params(m);
    double flat = (double)(n ? n : 1) * sizeof(float);
    double tied = (double)pt_model_buffer_bytes(m, 0, PT_MEM_PARAMS) - flat;
    for (int k = 0; k < PT_MEM_NCAT; k++) cat[k] = 0;

    /* activations: the model's own buffers, the trainer's global batch of
     * tokens (inputs and targets), and the micro-batches in flight */
    cat[PT_MEM_ACTS] = (double)pt_model_buffer_bytes(m, mB, PT_MEM_ACTS) +
                       2.0 * c->train.batch_size * (double)T * sizeof(int);
    /* the executor's blocks (pipeline/runtime.c), at pp = 1 too: in_flight
     * blocks, each the largest chunk's slot and its gradients in and
     * out, or each chunk's own (as many as it holds at once, its own
     * size) where that is less; a split backward adds sets of deferred
     * scratch, as many as the list has W's pending at once */
    size_t fl[PT_SCHEDULE_MAX_VIRTUAL];
    for (int ch = 0; ch < s->sched.virtual_stages; ch++)
        fl[ch] = pt_pipeline_block_floats(m, s->first[ch], s->last[ch], mB);
    cat[PT_MEM_ACTS] += (double)pt_schedule_blocks(s->sched.virtual_stages, s->sched.in_flight,
                                                   s->sched.chunk_in_flight, fl, NULL, NULL) *
                        sizeof(float);
    if (s->sched.split) /* sets of one scratch per module of a chunk, each sized for
                         * the kinds of module j of the chunks */
        for (int j = 0; j < s->most_modules; j++) {
            unsigned kinds = 0;
            for (int ch = 0; ch < s->sched.virtual_stages; ch++) {
                int i = s->first[ch] + j;
                if (i <= s->last[ch])
                    kinds |= 1u << (i == 0       ? PT_MODULE_EMBEDDING
                                    : i == L + 1 ? PT_MODULE_HEAD
                                                 : PT_MODULE_BLOCK);
            }
            cat[PT_MEM_ACTS] +=
                (double)s->sched.pending_w * (double)pt_module_scratch_bytes(m, mB, kinds);
        }

    pt_adamw_hparams hp = {0};
    hp.kind = !strcmp(c->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    hp.momentum = (float)c->train.momentum;
    int nstate = pt_optim_state_count(&hp);
    int zero = dp > 1 ? c->parallel.zero : 0;
    int sync = !strcmp(c->parallel.sync, "sync"), local = !strcmp(c->parallel.sync, "local_sgd");

    cat[PT_MEM_PARAMS] = flat + tied;
    cat[PT_MEM_GRADS] = flat + tied;
    if (!zero) {
        cat[PT_MEM_OPTIM] = (double)nstate * (double)n * sizeof(float);
    } else {
        /* zero.c: per module, this rank's slice of its region */
        double shard = 0, emb = 0, blk = 0, head = 0;
        /* ZeRO-3 with parallel.zero_whole: a whole module's parameters are
         * resident (its slice a view into them) and need no pool buffer */
        double pshard = 0, pemb = 0, phead = 0;
        int nown = 0, ngathered = 0;
        for (int i = 0; i < L + 2; i++) {
            size_t off, cnt, so, sn;
            pt_model_module_region(m, i, &off, &cnt);
            pt_comm_shard(cnt, g, grank, &so, &sn);
            shard += (double)sn * sizeof(float);
            double b = (double)cnt * sizeof(float);
            int w = zero >= 3 && cnt && whole[0] && kept_whole(whole, i, L);
            pshard += w ? b : (double)sn * sizeof(float);
            if (i == 0) {
                emb = b;
                pemb = w ? 0 : b;
            } else if (i == L + 1) {
                head = b;
                phead = w ? 0 : b;
            } else if (cnt) {
                blk = b;
                nown++;
                ngathered += !w;
            }
        }
        cat[PT_MEM_OPTIM] = nstate * shard;
        if (zero >= 2) {
            /* unit buffers for the most the schedule holds at once: every
             * block under a pipeline or a split backward, else two */
            int per_step = c->parallel.pp > 1 || s->sched.split;
            int nblk = per_step ? nown : nown < 2 ? nown : 2;
            cat[PT_MEM_GRADS] = tied + shard + emb + nblk * blk + head;
            int pblk = per_step || c->parallel.zero_keep_params ? ngathered
                       : ngathered < 2                          ? ngathered
                                                                : 2;
            if (zero >= 3) cat[PT_MEM_PARAMS] = tied + pshard + pemb + pblk * blk + phead;
        }
    }
    int gsz = c->parallel.zero_group > 0 ? c->parallel.zero_group : dp;
    cat[PT_MEM_COMM] = (double)communicators(c, s, zero > 0, gsz) * (double)pt_comm_scratch_bytes();
    if (dp > 1 && zero < 2 && !sync && !local) {
        /* stale: a gradient copy per round in flight, and dga's local ones */
        int nslots = c->parallel.staleness + 1;
        cat[PT_MEM_COMM] += (double)nslots * (double)n * sizeof(float);
        if (!strcmp(c->parallel.stale_mode, "dga"))
            cat[PT_MEM_COMM] += (double)nslots * (double)n * sizeof(float);
    }
    if (dp > 1 && local && !strcmp(c->parallel.outer, "nesterov"))
        cat[PT_MEM_OPTIM] += 2.0 * (double)n * sizeof(float);
    cat[PT_MEM_COMM] += lazy_comm(c, s, zero, gsz);
    if (s->tied_peer && s->emb_here) /* the head's wte gradient, received */
        cat[PT_MEM_COMM] += (double)pt_model_tensor(m, 0)->numel * sizeof(float);
    /* the pass list */
    cat[PT_MEM_SCRATCH] = (double)s->sched.bytes;
}

/* ---- bf16: the published formulas ---- */

/* Korthikanti et al. 2022, Table 2: bytes of one transformer layer's
 * activations for one micro-batch of b sequences (fp16/bf16 tensors, the
 * dropout masks one byte). */
static double layer_acts_bf16(double s, double b, double h, double a, double t, int sp,
                              int recompute) {
    if (recompute == PT_RECOMPUTE_FULL) return 2.0 * s * b * h / (sp ? t : 1); /* the input */
    double attn = 5.0 * a * s / (h * t);                                       /* softmax, mask */
    if (recompute == PT_RECOMPUTE_SELECTIVE) attn = 0;
    if (sp) return s * b * h * (34.0 / t + attn);
    if (t == 1) return s * b * h * (34.0 + attn);
    return s * b * h * (10.0 + 24.0 / t + attn);
}

/* The recompute mode of pipeline rank r: model.stage_recompute's r-th
 * entry when given, else the layout's. */
static int stage_recompute(const pt_plan_layout *l, int r) {
    const char *p = l->stage_recompute;
    for (int k = 0; *p && k < r; k++) {
        p = strchr(p, ',');
        if (!p) return l->recompute;
        p++;
    }
    if (!*p) return l->recompute;
    return !strncmp(p, "full", 4)        ? 2
           : !strncmp(p, "selective", 9) ? 1
           : !strncmp(p, "none", 4)      ? 0
                                         : l->recompute;
}

static void gpu_rank(const pt_config *c, const pt_plan_layout *l, const stage_info *s, int rc,
                     double *cat) {
    const model_sum *u = s->u;
    int L = c->model.n_layer, dp = c->parallel.dp, M = c->parallel.microbatches;
    double b = (double)c->train.batch_size / dp / M, S = c->model.seq_len;
    double h = c->model.n_embd, a = c->model.n_head, t = c->parallel.tp;
    double V = c->model.vocab_size;
    int sp = c->parallel.sequence_parallel;
    for (int k = 0; k < PT_MEM_NCAT; k++) cat[k] = 0;
    /* Psi: this rank's model-parallel shard (the head stage's copy of the
     * tied wte included); modules named in zero_whole stay whole */
    int zero = dp > 1 ? c->parallel.zero : 0;
    double Nd = c->parallel.zero_group > 0 ? c->parallel.zero_group : dp;
    double psi = (double)u->params_bytes / sizeof(float);
    size_t n = u->n;
    psi -= n ? 0 : 1; /* the flat buffer of an empty stage is one float */
    double whole = 0;
    for (int i = 0; zero >= 3 && i < L + 2; i++) {
        size_t cnt = u->cnt[i];
        if (l->zero_whole[0] && kept_whole(l->zero_whole, i, L)) whole += (double)cnt;
    }
    double sharded = psi - whole;
    /* K: the fp32 master copy and the optimizer's states (Adam m, v: 12) */
    pt_adamw_hparams hp = {0};
    hp.kind = !strcmp(c->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    hp.momentum = (float)c->train.momentum;
    double K = 4.0 + 4.0 * pt_optim_state_count(&hp);
    cat[PT_MEM_PARAMS] = 2 * (zero >= 3 ? whole + sharded / Nd : psi);
    cat[PT_MEM_GRADS] = 2 * (zero >= 2 ? psi / Nd : psi);
    cat[PT_MEM_OPTIM] = K * (zero >= 1 ? psi / Nd : psi);
    /* ZeRO-3's gathered units: the one running and the one prefetched */
    if (zero >= 3) {
        double blk = 0;
        for (int i = 1; i <= L; i++) {
            size_t cnt = u->cnt[i];
            if ((double)cnt > blk) blk = (double)cnt;
        }
        cat[PT_MEM_COMM] = 2 * 2 * blk;
    }
    /* activations: the trainer's blocks of layers (the micro-batches in
     * flight times the largest chunk's, or each chunk's own where less),
     * the head's fp32 logits for the loss, and under full recomputation one
     * layer's whole activations while its backward runs */
    double layer = layer_acts_bf16(S, b, h, a, t, sp, rc);
    size_t nb[PT_SCHEDULE_MAX_VIRTUAL];
    for (int ch = 0; ch < s->sched.virtual_stages; ch++) nb[ch] = (size_t)s->blocks[ch];
    cat[PT_MEM_ACTS] = (double)pt_schedule_blocks(s->sched.virtual_stages, s->sched.in_flight,
                                                  s->sched.chunk_in_flight, nb, NULL, NULL) *
                       layer;
    if (rc == PT_RECOMPUTE_FULL) cat[PT_MEM_ACTS] += layer_acts_bf16(S, b, h, a, t, sp, 0);
    if (s->head_here) {
        int k = c->parallel.pp > 1 ? s->sched.chunk_in_flight[s->head_chunk] : 1;
        cat[PT_MEM_ACTS] += k * 4.0 * S * b * V / t;
    }
}

/* A stage's tables for a save's scratch: its slice, its largest module
 * and its largest tensor (a tp rank's, alike on every tp rank), and the
 * whole size of the largest tensor that tp splits (0: none). */
typedef struct {
    double n, module, most, split;
} save_sizes;

static save_sizes save_sizes_of(const pt_model *m) {
    save_sizes z = {(double)pt_model_num_params(m), 0, 0, 0};
    for (int i = 0; i < pt_model_num_modules(m); i++) {
        size_t off, count;
        pt_model_module_region(m, i, &off, &count);
        if ((double)count > z.module) z.module = (double)count;
    }
    for (int k = 0; k < pt_model_num_tensors(m); k++) {
        const pt_param_info *p = pt_model_tensor(m, k);
        if ((double)p->numel > z.most) z.most = (double)p->numel;
        if (!pt_shard_whole(&p->shard) && (double)pt_shard_numel(&p->shard) > z.split)
            z.split = (double)pt_shard_numel(&p->shard);
    }
    return z;
}

/* A checkpoint save's scratch (trainer_ckpt.c, one tensor set at a time):
 * each stage's dp rank 0 receives ZeRO's shards of its slice a module at a
 * time (its largest module);
 * world rank 0, under tp or pp, also streams the whole model's tensors in
 * (tp_full.c): one buffer of a member's largest tensor (tp rank 1 of its
 * own stage, or another stage's) and, under tp, one of the largest tensor
 * tp splits, whole; under stale and local_sgd, afterwards, it receives
 * the other ranks' files through one slice-sized buffer (rank_state.c). */
static void save_scratch(const pt_config *c, int zero, const save_sizes *z, pt_plan_mem *out) {
    int p = c->parallel.pp, tp = c->parallel.tp;
    int files = c->parallel.dp > 1 && strcmp(c->parallel.sync, "sync") != 0;
    double most = tp > 1 ? z[0].most : 0, split = 0, need = 0;
    for (int r = 0; r < p; r++) {
        if (r > 0 && z[r].most > most) most = z[r].most;
        if (z[r].split > split) split = z[r].split;
    }
    for (int r = 0; r < p; r++) {
        double f = zero ? z[r].module : 0;
        if (r == 0 && (tp > 1 || p > 1)) f += split + most;
        if (r == 0 && files && z[0].n > f) f = z[0].n;
        out->stage[r].save = f * sizeof(float);
        if (out->stage[r].total + out->stage[r].save > need)
            need = out->stage[r].total + out->stage[r].save;
    }
    out->max.save = need - out->max.total;
}

pt_status pt_plan_memory(const pt_config *model, const pt_plan_layout *l, const pt_cluster *cl,
                         pt_plan_mem *out) {
    return pt_plan_memory_cached(NULL, model, l, cl, out);
}

pt_status pt_plan_memory_cached(pt_plan_memory_cache *k, const pt_config *model,
                                const pt_plan_layout *l, const pt_cluster *cl, pt_plan_mem *out) {
    memset(out, 0, sizeof *out);
    pt_config c = *model;
    pt_plan_layout_apply(l, &c);
    PT_CHECK(pt_config_validate_layout(&c));
    int p = c.parallel.pp;
    if (p > PT_PLAN_MAX_STAGES)
        return pt_error_set(PT_ERR_UNSUPPORTED, "plan: parallel.pp = %d (at most %d stages)", p,
                            PT_PLAN_MAX_STAGES);
    int gpu = !strcmp(c.train.precision, "bf16");
    if (gpu && cl && !(cl->device.peak_flops_bf16 > 0))
        return pt_error_set(PT_ERR_INVALID,
                            "train.precision = bf16: the cluster's device.peak_flops.bf16 is 0 "
                            "(the device has no bf16)");
    if (k && (!k->have_model || memcmp(&k->model, &c.model, sizeof c.model))) {
        /* another model: nothing kept holds */
        table_clear(&k->cuts, 0);
        table_clear(&k->scheds, 0);
        table_clear(&k->models, 1);
        table_clear(&k->sums, 0);
        k->model = c.model, k->have_model = 1;
    }
    pt_stage cutbuf[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    const pt_stage *cut = cutbuf;
    if (p > 1) PT_CHECK(cut_of(k, &c, cutbuf, &cut));
    sched_sum sumbuf[PT_PLAN_MAX_STAGES];
    const sched_sum *sums;
    PT_CHECK(scheds_of(k, &c, sumbuf, &sums));
    double slack = gpu ? GPU_SLACK_BYTES : 0;
    int dp = c.parallel.dp, zero = dp > 1 ? c.parallel.zero : 0;
    int g = c.parallel.zero_group > 0 ? c.parallel.zero_group : dp;
    out->n_stage = p;
    save_sizes zs[PT_PLAN_MAX_STAGES]; /* each stage's tables (its tp rank 0's) */
    for (int r = 0; r < p; r++) {
        int rc = stage_recompute(l, r);
        stage_info s;
        PT_CHECK(stage_new(&s, &c, cut, r, recompute_of(rc), &sums[r], gpu, k));
        if (!gpu) zs[r] = save_sizes_of(s.m);
        pt_plan_mem_rank *st = &out->stage[r];
        st->slack = slack;
        /* the shard ranks differ by a float or so (pt_comm_shard): each one */
        int ng = !gpu && zero ? g : 1;
        for (int gr = 0; gr < ng; gr++) {
            double cat[PT_MEM_NCAT];
            if (gpu)
                gpu_rank(&c, l, &s, rc, cat);
            else
                cpu_rank(&c, &s, l->zero_whole, gr, g, cat);
            double sum = slack;
            for (int k = 0; k < PT_MEM_NCAT; k++) {
                if (cat[k] > st->cat[k]) st->cat[k] = cat[k];
                sum += cat[k];
            }
            if (sum > st->total) st->total = sum;
        }
        stage_free(&s);
        for (int k = 0; k < PT_MEM_NCAT; k++)
            if (st->cat[k] > out->max.cat[k]) out->max.cat[k] = st->cat[k];
        if (st->total > out->max.total) out->max.total = st->total;
    }
    out->max.slack = slack;
    if (!gpu) save_scratch(&c, zero, zs, out);
    return PT_OK;
}

/* "93.1 GB" (decimal units, as device datasheets give memory). */
static void human(double b, char *buf, size_t n) {
    if (b >= 1e9)
        snprintf(buf, n, "%.1f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(buf, n, "%.1f MB", b / 1e6);
    else
        snprintf(buf, n, "%.1f kB", b / 1e3);
}

void pt_plan_rank_capacity(const pt_cluster *cl, int world, pt_plan_capacity *out) {
    long devices = (long)cl->nodes * cl->devices_per_node;
    double pool = cl->device.memory_bytes;
    int k = devices > 0 && world > devices ? (int)((world + devices - 1) / devices) : 1;
    const char *whose = "device";
    if (cl->profile && cl->nodes > 0) { /* RAM, shared by the node's ranks */
        k = (world + cl->nodes - 1) / cl->nodes;
        if (k < 1) k = 1;
        pool *= cl->devices_per_node, whose = "node";
    }
    out->bytes = pool / k, out->share = k;
    char a[32], b[32];
    human(out->bytes, a, sizeof a);
    human(pool, b, sizeof b);
    if (k == 1 && !cl->profile)
        snprintf(out->what, sizeof out->what, "the device has %s", a);
    else
        snprintf(out->what, sizeof out->what, "a rank has %s (the %s's %s over %d rank%s)", a,
                 whose, b, k, k == 1 ? "" : "s");
}

double pt_plan_mem_need(const pt_plan_mem_rank *m, const pt_plan_capacity *cap) {
    return m->total + m->save / cap->share;
}

int pt_plan_mem_overflow(const pt_plan_mem_rank *m, const pt_plan_capacity *cap, char *reason,
                         size_t n) {
    if (pt_plan_mem_need(m, cap) <= cap->bytes) {
        if (n) reason[0] = '\0';
        return 0;
    }
    /* the categories, largest first */
    int order[PT_MEM_NCAT];
    for (int k = 0; k < PT_MEM_NCAT; k++) order[k] = k;
    for (int i = 1; i < PT_MEM_NCAT; i++)
        for (int j = i; j > 0 && m->cat[order[j]] > m->cat[order[j - 1]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    char tot[32], part[64];
    human(m->total, tot, sizeof tot);
    size_t k = (size_t)snprintf(reason, n, "needs %s a rank (", tot);
    int first = 1;
    for (int i = 0; i < PT_MEM_NCAT; i++) {
        double b = m->cat[order[i]];
        if (b <= 0) continue;
        human(b, part, sizeof part);
        if (k < n)
            k += (size_t)snprintf(reason + k, n - k, "%s%s %s", first ? "" : ", ",
                                  pt_mem_cat_name((pt_mem_cat)order[i]), part);
        first = 0;
    }
    if (m->slack > 0 && k < n) {
        human(m->slack, part, sizeof part);
        k += (size_t)snprintf(reason + k, n - k, "%sslack %s", first ? "" : ", ", part);
    }
    if (m->save > 0 && k < n) {
        human(m->save, part, sizeof part);
        k += (size_t)snprintf(reason + k, n - k, "; a checkpoint save %s more%s", part,
                              cap->share > 1 ? ", on one of the ranks sharing it" : "");
    }
    if (k < n) snprintf(reason + k, n - k, "), %s", cap->what);
    return 1;
}
