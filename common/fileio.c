/*
 * common/fileio.c: whole-file reads (common/fileio.h). open + fstat + read
 * rather than stdio: one read call for the common case, no FILE buffer
 * copy, and O_NONBLOCK so that a FIFO given by mistake cannot hang the open.
 */
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum status file_read_all(const char *path, size_t max_bytes, char **buf, size_t *n_bytes, struct err *e)
{
	*buf = NULL;
	*n_bytes = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return err_set(e, errno == ENOENT ? ST_NOTFOUND : ST_IO, "%s: cannot open: %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		close(fd);
		return err_set(e, ST_IO, "%s: not a regular file", path);
	}
	if ((uint64_t)sb.st_size > max_bytes) {
		close(fd);
		return err_set(e, ST_INVALID, "%s: %lld bytes, more than the %zu allowed", path, (long long)sb.st_size,
			       max_bytes);
	}
	size_t n = (size_t)sb.st_size;
	char *b = malloc(n + 1);
	if (!b) {
		close(fd);
		return err_set(e, ST_NOMEM, "%s: out of memory (%zu bytes)", path, n + 1);
	}
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, b + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			int err = r < 0 ? errno : 0;
			free(b);
			close(fd);
			return err_set(e, ST_IO, "%s: read failed: %s", path, err ? strerror(err) : "file shrank");
		}
		got += (size_t)r;
	}
	close(fd);
	b[n] = '\0';
	*buf = b;
	*n_bytes = n;
	return ST_OK;
}
