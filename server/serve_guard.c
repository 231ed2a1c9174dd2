/*
 * server/serve_guard.c: the secure-service flags of `dsv4 serve` and their
 * checks (server/serve_guard.h).
 */
#include "server/serve_guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/log.h"
#include "scheduler/scheduler.h"
#include "server/cli.h"
#include "server/flags.h"
#include "server/http.h"

static int guard__bad(const char *flag, const char *v, const char *want)
{
	fprintf(stderr, "dsv4 serve: %s '%s': expected %s\n(try 'dsv4 serve --help')\n", flag, v, want);
	return CLI_EXIT_USAGE;
}

/* One flag of the family (flag_take's apply); names in serve_guard_extract. */
static int guard_apply(void *ctx, const char *cmd, const char *name, int which, const char *v)
{
	(void)cmd;
	(void)name;
	struct serve_guard_args *g = ctx;
	switch (which) {
	case 0:
		if (!v[0])
			return guard__bad("--api-key-file", v, "a file name");
		g->api_key_file = v;
		break;
	case 1:
		if (v)
			return guard__bad("--allow-unauthenticated", v, "no value");
		g->allow_unauthenticated = true;
		break;
	case 2:
		if (!flag_parse_long(v, 1, 4096, &g->max_body_mb))
			return guard__bad("--max-request-body-mb", v, "an integer in 1..4096");
		break;
	case 3:
		if (!flag_parse_long(v, 1, 1000000, &g->max_connections))
			return guard__bad("--max-connections", v, "an integer in 1..1000000");
		break;
	case 4:
		if (!flag_parse_long(v, 0, 1000000, &g->max_connections_per_ip))
			return guard__bad("--max-connections-per-ip", v, "an integer in 0..1000000 (0 = no limit)");
		break;
	case 5:
		if (!flag_parse_long(v, 1, 86400, &g->max_request_seconds))
			return guard__bad("--max-request-seconds", v, "an integer in 1..86400");
		break;
	case 6: { /* process-wide: the HTTP layer's default (http.h) */
		long s;
		if (!flag_parse_long(v, 1, 86400, &s))
			return guard__bad("--max-write-stall-seconds", v, "an integer in 1..86400");
		http_set_default_write_stall_s((unsigned)s);
		break;
	}
	case 7: { /* process-wide: the scheduler's stream bound (scheduler.h) */
		long mb;
		if (!flag_parse_long(v, 1, 4096, &mb))
			return guard__bad("--max-stream-backlog-mb", v, "an integer in 1..4096");
		sched_set_stream_backlog_bytes((size_t)mb << 20);
		break;
	}
	}
	return 0;
}

int serve_guard_extract(int *argc, char **argv, struct serve_guard_args *g)
{
	*g = (struct serve_guard_args){.max_body_mb = SERVE_GUARD_DEFAULT_BODY_MB,
				       .max_connections = SERVE_GUARD_DEFAULT_MAX_CONNECTIONS,
				       .max_connections_per_ip = SERVE_GUARD_DEFAULT_MAX_CONNECTIONS_PER_IP,
				       .max_request_seconds = 60};
	static const char *const names[] = {"--api-key-file", "--allow-unauthenticated", "--max-request-body-mb",
					    "--max-connections", "--max-connections-per-ip", "--max-request-seconds",
					    "--max-write-stall-seconds", "--max-stream-backlog-mb"};
	return flag_take(argc, argv, "serve", names, (int)(sizeof names / sizeof names[0]), 1u << 1, guard_apply, g);
}

const char *serve_guard_usage(void)
{
	return "security and budgets (docs/api.md, \"Security\"):\n"
	       "  --api-key-file FILE          read the API key from FILE (keeps it out of the process list)\n"
	       "  --allow-unauthenticated      allow a non-loopback --host without an API key (refused otherwise)\n"
	       "  --max-request-body-mb N      largest request body, MB (default 8); larger ones get 413\n"
	       "  --max-connections N          open HTTP connections at most (default 1000)\n"
	       "  --max-connections-per-ip N   open connections per client address (default 128; 0 = no limit)\n"
	       "  --max-request-seconds S      a request's headers and body must arrive within S (default 60)\n"
	       "  --max-write-stall-seconds S  cut a response the client takes nothing of for S (default 60)\n"
	       "  --max-stream-backlog-mb N    abort a request whose client reads slower than it generates once\n"
	       "                               N MB wait for it (default 4)\n";
}

bool serve_guard_is_loopback(const char *host)
{
	if (!host || !host[0])
		return false;
	if (!strcasecmp(host, "localhost"))
		return true;
	struct in_addr a4;
	struct in6_addr a6;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1) {
		if (IN6_IS_ADDR_LOOPBACK(&a6))
			return true;
		if (IN6_IS_ADDR_V4MAPPED(&a6))
			return a6.s6_addr[12] == 127;
	}
	return false;
}

bool serve_guard_host_header_ok(const char *value)
{
	if (!value)
		return true; /* HTTP/1.0 without Host: no browser sends that */
	char host[256];
	size_t n = strlen(value);
	if (n == 0 || n >= sizeof host)
		return false;
	if (value[0] == '[') {
		const char *close = strchr(value, ']');
		if (!close)
			return false;
		size_t hn = (size_t)(close - value - 1);
		memcpy(host, value + 1, hn);
		host[hn] = '\0';
		if (close[1] && close[1] != ':')
			return false;
	} else {
		const char *colon = strchr(value, ':');
		size_t hn = colon ? (size_t)(colon - value) : n;
		memcpy(host, value, hn);
		host[hn] = '\0';
	}
	size_t hn = strlen(host);
	if (hn && host[hn - 1] == '.') /* "localhost." */
		host[hn - 1] = '\0';
	return serve_guard_is_loopback(host);
}

static int guard__read_key(struct serve_guard_args *g)
{
	FILE *f = fopen(g->api_key_file, "re");
	if (!f) {
		fprintf(stderr, "dsv4 serve: --api-key-file %s: %s\n", g->api_key_file, strerror(errno));
		return CLI_EXIT_USAGE;
	}
	struct stat sb;
	if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & (S_IRWXG | S_IRWXO)))
		log_msg(LOG_WARN, "serve", "--api-key-file %s is readable by other users (mode %03o): chmod 600 it",
			g->api_key_file, (unsigned)(sb.st_mode & 0777));
	char buf[4096];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	bool more = fgetc(f) != EOF;
	fclose(f);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
		n--;
	buf[n] = '\0';
	if (more || n == 0 || strlen(buf) != n || strpbrk(buf, "\r\n")) {
		fprintf(stderr, "dsv4 serve: --api-key-file %s: expected one line with the key (1..4000 bytes)\n",
			g->api_key_file);
		return CLI_EXIT_USAGE;
	}
	/* One key per process, alive until exit: a static buffer, no free. */
	static char key[4096];
	memcpy(key, buf, n + 1);
	memset(buf, 0, sizeof buf);
	g->key_storage = key;
	return 0;
}

int serve_guard_check(struct serve_guard_args *g, const char *host, const char **api_key)
{
	if (g->api_key_file) {
		int rc = guard__read_key(g);
		if (rc)
			return rc;
		*api_key = g->key_storage;
	}
	bool keyed = *api_key && (*api_key)[0];
	if (!keyed && !serve_guard_is_loopback(host)) {
		if (!g->allow_unauthenticated) {
			fprintf(stderr,
				"dsv4 serve: --host %s is reachable from the network, and no API key is set: anyone who "
				"reaches it can use the model. Set a key (--api-key-file FILE, or $DSV4_API_KEY), or pass "
				"--allow-unauthenticated if that is what you want\n",
				host ? host : "(null)");
			return CLI_EXIT_USAGE;
		}
		log_msg(LOG_WARN, "serve", "serving on %s without an API key (--allow-unauthenticated)", host);
	}
	return 0;
}
