/* The trainer's loop: from the current step to train.steps, with the
 * progress line on stderr, the JSON-lines metrics whose every write is
 * checked, validation (the same bits under every layout), checkpoints every
 * checkpoint.every steps and at the end, the merged Chrome trace, and SIGINT
 * (save, then stop).
 *
 * What makes resume bitwise: everything a step depends on is either in the
 * checkpoint (parameters, the optimizer's state (AdamW moments and update
 * count, or SGD's momentum buffer), step count, the
 * data RNG's key and counter; under stale and local_sgd also each rank's
 * own parameters and moments, the stale rounds in flight and dga's local
 * gradients, the outer Nesterov state: rank<r>.safetensors) or a pure
 * function of the step (learning rate, which slot a step uses). Validation
 * reads fixed windows and touches no state.
 *
 * Not here: construction (trainer_new.c), the step (trainer_step.c),
 * checkpoints (trainer_ckpt.c), the metrics file's lines (trainer_metrics.c). */
#include "trainer_impl.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/kernels.h"

/* Validation gives the same bits under every layout (for the same
 * parameters), so that a layout's val_loss is comparable with one worker's
 * exactly:
 *   - one window per forward: a window's loss (its mean over T positions)
 *     is then the same float whatever the layout; a batched forward's mean
 *     depends on which windows share the batch;
 *   - each rank sums its contiguous share in window order in DOUBLE, and
 *     the ranks' sums travel as doubles, bit for bit (an all-gather of
 *     their bytes; a float all-reduce rounded them to 24 bits, differently
 *     per layout), added in rank order: the single worker's sequential
 *     double sum up to double rounding, ~1e-16 relative, far below the one
 *     float rounding of the result.
 * A strategy's forward points may be collectives (ZeRO-3's gathers): every
 * rank runs as many passes as the rank with the most windows (extra ones
 * on window 0, not counted). */
/* This rank's windows' losses summed in double; the stack's begin and end
 * around them (the tied wte refreshed, gathered units released). */
static pt_status validate_share(pt_trainer *t, size_t nwin, double *sum) {
    int T = t->cfg.model.seq_len;
    size_t first = 0, mine = nwin;
    pt_comm_shard(nwin, t->dp_size, t->dp_rank, &first, &mine);
    size_t most = (nwin + (size_t)t->dp_size - 1) / (size_t)t->dp_size;
    pt_step_begin b = {.step = t->step, .eval = 1, .microbatches = 1};
    PT_CHECK(pt_stack_begin(&t->stack, &b));
    pt_status st = PT_OK;
    *sum = 0;
    for (size_t w = 0; w < most && st == PT_OK; w++) {
        pt_data_window(t->val, w < mine ? first + w : 0, T, t->inputs, t->targets);
        pt_batch batch = {t->inputs, t->targets, 0.0f, 1, T, 0, 0};
        float loss = 0;
        st = pt_pipeline_forward(t->pipe, &batch, &loss);
        if (w < mine) *sum += (double)loss;
    }
    pt_status e = pt_stack_end(&t->stack, &b);
    return st != PT_OK ? st : e;
}

pt_status pt_trainer_validate(pt_trainer *t, float *val_loss) {
    if (!t->val) return pt_error_set(PT_ERR_INVALID, "data.val is not set");
    int T = t->cfg.model.seq_len;
    size_t nwin = pt_data_num_windows(t->val, T);
    /* the same windows in every layout: val_batches x batch_size
     * sequences (global batches; micro-batches do not change it), each dp
     * rank its contiguous share (the ranks of a tp group or a pipeline run
     * the same windows together: their passes are collectives) */
    size_t want = (size_t)t->cfg.train.val_batches * (size_t)t->cfg.train.batch_size;
    if (nwin > want) nwin = want;
    double sum = 0;
    PT_CHECK(validate_share(t, nwin, &sum));
    if (t->aux) {
        /* two floats' room per rank for its double's bytes (pt_comm_shard of
         * 2 x ranks floats: rank r's are [2r, 2r + 2)) */
        _Static_assert(sizeof(double) == 2 * sizeof(float), "a double in two floats");
        float *all = calloc(2 * (size_t)t->nranks, sizeof(float));
        if (!all) return pt_error_set(PT_ERR_NOMEM, "validation sums");
        memcpy(all + 2 * (size_t)t->rank, &sum, sizeof sum);
        pt_status st = pt_comm_allgather(t->aux, all, 2 * (size_t)t->nranks);
        sum = 0;
        /* each dp share once: its tp rank 0's on the last stage (the head's) */
        const pt_config *c = &t->cfg;
        int dp = c->parallel.dp, tp = c->parallel.tp, pp = c->parallel.pp;
        int last = pt_pipeline_head_stage(t->pipe);
        for (int d = 0; st == PT_OK && d < dp; d++) {
            double part;
            memcpy(&part, all + 2 * (size_t)pt_mesh_rank_at(dp, tp, pp, last, d, 0), sizeof part);
            sum += part;
        }
        free(all);
        PT_CHECK(st);
    }
    *val_loss = (float)(sum / (double)nwin);
    return PT_OK;
}

/* ---- the loop ---- */

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* The loop's own figures: its start, how long the last validation and
 * save took (a start line when the last one took a second or more, or
 * there was none yet), and rank 0's step times (for the closing summary). */
typedef struct {
    double t_start, val_s, save_s;
    double *step_ms; /* train.steps of them (rank 0; NULL: no summary) */
    int nsteps;
    size_t peak; /* the largest per-rank peak of the run */
} loop_state;

static pt_status run_validation(pt_trainer *t, loop_state *L) {
    float vl = 0;
    if (t->rank == 0 && L->val_s >= 1.0) fprintf(stderr, "step %d: validating ...\n", t->step);
    double a = pt_time_s();
    PT_CHECK(pt_trainer_validate(t, &vl));
    L->val_s = pt_time_s() - a;
    if (t->rank != 0) return PT_OK;
    fprintf(stderr, "step %d: val loss %.4f (%.1f s)\n", t->step, (double)vl, L->val_s);
    return pt_metrics_val(t, vl, pt_time_s() - L->t_start, L->val_s * 1e3);
}

/* A checkpoint save, said when it starts and when it is done. */
static pt_status save_timed(pt_trainer *t, loop_state *L) {
    if (t->rank == 0 && L->save_s >= 1.0)
        fprintf(stderr, "step %d: saving checkpoint ...\n", t->step);
    double a = pt_time_s();
    PT_CHECK(pt_trainer_save(t));
    L->save_s = pt_time_s() - a;
    if (t->rank != 0) return PT_OK;
    fprintf(stderr, "%s checkpoint %s/step_%08d (%.1f s)\n",
            t->cfg.checkpoint.async ? "snapshot taken for" : "saved", t->cfg.checkpoint.dir,
            t->step, L->save_s);
    return pt_metrics_save(t, pt_time_s() - L->t_start, L->save_s * 1e3);
}

/* Copy the part file `part` to out; errors name the file that failed. */
static pt_status append_part(pt_out *out, const char *part) {
    FILE *in = NULL;
    pt_status st = pt_file_open_regular(part, &in, NULL);
    char buf[65536];
    size_t n;
    while (st == PT_OK && (n = fread(buf, 1, sizeof buf, in)) > 0) st = pt_out_write(out, buf, n);
    if (st == PT_OK && ferror(in)) st = pt_error_set(PT_ERR_IO, "%s: read error", part);
    if (in) fclose(in);
    return st;
}

/* This rank's events into PATH.rank<r> (written whole, pt_out). */
static pt_status write_part(pt_trainer *t, const char *part) {
    pt_out *o = NULL;
    PT_CHECK(pt_out_open(&o, part));
    pt_status st = pt_trace_write_events(t->trace, pt_out_stream(o), t->rank, t->trace_t0);
    /* a failed write fails the commit too, which names the file and why */
    pt_status e = pt_out_commit(o);
    return e != PT_OK ? e : st;
}

/* Rank 0: the parts, in rank order, into PATH, replaced whole (pt_out: a
 * temporary beside it, renamed) or left as it was. */
static pt_status merge_parts(pt_trainer *t, const char *path) {
    char part[PT_CONFIG_STR_MAX + 32];
    pt_out *o = NULL;
    PT_CHECK(pt_out_open(&o, path));
    static const char head[] = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    pt_status st = pt_out_write(o, head, sizeof head - 1);
    for (int r = 0; r < t->nranks && st == PT_OK; r++) {
        snprintf(part, sizeof part, "%s.rank%d", path, r);
        if (r > 0) st = pt_out_write(o, ",\n", 2);
        if (st == PT_OK) st = append_part(o, part);
    }
    if (st == PT_OK) st = pt_out_write(o, "\n]}\n", 4);
    if (st != PT_OK) {
        pt_out_abort(o);
        return st;
    }
    return pt_out_commit(o);
}

/* Every rank writes its events to PATH.rank<r>; rank 0 merges them into
 * PATH and removes the parts. Every write is checked: a trace cut short by
 * a full disk or a file size limit is an error naming the file, and PATH
 * is left as it was, never a truncated JSON. */
static pt_status write_trace(pt_trainer *t) {
    const char *path = t->cfg.log.trace;
    char part[PT_CONFIG_STR_MAX + 32];
    snprintf(part, sizeof part, "%s.rank%d", path, t->rank);
    pt_status st = write_part(t, part);
    if (st != PT_OK) st = pt_trainer_prefix_error(st, "log.trace");
    if (pt_trace_dropped(t->trace))
        PT_WARN("log.trace: %zu events dropped (buffer full)", pt_trace_dropped(t->trace));
    if (t->aux) {
        float bad[1] = {st == PT_OK ? 0.0f : 1.0f};
        pt_status e = pt_comm_allreduce(t->aux, bad, 1, PT_REDUCE_SUM);
        if (e != PT_OK) return e;
        if (st == PT_OK && bad[0] != 0.0f)
            st = pt_error_set(PT_ERR_IO, "log.trace: a rank could not write its part");
    }
    if (t->rank != 0) return st;
    if (st == PT_OK && (st = merge_parts(t, path)) != PT_OK)
        st = pt_trainer_prefix_error(st, "log.trace");
    for (int r = 0; r < t->nranks; r++) { /* the parts go, merged or not */
        snprintf(part, sizeof part, "%s.rank%d", path, r);
        remove(part);
    }
    if (st == PT_OK) PT_INFO("wrote trace %s (%d ranks)", path, t->nranks);
    return st;
}

static void format_eta(char *buf, size_t n, double s) {
    if (s < 0 || !isfinite(s)) s = 0;
    int sec = (int)(s + 0.5);
    if (sec >= 3600)
        snprintf(buf, n, "%dh%02dm", sec / 3600, sec / 60 % 60);
    else
        snprintf(buf, n, "%dm%02ds", sec / 60, sec % 60);
}

/* rank 0: what the run is, before its first step */
static void say_start(const pt_trainer *t) {
    const pt_config *c = &t->cfg;
    if (t->rank != 0) return;
    PT_INFO("world %d (%s), sync %s, %d threads per rank, per-rank batch %d (%d x %d)", t->nranks,
            t->world ? pt_comm_backend_name(t->world) : "single", c->parallel.sync,
            c->train.threads, t->local_B, c->parallel.microbatches, t->micro_B);
    if (pt_model_bf16(t->model))
        PT_INFO("precision bf16: matrix products on the %s bf16 kernel, fp32 master weights, "
                "optimizer state and gradients",
                pt_gemm_bf16_kind());
    if (t->dps) {
        pt_ddp *d = pt_dp_sync_ddp(t->dps);
        size_t o, n;
        pt_ddp_bucket(d, 0, &o, &n, NULL);
        PT_INFO("gradient buckets: %d (largest %.2f MiB), overlap %s", pt_ddp_num_buckets(d),
                (double)n * 4 / 1048576.0, c->parallel.overlap ? "on" : "off");
    }
    /* the whole model's count, and what this rank holds of it (a tp slice,
     * a pipeline stage) */
    if (t->mp)
        PT_INFO("model: %zu parameters (%zu on this rank), %d layers, n_embd %d, %d heads, "
                "seq_len %d, vocab %d",
                pt_trainer_num_params(t), pt_model_num_params(t->model), c->model.n_layer,
                c->model.n_embd, c->model.n_head, c->model.seq_len, c->model.vocab_size);
    else
        PT_INFO("model: %zu parameters, %d layers, n_embd %d, %d heads, seq_len %d, vocab %d",
                pt_model_num_params(t->model), c->model.n_layer, c->model.n_embd, c->model.n_head,
                c->model.seq_len, c->model.vocab_size);
}

/* rank 0's progress line: the step, its time, the share of the ranks' time
 * spent exposed on communication and waiting for neighbour stages (the
 * parts' means over the ranks), and the ETA */
static void progress(const pt_trainer *t, const loop_state *L, const pt_step_info *info,
                     int start) {
    const pt_config *c = &t->cfg;
    double elapsed = pt_time_s() - L->t_start;
    char eta[32], share[160] = "";
    format_eta(eta, sizeof eta, elapsed / (t->step - start) * (c->train.steps - t->step));
    double wall = info->wall.mean > 0 ? info->wall.mean : 1;
    double comm =
        info->part[PT_PART_DP].mean + info->part[PT_PART_TP].mean + info->part[PT_PART_ZERO].mean;
    if (t->nranks > 1 && t->pp) {
        int len = snprintf(share, sizeof share, "  comm %.0f%%  pp wait %.0f%%  idle ms",
                           100 * comm / wall, 100 * info->part[PT_PART_PP].mean / wall);
        /* each stage's idle time outside its passes */
        for (int k = 0; k < info->stages && k < 8 && len < (int)sizeof share; k++)
            len += snprintf(share + len, sizeof share - (size_t)len, "%s%.0f", k ? "/" : " ",
                            info->stage_idle_ms[k]);
    } else if (t->nranks > 1)
        snprintf(share, sizeof share, "  comm %.0f%%", 100 * comm / wall);
    fprintf(stderr, "step %5d/%d  loss %.4f  lr %.2e  %.0f tok/s  %.1f ms%s  ETA %s\n", t->step,
            c->train.steps, (double)info->loss, (double)info->lr, info->tokens_per_s, info->step_ms,
            share, eta);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* rank 0, at the end: the median step and the memory peak, beside what
 * the plan predicted when there was one */
static void summary(const pt_trainer *t, loop_state *L) {
    if (t->rank != 0 || !L->step_ms || L->nsteps == 0) return;
    qsort(L->step_ms, (size_t)L->nsteps, sizeof *L->step_ms, cmp_double);
    double med = L->step_ms[L->nsteps / 2], mib = (double)L->peak / 1048576.0;
    double p_ms = 0, p_mem = 0;
    char elapsed[32], ms[48] = "", mem[48] = "";
    format_eta(elapsed, sizeof elapsed, pt_time_s() - L->t_start);
    if (pt_trainer_planned(t, &p_ms, &p_mem)) {
        snprintf(ms, sizeof ms, " (predicted %.1f ms)", p_ms);
        snprintf(mem, sizeof mem, " (predicted %.1f MiB)", p_mem / 1048576.0);
    }
    fprintf(stderr, "measured: %.1f ms a step, the median of %d%s; %.1f MiB a rank at most%s; %s\n",
            med, L->nsteps, ms, mib, mem, elapsed);
}

pt_status pt_trainer_run(pt_trainer *t) {
    const pt_config *c = &t->cfg;
    if (!t->train) return pt_error_set(PT_ERR_INVALID, "data.train is not set");
    PT_CHECK(pt_metrics_open(t));
    pt_status st = PT_OK;
    loop_state L = {.val_s = 1, .save_s = 1}; /* the first of each: not known to be quick */
    /* log.probe: rank 0's buffer for the speed probe after each step
     * (malloc, not pt_mem: instrumentation stays out of the categories) */
    float *probe_buf = NULL;
    if (c->log.probe && t->metrics) {
        probe_buf = calloc(pt_speed_probe_floats(), sizeof(float));
        if (!probe_buf) return pt_error_set(PT_ERR_NOMEM, "log.probe: the probe's buffers");
    }
    if (t->rank == 0 && c->train.steps > t->step) /* NULL: no summary */
        L.step_ms = malloc((size_t)(c->train.steps - t->step) * sizeof *L.step_ms);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old);
    say_start(t);
    int last_val = -1, last_save = -1, start = t->step;
    L.t_start = pt_time_s();
    if (t->val) {
        PT_CHECK_GOTO(st, run_validation(t, &L), done);
        last_val = t->step;
    }
    while (t->step < c->train.steps && !interrupted) {
        pt_step_info info;
        PT_CHECK_GOTO(st, pt_trainer_step(t, &info), done);
        if (probe_buf) info.probe_flops_s = pt_speed_probe(probe_buf); /* outside step_ms */
        PT_CHECK_GOTO(st, pt_metrics_step(t, &info, pt_time_s() - L.t_start), done);
        if (L.step_ms) L.step_ms[L.nsteps++] = info.step_ms;
        if (t->mem_peak_total > L.peak) L.peak = t->mem_peak_total;
        if (t->rank == 0 &&
            (t->step % c->log.every == 0 || t->step == c->train.steps || t->step == start + 1))
            progress(t, &L, &info, start);
        if (t->val && c->train.val_every > 0 && t->step % c->train.val_every == 0) {
            PT_CHECK_GOTO(st, run_validation(t, &L), done);
            last_val = t->step;
        }
        if (c->checkpoint.dir[0] && c->checkpoint.every > 0 && t->step % c->checkpoint.every == 0) {
            PT_CHECK_GOTO(st, save_timed(t, &L), done);
            last_save = t->step;
        }
    }
    if (t->val && last_val != t->step) PT_CHECK_GOTO(st, run_validation(t, &L), done);
    if (c->checkpoint.dir[0] && last_save != t->step) PT_CHECK_GOTO(st, save_timed(t, &L), done);
    /* the run's end waits for the last save (checkpoint.async) */
    PT_CHECK_GOTO(st, pt_trainer_save_wait(t), done);
    if (c->checkpoint.dir[0] && c->checkpoint.async && t->rank == 0)
        fprintf(stderr, "saved checkpoint %s/step_%08d\n", c->checkpoint.dir, t->step);
    if (t->trace) PT_CHECK_GOTO(st, write_trace(t), done);
    if (interrupted) st = pt_error_set(PT_ERR_INTERRUPTED, "interrupted at step %d", t->step);
    summary(t, &L);
done:
    free(probe_buf);
    free(L.step_ms);
    sigaction(SIGINT, &old, NULL);
    return pt_metrics_close(t, st);
}
