/* ZeRO on the strategy stack (parallel.h): pt_zero's points, and its
 * update, which replaces the optimizer entry (each rank steps on its own
 * shard). Stage 1 runs under the data-parallel "ddp" entry's buckets,
 * which the trainer pushes before this one.
 *
 * Not here: the sharding itself (zero.c). */
#include <stdlib.h>

#include "partrain/parallel.h"

typedef struct {
    pt_zero *z;
    pt_trace *trace;
    long step;
    uint64_t step_ns; /* the last update's blocking time */
} zero_entry;

static pt_status zbegin(void *self, pt_step_begin *b) {
    zero_entry *e = self;
    e->step = b->step;
    pt_zero_note_step(e->z, b->step);
    return PT_OK;
}
static pt_status zbefore_forward(void *self, const pt_hook_point *p) {
    return pt_zero_before_forward(((zero_entry *)self)->z, p->module);
}
static pt_status zafter_forward(void *self, const pt_hook_point *p) {
    return pt_zero_after_forward(((zero_entry *)self)->z, p->module);
}
static pt_status zbefore_backward(void *self, const pt_hook_point *p) {
    return pt_zero_before_backward(((zero_entry *)self)->z, p->module);
}
static pt_status zgrads(void *self, const pt_hook_point *p) {
    return pt_zero_module_done(((zero_entry *)self)->z, p->module, p->last);
}
/* A validation pass under keep_params leaves units gathered. */
static pt_status zend(void *self, const pt_step_begin *b) {
    return b->eval ? pt_zero_release_params(((zero_entry *)self)->z) : PT_OK;
}

static pt_status zupdate(void *self, pt_update *u) {
    zero_entry *e = self;
    uint64_t a = pt_time_ns();
    PT_CHECK(pt_zero_step(e->z, u));
    e->step_ns = pt_time_ns() - a;
    pt_trace_add(e->trace, "zero step", "optim", PT_TRACE_MAIN, a, a + e->step_ns, e->step);
    return PT_OK;
}

/* The blocking step (collectives and the shard's optimizer) and the hooks'
 * waits (stages 2, 3) are this rank's exposed communication. */
static void zstats(void *self, pt_sync_stats *s) {
    zero_entry *e = self;
    uint64_t ns = e->step_ns + pt_zero_take_wait_ns(e->z);
    e->step_ns = 0;
    s->comm_ns += ns;
    s->exposed_ns += ns;
    s->bytes += pt_zero_take_bytes(e->z);
}

static void zcounts(void *self, pt_comm_counts *k) {
    pt_zero_counts(((zero_entry *)self)->z, k);
}

static pt_status zstate(void *self, pt_state_visit *v) {
    return pt_zero_state(((zero_entry *)self)->z, v);
}

static void zfree(void *self) {
    zero_entry *e = self;
    pt_zero_free(e->z);
    free(e);
}

static const pt_strategy_ops ZERO = {.name = "zero",
                                     .begin = zbegin,
                                     .before_forward = zbefore_forward,
                                     .after_forward = zafter_forward,
                                     .before_backward = zbefore_backward,
                                     .grads = zgrads,
                                     .end = zend,
                                     .update = zupdate,
                                     .stats = zstats,
                                     .counts = zcounts,
                                     .state = zstate,
                                     .free = zfree};

pt_status pt_zero_strategy(pt_strategy *out, pt_zero **handle, pt_model *m, pt_comm *dp,
                           const pt_zero_options *o, const pt_adamw_hparams *hp, pt_trace *trace) {
    zero_entry *e = pt_strategy_entry_new(out, sizeof *e, "zero");
    if (!e) return PT_ERR_NOMEM;
    pt_status st = pt_zero_new(&e->z, m, dp, o, hp);
    if (st != PT_OK) {
        free(e);
        return st;
    }
    e->trace = trace;
    pt_zero_set_trace(e->z, trace);
    *out = (pt_strategy){&ZERO, e};
    if (handle) *handle = e->z;
    return PT_OK;
}
