/* Status names and messages, the thread-local last-error message, and the
 * assertion failure path. */
#include "partrain/core.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];
static _Thread_local int last_shared;
/* The PT_CHECK lines the last error passed, "a.c:1 <- b.c:2"; full: it
 * ends in " <- ..." and takes no more. */
static _Thread_local char trail[512];
static _Thread_local size_t trail_len;

const char *pt_status_name(pt_status s) {
    switch (s) {
#define PT_X_CASE(name, value, msg)                                                                \
    case name:                                                                                     \
        return #name;
        PT_STATUS_LIST(PT_X_CASE)
#undef PT_X_CASE
    }
    return "PT_ERR_UNKNOWN";
}

const char *pt_status_str(pt_status s) {
    switch (s) {
#define PT_X_CASE(name, value, msg)                                                                \
    case name:                                                                                     \
        return msg;
        PT_STATUS_LIST(PT_X_CASE)
#undef PT_X_CASE
    }
    return "unknown error";
}

pt_status pt_error_set(pt_status s, const char *fmt, ...) {
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap); /* the arguments may be last_error itself */
    va_end(ap);
    /* A message that wraps the last one ("loading x: <last>") continues its
     * trail; any other starts afresh. */
    if (!last_error[0] || !strstr(msg, last_error)) {
        trail[0] = '\0';
        trail_len = 0;
    }
    memcpy(last_error, msg, sizeof msg);
    last_shared = 0;
    return s;
}

pt_status pt_error_wrap(pt_status st, const char *fmt, ...) {
    if (st == PT_OK) return st;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return pt_error_set(st, "%s: %s", prefix, last_error);
}

const char *pt_error_trail(void) {
    return trail;
}

void pt_error_trace(const char *file, int line) {
    static const char more[] = " <- ...";
    if (trail_len + sizeof more > sizeof trail) return; /* full, and says so */
    const char *last = NULL, *prev = NULL; /* the last two parts of the path: "comm/comm.c" */
    for (const char *p = file; *p; p++)
        if (*p == '/') {
            prev = last;
            last = p;
        }
    char frame[160];
    snprintf(frame, sizeof frame, "%s%s:%d", trail_len ? " <- " : "", prev ? prev + 1 : file, line);
    size_t n = strlen(frame);
    if (trail_len + n + sizeof more > sizeof trail) { /* the last that fits */
        memcpy(trail + trail_len, more, sizeof more);
        trail_len = sizeof trail;
        return;
    }
    memcpy(trail + trail_len, frame, n + 1);
    trail_len += n;
}

const char *pt_error_message(void) {
    return last_error;
}

void pt_error_clear(void) {
    last_error[0] = '\0';
    last_shared = 0;
    trail[0] = '\0';
    trail_len = 0;
}

void pt_error_mark_shared(void) {
    last_shared = 1;
}

int pt_error_is_shared(void) {
    return last_shared;
}

void pt_assert_fail(const char *file, int line, const char *expr, const char *msg) {
    fprintf(stderr, "partrain: %s:%d: assertion failed: %s%s%s\n", file, line, expr,
            msg ? ": " : "", msg ? msg : "");
    fflush(stderr);
    abort();
}

void pt_assert_fail_eq(const char *file, int line, const char *expr, long long a, long long b) {
    fprintf(stderr, "partrain: %s:%d: assertion failed: %s (%lld vs %lld)\n", file, line, expr, a,
            b);
    fflush(stderr);
    abort();
}
