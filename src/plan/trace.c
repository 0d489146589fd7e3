/* The simulated timeline of a planned layout as a Chrome trace, in the
 * runtime's shapes (src/parallel/trace.c: complete events, cat "pipeline"
 * for passes named F<mb>, B<mb>, W<mb>, BW<mb> with " c<k>" for chunk k,
 * "comm" for collectives, "optim" for the update) so that
 * scripts/pipeline_figure.py draws it like a measured run:
 *   pid r (r < pp)   pipeline rank r of one dp x tp slice (every slice runs
 *                    the same timeline): tid 0 its passes, then the exposed
 *                    data-parallel traffic and the optimizer; tid 1 the tp
 *                    collectives inside its passes;
 *   pid 1000 + r     the link from rank r to its neighbours: each
 *                    activation or gradient transfer.
 * Times are the time model's (pt_plan_time_predict), microseconds. The
 * file is replaced atomically (pt_out): a full disk leaves the old one.
 *
 * Not here: the model itself (time.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_time_impl.h"

static void meta(FILE *f, int pid, const char *name, int sort, int *first) {
    fprintf(
        f,
        "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"%s\"}},\n"
        "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}}",
        *first ? "" : ",\n", pid, name, pid, sort);
    *first = 0;
}

static void event(FILE *f, const char *name, const char *cat, int pid, int tid, double start,
                  double end) {
    fprintf(f,
            ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
            "\"dur\":%.3f,\"args\":{\"step\":1}}",
            name, cat, pid, tid, start * 1e6, (end - start) * 1e6);
}

static double between(const pt_plan_pipe *pp, int ra, int rb) {
    long na = (long)ra * pp->stride / pp->dpn, nb = (long)rb * pp->stride / pp->dpn;
    return ra == rb ? 0 : na == nb ? pp->p2p_intra : pp->p2p_inter;
}

/* One rank's list in order (none: F B per micro-batch; gpipe: every F
 * first), each pass after the last, into *slots (malloc'd). */
static pt_status one_rank(const pt_plan_layout *l, const pt_plan_pipe *pp, pt_sched_slot **slots,
                          int *ns) {
    pt_schedule sc;
    PT_CHECK(pt_schedule_build(&sc, l->schedule, l->microbatches));
    *slots = malloc(sizeof **slots * (size_t)sc.npass);
    if (!*slots) {
        pt_schedule_free(&sc);
        return pt_error_set(PT_ERR_NOMEM, "plan: trace of %d passes", sc.npass);
    }
    double t = 0;
    for (int i = 0; i < sc.npass; i++) {
        const pt_pass *q = &sc.pass[i];
        double d = q->kind == PT_PASS_FORWARD ? pp->f[0] : pp->b[0] + pp->w[0];
        (*slots)[i] = (pt_sched_slot){0, q->kind, q->micro, 0, t, t + d};
        t += d;
    }
    *ns = sc.npass;
    pt_schedule_free(&sc);
    return PT_OK;
}

pt_status pt_plan_trace_write(const char *path, const pt_config *c, const pt_plan_layout *l,
                              const pt_cluster *cl) {
    pt_plan_pipe *pp = malloc(sizeof *pp);
    pt_sched_slot *slots = NULL;
    int ns = 0;
    pt_status st = pp ? pt_plan_pipe_times(c, l, cl, pp)
                      : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    if (st == PT_OK) st = pt_plan_pipe_run(l, pp);
    if (st == PT_OK && l->pp > 1) st = pt_plan_pipe_simulate(l, pp, 1, &pp->makespan, &slots, &ns);
    if (st == PT_OK && l->pp == 1) st = one_rank(l, pp, &slots, &ns);
    if (st != PT_OK) goto done;
    pt_plan_time tm;
    pt_plan_time_finish(c, l, cl, pp, &tm);
    /* written whole or not at all (pt_out): never a cut-off JSON at path */
    pt_out *o = NULL;
    PT_CHECK_GOTO(st, pt_out_open(&o, path), done);
    FILE *f = pt_out_stream(o);
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
    int first = 1;
    char name[64];
    for (int r = 0; r < l->pp; r++) {
        snprintf(name, sizeof name, "rank %d (stage %d)", r * l->dp * l->tp, r);
        meta(f, r, name, r, &first);
        if (l->pp > 1) {
            snprintf(name, sizeof name, "link %d", r);
            meta(f, 1000 + r, name, 1000 + r, &first);
        }
    }
    static const char *const kind[] = {"F", "BW", "B", "W"};
    for (int i = 0; i < ns; i++) {
        const pt_sched_slot *s = &slots[i];
        /* the chunk's virtual stage: the chunk-th on this rank in model order
         * (interleaved c p + r, zbv r then 2p - 1 - r) */
        int g = 0;
        for (int k = 0, seen = 0; k < pp->G; k++)
            if (pp->rank_of[k] == s->rank && seen++ == s->chunk) g = k;
        if (pp->v > 1)
            snprintf(name, sizeof name, "%s%d c%d", kind[s->kind], s->micro, s->chunk);
        else
            snprintf(name, sizeof name, "%s%d", kind[s->kind], s->micro);
        event(f, name, "pipeline", s->rank, 0, s->start, s->end);
        /* tp's collectives of the pass (half of F + B's each, the model's
         * split being 2 + 2 a block), on the comm thread at the pass's end */
        double tpd = s->kind == PT_PASS_BACKWARD_WEIGHT ? 0 : pp->tp[g] * 0.5;
        if (l->tp > 1 && tpd > 0)
            event(f, "tp all-reduce", "comm", s->rank, 1, s->end - tpd, s->end);
        /* the transfer to the next stage (F) or the previous one (B, BW) */
        int to = s->kind == PT_PASS_FORWARD           ? g + 1
                 : s->kind == PT_PASS_BACKWARD_WEIGHT ? -1
                                                      : g - 1;
        if (to >= 0 && to < pp->G && pp->rank_of[to] != s->rank) {
            double d = between(pp, s->rank, pp->rank_of[to]);
            snprintf(name, sizeof name, "%s %d", s->kind == PT_PASS_FORWARD ? "act" : "grad",
                     s->micro);
            event(f, name, "comm", 1000 + s->rank, 0, s->end, s->end + d);
        }
    }
    double t = pp->makespan;
    for (int r = 0; r < l->pp; r++) {
        if (tm.comm_s[PT_MESH_DP] > 0)
            event(f, l->zero ? "zero collectives" : "dp all-reduce", "comm", r, 0, t,
                  t + tm.comm_s[PT_MESH_DP]);
        event(f, "optimizer", "optim", r, 0, t + tm.comm_s[PT_MESH_DP], tm.step_s);
    }
    fputs("\n]}\n", f);
    st = pt_out_commit(o); /* every write above checked here, the file named */
done:
    free(slots);
    free(pp);
    return st;
}
