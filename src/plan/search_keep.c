/* What the planner's search keeps (plan_search_impl.h): the PT_PLAN_KEEP
 * fastest fitting layouts (a max-heap on step time, so that the slowest
 * kept is the bound a layout must beat) and the PT_PLAN_REJECTED smallest
 * rejected ones; and what it remembers between layouts: pt_plan_memory by
 * layout name (which spells every field), so that the per-stage
 * recompute's uniform layouts and ZeRO-3's whole modules are not computed
 * twice (a table of MEMO_SLOTS, the oldest entry overwritten); the
 * uniform recompute modes known not to fit per family and ZeRO variant;
 * the stage cuts; the last few pass lists.
 *
 * Not here: the search itself (search.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_search_impl.h"

void pt_plan_search_free(plan_search *s) {
    if (!s) return;
    pt_plan_memory_cache_free(s->mcache);
    free(s->memo);
    free(s->dead);
    for (int k = 0; k < 4; k++) {
        for (int r = 0; s->lists[k].lists && r < s->lists[k].p; r++)
            pt_schedule_free(&s->lists[k].lists[r]);
        free(s->lists[k].lists);
    }
    for (int p = 0; p <= PT_PLAN_MAX_STAGES; p++)
        for (int v = 0; v <= PT_SCHEDULE_MAX_VIRTUAL; v++)
            for (cut_node *c = s->cut[p][v], *next; c; c = next) {
                next = c->next;
                free(c);
            }
    free(s->fit);
    free(s);
}

plan_search *pt_plan_search_new(const pt_config *base, const pt_cluster *cl, int world) {
    plan_search *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->base = base, s->cl = cl, s->world = world;
    s->fit = malloc(sizeof *s->fit * PT_PLAN_KEEP);
    s->memo = calloc(MEMO_SLOTS, sizeof *s->memo);
    s->dead = calloc(DEAD_SLOTS, sizeof *s->dead);
    if (pt_plan_memory_cache_new(&s->mcache) != PT_OK) s->mcache = NULL;
    if (!s->fit || !s->memo || !s->dead || !s->mcache) {
        pt_plan_search_free(s);
        return NULL;
    }
    return s;
}

/* ---- the kept sets ---- */

static void heap_down(pt_plan_entry *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, big = i;
        if (l < n && h[l].time.step_s > h[big].time.step_s) big = l;
        if (r < n && h[r].time.step_s > h[big].time.step_s) big = r;
        if (big == i) return;
        pt_plan_entry t = h[i];
        h[i] = h[big], h[big] = t;
        i = big;
    }
}

static void heap_up(pt_plan_entry *h, int i) {
    while (i > 0 && h[(i - 1) / 2].time.step_s < h[i].time.step_s) {
        pt_plan_entry t = h[i];
        h[i] = h[(i - 1) / 2], h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

double pt_plan_keep_bound(const plan_search *s) {
    return s->n_fit < PT_PLAN_KEEP ? INFINITY : s->fit[0].time.step_s;
}

void pt_plan_keep_fit(plan_search *s, const pt_plan_entry *e) {
    if (s->n_fit < PT_PLAN_KEEP) {
        s->fit[s->n_fit] = *e;
        heap_up(s->fit, s->n_fit++);
    } else if (e->time.step_s < s->fit[0].time.step_s) {
        s->fit[0] = *e;
        heap_down(s->fit, s->n_fit, 0);
    }
}

void pt_plan_keep_rejected(plan_search *s, const pt_plan_layout *l, const pt_plan_mem_rank *m) {
    int n = s->n_rej;
    if (n == PT_PLAN_REJECTED && m->total >= s->rej[n - 1].mem.total) return;
    int i = n < PT_PLAN_REJECTED ? n++ : n - 1;
    while (i > 0 && s->rej[i - 1].mem.total > m->total) {
        s->rej[i] = s->rej[i - 1];
        i--;
    }
    pt_plan_entry *e = &s->rej[i];
    memset(e, 0, sizeof *e);
    e->layout = *l, e->mem = *m, e->fits = 0;
    pt_plan_mem_overflow(m, &s->cap, e->reason, sizeof e->reason);
    s->n_rej = n;
}

/* ---- memory, remembered ---- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ? h : 1;
}

static uint64_t dead_hash(const pt_plan_layout *l) {
    char k[96];
    snprintf(k, sizeof k, "%d/%d/%d/%d/%d/%s/%d/%d/%d", l->dp, l->tp, l->pp, l->sequence_parallel,
             l->microbatches, l->schedule, l->virtual_stages, l->zero,
             l->zero_group ? l->zero_group : l->dp);
    return name_hash(k);
}

pt_status pt_plan_search_mem(plan_search *s, const pt_plan_layout *l, pt_plan_mem *out) {
    char name[PT_PLAN_NAME_MAX * 4];
    pt_plan_layout_name(l, name, sizeof name);
    uint64_t h = name_hash(name);
    memo *e = &s->memo[h % MEMO_SLOTS];
    if (e->key == h) {
        *out = e->mem;
        return PT_OK;
    }
    s->n_mem++;
    uint64_t t0 = pt_time_ns();
    pt_status st = pt_plan_memory_cached(s->mcache, s->base, l, s->cl, out);
    s->mem_s += (double)(pt_time_ns() - t0) / 1e9;
    PT_CHECK(st);
    e->key = h, e->mem = *out;
    return PT_OK;
}

void pt_plan_mark_dead(plan_search *s, const pt_plan_layout *l, int r) {
    uint64_t h = dead_hash(l);
    size_t i = h % DEAD_SLOTS;
    dead *e = &s->dead[i];
    if (e->key != h) e->key = h, e->mode = 0;
    if (e->mode < r + 1) e->mode = (unsigned char)(r + 1);
}

int pt_plan_is_dead(const plan_search *s, const pt_plan_layout *l, int r) {
    uint64_t h = dead_hash(l);
    size_t i = h % DEAD_SLOTS;
    return s->dead[i].key == h && s->dead[i].mode >= r + 1;
}

/* ---- stage cuts and pass lists ---- */

pt_status pt_plan_search_cut(plan_search *s, const pt_plan_layout *l, const pt_stage **out) {
    int v = l->virtual_stages > 0 ? l->virtual_stages : 1, m = v > 1 ? l->microbatches : 0;
    const pt_sched *d = v > 1 ? pt_sched_find(l->schedule) : NULL;
    cut_node **head = &s->cut[l->pp][v], *c = *head;
    while (c && (c->m != m || c->sched != d || c->dp != l->dp)) c = c->next;
    if (!c) {
        c = malloc(sizeof *c + sizeof c->st[0] * (size_t)l->pp * (size_t)v);
        if (!c) return pt_error_set(PT_ERR_NOMEM, "plan: stage cut");
        pt_stage_step step = pt_config_stage_step(s->base, l->dp); /* the trainer's cut */
        pt_status e = pt_stage_split_step(&s->base->model, &step, l->schedule, l->pp, v,
                                          l->microbatches, l->stage_layers, c->st);
        if (e != PT_OK) {
            free(c);
            return e;
        }
        c->m = m, c->sched = d, c->dp = l->dp;
        c->next = *head;
        *head = c;
    }
    *out = c->st;
    return PT_OK;
}

pt_status pt_plan_search_lists(plan_search *s, const pt_plan_layout *l) {
    int p = l->pp, v = l->virtual_stages > 0 ? l->virtual_stages : 1, m = l->microbatches;
    if (p < 2) return PT_OK;
    for (int i = 0; i < 4; i++)
        if (s->lists[i].lists && s->lists[i].m == m && s->lists[i].p == p && s->lists[i].v == v &&
            !strcmp(s->lists[i].name, l->schedule)) {
            s->pipe.lists = s->lists[i].lists;
            return PT_OK;
        }
    int k = s->lists_next++ % 4;
    for (int r = 0; s->lists[k].lists && r < s->lists[k].p; r++)
        pt_schedule_free(&s->lists[k].lists[r]);
    free(s->lists[k].lists);
    s->lists[k].lists = calloc((size_t)p, sizeof(pt_schedule));
    if (!s->lists[k].lists) return pt_error_set(PT_ERR_NOMEM, "plan: pass lists");
    s->lists[k].p = p, s->lists[k].m = m, s->lists[k].v = v;
    snprintf(s->lists[k].name, sizeof s->lists[k].name, "%s", l->schedule);
    pt_status st = pt_schedule_build_all(s->lists[k].lists, l->schedule, m, p, v);
    if (st != PT_OK) {
        s->lists[k].m = -1; /* zeroed lists, freed with the slot */
        return st;
    }
    s->pipe.lists = s->lists[k].lists;
    return PT_OK;
}
