/* The memory model: per-rank peak bytes of each PT_MEM_* category during a
 * training step, for a layout of a config, without building the model.
 *
 *   fp32 (train.precision = fp32, partrain's CPU runtime): the runtime's
 *        own allocations, counted from the same size functions its
 *        constructors use (pt_model_buffer_bytes, pt_model_slot_bytes_at,
 *        pt_module_scratch_bytes, pt_comm_scratch_bytes, pt_comm_shard,
 *        pt_schedule_bytes) on a table-only model of each stage's slice:
 *        every buffer is allocated up front, so the peak of a step is what
 *        the trainer holds when it starts (docs/plan.md lists the terms);
 *   bf16 (planning a GPU run): the ZeRO paper's 2 + 2 + 12 bytes a
 *        parameter split by stage (Rajbhandari et al. 2020, Fig. 1) and
 *        Korthikanti et al. 2022's activations per layer (Table 2), times
 *        the micro-batches the schedule holds.
 *
 * The search's calls go through a pt_plan_memory_cache (plan_memory_impl.h)
 * that keeps what layouts share: stage cuts, pass list counts, tables
 * (memory_stage.c builds a stage).
 *
 * Not here: whether it fits (memory_fit.c, the search), time. */
#include "partrain/plan.h"

#include "partrain/comm.h"
#include "partrain/optim.h"
#include "partrain/parallel.h"

#include "plan_memory_impl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The GPU regime's stated headroom (docs/plan.md, "slack"): the CUDA
 * context, cuBLAS workspaces, NCCL's buffers and the caching allocator's
 * fragmentation. */
#define GPU_SLACK_BYTES (2.0 * 1073741824.0)

static pt_recompute recompute_of(int rc) {
    return rc == 2 ? PT_RECOMPUTE_FULL : rc == 1 ? PT_RECOMPUTE_SELECTIVE : PT_RECOMPUTE_NONE;
}

/* ---- fp32: the runtime's allocations ---- */

/* parallel.zero_whole ("embedding,head,h.0") as one flag per module
 * (L + 2, malloc'd; NULL when the list is empty or out of memory: *st
 * says which), parsed once a layout rather than once a module and rank. */
static unsigned char *whole_flags(const char *whole, int L, pt_status *st) {
    *st = PT_OK;
    if (!whole[0]) return NULL;
    unsigned char *f = calloc((size_t)L + 2, 1);
    if (!f) {
        *st = pt_error_set(PT_ERR_NOMEM, "plan: parallel.zero_whole");
        return NULL;
    }
    for (const char *p = whole; *p;) {
        const char *comma = strchr(p, ',');
        size_t k = comma ? (size_t)(comma - p) : strlen(p);
        char name[16];
        if (k == 9 && !strncmp(p, "embedding", 9)) f[0] = 1;
        if (k == 4 && !strncmp(p, "head", 4)) f[L + 1] = 1;
        if (k > 2 && k < sizeof name && !strncmp(p, "h.", 2)) {
            /* "h.N" exactly as the runtime spells block N (no sign, no 0s ahead) */
            long b = strtol(p + 2, NULL, 10);
            if (b >= 0 && b < L && snprintf(name, sizeof name, "h.%ld", b) == (int)k &&
                !strncmp(p, name, k))
                f[b + 1] = 1;
        }
        p += k + (comma ? 1 : 0);
    }
    return f;
}

/* The communicators a rank holds (each with its generic-collective piece,
 * pt_comm_scratch_bytes): the world, the mesh's groups of more than one
 * rank (tp, dp, pp, and mp = tp x pp), the trainer's auxiliary copy of the
 * world, ZeRO's shard group (and the cross-group one under HSDP), and a
 * pipeline's act/grad groups per chunk plus the tied wte's. */
static int communicators(const pt_config *c, const stage_info *s, int zero_on, int g) {
    int dp = c->parallel.dp, tp = c->parallel.tp, pp = c->parallel.pp;
    if (dp * tp * pp == 1) return 0;
    int n = 1 + 1; /* world, aux */
    n += (tp > 1) + (dp > 1) + (pp > 1) + (tp * pp > 1);
    if (zero_on) n += 1 + (g < dp);
    /* the pipeline's by message kind and chunk; the tied wte's on the two
     * stages it joins (tied.c) */
    if (pp > 1) n += 2 * pt_config_virtual_stages(c) + s->tied_peer;
    return n;
}

static double max2(double a, double b) {
    return a > b ? a : b;
}

/* The shm backend's single-copy scratch, allocated on a group's first
 * large collective (pt_comm_lazy_bytes): per group, its largest
 * collectives of a step. */
static double lazy_comm(const pt_config *c, const stage_info *s, int zero, int g) {
    const pt_model *m = s->m;
    int dp = c->parallel.dp, tp = c->parallel.tp, L = s->L;
    double total = 0;
    size_t n = pt_model_num_params(m), f = sizeof(float);
    size_t biggest = 0; /* the largest module region */
    for (int i = 0; i < L + 2; i++) {
        size_t off, cnt;
        pt_model_module_region(m, i, &off, &cnt);
        if (cnt > biggest) biggest = cnt;
    }
    if (dp > 1) {
        /* ddp.c's buckets: full ones of bucket_mb, cut from the top, the
         * open one closed at the embedding's boundary */
        double d = 0;
        if (!strcmp(c->parallel.sync, "local_sgd")) {
            d = (double)pt_comm_lazy_bytes(NULL, dp, PT_OP_ALLREDUCE, n * f);
        } else if (zero < 2) {
            size_t cap = (size_t)(c->parallel.bucket_mb * 1048576.0) / f, off, emb;
            if (cap < 1) cap = 1;
            pt_model_module_region(m, 0, &off, &emb);
            size_t above = n - emb, most = above >= cap || emb >= cap ? cap
                                           : above > emb              ? above
                                                                      : emb;
            d = (double)pt_comm_lazy_bytes(NULL, dp, PT_OP_ALLREDUCE, most * f);
        }
        total += d;
    }
    if (zero > 0) {
        /* the shard group: each module's parameters all-gathered (after the
         * update; ZeRO-3 before each pass), its gradients reduce-scattered
         * (stage >= 2); across groups (HSDP) the shards all-reduced */
        double z = (double)pt_comm_lazy_bytes(NULL, g, PT_OP_ALLGATHER, biggest * f);
        if (zero >= 2)
            z = max2(z, (double)pt_comm_lazy_bytes(NULL, g, PT_OP_REDUCE_SCATTER, biggest * f));
        total += z;
        if (g < dp && zero >= 2) {
            size_t so, sn;
            pt_comm_shard(biggest, g, 0, &so, &sn);
            total += (double)pt_comm_lazy_bytes(NULL, dp / g, PT_OP_ALLREDUCE, sn * f);
        }
    }
    if (tp > 1) {
        /* the blocks' collectives on the residual stream (N, C) */
        size_t nc = (size_t)(c->train.batch_size / dp / c->parallel.microbatches) *
                    (size_t)c->model.seq_len * (size_t)c->model.n_embd * f;
        total += c->parallel.sequence_parallel
                     ? max2((double)pt_comm_lazy_bytes(NULL, tp, PT_OP_REDUCE_SCATTER, nc),
                            (double)pt_comm_lazy_bytes(NULL, tp, PT_OP_ALLGATHER, nc))
                     : (double)pt_comm_lazy_bytes(NULL, tp, PT_OP_ALLREDUCE, nc);
    }
    return total;
}

/* The tied wte (tied.c, tied_split.c): without data parallelism the two
 * stages split its update by rows, each receiving the other's part of its
 * rows' gradient, the head's stage with an optimizer of its own over its
 * rows; else the embedding's receives the head's whole gradient. */
static void tied_wte(const pt_config *c, const stage_info *s, int nstate, double tied,
                     double *cat) {
    int dp = c->parallel.dp;
    size_t C = (size_t)c->model.n_embd;
    size_t nw = s->emb_here ? pt_model_tensor(s->m, 0)->numel : (size_t)(tied / sizeof(float));
    size_t lo = pt_tied_split_rows((int)(nw / C)) * C;
    if (dp > 1)
        cat[PT_MEM_COMM] += s->emb_here ? (double)nw * sizeof(float) : 0;
    else
        cat[PT_MEM_COMM] += (double)(s->emb_here ? lo : nw - lo) * sizeof(float);
    if (dp == 1 && !s->emb_here) cat[PT_MEM_OPTIM] += (double)nstate * (nw - lo) * sizeof(float);
}

/* Rank (stage s, shard rank 0 of g: the largest) of an fp32 run into cat[];
 * whole: parallel.zero_whole's flag per module (NULL: none). */
static void cpu_rank(const pt_config *c, const stage_info *s, const unsigned char *whole, int g,
                     double *cat) {
    const pt_model *m = s->m;
    int L = s->L, dp = c->parallel.dp, M = c->parallel.microbatches;
    int mB = c->train.batch_size / dp / M;
    size_t T = (size_t)c->model.seq_len;
    size_t n = pt_model_num_params(m);
    double flat = (double)(n ? n : 1) * sizeof(float);
    double tied = (double)pt_model_buffer_bytes(m, 0, PT_MEM_PARAMS) - flat;
    for (int k = 0; k < PT_MEM_NCAT; k++) cat[k] = 0;

    /* activations: the model's own buffers, the trainer's global batch of
     * tokens (inputs and targets), and the micro-batches in flight */
    cat[PT_MEM_ACTS] = (double)pt_model_buffer_bytes(m, mB, PT_MEM_ACTS) +
                       2.0 * c->train.batch_size * (double)T * sizeof(int);
    /* the executor's blocks (pipeline/runtime.c), at pp = 1 too: in_flight
     * blocks, each the largest chunk's slot and its gradients in and
     * out, or each chunk's own (as many as it holds at once, its own
     * size) where that is less; a split backward adds sets of deferred
     * scratch, as many as the list has W's pending at once */
    size_t fl[PT_SCHEDULE_MAX_VIRTUAL];
    for (int ch = 0; ch < s->sched.virtual_stages; ch++)
        fl[ch] = pt_pipeline_block_floats(m, s->first[ch], s->last[ch], mB);
    cat[PT_MEM_ACTS] += (double)pt_schedule_blocks(s->sched.virtual_stages, s->sched.in_flight,
                                                   s->sched.chunk_in_flight, fl, NULL, NULL) *
                        sizeof(float);
    if (s->sched.split) /* sets of one scratch per module of a chunk, each sized for
                         * the kinds of module j of the chunks */
        for (int j = 0; j < s->most_modules; j++) {
            unsigned kinds = 0;
            for (int ch = 0; ch < s->sched.virtual_stages; ch++) {
                int i = s->first[ch] + j;
                if (i <= s->last[ch])
                    kinds |= 1u << (i == 0       ? PT_MODULE_EMBEDDING
                                    : i == L + 1 ? PT_MODULE_HEAD
                                                 : PT_MODULE_BLOCK);
            }
            cat[PT_MEM_ACTS] +=
                (double)s->sched.pending_w * (double)pt_module_scratch_bytes(m, mB, kinds);
        }

    pt_adamw_hparams hp = {0};
    hp.kind = !strcmp(c->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    hp.momentum = (float)c->train.momentum;
    int nstate = pt_optim_state_count(&hp);
    int zero = dp > 1 ? c->parallel.zero : 0;
    int sync = !strcmp(c->parallel.sync, "sync"), local = !strcmp(c->parallel.sync, "local_sgd");

    cat[PT_MEM_PARAMS] = flat + tied;
    cat[PT_MEM_GRADS] = flat + tied;
    if (!zero) {
        cat[PT_MEM_OPTIM] = (double)nstate * (double)n * sizeof(float);
    } else {
        /* zero.c: per module, this rank's slice of its region */
        double shard = 0, emb = 0, blk = 0, head = 0;
        /* ZeRO-3 with parallel.zero_whole: a whole module's parameters are
         * resident (its slice a view into them) and need no pool buffer */
        double pshard = 0, pemb = 0, phead = 0;
        int nown = 0, ngathered = 0;
        for (int i = 0; i < L + 2; i++) {
            size_t off, cnt, so, sn;
            pt_model_module_region(m, i, &off, &cnt);
            pt_comm_shard(cnt, g, 0, &so, &sn);
            shard += (double)sn * sizeof(float);
            double b = (double)cnt * sizeof(float);
            int w = zero >= 3 && cnt && whole && whole[s->glob ? s->glob[i] : i];
            pshard += w ? b : (double)sn * sizeof(float);
            if (i == 0) {
                emb = b;
                pemb = w ? 0 : b;
            } else if (i == L + 1) {
                head = b;
                phead = w ? 0 : b;
            } else if (cnt) {
                blk = b;
                nown++;
                ngathered += !w;
            }
        }
        cat[PT_MEM_OPTIM] = nstate * shard;
        if (zero >= 2) {
            /* unit buffers for the most the schedule holds at once: every
             * block under a pipeline or a split backward, else two */
            int per_step = c->parallel.pp > 1 || s->sched.split;
            int nblk = per_step ? nown : nown < 2 ? nown : 2;
            cat[PT_MEM_GRADS] = tied + shard + emb + nblk * blk + head;
            int pblk = per_step || c->parallel.zero_keep_params ? ngathered
                       : ngathered < 2                          ? ngathered
                                                                : 2;
            if (zero >= 3) cat[PT_MEM_PARAMS] = tied + pshard + pemb + pblk * blk + phead;
        }
    }
    int gsz = c->parallel.zero_group > 0 ? c->parallel.zero_group : dp;
    cat[PT_MEM_COMM] = (double)communicators(c, s, zero > 0, gsz) * (double)pt_comm_scratch_bytes();
    if (dp > 1 && zero < 2 && !sync && !local) {
        /* stale: a gradient copy per round in flight, and dga's local ones */
        int nslots = c->parallel.staleness + 1;
        cat[PT_MEM_COMM] += (double)nslots * (double)n * sizeof(float);
        if (!strcmp(c->parallel.stale_mode, "dga"))
            cat[PT_MEM_COMM] += (double)nslots * (double)n * sizeof(float);
    }
    if (dp > 1 && local && !strcmp(c->parallel.outer, "nesterov"))
        cat[PT_MEM_OPTIM] += 2.0 * (double)n * sizeof(float);
    cat[PT_MEM_COMM] += lazy_comm(c, s, zero, gsz);
    if (s->tied_peer) tied_wte(c, s, nstate, tied, cat);
    /* the pass list */
    cat[PT_MEM_SCRATCH] = (double)s->sched.bytes;
}

/* ---- bf16: the published formulas ---- */

/* Korthikanti et al. 2022, Table 2: bytes of one transformer layer's
 * activations for one micro-batch of b sequences (fp16/bf16 tensors, the
 * dropout masks one byte). */
static double layer_acts_bf16(double s, double b, double h, double a, double t, int sp,
                              int recompute) {
    if (recompute == PT_RECOMPUTE_FULL) return 2.0 * s * b * h / (sp ? t : 1); /* the input */
    double attn = 5.0 * a * s / (h * t);                                       /* softmax, mask */
    if (recompute == PT_RECOMPUTE_SELECTIVE) attn = 0;
    if (sp) return s * b * h * (34.0 / t + attn);
    if (t == 1) return s * b * h * (34.0 + attn);
    return s * b * h * (10.0 + 24.0 / t + attn);
}

/* The recompute mode of pipeline rank r: model.stage_recompute's r-th
 * entry when given, else the layout's. */
static int stage_recompute(const pt_plan_layout *l, int r) {
    const char *p = l->stage_recompute;
    for (int k = 0; *p && k < r; k++) {
        p = strchr(p, ',');
        if (!p) return l->recompute;
        p++;
    }
    if (!*p) return l->recompute;
    return !strncmp(p, "full", 4)        ? 2
           : !strncmp(p, "selective", 9) ? 1
           : !strncmp(p, "none", 4)      ? 0
                                         : l->recompute;
}

static void gpu_rank(const pt_config *c, const unsigned char *whole_of, const stage_info *s, int rc,
                     double *cat) {
    const model_sum *u = s->u;
    int L = s->L, dp = c->parallel.dp, M = c->parallel.microbatches;
    double b = (double)c->train.batch_size / dp / M, S = c->model.seq_len;
    double h = c->model.n_embd, a = c->model.n_head, t = c->parallel.tp;
    double V = c->model.vocab_size;
    int sp = c->parallel.sequence_parallel;
    for (int k = 0; k < PT_MEM_NCAT; k++) cat[k] = 0;
    /* Psi: this rank's model-parallel shard (the head stage's copy of the
     * tied wte included); modules named in zero_whole stay whole */
    int zero = dp > 1 ? c->parallel.zero : 0;
    double Nd = c->parallel.zero_group > 0 ? c->parallel.zero_group : dp;
    double psi = (double)u->params_bytes / sizeof(float);
    size_t n = u->n;
    psi -= n ? 0 : 1; /* the flat buffer of an empty stage is one float */
    double whole = 0;
    for (int i = 0; zero >= 3 && i < L + 2; i++) {
        size_t cnt = u->cnt[i];
        if (whole_of && whole_of[s->glob ? s->glob[i] : i]) whole += (double)cnt;
    }
    double sharded = psi - whole;
    /* K: the fp32 master copy and the optimizer's states (Adam m, v: 12) */
    pt_adamw_hparams hp = {0};
    hp.kind = !strcmp(c->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    hp.momentum = (float)c->train.momentum;
    double K = 4.0 + 4.0 * pt_optim_state_count(&hp);
    cat[PT_MEM_PARAMS] = 2 * (zero >= 3 ? whole + sharded / Nd : psi);
    cat[PT_MEM_GRADS] = 2 * (zero >= 2 ? psi / Nd : psi);
    cat[PT_MEM_OPTIM] = K * (zero >= 1 ? psi / Nd : psi);
    /* ZeRO-3's gathered units: the one running and the one prefetched */
    if (zero >= 3) {
        double blk = 0;
        for (int i = 1; i <= L; i++) {
            size_t cnt = u->cnt[i];
            if ((double)cnt > blk) blk = (double)cnt;
        }
        cat[PT_MEM_COMM] = 2 * 2 * blk;
    }
    /* activations: the trainer's blocks of layers (the micro-batches in
     * flight times the largest chunk's, or each chunk's own where less),
     * the head's fp32 logits for the loss, and under full recomputation one
     * layer's whole activations while its backward runs */
    double layer = layer_acts_bf16(S, b, h, a, t, sp, rc);
    size_t nb[PT_SCHEDULE_MAX_VIRTUAL];
    for (int ch = 0; ch < s->sched.virtual_stages; ch++) nb[ch] = (size_t)s->blocks[ch];
    cat[PT_MEM_ACTS] = (double)pt_schedule_blocks(s->sched.virtual_stages, s->sched.in_flight,
                                                  s->sched.chunk_in_flight, nb, NULL, NULL) *
                       layer;
    if (rc == PT_RECOMPUTE_FULL) cat[PT_MEM_ACTS] += layer_acts_bf16(S, b, h, a, t, sp, 0);
    if (s->head_here) {
        int k = c->parallel.pp > 1 ? s->sched.chunk_in_flight[s->head_chunk] : 1;
        cat[PT_MEM_ACTS] += k * 4.0 * S * b * V / t;
    }
}

/* A checkpoint save's scratch (trainer_ckpt.c, ckpt_plan.c): a
 * synchronous save writes every rank's slices from its own buffers and
 * allocates nothing counted; an asynchronous one (checkpoint.async)
 * stages the rank's write share: of the sets of the group's one state (the
 * parameters and the rule's moments, stale's rounds in flight, the outer
 * step's anchor and momentum) its 1/dp part, and the sets that are its dp
 * index's own (local SGD's and dga's parameters and moments, dga's local
 * gradients) whole: n floats a set, n its stage's tp slice (tensors every
 * tp rank holds whole are split over tp too: this counts them whole). */
static void save_scratch(const pt_config *c, const double *n, pt_plan_mem *out) {
    int p = c->parallel.pp, dp = c->parallel.dp, k = c->parallel.staleness;
    pt_adamw_hparams hp = {0};
    hp.kind = !strcmp(c->train.optimizer, "sgd") ? PT_OPTIM_SGD : PT_OPTIM_ADAMW;
    hp.momentum = (float)c->train.momentum;
    double model = 1 + pt_optim_state_count(&hp), shared = model, own = 0, need = 0;
    int stale = dp > 1 && !strcmp(c->parallel.sync, "stale");
    int dga = stale && !strcmp(c->parallel.stale_mode, "dga");
    if (dp > 1 && !strcmp(c->parallel.sync, "local_sgd")) {
        shared = !strcmp(c->parallel.outer, "nesterov") ? 2 : 0;
        own = model;
    } else if (dga) {
        shared = k;
        own = model + k;
    } else if (stale) {
        shared = model + k;
    }
    for (int r = 0; r < p; r++) {
        out->stage[r].save = c->checkpoint.async ? n[r] * (shared / dp + own) * sizeof(float) : 0;
        if (out->stage[r].total + out->stage[r].save > need)
            need = out->stage[r].total + out->stage[r].save;
    }
    out->max.save = need - out->max.total;
}

pt_status pt_plan_memory(const pt_config *model, const pt_plan_layout *l, const pt_cluster *cl,
                         pt_plan_mem *out) {
    return pt_plan_memory_cached(NULL, model, l, cl, out);
}

pt_status pt_plan_memory_cached(pt_plan_memory_cache *k, const pt_config *model,
                                const pt_plan_layout *l, const pt_cluster *cl, pt_plan_mem *out) {
    memset(out, 0, sizeof *out);
    pt_config c = *model;
    pt_plan_layout_apply(l, &c);
    PT_CHECK(pt_config_validate_layout(&c));
    int p = c.parallel.pp;
    if (p > PT_PLAN_MAX_STAGES)
        return pt_error_set(PT_ERR_UNSUPPORTED, "plan: parallel.pp = %d (at most %d stages)", p,
                            PT_PLAN_MAX_STAGES);
    int gpu = !strcmp(c.train.precision, "bf16");
    if (gpu && cl && !(cl->device.peak_flops_bf16 > 0))
        return pt_error_set(PT_ERR_INVALID,
                            "train.precision = bf16: the cluster's device.peak_flops.bf16 is 0 "
                            "(the device has no bf16)");
    pt_plan_memory_cache_model(k, &c.model);
    pt_stage cutbuf[PT_PLAN_MAX_STAGES * PT_SCHEDULE_MAX_VIRTUAL];
    const pt_stage *cut = cutbuf;
    if (p > 1) PT_CHECK(pt_plan_stage_cut(k, &c, cutbuf, &cut));
    sched_sum sumbuf[PT_PLAN_MAX_STAGES];
    const sched_sum *sums;
    PT_CHECK(pt_plan_stage_scheds(k, &c, sumbuf, &sums));
    double slack = gpu ? GPU_SLACK_BYTES : 0;
    int dp = c.parallel.dp;
    int g = c.parallel.zero_group > 0 ? c.parallel.zero_group : dp;
    out->n_stage = p;
    double zs[PT_PLAN_MAX_STAGES]; /* each stage's slice, floats (its tp rank 0's) */
    pt_status err;
    unsigned char *whole = whole_flags(l->zero_whole, c.model.n_layer, &err);
    for (int r = 0; r < p && err == PT_OK; r++) {
        int rc = stage_recompute(l, r);
        stage_info s;
        err = pt_plan_stage_new(&s, &c, cut, r, recompute_of(rc), &sums[r], gpu, k);
        if (err != PT_OK) break;
        if (!gpu) zs[r] = (double)pt_model_num_params(s.m);
        pt_plan_mem_rank *st = &out->stage[r];
        st->slack = slack;
        /* the shard ranks differ by a float or so: pt_comm_shard gives the
         * first (count % g) ranks one more, so shard rank 0 holds the most
         * of every module and its figures are the stage's largest in every
         * category (what every rank's, evaluated one by one, gave) */
        double cat[PT_MEM_NCAT];
        if (gpu)
            gpu_rank(&c, whole, &s, rc, cat);
        else
            cpu_rank(&c, &s, whole, g, cat);
        double sum = slack;
        for (int k = 0; k < PT_MEM_NCAT; k++) {
            st->cat[k] = cat[k];
            sum += cat[k];
        }
        st->total = sum;
        pt_plan_stage_free(&s);
        for (int k = 0; k < PT_MEM_NCAT; k++)
            if (st->cat[k] > out->max.cat[k]) out->max.cat[k] = st->cat[k];
        if (st->total > out->max.total) out->max.total = st->total;
    }
    free(whole);
    PT_CHECK(err);
    out->max.slack = slack;
    if (!gpu) save_scratch(&c, zs, out);
    return PT_OK;
}
