/* The trace recorder: a fixed array of complete events ("ph":"X"), filled
 * without allocation during training and written as Chrome trace JSON
 * objects at the end; and its stack entry "trace", one event per module
 * pass. Merging ranks' parts into one file is the trainer's.
 *
 * Not here: file naming, merging, clock alignment across hosts. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

typedef struct {
    char name[40];
    const char *cat;
    int tid;
    long step;
    uint64_t start, end;
} event;

struct pt_trace {
    event *ev;
    size_t n, cap, dropped;
};

pt_status pt_trace_new(pt_trace **out, size_t max_events) {
    *out = NULL;
    pt_trace *t = calloc(1, sizeof *t);
    if (!t) return pt_error_set(PT_ERR_NOMEM, "trace");
    t->ev = pt_mem_alloc(PT_MEM_SCRATCH, (max_events ? max_events : 1) * sizeof(event));
    if (!t->ev) {
        free(t);
        return pt_error_set(PT_ERR_NOMEM, "trace: %zu events", max_events);
    }
    t->cap = max_events;
    *out = t;
    return PT_OK;
}

void pt_trace_free(pt_trace *t) {
    if (!t) return;
    pt_mem_free(t->ev);
    free(t);
}

void pt_trace_add(pt_trace *t, const char *name, const char *cat, int tid, uint64_t start_ns,
                  uint64_t end_ns, long step) {
    if (!t) return;
    if (t->n == t->cap) {
        t->dropped++;
        return;
    }
    event *e = &t->ev[t->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cat = cat;
    e->tid = tid;
    e->step = step;
    e->start = start_ns;
    e->end = end_ns < start_ns ? start_ns : end_ns;
}

size_t pt_trace_count(const pt_trace *t) {
    return t ? t->n : 0;
}
size_t pt_trace_dropped(const pt_trace *t) {
    return t ? t->dropped : 0;
}

pt_status pt_trace_write_events(const pt_trace *t, FILE *f, int rank, uint64_t t0_ns) {
    fprintf(
        f,
        "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n"
        "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}},"
        "\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":"
        "\"main\"}},\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":1,\"args\":{"
        "\"name\":\"comm\"}}",
        rank, rank, rank, rank, rank, rank);
    for (size_t i = 0; t && i < t->n; i++) {
        const event *e = &t->ev[i];
        double ts = e->start >= t0_ns ? (double)(e->start - t0_ns) / 1e3
                                      : -(double)(t0_ns - e->start) / 1e3;
        fprintf(f,
                ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
                "\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%ld}}",
                e->name, e->cat, rank, e->tid, ts, (double)(e->end - e->start) / 1e3, e->step);
    }
    return ferror(f) ? pt_error_set(PT_ERR_IO, "trace: write error") : PT_OK;
}

/* ---- the stack entry: one event per module pass ---- */

typedef struct {
    pt_trace *t;
    int microbatches, split, L;
    long step;
    uint64_t t0; /* the pass's start: after the entries before this one (a ZeRO gather
                    is not the module's compute) */
} trace_entry;

static pt_status tr_begin(void *self, pt_step_begin *b) {
    ((trace_entry *)self)->step = b->step;
    return PT_OK;
}

static pt_status tr_start(void *self, const pt_hook_point *p) {
    (void)p;
    ((trace_entry *)self)->t0 = pt_time_ns();
    return PT_OK;
}

/* "fwd h.3 mb1", "bwd head", "B embedding", "W h.0 mb2" */
static void tr_record(trace_entry *e, const char *pass, const char *cat, const pt_hook_point *p) {
    char mod[16], name[40];
    if (p->module == 0)
        snprintf(mod, sizeof mod, "embedding");
    else if (p->module == e->L + 1)
        snprintf(mod, sizeof mod, "head");
    else
        snprintf(mod, sizeof mod, "h.%d", p->module - 1);
    if (e->microbatches > 1)
        snprintf(name, sizeof name, "%s %s mb%d", pass, mod, p->micro);
    else
        snprintf(name, sizeof name, "%s %s", pass, mod);
    pt_trace_add(e->t, name, cat, PT_TRACE_MAIN, e->t0, pt_time_ns(), e->step);
}

static pt_status tr_forward(void *self, const pt_hook_point *p) {
    tr_record(self, "fwd", "forward", p);
    return PT_OK;
}
static pt_status tr_backward(void *self, const pt_hook_point *p) {
    trace_entry *e = self;
    tr_record(e, e->split ? "B" : "bwd", "backward", p);
    return PT_OK;
}
static pt_status tr_weight(void *self, const pt_hook_point *p) {
    tr_record(self, "W", "backward", p);
    return PT_OK;
}

static const pt_strategy_ops TRACE = {.name = "trace",
                                      .begin = tr_begin,
                                      .before_forward = tr_start,
                                      .after_forward = tr_forward,
                                      .before_backward = tr_start,
                                      .after_backward = tr_backward,
                                      .before_weight = tr_start,
                                      .after_weight = tr_weight,
                                      .free = free};

pt_status pt_trace_strategy(pt_strategy *out, pt_trace *t, const pt_model *m, int microbatches,
                            int split) {
    *out = (pt_strategy){0};
    if (!t) return PT_OK;
    trace_entry *e = pt_strategy_entry_new(out, sizeof *e, "trace");
    if (!e) return PT_ERR_NOMEM;
    *e = (trace_entry){t, microbatches, split, pt_model_config_of(m)->n_layer, 0, 0};
    *out = (pt_strategy){&TRACE, e};
    return PT_OK;
}
