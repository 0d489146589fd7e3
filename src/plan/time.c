/* The planner's time model: a layout's step time on a cluster, without
 * running anything.
 *
 * Per pipeline virtual stage, the F, B and W seconds of one micro-batch
 * (time_passes.c: measured from the profile, or modelled). The pipeline:
 * the schedule's real pass lists (pt_schedule_build_all) run by the
 * schedules' own simulator (pt_sched_simulate) with these per-stage times,
 * the point-to-point transfer of a micro-batch's activations between ranks
 * (over the link between their nodes) and the tied wte's between the
 * embedding's and the head's ranks. Then per step: the data-parallel
 * gradient all-reduce (ring, over the link the dp group crosses; on a
 * measured machine the profile's own collectives), of which only what
 * exceeds the last backward is exposed when parallel.overlap is on; ZeRO-1
 * the same all-reduce and ZeRO-2 a reduce-scatter of gradients (overlapped
 * the same way), then an exposed all-gather of the updated shards; ZeRO-3
 * an all-gather of the sharded parameters in each forward and backward and
 * a reduce-scatter of gradients per micro-batch, prefetched under the
 * compute (exposed: what exceeds the rank's busy time); on a measured
 * machine whose cores the ranks' threads fill, none of it hides (the
 * collectives are copies on the same cores). HSDP the shard's all-reduce
 * across the replicas; the optimizer from the profile's adamw_s / sgd_s
 * over the threads, never faster than its bytes over the profile's
 * memory_bw times the threads, and a read of the gradients for their norm
 * where the runtime does not fuse it, plus the gradients' reset (a
 * memset); without a profile 28 bytes a parameter over memory_bw. Each
 * pipeline rank updates what it holds, the tied wte's rows split between
 * the first and the last stage at dp 1 (tied_split.c, with their exchange
 * after the passes), and the step waits for the longest update
 * (pt_sched_step_end: the stage cut's rule too). Ranks
 * beyond the cluster's devices share them: compute slows by world /
 * devices while every rank computes, less while a pipeline's stages wait
 * in a bubble (the simulator's shared run; on a measured machine a pass
 * also runs at its lone rank's time there when no core is shared, its
 * cores' caches and memory bandwidth its own), and BLAS threads per rank
 * are max(1, cores / world) unless train.threads is set.
 *
 * Not here: memory (memory.c), the choice of layout (search.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_time_impl.h"

int pt_plan_bf16(const pt_config *c) {
    return !strcmp(c->train.precision, "bf16");
}

/* 6 P tokens + 12 L C T tokens: every parameter's multiply-add forward and
 * backward (P counts the tied wte once, so the LM head's product is in)
 * and the attention scores and their weighting (PaLM's appendix B). */
double pt_plan_model_flops(const pt_config *c) {
    double P = (double)pt_model_config_num_params(&c->model);
    double tokens = (double)c->train.batch_size * c->model.seq_len;
    return 6.0 * P * tokens +
           12.0 * c->model.n_layer * (double)c->model.n_embd * c->model.seq_len * tokens;
}

double pt_plan_allreduce_s(int n, double bytes, double bw, double lat) {
    if (n <= 1 || bytes <= 0) return 0;
    return 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * lat;
}

double pt_plan_allgather_s(int n, double bytes, double bw, double lat) {
    if (n <= 1 || bytes <= 0) return 0;
    return (double)(n - 1) / n * bytes / bw + (n - 1) * lat;
}

/* n ranks at mesh stride `stride` share a node when they fit in one (the
 * mesh is laid out node by node, tp fastest). */
const pt_link *pt_plan_group_link(const pt_cluster *cl, int n, int stride) {
    return (long)n * stride <= cl->devices_per_node ? &cl->intra_node : &cl->inter_node;
}

/* The recompute mode of pipeline rank r: its entry of stage_recompute
 * ("full,none,..."), else the layout's. */
static int stage_recompute(const pt_plan_layout *l, int r) {
    const char *s = l->stage_recompute;
    if (!*s) return l->recompute;
    for (int i = 0; i < r && s; i++) {
        s = strchr(s, ',');
        if (s) s++;
    }
    if (!s) return l->recompute;
    return !strncmp(s, "full", 4)        ? PT_RECOMPUTE_FULL
           : !strncmp(s, "selective", 9) ? PT_RECOMPUTE_SELECTIVE
                                         : PT_RECOMPUTE_NONE;
}

/* Whether module i (0 embedding, 1..L h.0.., L+1 head) is named in
 * parallel.zero_whole ("embedding,head,h.0"). */
static int kept_whole(const char *list, int i, int L) {
    char name[24];
    if (i == 0)
        snprintf(name, sizeof name, "embedding");
    else if (i > L)
        snprintf(name, sizeof name, "head");
    else
        snprintf(name, sizeof name, "h.%d", i - 1);
    size_t n = strlen(name);
    for (const char *s = list; s && *s; s = strchr(s, ','), s = s ? s + 1 : s)
        if (!strncmp(s, name, n) && (s[n] == ',' || !s[n])) return 1;
    return 0;
}

/* Parameters (floats) of module i, the tied wte's copy on a head-only
 * stage included (stages.c's count, which pt_stage gives per stage only). */
static double module_params(const pt_model_config *c, int i, int first) {
    double tied = i > c->n_layer && first > 0 ? (double)c->vocab_size * c->n_embd : 0;
    return (double)pt_stage_module_params(c, i) + tied;
}

static int cluster_devices(const pt_cluster *cl) {
    return cl->nodes * cl->devices_per_node;
}

/* Whether pipeline ranks ra and rb (their first dp x tp ranks: the mesh's
 * pp stride apart) sit on one node. */
static int same_node(const pt_plan_pipe *pp, int ra, int rb) {
    return (long)ra * pp->stride / pp->dpn == (long)rb * pp->stride / pp->dpn;
}

/* The tied wte's figures into pp (rank_of, slow, stride set), el bytes an
 * element, bytes_s the elementwise rate. */
static void tied_times(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl, double el,
                       double bytes_s, pt_plan_pipe *pp) {
    /* The tied wte (trainer_pipe.c): the embedding's rank sends it to the
     * head's at the step's first forward and waits for the send before
     * going on; the head's sends its gradient back after the head's last
     * backward, which the embedding's waits for and adds in its own last.
     * The message is the vocabulary shard, from beyond the caches: gpt2's
     * 154 MB took 22 ms at the first forward of a pipeline step on the
     * 2-core machine, and the add 12 ms. Every dp and tp rank of the
     * embedding's stage sends its own at once: ranks beyond the devices
     * share them (gpt2 at dp 2 x pp 2 on 2 cores: 48.5 ms at the first
     * forward, where 2 ranks took 22). */
    int re = pp->rank_of[0], rh = pp->rank_of[pp->G - 1], p = pp->p;
    double V = c->model.vocab_size, C = c->model.n_embd;
    pp->wte = V * C / l->tp;
    pp->wte_hi = (V - (double)pt_tied_split_rows(c->model.vocab_size)) * C / l->tp;
    if (p > 1 && re != rh) {
        const pt_link *lk = same_node(pp, re, rh) ? &cl->intra_node : &cl->inter_node;
        double wb = pp->wte * el;
        pp->tied_split = l->dp == 1;
        if (pp->tied_split) { /* tied_split.c: halves both ways, after the passes */
            double hb = pp->wte_hi * el;
            pp->tied_x =
                2 * pt_plan_coll_s(cl, pp->slow, PT_PROFILE_P2P, 2, hb, lk) + 3 * hb / bytes_s;
        } else {
            pp->tied_s = pt_plan_coll_s(cl, pp->slow, PT_PROFILE_P2P, 2, wb, lk);
            pp->tied_add = 3 * wb / bytes_s; /* read both, write one */
        }
    }
}

pt_status pt_plan_pipe_times(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                             pt_plan_pipe *pp) {
    int v = l->virtual_stages > 0 ? l->virtual_stages : 1;
    if (l->pp > PT_PLAN_MAX_STAGES || v > PT_SCHEDULE_MAX_VIRTUAL)
        return pt_error_set(PT_ERR_INVALID,
                            "plan: parallel.pp = %d x parallel.virtual_stages = %d "
                            "is beyond the planner's %d x %d stages",
                            l->pp, v, PT_PLAN_MAX_STAGES, PT_SCHEDULE_MAX_VIRTUAL);
    pt_stage st[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    pt_stage_step step = pt_config_stage_step(c, l->dp); /* the trainer's cut */
    PT_CHECK(pt_stage_split_step(&c->model, &step, l->schedule, l->pp, v, l->microbatches,
                                 l->stage_layers, st));
    return pt_plan_pipe_times_split(c, l, cl, st, pp);
}

pt_status pt_plan_pipe_times_split(const pt_config *c, const pt_plan_layout *l,
                                   const pt_cluster *cl, const pt_stage *st, pt_plan_pipe *pp) {
    memset(pp, 0, sizeof *pp);
    int p = l->pp, v = l->virtual_stages > 0 ? l->virtual_stages : 1, G = p * v;
    if (p > PT_PLAN_MAX_STAGES || v > PT_SCHEDULE_MAX_VIRTUAL)
        return pt_error_set(PT_ERR_INVALID,
                            "plan: parallel.pp = %d x parallel.virtual_stages = %d "
                            "is beyond the planner's %d x %d stages",
                            p, v, PT_PLAN_MAX_STAGES, PT_SCHEDULE_MAX_VIRTUAL);
    int bf16 = pt_plan_bf16(c);
    double peak = bf16 ? cl->device.peak_flops_bf16 : cl->device.peak_flops_fp32;
    if (!(peak > 0))
        return pt_error_set(PT_ERR_INVALID,
                            "plan: train.precision = %s but the cluster '%s' has no "
                            "device.peak_flops.%s",
                            bf16 ? "bf16" : "fp32", cl->name, bf16 ? "bf16" : "fp32");
    int world = l->dp * l->tp * l->pp, dev = cluster_devices(cl);
    pp->slow = world > dev ? (double)world / dev : 1.0;
    /* a measured machine's device is one core: a rank runs its threads on
     * as many of them */
    int cores = cl->profile && cl->profile->cores > 0 ? cl->profile->cores : dev;
    pp->threads =
        l->threads > 0 ? l->threads : (cl->profile ? (cores / world > 1 ? cores / world : 1) : 1);
    double per = cl->profile ? pp->threads : 1;
    const pt_link *tl = pt_plan_group_link(cl, l->tp, 1);
    pt_plan_rates r = {peak * cl->efficiency.matmul * per / pp->slow,
                       cl->device.memory_bw * cl->efficiency.elementwise * per / pp->slow,
                       bf16 ? 2 : 4,
                       pt_plan_link_bw(cl, tl),
                       tl->latency,
                       pp->slow,
                       cl->profile && cl->profile->cores > 0 ? cl->profile->cores : 1};

    /* and a pipeline rank's passes while the others wait (one pipeline
     * rank's dp x tp ranks on the devices): the shared run's other end */
    double slow_a = l->dp * l->tp > dev ? (double)l->dp * l->tp / dev : 1.0;
    pt_plan_rates ra = r;
    ra.flops_s *= pp->slow / slow_a, ra.bytes_s *= pp->slow / slow_a, ra.slow = slow_a;
    /* and with the devices just full (the full layout's ranks on every
     * core, none shared): where a pipeline rank's ranks alone leave cores
     * free, between the two ends. Only a measured machine's differs from
     * the alone time (its cores share caches and memory bandwidth); a
     * modelled device runs as fast with its neighbours busy. */
    pt_plan_rates rc = r;
    rc.flops_s *= pp->slow, rc.bytes_s *= pp->slow, rc.slow = 1;
    int mid = cl->profile && pp->slow > 1 && l->dp * l->tp < dev;
    /* A measured machine's pass alone is faster even where no core is
     * shared: gpt2 at pp 2 over 2 cores, 1f1b m 1 (each stage alone in
     * turn), every pass at the both-cores-busy time put the step 8-21%
     * over the best measured in five runs. */
    pp->alone = p > 1 && (pp->slow > 1 || cl->profile);

    double N = (double)c->train.batch_size / ((double)l->dp * l->microbatches) * c->model.seq_len;
    pt_plan_layout lt = *l, la;
    lt.threads = pp->threads;
    la = lt, la.pp = 1;
    int L = c->model.n_layer;
    for (int g = 0; g < G; g++) {
        int chunk = 0, rank = p > 1 ? pt_schedule_locate(l->schedule, p, v, g, &chunk) : 0;
        PT_ASSERT(rank >= 0 && rank < p);
        pp->rank_of[g] = rank;
        pp->first[g] = st[g].first, pp->last[g] = st[g].last;
        int rec = stage_recompute(l, rank);
        for (int i = st[g].first; i <= st[g].last; i++) {
            int kind = i == 0 ? PT_MODULE_EMBEDDING : i <= L ? PT_MODULE_BLOCK : PT_MODULE_HEAD;
            double f, b, w, tpc;
            pt_plan_module_times(c, &lt, cl, &r, kind, N, rec, &f, &b, &w, &tpc);
            pp->f[g] += f, pp->b[g] += b, pp->w[g] += w, pp->tp[g] += tpc;
            if (pp->alone) pt_plan_module_times(c, &la, cl, &ra, kind, N, rec, &f, &b, &w, &tpc);
            pp->fa[g] += f, pp->ba[g] += b, pp->wa[g] += w;
            if (p > 1 && mid) pt_plan_module_times(c, &lt, cl, &rc, kind, N, rec, &f, &b, &w, &tpc);
            pp->fc[g] += f, pp->bc[g] += b, pp->wc[g] += w;
        }
        /* parameters this rank holds (its tp shard; the tied wte's copy on
         * the last stage is in st's count) */
        pp->stage_params[rank] += (double)st[g].params / l->tp;
    }
    pp->G = G, pp->p = p, pp->v = v, pp->m = l->microbatches;
    pp->stride = l->dp * l->tp, pp->dpn = cl->devices_per_node;
    double act = N * c->model.n_embd * r.el / (l->sequence_parallel ? l->tp : 1);
    pp->p2p_intra = act / pt_plan_link_bw(cl, &cl->intra_node) + cl->intra_node.latency;
    pp->p2p_inter = act / pt_plan_link_bw(cl, &cl->inter_node) + cl->inter_node.latency;
    tied_times(c, l, cl, r.el, r.bytes_s, pp);
    for (int g = 0; g < G; g++) {
        int rk = pp->rank_of[g];
        pp->tp_busy[rk] += l->microbatches * pp->tp[g];
        pp->last_bw[rk] += pp->b[g] + pp->w[g];
        pp->busy[rk] += l->microbatches * (pp->f[g] + pp->b[g] + pp->w[g]);
        pp->busy_lo[rk] += l->microbatches * (fmin(pp->f[g], fmin(pp->fa[g], pp->fc[g])) +
                                              fmin(pp->b[g], fmin(pp->ba[g], pp->bc[g])) +
                                              fmin(pp->w[g], fmin(pp->wa[g], pp->wc[g])));
    }
    for (int k = 0; k < p; k++)
        if (pp->busy[k] > pp->busy[pp->crit]) pp->crit = k;
    return PT_OK;
}

pt_status pt_plan_pipe_run(const pt_plan_layout *l, pt_plan_pipe *pp) {
    if (pp->p == 1) {
        pp->makespan = pp->makespan_nop2p = pp->busy[0];
        return PT_OK;
    }
    PT_CHECK(pt_plan_pipe_simulate(l, pp, 0, &pp->makespan_nop2p, NULL, NULL));
    PT_CHECK(pt_plan_pipe_simulate(l, pp, 1, &pp->makespan, NULL, NULL));
    return PT_OK;
}

pt_status pt_plan_pipe_run_fast(const pt_plan_layout *l, pt_plan_pipe *pp) {
    if (pp->p == 1) return pt_plan_pipe_run(l, pp);
    PT_CHECK(pt_plan_pipe_simulate(l, pp, 1, &pp->makespan, NULL, NULL));
    pp->makespan_nop2p = pp->makespan;
    return PT_OK;
}

pt_status pt_plan_pipe_predict(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                               pt_plan_pipe *pp) {
    PT_CHECK(pt_plan_pipe_times(c, l, cl, pp));
    return pt_plan_pipe_run(l, pp);
}

static double p2p_between(const pt_plan_pipe *pp, int ra, int rb) {
    if (ra == rb) return 0;
    return same_node(pp, ra, rb) ? pp->p2p_intra : pp->p2p_inter;
}

pt_status pt_plan_pipe_simulate(const pt_plan_layout *l, pt_plan_pipe *pp, int with_p2p,
                                double *makespan, pt_sched_slot **slots, int *nslots) {
    int p = pp->p, G = pp->G, total = 0;
    pt_status st = PT_OK;
    pt_schedule *built = NULL;
    const pt_schedule *lists = pp->lists;
    pt_sched_result out = {.busy = pp->busy};
    if (slots) *slots = NULL;
    if (!lists) {
        built = calloc((size_t)p, sizeof *built);
        if (!built) return pt_error_set(PT_ERR_NOMEM, "plan: %d pass lists", p);
        PT_CHECK_GOTO(st, pt_schedule_build_all(built, l->schedule, pp->m, p, pp->v), done);
        lists = built;
    }
    for (int r = 0; r < p; r++) total += lists[r].npass;
    if (slots && !(out.slots = malloc(sizeof *out.slots * (size_t)total))) {
        st = pt_error_set(PT_ERR_NOMEM, "plan: trace of %d passes", total);
        goto done;
    }
    /* transfers between virtual stages on two ranks, over their nodes' link */
    double hop[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    for (int g = 0; g + 1 < G; g++) hop[g] = p2p_between(pp, pp->rank_of[g], pp->rank_of[g + 1]);
    /* ranks that share devices, or a measured machine's cores: a pass's
     * time depends on how many of them compute (pt_sched_times) */
    int sh = pp->alone;
    pt_sched_times t = {pp->f,
                        pp->b,
                        pp->w,
                        sh ? pp->fa : NULL,
                        sh ? pp->ba : NULL,
                        sh ? pp->wa : NULL,
                        sh ? pp->fc : NULL,
                        sh ? pp->bc : NULL,
                        sh ? pp->wc : NULL,
                        pp->slow,
                        with_p2p ? hop : NULL,
                        with_p2p ? pp->tied_s : 0,
                        pp->tied_add,
                        NULL}; /* the updates: pt_plan_time_finish, per variant */
    PT_CHECK_GOTO(st, pt_sched_simulate(lists, &t, &out), done);
    *makespan = out.makespan;
    if (slots) {
        *slots = out.slots, *nslots = out.nslots;
        out.slots = NULL;
    }
done:
    for (int r = 0; built && r < p; r++) pt_schedule_free(&built[r]);
    free(built);
    free(out.slots);
    return st;
}

/* Parameters rank r updates (its tp shard): those it holds, less the tied
 * wte's copy on the head's rank, with the split's rows moved from the
 * embedding's rank to the head's, and their exchange's time in
 * parameter-updates' worth added by the caller (tied_x). */
static double updated(const pt_plan_pipe *pp, int r) {
    int G = pp->G, re = pp->rank_of[0], rh = pp->rank_of[G - 1];
    double u = pp->stage_params[r];
    if (r == rh && pp->first[G - 1] > 0) u -= pp->wte; /* stages.c counts the copy */
    if (pp->tied_split && r == re) u -= pp->wte_hi;
    if (pp->tied_split && r == rh) u += pp->wte_hi;
    return u;
}

void pt_plan_time_finish(const pt_config *c, const pt_plan_layout *l, const pt_cluster *cl,
                         const pt_plan_pipe *pp, pt_plan_time *out) {
    memset(out, 0, sizeof *out);
    int bf16 = pt_plan_bf16(c), dp = l->dp, k = pp->crit;
    double gb = bf16 ? 2 : 4; /* gradient bytes a parameter */
    int zg = l->zero > 0 && l->zero_group > 0 && l->zero_group < dp ? l->zero_group : dp;
    const pt_link *shard = pt_plan_group_link(cl, zg, l->tp),
                  *repl = pt_plan_group_link(cl, dp / zg, zg * l->tp);
    double params = pp->stage_params[k], whole = 0;
    for (int g = 0; l->zero == 3 && l->zero_whole[0] && g < pp->G; g++)
        for (int i = pp->first[g]; pp->rank_of[g] == k && i <= pp->last[g]; i++)
            if (kept_whole(l->zero_whole, i, c->model.n_layer))
                whole += module_params(&c->model, i, pp->first[g]) / l->tp;
    /* A measured machine whose cores the ranks' threads fill: its
     * collectives are copies on those same cores (shm), so none of them
     * hides behind compute. gpt2 under ZeRO-3 on 2 ranks of 2 cores: the
     * step's trace showed the gathers and reduce-scatters as gaps, waits
     * and slower passes (+140 ms), where "hidden" predicted 0. */
    const pt_profile *pr = cl->profile;
    int world = l->dp * l->tp * l->pp, cores = pr && pr->cores > 0 ? pr->cores : 0;
    int full = cores > 0 && world * pp->threads >= cores;
    double window = c->parallel.overlap && !full ? pp->last_bw[k] : 0,
           busy = full ? 0 : pp->busy[k];
    double dp_s = 0, slow = pp->slow;
    const int AR = PT_PROFILE_ALLREDUCE, AG = PT_PROFILE_ALLGATHER, RS = PT_PROFILE_REDUCE_SCATTER;
    if (dp > 1) {
        if (l->zero < 2) {
            /* ZeRO-1 all-reduces the gradients over the whole dp group as
             * plain dp does (pt_ddp's buckets; zero.c), then all-gathers the
             * updated shards inside the shard group */
            const pt_link *all = pt_plan_group_link(cl, dp, l->tp);
            double ar = pt_plan_coll_s(cl, slow, AR, dp, params * gb, all);
            dp_s = ar > window ? ar - window : 0;
            if (l->zero == 1) dp_s += pt_plan_coll_s(cl, slow, AG, zg, params * gb, shard);
        } else if (l->zero == 2) {
            /* Without a pipeline every micro-batch's backward reduce-scatters
             * the gradients (zero.c; per_step under a pipeline): the last's
             * beyond its backward, the others' beyond the micro-batch after
             * them. gpt2 at dp 2, m 2 on 2 cores: 28 reduce-scatters a
             * step in the trace, where one set was counted. */
            double rs = pt_plan_coll_s(cl, slow, RS, zg, params * gb, shard);
            double ag = pt_plan_coll_s(cl, slow, AG, zg, params * gb, shard);
            double m = l->pp > 1 ? 1 : l->microbatches;
            double mb = full || !c->parallel.overlap ? 0 : pp->busy[k] / m;
            dp_s = (m - 1) * (rs > mb ? rs - mb : 0) + (rs > window ? rs - window : 0) + ag;
        } else {
            double sh = params - whole, m = l->microbatches;
            double z3 = m * (2 * pt_plan_coll_s(cl, slow, AG, zg, sh * gb, shard) +
                             pt_plan_coll_s(cl, slow, RS, zg, sh * gb, shard));
            dp_s = z3 > busy ? z3 - busy : 0;
            /* and the main thread's own traffic per micro-batch (zero.c): a
             * unit's gradient buffer zeroed (4 bytes a parameter), its
             * shard copied in for each of the two gathers (8 / zg) and the
             * reduced slice added into the shard (12 / zg). On a measured
             * machine only: a GPU does these at HBM rates. gpt2 on 2 ranks:
             * 50 ms of gaps between the modules in the step's trace; this
             * says 33. */
            if (pr) dp_s += m * sh * (4 + 28.0 / zg) / pr->memory_bw;
            double ar = pt_plan_coll_s(cl, slow, AR, dp, whole * gb, shard);
            dp_s += ar > window ? ar - window : 0;
        }
        if (l->zero >= 2 && zg < dp) /* HSDP: the shard across the replicas */
            dp_s += pt_plan_coll_s(cl, slow, AR, dp / zg, (params - whole) / zg * gb, repl);
    }
    int adam = strcmp(c->train.optimizer, "sgd") != 0;
    double rate = pr ? (adam ? pr->adamw_s : pr->sgd_s) : 0, per;
    double bw = pr ? pr->memory_bw : 0;
    double bytes = adam ? 28.0 : 12.0; /* read p, g and the state, write p and the state */
    if (rate > 0) {
        /* The measured rate over the threads, but no faster than the
         * update's memory traffic (28 or 12 bytes a parameter) at the
         * bandwidth one thread reached (calibrate times both on buffers
         * larger than the caches) times the rank's threads, plus a pass
         * that reads the gradients for their norm unless the runtime fuses
         * the two (no tp, pp or ZeRO, no clipping: trainer_step.c). gpt2's
         * step, a parameter: one thread 0.80 ns (this says 0.69), 2 ranks
         * of 1 thread each 0.81 (0.69), one rank of 2 threads 0.40-0.52
         * (0.35); the machine's aggregate bound (2 ranks together moved no
         * more than one rank of 2 threads) is left out. */
        int fused = l->tp == 1 && l->pp == 1 && l->zero == 0 && !(c->train.grad_clip > 0);
        double tbw = bw * pp->threads;
        per = fmax(rate / pp->threads, bytes / tbw) + (fused ? 0 : sizeof(float) / tbw);
    } else {
        per = bytes / (cl->device.memory_bw * cl->efficiency.elementwise);
    }
    /* and the gradients' reset at the step's start, a memset of every
     * gradient the rank holds, on one thread (4 bytes written; gpt2's 124
     * M: 16-24 ms between a step's update and the next step's forward) */
    double upd[PT_PLAN_MAX_STAGES];
    for (int r = 0; r < pp->p; r++) {
        double held = pp->stage_params[r];
        double reset = pr ? held * sizeof(float) / bw : 0;
        upd[r] = (updated(pp, r) / (l->zero > 0 ? zg : 1) * per + reset) * pp->slow;
        if (pp->tied_split && (r == pp->rank_of[0] || r == pp->rank_of[pp->G - 1]))
            upd[r] += pp->tied_x;
    }
    /* every rank's update after the passes (the norm's all-reduce joins
     * them): the step waits for the longest, the simulator's rule */
    out->optim_s = pt_sched_step_end(0, upd, pp->p);
    out->comm_s[PT_MESH_TP] = pp->tp_busy[k];
    out->comm_s[PT_MESH_DP] = dp_s;
    out->comm_s[PT_MESH_PP] = pp->makespan - pp->makespan_nop2p;
    out->compute_s = pp->busy[k] - pp->tp_busy[k];
    out->bubble_s = pp->makespan_nop2p - pp->busy[k];
    out->step_s = pp->makespan + dp_s + out->optim_s;
    double mean = 0;
    for (int r = 0; r < pp->p; r++) mean += pp->busy[r] / pp->p;
    out->bubble = pp->makespan > 0 ? 1 - mean / pp->makespan : 0;
    double tokens = (double)c->train.batch_size * c->model.seq_len;
    out->tokens_per_s = tokens / out->step_s;
    double peak = bf16 ? cl->device.peak_flops_bf16 : cl->device.peak_flops_fp32;
    /* a measured machine's device is one core; a rank uses threads of them */
    double ranks_peak = cl->profile ? (double)(world < cluster_devices(cl) ? world * pp->threads
                                                                           : cluster_devices(cl))
                                    : world;
    out->mfu = pt_plan_model_flops(c) / (ranks_peak * peak * out->step_s);
}

pt_status pt_plan_time_predict(const pt_config *model, const pt_plan_layout *l,
                               const pt_cluster *cl, pt_plan_time *out) {
    memset(out, 0, sizeof *out);
    pt_plan_pipe *pp = malloc(sizeof *pp);
    if (!pp) return pt_error_set(PT_ERR_NOMEM, "plan: time model");
    pt_status st = pt_plan_pipe_predict(model, l, cl, pp);
    if (st == PT_OK) pt_plan_time_finish(model, l, cl, pp, out);
    free(pp);
    return st;
}
