/*
 * common/status.c: status names and the error message buffer.
 */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *status_str(enum status st)
{
	switch (st) {
	case ST_OK: return "ok";
	case ST_INVALID: return "invalid argument";
	case ST_NOMEM: return "out of memory";
	case ST_UNSUPPORTED: return "unsupported";
	case ST_BUSY: return "busy";
	case ST_CUDA: return "cuda error";
	case ST_IO: return "i/o error";
	case ST_NOTFOUND: return "not found";
	case ST_TIMEOUT: return "timed out";
	case ST_ABORTED: return "aborted";
	}
	return "unknown status";
}

enum status err_set(struct err *e, enum status st, const char *fmt, ...)
{
	if (!e)
		return st;
	e->st = st;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	return st;
}

enum status err_prefix(struct err *e, const char *fmt, ...)
{
	if (!e)
		return ST_INVALID;
	char prefix[ERR_MSG_BYTES];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	char old[ERR_MSG_BYTES];
	memcpy(old, e->msg, sizeof old);
	/* Truncation is intended: the message is capped at ERR_MSG_BYTES. */
	size_t n = strnlen(prefix, sizeof e->msg - 1);
	memcpy(e->msg, prefix, n);
	if (n + 2 < sizeof e->msg) {
		memcpy(e->msg + n, ": ", 2);
		n += 2;
	}
	size_t rest = strnlen(old, sizeof old - 1);
	if (rest > sizeof e->msg - 1 - n)
		rest = sizeof e->msg - 1 - n;
	memcpy(e->msg + n, old, rest);
	e->msg[n + rest] = '\0';
	return e->st;
}

void err_clear(struct err *e)
{
	if (!e)
		return;
	e->st = ST_OK;
	e->msg[0] = '\0';
}
