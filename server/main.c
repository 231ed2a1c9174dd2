/*
 * server/main.c: `dsv4 <subcommand> [args]`. Dispatches to the table in cli.c.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: dsv4 <command> [options]\n\ncommands:\n");
	for (const struct cli_command *c = cli_commands; c->name; c++)
		fprintf(f, "  %-10s %s\n", c->name, c->summary);
	fprintf(f, "\n'dsv4 <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return CLI_EXIT_USAGE;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return CLI_EXIT_OK;
	}
	if (!strcmp(argv[1], "--version"))
		return cmd_version(argc - 1, argv + 1);
	for (const struct cli_command *c = cli_commands; c->name; c++)
		if (!strcmp(argv[1], c->name))
			return c->run(argc - 1, argv + 1);
	fprintf(stderr, "dsv4: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return CLI_EXIT_USAGE;
}
