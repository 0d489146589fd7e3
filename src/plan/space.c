/* The planner's layout space (plan_space_impl.h): every layout family of
 * `world` ranks under the keys a caller fixes, the validity of each one's
 * ZeRO variants, and, when nothing is valid, the one reason to give.
 *
 * A family is (dp, tp, pp, sp, micro-batches, schedule, virtual stages,
 * recompute): dp x tp x pp = world (tp dividing the heads, pp at most the
 * modules and PT_PLAN_MAX_STAGES), sequence parallelism at tp > 1, every
 * schedule at pp > 1 (gpipe, 1f1b, interleaved with 2..8 chunks, zb1,
 * zbv; none at pp 1) that pt_schedule_check accepts, micro-batches
 * dividing the rank's share of the batch, the three recompute modes. Its
 * ZeRO variants (0-3 at dp > 1, over the whole dp group or a dividing
 * HSDP group) are each validated by the config validator with the layout
 * written in (pt_config_validate_layout for bf16 plans, pt_config_validate,
 * the runtime's own limits included, for fp32 ones).
 *
 * A fixed key constrains the space; it never ends the walk. A fixed
 * parallel.stage_layers of n entries admits pp = n for the schedules of
 * one chunk a rank and pp x v = n for interleaved and zbv, as the
 * runtime cuts (pt_stage_split_for: p x v virtual stages); the cut itself
 * is checked once against the model. A candidate that fails a check is
 * dropped with its reason and counted. With no candidate left, the error
 * names the fixed keys' own contradiction when they have one (checked
 * before the walk: parallel.dp = 2 on 3 ranks), else the reason that
 * dropped the most candidates, and of the fixed keys only those the
 * reason names.
 *
 * Not here: what a layout costs (memory.c, time.c), the ranking (search.c). */
#include "plan_space_impl.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "partrain/parallel.h"

/* The keys a caller may fix, in PT_FIX_* order, and where their value
 * lives (kind: 'i' int, 'b' bool, 's' string) for the error line. */
static const struct {
    const char *name;
    size_t off;
    char kind;
} fixed_keys[PT_FIX_N] = {
    {"parallel.dp", offsetof(pt_config, parallel.dp), 'i'},
    {"parallel.tp", offsetof(pt_config, parallel.tp), 'i'},
    {"parallel.pp", offsetof(pt_config, parallel.pp), 'i'},
    {"parallel.zero", offsetof(pt_config, parallel.zero), 'i'},
    {"parallel.zero_group", offsetof(pt_config, parallel.zero_group), 'i'},
    {"parallel.sequence_parallel", offsetof(pt_config, parallel.sequence_parallel), 'b'},
    {"parallel.schedule", offsetof(pt_config, parallel.schedule), 's'},
    {"parallel.microbatches", offsetof(pt_config, parallel.microbatches), 'i'},
    {"parallel.virtual_stages", offsetof(pt_config, parallel.virtual_stages), 'i'},
    {"model.recompute", offsetof(pt_config, train.recompute), 's'},
    {"model.stage_recompute", offsetof(pt_config, train.stage_recompute), 's'},
    {"parallel.zero_whole", offsetof(pt_config, parallel.zero_whole), 's'},
    {"parallel.stage_layers", offsetof(pt_config, parallel.stage_layers), 's'},
    {"train.threads", offsetof(pt_config, train.threads), 'i'},
};

/* Whether the walk takes schedule d at pp: a pipeline's at pp > 1, the
 * one that runs none (none) at pp 1; and, parallel.schedule fixed, the
 * one it names (at pp > 1 what it runs as a pipeline: none is 1f1b). */
static int takes(const pt_plan_space *sp, int pp, const pt_sched *d) {
    if (d->pipeline != (pp > 1)) return 0;
    if (!sp->fix[PT_FIX_SCHED]) return 1;
    const char *want = sp->base->parallel.schedule;
    const pt_sched *w = pt_sched_find(want);
    if (w && pp > 1) want = w->as_pipeline;
    return !strcmp(want, d->name);
}

/* The fixed parallel.schedule cannot run at pp 1 (the planner runs none
 * there). */
static int fixed_needs_pipeline(const pt_plan_space *sp) {
    const pt_sched *d = pt_sched_find(sp->base->parallel.schedule);
    return sp->fix[PT_FIX_SCHED] && !(d && takes(sp, 1, d));
}

static int recompute_mode(const char *s) {
    return !strcmp(s, "full")        ? PT_RECOMPUTE_FULL
           : !strcmp(s, "selective") ? PT_RECOMPUTE_SELECTIVE
                                     : PT_RECOMPUTE_NONE;
}

void pt_plan_space_init(pt_plan_space *sp, const pt_config *base, pt_config *scratch,
                        const char *const *fixed, int n_fixed, int world) {
    memset(sp, 0, sizeof *sp);
    sp->base = base, sp->scratch = scratch, sp->world = world;
    for (int i = 0; i < n_fixed; i++)
        for (int f = 0; f < PT_FIX_N; f++)
            if (!strcmp(fixed[i], fixed_keys[f].name)) sp->fix[f] = 1;
    const char *cut = base->parallel.stage_layers;
    if (sp->fix[PT_FIX_LAYERS] && cut[0]) {
        sp->n_cut = 1;
        for (const char *p = cut; *p; p++) sp->n_cut += *p == ',';
    }
}

/* ---- the reasons ---- */

/* A reason's kind: its text with every run of digits as one '#' (so that
 * "parallel.tp (3)" and "parallel.tp (6)" count together). */
static uint64_t reason_key(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch >= '0' && ch <= '9') {
            while (s[1] >= '0' && s[1] <= '9') s++;
            ch = '#';
        }
        h = (h ^ ch) * 1099511628211ull;
    }
    return h;
}

void pt_plan_space_drop(pt_plan_space *sp, const char *reason) {
    uint64_t k = reason_key(reason);
    sp->n_dropped++;
    for (int i = 0; i < sp->n_why; i++)
        if (sp->why[i].key == k) {
            sp->why[i].n++;
            return;
        }
    if (sp->n_why == PT_PLAN_WHY) return;
    sp->why[sp->n_why].key = k, sp->why[sp->n_why].n = 1;
    snprintf(sp->why[sp->n_why].text, sizeof sp->why[0].text, "%s", reason);
    sp->n_why++;
}

static void dropf(pt_plan_space *sp, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pt_plan_space_drop(sp, buf);
}

/* Whether the dotted key `name` appears in s as a whole name. */
static int names_key(const char *s, const char *name) {
    size_t n = strlen(name);
    for (const char *p = strstr(s, name); p; p = strstr(p + 1, name)) {
        char before = p > s ? p[-1] : ' ', after = p[n];
        int word = (after < 'a' || after > 'z') && after != '_' && after != '.' &&
                   ((before < 'a' || before > 'z') && before != '_' && before != '.');
        if (word) return 1;
    }
    return 0;
}

/* "parallel.tp=3, parallel.pp=2": the fixed keys that `reason` names. */
static void fixed_list(const pt_plan_space *sp, const char *reason, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int f = 0; f < PT_FIX_N && k < n; f++) {
        if (!sp->fix[f] || !names_key(reason, fixed_keys[f].name)) continue;
        const char *at = (const char *)sp->base + fixed_keys[f].off;
        char v[160];
        if (fixed_keys[f].kind == 's')
            snprintf(v, sizeof v, "%s", at);
        else if (fixed_keys[f].kind == 'b')
            snprintf(v, sizeof v, "%s", *(const int *)at ? "true" : "false");
        else
            snprintf(v, sizeof v, "%d", *(const int *)at);
        k += (size_t)snprintf(buf + k, n - k, "%s%s=%s", k ? ", " : "", fixed_keys[f].name, v);
    }
}

/* ---- the fixed keys among themselves ---- */

/* Whether the fixed cut (n_cut entries) can be pp's: pp x v = n_cut for a
 * schedule that the fixed keys leave (v 1 but for interleaved, 2..8, and
 * zbv, 2). */
static int cut_fits_pp(const pt_plan_space *sp, int pp) {
    const pt_config *c = sp->base;
    if (!sp->n_cut) return 1;
    if (pp < 2 || sp->n_cut % pp) return 0;
    int v = sp->n_cut / pp;
    const pt_sched *d;
    for (int i = 0; (d = pt_sched_at(i)); i++) {
        if (!takes(sp, pp, d)) continue;
        if (sp->fix[PT_FIX_V] && c->parallel.virtual_stages > 0 && v != c->parallel.virtual_stages)
            continue;
        if (v >= d->v_min && v <= d->v_max) return 1;
    }
    return 0;
}

/* The first contradiction among the fixed keys (and the world and the
 * model) into buf: 1, or 0 when they have none that the walk would only
 * find by dropping every candidate. */
static int contradiction(const pt_plan_space *sp, char *buf, size_t n) {
    const pt_config *c = sp->base;
    int w = sp->world, B = c->train.batch_size, nmod = c->model.n_layer + 2;
    int dp = sp->fix[PT_FIX_DP] ? c->parallel.dp : 0, tp = sp->fix[PT_FIX_TP] ? c->parallel.tp : 0;
    int pp = sp->fix[PT_FIX_PP] ? c->parallel.pp : 0;
    int m = sp->fix[PT_FIX_M] ? c->parallel.microbatches : 0;
    const char *dims[3] = {"parallel.dp", "parallel.tp", "parallel.pp"};
    int val[3] = {dp, tp, pp}, prod = 1, nfix = 0;
    char names[96] = "", nums[64] = "";
    for (int i = 0; i < 3; i++) {
        if (!val[i]) continue;
        if (w % val[i])
            return snprintf(buf, n, "%s (%d) does not divide the %d ranks", dims[i], val[i], w) > 0;
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", nfix ? " x " : "",
                 dims[i]);
        snprintf(nums + strlen(nums), sizeof nums - strlen(nums), "%s%d", nfix ? " x " : "",
                 val[i]);
        prod *= val[i], nfix++;
    }
    if (nfix > 1 && (w % prod || (nfix == 3 && prod != w)))
        return snprintf(buf, n, "%s (%s = %d) %s the %d ranks", names, nums, prod,
                        nfix == 3 ? "is not" : "does not divide", w) > 0;
    if (tp && c->model.n_head % tp)
        return snprintf(buf, n, "model.n_head (%d) is not divisible by parallel.tp (%d)",
                        c->model.n_head, tp) > 0;
    if (pp && (pp > nmod || pp > PT_PLAN_MAX_STAGES))
        return snprintf(buf, n,
                        "parallel.pp (%d) exceeds the model's %d modules or the planner's %d "
                        "stages",
                        pp, nmod, PT_PLAN_MAX_STAGES) > 0;
    if (dp && B % dp)
        return snprintf(buf, n, "train.batch_size (%d) is not divisible by parallel.dp (%d)", B,
                        dp) > 0;
    if (m && B % (dp ? dp * m : m))
        return snprintf(buf, n,
                        "train.batch_size (%d) is not divisible by %sparallel.microbatches (%d)", B,
                        dp ? "parallel.dp x " : "", dp ? dp * m : m) > 0;
    const char *sched = c->parallel.schedule;
    if (pp == 1 && fixed_needs_pipeline(sp))
        return snprintf(buf, n,
                        "parallel.schedule = %s needs parallel.pp > 1 (the planner runs none at "
                        "pp 1)",
                        sched) > 0;
    if (!sp->n_cut) return 0;
    if (pp == 1)
        return snprintf(buf, n, "parallel.stage_layers needs a pipeline (parallel.pp > 1)") > 0;
    if (sp->n_cut > nmod)
        return snprintf(buf, n,
                        "parallel.stage_layers (\"%s\") cuts %d stages: the model has %d "
                        "modules (the embedding, %d blocks, the head)",
                        c->parallel.stage_layers, sp->n_cut, nmod, nmod - 2) > 0;
    /* the cut against the model, as the runtime checks it at its count */
    pt_stage *st = malloc(sizeof *st * (size_t)sp->n_cut);
    pt_status e =
        st ? pt_stage_split(&c->model, sp->n_cut, c->parallel.stage_layers, st) : PT_ERR_NOMEM;
    free(st);
    if (e != PT_OK) return snprintf(buf, n, "%s", pt_error_message()) > 0;
    int any = 0;
    for (int p = 2; p <= w && !any; p++) any = w % p == 0 && (!pp || p == pp) && cut_fits_pp(sp, p);
    if (!any)
        return snprintf(buf, n,
                        "parallel.stage_layers (\"%s\") cuts %d stages: %s as parallel.pp, nor "
                        "as parallel.pp x parallel.virtual_stages (interleaved: 2-%d chunks, "
                        "zbv: 2)%s",
                        c->parallel.stage_layers, sp->n_cut,
                        pp ? "not parallel.pp's" : "no pipeline of these ranks has that many",
                        PT_SCHEDULE_MAX_VIRTUAL,
                        sp->fix[PT_FIX_SCHED] ? ", under the fixed parallel.schedule" : "") > 0;
    return 0;
}

pt_status pt_plan_space_error(const pt_plan_space *sp) {
    char why[256], fx[512], more[400] = "";
    if (!contradiction(sp, why, sizeof why)) {
        int top = -1, next = -1;
        for (int i = 0; i < sp->n_why; i++)
            if (top < 0 || sp->why[i].n > sp->why[top].n)
                next = top, top = i;
            else if (next < 0 || sp->why[i].n > sp->why[next].n)
                next = i;
        if (top < 0) {
            snprintf(why, sizeof why, "no dp x tp x pp factorization");
        } else {
            snprintf(why, sizeof why, "%s", sp->why[top].text);
            if (next >= 0)
                snprintf(more, sizeof more, " (%ld of %ld candidates; next most often: %s)",
                         sp->why[top].n, sp->n_dropped, sp->why[next].text);
        }
    }
    fixed_list(sp, why, fx, sizeof fx);
    return pt_error_set(PT_ERR_INVALID, "no layout of %d ranks is valid%s%s%s: %s%s", sp->world,
                        fx[0] ? " with " : "", fx, fx[0] ? " (fixed)" : "", why, more);
}

/* ---- the walk ---- */

static void set_schedule(pt_plan_layout *l, const char *name, int v) {
    snprintf(l->schedule, sizeof l->schedule, "%s", name);
    l->virtual_stages = v;
}

/* Whether l passes the config validator: l written into the scratch copy.
 * A fixed cut is left out: the group is validated at one chunk a rank,
 * and the cut was checked once against the model (contradiction()). */
static int valid(pt_plan_space *sp, const pt_plan_layout *l) {
    pt_plan_layout_apply(l, sp->scratch);
    if (sp->n_cut) sp->scratch->parallel.stage_layers[0] = 0;
    /* an fp32 plan runs on partrain's runtime: its own limits apply too; a
     * bf16 plan is for a GPU run of the same keys */
    pt_status st = !strcmp(sp->base->train.precision, "bf16")
                       ? pt_config_validate_layout(sp->scratch)
                       : pt_config_validate(sp->scratch);
    if (st == PT_OK) return 1;
    pt_plan_space_drop(sp, pt_error_message());
    return 0;
}

/* Validity of each ZeRO variant of l's (dp, tp, pp, sp, m) into
 * zvalid[z (dp + 1) + g]; the number valid. */
static int valid_zero(pt_plan_space *sp, pt_plan_layout *l, int *zvalid) {
    int any = 0, dp = l->dp;
    const pt_config *c = sp->base;
    for (int z = 0; z <= 3; z++)
        for (int g = 0; g <= dp; g++) {
            int ok = 0;
            if (!(g > 0 && (z == 0 || g == 1 || g == dp || dp % g)) &&
                !(sp->fix[PT_FIX_ZERO] ? z != c->parallel.zero : (z > 0 && dp == 1)) &&
                !(sp->fix[PT_FIX_ZG] && g != c->parallel.zero_group)) {
                l->zero = z, l->zero_group = g;
                ok = valid(sp, l);
            }
            zvalid[z * (dp + 1) + g] = ok;
            any += ok;
        }
    return any;
}

/* The families of group l: every schedule, chunk count and recompute. */
static pt_status walk_schedules(pt_plan_space *sp, const pt_plan_space_visitor *vis,
                                pt_plan_layout *l) {
    const pt_config *c = sp->base;
    int pp = l->pp, m = l->microbatches;
    const pt_sched *d;
    for (int i = 0; (d = pt_sched_at(i)); i++) {
        if (!takes(sp, pp, d)) continue;
        const char *name = d->name;
        for (int v = d->v_min; v <= d->v_max; v++) {
            if (sp->fix[PT_FIX_V] && c->parallel.virtual_stages > 0 &&
                v != c->parallel.virtual_stages)
                continue;
            if (sp->n_cut && pp * v != sp->n_cut) continue; /* not the cut's count */
            if (pt_schedule_check(name, m, pp, v, c->model.n_layer + 2) != PT_OK) {
                pt_plan_space_drop(sp, pt_error_message());
                continue;
            }
            set_schedule(l, name, v);
            for (int r = 0; r <= PT_RECOMPUTE_FULL; r++) {
                if (sp->fix[PT_FIX_REC] && r != recompute_mode(c->train.recompute)) continue;
                l->recompute = r;
                PT_CHECK(vis->family(vis->ctx, l));
            }
        }
    }
    return PT_OK;
}

/* The groups of tp x pp (dp the rest): sequence parallelism, micro-batches. */
static pt_status walk_groups(pt_plan_space *sp, const pt_plan_space_visitor *vis, pt_plan_layout *l,
                             int *zvalid) {
    const pt_config *c = sp->base;
    int B = c->train.batch_size, dp = l->dp, tp = l->tp, pp = l->pp;
    for (int s = 0; s <= (tp > 1); s++) {
        if (sp->fix[PT_FIX_SP] && s != c->parallel.sequence_parallel) continue;
        if (sp->fix[PT_FIX_M] && (B / dp) % c->parallel.microbatches)
            dropf(sp,
                  "train.batch_size / parallel.dp (%d / %d) is not divisible by "
                  "parallel.microbatches (%d)",
                  B, dp, c->parallel.microbatches);
        for (int m = 1; m <= B / dp && m <= PT_SCHEDULE_MAX_MICRO; m++) {
            if (sp->fix[PT_FIX_M] && m != c->parallel.microbatches) continue;
            if ((B / dp) % m) continue;
            l->sequence_parallel = s, l->microbatches = m;
            l->recompute = PT_RECOMPUTE_NONE;
            set_schedule(l, pp == 1 ? "none" : "1f1b", 1);
            int nz = valid_zero(sp, l, zvalid);
            if (!nz) continue;
            PT_CHECK(vis->group(vis->ctx, l, zvalid, nz));
            if (pp == 1 && fixed_needs_pipeline(sp))
                dropf(sp,
                      "parallel.schedule = %s needs parallel.pp > 1 (the planner runs none at "
                      "pp 1)",
                      c->parallel.schedule);
            PT_CHECK(walk_schedules(sp, vis, l));
        }
    }
    return PT_OK;
}

pt_status pt_plan_space_walk(pt_plan_space *sp, const pt_plan_space_visitor *vis) {
    const pt_config *c = sp->base;
    int world = sp->world, L = c->model.n_layer, B = c->train.batch_size;
    char why[256];
    if (contradiction(sp, why, sizeof why)) return PT_OK; /* nothing to walk */
    int *zvalid = malloc(sizeof *zvalid * 4 * ((size_t)world + 1));
    if (!zvalid) return pt_error_set(PT_ERR_NOMEM, "plan: search state");
    pt_plan_layout l;
    memset(&l, 0, sizeof l);
    l.threads = c->train.threads;
    if (sp->fix[PT_FIX_SREC])
        snprintf(l.stage_recompute, sizeof l.stage_recompute, "%s", c->train.stage_recompute);
    if (sp->fix[PT_FIX_WHOLE])
        snprintf(l.zero_whole, sizeof l.zero_whole, "%s", c->parallel.zero_whole);
    if (sp->fix[PT_FIX_LAYERS])
        snprintf(l.stage_layers, sizeof l.stage_layers, "%s", c->parallel.stage_layers);
    pt_status st = PT_OK;
    for (int tp = 1; tp <= world && st == PT_OK; tp++) {
        if ((sp->fix[PT_FIX_TP] && tp != c->parallel.tp) || world % tp) continue;
        if (c->model.n_head % tp) {
            dropf(sp, "model.n_head (%d) is not divisible by parallel.tp (%d)", c->model.n_head,
                  tp);
            continue;
        }
        for (int pp = 1; pp * tp <= world && st == PT_OK; pp++) {
            if ((sp->fix[PT_FIX_PP] && pp != c->parallel.pp) || (world / tp) % pp) continue;
            if (sp->n_cut && !cut_fits_pp(sp, pp)) continue; /* not the fixed cut's */
            if (pp > L + 2 || pp > PT_PLAN_MAX_STAGES) {
                dropf(sp,
                      "parallel.pp (%d) exceeds the model's %d modules or the planner's %d "
                      "stages",
                      pp, L + 2, PT_PLAN_MAX_STAGES);
                continue;
            }
            int dp = world / tp / pp;
            if (sp->fix[PT_FIX_DP] && dp != c->parallel.dp) continue;
            if (B % dp) {
                dropf(sp, "train.batch_size (%d) is not divisible by parallel.dp (%d)", B, dp);
                continue;
            }
            l.dp = dp, l.tp = tp, l.pp = pp;
            st = walk_groups(sp, vis, &l, zvalid);
        }
    }
    free(zvalid);
    return st;
}
