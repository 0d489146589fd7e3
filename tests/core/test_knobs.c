/* Debugging knobs (src/core/knobs.c): defaults, values from the
 * environment, bad values (reported, default used), read once until
 * pt_knobs_reread; and the three places that must agree: the table, the
 * rows of "Debugging knobs" in docs/architecture.md (same names, same
 * defaults), and the sources (no file under src/ but knobs.c calls getenv
 * for a knob). */
#include "partrain/core.h"
#include "pt_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void set(const char *name, const char *value) {
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    pt_knobs_reread();
}

static void test_int(void) {
    set("PT_SHM_SLOTS", NULL);
    CHECK_EQ(pt_knob_int("PT_SHM_SLOTS"), 2);
    CHECK_EQ(pt_knob_is_set("PT_SHM_SLOTS"), 0);
    set("PT_SHM_SLOTS", "5");
    CHECK_EQ(pt_knob_int("PT_SHM_SLOTS"), 5);
    CHECK_EQ(pt_knob_is_set("PT_SHM_SLOTS"), 1);
    /* read once: a later change is not seen until reread */
    setenv("PT_SHM_SLOTS", "7", 1);
    CHECK_EQ(pt_knob_int("PT_SHM_SLOTS"), 5);
    pt_knobs_reread();
    CHECK_EQ(pt_knob_int("PT_SHM_SLOTS"), 7);
    set("PT_SHM_SLOTS", "1"); /* below the range: the default (and a warning) */
    CHECK_EQ(pt_knob_int("PT_SHM_SLOTS"), 2);
    set("PT_SHM_SLOTS", "3x"); /* not an integer */
    CHECK_EQ(pt_knob_int("PT_SHM_SLOTS"), 2);
    CHECK_EQ(pt_knob_is_set("PT_SHM_SLOTS"), 1);
    set("PT_SHM_SLOTS", ""); /* empty: unset */
    CHECK_EQ(pt_knob_int("PT_SHM_SLOTS"), 2);
    CHECK_EQ(pt_knob_is_set("PT_SHM_SLOTS"), 0);
    set("PT_SHM_SLOTS", NULL);
}

static void test_float_and_string(void) {
    set("PT_SHM_SPIN_US", "0.5");
    CHECK_NEAR(pt_knob_float("PT_SHM_SPIN_US"), 0.5, 0, 0);
    set("PT_SHM_SPIN_US", NULL);
    CHECK_NEAR(pt_knob_float("PT_SHM_SPIN_US"), -1, 0, 0);
    set("PT_GEMM", "blas");
    CHECK(!strcmp(pt_knob_str("PT_GEMM"), "blas"));
    set("PT_GEMM", "fast"); /* not a choice */
    CHECK(!strcmp(pt_knob_str("PT_GEMM"), "auto"));
    set("PT_GEMM", NULL);
    CHECK(!strcmp(pt_knob_str("PT_GEMM"), "auto"));
}

static int find_knob(const char *name) {
    int n;
    const pt_knob_info *k = pt_knob_table(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(k[i].name, name)) return i;
    return -1;
}

/* Every row of the docs table is a knob with the table's default, and
 * every knob has a row. */
static void test_docs_table(void) {
    char *doc = NULL;
    CHECK_OK(pt_read_text_file(PT_SOURCE_DIR "/docs/architecture.md", 1 << 22, &doc));
    if (!doc) return;
    char *sec = strstr(doc, "### Debugging knobs");
    CHECK(sec != NULL);
    if (!sec) {
        free(doc);
        return;
    }
    char *end = strstr(sec + 1, "\n#");
    if (end) *end = '\0';
    int n;
    const pt_knob_info *k = pt_knob_table(&n);
    int *rows = calloc((size_t)n, sizeof *rows);
    for (char *p = strstr(sec, "\n| `"); p; p = strstr(p + 1, "\n| `")) {
        char name[64], type[64], def[64];
        if (sscanf(p, "\n| `%63[^`]` | %63[^|]| %63[^ |]", name, type, def) != 3) continue;
        int i = find_knob(name);
        if (i < 0) {
            fprintf(stderr, "docs row %s: no such knob\n", name);
            CHECK(i >= 0);
            continue;
        }
        rows[i]++;
        if (strcmp(def, k[i].def)) fprintf(stderr, "%s: docs %s, table %s\n", name, def, k[i].def);
        CHECK(!strcmp(def, k[i].def));
    }
    for (int i = 0; i < n; i++) {
        if (rows[i] != 1) fprintf(stderr, "%s: %d docs rows\n", k[i].name, rows[i]);
        CHECK_EQ(rows[i], 1);
    }
    free(rows);
    free(doc);
}

/* Files under dir (recursively) other than src/core/knobs.c that call
 * getenv for a knob. */
static int getenv_readers(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int bad = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            bad += getenv_readers(path);
            continue;
        }
        size_t len = strlen(path);
        if (len < 2 || strcmp(path + len - 2, ".c") || strstr(path, "/src/core/knobs.c")) continue;
        char *text = NULL;
        if (pt_read_text_file(path, 1 << 24, &text) != PT_OK) continue;
        int n;
        const pt_knob_info *k = pt_knob_table(&n);
        for (int i = 0; i < n; i++) {
            char call[96];
            snprintf(call, sizeof call, "getenv(\"%s\")", k[i].name);
            if (strstr(text, call)) {
                fprintf(stderr, "%s reads %s itself (use pt_knob_*)\n", path, k[i].name);
                bad++;
            }
        }
        free(text);
    }
    closedir(d);
    return bad;
}

static void test_one_reader(void) {
    CHECK_EQ(getenv_readers(PT_SOURCE_DIR "/src"), 0);
}

int main(void) {
    RUN(test_int);
    RUN(test_float_and_string);
    RUN(test_docs_table);
    RUN(test_one_reader);
    return TEST_DONE();
}
