/*
 * server/flagnum.h: the number parsers the subcommands' flags share
 * (cmd_serve.c, load_args.c, serve_guard.c): a whole decimal string in a
 * closed range, or false. Not a public header.
 */
#ifndef DSV4_SERVER_FLAGNUM_H
#define DSV4_SERVER_FLAGNUM_H

#include <stdbool.h>

/* s is a base-10 integer in lo..hi (nothing after it): *out, true. */
bool flag_parse_long(const char *s, long lo, long hi, long *out);
/* s is a number in lo..hi (nothing after it, not NaN): *out, true. */
bool flag_parse_double(const char *s, double lo, double hi, double *out);

#endif
