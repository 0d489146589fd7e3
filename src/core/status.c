/* Status names and messages, the thread-local last-error message, and the
 * assertion failure path. */
#include "partrain/core.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024];
static _Thread_local int last_shared;

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
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    last_shared = 0;
    return s;
}

const char *pt_error_message(void) {
    return last_error;
}

void pt_error_clear(void) {
    last_error[0] = '\0';
    last_shared = 0;
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
