/* The strategy stack (parallel.h): one ordered array of strategy tables,
 * called at the executor's points. BEFORE points run in stack order, AFTER
 * points in reverse; the first error stops the point and is returned.
 *
 * Not here: any strategy (ddp.c, zero_strategy.c, strategies.c, tied.c,
 * trace.c, local_sgd.c), the executor (pipeline/runtime.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

pt_status pt_stack_push(pt_stack *s, pt_strategy e) {
    if (!e.ops) return PT_OK;
    if (s->n == PT_STACK_MAX) {
        if (e.ops->free) e.ops->free(e.self);
        return pt_error_set(PT_ERR_INTERNAL, "strategy stack: more than %d entries", PT_STACK_MAX);
    }
    s->at[s->n++] = e;
    return PT_OK;
}

void pt_stack_free(pt_stack *s) {
    for (int i = s->n - 1; i >= 0; i--)
        if (s->at[i].ops->free) s->at[i].ops->free(s->at[i].self);
    memset(s, 0, sizeof *s);
}

pt_strategy *pt_stack_find(pt_stack *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->at[i].ops->name, name)) return &s->at[i];
    return NULL;
}

pt_status pt_stack_begin(pt_stack *s, pt_step_begin *b) {
    for (int i = 0; i < s->n; i++)
        if (s->at[i].ops->begin) PT_CHECK(s->at[i].ops->begin(s->at[i].self, b));
    return PT_OK;
}

typedef pt_status (*point_fn)(void *self, const pt_hook_point *p);

static point_fn slot_of(const pt_strategy_ops *o, pt_point k) {
    switch (k) {
    case PT_POINT_BEFORE_FORWARD:
        return o->before_forward;
    case PT_POINT_AFTER_FORWARD:
        return o->after_forward;
    case PT_POINT_BEFORE_BACKWARD:
        return o->before_backward;
    case PT_POINT_AFTER_BACKWARD:
        return o->after_backward;
    case PT_POINT_BEFORE_WEIGHT:
        return o->before_weight;
    case PT_POINT_AFTER_WEIGHT:
        return o->after_weight;
    case PT_POINT_GRADS:
        return o->grads;
    }
    return NULL;
}

static int is_after(pt_point k) {
    return k == PT_POINT_AFTER_FORWARD || k == PT_POINT_AFTER_BACKWARD ||
           k == PT_POINT_AFTER_WEIGHT || k == PT_POINT_GRADS;
}

pt_status pt_stack_point(pt_stack *s, pt_point k, const pt_hook_point *p) {
    int after = is_after(k);
    for (int j = 0; j < s->n; j++) {
        const pt_strategy *e = &s->at[after ? s->n - 1 - j : j];
        point_fn fn = slot_of(e->ops, k);
        if (fn) PT_CHECK(fn(e->self, p));
    }
    return PT_OK;
}

pt_status pt_stack_end(pt_stack *s, const pt_step_begin *b) {
    pt_status st = PT_OK;
    char msg[512] = "";
    for (int i = s->n - 1; i >= 0; i--)
        if (s->at[i].ops->end) {
            pt_status e = s->at[i].ops->end(s->at[i].self, b);
            if (e != PT_OK && st == PT_OK) {
                st = e;
                snprintf(msg, sizeof msg, "%s", pt_error_message());
            }
        }
    return st == PT_OK ? PT_OK : pt_error_set(st, "%s", msg);
}

/* The norm entries in stack order: each sums its part over its group. */
static pt_status reduce_norm(void *arg, double parts[2], double *sumsq) {
    pt_stack *s = arg;
    for (int i = 0; i < s->n; i++)
        if (s->at[i].ops->norm) PT_CHECK(s->at[i].ops->norm(s->at[i].self, parts));
    *sumsq = parts[0] + parts[1];
    return PT_OK;
}

pt_status pt_stack_update(pt_stack *s, pt_update *u) {
    for (int i = 0; i < s->n && !u->reduce_norm; i++)
        if (s->at[i].ops->norm) {
            u->reduce_norm = reduce_norm;
            u->norm_arg = s;
        }
    for (int i = 0; i < s->n; i++)
        if (s->at[i].ops->sync) PT_CHECK(s->at[i].ops->sync(s->at[i].self, u));
    for (int i = 0; i < s->n; i++)
        if (s->at[i].ops->update) PT_CHECK(s->at[i].ops->update(s->at[i].self, u));
    return PT_OK;
}

void pt_stack_stats(pt_stack *s, pt_sync_stats *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < s->n; i++)
        if (s->at[i].ops->stats) s->at[i].ops->stats(s->at[i].self, out);
}

void pt_stack_counts(pt_stack *s, pt_comm_counts *k) {
    for (int i = 0; i < s->n; i++)
        if (s->at[i].ops->counts) s->at[i].ops->counts(s->at[i].self, k);
}

const char *pt_group_name(pt_group g) {
    static const char *names[PT_NGROUPS] = {"dp", "tp", "pp", "zero"};
    return (unsigned)g < PT_NGROUPS ? names[g] : "unknown";
}

void pt_comm_counts_add(pt_comm_counts *k, pt_group g, const pt_comm *c) {
    if (!c || (unsigned)g >= PT_NGROUPS) return;
    pt_comm_stats s;
    pt_comm_get_stats(c, &s);
    k->blocked_ns[g] += s.blocked_ns;
    for (int op = 0; op < PT_OP_COUNT; op++) {
        k->comm_ns[g] += s.ns[op];
        k->sent[g] += s.bytes_sent[op];
    }
}

void *pt_strategy_entry_new(pt_strategy *out, size_t size, const char *what) {
    *out = (pt_strategy){0};
    void *e = calloc(1, size);
    if (!e) pt_error_set(PT_ERR_NOMEM, "%s", what);
    return e;
}

pt_status pt_stack_state(pt_stack *s, pt_state_visit *v) {
    for (int i = 0; i < s->n; i++)
        if (s->at[i].ops->state) PT_CHECK(s->at[i].ops->state(s->at[i].self, v));
    return PT_OK;
}
