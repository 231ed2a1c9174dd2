/*
 * server/notify.h: systemd's sd_notify protocol without libsystemd.
 *
 * When $NOTIFY_SOCKET is set (Type=notify units), each call sends one
 * datagram ("READY=1", "STOPPING=1", "WATCHDOG=1", "STATUS=...") to that
 * AF_UNIX socket (a path, or an abstract name when it starts with '@').
 * Without $NOTIFY_SOCKET every call is a no-op that returns ST_OK, so the
 * server behaves the same outside systemd.
 */
#ifndef DSV4_SERVER_NOTIFY_H
#define DSV4_SERVER_NOTIFY_H

#include <stdint.h>

#include "common/status.h"

/* Send state (e.g. "READY=1\nSTATUS=serving"). ST_IO when the socket is
 * set but the send fails (the caller logs it; it is never fatal). */
enum status server_notify(const char *state, struct err *e) DSV4_WUR;

/* The watchdog interval systemd asks for ($WATCHDOG_USEC, honouring
 * $WATCHDOG_PID), in microseconds; 0 when there is no watchdog. */
uint64_t server_notify_watchdog_usec(void);

#endif
