/* Data files (src/train/data.c): text and llm.c's .bin, its 16-bit
 * (magic 20240520, version 1) and 32-bit (20240801, version 7) files, the
 * windows read back, bad files as one message naming the file and the
 * offset, and pt_data_write choosing the narrow file whenever it can. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "partrain/train.h"
#include "pt_test.h"
#include "pt_test_files.h"

static void write_text(const char *path, size_t n) {
    static const char pattern[] = "the quick brown fox jumps over the lazy dog. ";
    char *s = malloc(n);
    for (size_t i = 0; i < n; i++) s[i] = pattern[i % (sizeof pattern - 1)];
    write_bytes(path, s, n);
    free(s);
}

static int msg_has(const char *s) {
    int ok = strstr(pt_error_message(), s) != NULL;
    if (!ok) fprintf(stderr, "  message '%s' lacks '%s'\n", pt_error_message(), s);
    return ok;
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static void write_bin(const char *path, const uint16_t *tok, int n, int magic, int version,
                      int count) {
    int32_t header[256] = {0};
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    FILE *f = fopen(path, "wb");
    fwrite(header, 4, 256, f);
    fwrite(tok, 2, (size_t)n, f);
    fclose(f);
}

static void test_data(void) {
    pt_data *d = NULL;
    write_text(tmp_path("t.txt"), 100);
    CHECK_OK(pt_data_open(&d, tmp_path("t.txt"), 256));
    CHECK_EQ(pt_data_num_tokens(d), 100);
    CHECK_EQ(pt_data_num_windows(d, 9), 10);
    int x[9], y[9];
    pt_data_window(d, 1, 9, x, y);
    CHECK_EQ(x[0], 'b'); /* token 10 of the pattern */
    CHECK_EQ(y[0], 'r');
    pt_rng r;
    pt_rng_init(&r, 1, "d");
    int xs[18], ys[18];
    pt_data_sample(d, &r, 2, 9, xs, ys);
    CHECK_EQ(r.counter > 0, 1);
    CHECK_EQ(xs[1], ys[0]);
    pt_data_free(d);

    uint16_t tok[5] = {1, 2, 3, 4, 5};
    write_bin(tmp_path("ok.bin"), tok, 5, 20240520, 1, 5);
    CHECK_OK(pt_data_open(&d, tmp_path("ok.bin"), 6));
    CHECK_EQ(pt_data_num_tokens(d), 5);
    pt_data_free(d);
    d = NULL;
    CHECK(pt_data_open(&d, tmp_path("ok.bin"), 5) == PT_ERR_FORMAT && d == NULL);
    CHECK(msg_has("ok.bin") && msg_has("offset 4") && msg_has("vocab_size"));
    write_bin(tmp_path("short.bin"), tok, 3, 20240520, 1, 5);
    CHECK(pt_data_open(&d, tmp_path("short.bin"), 256) == PT_ERR_FORMAT && msg_has("short.bin"));
    write_bin(tmp_path("v2.bin"), tok, 5, 20240520, 2, 5);
    CHECK(pt_data_open(&d, tmp_path("v2.bin"), 256) == PT_ERR_FORMAT && msg_has("version"));
    write_bytes(tmp_path("empty.txt"), "", 0);
    CHECK(pt_data_open(&d, tmp_path("empty.txt"), 256) == PT_ERR_FORMAT && msg_has("empty.txt") &&
          msg_has("empty"));
    CHECK(pt_data_open(&d, tmp_path("missing.txt"), 256) == PT_ERR_IO && msg_has("missing.txt"));
    CHECK(pt_data_open(&d, tmpdir, 256) != PT_OK && d == NULL);
    CHECK_EQ(pt_mem_current(PT_MEM_SCRATCH), 0);
}

static int same_bytes(const char *p, const char *q) {
    FILE *a = fopen(p, "rb"), *b = fopen(q, "rb");
    int same = a && b;
    while (same) {
        int ca = fgetc(a), cb = fgetc(b);
        same = ca == cb;
        if (ca == EOF) break;
    }
    if (a) fclose(a);
    if (b) fclose(b);
    return same;
}

/* llm.c's uint32 variant (magic 20240801, version 7): ids above 65,535
 * read back whole, are checked against the vocabulary, and the writer
 * picks the narrow file whenever the tokens fit it. */
static void test_data_wide(void) {
    pt_data *d = NULL;
    int tok[6] = {70000, 128255, 3, 65535, 65536, 1};
    CHECK_OK(pt_data_write(tmp_path("wide.bin"), tok, 6));
    CHECK_EQ(file_size(tmp_path("wide.bin")), 1024 + 4 * 6);
    CHECK_OK(pt_data_open(&d, tmp_path("wide.bin"), 128256));
    if (d) {
        CHECK_EQ(pt_data_num_tokens(d), 6);
        int x[5], y[5];
        pt_data_window(d, 0, 5, x, y);
        for (int i = 0; i < 5; i++) {
            CHECK_EQ(x[i], tok[i]);
            CHECK_EQ(y[i], tok[i + 1]);
        }
        pt_data_free(d);
        d = NULL;
    }
    CHECK(pt_data_open(&d, tmp_path("wide.bin"), 128255) == PT_ERR_FORMAT && d == NULL);
    CHECK(msg_has("wide.bin") && msg_has("token 128255") && msg_has("offset 1") &&
          msg_has("byte 1028"));
    /* all below 65,536: the uint16 file, bitwise what llm.c's GPT-2 files are */
    int narrow[5] = {1, 2, 3, 4, 65535};
    CHECK_OK(pt_data_write(tmp_path("narrow.bin"), narrow, 5));
    CHECK_EQ(file_size(tmp_path("narrow.bin")), 1024 + 2 * 5);
    uint16_t n16[5] = {1, 2, 3, 4, 65535};
    write_bin(tmp_path("narrow-ref.bin"), n16, 5, 20240520, 1, 5);
    CHECK(same_bytes(tmp_path("narrow.bin"), tmp_path("narrow-ref.bin")));
    /* the writer refuses what no .bin can hold */
    int neg[2] = {1, -1};
    CHECK(pt_data_write(tmp_path("neg.bin"), neg, 2) == PT_ERR_INVALID && msg_has("negative"));
    CHECK(pt_data_write(tmp_path("none.bin"), neg, 0) == PT_ERR_INVALID && msg_has("none.bin"));
    /* the same ids in either file: the same windows and the same draws */
    enum { NS = 400, TS = 7 };
    int ids[NS];
    uint32_t ids32[NS];
    for (int i = 0; i < NS; i++) ids32[i] = (uint32_t)(ids[i] = (i * 7919 + 11) % 65536);
    CHECK_OK(pt_data_write(tmp_path("ids16.bin"), ids, NS));
    CHECK_EQ(file_size(tmp_path("ids16.bin")), 1024 + 2 * NS);
    int32_t h32[256] = {20240801, 7, NS};
    FILE *f = fopen(tmp_path("ids32.bin"), "wb");
    fwrite(h32, 4, 256, f);
    fwrite(ids32, 4, NS, f);
    fclose(f);
    pt_data *d16 = NULL, *d32 = NULL;
    CHECK_OK(pt_data_open(&d16, tmp_path("ids16.bin"), 65536));
    CHECK_OK(pt_data_open(&d32, tmp_path("ids32.bin"), 65536));
    if (d16 && d32) {
        int x16[4 * TS], y16[4 * TS], x32[4 * TS], y32[4 * TS];
        pt_data_window(d16, 3, TS, x16, y16);
        pt_data_window(d32, 3, TS, x32, y32);
        CHECK(memcmp(x16, x32, sizeof(int) * TS) == 0 && memcmp(y16, y32, sizeof(int) * TS) == 0);
        CHECK_EQ(x16[0], ids[3 * (TS + 1)]);
        pt_rng r16, r32;
        pt_rng_init(&r16, 5, "d");
        pt_rng_init(&r32, 5, "d");
        pt_data_sample(d16, &r16, 4, TS, x16, y16);
        pt_data_sample(d32, &r32, 4, TS, x32, y32);
        CHECK(memcmp(x16, x32, sizeof x16) == 0 && memcmp(y16, y32, sizeof y16) == 0);
    }
    pt_data_free(d16);
    pt_data_free(d32);
    /* each magic takes its own version and width only */
    int32_t hdr[256] = {20240801, 1, 2};
    f = fopen(tmp_path("mixed.bin"), "wb");
    fwrite(hdr, 4, 256, f);
    fwrite(n16, 2, 4, f); /* 2 uint32 tokens' bytes */
    fclose(f);
    CHECK(pt_data_open(&d, tmp_path("mixed.bin"), 256) == PT_ERR_FORMAT && msg_has("version 1") &&
          msg_has("20240801"));
    hdr[1] = 7;
    f = fopen(tmp_path("short32.bin"), "wb");
    fwrite(hdr, 4, 256, f);
    fwrite(n16, 2, 2, f); /* one uint32 token's bytes, two promised */
    fclose(f);
    CHECK(pt_data_open(&d, tmp_path("short32.bin"), 256) == PT_ERR_FORMAT &&
          msg_has("short32.bin") && msg_has("4 bytes"));
    write_bin(tmp_path("v7.bin"), n16, 4, 20240520, 7, 2);
    CHECK(pt_data_open(&d, tmp_path("v7.bin"), 65536) == PT_ERR_FORMAT && msg_has("version 7"));
    CHECK_EQ(pt_mem_current(PT_MEM_SCRATCH), 0);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pt-test-data-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_data);
    RUN(test_data_wide);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return TEST_DONE();
}
