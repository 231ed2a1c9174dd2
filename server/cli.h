/*
 * server/cli.h: the subcommands of the dsv4 binary.
 *
 * Each subcommand is int cmd_<name>(int argc, char **argv), argv[0] being the
 * subcommand's name; it returns the process exit status (0 ok, 1 runtime
 * failure, 2 usage error) and prints its own errors.
 */
#ifndef DSV4_SERVER_CLI_H
#define DSV4_SERVER_CLI_H

struct cli_command {
	const char *name;
	const char *summary;
	int (*run)(int argc, char **argv);
};

/* NULL-terminated table, in cli.c. */
extern const struct cli_command cli_commands[];

/* Exit statuses shared by all subcommands. */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

int cmd_version(int argc, char **argv);
/* ---- checkpoint ---- */
int cmd_inspect(int argc, char **argv);
/* ---- tokenizer ---- */
int cmd_tokenize(int argc, char **argv);
/* ---- kernels ---- */
int cmd_kernels(int argc, char **argv);
/* ---- comm ---- */
/* ---- forward pass ---- */
int cmd_generate(int argc, char **argv);
/* ---- openai server ---- */
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv); /* bench: server/cmd_bench.c */

#endif
