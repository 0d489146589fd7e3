/* Which bytes of a checkpoint this rank writes and reads: its state as
 * regions of its flat layout, named by slot (file, group), and each region
 * as runs of the full tensors (ckpt_impl.h).
 *
 * Who writes an element, so that each is written once and no rank more
 * than its share, with nothing but the layout known (no communication):
 *   - a region's `copies` dp ranks (replicas of the same values: the model
 *     under sync, HSDP's groups of ZeRO shards) split it by pt_comm_shard,
 *     rank `copy` taking its part;
 *   - of that part, a tensor that every tp rank holds whole (LayerNorms,
 *     wpe, the row-parallel biases: pt_shard split_dim -1) is split again
 *     over the tp ranks, which hold the same regions of the same layout;
 *   - pipeline stages hold different modules: nothing to split.
 * Every rank of a dp group lists its regions alike (the strategies' state
 * slots are pure functions of the layout), so the parts tile each region;
 * the write agrees on the totals before any byte is written
 * (ckpt_write.c).
 *
 * Not here: the files (ckpt_write.c, ckpt_read.c). */
#include "ckpt_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tables below are metadata (a region per module and tensor set at
 * most, a few KiB) on the C heap, like the header text: a synchronous save
 * allocates nothing the categories count, and the planner says so. */
static void *grow(void *old, size_t old_bytes, size_t new_bytes) {
    void *p = malloc(new_bytes);
    if (p && old) memcpy(p, old, old_bytes);
    if (p) free(old);
    return p;
}

int pt_ckpt_is_main(const char *file) {
    return !strcmp(file, "model") || !strcmp(file, "optim_m") || !strcmp(file, "optim_v");
}

pt_status pt_ckpt_set_init(pt_ckpt_set *c, const pt_model *local, const pt_model *full, int tp,
                           int tp_rank, int per_replica) {
    memset(c, 0, sizeof *c);
    *c = (pt_ckpt_set){
        .local = local, .full = full, .tp = tp, .tp_rank = tp_rank, .per_replica = per_replica};
    int n = pt_model_num_tensors(local);
    c->full_of = malloc((size_t)(n ? n : 1) * sizeof *c->full_of);
    if (!c->full_of) return pt_error_set(PT_ERR_NOMEM, "checkpoint: tensor table");
    for (int k = 0; k < n; k++) {
        const pt_param_info *p = pt_model_tensor(local, k);
        c->full_of[k] = -1;
        for (int i = 0; i < pt_model_num_tensors(full); i++)
            if (!strcmp(pt_model_tensor(full, i)->name, p->name)) c->full_of[k] = i;
        PT_ASSERT(c->full_of[k] >= 0); /* a stage's tensors are the model's */
    }
    return PT_OK;
}

void pt_ckpt_set_deinit(pt_ckpt_set *c) {
    free(c->full_of);
    free(c->r);
    free(c->s);
    memset(c, 0, sizeof *c);
}

/* The slot of (file, group), added when new. */
static int slot_of(pt_ckpt_set *c, const char *file, const char *group) {
    for (int i = 0; i < c->ns; i++)
        if (!strcmp(c->s[i].file, file) && !strcmp(c->s[i].group, group)) return i;
    if (c->ns == c->scap) {
        int cap = c->scap ? 2 * c->scap : 8;
        pt_ckpt_slot *s = grow(c->s, (size_t)c->scap * sizeof *s, (size_t)cap * sizeof *s);
        if (!s) return -1;
        c->s = s;
        c->scap = cap;
    }
    snprintf(c->s[c->ns].file, sizeof c->s[c->ns].file, "%s", file);
    snprintf(c->s[c->ns].group, sizeof c->s[c->ns].group, "%s", group);
    return c->ns++;
}

/* Where a tensor set of `replica` goes. The main files hold the group's
 * one model (replica -1) or dp index 0's own; every other replica's
 * parameters and moments, and its other own state, go to replica<d>; the
 * group's other state (stale sums, the outer step's) to sync. A restart
 * reads every replica's parameters and moments from the main files and
 * nothing else (returns 0 for a set left out). */
static int where(const pt_ckpt_set *c, const char *name, int replica, char *file, char *group) {
    static const char *const main_sets[] = {"params", "optim_m", "optim_v"};
    static const char *const main_files[] = {"model", "optim_m", "optim_v"};
    for (int k = 0; k < 3; k++)
        if (!strcmp(name, main_sets[k]) && (replica <= 0 || !c->per_replica)) {
            snprintf(file, PT_CKPT_FILE_MAX, "%s", main_files[k]);
            group[0] = '\0';
            return 1;
        }
    if (!c->per_replica) return 0;
    if (replica < 0)
        snprintf(file, PT_CKPT_FILE_MAX, "sync");
    else
        snprintf(file, PT_CKPT_FILE_MAX, "replica%d", replica);
    snprintf(group, PT_CKPT_PREFIX_MAX, "%s", name);
    return 1;
}

pt_status pt_ckpt_set_add(pt_state_visit *v, const pt_state_region *r) {
    pt_ckpt_set *c = v->arg;
    char file[PT_CKPT_FILE_MAX], group[PT_CKPT_PREFIX_MAX];
    if (strlen(r->name) >= PT_CKPT_PREFIX_MAX)
        return pt_error_set(PT_ERR_INTERNAL, "checkpoint: state name %s too long", r->name);
    if (!where(c, r->name, r->replica, file, group) || r->n == 0) return PT_OK;
    PT_ASSERT(r->data && r->copies >= 1 && r->copy >= 0 && r->copy < r->copies);
    PT_ASSERT(r->off + r->n <= pt_model_num_params(c->local));
    int s = slot_of(c, file, group);
    if (s < 0) return pt_error_set(PT_ERR_NOMEM, "checkpoint: state table");
    if (c->nr == c->rcap) {
        int cap = c->rcap ? 2 * c->rcap : 32;
        pt_ckpt_region *nr = grow(c->r, (size_t)c->rcap * sizeof *nr, (size_t)cap * sizeof *nr);
        if (!nr) return pt_error_set(PT_ERR_NOMEM, "checkpoint: state table");
        c->r = nr;
        c->rcap = cap;
    }
    c->r[c->nr++] = (pt_ckpt_region){s, r->off, r->n, r->data, r->copy, r->copies};
    return PT_OK;
}

pt_status pt_ckpt_walk(const pt_ckpt_set *c, int i, int share, pt_ckpt_run_fn fn, void *arg) {
    const pt_ckpt_region *r = &c->r[i];
    size_t lo = r->off, hi = r->off + r->n;
    if (share) {
        size_t so, sn;
        pt_comm_shard(r->n, r->copies, r->copy, &so, &sn);
        lo = r->off + so;
        hi = lo + sn;
    }
    for (int k = 0; k < pt_model_num_tensors(c->local); k++) {
        const pt_param_info *p = pt_model_tensor(c->local, k);
        if (p->offset >= hi || p->offset + p->numel <= lo) continue;
        /* [a, b): the tensor's local elements in the region (its part) */
        size_t a = (lo > p->offset ? lo : p->offset) - p->offset;
        size_t b = (hi < p->offset + p->numel ? hi : p->offset + p->numel) - p->offset;
        if (share && c->tp > 1 && p->shard.split_dim < 0) { /* alike on every tp rank */
            size_t so, sn;
            pt_comm_shard(b - a, c->tp, c->tp_rank, &so, &sn);
            a += so;
            b = a + sn;
        }
        for (size_t q = 0; a < b && q < pt_shard_num_runs(&p->shard); q++) {
            size_t g, l, len;
            pt_shard_run(&p->shard, q, &g, &l, &len);
            size_t x0 = l > a ? l : a, x1 = l + len < b ? l + len : b;
            if (x0 >= x1) continue;
            float *data = r->data + (p->offset + x0 - r->off);
            PT_CHECK(fn(arg, r->slot, c->full_of[k], g + (x0 - l), data, x1 - x0));
        }
    }
    return PT_OK;
}

void pt_ckpt_zero_padding(const pt_ckpt_set *c, int i) {
    const pt_ckpt_region *r = &c->r[i];
    for (int k = 0; k < pt_model_num_tensors(c->local); k++) {
        const pt_param_info *p = pt_model_tensor(c->local, k);
        size_t width = p->ndim == 2 ? (size_t)p->shape[1] : 1, npad = (size_t)p->shard.pad * width;
        if (!npad) continue;
        size_t a = p->offset + p->numel - npad, b = p->offset + p->numel; /* the pad rows */
        if (a < r->off) a = r->off;
        if (b > r->off + r->n) b = r->off + r->n;
        if (a < b) memset(r->data + (a - r->off), 0, (b - a) * sizeof(float));
    }
}

/* ---- the write shares as pieces ---- */

/* A run as bytes of its group (the full tensors in flat order: our files'
 * layout), from the live buffer or, staged, the next bytes of the staging
 * buffer; coalesced with the pending piece when both its bytes and its
 * source follow on, else the pending one goes out. */
typedef struct {
    const pt_ckpt_set *c;
    const char *staging; /* NULL: from the live buffers */
    uint64_t at;         /* the staging buffer's next byte */
    pt_ckpt_piece pending;
    int have;
    pt_ckpt_emit_fn fn; /* NULL: only count */
    void *arg;
    uint64_t *bytes, total;
} emitter;

static pt_status flush(emitter *e) {
    if (!e->have || !e->fn) return PT_OK;
    e->have = 0;
    return e->fn(e->arg, &e->pending);
}

static pt_status emit_run(void *arg, int slot, int tensor, size_t at, float *data, size_t len) {
    emitter *e = arg;
    uint64_t off = ((uint64_t)pt_model_tensor(e->c->full, tensor)->offset + at) * sizeof(float);
    uint64_t bytes = (uint64_t)len * sizeof(float);
    const char *src = e->staging ? e->staging + e->at : (const char *)data;
    e->at += bytes;
    if (e->bytes) e->bytes[slot] += bytes;
    e->total += bytes;
    pt_ckpt_piece *p = &e->pending;
    if (e->have && p->slot == slot && p->off + p->len == off && p->src + p->len == src) {
        p->len += bytes;
        return PT_OK;
    }
    PT_CHECK(flush(e));
    *p = (pt_ckpt_piece){slot, off, bytes, src};
    e->have = 1;
    return PT_OK;
}

pt_status pt_ckpt_emit(const pt_ckpt_set *c, const char *staging, pt_ckpt_emit_fn fn, void *arg) {
    emitter e = {.c = c, .staging = staging, .fn = fn, .arg = arg};
    for (int i = 0; i < c->nr; i++) PT_CHECK(pt_ckpt_walk(c, i, 1, emit_run, &e));
    return flush(&e);
}

uint64_t pt_ckpt_share_bytes(const pt_ckpt_set *c, uint64_t *per_slot) {
    emitter e = {.c = c, .bytes = per_slot};
    if (per_slot) memset(per_slot, 0, (size_t)c->ns * sizeof *per_slot);
    for (int i = 0; i < c->nr; i++) (void)pt_ckpt_walk(c, i, 1, emit_run, &e); /* cannot fail */
    return e.total;
}

static pt_status stage_run(void *arg, int slot, int tensor, size_t at, float *data, size_t len) {
    (void)slot;
    (void)tensor;
    (void)at;
    char **to = arg;
    memcpy(*to, data, len * sizeof(float));
    *to += len * sizeof(float);
    return PT_OK;
}

void pt_ckpt_stage(const pt_ckpt_set *c, char *staging) {
    for (int i = 0; i < c->nr; i++) (void)pt_ckpt_walk(c, i, 1, stage_run, &staging);
}

void pt_ckpt_files_deinit(pt_ckpt_files *fs) {
    for (int i = 0; i < fs->nf; i++) free(fs->f[i].group);
    free(fs->f);
    memset(fs, 0, sizeof *fs);
}
