/*
 * comm/bootstrap.c: the TCP rendezvous of a multi-node group and its
 * liveness channel (protocol in comm/bootstrap.h).
 *
 * Plain blocking sockets, with poll() before every read, write, accept and
 * connect so that each step respects the one handshake deadline. Messages are
 * framed with a fixed header whose magic, version and length are checked
 * before any payload is read, so a stray client or a port scanner is a clear
 * "not a dsv4 bootstrap peer" error, never a large allocation or a hang.
 * Writes use MSG_NOSIGNAL: a peer that vanished is an error value, not a
 * SIGPIPE.
 */
#include "comm/bootstrap.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/limits.h"
#include "common/log.h"
#include "common/timeutil.h"

enum boot_type {
	BOOT_HELLO = 1,
	BOOT_WELCOME = 2,
	BOOT_REJECT = 3,
	BOOT_BYE = 4,
	BOOT_CHALLENGE = 5,
};

#define BOOT_HELLO_FIXED_BYTES 18 /* rank, n_ranks, fingerprint, version bytes */
#define BOOT_WELCOME_BYTES (4 + COMM_UNIQUE_ID_BYTES + COMM_MAC_BYTES)

#define BOOT_HEADER_BYTES 12

struct boot_peer {
	int fd;         /* -1 once closed */
	int rank;
	char addr[80];  /* "host:port" for messages */
	uint8_t challenge[COMM_CHALLENGE_BYTES]; /* master: the worker's, answered in the welcome */
};

struct comm_boot {
	int rank;
	int n_ranks;
	uint8_t unique_id[COMM_UNIQUE_ID_BYTES];
	struct boot_peer *peers; /* master: ranks 1..n-1 at index rank-1; worker: the master */
	int n_peers;
	pthread_mutex_t mu;      /* peers and the lost state */
	enum status lost_st;     /* ST_OK while every peer is alive */
	char lost_msg[ERR_MSG_BYTES];
	bool left;
	/* watcher */
	bool watching;
	pthread_t watcher;
	atomic_int stop;
	comm_boot_lost_fn lost_cb;
	void *lost_ctx;
};

/* ---- Time and byte order ---- */

static int boot__remaining_ms(double deadline_s)
{
	double left = deadline_s - time_mono_s();
	if (left <= 0)
		return 0;
	return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

/* ---- Socket I/O with a deadline ---- */

/* Writes all n bytes before the deadline. */
static enum status boot__write_all(int fd, const void *buf, size_t n, double deadline_s, const char *who,
				   struct err *e)
{
	const uint8_t *p = buf;
	while (n > 0) {
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };
		int rc = poll(&pfd, 1, boot__remaining_ms(deadline_s));
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc == 0)
			return err_set(e, ST_TIMEOUT, "bootstrap: %s: timed out sending", who);
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return err_set(e, ST_IO, "bootstrap: %s: send: %s", who, strerror(errno));
		}
		p += w;
		n -= (size_t)w;
	}
	return ST_OK;
}

/* Reads exactly n bytes before the deadline. *eof is set when the peer closed
 * the connection before the first byte (a clean close). */
static enum status boot__read_full(int fd, void *buf, size_t n, double deadline_s, const char *who, bool *eof,
				   struct err *e)
{
	uint8_t *p = buf;
	size_t got = 0;
	*eof = false;
	while (got < n) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int rc = poll(&pfd, 1, boot__remaining_ms(deadline_s));
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc == 0)
			return err_set(e, ST_TIMEOUT, "bootstrap: %s: timed out waiting for data", who);
		ssize_t r = recv(fd, p + got, n - got, 0);
		if (r < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return err_set(e, ST_IO, "bootstrap: %s: connection lost: %s", who, strerror(errno));
		}
		if (r == 0) {
			*eof = got == 0;
			return err_set(e, ST_IO, "bootstrap: %s: connection closed%s", who,
				       got ? " in the middle of a message" : "");
		}
		got += (size_t)r;
	}
	return ST_OK;
}

static enum status boot__send_frame(int fd, enum boot_type type, const void *payload, size_t n, double deadline_s,
				    const char *who, struct err *e)
{
	uint8_t buf[BOOT_HEADER_BYTES + COMM_BOOT_MAX_PAYLOAD_BYTES];
	if (n > COMM_BOOT_MAX_PAYLOAD_BYTES)
		n = COMM_BOOT_MAX_PAYLOAD_BYTES;
	put_u32(buf, COMM_BOOT_MAGIC);
	put_u16(buf + 4, COMM_BOOT_PROTOCOL_VERSION);
	put_u16(buf + 6, (uint16_t)type);
	put_u32(buf + 8, (uint32_t)n);
	if (n)
		memcpy(buf + BOOT_HEADER_BYTES, payload, n);
	return boot__write_all(fd, buf, BOOT_HEADER_BYTES + n, deadline_s, who, e);
}

/* Reads one frame into payload (COMM_BOOT_MAX_PAYLOAD_BYTES + 1 bytes, NUL
 * terminated for text). Garbage is ST_IO with a message that says so. */
static enum status boot__recv_frame(int fd, enum boot_type *type, uint8_t *payload, size_t *n, double deadline_s,
				    const char *who, bool *eof, struct err *e)
{
	uint8_t h[BOOT_HEADER_BYTES];
	enum status st = boot__read_full(fd, h, sizeof h, deadline_s, who, eof, e);
	if (st != ST_OK)
		return st;
	uint32_t magic = get_u32(h);
	if (magic != COMM_BOOT_MAGIC)
		return err_set(e, ST_IO,
			       "bootstrap: %s: bad magic 0x%08x (expected 0x%08x): not a dsv4 bootstrap peer (wrong port?)",
			       who, magic, COMM_BOOT_MAGIC);
	uint16_t proto = get_u16(h + 4);
	if (proto != COMM_BOOT_PROTOCOL_VERSION)
		return err_set(e, ST_INVALID,
			       "bootstrap: %s: speaks bootstrap protocol version %u, this dsv4 speaks %u (different dsv4 builds)",
			       who, proto, COMM_BOOT_PROTOCOL_VERSION);
	uint32_t len = get_u32(h + 8);
	if (len > COMM_BOOT_MAX_PAYLOAD_BYTES)
		return err_set(e, ST_IO, "bootstrap: %s: message of %u bytes exceeds the limit of %u: garbage on the socket",
			       who, len, COMM_BOOT_MAX_PAYLOAD_BYTES);
	bool eof2;
	if (len) {
		st = boot__read_full(fd, payload, len, deadline_s, who, &eof2, e);
		if (st != ST_OK)
			return st;
	}
	payload[len] = '\0';
	*type = (enum boot_type)get_u16(h + 6);
	*n = len;
	return ST_OK;
}

static void boot__describe_peer(int fd, char *out, size_t n)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	char host[64] = "?";
	int port = 0;
	if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET) {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;
			inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
			port = ntohs(a->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
			port = ntohs(a->sin6_port);
		}
	}
	snprintf(out, n, "%s:%d", host, port);
}

static void boot__keepalive(int fd)
{
	int one = 1, idle = COMM_BOOT_KEEPIDLE_S, intvl = COMM_BOOT_KEEPINTVL_S, cnt = COMM_BOOT_KEEPCNT;
	/* Best effort: without keepalive a vanished machine is noticed later. */
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Puts the caller's context in front of a message from the I/O helpers,
 * replacing their generic "bootstrap: " (no double prefixes). */
static enum status boot__context(struct err *e, const char *ctx)
{
	size_t n = strlen(ctx);
	if (!strncmp(e->msg, ctx, n))
		return e->st;
	if (!strncmp(e->msg, "bootstrap: ", 11))
		memmove(e->msg, e->msg + 11, strlen(e->msg + 11) + 1);
	return err_prefix(e, "%s", ctx);
}

/* ---- Master ---- */

static enum status boot__listen_on(const char *node, int port_num, int *out_fd, int *out_errno, struct err *e)
{
	char port[16];
	snprintf(port, sizeof port, "%d", port_num);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
	*out_errno = 0;
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(node, port, &hints, &res);
	if (rc != 0)
		return err_set(e, ST_IO, "bootstrap master: cannot resolve listen address %s: %s", node ? node : "*",
			       gai_strerror(rc));
	/* (node may be NULL: AI_PASSIVE then gives the wildcard addresses.) */
	/* Prefer IPv4 for the wildcard: "all interfaces" must include the
	 * cluster network whatever the IPv6 configuration is. */
	int fd = -1, last_errno = 0;
	for (int pass = 0; pass < 2 && fd < 0; pass++) {
		for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
			if ((pass == 0) != (ai->ai_family == AF_INET))
				continue;
			int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
			if (s < 0) {
				last_errno = errno;
				continue;
			}
			int one = 1;
			(void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
			if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, COMM_MAX_RANKS) == 0) {
				fd = s;
			} else {
				last_errno = errno;
				close(s);
			}
		}
	}
	freeaddrinfo(res);
	*out_errno = last_errno;
	if (fd < 0)
		return err_set(e, ST_IO, "bootstrap master: cannot listen on %s:%d: %s", node ? node : "*", port_num,
			       strerror(last_errno));
	*out_fd = fd;
	return ST_OK;
}

/* Listens on the master address, or on all interfaces when none is given.
 * The same --master-addr is usually passed to every node; when it is not an
 * address of this machine (a NAT or DNS alias), fall back to all interfaces
 * instead of failing. */
static enum status boot__listen(const struct comm_boot_options *opt, int *out_fd, struct err *e)
{
	const char *node = opt->master_addr && opt->master_addr[0] ? opt->master_addr : NULL;
	int err_no = 0;
	enum status st = boot__listen_on(node, opt->master_port, out_fd, &err_no, e);
	if (st != ST_OK && node && err_no == EADDRNOTAVAIL) {
		log_msg(LOG_WARN, "comm", "bootstrap master: %s is not an address of this machine; listening on all interfaces",
			node);
		err_clear(e);
		st = boot__listen_on(NULL, opt->master_port, out_fd, &err_no, e);
	}
	return st;
}

/* Checks the form of a hello and its MAC over the master's challenge. ST_IO:
 * malformed (garbage); ST_INVALID: the MAC does not match (another secret, or
 * a hello replayed from an earlier connection). */
static enum status boot__auth_hello(const struct comm_boot_options *opt, const uint8_t *challenge, const uint8_t *p,
				    size_t n, const char *who, struct err *e)
{
	if (n < BOOT_HELLO_FIXED_BYTES + 2 * COMM_MAC_BYTES)
		return err_set(e, ST_IO, "bootstrap master: %s: hello of %zu bytes is too short: garbage", who, n);
	uint16_t vlen = get_u16(p + 16);
	if (vlen > COMM_BOOT_MAX_VERSION_BYTES || (size_t)BOOT_HELLO_FIXED_BYTES + vlen + 2 * COMM_MAC_BYTES != n)
		return err_set(e, ST_IO, "bootstrap master: %s: malformed hello (version of %u bytes in %zu): garbage",
			       who, vlen, n);
	uint8_t mac[COMM_MAC_BYTES];
	comm_auth_mac(opt->secret, "dsv4 boot hello", challenge, COMM_CHALLENGE_BYTES, p, n - COMM_MAC_BYTES, mac);
	if (!comm_mac_equal(mac, p + n - COMM_MAC_BYTES))
		return err_set(e, ST_INVALID, "bootstrap master: %s: hello failed authentication (a different "
			       "--tp-secret-file, or a replayed hello)", who);
	return ST_OK;
}

/* Checks one worker's authenticated hello (form checked by boot__auth_hello).
 * On a mismatch: ST_INVALID with the reason (also what the worker is told). */
static enum status boot__check_hello(struct comm_boot *b, const struct comm_boot_options *opt, const uint8_t *p,
				     const char *who, int *rank_out, struct err *e)
{
	uint32_t rank = get_u32(p), n_ranks = get_u32(p + 4);
	uint64_t fp = get_u64(p + 8);
	uint16_t vlen = get_u16(p + 16);
	char version[COMM_BOOT_MAX_VERSION_BYTES + 1];
	memcpy(version, p + 18, vlen);
	version[vlen] = '\0';
	if ((int)n_ranks != b->n_ranks)
		return err_set(e, ST_INVALID, "world size differs: master has --nnodes %d, worker %s (rank %u) has %u",
			       b->n_ranks, who, rank, n_ranks);
	if (rank == 0 || rank >= (uint32_t)b->n_ranks)
		return err_set(e, ST_INVALID, "worker %s: rank %u out of range: workers are ranks 1..%d (rank 0 is the master)",
			       who, rank, b->n_ranks - 1);
	if (b->peers[rank - 1].fd >= 0)
		return err_set(e, ST_INVALID, "worker %s: duplicate rank %u: already taken by %s", who, rank,
			       b->peers[rank - 1].addr);
	if (strcmp(version, opt->version) != 0)
		return err_set(e, ST_INVALID, "dsv4 version differs: master %s, worker rank %u (%s) %s", opt->version,
			       rank, who, version);
	if (fp != opt->checkpoint_fingerprint)
		return err_set(e, ST_INVALID,
			       "checkpoint fingerprint differs: master 0x%016llx, worker rank %u (%s) 0x%016llx "
			       "(not the same checkpoint files)",
			       (unsigned long long)opt->checkpoint_fingerprint, rank, who, (unsigned long long)fp);
	*rank_out = (int)rank;
	return ST_OK;
}

/* Tells every connected worker (and the one being refused) why the master
 * gives up, so that they fail with the same reason instead of timing out. */
static void boot__reject_all(struct comm_boot *b, int extra_fd, const char *reason, double deadline_s)
{
	struct err ignore;
	size_t n = strnlen(reason, COMM_BOOT_MAX_REASON_BYTES);
	/* A short grace period: the workers are waiting for an answer. */
	double dl = deadline_s < time_mono_s() + 1.0 ? time_mono_s() + 1.0 : deadline_s;
	if (extra_fd >= 0)
		(void)boot__send_frame(extra_fd, BOOT_REJECT, reason, n, dl, "refused worker", &ignore);
	for (int i = 0; i < b->n_peers; i++)
		if (b->peers[i].fd >= 0)
			(void)boot__send_frame(b->peers[i].fd, BOOT_REJECT, reason, n, dl, b->peers[i].addr, &ignore);
}

static enum status boot__master(struct comm_boot *b, const struct comm_boot_options *opt, double deadline_s,
				struct err *e)
{
	int lfd = -1;
	enum status st = boot__listen(opt, &lfd, e);
	if (st != ST_OK)
		return st;
	log_msg(LOG_INFO, "comm", "bootstrap master: listening on %s:%d for %d worker(s)",
		opt->master_addr && opt->master_addr[0] ? opt->master_addr : "*", opt->master_port, b->n_ranks - 1);
	int n_joined = 0;
	uint8_t *payload = malloc(COMM_BOOT_MAX_PAYLOAD_BYTES + 1);
	if (!payload) {
		close(lfd);
		return err_set(e, ST_NOMEM, "bootstrap: out of memory");
	}
	while (n_joined < b->n_ranks - 1) {
		struct pollfd pfd = { .fd = lfd, .events = POLLIN };
		int rc = poll(&pfd, 1, boot__remaining_ms(deadline_s));
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc == 0) {
			char missing[256] = "";
			size_t len = 0;
			for (int i = 0; i < b->n_peers && len + 8 < sizeof missing; i++)
				if (b->peers[i].fd < 0)
					len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", len ? "," : "",
								i + 1);
			st = err_set(e, ST_TIMEOUT,
				     "bootstrap master: timed out after %d ms on port %d waiting for worker rank(s) %s "
				     "(%d of %d joined): is `dsv4 serve --node-rank N --master-addr <this host> --master-port %d` "
				     "running there, and is the port open?",
				     opt->timeout_ms, opt->master_port, missing, n_joined, b->n_ranks - 1, opt->master_port);
			boot__reject_all(b, -1, e->msg, deadline_s);
			break;
		}
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)
				continue;
			st = err_set(e, ST_IO, "bootstrap master: accept: %s", strerror(errno));
			break;
		}
		char who[80];
		boot__describe_peer(fd, who, sizeof who);
		enum boot_type type;
		size_t n;
		bool eof;
		/* A hello comes right after connect; a connection that stays
		 * silent (a port probe, a health check) is dropped after a few
		 * seconds and the master keeps waiting, so it cannot block the
		 * real workers. Bytes that are not a hello are an error. */
		double hello_deadline_s = time_mono_s() + COMM_BOOT_HELLO_TIMEOUT_MS / 1000.0;
		if (hello_deadline_s > deadline_s)
			hello_deadline_s = deadline_s;
		uint8_t challenge[COMM_CHALLENGE_BYTES];
		eof = false;
		st = comm_random_bytes(challenge, sizeof challenge, e);
		if (st == ST_OK)
			st = boot__send_frame(fd, BOOT_CHALLENGE, challenge, sizeof challenge, hello_deadline_s, who, e);
		if (st == ST_OK)
			st = boot__recv_frame(fd, &type, payload, &n, hello_deadline_s, who, &eof, e);
		if (st == ST_OK && type != BOOT_HELLO)
			st = err_set(e, ST_IO, "bootstrap master: %s: expected a hello, got message type %d", who,
				     (int)type);
		if (st == ST_OK)
			st = boot__auth_hello(opt, challenge, payload, n, who, e);
		if (st != ST_OK && st != ST_NOMEM) {
			/* Not (yet) a member: whatever it sent, it cannot end the group. */
			if (st == ST_IO && eof)
				log_msg(LOG_WARN, "comm", "bootstrap master: connection from %s closed without a hello "
					"(a port probe?); still waiting", who);
			else if (st == ST_TIMEOUT)
				log_msg(LOG_WARN, "comm", "bootstrap master: connection from %s stayed silent (a port "
					"probe?); dropped, still waiting", who);
			else
				log_msg(LOG_WARN, "comm", "bootstrap master: dropped a connection: %s; still waiting", e->msg);
			if (st == ST_INVALID) { /* a worker with another secret or build: tell it why */
				struct err ignore;
				(void)boot__send_frame(fd, BOOT_REJECT, e->msg, strnlen(e->msg, COMM_BOOT_MAX_REASON_BYTES),
						       time_mono_s() + 1.0, who, &ignore);
			}
			close(fd);
			st = ST_OK;
			err_clear(e);
			if (time_mono_s() < deadline_s)
				continue;
			st = err_set(e, ST_TIMEOUT, "bootstrap master: timed out after %d ms on port %d waiting for "
				     "worker(s) (%d of %d joined)", opt->timeout_ms, opt->master_port, n_joined,
				     b->n_ranks - 1);
			boot__reject_all(b, -1, e->msg, deadline_s);
			break;
		}
		int rank = -1;
		if (st == ST_OK)
			st = boot__check_hello(b, opt, payload, who, &rank, e);
		if (st == ST_OK)
			memcpy(b->peers[rank - 1].challenge, payload + n - 2 * COMM_MAC_BYTES, COMM_CHALLENGE_BYTES);
		if (st != ST_OK) {
			boot__context(e, "bootstrap master");
			boot__reject_all(b, fd, e->msg, deadline_s);
			close(fd);
			break;
		}
		struct boot_peer *p = &b->peers[rank - 1];
		p->fd = fd;
		p->rank = rank;
		snprintf(p->addr, sizeof p->addr, "%s", who);
		n_joined++;
		log_msg(LOG_INFO, "comm", "bootstrap master: worker rank %d joined from %s (%d of %d)", rank, who, n_joined,
			b->n_ranks - 1);
	}
	free(payload);
	close(lfd);
	if (st != ST_OK)
		return st;
	/* Everyone is here: ship the id. */
	uint8_t welcome[BOOT_WELCOME_BYTES];
	put_u32(welcome, (uint32_t)b->n_ranks);
	memcpy(welcome + 4, b->unique_id, COMM_UNIQUE_ID_BYTES);
	for (int i = 0; i < b->n_peers; i++) {
		comm_auth_mac(opt->secret, "dsv4 boot welcome", b->peers[i].challenge, COMM_CHALLENGE_BYTES, welcome,
			      BOOT_WELCOME_BYTES - COMM_MAC_BYTES, welcome + BOOT_WELCOME_BYTES - COMM_MAC_BYTES);
		st = boot__send_frame(b->peers[i].fd, BOOT_WELCOME, welcome, sizeof welcome, deadline_s, b->peers[i].addr,
				      e);
		if (st != ST_OK)
			return err_prefix(e, "bootstrap master: worker rank %d", i + 1);
		boot__keepalive(b->peers[i].fd);
	}
	return ST_OK;
}

/* ---- Worker ---- */

/* One non-blocking connect attempt to every address of the master, each
 * bounded by the deadline. */
static int boot__try_connect(const struct comm_boot_options *opt, double deadline_s, char *last_err, size_t n_err)
{
	char port[16];
	snprintf(port, sizeof port, "%d", opt->master_port);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(opt->master_addr, port, &hints, &res);
	if (rc != 0) {
		snprintf(last_err, n_err, "cannot resolve %s: %s", opt->master_addr, gai_strerror(rc));
		return -1;
	}
	int fd = -1;
	for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
		int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
		if (s < 0) {
			snprintf(last_err, n_err, "socket: %s", strerror(errno));
			continue;
		}
		int err = 0;
		if (connect(s, ai->ai_addr, ai->ai_addrlen) != 0) {
			err = errno;
			if (err == EINPROGRESS) {
				struct pollfd pfd = { .fd = s, .events = POLLOUT };
				int prc = poll(&pfd, 1, boot__remaining_ms(deadline_s));
				if (prc <= 0) {
					err = prc == 0 ? ETIMEDOUT : errno;
				} else {
					socklen_t len = sizeof err;
					if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
						err = errno;
				}
			}
		}
		if (err == 0) {
			int flags = fcntl(s, F_GETFL);
			if (flags >= 0)
				(void)fcntl(s, F_SETFL, flags & ~O_NONBLOCK);
			fd = s;
		} else {
			snprintf(last_err, n_err, "%s", strerror(err));
			close(s);
		}
	}
	freeaddrinfo(res);
	return fd;
}

/* The welcome's MAC over this worker's challenge. */
static bool boot__welcome_ok(const struct comm_boot_options *opt, const uint8_t *my_challenge, const uint8_t *welcome)
{
	uint8_t mac[COMM_MAC_BYTES];
	comm_auth_mac(opt->secret, "dsv4 boot welcome", my_challenge, COMM_CHALLENGE_BYTES, welcome,
		      BOOT_WELCOME_BYTES - COMM_MAC_BYTES, mac);
	return comm_mac_equal(mac, welcome + BOOT_WELCOME_BYTES - COMM_MAC_BYTES);
}

static enum status boot__worker(struct comm_boot *b, const struct comm_boot_options *opt, double deadline_s,
				struct err *e)
{
	char who[320];
	snprintf(who, sizeof who, "master %s:%d", opt->master_addr, opt->master_port);
	char last_err[160] = "no attempt";
	int fd = -1;
	int n_attempts = 0;
	for (;;) {
		fd = boot__try_connect(opt, deadline_s, last_err, sizeof last_err);
		n_attempts++;
		if (fd >= 0 || boot__remaining_ms(deadline_s) == 0)
			break;
		int wait = boot__remaining_ms(deadline_s);
		if (wait > COMM_BOOT_CONNECT_RETRY_MS)
			wait = COMM_BOOT_CONNECT_RETRY_MS;
		struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)wait * 1000000L };
		nanosleep(&ts, NULL);
	}
	if (fd < 0)
		return err_set(e, ST_TIMEOUT,
			       "bootstrap worker rank %d: no dsv4 master at %s:%d after %d ms and %d attempts (last error: %s): "
			       "is rank 0 running with --master-port %d, and is the port reachable?",
			       b->rank, opt->master_addr, opt->master_port, opt->timeout_ms, n_attempts, last_err,
			       opt->master_port);
	struct boot_peer *p = &b->peers[0];
	p->fd = fd;
	p->rank = 0;
	snprintf(p->addr, sizeof p->addr, "%s:%d", opt->master_addr, opt->master_port);

	char ctx[64];
	snprintf(ctx, sizeof ctx, "bootstrap worker rank %d", b->rank);
	uint8_t *payload = malloc(COMM_BOOT_MAX_PAYLOAD_BYTES + 1);
	if (!payload)
		return err_set(e, ST_NOMEM, "bootstrap: out of memory");
	enum boot_type type;
	size_t n;
	bool eof;
	/* The master speaks first: its challenge. */
	enum status st = boot__recv_frame(fd, &type, payload, &n, deadline_s, who, &eof, e);
	if (st == ST_OK && type == BOOT_REJECT)
		st = err_set(e, ST_INVALID, "bootstrap worker rank %d: %s refused this node: %s", b->rank, who,
			     (const char *)payload);
	else if (st == ST_OK && (type != BOOT_CHALLENGE || n != COMM_CHALLENGE_BYTES))
		st = err_set(e, ST_IO, "bootstrap worker rank %d: %s: unexpected message type %d of %zu bytes: garbage",
			     b->rank, who, (int)type, n);
	uint8_t my_challenge[COMM_CHALLENGE_BYTES];
	if (st == ST_OK)
		st = comm_random_bytes(my_challenge, sizeof my_challenge, e);
	if (st == ST_OK) {
		size_t vlen = strlen(opt->version);
		uint8_t hello[BOOT_HELLO_FIXED_BYTES + COMM_BOOT_MAX_VERSION_BYTES + 2 * COMM_MAC_BYTES];
		put_u32(hello, (uint32_t)b->rank);
		put_u32(hello + 4, (uint32_t)b->n_ranks);
		put_u64(hello + 8, opt->checkpoint_fingerprint);
		put_u16(hello + 16, (uint16_t)vlen);
		memcpy(hello + 18, opt->version, vlen);
		size_t hn = BOOT_HELLO_FIXED_BYTES + vlen;
		memcpy(hello + hn, my_challenge, COMM_CHALLENGE_BYTES);
		hn += COMM_CHALLENGE_BYTES;
		comm_auth_mac(opt->secret, "dsv4 boot hello", payload, COMM_CHALLENGE_BYTES, hello, hn, hello + hn);
		hn += COMM_MAC_BYTES;
		st = boot__send_frame(fd, BOOT_HELLO, hello, hn, deadline_s, who, e);
	}
	if (st == ST_OK)
		st = boot__recv_frame(fd, &type, payload, &n, deadline_s, who, &eof, e);
	if (st == ST_TIMEOUT)
		err_set(e, ST_TIMEOUT,
			"bootstrap worker rank %d: %s accepted the connection but did not answer within %d ms "
			"(still waiting for other workers, or not a dsv4 master)",
			b->rank, who, opt->timeout_ms);
	else if (st != ST_OK)
		boot__context(e, ctx);
	else if (type == BOOT_REJECT)
		st = err_set(e, ST_INVALID, "bootstrap worker rank %d: %s refused this node: %s", b->rank, who,
			     (const char *)payload);
	else if (type != BOOT_WELCOME || n != BOOT_WELCOME_BYTES)
		st = err_set(e, ST_IO, "bootstrap worker rank %d: %s: unexpected message type %d of %zu bytes: garbage",
			     b->rank, who, (int)type, n);
	else if (!boot__welcome_ok(opt, my_challenge, payload))
		st = err_set(e, ST_INVALID, "bootstrap worker rank %d: %s failed authentication (not the master of "
			     "this group, or a different --tp-secret-file)", b->rank, who);
	else if ((int)get_u32(payload) != b->n_ranks)
		st = err_set(e, ST_INVALID, "bootstrap worker rank %d: %s: world size %u, expected %d", b->rank, who,
			     get_u32(payload), b->n_ranks);
	else
		memcpy(b->unique_id, payload + 4, COMM_UNIQUE_ID_BYTES);
	free(payload);
	if (st == ST_OK) {
		boot__keepalive(fd);
		log_msg(LOG_INFO, "comm", "bootstrap worker rank %d: joined %s (world of %d)", b->rank, who, b->n_ranks);
	}
	return st;
}

/* ---- Public ---- */

static void boot__close_all(struct comm_boot *b)
{
	for (int i = 0; i < b->n_peers; i++)
		if (b->peers[i].fd >= 0) {
			close(b->peers[i].fd);
			b->peers[i].fd = -1;
		}
}

static void boot__free(struct comm_boot *b)
{
	boot__close_all(b);
	pthread_mutex_destroy(&b->mu);
	free(b->peers);
	free(b);
}

enum status comm_boot_create(struct comm_boot **out, const struct comm_boot_options *opt, struct err *e)
{
	struct err local;
	if (!e)
		e = &local; /* the handshake reads back its own messages */
	err_clear(e);
	*out = NULL;
	if (!opt || opt->n_ranks < 1 || opt->n_ranks > COMM_MAX_RANKS)
		return err_set(e, ST_INVALID, "bootstrap: world size %d out of range [1, %d]", opt ? opt->n_ranks : 0,
			       COMM_MAX_RANKS);
	if (opt->rank < 0 || opt->rank >= opt->n_ranks)
		return err_set(e, ST_INVALID, "bootstrap: rank %d out of range [0, %d)", opt->rank, opt->n_ranks);
	if (opt->master_port < 1 || opt->master_port > 65535)
		return err_set(e, ST_INVALID, "bootstrap: master port %d out of range [1, 65535]", opt->master_port);
	if (opt->rank > 0 && (!opt->master_addr || !opt->master_addr[0]))
		return err_set(e, ST_INVALID, "bootstrap: worker rank %d needs the master's address (--master-addr)",
			       opt->rank);
	if (!opt->version || strlen(opt->version) > COMM_BOOT_MAX_VERSION_BYTES)
		return err_set(e, ST_INVALID, "bootstrap: version string missing or longer than %d bytes",
			       COMM_BOOT_MAX_VERSION_BYTES);
	if (opt->timeout_ms < 0)
		return err_set(e, ST_INVALID, "bootstrap: timeout_ms %d is negative", opt->timeout_ms);
	struct comm_boot *b = calloc(1, sizeof *b);
	if (!b)
		return err_set(e, ST_NOMEM, "bootstrap: out of memory");
	b->rank = opt->rank;
	b->n_ranks = opt->n_ranks;
	b->n_peers = opt->rank == 0 ? opt->n_ranks - 1 : 1;
	b->peers = calloc((size_t)(b->n_peers ? b->n_peers : 1), sizeof *b->peers);
	if (!b->peers) {
		free(b);
		return err_set(e, ST_NOMEM, "bootstrap: out of memory");
	}
	for (int i = 0; i < b->n_peers; i++)
		b->peers[i].fd = -1;
	pthread_mutex_init(&b->mu, NULL);
	b->lost_st = ST_OK;
	atomic_init(&b->stop, 0);
	if (opt->rank == 0 && opt->unique_id)
		memcpy(b->unique_id, opt->unique_id, COMM_UNIQUE_ID_BYTES);

	struct comm_boot_options o = *opt;
	if (!o.timeout_ms)
		o.timeout_ms = COMM_BOOT_DEFAULT_TIMEOUT_MS;
	double deadline_s = time_mono_s() + o.timeout_ms / 1000.0;
	enum status st = ST_OK;
	if (b->n_peers > 0)
		st = b->rank == 0 ? boot__master(b, &o, deadline_s, e) : boot__worker(b, &o, deadline_s, e);
	if (st != ST_OK) {
		log_msg(LOG_ERROR, "comm", "%s", e->msg);
		boot__free(b);
		return st;
	}
	*out = b;
	return ST_OK;
}

int comm_boot_rank(const struct comm_boot *b) { return b->rank; }
int comm_boot_n_ranks(const struct comm_boot *b) { return b->n_ranks; }
const uint8_t *comm_boot_unique_id(const struct comm_boot *b) { return b->unique_id; }

/* Reads what a readable liveness connection has to say; records the loss.
 * Caller holds mu. */
static void boot__peer_event_locked(struct comm_boot *b, struct boot_peer *p)
{
	uint8_t payload[COMM_BOOT_MAX_PAYLOAD_BYTES + 1];
	enum boot_type type;
	size_t n;
	bool eof;
	struct err e;
	err_clear(&e);
	const char *role = p->rank == 0 ? "master" : "worker";
	enum status st = boot__recv_frame(p->fd, &type, payload, &n, time_mono_s() + 1.0, p->addr, &eof, &e);
	if (st == ST_OK && type == BOOT_BYE)
		snprintf(b->lost_msg, sizeof b->lost_msg, "bootstrap: %s rank %d (%s) left: %.380s", role, p->rank, p->addr,
			 (const char *)payload);
	else if (st == ST_OK)
		snprintf(b->lost_msg, sizeof b->lost_msg,
			 "bootstrap: %s rank %d (%s) sent unexpected message type %d on the liveness channel", role,
			 p->rank, p->addr, (int)type);
	else if (eof)
		snprintf(b->lost_msg, sizeof b->lost_msg,
			 "bootstrap: %s rank %d (%s) closed the connection: its process exited or crashed", role, p->rank,
			 p->addr);
	else
		snprintf(b->lost_msg, sizeof b->lost_msg, "bootstrap: %s rank %d lost: %.400s", role, p->rank, e.msg);
	b->lost_st = (st == ST_OK && type == BOOT_BYE) ? ST_ABORTED : ST_IO;
	close(p->fd);
	p->fd = -1;
}

enum status comm_boot_poll(struct comm_boot *b, int wait_ms, struct err *e)
{
	pthread_mutex_lock(&b->mu);
	if (b->lost_st == ST_OK && !b->left && b->n_peers > 0) {
		struct pollfd pfd[COMM_MAX_RANKS];
		for (int i = 0; i < b->n_peers; i++)
			pfd[i] = (struct pollfd){ .fd = b->peers[i].fd, .events = POLLIN };
		int rc = poll(pfd, (nfds_t)b->n_peers, wait_ms < 0 ? 0 : wait_ms);
		for (int i = 0; rc > 0 && i < b->n_peers && b->lost_st == ST_OK; i++)
			if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))
				boot__peer_event_locked(b, &b->peers[i]);
		if (b->lost_st != ST_OK)
			log_msg(LOG_ERROR, "comm", "%s", b->lost_msg);
	}
	enum status st = b->lost_st;
	if (st != ST_OK)
		err_set(e, st, "%s", b->lost_msg);
	else if (b->left)
		st = err_set(e, ST_ABORTED, "bootstrap: this rank has left the group");
	pthread_mutex_unlock(&b->mu);
	return st;
}

static void *boot__watch_main(void *arg)
{
	struct comm_boot *b = arg;
	while (!atomic_load(&b->stop)) {
		struct err e;
		err_clear(&e);
		/* Short waits so that destroy never waits long for the thread. */
		enum status st = comm_boot_poll(b, 100, &e);
		if (st != ST_OK) {
			if (!atomic_load(&b->stop))
				b->lost_cb(b->lost_ctx, st, e.msg);
			break;
		}
	}
	return NULL;
}

enum status comm_boot_watch(struct comm_boot *b, comm_boot_lost_fn lost, void *ctx, struct err *e)
{
	if (!lost)
		return err_set(e, ST_INVALID, "bootstrap: watch needs a callback");
	if (b->watching)
		return err_set(e, ST_INVALID, "bootstrap: already watching");
	b->lost_cb = lost;
	b->lost_ctx = ctx;
	if (pthread_create(&b->watcher, NULL, boot__watch_main, b) != 0)
		return err_set(e, ST_NOMEM, "bootstrap: cannot start the watcher thread");
	b->watching = true;
	return ST_OK;
}

void comm_boot_leave(struct comm_boot *b, const char *reason)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->mu);
	if (!b->left) {
		b->left = true;
		char msg[COMM_BOOT_MAX_REASON_BYTES];
		snprintf(msg, sizeof msg, "%s", reason ? reason : "no reason given");
		struct err ignore;
		for (int i = 0; i < b->n_peers; i++)
			if (b->peers[i].fd >= 0)
				(void)boot__send_frame(b->peers[i].fd, BOOT_BYE, msg, strlen(msg), time_mono_s() + 1.0,
						       b->peers[i].addr, &ignore);
		boot__close_all(b);
	}
	pthread_mutex_unlock(&b->mu);
}

void comm_boot_destroy(struct comm_boot *b)
{
	if (!b)
		return;
	atomic_store(&b->stop, 1);
	if (b->watching)
		pthread_join(b->watcher, NULL);
	comm_boot_leave(b, "shutting down");
	boot__free(b);
}
