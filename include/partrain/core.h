/* partrain core: status codes and error messages, assertions, the counting
 * allocator (memory by category), the counter-based RNG, logging and
 * clocks. Depends on libc only. Every other layer includes this header.
 *
 * Not here: anything that knows about models, kernels or ranks. */
#ifndef PARTRAIN_CORE_H
#define PARTRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ------------------------------------------------------
 * Functions that can fail return pt_status: 0 is success, negative an error.
 * The X-macro is the single list; it yields the enum, the names and the
 * generic messages. The specific message (which input, which value) is the
 * thread-local "last error", set with pt_error_set. */
#define PT_STATUS_LIST(X)                                                                          \
    X(PT_OK, 0, "ok")                                                                              \
    X(PT_ERR_INVALID, -1, "invalid argument")                                                      \
    X(PT_ERR_IO, -2, "input/output error")                                                         \
    X(PT_ERR_NOMEM, -3, "out of memory")                                                           \
    X(PT_ERR_FORMAT, -4, "bad file format")                                                        \
    X(PT_ERR_COMM, -5, "communication error")                                                      \
    X(PT_ERR_TIMEOUT, -6, "timed out")                                                             \
    X(PT_ERR_UNSUPPORTED, -7, "unsupported")                                                       \
    X(PT_ERR_INTERNAL, -8, "internal error")                                                       \
    X(PT_ERR_INTERRUPTED, -9, "interrupted")

typedef enum {
#define PT_X_ENUM(name, value, msg) name = value,
    PT_STATUS_LIST(PT_X_ENUM)
#undef PT_X_ENUM
} pt_status;

/* "PT_ERR_IO" for PT_ERR_IO; "PT_ERR_UNKNOWN" for values not in the list. */
/* "0.5.0 (commit 1a2b3c4d5e6f)": the library's version and the commit it
 * was built from ("-dirty" after it when the checkout had changes,
 * "unknown" outside git). */
const char *pt_version(void);

const char *pt_status_name(pt_status s);
/* The generic message of a status ("input/output error"). */
const char *pt_status_str(pt_status s);

/* Record a specific message for the calling thread and return s, so that a
 * failing function can `return pt_error_set(PT_ERR_IO, "%s: %s", path, ...)`.
 * The message should name the bad input. */
pt_status pt_error_set(pt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The calling thread's last message ("" when none). Valid until the next set. */
const char *pt_error_message(void);
/* st itself when PT_OK; else the last error becomes "<prefix>: <message>"
 * (prefix formatted from fmt) and st is returned. */
pt_status pt_error_wrap(pt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Forget the calling thread's last message. */
void pt_error_clear(void);
/* Mark the last message as one that every rank of the job returns alike (an
 * error the ranks agreed on), so that a front end prints it once instead of
 * once per rank. The next pt_error_set or pt_error_clear unmarks it. */
void pt_error_mark_shared(void);
int pt_error_is_shared(void);

/* Where the last error travelled: "file:line" of each PT_CHECK /
 * PT_CHECK_GOTO that passed it on, the first (nearest the failure) first,
 * "comm/comm.c:412 <- train/trainer.c:88"; "" when none. pt_error_set and
 * pt_error_clear start it afresh. For debugging only (the CLI prints it
 * under PT_LOG=debug): the message itself never changes. */
const char *pt_error_trail(void);
/* Add file:line to the calling thread's trail (PT_CHECK, on failure only). */
void pt_error_trace(const char *file, int line) __attribute__((cold));

/* Propagate a failure to the caller, leaving this line in the error's
 * trail. Success costs the one comparison it always did. */
#define PT_CHECK(expr)                                                                             \
    do {                                                                                           \
        pt_status pt_check_s_ = (expr);                                                            \
        if (pt_check_s_ != PT_OK) {                                                                \
            pt_error_trace(__FILE__, __LINE__);                                                    \
            return pt_check_s_;                                                                    \
        }                                                                                          \
    } while (0)

/* Store a failure in `st` and jump to the single cleanup label (leaving
 * this line in the trail). */
#define PT_CHECK_GOTO(st, expr, label)                                                             \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) != PT_OK) {                                                                       \
            pt_error_trace(__FILE__, __LINE__);                                                    \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Assertions are for our own bugs only and stay on in release builds. Input
 * from users, files, the environment or other ranks never reaches them. */
#define PT_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) pt_assert_fail(__FILE__, __LINE__, #cond, NULL);                              \
    } while (0)
/* Equality of two integers; prints both values when it fails. */
#define PT_ASSERT_EQ(a, b)                                                                         \
    do {                                                                                           \
        long long pt_a_ = (long long)(a), pt_b_ = (long long)(b);                                  \
        if (pt_a_ != pt_b_) pt_assert_fail_eq(__FILE__, __LINE__, #a " == " #b, pt_a_, pt_b_);     \
    } while (0)
_Noreturn void pt_assert_fail(const char *file, int line, const char *expr, const char *msg);
_Noreturn void pt_assert_fail_eq(const char *file, int line, const char *expr, long long a,
                                 long long b);

/* ---- memory by category ------------------------------------------------
 * All sizeable allocations go through pt_mem_alloc with a category, so that
 * memory can be reported per category (current and peak). Blocks are 64-byte
 * aligned. Thread-safe (atomic counters). */
#define PT_MEM_CATEGORY_LIST(X)                                                                    \
    X(PT_MEM_PARAMS, "params")                                                                     \
    X(PT_MEM_GRADS, "grads")                                                                       \
    X(PT_MEM_OPTIM, "optim")                                                                       \
    X(PT_MEM_ACTS, "acts")                                                                         \
    X(PT_MEM_COMM, "comm")                                                                         \
    X(PT_MEM_SCRATCH, "scratch")

typedef enum {
#define PT_X_ENUM(name, str) name,
    PT_MEM_CATEGORY_LIST(PT_X_ENUM)
#undef PT_X_ENUM
        PT_MEM_NCAT
} pt_mem_cat;

/* "params", "grads", ... */
const char *pt_mem_cat_name(pt_mem_cat c);

/* Allocate `bytes` (may be 0) zero-filled bytes, 64-byte aligned, counted in
 * category c. Returns NULL and sets the last error on failure. */
void *pt_mem_alloc(pt_mem_cat c, size_t bytes);
/* Free a block from pt_mem_alloc; NULL is a no-op. */
void pt_mem_free(void *p);
/* Bytes currently held in category c, and the peak since the last reset. */
size_t pt_mem_current(pt_mem_cat c);
size_t pt_mem_peak(pt_mem_cat c);
/* Bytes currently held / peak over all categories together. */
size_t pt_mem_current_total(void);
size_t pt_mem_peak_total(void);
/* Start a new peak window (e.g. per training step): peak := current. */
void pt_mem_reset_peak(void);
/* Testing: make the n-th pt_mem_alloc call from now on fail (1 = the next
 * one); 0 disables. */
void pt_mem_fail_after(long n);

/* ---- counter-based RNG -----------------------------------------------------
 * Philox-4x32-10 (Salmon et al., SC'11): the output is a pure function of a
 * 64-bit key and a 128-bit counter, so any element of any tensor can be drawn
 * independently, by any rank, in any order. Parameter init uses
 * key = pt_rng_key(seed, name) and counter = element index in the FULL tensor
 * (DESIGN principle 2). A sequential stream (pt_rng) is a key plus a counter
 * that advances; its state is two integers, saved in checkpoints. */

/* Key for (seed, name): a hash of the name mixed with the seed. */
uint64_t pt_rng_key(uint64_t seed, const char *name);
/* Four 32-bit words for (key, counter). */
void pt_philox(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]);
/* Uniform in [0, 1) for element `index` of stream `key`. */
float pt_rng_uniform_at(uint64_t key, uint64_t index);
/* Standard normal (Box-Muller on two words) for element `index` of `key`. */
float pt_rng_normal_at(uint64_t key, uint64_t index);

typedef struct {
    uint64_t key;
    uint64_t counter;
} pt_rng;

void pt_rng_init(pt_rng *r, uint64_t seed, const char *name);
/* Next 64 random bits; advances the counter by one. */
uint64_t pt_rng_next_u64(pt_rng *r);
/* Uniform integer in [0, n), n > 0 (rejection sampling: unbiased). */
uint64_t pt_rng_below(pt_rng *r, uint64_t n);
/* Uniform float in [0, 1). */
float pt_rng_uniform(pt_rng *r);

/* ---- files ------------------------------------------------------------------ */

/* Open an input file for reading ("rb" stream, *out; fclose it). Anything
 * but a regular file (a directory, FIFO, socket or device) is refused with
 * one message naming the path and what it is, and never blocks (a FIFO with
 * no writer would block a plain open forever). size: the file's size in
 * bytes (NULL: not wanted). Every input path goes through this. */
pt_status pt_file_open_regular(const char *path, FILE **out, uint64_t *size);

/* The whole file at path as one NUL-terminated string (*out, free()), at
 * most max_bytes long, opened with pt_file_open_regular; errors name the
 * path. */
pt_status pt_read_text_file(const char *path, size_t max_bytes, char **out);
/* Offset of the first "\u0000" escape in JSON text s[0, n), n when none:
 * cJSON decodes it into a NUL that silently cuts the string short, so
 * that "wte.weight\u0000x" would load as "wte.weight". Every JSON input
 * (configs, checkpoint state, safetensors headers, cluster files) is
 * checked with it before parsing. */
size_t pt_json_first_nul_escape(const char *s, size_t n);

/* Output paths, checked by every command before any work (and again by the
 * writers). A file output must be a regular file or not exist yet (a
 * symbolic link counts as the file it names), in a folder that is a
 * directory this process may write into; make_dirs: that folder may be
 * missing, the writer making it (mkdir -p), as long as the nearest one
 * above that exists is such a directory. Anything else (a FIFO, socket,
 * device or directory at path; a missing folder; a file where a folder
 * should be) is one message naming path and what is wrong, e.g.
 * "m.json: is a FIFO, not a regular file". */
pt_status pt_file_check_output(const char *path, int make_dirs);
/* The same for an output directory (checkpoint.dir): a directory this
 * process may write, or nothing yet under a folder that can take it
 * (missing folders are made, mkdir -p). */
pt_status pt_dir_check_output(const char *path);

/* A stream written as it goes (log.metrics' lines: not atomic, so that it
 * can be followed), appended to (append) or truncated, after
 * pt_file_check_output(path, 0); refuses anything but a regular file, and
 * never blocks on a FIFO. The caller checks each write and names path. */
pt_status pt_file_open_output(const char *path, int append, FILE **out);

/* A whole output file, written atomically: every file partrain writes goes
 * through pt_out (or pt_file_write_atomic). pt_out_open checks path
 * (pt_file_check_output) and creates a temporary beside it; write to
 * pt_out_stream (any stdio call: a failed write's errno is kept) or with
 * pt_out_write; pt_out_commit flushes, fsyncs and renames it over path; a
 * failure there, or pt_out_abort, removes the temporary, and path is as it
 * was. Errors are one line naming path: "plan.json: write failed: File too
 * large". Both commit and abort free o (abort: NULL is a no-op). */
typedef struct pt_out pt_out;
pt_status pt_out_open(pt_out **out, const char *path);
/* The stream into the temporary (lent; valid until commit or abort). */
FILE *pt_out_stream(pt_out *o);
/* n bytes of data; an error names path and the reason. */
pt_status pt_out_write(pt_out *o, const void *data, size_t n);
/* Flush and fsync what was written (the temporary is then complete and
 * durable, not yet in place); nothing more may be written. Commit does
 * this itself; call it to act between the two (a crash test's point). */
pt_status pt_out_sync(pt_out *o);
pt_status pt_out_commit(pt_out *o);
void pt_out_abort(pt_out *o);
/* path := data[0, n), atomically: open, write, commit. */
pt_status pt_file_write_atomic(const char *path, const void *data, size_t n);

/* ---- comma lists ------------------------------------------------------------
 * The one grammar of every config value that is a list (parallel.stage_layers,
 * model.stage_recompute, parallel.zero_whole): "" is the empty list; else
 * entries separated by commas, blanks (spaces, tabs) around an entry ignored,
 * no entry empty (",4", "2,,2", "2," and " " are refused). A number in a list
 * is decimal digits: no sign, no leading zero, at most a limit that the key
 * names. Errors are one line: KEY = "VALUE": entry K ... */
#define PT_LIST_ITEM_MAX 128

typedef struct {
    const char *key;             /* the config key, for messages (lent) */
    const char *value;           /* the whole list (lent) */
    const char *at;              /* where the next entry starts; NULL after the last */
    int index;                   /* 1-based number of the entry in item */
    char item[PT_LIST_ITEM_MAX]; /* that entry, blanks around it dropped (longer: cut) */
} pt_list;

void pt_list_init(pt_list *l, const char *key, const char *value);
/* The next entry into l->item: 1; 0 after the last; an error (negative
 * pt_status, message set) for an empty entry. */
int pt_list_next(pt_list *l);
/* s as a list number: 1 with *v when it is one and at most max (max >= 0);
 * 0 when it is not a number; -1 when it is one above max (*v untouched
 * unless 1). */
int pt_list_uint(const char *s, long max, long *v);
/* l->item as a list number in [0, max] (*v); errors name the entry and
 * the limit, and limit_name says what it is ("model.n_layer"). */
pt_status pt_list_number(const pt_list *l, long max, const char *limit_name, long *v);
/* One error line about the current entry: KEY = "VALUE": entry K ('ITEM') <fmt...>. */
pt_status pt_list_error(const pt_list *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- logging and time ------------------------------------------------------ */
typedef enum { PT_LOG_DEBUG, PT_LOG_INFO, PT_LOG_WARN, PT_LOG_ERROR } pt_log_level;

/* Messages below `level` are dropped (default INFO; env PT_LOG=debug|info|
 * warn|error). The rank, when set (>= 0), prefixes every line. */
void pt_log_set_level(pt_log_level level);
void pt_log_set_rank(int rank);
void pt_log(pt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define PT_DEBUG(...) pt_log(PT_LOG_DEBUG, __VA_ARGS__)
#define PT_INFO(...)  pt_log(PT_LOG_INFO, __VA_ARGS__)
#define PT_WARN(...)  pt_log(PT_LOG_WARN, __VA_ARGS__)

/* ---- debugging and tuning knobs -----------------------------------------------
 * Environment variables that change how partrain does something, never what
 * it computes for the user: log verbosity, a kernel path, an algorithm's
 * threshold, a path tests force. (What a user chooses is a config key.)
 * Each is one row of the table in src/core/knobs.c and of "Debugging knobs"
 * in docs/architecture.md, and is read from the environment once, at its
 * first use, from any thread; a value that does not parse or is out of
 * range is reported once on stderr and the default is used. Asking for a
 * name the table lacks, or as another type, is a bug (assert). */
typedef enum { PT_KNOB_INT, PT_KNOB_FLOAT, PT_KNOB_STR } pt_knob_type;

typedef struct {
    const char *name;    /* "PT_SHM_SLOTS" */
    pt_knob_type type;   /* how the value parses */
    const char *def;     /* the default, as it would be written in the environment */
    double min, max;     /* numbers: the allowed range */
    const char *choices; /* strings: the allowed values, "a|b|c"; NULL: any text (< 256 bytes) */
    const char *doc;     /* one line */
} pt_knob_info;

long pt_knob_int(const char *name);
double pt_knob_float(const char *name);
/* One of the knob's choices, or a free knob's text (a static string, never
 * NULL). */
const char *pt_knob_str(const char *name);
/* 1 when the environment sets the knob (non-empty), valid or not. */
int pt_knob_is_set(const char *name);
/* The table (*n rows), for tests and documentation. */
const pt_knob_info *pt_knob_table(int *n);
/* Tests: read the environment again at each knob's next use. Not while
 * another thread may read a knob. */
void pt_knobs_reread(void);

/* Monotonic clock in nanoseconds / seconds. */
uint64_t pt_time_ns(void);
double pt_time_s(void);

#ifdef __cplusplus
}
#endif
#endif
