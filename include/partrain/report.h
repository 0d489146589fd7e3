/* partrain report: one self-contained HTML file of charts from the metrics
 * of one or more training runs (`partrain report RUN_DIR... [--out FILE]`,
 * docs/report.md).
 *
 * A RUN is what a training run's log.metrics file holds: a run record
 * (layout, config, machine, version, the plan's prediction), one line per
 * step, per validation and per checkpoint save (trainer_metrics.c writes
 * them). A RUN_DIR is a directory holding metrics.jsonl (the default
 * configs write runs/NAME/metrics.jsonl), or the metrics file itself.
 *
 * Lifecycle: pt_report_run_load (or _parse) each run -> pt_report_write
 * (or pt_report_data_json) over them -> pt_report_run_free each.
 *
 * The metrics file is untrusted input: every line is parsed on its own; a
 * line that is not JSON, a field missing or of another type, a number out
 * of range is skipped and said in the run's notes, never an error, so that
 * a run killed half-way (its last line cut) or one of an older version
 * still gets a report of what it has. Only a file with no line of a run at
 * all is refused. fuzz/fuzz_metrics.c fuzzes the parser.
 *
 * Not here: the drawing (src/report/report.js, run in the browser, on the
 * vendored uPlot in third_party/uplot/). */
#ifndef PARTRAIN_REPORT_H
#define PARTRAIN_REPORT_H

#include <stddef.h>

#include "partrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pt_report_run pt_report_run;

/* Read the run at path: a directory holding metrics.jsonl, or a metrics
 * file (opened with pt_file_open_regular). The run's trace (its config's
 * log.trace, else trace.json beside the metrics) is found, not read.
 * Errors, one line naming path: missing, neither a run directory nor a
 * regular file, unreadable, no line of a run in it. */
pt_status pt_report_run_load(pt_report_run **out, const char *path);
/* The same from text (n bytes, any bytes): the parser alone; name labels
 * the run and its messages. */
pt_status pt_report_run_parse(pt_report_run **out, const char *text, size_t n, const char *name);
void pt_report_run_free(pt_report_run *r);

/* What the report says is missing from the run ("no trace", "line 41 is
 * cut short: ..."), k < pt_report_run_notes. */
int pt_report_run_notes(const pt_report_run *r);
const char *pt_report_run_note(const pt_report_run *r, int k);
/* Steps read. */
size_t pt_report_run_steps(const pt_report_run *r);

/* The report's data, one JSON object for report.js (malloc'd text; NULL
 * when out of memory): every run's series (at most PT_REPORT_MAX_POINTS a
 * series, means of consecutive steps beyond that), its parts per rank
 * averaged over its steps, traffic per group, memory per rank, the plan,
 * config, machine and notes. */
#define PT_REPORT_MAX_POINTS 2000
char *pt_report_data_json(pt_report_run *const *runs, int n);

/* Write the HTML file at path (checked with pt_file_check_output, written
 * atomically with pt_out): uPlot, our script and the data inline, nothing
 * fetched. */
pt_status pt_report_write(const char *path, pt_report_run *const *runs, int n);

#ifdef __cplusplus
}
#endif
#endif
