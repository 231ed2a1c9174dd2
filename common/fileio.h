/*
 * common/fileio.h: reading a whole small file (config.json, the checkpoint
 * index, tokenizer.json) into memory, with the checks every such reader
 * needs: a regular file, a size limit, short reads and EINTR handled, and
 * an error that names the file.
 */
#ifndef DSV4_COMMON_FILEIO_H
#define DSV4_COMMON_FILEIO_H

#include <stddef.h>

#include "status.h"

/* *buf = the bytes of the regular file at path (malloc'd, NUL-terminated),
 * *n_bytes its size. ST_NOTFOUND (no such file), ST_IO (cannot open, not a
 * regular file, a read error), ST_INVALID (more than max_bytes), ST_NOMEM.
 * On failure *buf is NULL. */
enum status file_read_all(const char *path, size_t max_bytes, char **buf, size_t *n_bytes, struct err *e) DSV4_WUR;

#endif
