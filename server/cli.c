/*
 * server/cli.c: the table of subcommands. A new subcommand is a line here and
 * a cmd_<name>.c beside it.
 */
#include "cli.h"

#include <stddef.h>

const struct cli_command cli_commands[] = {
	{"version", "print the version and the compiled CUDA targets", cmd_version},
	/* ---- checkpoint ---- */
	{"inspect", "validate a checkpoint and print its config, layers, tensors, quantization", cmd_inspect},
	/* ---- tokenizer ---- */
	{"tokenize", "encode text to token ids, or --decode ids", cmd_tokenize},
	/* ---- kernels ---- */
	{"kernels", "print the per-layer kernel plan for a model on this or a simulated GPU", cmd_kernels},
	/* ---- comm ---- */
	/* ---- forward pass ---- */
	{"generate", "run one prompt through the model (GPU when usable, else CPU): prefill, decode, sampling", cmd_generate},
	/* ---- openai server ---- */
	{"serve", "serve the OpenAI-compatible API over HTTP: dsv4 serve MODEL_DIR [vLLM's flags]", cmd_serve},
	{"bench", "benchmarks: decode (ms/step, tokens/s, bytes read vs measured bandwidth, per-op profile)", cmd_bench},
	{NULL, NULL, NULL},
};
