/*
 * server/cmd_inspect.c: `dsv4 inspect [--tensors] MODEL_DIR` (or `tiny`, the
 * tiny checkpoint serve builds and caches).
 *
 * Opens the checkpoint with the same validation the server runs at load, so
 * a checkpoint that inspects cleanly is one the loader accepts. Prints the
 * summary of model/inspect.h on stdout; any error goes to stderr as one line
 * naming the file and tensor, with exit status 1 (2 for a usage error).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "model/checkpoint.h"
#include "model/inspect.h"
#include "server/load_args.h"

static void inspect_usage(FILE *f)
{
	fprintf(f, "usage: dsv4 inspect [--tensors] MODEL_DIR|tiny\n\n"
		   "Validate a DeepSeek-V4 checkpoint directory (config.json, model.safetensors.index.json,\n"
		   "shards) and print its config, layer types, tensor count, bytes per dtype and quantization.\n\n"
		   "  --tensors   also list every tensor: name, dtype, shape, shard, format\n");
}

int cmd_inspect(int argc, char **argv)
{
	struct model_checkpoint_options load_opts = {0}; /* dummy-load: --load-format, --hf-overrides */
	if (load_args_extract(&argc, argv, "inspect", false, &load_opts))
		return CLI_EXIT_USAGE;
	const char *dir = NULL;
	struct model_inspect_options opt = {0};
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			inspect_usage(stdout);
			return CLI_EXIT_OK;
		} else if (!strcmp(argv[i], "--tensors")) {
			opt.list_tensors = true;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, "dsv4 inspect: unknown option '%s'\n", argv[i]);
			inspect_usage(stderr);
			return CLI_EXIT_USAGE;
		} else if (dir) {
			fprintf(stderr, "dsv4 inspect: more than one MODEL_DIR\n");
			return CLI_EXIT_USAGE;
		} else {
			dir = argv[i];
		}
	}
	if (!dir) {
		inspect_usage(stderr);
		return CLI_EXIT_USAGE;
	}
	char tiny_dir[2048];
	if (!strcmp(dir, "tiny")) { /* serve's tiny checkpoint, built once */
		if (load_args_model_dir(dir, tiny_dir, sizeof tiny_dir))
			return CLI_EXIT_FAIL;
		dir = tiny_dir;
	}
	struct err e;
	err_clear(&e);
	struct model_checkpoint *ck = NULL;
	struct model_checkpoint_options co = load_opts; /* dummy-load */
	co.dummy_no_fill = true;
	co.dir = dir;
	if (model_checkpoint_create(&ck, &co, &e) != ST_OK) {
		fprintf(stderr, "dsv4 inspect: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	enum status st = model_inspect_write(ck, &opt, stdout, &e);
	model_checkpoint_destroy(ck);
	if (st != ST_OK) {
		fprintf(stderr, "dsv4 inspect: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	return CLI_EXIT_OK;
}
