/* partrain calibrate: the modules' passes (calibrate_impl.h), through the
 * model's one-module range passes (pt_model_forward_range, _backward_range
 * split, _backward_weight_range, _recompute_range) for each module kind of
 * a shape: forward, input gradient (B), weight gradient (W) and the extra
 * backward of selective and full recomputation, per micro-batch size and
 * thread count, alone; then in groups of forked ranks, as tensor-parallel
 * shards and as whole modules with a rank on every core.
 *
 * Not here: the products alone (calibrate_kernels.c), timing
 * (calibrate_time.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "calibrate_impl.h"
#include "partrain/kernels.h"

enum { P_FWD, P_BGRAD, P_WGRAD, P_BW, P_RECOMPUTE };

typedef struct {
    pt_model *m;
    pt_model_slot *s;
    const pt_batch *b;
    int i, pass, last; /* module, pass, the model's head index */
    float *dy, *dx;
} module_arg;

/* The first failed pass's status (a tensor-parallel collective's), for
 * the rank's exit; after it, passes do nothing (the timings are dropped). */
static pt_status pass_err;

static void pass_module(void *arg) {
    module_arg *a = arg;
    int i = a->i;
    const float *dy = i == a->last ? NULL : a->dy;
    float *dx = i == 0 ? NULL : a->dx;
    pt_status st = PT_OK;
    if (pass_err != PT_OK) return;
    switch (a->pass) {
    case P_FWD: {
        float loss;
        st = pt_model_forward_range(a->m, a->s, a->b, i, i, i == a->last ? &loss : NULL);
        break;
    }
    case P_BGRAD:
        st = pt_model_backward_range(a->m, a->s, i, i, dy, dx, 1);
        break;
    case P_WGRAD:
        st = pt_model_backward_weight_range(a->m, a->s, i, i);
        break;
    case P_BW:
        st = pt_model_backward_range(a->m, a->s, i, i, dy, dx, 1);
        if (st == PT_OK) st = pt_model_backward_weight_range(a->m, a->s, i, i);
        break;
    default: /* what B recomputes first, alone */
        st = pt_model_recompute_range(a->m, a->s, i, i);
        break;
    }
    pass_err = st;
}

/* Block + head forward flops of a micro-batch of N rows (the cost cap). */
static double forward_flop(const pt_model_config *c, double N) {
    double C = c->n_embd;
    return 24.0 * N * C * C + 4.0 * N * c->seq_len * C + 2.0 * N * C * c->vocab_size;
}

typedef struct {
    pt_model *m[3];         /* whole (recompute none), block-only selective, block-only full */
    pt_model_slot *slot[3]; /* the whole model's own; a block range slot of the others */
    int *tokens;
    float *dy, *dx;
} module_models;

static void module_models_free(module_models *mm) {
    for (int r = 1; r < 3; r++) pt_model_slot_free(mm->slot[r]);
    for (int r = 0; r < 3; r++) pt_model_free(mm->m[r]);
    free(mm->tokens);
    pt_mem_free(mm->dy);
    pt_mem_free(mm->dx);
}

/* The three models of one module each, of tp rank `rank` of t (tp_comm
 * its group's communicator; t 1: the whole modules, tp_comm NULL). */
static pt_status module_models_new(module_models *mm, const pt_model_config *mc, int max_B, int t,
                                   int rank, pt_comm *tp_comm) {
    memset(mm, 0, sizeof *mm);
    static const unsigned char block_only[3] = {0, 1, 0};
    for (int r = 0; r < 3; r++) {
        pt_model_options opt = {
            .recompute = (pt_recompute)r, .owned = r ? block_only : NULL, .tp = t, .tp_rank = rank};
        PT_CHECK(pt_model_new_opts(&mm->m[r], mc, max_B, &opt));
        if (t > 1) pt_model_set_tp_comm(mm->m[r], tp_comm);
        pt_model_draw_weights(mm->m[r], 1);
        if (r)
            PT_CHECK(pt_model_slot_new_range(&mm->slot[r], mm->m[r], 1, 1));
        else
            mm->slot[r] = pt_model_own_slot(mm->m[r]);
    }
    size_t N = (size_t)max_B * mc->seq_len;
    mm->tokens = malloc(sizeof(int) * N);
    mm->dy = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * N * mc->n_embd);
    mm->dx = pt_mem_alloc(PT_MEM_SCRATCH, sizeof(float) * N * mc->n_embd);
    if (!mm->tokens || !mm->dy || !mm->dx)
        return pt_error_set(PT_ERR_NOMEM, "calibrate: module buffers of %zu rows", N);
    for (size_t i = 0; i < N; i++) mm->tokens[i] = (int)((i * 7919u + 13u) % mc->vocab_size);
    pt_calib_fill(mm->dy, N * mc->n_embd, 4);
    return PT_OK;
}

/* The largest micro-batch (sequences, a power of 2) whose forward is
 * within the effort's cap (1 at least). */
static int module_max_B(const effort *e, const pt_model_config *mc) {
    int max_B = 1;
    for (int mult = 2; mult <= e->max_mult; mult *= 2)
        if (forward_flop(mc, (double)mult * mc->seq_len) <= e->fwd_max_flop) max_B = mult;
    return max_B;
}

/* Each module's passes at micro-batch B (e[3]: embedding, block, head, of
 * tp shard t at `threads`), timed by `timer`; *probe_mean the speed probe's
 * mean before and after on as many cores, when probe_buf (else 0). */
static void time_modules(const effort *ef, timer_fn timer, module_models *mm,
                         const pt_model_config *mc, int B, int threads, int t, int ranks,
                         float *probe_buf, pt_profile_module e[3], double *probe_mean) {
    int T = mc->seq_len;
    pt_batch b = {.tokens = mm->tokens, .targets = mm->tokens, .B = B, .T = T};
    b.dloss = 1.0f / (float)(B * T);
    module_arg a = {.b = &b, .last = 2, .dy = mm->dy, .dx = mm->dx};
    double p0 = probe_buf ? pt_speed_probe_cores(probe_buf, threads) : 0;
    pt_calib_set_evict(!ef->quick); /* the tests' quick run: one repetition, no eviction */
    for (int r = 0; r < 3; r++) {
        a.m = mm->m[r];
        a.s = mm->slot[r];
        if (r) pt_calib_fill(pt_model_slot_stream(a.s, 0), (size_t)B * T * mc->n_embd, 5);
        /* one forward in order fills every module's input */
        for (int i = r ? 1 : 0; i <= (r ? 1 : 2); i++) {
            a.i = i;
            a.pass = P_FWD;
            pass_module(&a);
        }
        for (int i = r ? 1 : 0; i <= (r ? 1 : 2); i++) {
            a.i = i;
            if (r == 0) {
                e[i] = (pt_profile_module){.kind = i == 0   ? PT_MODULE_EMBEDDING
                                                   : i == 1 ? PT_MODULE_BLOCK
                                                            : PT_MODULE_HEAD,
                                           .n_embd = mc->n_embd,
                                           .n_head = mc->n_head,
                                           .seq_len = T,
                                           .vocab_size = mc->vocab_size,
                                           .tp = t,
                                           .tokens = B * T,
                                           .threads = threads,
                                           .ranks = ranks};
                a.pass = P_FWD;
                e[i].fwd_s = timer(ef, pass_module, &a);
                a.pass = P_BGRAD;
                e[i].bgrad_s = timer(ef, pass_module, &a);
                a.pass = P_WGRAD;
                e[i].wgrad_s = timer(ef, pass_module, &a);
            }
            if (i == 1 && r > 0) {
                a.pass = P_RECOMPUTE;
                e[1].recompute_s[r] = timer(ef, pass_module, &a);
            }
        }
    }
    /* Recomputation's extra backward time: B + W under the mode minus B + W
     * under none, paired runs' median difference, and never below the
     * recompute alone. B itself runs slower after a full recompute, so the
     * recompute alone falls short (small's block, 1024 tokens, 2 threads:
     * 15.0 ms alone, 18.5 ms of extra B + W); a difference of two minima
     * timed apart was noise (one entry: 14.3 ms, then 67.0 ms; some 0). */
    for (int r = 1; r < 3; r++) {
        module_arg none = a, mode = a;
        none.m = mm->m[0], none.s = mm->slot[0];
        mode.m = mm->m[r], mode.s = mm->slot[r];
        none.i = mode.i = 1;
        none.pass = mode.pass = P_BW;
        double extra =
            pt_calib_time_paired(ef, timer == pt_calib_time_min ? 0 : pt_calib_fixed_reps(ef),
                                 pass_module, &none, pass_module, &mode);
        if (extra > e[1].recompute_s[r]) e[1].recompute_s[r] = extra;
    }
    pt_calib_set_evict(0);
    *probe_mean = probe_buf ? 0.5 * (p0 + pt_speed_probe_cores(probe_buf, threads)) : 0;
}

/* Three module entries and the probe beside each (on their threads' cores)
 * into the tables; the block's probe joins the median. */
static pt_status push_modules(calib *k, const pt_profile_module e[3], const double probe[3]) {
    if (probe[1] > 0) PT_CHECK(pt_calib_keep_probe(k, e[1].threads, probe[1]));
    for (int i = 0; i < 3; i++) {
        PT_CHECK(pt_calib_push((void **)&k->probe_module, &k->n_module_probed, &k->cap_probe_module,
                               sizeof probe[i], &probe[i]));
        PT_CHECK(pt_calib_push((void **)&k->p->module, &k->p->n_module, &k->cap_module, sizeof e[i],
                               &e[i]));
    }
    return PT_OK;
}

pt_status pt_calib_measure_model(calib *k, const pt_model_config *shape) {
    pt_model_config mc = *shape;
    mc.n_layer = 1; /* one module of each kind */
    PT_CHECK(pt_model_config_validate(&mc));
    int max_B = module_max_B(k->e, &mc);
    module_models mm;
    pt_status st = module_models_new(&mm, &mc, max_B, 1, 0, NULL);
    for (int t = 0; st == PT_OK && t < k->n_threads; t++) {
        if (t > 0 && t < k->n_threads - 1) continue; /* modules: 1 and the most */
        pt_kernels_set_threads(k->threads[t]);
        for (int B = 1; st == PT_OK && B <= max_B; B *= 2) {
            pt_profile_module e[3];
            double pm;
            time_modules(k->e, pt_calib_time_min, &mm, &mc, B, k->threads[t], 1, 1,
                         k->e->quick ? NULL : k->probe_buf, e, &pm);
            st = pass_err != PT_OK ? pass_err : push_modules(k, e, (double[3]){pm, pm, pm});
        }
    }
    module_models_free(&mm);
    return st;
}

/* ---- in groups: tensor-parallel shards, and tp 1 under load ---------------
 * A shard's passes run the group's collectives, so a shard is timed in a
 * group of t ranks forked by pt_launch (shm), one thread each: its times
 * hold the collectives, the ranks waiting for one another at each (the skew
 * of a shared machine) and t ranks sharing the cores (the planner scales by
 * its own oversubscription over this one). And whole modules are timed
 * again with every core running the same passes (a rank per core, no
 * collectives), what a data-parallel or pipeline rank sees: on the 2-core
 * development machine a one-thread step took 15-28% longer with a second
 * one on the other core (caches and memory bandwidth are shared). Every
 * rank runs the same passes the same number of times (a time
 * target would let the counts differ and the collectives pair wrongly): a
 * warm-up, then two, rank 0's faster kept (an outlier size timed again:
 * outlier_sizes; with more ranks than cores,
 * five and their median: time_over), with rank 0's probe beside them (the
 * groups take about 40% of the run's time as it is). */

enum { TP_MAX_OUT = 64 };

typedef struct {
    const effort *e;
    pt_model_config mc;  /* n_layer 1 */
    int t, ranks, max_B; /* the shard's tp (1: whole), ranks at once */
    int cores;           /* the machine's */
    float *probe_buf;    /* the parent's (its pages are the fork's) */
    /* shared with the parent (MAP_SHARED): rank 0's entries, 3 per B, the
     * probe beside each, and how many sizes were timed again */
    pt_profile_module out[TP_MAX_OUT];
    double probe[TP_MAX_OUT];
    int n_out, n_retimed;
} tp_job;

/* A warm-up, then `reps` timed runs of fn(arg) into t. */
static void time_runs(pass_fn fn, void *arg, int reps, double *t) {
    fn(arg);
    for (int n = 0; n < reps; n++) {
        pt_calib_evict();
        pt_calib_start_together();
        double t0 = pt_time_s();
        fn(arg);
        t[n] = pt_time_s() - t0;
    }
}

static double time_fixed(const effort *e, pass_fn fn, void *arg) {
    double t[8] = {0};
    int reps = pt_calib_fixed_reps(e);
    time_runs(fn, arg, reps, t);
    double best = t[0];
    for (int n = 1; n < reps; n++) best = t[n] < best ? t[n] : best;
    return best;
}

/* More ranks than cores: a pass's time on rank 0 holds the waits for the
 * ranks that the scheduler left off the cores, a different draw each run
 * (gpt2's tp 4 block over 2 cores, 256 tokens: a forward of 9.4, 12.0 and
 * 13.5 ms in three calibrates, the head's weight gradient 23.4 and 52.9;
 * the fastest of two is a lucky draw, not a step's). So the median of
 * five, the same count on every rank. */
static double time_over(const effort *e, pass_fn fn, void *arg) {
    double t[5];
    int reps = e->quick ? 1 : 5;
    time_runs(fn, arg, reps, t);
    qsort(t, (size_t)reps, sizeof t[0], pt_calib_cmp_double);
    return t[reps / 2];
}

/* An entry's time per token at the median speed (times the probe's rate:
 * rescaled alike, probe_rescale), the sum of its three passes. */
static double module_cost(const pt_profile_module *e, double probe) {
    return (e->fwd_s + e->bgrad_s + e->wgrad_s) * (probe > 0 ? probe : 1) / e->tokens;
}

/* The micro-batch sizes (bit b: the b-th, B = 2^b) whose entries look like
 * a slow spell of the host's rather than the machine: a spell that outlasts
 * both repetitions makes a whole entry slow (small's tp 2 block at 256
 * tokens cost 3.0x per token what it did at 512, in one calibrate of
 * three; the others 1.07x). Per token a block or a head costs more at
 * fewer tokens (smaller products; gpt2's tp 2 block at 64 tokens 1.2-1.35x
 * the 128's), not 1.5x, and no more at more tokens than at half as many,
 * bar 15% of noise. The embedding, a few copies and a collective's latency,
 * does cost 1.5-10x per token at its fewest tokens, and little in a step.
 * out: the entries, three per size (embedding, block, head). */
static uint32_t outlier_sizes(const pt_profile_module *out, const double *probe, int n_out) {
    uint32_t redo = 0;
    for (int i = 0; i + 3 < n_out; i++) {
        if (i % 3 == 0) continue;
        double now = module_cost(&out[i], probe[i]), next = module_cost(&out[i + 3], probe[i + 3]);
        if (now > 1.5 * next) redo |= 1u << (i / 3);
        if (next > 1.15 * now) redo |= 1u << (i / 3 + 1);
    }
    return redo;
}

static int tp_rank_main(void *arg) {
    tp_job *j = arg;
    pt_comm_options co = {.backend = "shm"};
    pt_comm *c = NULL;
    pt_status s = pt_comm_new(&c, &co);
    int rank = c ? pt_comm_rank(c) : -1;
    module_models mm = {0};
    /* the parent's buffers, a copy-on-write copy in this forked rank */
    float *probe_buf = rank == 0 && !j->e->quick ? j->probe_buf : NULL;
    if (s == PT_OK) s = module_models_new(&mm, &j->mc, j->max_B, j->t, j->t > 1 ? rank : 0, c);
    pt_calib_set_lockstep(c);
    pt_kernels_set_threads(1);
    timer_fn timer = j->ranks > j->cores ? time_over : time_fixed;
    for (int B = 1; s == PT_OK && B <= j->max_B; B *= 2) {
        pt_profile_module e[3];
        double pm;
        time_modules(j->e, timer, &mm, &j->mc, B, 1, j->t, j->ranks, probe_buf, e, &pm);
        if (s == PT_OK) s = pass_err;
        if (s == PT_OK && rank == 0 && j->n_out + 3 <= TP_MAX_OUT) {
            for (int m = 0; m < 3; m++) j->probe[j->n_out + m] = pm;
            memcpy(&j->out[j->n_out], e, sizeof e);
            j->n_out += 3;
        }
    }
    /* Outliers, timed again: rank 0 names them, every rank reruns them. */
    uint32_t redo = rank == 0 && !j->e->quick ? outlier_sizes(j->out, j->probe, j->n_out) : 0;
    if (s == PT_OK && !j->e->quick) s = pt_comm_broadcast(c, &redo, sizeof redo, 0);
    for (int b = 0, B = 1; s == PT_OK && B <= j->max_B; b++, B *= 2) {
        if (!(redo >> b & 1)) continue;
        j->n_retimed += rank == 0;
        pt_profile_module e[3];
        double pm;
        time_modules(j->e, timer, &mm, &j->mc, B, 1, j->t, j->ranks, probe_buf, e, &pm);
        if (s == PT_OK) s = pass_err;
        for (int m = 0; s == PT_OK && rank == 0 && m < 3; m++)
            if (3 * b + m < j->n_out &&
                module_cost(&e[m], pm) < module_cost(&j->out[3 * b + m], j->probe[3 * b + m]))
                j->out[3 * b + m] = e[m], j->probe[3 * b + m] = pm;
    }
    if (s == PT_OK) s = pt_calib_lockstep_err();
    pt_calib_set_lockstep(NULL);
    if (s != PT_OK)
        fprintf(stderr, "partrain calibrate: group rank %d of %d: %s\n", rank, j->ranks,
                pt_error_message());
    module_models_free(&mm);
    pt_comm_free(c);
    pt_calib_evict_free();
    return s == PT_OK ? 0 : 1;
}

/* The shape's shards at t = 2 and 4 (2 in quick), where the shape splits
 * that way, and whole modules on every core. Before any thread of the
 * parent's starts (pt_launch forks). */
pt_status pt_calib_measure_groups(calib *k, const pt_model_config *shape) {
    tp_job *j = mmap(NULL, sizeof *j, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (j == MAP_FAILED)
        return pt_error_set(PT_ERR_NOMEM, "calibrate: shared results: %s", strerror(errno));
    pt_status st = PT_OK;
    const int groups[3][2] = {{1, k->p->cores}, {2, 2}, {4, 4}}; /* tp, ranks */
    for (int g = 0; st == PT_OK && g < (k->e->quick ? 2 : 3); g++) {
        int t = groups[g][0], ranks = groups[g][1];
        if (ranks < 2) continue; /* one core: under load is alone */
        memset(j, 0, sizeof *j);
        j->e = k->e;
        j->mc = *shape;
        j->mc.n_layer = 1;
        j->t = t;
        j->ranks = ranks;
        j->cores = k->p->cores;
        j->max_B = module_max_B(k->e, &j->mc);
        j->probe_buf = k->probe_buf;
        if (pt_model_config_validate(&j->mc) != PT_OK || pt_shard_check(&j->mc, t) != PT_OK) {
            pt_error_clear();
            continue; /* the shape does not split t ways */
        }
        pt_comm_options co = {.backend = "shm"};
        int exit_code = 1;
        st = pt_launch(ranks, tp_rank_main, j, &co, &exit_code);
        if (st == PT_OK && exit_code != 0)
            st = pt_error_set(PT_ERR_COMM,
                              "calibrate: the %d-rank measurement of tp %d failed "
                              "(exit %d)",
                              ranks, t, exit_code);
        k->c->n_retimed += j->n_retimed;
        for (int i = 0; st == PT_OK && i < j->n_out; i += 3)
            st = push_modules(k, &j->out[i], &j->probe[i]);
    }
    munmap(j, sizeof *j);
    return st;
}
