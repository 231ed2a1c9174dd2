/*
 * server/flags.c: flag values as numbers in a range, and flag families
 * taken out of argv (flags.h): one parser for every subcommand, so that
 * "--port 8e3" or "--max-num-seqs 4x" is refused the same way everywhere.
 */
#include "flags.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/cli.h"

bool flag_parse_long(const char *s, long lo, long hi, long *out)
{
	char *end = NULL;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || !s[0] || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

bool flag_parse_double(const char *s, double lo, double hi, double *out)
{
	char *end = NULL;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || !s[0] || *end || !(v >= lo && v <= hi))
		return false;
	*out = v;
	return true;
}

int flag_take(int *argc, char **argv, const char *cmd, const char *const *names, int n_names, unsigned no_value,
	      int (*apply)(void *ctx, const char *cmd, const char *name, int k, const char *v), void *ctx)
{
	int out = 1;
	for (int i = 1; i < *argc; i++) {
		const char *arg = argv[i];
		if (!strcmp(arg, "--")) { /* the rest is not ours */
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
		if (!v && !(no_value >> which & 1u)) {
			if (i + 1 >= *argc) {
				fprintf(stderr, "dsv4 %s: option '%s' needs a value\n(try 'dsv4 %s --help')\n", cmd, arg, cmd);
				return CLI_EXIT_USAGE;
			}
			v = argv[++i];
		}
		int rc = apply(ctx, cmd, names[which], which, v);
		if (rc)
			return rc;
	}
	argv[out] = NULL;
	*argc = out;
	return 0;
}
