/* Placeholder until the train subcommand lands. */
#include "cli_impl.h"

#include <stdio.h>

int pt_cli_train(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "partrain: %s is not built yet\n", argv[0]);
    return 2;
}
