/* partrain flight DIR|PREFIX: merge the flight recorder dumps of a dead job
 * (log.flight: one JSON file per surviving rank, docs/comm.md "Flight
 * recorder") and print the first mismatch: one summary line, then the
 * details (each involved group's last operations on every rank).
 *
 * What counts as the first mismatch, in this order:
 *  1. operations out of order: a group's collective #N differs between two
 *     ranks (op, bytes or root), or a rank ran #N+1 while its #N stayed
 *     queued (a deferred collective); the earliest such #N, by wall time;
 *  2. otherwise the stuck collective: of those some rank was in when the
 *     job died (running or failed), one with a laggard before one without
 *     (every member in it: stopped with the job), then the one the most
 *     ranks were in, the earliest of equals; its laggards are the members that never issued
 *     it (they issued fewer collectives on the group), or issued it and
 *     never ran it, or left no dump (killed, or stopped and then killed).
 *
 * Dumps are input like any file: each field is checked, and a file that
 * is not a dump is one line naming it. Times: each dump's monotonic clock
 * is moved onto wall time by its own (real_ns - mono_ns), so that hosts
 * line up as well as their clocks do.
 *
 * Not here: the recorder and the live analysis (src/comm/comm_flight*.c). */
#include "cli_impl.h"

#include <cjson/cJSON.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "partrain/comm.h"

enum { S_NONE, S_QUEUED, S_RUNNING, S_DONE, S_FAILED };
#define OP_SPLIT  PT_OP_COUNT
#define MAX_RANKS 4096

typedef struct {
    uint64_t seq, bytes;
    double q, t0, t1; /* wall seconds (0: none) */
    int op, peer, state;
} f_op;

typedef struct {
    char name[64];
    uint64_t id, coll;
    int rank, size, nmem, nops;
    int *members;
    f_op *ops;
} f_comm;

typedef struct {
    char path[1024], reason[512];
    int rank, world, ncomms;
    f_comm *comms;
} f_dump;

typedef struct {
    f_dump *d;
    int n;
    double t_origin; /* the earliest time in any dump */
} f_job;

static void usage(FILE *f) {
    fprintf(f, "usage: partrain flight DIR|PREFIX\n\n"
               "Merge the flight recorder dumps of a dead job (log.flight: DIR/flight-rankR.json\n"
               "or PREFIX-rankR.json, one per surviving rank) and print the first mismatch:\n"
               "operations out of order in a group (a collective #N that differs between ranks,\n"
               "or one a rank deferred), else the collective the job was stuck in and the ranks\n"
               "that never arrived, with what each of them last completed. Then each involved\n"
               "group's last operations on every rank.\n");
}

/* ---- reading ---- */

static int op_code(const char *s) {
    if (!strcmp(s, "split")) return OP_SPLIT;
    for (int k = 0; k < PT_OP_COUNT; k++)
        if (!strcmp(s, pt_comm_op_name((pt_comm_op)k))) return k;
    return -1;
}

static const char *op_text(int op) {
    return op == OP_SPLIT ? "split" : pt_comm_op_name((pt_comm_op)op);
}

static int state_code(const char *s) {
    static const char *n[] = {"none", "queued", "running", "done", "failed"};
    for (int k = 0; k <= S_FAILED; k++)
        if (!strcmp(s, n[k])) return k;
    return -1;
}

static int is_p2p(int op) {
    return op == PT_OP_SEND || op == PT_OP_RECV;
}

/* Number field `key` of o into *v; 0 when missing or not a number. */
static int num(const cJSON *o, const char *key, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x)) return 0;
    *v = x->valuedouble;
    return 1;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static pt_status read_op(const cJSON *o, double off, f_op *op, const char *path) {
    double seq, bytes, peer, q, t0, t1;
    const char *name = str(o, "op"), *state = str(o, "state");
    if (!num(o, "seq", &seq) || !num(o, "bytes", &bytes) || !num(o, "peer", &peer) ||
        !num(o, "queued_ns", &q) || !num(o, "start_ns", &t0) || !num(o, "end_ns", &t1) || !name ||
        !state || op_code(name) < 0 || state_code(state) < 0 || seq < 0 || bytes < 0)
        return pt_error_set(PT_ERR_FORMAT, "%s: an operation with missing or bad fields", path);
    op->seq = (uint64_t)seq;
    op->bytes = (uint64_t)bytes;
    op->op = op_code(name);
    op->peer = (int)peer;
    op->state = state_code(state);
    op->t0 = t0 > 0 ? (t0 + off) * 1e-9 : 0;
    op->t1 = t1 > 0 ? (t1 + off) * 1e-9 : 0;
    op->q = q > 0 ? (q + off) * 1e-9 : op->t0;
    return PT_OK;
}

static pt_status read_comm(const cJSON *o, double off, f_comm *c, const char *path) {
    double id = 0, rank, size, coll;
    const char *name = str(o, "name"), *ids = str(o, "id");
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "members");
    const cJSON *ops = cJSON_GetObjectItemCaseSensitive(o, "ops");
    if (!name || !ids || !num(o, "rank", &rank) || !num(o, "size", &size) ||
        !num(o, "collectives", &coll) || !cJSON_IsArray(mem) || !cJSON_IsArray(ops) || size < 1 ||
        size > MAX_RANKS || rank < 0 || rank >= size)
        return pt_error_set(PT_ERR_FORMAT, "%s: a group with missing or bad fields", path);
    (void)id;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->id = strtoull(ids, NULL, 16);
    c->rank = (int)rank;
    c->size = (int)size;
    c->coll = (uint64_t)coll;
    c->nmem = cJSON_GetArraySize(mem);
    c->nops = cJSON_GetArraySize(ops);
    c->members = calloc((size_t)c->nmem + 1, sizeof *c->members);
    c->ops = calloc((size_t)c->nops + 1, sizeof *c->ops);
    if (!c->members || !c->ops) return pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    int k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, mem) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= MAX_RANKS)
            return pt_error_set(PT_ERR_FORMAT, "%s: group %s: a bad member", path, name);
        c->members[k++] = (int)x->valuedouble;
    }
    k = 0;
    cJSON_ArrayForEach(x, ops) PT_CHECK(read_op(x, off, &c->ops[k++], path));
    return PT_OK;
}

static pt_status read_dump(const char *path, f_dump *d) {
    char *text = NULL;
    PT_CHECK(pt_read_text_file(path, 64u << 20, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    double mark = 0, rank, world, mono, real;
    const cJSON *comms = root ? cJSON_GetObjectItemCaseSensitive(root, "comms") : NULL;
    if (!root || !num(root, "partrain_flight", &mark) || !num(root, "rank", &rank) ||
        !num(root, "world", &world) || !num(root, "mono_ns", &mono) ||
        !num(root, "real_ns", &real) || !cJSON_IsArray(comms) || rank < 0 || world < 1 ||
        world > MAX_RANKS || rank >= world) {
        cJSON_Delete(root);
        return pt_error_set(PT_ERR_FORMAT, "%s: not a partrain flight dump", path);
    }
    snprintf(d->path, sizeof d->path, "%s", path);
    snprintf(d->reason, sizeof d->reason, "%s", str(root, "reason") ? str(root, "reason") : "");
    d->rank = (int)rank;
    d->world = (int)world;
    d->ncomms = cJSON_GetArraySize(comms);
    d->comms = calloc((size_t)d->ncomms + 1, sizeof *d->comms);
    pt_status st = d->comms ? PT_OK : pt_error_set(PT_ERR_NOMEM, "%s: out of memory", path);
    int k = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, comms) {
        if (st == PT_OK) st = read_comm(x, real - mono, &d->comms[k++], path);
    }
    cJSON_Delete(root);
    return st;
}

static void job_free(f_job *j) {
    for (int i = 0; i < j->n; i++) {
        for (int c = 0; c < j->d[i].ncomms; c++) {
            free(j->d[i].comms[c].members);
            free(j->d[i].comms[c].ops);
        }
        free(j->d[i].comms);
    }
    free(j->d);
}

/* The dumps of DIR (flight-rank*.json) or PREFIX (PREFIX-rank*.json). */
static pt_status read_job(const char *where, f_job *j) {
    struct stat sb;
    char pattern[1100];
    if (stat(where, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(pattern, sizeof pattern, "%s/flight-rank*.json", where);
    else
        snprintf(pattern, sizeof pattern, "%s-rank*.json", where);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        globfree(&g);
        return pt_error_set(PT_ERR_IO, "%s: no flight dumps (%s)", where, pattern);
    }
    j->d = calloc(g.gl_pathc, sizeof *j->d);
    pt_status st = j->d ? PT_OK : pt_error_set(PT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == PT_OK && i < g.gl_pathc; i++)
        st = read_dump(g.gl_pathv[i], &j->d[j->n++]);
    globfree(&g);
    j->t_origin = 0;
    for (int i = 0; i < j->n; i++)
        for (int c = 0; c < j->d[i].ncomms; c++)
            for (int k = 0; k < j->d[i].comms[c].nops; k++) {
                double t = j->d[i].comms[c].ops[k].q;
                if (t > 0 && (j->t_origin == 0 || t < j->t_origin)) j->t_origin = t;
            }
    return st;
}

/* ---- merging ---- */

static const f_dump *dump_of(const f_job *j, int rank) {
    for (int i = 0; i < j->n; i++)
        if (j->d[i].rank == rank) return &j->d[i];
    return NULL;
}

static const f_comm *comm_of(const f_dump *d, uint64_t id) {
    for (int c = 0; d && c < d->ncomms; c++)
        if (d->comms[c].id == id) return &d->comms[c];
    return NULL;
}

/* Collective #seq in c's ring (NULL: not there). */
static const f_op *op_at(const f_comm *c, uint64_t seq) {
    for (int k = 0; c && k < c->nops; k++)
        if (!is_p2p(c->ops[k].op) && c->ops[k].seq == seq) return &c->ops[k];
    return NULL;
}

static int differs(const f_op *a, const f_op *b) {
    return a->op != b->op || a->bytes != b->bytes ||
           (a->op == PT_OP_BROADCAST && a->peer != b->peer);
}

static void bytes_text(uint64_t b, char *out, size_t len) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0 || v == (double)(uint64_t)v)
        snprintf(out, len, "%.0f %s", v, unit[u]);
    else
        snprintf(out, len, "%.3g %s", v, unit[u]);
}

/* "allreduce #5 (64 KiB)" */
static void op_words(const f_op *o, char *out, size_t len) {
    char b[32];
    bytes_text(o->bytes, b, sizeof b);
    snprintf(out, len, "%s #%llu (%s)", op_text(o->op), (unsigned long long)o->seq, b);
}

typedef struct {
    int kind; /* 0 none, 1 differs, 2 deferred, 3 stuck */
    double t;
    const f_comm *c; /* the group, as one of its ranks dumped it */
    uint64_t seq;
    int r1, r2;        /* differs: the two ranks; deferred: r1 */
    const f_op *a, *b; /* differs: r1's and r2's #seq; deferred: #seq and the one run instead */
    int waiters;       /* stuck: ranks in it */
    double waited;     /* stuck: how long the longest of them was in it */
} finding;

static void consider(finding *f, const finding *g) {
    if (!f->kind || g->t < f->t) *f = *g;
}

/* Operations out of order: the earliest. */
static finding out_of_order(const f_job *j) {
    finding f = {0};
    for (int i = 0; i < j->n; i++)
        for (int c = 0; c < j->d[i].ncomms; c++) {
            const f_comm *a = &j->d[i].comms[c];
            for (int k = 0; k < a->nops; k++) {
                const f_op *o = &a->ops[k];
                if (is_p2p(o->op)) continue;
                /* deferred: a later collective of the group ran while this one waited */
                for (int m = 0; o->state == S_QUEUED && m < a->nops; m++)
                    if (!is_p2p(a->ops[m].op) && a->ops[m].seq > o->seq &&
                        a->ops[m].state != S_QUEUED)
                        consider(&f, &(finding){2, a->ops[m].t0, a, o->seq, j->d[i].rank, -1, o,
                                                &a->ops[m], 0, 0});
                for (int i2 = i + 1; i2 < j->n; i2++) {
                    const f_op *o2 = op_at(comm_of(&j->d[i2], a->id), o->seq);
                    if (o2 && differs(o, o2))
                        consider(&f, &(finding){1, o->q < o2->q ? o->q : o2->q, a, o->seq,
                                                j->d[i].rank, j->d[i2].rank, o, o2, 0, 0});
                }
            }
        }
    return f;
}

/* The collective the most ranks were in when the job died. */
static int laggards_of(const f_job *j, const f_comm *g, uint64_t seq, int *lag, int *why, int max);

static finding stuck(const f_job *j) {
    finding f = {0};
    int f_lags = 0; /* f has a laggard: preferred, as in pt_flight_describe */
    for (int i = 0; i < j->n; i++)
        for (int c = 0; c < j->d[i].ncomms; c++) {
            const f_comm *a = &j->d[i].comms[c];
            for (int k = 0; k < a->nops; k++) {
                const f_op *o = &a->ops[k];
                if (is_p2p(o->op) || (o->state != S_RUNNING && o->state != S_FAILED)) continue;
                finding g = {3, o->t0, a, o->seq, -1, -1, o, NULL, 0, 0};
                for (int i2 = 0; i2 < j->n; i2++) {
                    const f_op *o2 = op_at(comm_of(&j->d[i2], a->id), o->seq);
                    if (!o2 || (o2->state != S_RUNNING && o2->state != S_FAILED)) continue;
                    g.waiters++;
                    if (o2->t0 > 0 && o2->t0 < g.t) g.t = o2->t0;
                    if (o2->t1 > o2->t0 && o2->t1 - o2->t0 > g.waited) g.waited = o2->t1 - o2->t0;
                }
                int lag[64], why[64], lags = laggards_of(j, a, o->seq, lag, why, 64) > 0;
                if (!f.kind || lags > f_lags ||
                    (lags == f_lags &&
                     (g.waiters > f.waiters || (g.waiters == f.waiters && g.t < f.t))))
                    f = g, f_lags = lags;
            }
        }
    return f;
}

/* The members of group g that did not run its collective #seq: lag[i]
 * with why[i] 0 (never issued it: fewer collectives there), 1 (issued it,
 * never ran it) or 2 (no dump); how many (at most max). */
static int laggards_of(const f_job *j, const f_comm *g, uint64_t seq, int *lag, int *why, int max) {
    int n = 0;
    for (int m = 0; m < g->nmem && n < max; m++) {
        int r = g->members[m];
        const f_dump *d = dump_of(j, r);
        const f_comm *c = comm_of(d, g->id);
        const f_op *o = op_at(c, seq);
        int kind = !d ? 2 : !c || c->coll < seq ? 0 : o && o->state == S_QUEUED ? 1 : -1;
        if (kind >= 0) lag[n] = r, why[n++] = kind;
    }
    return n;
}

/* "; ranks 2, 3 never arrived; rank 1 left no dump" (prefixed by sep). */
static int laggard_words(const int *lag, const int *why, int nlag, const char *sep, char *out,
                         size_t len) {
    static const char *verb[3] = {" never arrived", " issued it and never ran it", " left no dump"};
    size_t n = strlen(out);
    int any = 0;
    for (int kind = 0; kind < 3; kind++) {
        int cnt = 0;
        for (int i = 0; i < nlag; i++) cnt += why[i] == kind;
        if (!cnt || n >= len) continue;
        n += (size_t)snprintf(out + n, len - n, "%s rank%s", any ? ";" : sep, cnt > 1 ? "s" : "");
        for (int i = 0, k = 0; i < nlag && n < len; i++)
            if (why[i] == kind)
                n += (size_t)snprintf(out + n, len - n, "%s %d", k++ ? "," : "", lag[i]);
        if (n < len) n += (size_t)snprintf(out + n, len - n, "%s", verb[kind]);
        any = 1;
    }
    return any;
}

/* "; rank 2 last completed tp group 0 allreduce #2 at +0.110 s, then entered world barrier #5" */
static void whereabouts(const f_job *j, int rank, char *out, size_t len) {
    const f_dump *d = dump_of(j, rank);
    size_t k = strlen(out);
    if (!d) return; /* said already: it left no dump */
    const f_comm *lc = NULL, *wc = NULL;
    const f_op *last = NULL, *wait = NULL;
    for (int c = 0; c < d->ncomms; c++)
        for (int m = 0; m < d->comms[c].nops; m++) {
            const f_op *o = &d->comms[c].ops[m];
            if (o->state == S_DONE && (!last || o->t1 > last->t1)) last = o, lc = &d->comms[c];
            if ((o->state == S_RUNNING || o->state == S_FAILED) && (!wait || o->t0 < wait->t0))
                wait = o, wc = &d->comms[c];
        }
    char w[96];
    if (last) {
        op_words(last, w, sizeof w);
        k += (size_t)snprintf(out + k, len - k, "; rank %d last completed %s %s at +%.3f s", rank,
                              lc->name, w, last->t1 - j->t_origin);
    } else {
        k += (size_t)snprintf(out + k, len - k, "; rank %d completed nothing", rank);
    }
    if (wait && k < len) {
        op_words(wait, w, sizeof w);
        snprintf(out + k, len - k, ", then %s %s %s",
                 wait->state == S_FAILED ? "failed in" : "was in", wc->name, w);
        int lag[64], why[64];
        int nlag = is_p2p(wait->op) ? 0 : laggards_of(j, wc, wait->seq, lag, why, 64);
        laggard_words(lag, why, nlag, ", where", out, len);
    }
}

/* ---- printing ---- */

static void print_stuck(const f_job *j, const finding *f) {
    char w[96], line[4096];
    op_words(f->a, w, sizeof w);
    snprintf(line, sizeof line, "%s: %s", f->c->name, w);
    int lag[64], why[64], nlag = laggards_of(j, f->c, f->seq, lag, why, 64);
    if (!laggard_words(lag, why, nlag, ":", line, sizeof line))
        snprintf(line + strlen(line), sizeof line - strlen(line), ": every rank arrived");
    size_t n = strlen(line);
    snprintf(line + n, sizeof line - n, "; %d rank%s %s in it (%.1f s)", f->waiters,
             f->waiters > 1 ? "s" : "", f->waiters > 1 ? "were" : "was", f->waited);
    for (int i = 0; i < nlag && i < 4; i++) whereabouts(j, lag[i], line, sizeof line);
    printf("first mismatch: %s\n", line);
}

static void print_finding(const f_job *j, const finding *f) {
    char a[96], b[96], line[2048] = "";
    if (f->kind == 3) {
        print_stuck(j, f);
        return;
    }
    op_words(f->a, a, sizeof a);
    op_words(f->b, b, sizeof b);
    if (f->kind == 1)
        snprintf(line, sizeof line,
                 "%s: collective #%llu differs: rank %d issued %s, rank %d issued %s "
                 "(operations out of order)",
                 f->c->name, (unsigned long long)f->seq, f->r1, a, f->r2, b);
    else
        snprintf(line, sizeof line,
                 "%s: rank %d ran %s while its %s waited (issued in another order than the "
                 "others ran them)",
                 f->c->name, f->r1, b, a);
    whereabouts(j, f->r1, line, sizeof line);
    printf("first mismatch: %s\n", line);
}

/* One group's last operations on each of its ranks. */
static void print_group(const f_job *j, const f_comm *g) {
    printf("  %s (ranks", g->name);
    for (int m = 0; m < g->nmem; m++) printf("%s %d", m ? "," : "", g->members[m]);
    printf("):\n");
    static const char *st[] = {"none", "queued", "running", "done", "failed"};
    for (int m = 0; m < g->nmem; m++) {
        const f_dump *d = dump_of(j, g->members[m]);
        const f_comm *c = comm_of(d, g->id);
        printf("    rank %d:", g->members[m]);
        if (!c) printf(" %s", d ? "(not in its dump)" : "(no dump)");
        for (int k = c && c->nops > 6 ? c->nops - 6 : 0; c && k < c->nops; k++) {
            const f_op *o = &c->ops[k];
            char w[96];
            op_words(o, w, sizeof w);
            printf("%s %s %s", k > (c->nops > 6 ? c->nops - 6 : 0) ? " |" : "", w, st[o->state]);
            if (o->t0 > 0) printf(" +%.3f s", o->t0 - j->t_origin);
            if (o->t1 > o->t0 && o->t0 > 0) printf(" (%.2f ms)", (o->t1 - o->t0) * 1e3);
        }
        printf("\n");
    }
}

int pt_cli_flight(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        usage(stderr);
        return 2;
    }
    f_job j = {0};
    pt_status st = read_job(argv[1], &j);
    if (st != PT_OK) {
        job_free(&j);
        return pt_cli_fail(pt_error_message());
    }
    int world = j.d[0].world;
    printf("partrain flight: %d dump%s of a %d-rank job; no dump from rank", j.n,
           j.n > 1 ? "s" : "", world);
    int none = 0;
    for (int r = 0; r < world; r++)
        if (!dump_of(&j, r)) printf("%s %d", none++ ? "," : "", r);
    printf("%s\n", none ? " (killed, or stopped and killed)" : "s: none");
    finding f = out_of_order(&j);
    if (!f.kind) f = stuck(&j);
    if (f.kind)
        print_finding(&j, &f);
    else
        printf("no mismatch: no group's operations differ between ranks, and none was stuck\n");
    const f_dump *first = &j.d[0];
    for (int i = 1; i < j.n; i++)
        if (j.d[i].rank < first->rank) first = &j.d[i];
    printf("the job's error (rank %d): %s\n", first->rank, first->reason);
    if (f.kind) {
        printf("details (each rank's last operations in the group, times from the first one "
               "recorded):\n");
        print_group(&j, f.c);
        uint64_t shown[16] = {f.c->id};
        int nshown = 1, lag[64], why[64];
        int nlag = f.kind == 3 ? laggards_of(&j, f.c, f.seq, lag, why, 64) : 0;
        if (f.kind != 3) lag[nlag++] = f.r1;
        for (int i = 0; i < nlag && nshown < 16; i++) /* where the laggards were */
            for (int c = 0; c < (dump_of(&j, lag[i]) ? dump_of(&j, lag[i])->ncomms : 0); c++) {
                const f_comm *g = &dump_of(&j, lag[i])->comms[c];
                int in = 0, seen = 0;
                for (int k = 0; k < g->nops; k++)
                    in |= g->ops[k].state == S_RUNNING || g->ops[k].state == S_FAILED ||
                          g->ops[k].state == S_QUEUED;
                for (int k = 0; k < nshown; k++) seen |= shown[k] == g->id;
                if (!in || seen || nshown == 16) continue;
                shown[nshown++] = g->id;
                print_group(&j, g);
            }
    }
    job_free(&j);
    return 0;
}
