/* Sharded tensors: for t = 1, 2 and 4 and every tp rank, the split of every
 * GPT-2 tensor is built here BY HAND from its global shape (column-parallel
 * c_attn: the columns [r*C/t, (r+1)*C/t) of each of q, k and v; c_fc: its
 * output columns; row-parallel c_proj: its input rows, biases whole; wte:
 * vocabulary rows, padded to a multiple of t; wpe and LayerNorms whole) and
 * checked against the model, also for vocabularies that t = 2, 3, 4 does not
 * divide (and a rank that holds only padding):
 * (a) the slice description and the slice model's table, (b) init of the
 * slice equals the slice of the whole init bitwise, (c) a checkpoint written
 * from the t slices is byte for byte the t = 1 file, (d) reading a slice
 * from the t = 1 file gives the slice bitwise, padding zero. Plus the
 * refusals (t not dividing n_head, unknown names, a file of another shape). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/model.h"
#include "partrain/train.h"
#include "pt_test.h"
#include "pt_test_files.h"

/* L, C, NH, V, T: n_head and vocab_size divisible by 2 and 4 */
static const pt_model_config base_cfg = {2, 16, 4, 12, 6};
/* n_head divisible by 2, 3 and 4; vocabularies none of them divides (37),
 * and one that leaves rank 3 of 4 only padding (5: Vl 2, rows 6 and 7) */
static const pt_model_config pad_cfg = {2, 24, 12, 37, 6};
static const pt_model_config tiny_v_cfg = {1, 24, 12, 5, 6};
/* the configuration the checks below run on */
static pt_model_config cfg = {2, 16, 4, 12, 6};

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* ---- the split by hand ---- */

typedef struct {
    int split_dim; /* -1 whole */
    int np;
    int64_t off[3], ext[3];
    int64_t pad; /* wte: padding rows after the real ones */
} hand_split;

/* From the name and the global shape (R, K) (K 0: a vector) only. */
static hand_split by_hand(const char *name, int64_t R, int64_t K, int t, int r) {
    hand_split h = {-1, 0, {0}, {0}, 0};
    if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {
        /* q, k, v side by side: each C wide, rank r's heads of each */
        int64_t E = ends_with(name, "weight") ? K : R, Cq = E / 3;
        h.split_dim = ends_with(name, "weight") ? 1 : 0;
        h.np = 3;
        for (int b = 0; b < 3; b++) {
            h.off[b] = b * Cq + r * (Cq / t);
            h.ext[b] = Cq / t;
        }
    } else if (ends_with(name, "mlp.c_fc.weight")) { /* column-parallel: output columns */
        h.split_dim = 1;
        h.np = 1;
        h.off[0] = r * (K / t);
        h.ext[0] = K / t;
    } else if (ends_with(name, "mlp.c_fc.bias")) {
        h.split_dim = 0;
        h.np = 1;
        h.off[0] = r * (R / t);
        h.ext[0] = R / t;
    } else if (!strcmp(name, "wte.weight")) {
        /* vocabulary rows of [0, t*Vl), Vl = ceil(R/t); rows >= R padding */
        int64_t Vl = (R + t - 1) / t, lo = r * Vl, hi = lo + Vl;
        int64_t real = hi <= R ? Vl : (lo < R ? R - lo : 0);
        h.split_dim = 0;
        h.np = 1;
        h.off[0] = lo;
        h.ext[0] = real;
        h.pad = Vl - real;
    } else if (ends_with(name, ".c_proj.weight")) {
        /* row-parallel: input rows */
        h.split_dim = 0;
        h.np = 1;
        h.off[0] = r * (R / t);
        h.ext[0] = R / t;
    }
    return h;
}

/* map[l] = the global element index of local element l, by nested loops
 * over the hand split; returns the count of real local elements (the
 * padding, if any, follows them). */
static size_t hand_map(const hand_split *h, int64_t R, int64_t K, size_t *map) {
    int64_t W = K ? K : 1;
    size_t n = 0;
    if (h->split_dim < 0) {
        for (int64_t j = 0; j < R * W; j++) map[n++] = (size_t)j;
    } else if (h->split_dim == 0) {
        for (int p = 0; p < h->np; p++)
            for (int64_t i = h->off[p]; i < h->off[p] + h->ext[p]; i++)
                for (int64_t j = 0; j < W; j++) map[n++] = (size_t)(i * W + j);
    } else {
        for (int64_t i = 0; i < R; i++)
            for (int p = 0; p < h->np; p++)
                for (int64_t j = h->off[p]; j < h->off[p] + h->ext[p]; j++)
                    map[n++] = (size_t)(i * K + j);
    }
    return n;
}

/* The hand map of tensor i of the slice model of (t, r), from the whole
 * model's tensor i. */
static size_t tensor_map(const pt_model *whole, int i, int t, int r, size_t *map) {
    const pt_param_info *ft = pt_model_tensor(whole, i);
    hand_split h = by_hand(ft->name, ft->shape[0], ft->shape[1], t, r);
    return hand_map(&h, ft->shape[0], ft->shape[1], map);
}

/* Gather the slice of (t, r) from a buffer laid out like whole's; padding
 * zero. */
static void hand_gather(const pt_model *whole, const pt_model *slice, int t, int r,
                        const float *full, float *part, size_t *map) {
    for (int i = 0; i < pt_model_num_tensors(whole); i++) {
        size_t n = tensor_map(whole, i, t, r, map);
        const pt_param_info *ft = pt_model_tensor(whole, i), *lt = pt_model_tensor(slice, i);
        for (size_t l = 0; l < n; l++) part[lt->offset + l] = full[ft->offset + map[l]];
        for (size_t l = n; l < lt->numel; l++) part[lt->offset + l] = 0.0f;
    }
}

/* Elements of slice's tensors that are padding (all at their tensors' ends). */
static size_t pad_elems(const pt_model *slice) {
    size_t n = 0;
    for (int i = 0; i < pt_model_num_tensors(slice); i++) {
        const pt_param_info *lt = pt_model_tensor(slice, i);
        n += (size_t)lt->shard.pad * (size_t)(lt->ndim == 2 ? lt->shape[1] : 1);
    }
    return n;
}

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static size_t count_bit_diffs(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

/* ---- (a) the description and the table ---- */

static void check_describe(int t) {
    pt_model *whole = NULL;
    CHECK_OK(pt_model_new_slice(&whole, &cfg, 0, 1, 0));
    if (!whole) return;
    size_t P = pt_model_num_params(whole);
    size_t *map = malloc(P * sizeof *map), *runmap = malloc(P * sizeof *runmap);
    unsigned *covered = calloc(P, sizeof *covered);
    for (int r = 0; r < t; r++) {
        pt_model *s = NULL;
        CHECK_OK(pt_model_new_slice(&s, &cfg, 0, t, r));
        if (!s) break;
        int ts, tr;
        pt_model_tp(s, &ts, &tr);
        CHECK_EQ(ts, t);
        CHECK_EQ(tr, r);
        CHECK(pt_model_params(s) == NULL && pt_model_grads(s) == NULL);
        CHECK_EQ(pt_model_num_tensors(s), pt_model_num_tensors(whole));
        size_t at = 0;
        for (int i = 0; i < pt_model_num_tensors(s); i++) {
            const pt_param_info *ft = pt_model_tensor(whole, i), *lt = pt_model_tensor(s, i);
            CHECK(!strcmp(ft->name, lt->name));
            CHECK_EQ(lt->module, ft->module);
            CHECK_EQ(lt->decay, ft->decay);
            /* the global shape is GPT-2's */
            CHECK_EQ(lt->shard.ndim, ft->ndim);
            CHECK_EQ(lt->shard.shape[0], ft->shape[0]);
            CHECK_EQ(lt->shard.shape[1], ft->shape[1]);
            /* the split is the hand one */
            hand_split h = by_hand(ft->name, ft->shape[0], ft->shape[1], t, r);
            CHECK_EQ(lt->shard.split_dim, h.split_dim);
            CHECK_EQ(lt->shard.npieces, h.np);
            CHECK_EQ(lt->shard.pad, h.pad);
            for (int p = 0; p < h.np && p < lt->shard.npieces; p++) {
                CHECK_EQ(lt->shard.piece[p].offset, h.off[p]);
                CHECK_EQ(lt->shard.piece[p].extent, h.ext[p]);
            }
            /* a pure function: pt_shard_describe gives the table's */
            pt_shard d;
            CHECK_OK(pt_shard_describe(&d, &cfg, ft->name, t, r));
            CHECK(!memcmp(&d, &lt->shard, sizeof d));
            /* local shape and layout: contiguous in table order */
            int64_t ls0 = ft->shape[0], ls1 = ft->shape[1];
            if (h.split_dim == 0) ls0 = h.np * h.ext[0] + h.pad;
            if (h.split_dim == 1) ls1 = h.np * h.ext[0];
            CHECK_EQ(lt->ndim, ft->ndim);
            CHECK_EQ(lt->shape[0], ls0);
            CHECK_EQ(lt->shape[1], ls1);
            size_t n = tensor_map(whole, i, t, r, map);
            CHECK_EQ(lt->numel, n + (size_t)h.pad * (size_t)(ls1 ? ls1 : 1));
            CHECK_EQ(pt_shard_local_numel(&lt->shard), lt->numel);
            CHECK_EQ(lt->numel, (size_t)ls0 * (size_t)(ls1 ? ls1 : 1));
            CHECK_EQ(lt->offset, at);
            at += lt->numel;
            /* the runs are the hand map */
            size_t nruns = pt_shard_num_runs(&lt->shard), filled = 0, last_g = 0;
            for (size_t k = 0; k < nruns; k++) {
                size_t g, l, len;
                pt_shard_run(&lt->shard, k, &g, &l, &len);
                CHECK_EQ(l, filled); /* in order, once */
                CHECK(k == 0 || g >= last_g);
                last_g = g + len;
                for (size_t j = 0; j < len && l + j < n; j++) runmap[l + j] = g + j;
                filled = l + len;
            }
            CHECK_EQ(filled, n); /* the runs end where the padding starts */
            size_t bad = 0;
            for (size_t l = 0; l < n && l < filled; l++) bad += runmap[l] != map[l];
            CHECK_EQ(bad, 0);
            for (size_t l = 0; l < n; l++) covered[ft->offset + map[l]]++;
        }
        CHECK_EQ(pt_model_num_params(s), at);
        /* module regions tile the slice's flat buffer */
        size_t mat = 0;
        for (int i = 0; i < pt_model_num_modules(s); i++) {
            size_t off, cnt;
            pt_model_module_region(s, i, &off, &cnt);
            CHECK_EQ(off, mat);
            mat += cnt;
        }
        CHECK_EQ(mat, at);
        pt_model_free(s);
    }
    /* split tensors: the t slices cover every element once; whole ones t times */
    size_t bad = 0;
    for (int i = 0; i < pt_model_num_tensors(whole); i++) {
        const pt_param_info *ft = pt_model_tensor(whole, i);
        hand_split h = by_hand(ft->name, ft->shape[0], ft->shape[1], t, 0);
        unsigned want = h.split_dim < 0 ? (unsigned)t : 1u;
        for (size_t j = 0; j < ft->numel; j++) bad += covered[ft->offset + j] != want;
    }
    CHECK_EQ(bad, 0);
    free(covered);
    free(runmap);
    free(map);
    pt_model_free(whole);
}

static void test_describe_t1(void) {
    check_describe(1);
    /* t = 1: every slice is the whole tensor, the table pt_model_new's */
    pt_model *a = NULL, *b = NULL;
    CHECK_OK(pt_model_new(&a, &cfg, 1));
    CHECK_OK(pt_model_new_slice(&b, &cfg, 1, 1, 0));
    if (!a || !b) goto done;
    CHECK_EQ(pt_model_num_params(a), pt_model_num_params(b));
    CHECK_EQ(pt_model_num_params(a), pt_model_config_num_params(&cfg));
    for (int i = 0; i < pt_model_num_tensors(a); i++) {
        const pt_param_info *x = pt_model_tensor(a, i);
        CHECK(!memcmp(x, pt_model_tensor(b, i), sizeof *x));
        CHECK_EQ(pt_shard_local_numel(&x->shard), x->numel);
        CHECK_EQ(x->shard.shape[0], x->shape[0]);
        CHECK_EQ(x->shard.shape[1], x->shape[1]);
        size_t total = 0;
        for (size_t k = 0; k < pt_shard_num_runs(&x->shard); k++) {
            size_t g, l, len;
            pt_shard_run(&x->shard, k, &g, &l, &len);
            CHECK_EQ(g, l);
            total += len;
        }
        CHECK_EQ(total, x->numel);
    }
    pt_model_draw_weights(a, 7);
    pt_model_draw_weights(b, 7);
    CHECK_EQ(count_bit_diffs(pt_model_params(a), pt_model_params(b), pt_model_num_params(a)), 0);
done:
    pt_model_free(b);
    pt_model_free(a);
}
static void test_describe_t2(void) {
    check_describe(2);
}
static void test_describe_t4(void) {
    check_describe(4);
}

/* ---- (b) init by global element index ---- */

static void check_init(int t) {
    const uint64_t seed = 20240520;
    pt_model *whole = NULL;
    CHECK_OK(pt_model_new(&whole, &cfg, 1));
    if (!whole) return;
    pt_model_draw_weights(whole, seed);
    size_t P = pt_model_num_params(whole), total = 0;
    size_t *map = malloc(P * sizeof *map);
    float *want = NULL;
    for (int r = 0; r < t; r++) {
        pt_model *s = NULL;
        CHECK_OK(pt_model_new_slice(&s, &cfg, 1, t, r));
        if (!s) break;
        size_t n = pt_model_num_params(s);
        want = realloc(want, n * sizeof *want); /* padding makes n > P possible */
        pt_model_draw_weights(s, seed);
        /* real rows: the whole init's at their places; padding: zero */
        hand_gather(whole, s, t, r, pt_model_params(whole), want, map);
        CHECK_EQ(count_bit_diffs(pt_model_params(s), want, n), 0);
        total += n - pad_elems(s);
        pt_model_free(s);
    }
    /* the split tensors add up to the whole; whole ones are held t times */
    size_t whole_once = 0;
    for (int i = 0; i < pt_model_num_tensors(whole); i++)
        if (pt_model_tensor(whole, i)->shard.split_dim < 0)
            whole_once += pt_model_tensor(whole, i)->numel;
    CHECK_EQ(total, P + (size_t)(t - 1) * whole_once);
    free(want);
    free(map);
    pt_model_free(whole);
}

static void test_init_t2(void) {
    check_init(2);
}
static void test_init_t4(void) {
    check_init(4);
}

/* ---- (c) write from slices, (d) read a slice ---- */

static void check_ckpt(int t) {
    pt_model *whole = NULL;
    CHECK_OK(pt_model_new(&whole, &cfg, 1));
    if (!whole) return;
    size_t P = pt_model_num_params(whole);
    float *full = pt_model_params(whole);
    /* distinct values, exact in float: a misplaced element shows */
    for (size_t j = 0; j < P; j++) full[j] = (float)(j + 1) * (j % 2 ? -0.5f : 0.25f);
    char name1[64], namet[64];
    snprintf(name1, sizeof name1, "t1-%d.safetensors", t);
    snprintf(namet, sizeof namet, "slices-%d.safetensors", t);
    char path1[512], patht[512];
    snprintf(path1, sizeof path1, "%s", tmp_path(name1));
    snprintf(patht, sizeof patht, "%s", tmp_path(namet));
    CHECK_OK(pt_safetensors_save(path1, whole, full));

    pt_model *s[4] = {NULL};
    float *bufs[4] = {NULL};
    const float *cbufs[4];
    size_t *map = malloc(P * sizeof *map);
    for (int r = 0; r < t; r++) {
        CHECK_OK(pt_model_new_slice(&s[r], &cfg, 0, t, r));
        if (!s[r]) goto done;
        bufs[r] = malloc(pt_model_num_params(s[r]) * sizeof(float));
        hand_gather(whole, s[r], t, r, full, bufs[r], map);
        cbufs[r] = bufs[r];
    }
    /* whole tensors are taken from rank 0: the others' copies do not
     * matter; nor does padding, which must not reach the file */
    for (int r = 0; r < t; r++)
        for (int i = 0; i < pt_model_num_tensors(s[r]); i++) {
            const pt_param_info *lt = pt_model_tensor(s[r], i);
            size_t npad = (size_t)lt->shard.pad * (size_t)(lt->ndim == 2 ? lt->shape[1] : 1);
            if (r > 0 && lt->shard.split_dim < 0)
                for (size_t j = 0; j < lt->numel; j++) bufs[r][lt->offset + j] = -1e30f;
            for (size_t j = lt->numel - npad; j < lt->numel; j++) bufs[r][lt->offset + j] = 7e30f;
        }
    CHECK_OK(pt_safetensors_save_slices(patht, s[t - 1], cbufs));
    /* (c) the same file, byte for byte (header: names, shapes, offsets;
     * then every tensor's bytes) */
    size_t n1 = 0, nt = 0;
    unsigned char *b1 = read_all(path1, &n1), *bt = read_all(patht, &nt);
    CHECK(b1 && bt);
    CHECK_EQ(n1, nt);
    if (b1 && bt && n1 == nt) {
        CHECK(memcmp(b1, bt, n1) == 0);
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++) hlen |= (uint64_t)b1[i] << (8 * i);
        size_t bad = 0; /* the data section, tensor by tensor */
        for (int i = 0; i < pt_model_num_tensors(whole); i++) {
            const pt_param_info *ft = pt_model_tensor(whole, i);
            size_t at = 8 + hlen + ft->offset * sizeof(float);
            bad += memcmp(b1 + at, bt + at, ft->numel * sizeof(float)) != 0;
        }
        CHECK_EQ(bad, 0);
    }
    free(b1);
    free(bt);
    /* and it loads as the whole model */
    float *back = malloc(P * sizeof *back);
    CHECK_OK(pt_safetensors_load(patht, whole, back));
    CHECK_EQ(count_bit_diffs(back, full, P), 0);
    free(back);

    /* (d) each rank's slice, read from the t = 1 file */
    for (int r = 0; r < t; r++) {
        size_t n = pt_model_num_params(s[r]);
        float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
        /* every element must be read, and padding zeroed */
        for (size_t j = 0; j < n; j++) got[j] = 12345.0f;
        hand_gather(whole, s[r], t, r, full, want, map);
        CHECK_OK(pt_safetensors_load_slice(path1, s[r], got));
        CHECK_EQ(count_bit_diffs(got, want, n), 0);
        /* and from the file the slices wrote: slice -> full -> slice */
        for (size_t j = 0; j < n; j++) got[j] = -12345.0f;
        CHECK_OK(pt_safetensors_load_slice(patht, s[r], got));
        CHECK_EQ(count_bit_diffs(got, want, n), 0);
        free(want);
        free(got);
    }
done:
    for (int r = 0; r < t; r++) {
        free(bufs[r]);
        pt_model_free(s[r]);
    }
    free(map);
    pt_model_free(whole);
}

static void test_ckpt_t1(void) {
    check_ckpt(1);
}
static void test_ckpt_t2(void) {
    check_ckpt(2);
}
static void test_ckpt_t4(void) {
    check_ckpt(4);
}

/* Initialized slices saved at ts make the whole init's file, and it
 * loads back into slices of another degree tl: equal to tl's init (padding
 * zero, whatever the buffer held). */
static void check_across(int ts, int tl) {
    const uint64_t seed = 99;
    pt_model *sv[4] = {NULL}, *sl = NULL, *ml = NULL;
    const float *bufs[4];
    char name[64], name1[64], path[512], path1[512];
    snprintf(name, sizeof name, "t%d-init-%d.safetensors", ts, cfg.vocab_size);
    snprintf(name1, sizeof name1, "t1-init-%d.safetensors", cfg.vocab_size);
    snprintf(path, sizeof path, "%s", tmp_path(name));
    snprintf(path1, sizeof path1, "%s", tmp_path(name1));
    for (int r = 0; r < ts; r++) {
        CHECK_OK(pt_model_new_slice(&sv[r], &cfg, 1, ts, r));
        if (!sv[r]) goto done;
        pt_model_draw_weights(sv[r], seed);
        bufs[r] = pt_model_params(sv[r]);
    }
    CHECK_OK(pt_safetensors_save_slices(path, sv[0], bufs));
    /* the file of ts initialized slices is the file of the whole init */
    CHECK_OK(pt_model_new(&ml, &cfg, 1));
    if (!ml) goto done;
    pt_model_draw_weights(ml, seed);
    CHECK_OK(pt_safetensors_save(path1, ml, pt_model_params(ml)));
    pt_model_free(ml);
    ml = NULL;
    size_t ns = 0, n1 = 0;
    unsigned char *bs = read_all(path, &ns), *b1 = read_all(path1, &n1);
    CHECK(bs && b1 && ns == n1 && memcmp(bs, b1, n1) == 0);
    free(bs);
    free(b1);
    for (int r = 0; r < tl; r++) {
        CHECK_OK(pt_model_new_slice(&sl, &cfg, 1, tl, r));
        CHECK_OK(pt_model_new_slice(&ml, &cfg, 1, tl, r));
        if (!sl || !ml) goto done;
        pt_model_draw_weights(ml, seed);
        size_t n = pt_model_num_params(ml);
        for (size_t j = 0; j < n; j++) pt_model_params(sl)[j] = -3.0f;
        CHECK_OK(pt_safetensors_load_slice(path, sl, pt_model_params(sl)));
        CHECK_EQ(count_bit_diffs(pt_model_params(sl), pt_model_params(ml), n), 0);
        pt_model_free(sl);
        pt_model_free(ml);
        sl = ml = NULL;
    }
done:
    pt_model_free(ml);
    pt_model_free(sl);
    for (int r = 0; r < ts; r++) pt_model_free(sv[r]);
}

static void test_ckpt_across_degrees(void) {
    check_across(4, 2);
}

/* ---- a vocabulary that t does not divide ---- */

static void test_padded_vocab(void) {
    cfg = pad_cfg; /* V 37: Vl 19, 13, 10 at t = 2, 3, 4 */
    for (int t = 1; t <= 4; t++) {
        check_describe(t);
        if (t > 1) check_init(t);
        check_ckpt(t);
    }
    check_across(4, 3);
    check_across(3, 2);
    check_across(2, 1);
    cfg = base_cfg;
}

static void test_all_padding_rank(void) {
    cfg = tiny_v_cfg; /* V 5, t 4: Vl 2, rank 3 holds rows 6 and 7 */
    pt_shard d;
    CHECK_OK(pt_shard_describe(&d, &cfg, "wte.weight", 4, 3));
    CHECK(d.split_dim == 0 && d.npieces == 1);
    CHECK_EQ(d.piece[0].offset, 6);
    CHECK_EQ(d.piece[0].extent, 0);
    CHECK_EQ(d.pad, 2);
    CHECK_EQ(pt_shard_num_runs(&d), 0);
    int64_t shape[2];
    pt_shard_local_shape(&d, shape);
    CHECK(shape[0] == 2 && shape[1] == 24);
    CHECK_EQ(pt_shard_local_numel(&d), 48);
    /* rank 2: one real row (4), one padding row */
    CHECK_OK(pt_shard_describe(&d, &cfg, "wte.weight", 4, 2));
    CHECK(d.piece[0].offset == 4 && d.piece[0].extent == 1 && d.pad == 1);
    CHECK_EQ(pt_shard_num_runs(&d), 1);
    size_t g, l, len;
    pt_shard_run(&d, 0, &g, &l, &len);
    CHECK(g == 4 * 24 && l == 0 && len == 24);
    for (int t = 2; t <= 4; t++) {
        check_describe(t);
        check_init(t);
        check_ckpt(t);
    }
    check_across(4, 3);
    check_across(3, 4);
    cfg = base_cfg;
}

/* ---- refusals ---- */

static int msg_has(const char *s) {
    return strstr(pt_error_message(), s) != NULL;
}

static void test_refusals(void) {
    pt_model *m = NULL;
    pt_model_config odd_v = cfg;
    odd_v.vocab_size = 11;
    /* no refusal: padded (V 11, t 2: rank 1 holds rows 6..10 and one of padding) */
    CHECK_OK(pt_shard_check(&odd_v, 2));
    CHECK_OK(pt_shard_check(&odd_v, 1));
    CHECK_OK(pt_model_new_slice(&m, &odd_v, 1, 2, 1));
    if (m) {
        const pt_param_info *wte = pt_model_tensor(m, 0);
        CHECK(!strcmp(wte->name, "wte.weight"));
        CHECK(wte->shape[0] == 6 && wte->shape[1] == 16 && wte->numel == 6 * 16);
        CHECK(wte->shard.shape[0] == 11 && wte->shard.pad == 1);
        CHECK(wte->shard.piece[0].offset == 6 && wte->shard.piece[0].extent == 5);
        pt_model_free(m);
        m = NULL;
    }
    CHECK(pt_shard_check(&cfg, 3) == PT_ERR_INVALID && msg_has("model.n_head (4)"));
    CHECK(pt_shard_check(&cfg, 8) == PT_ERR_INVALID && msg_has("model.n_head"));
    CHECK(pt_shard_check(&cfg, 0) == PT_ERR_INVALID && msg_has("parallel.tp"));
    CHECK(pt_model_new_slice(&m, &cfg, 1, 2, 2) == PT_ERR_INVALID && m == NULL);
    CHECK(pt_model_new_slice(&m, &cfg, -1, 1, 0) == PT_ERR_INVALID && m == NULL);
    pt_shard d;
    const char *bad[] = {"h.2.ln_1.weight",
                         "h.01.ln_1.weight",
                         "h..ln_1.weight",
                         "h.0.ln_3.weight",
                         "wte",
                         "transformer.wte.weight",
                         "h.0.attn.bias",
                         ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(pt_shard_describe(&d, &cfg, bad[i], 2, 0) == PT_ERR_INVALID);
        CHECK(msg_has("not a parameter"));
    }
    CHECK_OK(pt_shard_describe(&d, &cfg, "h.1.mlp.c_proj.bias", 2, 1));
    CHECK(d.split_dim == -1 && d.shape[0] == 16 && d.ndim == 1);
    /* the table only: nothing allocated */
    size_t before = pt_mem_current_total();
    CHECK_OK(pt_model_new_slice(&m, &cfg, 0, 2, 1));
    CHECK_EQ(pt_mem_current_total(), before);
    pt_model_free(m);
}

static void test_load_slice_checked(void) {
    /* a file of another model shape, and a truncated file: refused as
     * pt_safetensors_load refuses them, the buffer untouched */
    pt_model_config other = cfg;
    other.vocab_size = 16;
    pt_model *o = NULL, *s = NULL;
    CHECK_OK(pt_model_new(&o, &other, 1));
    CHECK_OK(pt_model_new_slice(&s, &cfg, 1, 2, 1));
    if (!o || !s) goto done;
    pt_model_draw_weights(o, 1);
    const char *path = tmp_path("other.safetensors");
    CHECK_OK(pt_safetensors_save(path, o, pt_model_params(o)));
    float *buf = pt_model_params(s);
    buf[0] = 42.0f;
    CHECK(pt_safetensors_load_slice(path, s, buf) == PT_ERR_FORMAT);
    CHECK(msg_has("wte.weight") && msg_has("shape"));
    CHECK(buf[0] == 42.0f);
    size_t n = 0;
    unsigned char *bytes = read_all(path, &n);
    CHECK(bytes != NULL);
    if (bytes) {
        const char *cut = tmp_path("cut.safetensors");
        FILE *f = fopen(cut, "wb");
        CHECK(f != NULL);
        if (f) {
            CHECK_EQ(fwrite(bytes, 1, n - 4, f), n - 4);
            fclose(f);
            CHECK(pt_safetensors_load_slice(cut, s, buf) == PT_ERR_FORMAT);
            CHECK(msg_has("cut.safetensors"));
        }
        free(bytes);
    }
    CHECK(pt_safetensors_load_slice(tmp_path("absent.safetensors"), s, buf) != PT_OK);
done:
    pt_model_free(s);
    pt_model_free(o);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-shard-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_describe_t1);
    RUN(test_describe_t2);
    RUN(test_describe_t4);
    RUN(test_init_t2);
    RUN(test_init_t4);
    RUN(test_ckpt_t1);
    RUN(test_ckpt_t2);
    RUN(test_ckpt_t4);
    RUN(test_ckpt_across_degrees);
    RUN(test_padded_vocab);
    RUN(test_all_padding_rank);
    RUN(test_refusals);
    RUN(test_load_slice_checked);
    CHECK_EQ(pt_mem_current_total(), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_DONE();
}
