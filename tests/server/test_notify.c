/*
 * tests/server/test_notify.c: the sd_notify datagram (server/notify.h) to a
 * path socket and to an abstract one, the no-op without $NOTIFY_SOCKET, a
 * bad address, and $WATCHDOG_USEC / $WATCHDOG_PID parsing.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "server/notify.h"
#include "tests/test.h"

static int bind_dgram(const char *name, bool abstract)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	size_t n = strlen(name);
	memcpy(sa.sun_path + (abstract ? 1 : 0), name, n);
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (abstract ? 1 : 0));
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) != 0) {
		perror("bind");
		return -1;
	}
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return fd;
}

static void expect_msg(int fd, const char *want)
{
	char buf[256];
	ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
	T_CHECKF(n == (ssize_t)strlen(want), "received %zd bytes", n);
	if (n >= 0) {
		buf[n] = '\0';
		T_CHECKF(!strcmp(buf, want), "got '%s' want '%s'", buf, want);
	}
}

int main(void)
{
	struct err e = {0};
	unsetenv("NOTIFY_SOCKET");
	T_CHECK(server_notify("READY=1", &e) == ST_OK); /* no socket: a no-op */

	char path[108];
	snprintf(path, sizeof path, "/tmp/dsv4-notify-%d-%ld.sock", (int)getpid(), (long)time(NULL));
	int fd = bind_dgram(path, false);
	T_CHECK(fd >= 0);
	setenv("NOTIFY_SOCKET", path, 1);
	T_CHECK(server_notify("READY=1\nSTATUS=x", &e) == ST_OK);
	expect_msg(fd, "READY=1\nSTATUS=x");
	T_CHECK(server_notify("WATCHDOG=1", &e) == ST_OK);
	expect_msg(fd, "WATCHDOG=1");
	close(fd);
	unlink(path);
	/* The socket is gone: an error, never a crash. */
	T_CHECK(server_notify("STOPPING=1", &e) == ST_IO);

	char abs_name[64];
	snprintf(abs_name, sizeof abs_name, "dsv4-notify-abs-%d", (int)getpid());
	fd = bind_dgram(abs_name, true);
	T_CHECK(fd >= 0);
	char env[80];
	snprintf(env, sizeof env, "@%s", abs_name);
	setenv("NOTIFY_SOCKET", env, 1);
	T_CHECK(server_notify("STOPPING=1", &e) == ST_OK);
	expect_msg(fd, "STOPPING=1");
	close(fd);

	setenv("NOTIFY_SOCKET", "relative/path", 1);
	T_CHECK(server_notify("READY=1", &e) == ST_INVALID);
	unsetenv("NOTIFY_SOCKET");

	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	T_CHECK(server_notify_watchdog_usec() == 0);
	setenv("WATCHDOG_USEC", "30000000", 1);
	T_CHECK(server_notify_watchdog_usec() == 30000000u);
	char pid[32];
	snprintf(pid, sizeof pid, "%d", (int)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	T_CHECK(server_notify_watchdog_usec() == 30000000u);
	setenv("WATCHDOG_PID", "1", 1);
	T_CHECK(server_notify_watchdog_usec() == 0); /* meant for another process */
	unsetenv("WATCHDOG_PID");
	setenv("WATCHDOG_USEC", "12x", 1);
	T_CHECK(server_notify_watchdog_usec() == 0);
	return test_exit();
}
