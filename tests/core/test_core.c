/* Core: status messages, the counting allocator (categories, peaks, injected
 * failure), input files (regular files only, never blocking on a FIFO)
 * and the counter-based RNG (reference vector, layout independence,
 * distribution moments). */
#include "partrain/core.h"
#include "pt_test.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static void test_status(void) {
    CHECK(!strcmp(pt_status_name(PT_ERR_IO), "PT_ERR_IO"));
    CHECK(!strcmp(pt_status_str(PT_ERR_NOMEM), "out of memory"));
    pt_status s = pt_error_set(PT_ERR_INVALID, "bad key %s", "model.x");
    CHECK_EQ(s, PT_ERR_INVALID);
    CHECK(!strcmp(pt_error_message(), "bad key model.x"));
    pt_error_clear();
    CHECK(!strcmp(pt_error_message(), ""));
    pt_error_set(PT_ERR_IO, "agreed");
    CHECK(!pt_error_is_shared());
    pt_error_mark_shared();
    CHECK(pt_error_is_shared());
    pt_error_set(PT_ERR_IO, "another");
    CHECK(!pt_error_is_shared());
    pt_error_mark_shared();
    pt_error_clear();
    CHECK(!pt_error_is_shared());
    /* pt_error_wrap: PT_OK passes untouched; an error gets the prefix */
    pt_error_set(PT_ERR_IO, "left alone");
    CHECK_EQ(pt_error_wrap(PT_OK, "pipeline %s", "send"), PT_OK);
    CHECK(!strcmp(pt_error_message(), "left alone"));
    pt_error_set(PT_ERR_IO, "peer gone");
    CHECK_EQ(pt_error_wrap(PT_ERR_IO, "pipeline %s", "send of wte"), PT_ERR_IO);
    CHECK(!strcmp(pt_error_message(), "pipeline send of wte: peer gone"));
    pt_error_clear();
}

/* The file:line trail of PT_CHECK: the message never changes. */
static pt_status fail_io(void) {
    return pt_error_set(PT_ERR_IO, "disk full");
}
static int line_inner, line_outer;
static pt_status inner(void) {
    line_inner = __LINE__ + 1;
    PT_CHECK(fail_io());
    return PT_OK;
}
static pt_status outer(void) {
    line_outer = __LINE__ + 1;
    PT_CHECK(inner());
    return PT_OK;
}
static pt_status deep(int n) {
    if (n == 0) return fail_io();
    PT_CHECK(deep(n - 1));
    return PT_OK;
}
static pt_status with_goto(void) {
    pt_status st = PT_OK;
    PT_CHECK_GOTO(st, fail_io(), done);
done:
    return st;
}

static void test_trail(void) {
    pt_error_clear();
    CHECK(!strcmp(pt_error_trail(), ""));
    CHECK_EQ(outer(), PT_ERR_IO);
    CHECK(!strcmp(pt_error_message(), "disk full")); /* unchanged */
    char want[128];
    snprintf(want, sizeof want, "core/test_core.c:%d <- core/test_core.c:%d", line_inner,
             line_outer);
    if (strcmp(pt_error_trail(), want)) fprintf(stderr, "trail '%s'\n", pt_error_trail());
    CHECK(!strcmp(pt_error_trail(), want));
    /* a message that wraps the last one keeps its trail; a new one does not */
    pt_error_set(PT_ERR_IO, "saving x: %s", pt_error_message());
    CHECK(!strcmp(pt_error_trail(), want));
    pt_error_set(PT_ERR_INVALID, "something else");
    CHECK(!strcmp(pt_error_trail(), ""));
    CHECK_EQ(with_goto(), PT_ERR_IO);
    CHECK(strstr(pt_error_trail(), "core/test_core.c:") == pt_error_trail());
    /* a long chain ends in "..." and stays bounded */
    CHECK_EQ(deep(200), PT_ERR_IO);
    size_t n = strlen(pt_error_trail());
    CHECK(n < 512);
    CHECK(n > 7 && !strcmp(pt_error_trail() + n - 7, " <- ..."));
    pt_error_clear();
    CHECK(!strcmp(pt_error_trail(), ""));
}

static void test_mem(void) {
    size_t base = pt_mem_current(PT_MEM_PARAMS);
    void *a = pt_mem_alloc(PT_MEM_PARAMS, 1000);
    void *b = pt_mem_alloc(PT_MEM_GRADS, 24);
    CHECK(a && b);
    CHECK_EQ((uintptr_t)a % 64, 0);
    CHECK_EQ(pt_mem_current(PT_MEM_PARAMS), base + 1000);
    CHECK(((unsigned char *)a)[999] == 0);
    pt_mem_free(a);
    CHECK_EQ(pt_mem_current(PT_MEM_PARAMS), base);
    CHECK(pt_mem_peak(PT_MEM_PARAMS) >= base + 1000);
    pt_mem_reset_peak();
    CHECK_EQ(pt_mem_peak(PT_MEM_PARAMS), base);
    pt_mem_fail_after(2);
    void *c = pt_mem_alloc(PT_MEM_ACTS, 8);
    void *d = pt_mem_alloc(PT_MEM_ACTS, 8);
    CHECK(c != NULL);
    CHECK(d == NULL);
    CHECK(strstr(pt_error_message(), "acts") != NULL);
    pt_mem_free(c);
    pt_mem_free(b);
    pt_mem_free(NULL);
}

/* Blocks of 2 MiB and more come from a mapping of their own (2 MiB aligned
 * outside ASan): still zero, counted, writable to the last byte, freed. */
static void test_mem_large(void) {
    size_t base = pt_mem_current(PT_MEM_GRADS), n = (3u << 20) + 100;
    unsigned char *a = pt_mem_alloc(PT_MEM_GRADS, n), *b = pt_mem_alloc(PT_MEM_GRADS, n);
    CHECK(a && b);
    CHECK_EQ((uintptr_t)a % 64, 0);
    CHECK_EQ(pt_mem_current(PT_MEM_GRADS), base + 2 * n);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i += 4093) nonzero += a[i] != 0;
    CHECK_EQ(nonzero + (a[n - 1] != 0), 0);
    memset(a, 0xab, n);
    memset(b, 0xcd, n); /* the blocks do not overlap */
    CHECK(a[n - 1] == 0xab && a[0] == 0xab && b[0] == 0xcd);
    pt_mem_free(a);
    pt_mem_free(b);
    CHECK_EQ(pt_mem_current(PT_MEM_GRADS), base);
}

/* pt_read_text_file: the content NUL-terminated; a missing file and one over
 * the cap fail naming the path. */
static void test_read_text_file(void) {
    char path[] = "/tmp/pt-test-core-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    for (int i = 0; i < 3000; i++) fputs("abc", f); /* 9000 bytes: crosses a read */
    fclose(f);
    char *text = NULL;
    CHECK_OK(pt_read_text_file(path, 9000, &text));
    CHECK(text && strlen(text) == 9000 && text[8999] == 'c');
    free(text);
    CHECK_EQ(pt_read_text_file(path, 8999, &text), PT_ERR_FORMAT);
    CHECK(text == NULL && strstr(pt_error_message(), path));
    unlink(path);
    CHECK_EQ(pt_read_text_file(path, 100, &text), PT_ERR_IO);
    CHECK(strstr(pt_error_message(), path));
}

/* Expect pt_file_open_regular and pt_read_text_file to refuse path with
 * one message naming it and saying what it is. */
static void expect_refused(const char *path, const char *kind) {
    FILE *f = (FILE *)1;
    uint64_t size = 1;
    CHECK_EQ(pt_file_open_regular(path, &f, &size), PT_ERR_IO);
    CHECK(f == NULL && size == 0);
    const char *m = pt_error_message();
    if (!strstr(m, path) || !strstr(m, kind) || strchr(m, '\n'))
        fprintf(stderr, "  message '%s' should name %s and say '%s'\n", m, path, kind);
    CHECK(strstr(m, path) && strstr(m, kind) && !strchr(m, '\n'));
    char *text = (char *)1;
    CHECK_EQ(pt_read_text_file(path, 100, &text), PT_ERR_IO);
    CHECK(text == NULL && strstr(pt_error_message(), kind));
}

/* Every input path goes through pt_file_open_regular: a regular file opens
 * (with its size); a FIFO (which would block a plain open until a writer
 * came), a directory, a socket and a device are refused at once by name.
 * alarm(): a regression that blocks fails here instead of hanging. */
static void test_open_regular(void) {
    char dir[] = "/tmp/pt-test-open-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[96]; /* short: a socket's path must fit sun_path */
    alarm(20);
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *w = fopen(path, "w");
    CHECK(w != NULL);
    fputs("hello", w);
    fclose(w);
    FILE *f = NULL;
    uint64_t size = 0;
    CHECK_OK(pt_file_open_regular(path, &f, &size));
    CHECK(f != NULL && size == 5);
    char buf[8] = {0};
    CHECK(f && fread(buf, 1, sizeof buf, f) == 5 && !strcmp(buf, "hello"));
    if (f) fclose(f);
    CHECK_OK(pt_file_open_regular(path, &f, NULL)); /* size not wanted */
    if (f) fclose(f);

    snprintf(path, sizeof path, "%s/fifo", dir);
    CHECK(mkfifo(path, 0644) == 0);
    expect_refused(path, "a FIFO");
    expect_refused(dir, "a directory");
    expect_refused("/dev/null", "a character device");
    snprintf(path, sizeof path, "%s/sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    CHECK(strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    expect_refused(path, "a socket");
    close(s);
    snprintf(path, sizeof path, "%s/missing", dir);
    CHECK_EQ(pt_file_open_regular(path, &f, NULL), PT_ERR_IO);
    CHECK(strstr(pt_error_message(), path) && strstr(pt_error_message(), "No such file"));
    alarm(0);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void test_philox_known_answer(void) {
    /* Random123's known-answer test for philox4x32_10 with counter and key
     * all ones (kat_vectors: ffffffff... -> 408f276d 41c83b0e a20bc7c6 6d5451fd). */
    uint32_t w[4];
    pt_philox(0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull, w);
    CHECK_EQ(w[0], 0x408f276du);
    CHECK_EQ(w[1], 0x41c83b0eu);
    CHECK_EQ(w[2], 0xa20bc7c6u);
    CHECK_EQ(w[3], 0x6d5451fdu);
    pt_philox(0, 0, 0, w);
    CHECK_EQ(w[0], 0x6627e8d5u);
    CHECK_EQ(w[1], 0xe169c58du);
    CHECK_EQ(w[2], 0xbc57ac4cu);
    CHECK_EQ(w[3], 0x9b00dbd8u);
}

static void test_rng_layout_independent(void) {
    /* Element i of a tensor is the same whether drawn alone or in a sweep. */
    uint64_t k = pt_rng_key(1337, "h.0.attn.c_attn.weight");
    float all[64];
    for (int i = 0; i < 64; i++) all[i] = pt_rng_normal_at(k, (uint64_t)i);
    for (int i = 63; i >= 0; i -= 7) CHECK(pt_rng_normal_at(k, (uint64_t)i) == all[i]);
    CHECK(pt_rng_key(1337, "a") != pt_rng_key(1337, "b"));
    CHECK(pt_rng_key(1, "a") != pt_rng_key(2, "a"));
}

static void test_rng_moments(void) {
    uint64_t k = pt_rng_key(7, "moments");
    double s = 0, s2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = pt_rng_normal_at(k, (uint64_t)i);
        s += x;
        s2 += x * x;
    }
    CHECK_NEAR(s / n, 0.0, 0.01, 0);
    CHECK_NEAR(s2 / n, 1.0, 0.01, 0);
    pt_rng r;
    pt_rng_init(&r, 7, "stream");
    int counts[10] = {0};
    for (int i = 0; i < 100000; i++) counts[pt_rng_below(&r, 10)]++;
    for (int i = 0; i < 10; i++) CHECK_NEAR(counts[i], 10000, 500, 0);
    CHECK_EQ(r.counter, 100000);
}

int main(void) {
    RUN(test_status);
    RUN(test_trail);
    RUN(test_mem);
    RUN(test_mem_large);
    RUN(test_read_text_file);
    RUN(test_open_regular);
    RUN(test_philox_known_answer);
    RUN(test_rng_layout_independent);
    RUN(test_rng_moments);
    return TEST_DONE();
}
