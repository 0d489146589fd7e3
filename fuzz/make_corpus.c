/* Writes the seed corpus of the fuzz targets into DIR/<target>/: real
 * files of the tiny model that fuzz_safetensors loads (a checkpoint, a
 * two-group rank file, a GPT-2-style file) and near-valid variants, small
 * configs, and data files (first byte: fuzz_data's selector). Run by hand
 * when the formats change: fuzz_make_corpus fuzz/corpus (the files of configs/
 * are copied into corpus/config by hand too). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train_impl.h"

static const char *dir;

static void put(const char *target, const char *name, const void *a, size_t na, const void *b,
                size_t nb) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || (na && fwrite(a, 1, na, f) != na) || (nb && fwrite(b, 1, nb, f) != nb)) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    if (fread(b, 1, *n, f) != *n) exit(1);
    fclose(f);
    return b;
}

static void safetensors_seeds(void) {
    static const pt_model_config tiny = {1, 8, 2, 16, 4}; /* as fuzz_safetensors.c */
    pt_model *m = NULL;
    if (pt_model_new(&m, &tiny, 1) != PT_OK) exit(1);
    pt_model_draw_weights(m, 3);
    char tmp[] = "/tmp/pt-corpus-XXXXXX.safetensors";
    int fd = mkstemps(tmp, 12);
    if (fd < 0) exit(1);
    size_t n;
    if (pt_safetensors_save(tmp, m, pt_model_params(m)) != PT_OK) exit(1);
    unsigned char *b = slurp(tmp, &n);
    put("safetensors", "model.safetensors", b, n, NULL, 0);
    put("safetensors", "truncated.safetensors", b, n - 5, NULL, 0);
    b[n - 1] ^= 1; /* data only: still valid */
    put("safetensors", "extra.safetensors", b, n, "\0\0\0\0", 4);
    free(b);
    pt_ckpt_group g[2] = {{"m", pt_model_params(m)}, {"v", pt_model_params(m)}};
    const char *meta[] = {"rank", "0", "ranks", "2", NULL};
    if (pt_st_write_groups(tmp, m, meta, g, 2) != PT_OK) exit(1);
    b = slurp(tmp, &n);
    put("safetensors", "rank0.safetensors", b, n, NULL, 0);
    free(b);
    /* GPT-2's layout: transformer. prefix, a mask buffer, no metadata */
    char hdr[8192];
    int at =
        snprintf(hdr, sizeof hdr,
                 "{\"h.0.attn.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}");
    for (int i = 0; i < pt_model_num_tensors(m); i++) {
        const pt_param_info *t = pt_model_tensor(m, i);
        char shape[64];
        if (t->ndim == 2)
            snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)t->shape[0],
                     (long long)t->shape[1]);
        else
            snprintf(shape, sizeof shape, "[%lld]", (long long)t->shape[0]);
        at += snprintf(hdr + at, sizeof hdr - (size_t)at,
                       ",\"transformer.%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%zu,"
                       "%zu]}",
                       t->name, shape, 4 + t->offset * 4, 4 + (t->offset + t->numel) * 4);
    }
    at += snprintf(hdr + at, sizeof hdr - (size_t)at, "}");
    size_t data = 4 + pt_model_num_params(m) * 4;
    unsigned char *file = calloc(1, 8 + (size_t)at + data);
    uint64_t hl = (uint64_t)at;
    memcpy(file, &hl, 8);
    memcpy(file + 8, hdr, (size_t)at);
    memcpy(file + 8 + at + 4, pt_model_params(m), data - 4);
    put("safetensors", "gpt2.safetensors", file, 8 + (size_t)at + data, NULL, 0);
    free(file);
    remove(tmp);
    pt_model_free(m);
}

static void config_seeds(void) {
    static const char *const c[] = {
        "{\"model\": {\"n_layer\": 2, \"n_embd\": 32, \"n_head\": 4}, \"train\": {\"lr\": 0.001}}",
        "{\"train.lr\": 0.001, \"parallel\": {\"dp\": 2, \"zero\": 1}, \"data.train\": \"x.txt\"}",
        "{\"train\": {\"lr\": 0.1, \"lr\": 0.2}}",
        "{\"train\": {\"steps\": 3}} {}",
        "{\"parallel\": {\"sync\": \"local_sgd\", \"overlap\": false}, \"log.every\": 5}",
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "seed%zu.json", i);
        put("config", name, c[i], strlen(c[i]), NULL, 0);
    }
}

static void data_seeds(void) {
    /* selector byte: bit 0 .bin name, bit 1 vocab 256, bit 2 vocab 50257,
     * bit 3 vocab 128256 */
    const char text[] = "the quick brown fox jumps over the lazy dog. caf\xc3\xa9 \xe2\x82\xac";
    put("data", "text.txt", "\x02", 1, text, sizeof text - 1);
    put("data", "nul.txt", "\x02", 1, "ab\0cd", 5);
    put("data", "utf8bad.txt", "\x02", 1, "ab\xc3\x28zz", 6);
    int32_t h[256] = {20240520, 1, 8};
    unsigned char bin[1024 + 16];
    memcpy(bin, h, sizeof h);
    for (int i = 0; i < 8; i++) {
        uint16_t t = (uint16_t)(i * 7);
        memcpy(bin + 1024 + 2 * i, &t, 2);
    }
    put("data", "tokens.bin", "\x07", 1, bin, sizeof bin);
    put("data", "tokens-as-txt", "\x06", 1, bin, sizeof bin);
    put("data", "text.bin", "\x03", 1, text, sizeof text - 1);
    /* llm.c's uint32 file (magic 20240801, version 7): ids past a uint16
     * under Llama 3's vocabulary (selector bit 3), and the same file under
     * 50257, where its second token is out of range */
    int32_t w[256] = {20240801, 7, 6}; /* 6 tokens: one window of 4 + 1 read back */
    unsigned char wide[1024 + 24];
    memcpy(wide, w, sizeof w);
    const uint32_t ids[6] = {0, 70000, 128255, 65535, 65536, 1};
    memcpy(wide + 1024, ids, sizeof ids);
    put("data", "tokens32.bin", "\x09", 1, wide, sizeof wide);
    put("data", "tokens32-vocab.bin", "\x05", 1, wide, sizeof wide);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_corpus DIR\n");
        return 2;
    }
    dir = argv[1];
    mkdir(dir, 0755);
    safetensors_seeds();
    config_seeds();
    data_seeds();
    return 0;
}
