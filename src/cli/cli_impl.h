/* Private to the CLI: one entry point per subcommand. Each returns the
 * process exit status and prints its own --help. argv[0] is the subcommand. */
#ifndef PT_CLI_IMPL_H
#define PT_CLI_IMPL_H

int pt_cli_train(int argc, char **argv);
int pt_cli_eval(int argc, char **argv);
int pt_cli_sample(int argc, char **argv);
int pt_cli_bench(int argc, char **argv);

#endif
