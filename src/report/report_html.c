/* The report's file: one HTML page holding everything it needs, so that it
 * opens from disk in any browser with nothing fetched: uPlot's style and
 * script (third_party/uplot), ours (report.css, report.js) and the data
 * (report_data.c) inline, all embedded into the library at build time
 * (cmake/embed.cmake). A Content-Security-Policy allows inline scripts and
 * styles only: a request the page would make is refused by the browser
 * (and shows as an error in its console, which test_report_browser
 * watches).
 *
 * The data goes in a <script type="application/json"> element, every '<'
 * written \u003c (JSON's own escape), so that no string of a run (a path, a
 * config value) can end the element.
 *
 * Not here: what the data holds (report_data.c), the drawing (report.js). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_impl.h"

/* report_assets.c, generated */
extern const char pt_report_uplot_js[], pt_report_uplot_css[], pt_report_js[], pt_report_css[];

static pt_status put(pt_out *o, const char *s) {
    return pt_out_write(o, s, strlen(s));
}

/* s with & < > " as entities (a title) */
static pt_status put_text(pt_out *o, const char *s) {
    pt_status st = PT_OK;
    for (; *s && st == PT_OK; s++) {
        const char *e = *s == '&'   ? "&amp;"
                        : *s == '<' ? "&lt;"
                        : *s == '>' ? "&gt;"
                        : *s == '"' ? "&quot;"
                                    : NULL;
        st = e ? put(o, e) : pt_out_write(o, s, 1);
    }
    return st;
}

/* JSON text with every '<' as \u003c */
static pt_status put_json(pt_out *o, const char *s) {
    pt_status st = PT_OK;
    while (*s && st == PT_OK) {
        const char *lt = strchr(s, '<');
        size_t n = lt ? (size_t)(lt - s) : strlen(s);
        st = pt_out_write(o, s, n);
        if (st == PT_OK && lt) st = put(o, "\\u003c");
        s += n + (lt != NULL);
    }
    return st;
}

static const char HEAD[] =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
    "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>";

static pt_status write_page(pt_out *o, pt_report_run *const *runs, int n, const char *data) {
    PT_CHECK(put(o, HEAD));
    PT_CHECK(put(o, "partrain report: "));
    for (int i = 0; i < n; i++) {
        if (i) PT_CHECK(put(o, ", "));
        PT_CHECK(put_text(o, runs[i]->name));
    }
    PT_CHECK(put(o, "</title>\n<style>\n"));
    PT_CHECK(put(o, pt_report_uplot_css));
    PT_CHECK(put(o, "\n</style>\n<style>\n"));
    PT_CHECK(put(o, pt_report_css));
    PT_CHECK(put(o, "\n</style>\n</head>\n<body>\n<noscript>This report draws its charts with "
                    "JavaScript: allow it for this file.</noscript>\n<main id=\"report\"></main>\n"
                    "<script type=\"application/json\" id=\"pt-data\">"));
    PT_CHECK(put_json(o, data));
    PT_CHECK(put(o, "</script>\n<script>\n"));
    PT_CHECK(put(o, pt_report_uplot_js));
    PT_CHECK(put(o, "\n</script>\n<script>\n"));
    PT_CHECK(put(o, pt_report_js));
    return put(o, "\n</script>\n</body>\n</html>\n");
}

pt_status pt_report_write(const char *path, pt_report_run *const *runs, int n) {
    char *data = pt_report_data_json(runs, n);
    if (!data) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory building the report", path);
    pt_out *o = NULL;
    pt_status st = pt_out_open(&o, path);
    if (st == PT_OK) st = write_page(o, runs, n, data);
    free(data);
    if (!o) return st;
    if (st != PT_OK) {
        pt_out_abort(o);
        return st;
    }
    return pt_out_commit(o);
}
