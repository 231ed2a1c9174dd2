/*
 * server/flags.h: what the subcommands' flag parsers share (cmd_serve.c,
 * load_args.c, serve_guard.c): numbers in a closed range, and taking a
 * family of "--name V" / "--name=V" flags out of argv so that each family
 * is parsed by its own module before the command's own parser sees the
 * rest. Not a public header.
 */
#ifndef DSV4_SERVER_FLAGS_H
#define DSV4_SERVER_FLAGS_H

#include <stdbool.h>

/* s is a base-10 integer in lo..hi (nothing after it): *out, true. */
bool flag_parse_long(const char *s, long lo, long hi, long *out);
/* s is a number in lo..hi (nothing after it, not NaN): *out, true. */
bool flag_parse_double(const char *s, double lo, double hi, double *out);

/* Calls apply(ctx, cmd, names[k], k, value) for each "--name V" /
 * "--name=V" of names in argv[1..] and removes them; "--" ends the scan.
 * A name whose bit is set in no_value takes no separate value (apply gets
 * the "=V" part, or NULL). A non-zero return of apply is returned at once;
 * a missing value is a usage error. 0, or that exit code. */
int flag_take(int *argc, char **argv, const char *cmd, const char *const *names, int n_names, unsigned no_value,
	      int (*apply)(void *ctx, const char *cmd, const char *name, int k, const char *v), void *ctx);

#endif
