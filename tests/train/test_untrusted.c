/* Hostile inputs to the train layer's parsers: safetensors files whose
 * tensors alias, leave gaps or carry bytes that belong to no tensor, NUL
 * and invalid UTF-8 in the header, shapes and offsets that are no exact
 * integers, absurd layer numbers, bare files that do not state the head
 * count; configs with duplicate keys (flat, nested, dotted vs nested) or
 * content after the object; data files that are neither llm.c tokens nor
 * UTF-8 text. Each case checks the status AND the words of the one-line
 * message, so that it fails on a reader that refuses for the wrong reason
 * (or accepts). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../src/train/train_impl.h" /* pt_ckpt_parse_state, pt_ckpt_state_fields */
#include "partrain/train.h"
#include "pt_test.h"
#include "pt_test_files.h"

static int msg_has(const char *s) {
    int ok = strstr(pt_error_message(), s) != NULL;
    if (!ok) fprintf(stderr, "  message '%s' lacks '%s'\n", pt_error_message(), s);
    return ok;
}

/* ---- safetensors files built by hand ---- */

#define MAXT 64
typedef struct {
    char name[96];
    char shape[96]; /* JSON array text, e.g. "[16, 8]" */
    char begin[48], end[48];
} st_entry;

typedef struct {
    st_entry e[MAXT];
    int n;
    char meta[256]; /* JSON object text, or "" for none */
} st_file;

static const pt_model_config MC = {1, 8, 2, 16, 4}; /* n_embd/64 would give 1 head, not 2 */

/* The model's tensors in flat order at their natural offsets (a valid
 * file), n_head stated in __metadata__. */
static void st_from_model(st_file *f, const pt_model *m) {
    memset(f, 0, sizeof *f);
    snprintf(f->meta, sizeof f->meta, "{\"format\":\"pt\",\"n_head\":\"%d\"}",
             pt_model_config_of(m)->n_head);
    for (int i = 0; i < pt_model_num_tensors(m); i++) {
        const pt_param_info *t = pt_model_tensor(m, i);
        st_entry *e = &f->e[f->n++];
        snprintf(e->name, sizeof e->name, "%s", t->name);
        if (t->ndim == 2)
            snprintf(e->shape, sizeof e->shape, "[%lld,%lld]", (long long)t->shape[0],
                     (long long)t->shape[1]);
        else
            snprintf(e->shape, sizeof e->shape, "[%lld]", (long long)t->shape[0]);
        snprintf(e->begin, sizeof e->begin, "%zu", t->offset * 4);
        snprintf(e->end, sizeof e->end, "%zu", (t->offset + t->numel) * 4);
    }
}

static int st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name)) return i;
    fprintf(stderr, "no tensor %s\n", name);
    exit(1);
}

/* Header (padding `pad` bytes of `padc` after the JSON) + data bytes. */
static void st_write_raw(const char *path, const st_file *f, const char *extra, size_t pad,
                         char padc, const void *data, size_t ndata) {
    static char hdr[1 << 16];
    int at = snprintf(hdr, sizeof hdr, "{");
    if (f->meta[0])
        at += snprintf(hdr + at, sizeof hdr - (size_t)at, "\"__metadata__\":%s", f->meta);
    for (int i = 0; i < f->n; i++)
        at += snprintf(hdr + at, sizeof hdr - (size_t)at,
                       "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%s,%s]}",
                       (i || f->meta[0]) ? "," : "", f->e[i].name, f->e[i].shape, f->e[i].begin,
                       f->e[i].end);
    at += snprintf(hdr + at, sizeof hdr - (size_t)at, "%s}", extra ? extra : "");
    for (size_t i = 0; i < pad; i++) hdr[at++] = padc;
    FILE *fp = fopen(path, "wb");
    uint64_t hl = (uint64_t)at;
    fwrite(&hl, 8, 1, fp);
    fwrite(hdr, 1, (size_t)at, fp);
    if (ndata) fwrite(data, 1, ndata, fp);
    fclose(fp);
}

static void st_write(const char *path, const st_file *f, pt_model *m, size_t extra_bytes) {
    size_t n = pt_model_num_params(m) * 4 + extra_bytes;
    unsigned char *data = calloc(1, n);
    memcpy(data, pt_model_params(m), pt_model_num_params(m) * 4);
    st_write_raw(path, f, NULL, 0, ' ', data, n);
    free(data);
}

static pt_model *new_model(void) {
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &MC, 1));
    if (m) pt_model_draw_weights(m, 7);
    return m;
}

static pt_status load(const char *name, pt_model *into) {
    return pt_safetensors_load(tmp_path(name), into, pt_model_params(into));
}

static void test_st_valid_baseline(void) {
    pt_model *m = new_model(), *m2 = new_model();
    if (!m || !m2) return;
    st_file f;
    st_from_model(&f, m);
    st_write(tmp_path("ok.safetensors"), &f, m, 0);
    memset(pt_model_params(m2), 0, pt_model_num_params(m2) * 4);
    CHECK_OK(load("ok.safetensors", m2));
    CHECK(!memcmp(pt_model_params(m), pt_model_params(m2), pt_model_num_params(m) * 4));
    /* an empty tensor (shape [0], no bytes) and an attention-mask buffer of
     * another dtype are fine: they tile too */
    st_write_raw(tmp_path("buffers.safetensors"), &f,
                 ",\"h.0.attn.masked_bias\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,"
                 "0]}",
                 3, ' ', pt_model_params(m), pt_model_num_params(m) * 4);
    CHECK_OK(load("buffers.safetensors", m2));
    pt_model_free(m);
    pt_model_free(m2);
}

/* ---- item 10: tiling, NUL, UTF-8 ---- */

static void test_st_overlap(void) {
    pt_model *m = new_model();
    if (!m) return;
    st_file f;
    st_from_model(&f, m);
    /* ln_1.bias aliased onto ln_1.weight's bytes (both [C]) */
    int w = st_find(&f, "h.0.ln_1.weight"), b = st_find(&f, "h.0.ln_1.bias");
    memcpy(f.e[b].begin, f.e[w].begin, sizeof f.e[b].begin);
    memcpy(f.e[b].end, f.e[w].end, sizeof f.e[b].end);
    st_write(tmp_path("overlap.safetensors"), &f, m, 0);
    CHECK(load("overlap.safetensors", m) == PT_ERR_FORMAT && msg_has("overlap.safetensors") &&
          msg_has("overlaps") && msg_has("h.0.ln_1"));
    /* a partial overlap: wpe starts 4 bytes inside wte */
    st_from_model(&f, m);
    int p = st_find(&f, "wpe.weight");
    long long pb = atoll(f.e[p].begin), pe = atoll(f.e[p].end);
    snprintf(f.e[p].begin, sizeof f.e[p].begin, "%lld", pb - 4);
    snprintf(f.e[p].end, sizeof f.e[p].end, "%lld", pe - 4);
    st_write(tmp_path("overlap2.safetensors"), &f, m, 0);
    CHECK(load("overlap2.safetensors", m) == PT_ERR_FORMAT && msg_has("overlaps") &&
          msg_has("wpe.weight"));
    pt_model_free(m);
}

static void test_st_gap(void) {
    pt_model *m = new_model();
    if (!m) return;
    st_file f;
    st_from_model(&f, m);
    /* every tensor from wpe on moves 4 bytes up: a hole of 4 bytes */
    int p = st_find(&f, "wpe.weight");
    long long from = atoll(f.e[p].begin);
    for (int i = 0; i < f.n; i++) {
        long long b = atoll(f.e[i].begin), e = atoll(f.e[i].end);
        if (b < from) continue;
        snprintf(f.e[i].begin, sizeof f.e[i].begin, "%lld", b + 4);
        snprintf(f.e[i].end, sizeof f.e[i].end, "%lld", e + 4);
    }
    st_write(tmp_path("gap.safetensors"), &f, m, 4);
    CHECK(load("gap.safetensors", m) == PT_ERR_FORMAT && msg_has("gap.safetensors") &&
          msg_has("4 unused data bytes before tensor 'wpe.weight'"));
    /* bytes after the last tensor belong to no tensor either */
    st_from_model(&f, m);
    st_write(tmp_path("tail.safetensors"), &f, m, 8);
    CHECK(load("tail.safetensors", m) == PT_ERR_FORMAT && msg_has("tail.safetensors") &&
          msg_has("belong to no tensor"));
    pt_model_free(m);
}

static void test_st_header_bytes(void) {
    pt_model *m = new_model();
    if (!m) return;
    st_file f;
    st_from_model(&f, m);
    size_t nd = pt_model_num_params(m) * 4;
    /* NUL padding after the JSON: hidden bytes a C parser never sees */
    st_write_raw(tmp_path("nul.safetensors"), &f, NULL, 4, '\0', pt_model_params(m), nd);
    CHECK(load("nul.safetensors", m) == PT_ERR_FORMAT && msg_has("nul.safetensors") &&
          msg_has("a NUL"));
    /* invalid UTF-8 in a metadata value, in a name */
    snprintf(f.meta, sizeof f.meta, "{\"n_head\":\"2\",\"note\":\"\xff\xfe\"}");
    st_write_raw(tmp_path("utf8.safetensors"), &f, NULL, 0, ' ', pt_model_params(m), nd);
    CHECK(load("utf8.safetensors", m) == PT_ERR_FORMAT && msg_has("utf8.safetensors") &&
          msg_has("not valid UTF-8"));
    st_from_model(&f, m);
    snprintf(f.meta, sizeof f.meta, "{\"n_head\":\"2\",\"note\":\"\xc0\xaf\"}"); /* overlong '/' */
    st_write_raw(tmp_path("overlong.safetensors"), &f, NULL, 0, ' ', pt_model_params(m), nd);
    CHECK(load("overlong.safetensors", m) == PT_ERR_FORMAT && msg_has("not valid UTF-8"));
    /* a NUL spelled as an escape: "wte.weight\u0000x" would load as wte.weight */
    st_from_model(&f, m);
    snprintf(f.e[st_find(&f, "wte.weight")].name, sizeof f.e[0].name, "wte.weight\\u0000x");
    st_write_raw(tmp_path("esc.safetensors"), &f, NULL, 0, ' ', pt_model_params(m), nd);
    CHECK(load("esc.safetensors", m) == PT_ERR_FORMAT && msg_has("esc.safetensors") &&
          msg_has("\\u0000 escape"));
    /* an escaped backslash before "u0000" is text, not a NUL */
    st_from_model(&f, m);
    snprintf(f.meta, sizeof f.meta, "{\"n_head\":\"2\",\"note\":\"C:\\\\u0000\"}");
    st_write_raw(tmp_path("bslash.safetensors"), &f, NULL, 0, ' ', pt_model_params(m), nd);
    CHECK_OK(load("bslash.safetensors", m));
    /* valid UTF-8 is fine */
    snprintf(f.meta, sizeof f.meta, "{\"n_head\":\"2\",\"note\":\"caf\xc3\xa9 \xe2\x82\xac\"}");
    st_write_raw(tmp_path("utf8ok.safetensors"), &f, NULL, 0, ' ', pt_model_params(m), nd);
    CHECK_OK(load("utf8ok.safetensors", m));
    /* something other than whitespace after the object */
    st_from_model(&f, m);
    st_write_raw(tmp_path("after.safetensors"), &f, NULL, 2, 'x', pt_model_params(m), nd);
    CHECK(load("after.safetensors", m) == PT_ERR_FORMAT && msg_has("content after"));
    /* metadata must map strings to strings (what other readers require) */
    snprintf(f.meta, sizeof f.meta, "{\"n_head\":2}");
    st_write_raw(tmp_path("metanum.safetensors"), &f, NULL, 0, ' ', pt_model_params(m), nd);
    CHECK(load("metanum.safetensors", m) == PT_ERR_FORMAT && msg_has("not a string"));
    pt_model_free(m);
}

/* ---- item 11: numbers that are no exact integers ---- */

static void test_st_numbers(void) {
    pt_model *m = new_model();
    if (!m) return;
    st_file f;
    static const char *const shapes[] = {"[1e300]", "[-1]", "[2.5]", "[8.5]", "[1e19]"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        st_from_model(&f, m);
        int b = st_find(&f, "h.0.ln_1.bias"); /* shape [8] */
        snprintf(f.e[b].shape, sizeof f.e[b].shape, "%s", shapes[i]);
        st_write(tmp_path("shape.safetensors"), &f, m, 0);
        CHECK(load("shape.safetensors", m) == PT_ERR_FORMAT && msg_has("h.0.ln_1.bias") &&
              msg_has("shape entry 0 is not an integer"));
    }
    static const char *const offs[][2] = {{"0.5", "32.5"},    {"1e19", "1e19"}, {"-32", "0"},
                                          {"1e300", "1e300"}, {"0", "1e20"},    {"\"0\"", "32"}};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        st_from_model(&f, m);
        int b = st_find(&f, "h.0.ln_1.bias");
        snprintf(f.e[b].begin, sizeof f.e[b].begin, "%s", offs[i][0]);
        snprintf(f.e[b].end, sizeof f.e[b].end, "%s", offs[i][1]);
        st_write(tmp_path("offs.safetensors"), &f, m, 0);
        CHECK(load("offs.safetensors", m) == PT_ERR_FORMAT && msg_has("h.0.ln_1.bias") &&
              msg_has("data offsets are not integers"));
    }
    /* a shape whose element count overflows 64 bits */
    st_from_model(&f, m);
    int b = st_find(&f, "h.0.ln_1.bias");
    snprintf(f.e[b].shape, sizeof f.e[b].shape, "[4294967296,4294967296,4294967296]");
    st_write(tmp_path("huge.safetensors"), &f, m, 0);
    CHECK(load("huge.safetensors", m) == PT_ERR_FORMAT && msg_has("shape too large"));
    pt_model_free(m);
}

/* ---- item 11: bare files (no state.json) ---- */

static const char *bare_dir(const char *name) {
    const char *d = tmp_path(name);
    mkdir(d, 0755);
    return d;
}

static void test_bare_checkpoint(void) {
    pt_model *m = new_model();
    if (!m) return;
    pt_config c;
    /* partrain's own file states n_head: 2 heads of 4 channels (the old
     * guess, n_embd / 64, gave 1) */
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", bare_dir("bare_ours"));
    CHECK_OK(pt_safetensors_save(path, m, pt_model_params(m)));
    CHECK_OK(pt_checkpoint_read_config(tmp_path("bare_ours"), &c));
    CHECK(c.model.n_head == 2 && c.model.n_embd == 8 && c.model.n_layer == 1 &&
          c.model.vocab_size == 16 && c.model.seq_len == 4);
    /* a GPT-2 file does not: refused, not guessed */
    st_file f;
    st_from_model(&f, m);
    f.meta[0] = '\0';
    snprintf(path, sizeof path, "%s/model.safetensors", bare_dir("bare_gpt2"));
    st_write(path, &f, m, 0);
    CHECK(pt_checkpoint_read_config(tmp_path("bare_gpt2"), &c) == PT_ERR_FORMAT &&
          msg_has("bare_gpt2/model.safetensors") && msg_has("n_head") && msg_has("no state.json"));
    /* a stated count that does not divide n_embd */
    st_from_model(&f, m);
    snprintf(f.meta, sizeof f.meta, "{\"n_head\":\"3\"}");
    snprintf(path, sizeof path, "%s/model.safetensors", bare_dir("bare_nh3"));
    st_write(path, &f, m, 0);
    CHECK(pt_checkpoint_read_config(tmp_path("bare_nh3"), &c) == PT_ERR_FORMAT &&
          msg_has("n_head '3'"));
    /* a layer number past any int: no overflow, one line */
    st_from_model(&f, m);
    st_entry *e = &f.e[f.n++];
    snprintf(e->name, sizeof e->name, "h.99999999999999999999.ln_1.weight");
    snprintf(e->shape, sizeof e->shape, "[0]");
    size_t end = pt_model_num_params(m) * 4;
    snprintf(e->begin, sizeof e->begin, "%zu", end);
    snprintf(e->end, sizeof e->end, "%zu", end);
    snprintf(path, sizeof path, "%s/model.safetensors", bare_dir("bare_layer"));
    st_write(path, &f, m, 0);
    CHECK(pt_checkpoint_read_config(tmp_path("bare_layer"), &c) == PT_ERR_FORMAT &&
          msg_has("h.99999999999999999999.") && msg_has("layer number out of range"));
    snprintf(e->name, sizeof e->name, "h.2147483647.ln_1.weight"); /* INT_MAX: + 1 overflowed */
    st_write(path, &f, m, 0);
    CHECK(pt_checkpoint_read_config(tmp_path("bare_layer"), &c) == PT_ERR_FORMAT &&
          msg_has("layer number out of range"));
    /* a wte shape of 1e300 reaches no conversion */
    st_from_model(&f, m);
    snprintf(f.e[st_find(&f, "wte.weight")].shape, sizeof f.e[0].shape, "[1e300,8]");
    snprintf(path, sizeof path, "%s/model.safetensors", bare_dir("bare_1e300"));
    st_write(path, &f, m, 0);
    CHECK(pt_checkpoint_read_config(tmp_path("bare_1e300"), &c) == PT_ERR_FORMAT &&
          msg_has("wte.weight") && msg_has("not an integer"));
    /* neither state.json nor model.safetensors: the message names the file
     * that could not be opened */
    CHECK(pt_checkpoint_read_config(bare_dir("bare_empty"), &c) == PT_ERR_IO &&
          msg_has("bare_empty/model.safetensors") && msg_has("No such file"));
    pt_model_free(m);
}

/* A bare checkpoint of a vocabulary past 65,536: wte's shape (70000, 8)
 * gives vocab_size 70,000 (the cap was 65,536), and the file loads. */
static void test_bare_checkpoint_wide(void) {
    const pt_model_config wide = {1, 8, 2, 70000, 4};
    pt_model *m = NULL;
    CHECK_OK(pt_model_new(&m, &wide, 1));
    if (!m) return;
    pt_model_draw_weights(m, 7);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", bare_dir("bare_wide"));
    CHECK_OK(pt_safetensors_save(path, m, pt_model_params(m)));
    pt_config c;
    CHECK_OK(pt_checkpoint_read_config(tmp_path("bare_wide"), &c));
    CHECK_EQ(c.model.vocab_size, 70000);
    CHECK_EQ(c.model.n_embd, 8);
    float *back = calloc(pt_model_num_params(m), sizeof(float));
    CHECK_OK(pt_safetensors_load(path, m, back));
    CHECK(memcmp(back, pt_model_params(m), pt_model_num_params(m) * sizeof(float)) == 0);
    free(back);
    pt_model_free(m);
}

/* ---- item 12: config JSON ---- */

static void test_config_json(void) {
    pt_config c;
    static const struct {
        const char *json, *want;
    } bad[] = {
        {"{\"train\": {\"lr\": 0.1, \"lr\": 0.2}}", "duplicate key 'train.lr'"},
        {"{\"train\": {\"lr\": 0.1}, \"train\": {\"steps\": 3}}", "duplicate key 'train'"},
        {"{\"train.lr\": 0.1, \"train\": {\"lr\": 0.2}}", "duplicate key 'train.lr'"},
        {"{\"train\": {\"lr\": 0.2}, \"train.lr\": 0.1}", "duplicate key 'train.lr'"},
        {"{\"train.lr\": 0.1, \"train.lr\": 0.2}", "duplicate key 'train.lr'"},
        {"{\"model\": {\"n_layer\": 2}, \"train\": {\"steps\": 3}, \"model.n_layer\": 3}",
         "duplicate key 'model.n_layer'"},
        {"{\"train\": {\"lr\": 0.1}} {\"train\": {\"lr\": 9}}",
         "content after the top-level JSON object at line 1 (byte offset 23)"},
        {"{\"train\": {\"lr\": 0.1}}\n\n  x", "content after the top-level JSON object at line 3"},
        {"{}]", "content after the top-level JSON object at line 1 (byte offset 2)"},
        {"{\"data\": {\"train\": \"a.txt\\u0000.bin\"}}", "\\u0000 escape"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pt_config_defaults(&c);
        CHECK(pt_config_load_string(&c, bad[i].json, "cfg.json") != PT_OK && msg_has("cfg.json") &&
              msg_has(bad[i].want));
    }
    /* distinct keys, nested and dotted, and trailing whitespace are fine */
    pt_config_defaults(&c);
    CHECK_OK(pt_config_load_string(&c, "{\"train.lr\": 0.1, \"train\": {\"steps\": 3}}\n  \n",
                                   "cfg.json"));
    CHECK(c.train.lr == 0.1 && c.train.steps == 3);
    /* a checkpoint's state.json is one object too */
    mkdir(tmp_path("state2"), 0755);
    const char st2[] = "{\"config\": {\"model\": {\"n_layer\": 1}}}\n{\"config\": {}}\n";
    write_bytes(tmp_path("state2/state.json"), st2, sizeof st2 - 1);
    CHECK(pt_checkpoint_read_config(tmp_path("state2"), &c) == PT_ERR_FORMAT &&
          msg_has("state2/state.json") && msg_has("not one JSON object"));
    /* its own fields: a step, data_rng's two 64-bit words in hex (no sign:
     * strtoull alone read "-5" as 2^64 - 5), rank_state's pipeline start
     * no later than the step */
    const struct {
        const char *json, *want; /* want NULL: accepted */
    } fields[] = {
        {"{\"step\": 3, \"data_rng\": {\"key\": \"00ff\", \"counter\": \"1\"}}", NULL},
        {"{\"step\": 3, \"data_rng\": {\"key\": \"-5\", \"counter\": \"1\"}}", "bad data_rng"},
        {"{\"step\": 3, \"data_rng\": {\"key\": \" 5\", \"counter\": \"1\"}}", "bad data_rng"},
        {"{\"step\": 3, \"data_rng\": {\"key\": \"10000000000000000\", \"counter\": \"1\"}}",
         "bad data_rng"},
        {"{\"step\": 3, \"data_rng\": {\"key\": \"1\", \"counter\": \"1\"}, "
         "\"rank_state\": {\"ranks\": 2, \"pipeline_start\": 4}}",
         "bad rank_state"},
        {"{\"step\": -1, \"data_rng\": {\"key\": \"1\", \"counter\": \"1\"}}", "bad step"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        cJSON *root = NULL;
        pt_ckpt_state cs;
        CHECK_OK(pt_ckpt_parse_state(fields[i].json, "s/state.json", &root));
        pt_status st = pt_ckpt_state_fields(root, "s/state.json", &cs);
        if (!fields[i].want)
            CHECK(st == PT_OK && cs.step == 3 && cs.key == 0xff && cs.counter == 1);
        else
            CHECK(st == PT_ERR_FORMAT && msg_has("s/state.json") && msg_has(fields[i].want));
        cJSON_Delete(root);
    }
    /* a NUL in a config file would hide what follows it */
    write_bytes(tmp_path("nul.json"), "{\"train\": {}}\0{\"x\": 1}", 22);
    pt_config_defaults(&c);
    CHECK(pt_config_load_file(&c, tmp_path("nul.json")) == PT_ERR_FORMAT && msg_has("nul.json") &&
          msg_has("NUL byte at offset 13"));
}

/* ---- item 13: data files ---- */

static pt_status open_bytes(const char *name, const void *p, size_t n) {
    write_bytes(tmp_path(name), p, n);
    pt_data *d = NULL;
    pt_status st = pt_data_open(&d, tmp_path(name), 256);
    pt_data_free(d);
    return st;
}

static void test_data_rule(void) {
    /* a .bin name needs llm.c's magic */
    char text[2000];
    for (size_t i = 0; i < sizeof text; i++) text[i] = "hello world "[i % 12];
    CHECK(open_bytes("text.bin", text, sizeof text) == PT_ERR_FORMAT && msg_has("text.bin") &&
          msg_has("magic"));
    CHECK(open_bytes("small.bin", "abc", 3) == PT_ERR_FORMAT && msg_has("small.bin") &&
          msg_has("shorter than the 1024-byte header"));
    /* the magic makes a token file whatever the name */
    int32_t hdr[256] = {20240520, 1, 3};
    unsigned char tok[1024 + 6];
    memcpy(tok, hdr, sizeof hdr);
    uint16_t t3[3] = {65, 66, 67};
    memcpy(tok + 1024, t3, 6);
    write_bytes(tmp_path("tokens.txt"), tok, sizeof tok);
    pt_data *d = NULL;
    CHECK_OK(pt_data_open(&d, tmp_path("tokens.txt"), 256));
    CHECK(d && pt_data_num_tokens(d) == 3);
    pt_data_free(d);
    /* text: UTF-8 without NUL, the first bad byte named */
    CHECK(open_bytes("nul.txt", "abc\0def", 7) == PT_ERR_FORMAT && msg_has("nul.txt") &&
          msg_has("byte 3 (0x00) is a NUL"));
    static const struct {
        const char *bytes;
        size_t n, at;
    } bad[] = {
        {"ab\xc3\x28", 4, 2},       /* bad continuation */
        {"a\xc0\xaf", 3, 1},        /* overlong */
        {"ab\xed\xa0\x80", 5, 2},   /* surrogate */
        {"\xf4\x90\x80\x80", 4, 0}, /* above U+10FFFF */
        {"abc\xe2\x82", 5, 3},      /* cut off at the end */
        {"x\x80", 2, 1},            /* stray continuation */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "byte %zu (0x%02x) is not valid UTF-8", bad[i].at,
                 (unsigned char)bad[i].bytes[bad[i].at]);
        CHECK(open_bytes("bad.txt", bad[i].bytes, bad[i].n) == PT_ERR_FORMAT &&
              msg_has("bad.txt") && msg_has(want));
    }
    const char ok[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbb\xbf";
    CHECK_OK(open_bytes("ok.txt", ok, sizeof ok - 1));
    CHECK_EQ(pt_mem_current(PT_MEM_SCRATCH), 0);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-untrusted-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_st_valid_baseline);
    RUN(test_st_overlap);
    RUN(test_st_gap);
    RUN(test_st_header_bytes);
    RUN(test_st_numbers);
    RUN(test_bare_checkpoint);
    RUN(test_bare_checkpoint_wide);
    RUN(test_config_json);
    RUN(test_data_rule);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_DONE();
}
