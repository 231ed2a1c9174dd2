/*
 * server/notify.c: sd_notify(3) as a datagram on $NOTIFY_SOCKET. The
 * protocol is one AF_UNIX SOCK_DGRAM message of newline-separated
 * KEY=VALUE assignments; an abstract socket is spelled with a leading '@'.
 */
#include "notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum status server_notify(const char *state, struct err *e)
{
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !path[0])
		return ST_OK;
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	size_t n = strlen(path);
	if (n >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@'))
		return err_set(e, ST_INVALID, "NOTIFY_SOCKET '%s' is not an absolute path or abstract name", path);
	memcpy(sa.sun_path, path, n);
	if (path[0] == '@')
		sa.sun_path[0] = '\0';
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return err_set(e, ST_IO, "sd_notify: socket: %s", strerror(errno));
	ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
	int err = errno;
	close(fd);
	if (w < 0)
		return err_set(e, ST_IO, "sd_notify to %s: %s", path, strerror(err));
	return ST_OK;
}

uint64_t server_notify_watchdog_usec(void)
{
	const char *us = getenv("WATCHDOG_USEC");
	if (!us || !us[0])
		return 0;
	const char *pid = getenv("WATCHDOG_PID");
	if (pid && pid[0] && strtol(pid, NULL, 10) != (long)getpid())
		return 0;
	char *end = NULL;
	unsigned long long v = strtoull(us, &end, 10);
	return (end && !*end) ? (uint64_t)v : 0;
}
