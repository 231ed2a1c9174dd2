/*
 * common/status.h: the one status vocabulary of dsv4, and the error message
 * that travels with it.
 *
 * Functions that can fail return enum status and, when they take a
 * struct err *, fill it with one line that names what failed and why
 * ("model/config.json: field hidden_size: must be a positive integer").
 * Nothing here prints or exits; the caller decides (style.md rules 4 and 6).
 */
#ifndef DSV4_COMMON_STATUS_H
#define DSV4_COMMON_STATUS_H

#include <stddef.h>

#define DSV4_WUR __attribute__((warn_unused_result))
#define DSV4_PRINTF(a, b) __attribute__((format(printf, a, b)))

enum status {
	ST_OK = 0,
	ST_INVALID = -1,     /* bad input: request, flag, checkpoint */
	ST_NOMEM = -2,       /* allocation failed */
	ST_UNSUPPORTED = -3, /* valid but not implemented / not on this device */
	ST_BUSY = -4,        /* try later: queue full, draining */
	ST_CUDA = -5,        /* a CUDA / cuBLASLt / NCCL call failed */
	ST_IO = -6,          /* open, read, mmap, socket */
	ST_NOTFOUND = -7,    /* a named thing does not exist */
	ST_TIMEOUT = -8,     /* a peer or a deadline did not come */
	ST_ABORTED = -9,     /* cancelled by the caller */
};

/* Static, never NULL: "ok", "invalid argument", ... */
const char *status_str(enum status st);

/* Error message buffer; the first error set stays unless err_clear() is called. */
#define ERR_MSG_BYTES 512
struct err {
	enum status st;
	char msg[ERR_MSG_BYTES];
};

/* Record st and a formatted message in e (may be NULL) and return st, so that
 * a failing path is one line: return err_set(e, ST_INVALID, "...", ...). */
enum status err_set(struct err *e, enum status st, const char *fmt, ...) DSV4_PRINTF(3, 4);

/* Prefix the message already in e with "prefix: " (for adding context such as
 * a file or layer name on the way up). Returns e->st. */
enum status err_prefix(struct err *e, const char *fmt, ...) DSV4_PRINTF(2, 3);

void err_clear(struct err *e);

#endif
