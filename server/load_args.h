/*
 * server/load_args.h: the flags of every subcommand that opens a model,
 * parsed here once: the checkpoint's (--load-format, --hf-overrides, the
 * dummy seed) and the executor's (--device, --precision, and the tensor
 * parallel group: --tensor-parallel-size, --nnodes, --node-rank,
 * --master-addr, --master-port, --tp-timeout, --tp-secret-file), vLLM's
 * names where they exist.
 */
#ifndef DSV4_SERVER_LOAD_ARGS_H
#define DSV4_SERVER_LOAD_ARGS_H

#include <stdbool.h>
#include <stddef.h>

#include "model/checkpoint.h"
#include "model/exec_open.h"

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

/*
 * Take the executor's flags out of argv (as above) into xo's device,
 * precision and parallel (left as they are when absent; the caller sets the
 * defaults first). The combination is checked (model_exec_parallel_world);
 * a refusal prints the flag and returns CLI_EXIT_USAGE.
 */
int load_args_extract_exec(int *argc, char **argv, const char *cmd, struct model_exec_open_options *xo);

/* Their usage lines. */
const char *load_args_exec_usage(void);

/*
 * The checkpoint directory of a model argument into out: the argument
 * itself, or for "tiny" the tiny random checkpoint: $DSV4_TINY_MODEL (built
 * there if missing), else the repository's models/tiny-bf16 if it was
 * built, else $XDG_CACHE_HOME/dsv4/tiny-bf16 (~/.cache/dsv4/tiny-bf16),
 * built there once with scripts/make_tiny_model. 0, or -1 after logging why.
 */
int load_args_model_dir(const char *model, char *out, size_t cap);

#endif
