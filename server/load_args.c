/*
 * server/load_args.c: the checkpoint loading flags every subcommand that opens
 * a model accepts (--load-format, --hf-overrides, --dummy-seed / --seed),
 * taken out of argv before the subcommand's own parser runs so that each
 * command needs one call and no option-table edits.
 */
#include "server/load_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/cli.h"

int load_args_extract(int *argc, char **argv, const char *cmd, bool take_seed, struct model_checkpoint_options *co)
{
	static const char *names[] = {"--load-format", "--hf-overrides", "--dummy-seed", "--seed"};
	int n_names = take_seed ? 4 : 3;
	int out = 1;
	for (int i = 1; i < *argc; i++) {
		const char *arg = argv[i];
		if (!strcmp(arg, "--")) {
			while (i < *argc)
				argv[out++] = argv[i++];
			break;
		}
		int which = -1;
		const char *v = NULL;
		for (int k = 0; k < n_names && which < 0; k++) {
			size_t n = strlen(names[k]);
			if (!strncmp(arg, names[k], n) && (arg[n] == '\0' || arg[n] == '=')) {
				which = k;
				v = arg[n] == '=' ? arg + n + 1 : NULL;
			}
		}
		if (which < 0) {
			argv[out++] = argv[i];
			continue;
		}
		if (!v) {
			if (i + 1 >= *argc) {
				fprintf(stderr, "dsv4 %s: option '%s' needs a value\n", cmd, arg);
				return CLI_EXIT_USAGE;
			}
			v = argv[++i];
		}
		if (which == 0) {
			if (!model_load_format_parse(v, &co->load_format)) {
				fprintf(stderr, "dsv4 %s: --load-format '%s': expected auto, safetensors or dummy\n", cmd, v);
				return CLI_EXIT_USAGE;
			}
		} else if (which == 1) {
			co->hf_overrides = v;
		} else {
			char *end = NULL;
			errno = 0;
			unsigned long long s = strtoull(v, &end, 10);
			if (errno || !v[0] || *end || v[0] == '-') {
				fprintf(stderr, "dsv4 %s: %s '%s': expected a non-negative integer\n", cmd, names[which], v);
				return CLI_EXIT_USAGE;
			}
			co->dummy_seed = s;
		}
	}
	argv[out] = NULL;
	*argc = out;
	return 0;
}

const char *load_args_usage(void)
{
	return "  --load-format auto|safetensors|dummy\n"
	       "                               dummy: random weights of the exact names, shapes and formats\n"
	       "                               from config.json alone (deterministic)\n"
	       "  --hf-overrides JSON          merged into config.json before validation, e.g.\n"
	       "                               '{\"num_hidden_layers\": 8}' (known keys, same types)\n"
	       "  --dummy-seed N               seed of the dummy weights (default 0)\n";
}
