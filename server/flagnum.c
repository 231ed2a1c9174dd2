/*
 * server/flagnum.c: flag values as numbers in a range (flagnum.h), one
 * parser for every subcommand so that "--port 8e3" or "--max-num-seqs 4x"
 * is refused the same way everywhere.
 */
#include "flagnum.h"

#include <errno.h>
#include <stdlib.h>

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
