/* Scratch files for tests: one temporary directory per test executable
 * (tmpdir, made by the test), paths inside it, and whole files written at
 * once. Header-only and static, like pt_test.h; shared so that each test
 * does not carry its own copy. */
#ifndef PT_TEST_FILES_H
#define PT_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>

static char tmpdir[256];

/* tmpdir/name in one of 8 rotating buffers (valid until 8 more calls). */
static inline const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

/* Write n bytes to path; a failure ends the test (it is the test's own setup). */
static inline void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    if ((n && fwrite(p, 1, n, f) != n) | (fclose(f) != 0)) {
        perror(path);
        exit(1);
    }
}

#endif
