/* The trace recorder: a fixed array of complete events ("ph":"X"), filled
 * without allocation during training and written as Chrome trace JSON
 * objects at the end. Merging ranks' parts into one file is the trainer's.
 *
 * Not here: file naming, merging, clock alignment across hosts. */
#include <inttypes.h>
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
