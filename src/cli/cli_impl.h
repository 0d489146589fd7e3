/* Private to the CLI: one entry point per subcommand, and the helpers they
 * share (cli_common.c). Each entry point returns the process exit status and
 * prints its own --help. argv[0] is the subcommand. */
#ifndef PT_CLI_IMPL_H
#define PT_CLI_IMPL_H

#include <stddef.h>

#include "partrain/model.h"
#include "partrain/plan.h"
#include "partrain/train.h"

int pt_cli_train(int argc, char **argv);
int pt_cli_eval(int argc, char **argv);
int pt_cli_sample(int argc, char **argv);
int pt_cli_bench(int argc, char **argv);
int pt_cli_plan(int argc, char **argv);
int pt_cli_calibrate(int argc, char **argv);
int pt_cli_flight(int argc, char **argv);
int pt_cli_report(int argc, char **argv);

/* ---- shared helpers (cli_common.c) ---- */

/* Print "partrain: MSG" on stderr; returns 1, a failed run's exit status.
 * When msg is the last error (pt_error_message()), also its trail, under
 * PT_LOG=debug only. */
int pt_cli_fail(const char *msg);
/* Under PT_LOG=debug: the last error's file:line trail (pt_error_trail), a
 * line of its own; nothing otherwise. */
void pt_cli_error_trail(void);

/* An output file option (`opt`, e.g. "--write") checked before any work
 * (pt_file_check_output: a regular file or nothing yet, in an existing
 * folder): 0 when fine, else 1 after one line "partrain: --write PATH: is
 * a FIFO, not a regular file". */
int pt_cli_check_output(const char *opt, const char *path);

/* Whether argv[*i] is the option `name` with a value, given as
 * "name VALUE" or "name=VALUE": 1 with *value set (argv's string, lent) and
 * *i moved onto the value; 0 when argv[*i] is something else; -1 when the
 * value is missing (a line naming the option and `cmd`'s --help printed:
 * exit 2). */
int pt_cli_option(int argc, char **argv, int *i, const char *name, const char *cmd,
                  const char **value);
/* Parse s as a whole integer / number in [min, max] for option opt: 1 with
 * *out set, else 0 after one line naming the option, the range and s. */
int pt_cli_parse_int(const char *opt, const char *s, long min, long max, int *out);
int pt_cli_parse_num(const char *opt, const char *s, double min, double max, double *out);

/* --config FILE and --set key=value, gathered while a subcommand walks its
 * arguments and applied afterwards in one order whatever the command line's:
 * defaults < the file (the last --config given) < each --set, in turn. */
typedef struct {
    const char *config; /* lent from argv; NULL: none */
    const char **sets;  /* lent from argv, in order (malloc'd array of the pointers) */
    int nsets;
} pt_cli_config_args;

/* Room for every --set of an argc-argument command line; 0, or 1 after a
 * message when out of memory. */
int pt_cli_config_args_init(pt_cli_config_args *a, int argc);
void pt_cli_config_args_deinit(pt_cli_config_args *a);
/* pt_cli_option for --config and --set: 1 when argv[*i] was one of them
 * (kept in a), 0 when not, -1 when its value is missing (exit 2). */
int pt_cli_config_arg(pt_cli_config_args *a, int argc, char **argv, int *i, const char *cmd);
/* The config they make, validated. Errors name the file or the key. */
pt_status pt_cli_config_build(const pt_cli_config_args *a, pt_config *cfg);

/* Whether key (a config key name) is one a layout sets: parallel.*,
 * model.recompute, model.stage_recompute, train.threads. Given by the user,
 * the planner holds it fixed. */
int pt_cli_layout_key(const char *key);

/* One stderr line when `cluster`'s profile (loaded as cl) has no measured
 * modules of model m's shape: the planner then models the passes from the
 * product table, and the user should calibrate for this config. */
void pt_cli_profile_note(const pt_cluster *cl, const pt_model_config *m, const char *cluster);

/* train --layout auto (cli_layout.c): plan cfg for `world` ranks on this
 * machine (the calibrate profile of cfg's shape, measured once into the
 * cache) or on the cluster file `cluster` (NULL: this machine), holding the
 * layout keys that a's --set gives fixed, print the choice and why on
 * stderr, and write the fastest layout into cfg. cfg's output paths are
 * checked first (pt_trainer_check_outputs), before any planning. *plan
 * gets the run record's plan (pt_trainer_set_plan: the prediction and the
 * profile's bandwidths; malloc'd, NULL when out of memory). */
pt_status pt_cli_layout_auto(pt_config *cfg, const pt_cli_config_args *a, int world,
                             const char *cluster, char **plan);
/* The run record's plan of a plan file (train --plan): its "plan" object
 * with "source" and "path" added (malloc'd; NULL when it cannot be read:
 * the file was loaded before, the run goes on without it). */
char *pt_cli_plan_file_json(const char *path);

/* ---- train's launches and restarts (cli_train.c, cli_restart.c) ---- */

/* Launch cfg's job on nproc ranks of this machine (the shm launcher),
 * resuming from checkpoint.dir/latest when resume, plan the run record's
 * plan (NULL: none): 0 when it succeeded, 1 when it failed (*res says how;
 * its line is printed), 2 when it could not start (refused before any
 * rank: a line said why). */
int pt_cli_launch(const pt_config *cfg, int nproc, int resume, const char *plan,
                  pt_launch_result *res);
/* --max-restarts and --elastic (cli_restart.c). */
typedef struct {
    int max_restarts, elastic;
    const char *cluster;            /* --cluster: the elastic planner's cluster (NULL: this
                                       machine's profile) */
    const pt_cli_config_args *args; /* the command line's --config and --set */
} pt_cli_restart;
/* The job, and up to r->max_restarts restarts of it after job faults (one
 * line each): 0 when a run ended well, 1 otherwise. cfg and *plan (the run
 * record's, malloc'd or NULL) change with an elastic restart's layout. */
int pt_cli_train_restarts(pt_config *cfg, int nproc, int resume, char **plan,
                          const pt_cli_restart *r);
/* 1 with the step directory in stepdir when checkpoint.dir holds a
 * checkpoint to resume from; 0 otherwise (no error left behind). */
int pt_cli_checkpoint_exists(const pt_config *cfg, char *stepdir, size_t n);

/* A --checkpoint argument (a checkpoint directory with `latest`, or one step
 * directory): the step directory into stepdir (n bytes) and the config it
 * was saved with into *cfg. Reads only. */
pt_status pt_cli_checkpoint_open(const char *arg, char *stepdir, size_t n, pt_config *cfg);
/* A model of cfg's shape for micro-batches of B sequences, holding the
 * parameters of stepdir/model.safetensors (*out: the caller frees it; NULL
 * on failure). */
pt_status pt_cli_checkpoint_model(const char *stepdir, const pt_config *cfg, int B, pt_model **out);

#endif
