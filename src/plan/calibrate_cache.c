/* partrain calibrate: the profile's file and the cache (calibrate.h) --
 * the JSON is the cluster writer's own (pt_cluster_to_json, so that what
 * calibrate writes is what the loader reads), written whole or not at all;
 * the cache is $XDG_CACHE_HOME/partrain/ (else ~/.cache/partrain/),
 * profile-<hash of the CPU model, the binary and the options>.json, valid
 * while the file loads and names this CPU and binary.
 *
 * Not here: the measurement (calibrate.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "calibrate_impl.h"

char *pt_calibration_to_json(const pt_calibration *c) {
    return pt_cluster_to_json(&c->cluster); /* cluster.c's writer: the loader's own format */
}

/* The last error's message behind prefix (copied first: it is the buffer
 * being set). */
static pt_status prefix_error(pt_status st, const char *prefix) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_error_message());
    return pt_error_set(st, "%s%s", prefix, msg);
}

pt_status pt_calibrate_check_out(const char *path) {
    if (!path || !*path) return pt_error_set(PT_ERR_INVALID, "calibrate: --out: empty path");
    pt_status st = pt_file_check_output(path, 0);
    return st == PT_OK ? PT_OK : prefix_error(st, "calibrate: --out ");
}

pt_status pt_calibrate_write(const pt_calibration *c, const char *path) {
    /* the path before the text: a directory or a missing folder is the
     * path's error, whatever the profile holds */
    pt_status st = pt_file_check_output(path, 0);
    if (st != PT_OK) return prefix_error(st, "calibrate: ");
    pt_error_clear();
    char *text = pt_calibration_to_json(c);
    if (!text && pt_error_message()[0]) /* the writer's refusal names the number */
        return prefix_error(PT_ERR_INVALID, "calibrate: the profile would not load back: ");
    if (!text) return pt_error_set(PT_ERR_NOMEM, "calibrate: the profile's JSON");
    size_t len = strlen(text);
    char *line = realloc(text, len + 2);
    if (!line) {
        free(text);
        return pt_error_set(PT_ERR_NOMEM, "calibrate: the profile's JSON");
    }
    line[len] = '\n';
    /* whole or not at all: a failure leaves path as it was and no temporary */
    st = pt_file_write_atomic(path, line, len + 1);
    free(line);
    return st == PT_OK ? PT_OK : prefix_error(st, "calibrate: ");
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* The cache folder: $XDG_CACHE_HOME/partrain or $HOME/.cache/partrain. */
static pt_status cache_dir(char *dir, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int len;
    if (xdg && *xdg)
        len = snprintf(dir, n, "%s/partrain", xdg);
    else if (home && *home)
        len = snprintf(dir, n, "%s/.cache/partrain", home);
    else
        return pt_error_set(PT_ERR_INVALID,
                            "calibrate: no cache folder (XDG_CACHE_HOME and HOME unset)");
    if (len < 0 || (size_t)len >= n)
        return pt_error_set(PT_ERR_INVALID, "calibrate: cache folder path too long");
    return PT_OK;
}

/* mkdir -p of dir (the cache's folders). */
static pt_status make_dirs(const char *dir) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1;; p++) {
        int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return pt_error_set(PT_ERR_IO, "calibrate: cannot create %s: %s", tmp,
                                    strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    return PT_OK;
}

pt_status pt_calibrate_cache_path(const pt_calibrate_options *o, char *path, size_t n) {
    char dir[4096], cpu[PT_PLAN_NAME_MAX], binary[PT_PLAN_NAME_MAX];
    PT_CHECK(cache_dir(dir, sizeof dir));
    PT_CHECK(make_dirs(dir));
    pt_calibrate_identity(cpu, binary);
    uint64_t h = 14695981039346656037ull;
    h = fnv1a(h, cpu, strlen(cpu) + 1);
    h = fnv1a(h, binary, strlen(binary) + 1);
    const pt_model_config *models;
    int n_models;
    pt_calib_models_of(o, &models, &n_models);
    for (int i = 0; i < n_models; i++) {
        int s[4] = {models[i].n_embd, models[i].n_head, models[i].vocab_size, models[i].seq_len};
        h = fnv1a(h, s, sizeof s);
    }
    int q[2] = {o->quick, o->threads};
    h = fnv1a(h, q, sizeof q);
    int len = snprintf(path, n, "%s/profile-%016llx.json", dir, (unsigned long long)h);
    if (len < 0 || (size_t)len >= n)
        return pt_error_set(PT_ERR_INVALID, "calibrate: cache path too long");
    return PT_OK;
}

/* Whether path holds a profile measured by this binary on this CPU: the
 * cluster loader accepts it and its profile names both. */
static int cache_valid(const char *path) {
    pt_cluster *cl = NULL;
    if (pt_cluster_load_file(&cl, path) != PT_OK) {
        pt_error_clear();
        return 0;
    }
    char cpu[PT_PLAN_NAME_MAX], binary[PT_PLAN_NAME_MAX];
    pt_calibrate_identity(cpu, binary);
    int ok = cl->profile && !strcmp(cl->profile->cpu, cpu) && !strcmp(cl->profile->binary, binary);
    pt_cluster_free(cl);
    return ok;
}

pt_status pt_calibrate_cached(const pt_calibrate_options *o, char *path, size_t n, int *measured) {
    if (measured) *measured = 0;
    PT_CHECK(pt_calibrate_cache_path(o, path, n));
    if (cache_valid(path)) return PT_OK;
    PT_CHECK(pt_file_check_output(path, 0)); /* before a minute of measuring */
    pt_calibration c;
    PT_CHECK(pt_calibrate(o, &c));
    pt_status st = pt_calibrate_write(&c, path);
    pt_calibration_deinit(&c);
    if (st == PT_OK && measured) *measured = 1;
    return st;
}
