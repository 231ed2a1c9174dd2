/*
 * server/serve_guard.h: the secure-service flags of `dsv4 serve` (issue 17):
 * where the API key comes from, whether an open server may listen on the
 * network, and the HTTP budgets (request body size, connections).
 *
 * Secure defaults: binding an address other than loopback without an API key
 * refuses to start unless --allow-unauthenticated is given (an open model
 * server on the network is a mistake far more often than a choice);
 * --api-key-file keeps the key out of /proc/PID/cmdline, which every local
 * user can read; a keyless loopback server checks the Host header (api.c) so
 * that a web page cannot reach it through DNS rebinding.
 *
 * Parsed like the tensor-parallel flags: serve_guard_extract() takes them out
 * of argv before cmd_serve.c's own parser, so that file only grows two calls.
 */
#ifndef DSV4_SERVER_SERVE_GUARD_H
#define DSV4_SERVER_SERVE_GUARD_H

#include <stdbool.h>
#include <stddef.h>

/* Default request body limit: a chat request with a long context is a few
 * MB of JSON; 8 MB leaves room and caps what parsing one request costs. */
#define SERVE_GUARD_DEFAULT_BODY_MB 8
/* Connections: MHD's own default is about FD_SETSIZE; an explicit limit, and
 * a per-address one so that one client cannot take every slot. */
#define SERVE_GUARD_DEFAULT_MAX_CONNECTIONS 1000
#define SERVE_GUARD_DEFAULT_MAX_CONNECTIONS_PER_IP 128

struct serve_guard_args {
	const char *api_key_file;      /* --api-key-file */
	bool allow_unauthenticated;    /* --allow-unauthenticated */
	long max_body_mb;              /* --max-request-body-mb */
	long max_connections;          /* --max-connections */
	long max_connections_per_ip;   /* --max-connections-per-ip (0 = no per-address limit) */
	long max_request_seconds;      /* --max-request-seconds: headers + body must arrive within it */
	const char *key_storage;       /* the key read from api_key_file (a static buffer) */
};

/* Takes the flags out of argv (shifting the rest down, updating *argc).
 * 0, or CLI_EXIT_USAGE after printing why. */
int serve_guard_extract(int *argc, char **argv, struct serve_guard_args *g);
/* Usage lines of these flags. */
const char *serve_guard_usage(void);
/* After the other flags: reads --api-key-file into *api_key (which then
 * points into g), and refuses a non-loopback host without a key unless
 * --allow-unauthenticated. 0 or CLI_EXIT_USAGE after printing why. */
int serve_guard_check(struct serve_guard_args *g, const char *host, const char **api_key);
/* True for 127.0.0.0/8, ::1, "localhost" and ::ffff:127.x. */
bool serve_guard_is_loopback(const char *host);
/* True when a Host header value (host[:port], [v6]:port) names this machine
 * by a loopback name. */
bool serve_guard_host_header_ok(const char *value);

#endif
