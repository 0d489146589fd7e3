/* Schedules: the order in which one rank runs the forward and backward
 * passes of a step's micro-batches. The trainer's step is a driver over
 * such a list (trainer_step.c), so that a schedule is data, not code: the
 * data-parallel modes run `none` (each micro-batch's backward right after
 * its forward, one micro-batch in flight) or `gpipe` (every forward, then
 * every backward: M in flight); pipeline schedules will add their lists
 * per stage.
 *
 * Not here: running the passes (the trainer), the stages' communication. */
#include <string.h>

#include "partrain/parallel.h"

pt_status pt_schedule_build(pt_schedule *s, const char *name, int microbatches) {
    memset(s, 0, sizeof *s);
    if (microbatches < 1 || microbatches > PT_SCHEDULE_MAX_MICRO)
        return pt_error_set(PT_ERR_INVALID, "parallel.microbatches must be in [1, %d] (got %d)",
                            PT_SCHEDULE_MAX_MICRO, microbatches);
    int M = microbatches, n = 0;
    if (!strcmp(name, "none")) {
        for (int mb = 0; mb < M; mb++) {
            s->pass[n++] = (pt_pass){PT_PASS_FORWARD, mb};
            s->pass[n++] = (pt_pass){PT_PASS_BACKWARD, mb};
        }
        s->in_flight = 1;
    } else if (!strcmp(name, "gpipe")) {
        for (int mb = 0; mb < M; mb++) s->pass[n++] = (pt_pass){PT_PASS_FORWARD, mb};
        for (int mb = 0; mb < M; mb++) s->pass[n++] = (pt_pass){PT_PASS_BACKWARD, mb};
        s->in_flight = M;
    } else {
        return pt_error_set(PT_ERR_UNSUPPORTED,
                            "parallel.schedule = %s is not supported yet (no pipeline "
                            "parallelism: none or gpipe)",
                            name);
    }
    s->npass = n;
    s->microbatches = M;
    /* the last backward of the step completes every module's gradients */
    for (int k = n - 1; k >= 0; k--)
        if (s->pass[k].kind == PT_PASS_BACKWARD) {
            s->last_micro = s->pass[k].micro;
            break;
        }
    return PT_OK;
}
