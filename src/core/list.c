/* The comma lists of config values (core.h, "comma lists"): one grammar
 * and one set of messages for every key whose value is a list, so that
 * "2, 2" and "2,2" mean the same for parallel.stage_layers as for
 * model.stage_recompute, and an empty entry is refused by all of them
 * alike.
 *
 *   list  = "" | entry { "," entry }
 *   entry = blanks item blanks        blanks: spaces and tabs, any number
 *   item  = one or more characters, no comma, not starting or ending in a blank
 *   number = "0" | digit1-9 { digit }  (no sign, no leading zero), <= a limit
 *
 * Not here: what an entry means (the key's own parser: train/config.c,
 * parallel/stages.c). */
#include "partrain/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int blank(char c) {
    return c == ' ' || c == '\t';
}

void pt_list_init(pt_list *l, const char *key, const char *value) {
    l->key = key;
    l->value = value ? value : "";
    l->at = l->value[0] ? l->value : NULL; /* "": no entry at all */
    l->index = 0;
    l->item[0] = '\0';
}

int pt_list_next(pt_list *l) {
    if (!l->at) return 0;
    const char *s = l->at, *comma = strchr(s, ',');
    const char *end = comma ? comma : s + strlen(s);
    l->at = comma ? comma + 1 : NULL;
    l->index++;
    while (s < end && blank(*s)) s++;
    while (end > s && blank(end[-1])) end--;
    size_t n = (size_t)(end - s);
    if (n >= sizeof l->item) n = sizeof l->item - 1;
    memcpy(l->item, s, n);
    l->item[n] = '\0';
    if (s == end)
        return pt_error_set(PT_ERR_INVALID,
                            "%s = \"%s\": entry %d is empty (a list is entries separated by "
                            "commas, none of them empty)",
                            l->key, l->value, l->index);
    return 1;
}

int pt_list_uint(const char *s, long max, long *v) {
    if (!(*s >= '0' && *s <= '9') || (s[0] == '0' && s[1])) return 0;
    long x = 0;
    int over = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        long d = *s - '0';
        /* x * 10 + d > max, asked without overflowing: x <= max / 10 first */
        if (!over && (x > max / 10 || x * 10 > max - d)) over = 1;
        if (!over) x = x * 10 + d;
    }
    if (*s) return 0;
    if (over) return -1;
    *v = x;
    return 1;
}

pt_status pt_list_number(const pt_list *l, long max, const char *limit_name, long *v) {
    int r = pt_list_uint(l->item, max, v);
    if (r > 0) return PT_OK;
    if (r < 0)
        return pt_error_set(PT_ERR_INVALID, "%s = \"%s\": entry %d (%s) is over the limit %ld (%s)",
                            l->key, l->value, l->index, l->item, max, limit_name);
    return pt_list_error(l, "is not a non-negative integer (decimal digits: no sign, no leading "
                            "zero)");
}

pt_status pt_list_error(const pt_list *l, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return pt_error_set(PT_ERR_INVALID, "%s = \"%s\": entry %d ('%s') %s", l->key, l->value,
                        l->index, l->item, what);
}
