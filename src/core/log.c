/* Logging to stderr with an optional rank prefix, and monotonic clocks. */
#include "partrain/core.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_level = -1; /* -1: not yet read from PT_LOG */
static int log_rank = -1;

static int level_from_env(void) {
    const char *e = pt_knob_str("PT_LOG");
    if (!strcmp(e, "debug")) return PT_LOG_DEBUG;
    if (!strcmp(e, "warn")) return PT_LOG_WARN;
    if (!strcmp(e, "error")) return PT_LOG_ERROR;
    return PT_LOG_INFO;
}

void pt_log_set_level(pt_log_level level) {
    log_level = (int)level;
}

void pt_log_set_rank(int rank) {
    log_rank = rank;
}

void pt_log(pt_log_level level, const char *fmt, ...) {
    if (log_level < 0) log_level = level_from_env();
    if ((int)level < log_level) return;
    static const char *const tags[] = {"debug", "info", "warn", "error"};
    char line[2048];
    int n = log_rank >= 0 ? snprintf(line, sizeof line, "[rank %d] %s: ", log_rank, tags[level])
                          : snprintf(line, sizeof line, "partrain %s: ", tags[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line so that lines from several ranks do not interleave. */
    fprintf(stderr, "%s\n", line);
}

uint64_t pt_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double pt_time_s(void) {
    return (double)pt_time_ns() * 1e-9;
}
