/* Debugging and tuning knobs: the environment variables that change how
 * partrain does something, never what it computes for the user (log
 * verbosity, a kernel path, an algorithm's threshold, a path that tests
 * force). One table holds them all, with type, default, allowed values
 * and a line of documentation; docs/architecture.md ("Debugging knobs")
 * has one row per entry (tests/core/test_knobs.c checks that both agree).
 * Nothing else in partrain calls getenv for them.
 *
 * Each knob is read once, at its first use, under a mutex (the first use
 * may come from any thread); afterwards a read is one atomic load. A value
 * that does not parse, or lies outside the allowed range or choices, is
 * reported once on stderr and the default is used: the environment is
 * input, never an assertion. An empty value counts as unset.
 *
 * Not here: settings a user chooses (config keys: train/config.c, shown
 * by `partrain train --help`), markers the program sets for itself
 * (PT_BLAS_REEXEC), variables of other software (OMPI_*, OPENBLAS_*). */
#include "partrain/core.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Keep in step with docs/architecture.md, "Debugging knobs". */
static const pt_knob_info knobs[] = {
    {"PT_LOG", PT_KNOB_STR, "info", 0, 0, "debug|info|warn|error",
     "log level; debug also prints the file:line trail of a failure"},
    {"PT_GEMM", PT_KNOB_STR, "auto", 0, 0, "auto|blas|own",
     "matrix products: partrain's packed kernel where it pays (auto), OpenBLAS always (blas), "
     "or the packed kernel always (own)"},
    {"PT_PLAN_STATS", PT_KNOB_INT, "0", 0, 1, NULL,
     "1: the planner's search prints its counts and phase times"},
    {"PT_COMM_GENERIC", PT_KNOB_INT, "0", 0, 1, NULL,
     "1: every collective through the generic versions on the backend's send/recv (tests)"},
    {"PT_SHM_SPIN_US", PT_KNOB_FLOAT, "-1", -1, 1e6, NULL,
     "shm: most microseconds a wait spins before it yields (-1: 50 when every rank has a core, "
     "else 2)"},
    {"PT_SHM_CMA", PT_KNOB_INT, "1", 0, 1, NULL,
     "shm: 0 turns single-copy (cross-memory attach) collectives off"},
    {"PT_SHM_CMA_MIN_KB", PT_KNOB_INT, "16", 0, 1e9, NULL,
     "shm: smallest collective (KiB) that goes single-copy; every rank must see the same"},
    {"PT_SHM_CMA_CHUNK_KB", PT_KNOB_INT, "128", 1, 1e6, NULL,
     "shm: single-copy all-reduce chunk per peer (KiB); every rank must see the same"},
    {"PT_SHM_STAGE_KB", PT_KNOB_INT, "512", 64, 65536, NULL, "shm: staging half per member (KiB)"},
    {"PT_SHM_SLICE_KB", PT_KNOB_INT, "32", 1, 1e6, NULL,
     "shm: pipelined all-reduce slice per shard (KiB)"},
    {"PT_SHM_SLOTS", PT_KNOB_INT, "2", 2, 1e6, NULL, "shm: pipelined all-reduce ring slots"},
    {"PT_MPI_SERIALIZE", PT_KNOB_INT, "0", 0, 1, NULL,
     "mpi: 1 serializes every MPI call under one mutex even under MPI_THREAD_MULTIPLE (tests)"},
    {"PT_MPI_BLOCKING", PT_KNOB_STR, "none", 0, 0, "none|world|all",
     "mpi: collectives of the world (world) or of every communicator (all) as Open MPI's "
     "blocking calls under the watchdog; the same on every rank"},
    {"PT_MPI_RING_MIN_KB", PT_KNOB_INT, "256", 0, 1e12, NULL,
     "mpi: smallest collective (KiB) that takes the ring; the same on every rank"},
    {"PT_FAULT", PT_KNOB_STR, "none", 0, 0, NULL,
     "tests: one rank misbehaves at one collective, ACTION:rank=R[:group=G]:seq=N with ACTION "
     "skip, swap, kill or stop (src/comm/comm_fault.c); the first launch of a restarted job "
     "only"},
};
#define NKNOBS ((int)(sizeof knobs / sizeof knobs[0]))

static pthread_mutex_t knob_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int knob_ready[NKNOBS]; /* 1: value[i] / choice[i] / from_env[i] are set */
static double knob_value[NKNOBS];
static const char *knob_choice[NKNOBS]; /* a string knob's value: one of its choices */
static char knob_text[NKNOBS][256];     /* a free string knob's (choices NULL) value */
static int knob_from_env[NKNOBS];

const pt_knob_info *pt_knob_table(int *n) {
    *n = NKNOBS;
    return knobs;
}

/* The choice of `choices` ("a|b|c") equal to s, as a pointer into a
 * static copy of it; NULL when s is none of them. */
static const char *match_choice(int i, const char *s) {
    static char copies[NKNOBS][64]; /* "a\0b\0c\0": the choices cut apart */
    const char *all = knobs[i].choices;
    size_t len = strlen(all);
    PT_ASSERT(len < sizeof copies[i]);
    memcpy(copies[i], all, len + 1);
    for (char *p = copies[i]; p && *p;) {
        char *bar = strchr(p, '|');
        if (bar) *bar = '\0';
        if (!strcmp(p, s)) return p;
        p = bar ? bar + 1 : NULL;
    }
    return NULL;
}

/* Parse s as knob i's type into value[i] / choice[i]; 0 when it does not. */
static int parse(int i, const char *s) {
    const pt_knob_info *k = &knobs[i];
    if (k->type == PT_KNOB_STR && !k->choices) { /* any text that fits */
        if (strlen(s) >= sizeof knob_text[i]) return 0;
        snprintf(knob_text[i], sizeof knob_text[i], "%s", s);
        knob_choice[i] = knob_text[i];
        return 1;
    }
    if (k->type == PT_KNOB_STR) {
        const char *c = match_choice(i, s);
        if (c) knob_choice[i] = c;
        return c != NULL;
    }
    char *end = NULL;
    errno = 0;
    double v = k->type == PT_KNOB_INT ? (double)strtoll(s, &end, 10) : strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < k->min || v > k->max) return 0;
    knob_value[i] = v;
    return 1;
}

static void load(int i) {
    if (atomic_load_explicit(&knob_ready[i], memory_order_acquire)) return;
    pthread_mutex_lock(&knob_mu);
    if (!atomic_load_explicit(&knob_ready[i], memory_order_relaxed)) {
        const pt_knob_info *k = &knobs[i];
        int ok = parse(i, k->def);
        PT_ASSERT(ok); /* the table's own default */
        const char *e = getenv(k->name);
        knob_from_env[i] = e && *e;
        if (knob_from_env[i] && !parse(i, e)) {
            if (k->type == PT_KNOB_STR && !k->choices)
                fprintf(stderr, "partrain warn: %s is longer than %zu bytes; using %s\n", k->name,
                        sizeof knob_text[i] - 1, k->def);
            else if (k->type == PT_KNOB_STR)
                fprintf(stderr, "partrain warn: %s=%s is not one of %s; using %s\n", k->name, e,
                        k->choices, k->def);
            else
                fprintf(stderr, "partrain warn: %s=%s is not %s in [%g, %g]; using %s\n", k->name,
                        e, k->type == PT_KNOB_INT ? "an integer" : "a number", k->min, k->max,
                        k->def);
            parse(i, k->def);
        }
        atomic_store_explicit(&knob_ready[i], 1, memory_order_release);
    }
    pthread_mutex_unlock(&knob_mu);
}

/* The row of `name`; asking for a knob that is not in the table, or as
 * another type, is our bug. */
static int find(const char *name, int type) {
    for (int i = 0; i < NKNOBS; i++) {
        if (strcmp(knobs[i].name, name) != 0) continue;
        if (type >= 0 && (int)knobs[i].type != type)
            pt_assert_fail(__FILE__, __LINE__, "knob read as its own type", name);
        return i;
    }
    pt_assert_fail(__FILE__, __LINE__, "knob in the table", name);
}

long pt_knob_int(const char *name) {
    int i = find(name, PT_KNOB_INT);
    load(i);
    return (long)knob_value[i];
}

double pt_knob_float(const char *name) {
    int i = find(name, PT_KNOB_FLOAT);
    load(i);
    return knob_value[i];
}

const char *pt_knob_str(const char *name) {
    int i = find(name, PT_KNOB_STR);
    load(i);
    return knob_choice[i];
}

int pt_knob_is_set(const char *name) {
    int i = find(name, -1);
    load(i);
    return knob_from_env[i];
}

void pt_knobs_reread(void) {
    pthread_mutex_lock(&knob_mu);
    for (int i = 0; i < NKNOBS; i++) atomic_store(&knob_ready[i], 0);
    pthread_mutex_unlock(&knob_mu);
}
