/*
 * server/load_args.h: --load-format, --hf-overrides and the dummy seed, shared
 * by serve, generate, inspect and kernels (vLLM's flags of the same names).
 */
#ifndef DSV4_SERVER_LOAD_ARGS_H
#define DSV4_SERVER_LOAD_ARGS_H

#include <stdbool.h>

#include "model/checkpoint.h"

/*
 * Take --load-format auto|safetensors|dummy, --hf-overrides JSON and
 * --dummy-seed N (and --seed N when take_seed: serve, which has no sampling
 * seed of its own) out of argv (shifting the rest down, updating *argc) into
 * co's load_format, hf_overrides and dummy_seed. 0, or CLI_EXIT_USAGE after
 * printing why (cmd names the subcommand).
 */
int load_args_extract(int *argc, char **argv, const char *cmd, bool take_seed, struct model_checkpoint_options *co);

/* The usage lines of these flags. */
const char *load_args_usage(void);

#endif
