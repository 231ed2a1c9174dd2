/*
 * comm/comm_tcp.c: the TCP backend (comm/comm_tcp.h): ranks as processes,
 * a star through rank 0, host buffers only.
 *
 * One frame per message each way: a 24-byte header (magic, op, dtype, root,
 * element count, payload bytes) and the payload. A worker sends its header
 * (with its contribution when it has one) and waits for rank 0's answer;
 * rank 0 reads every worker in rank order, checks that all called the same
 * collective, computes the result and answers each worker. Because rank 0
 * reads all contributions before it writes any answer, and a worker writes
 * all of its contribution before it reads, no pair of ranks can block each
 * other on full socket buffers.
 *
 * Blocking sockets with poll() in short slices: every wait has the group's
 * deadline and notices comm_abort() (which also shuts the sockets down, so
 * the peers see the connection close). Writes use MSG_NOSIGNAL.
 */
#include "comm/comm_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/auth.h"
#include "comm/internal.h"
#include "comm/limits.h"
#include "common/log.h"
#include "common/timeutil.h"

#define TCP_FRAME_MAGIC 0x50435444u /* "DTCP" */
#define TCP_HELLO_MAGIC 0x48435444u /* "DTCH" */
#define TCP_ACK_MAGIC 0x41435444u   /* "DTCA" */
#define TCP_ID_MAGIC "DSV4TCP"
#define TCP_HEADER_BYTES 24
#define TCP_HELLO_BYTES (24 + COMM_CHALLENGE_BYTES + COMM_MAC_BYTES)
#define TCP_CHAL_MAGIC 0x4b435444u  /* "DTCK" */
#define TCP_CHAL_BYTES (4 + COMM_CHALLENGE_BYTES)
#define TCP_ACK_BYTES (4 + COMM_MAC_BYTES)
/* Poll slice: how quickly a wait notices comm_abort() from another thread
 * even if the socket shutdown did not wake it. */
#define TCP_POLL_SLICE_MS 100
/* A connection to the listener must say hello within this time. */
#define TCP_HELLO_TIMEOUT_MS 5000
/* Pause between connect attempts while rank 0 is not listening yet. */
#define TCP_CONNECT_RETRY_MS 100

enum tcp_op {
	TCP_OP_ALL_REDUCE = 1,
	TCP_OP_ALL_GATHER = 2,
	TCP_OP_BROADCAST = 3,
	TCP_OP_BARRIER = 4,
	TCP_OP_ERROR = 5,
};

struct comm_tcp_listener {
	int fd;
	int port;
	uint64_t nonce;
	struct comm_secret secret; /* n_bytes 0: the empty key */
};

struct tcp_ctx {
	int n_fds;
	int *fds;          /* rank 0: fds[r] for worker r (fds[0] = -1); worker: fds[0] = rank 0 */
	int timeout_ms;
	atomic_int abort_req;
	char abort_reason[256]; /* written before abort_req is set */
	float *acc;
	size_t acc_cap;
	uint8_t *scratch;
	size_t scratch_cap;
};

static const char *tcp__op_name(int op)
{
	switch (op) {
	case TCP_OP_ALL_REDUCE: return "all_reduce_sum";
	case TCP_OP_ALL_GATHER: return "all_gather";
	case TCP_OP_BROADCAST: return "broadcast";
	case TCP_OP_BARRIER: return "barrier";
	case TCP_OP_ERROR: return "error";
	}
	return "?";
}

/* ---- I/O ---- */

static int tcp__left_ms(double deadline_s)
{
	double left = deadline_s - time_mono_s();
	return left <= 0 ? 0 : (int)(left * 1000.0) + 1;
}

static enum status tcp__aborted(struct comm *c, struct err *e)
{
	struct tcp_ctx *x = c->ctx;
	return err_set(e, ST_ABORTED, "comm tcp rank %d: aborted: %s", c->rank, x->abort_reason);
}

static const char *tcp__peer_name(struct comm *c, int peer, char *buf, size_t n)
{
	snprintf(buf, n, "rank %d", c->rank == 0 ? peer : 0);
	return buf;
}

static enum status tcp__io(struct comm *c, int peer, bool writing, void *buf, size_t n, double deadline_s,
			   struct err *e)
{
	struct tcp_ctx *x = c->ctx;
	int fd = x->fds[peer];
	uint8_t *p = buf;
	char who[32];
	while (n > 0) {
		if (atomic_load(&x->abort_req))
			return tcp__aborted(c, e);
		int left = tcp__left_ms(deadline_s);
		if (left == 0)
			return err_set(e, ST_TIMEOUT, "comm tcp rank %d: timed out after %d ms %s %s", c->rank,
				       x->timeout_ms, writing ? "sending to" : "waiting for",
				       tcp__peer_name(c, peer, who, sizeof who));
		struct pollfd pfd = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
		int rc = poll(&pfd, 1, left < TCP_POLL_SLICE_MS ? left : TCP_POLL_SLICE_MS);
		if (rc < 0 && errno != EINTR)
			return err_set(e, ST_IO, "comm tcp rank %d: poll: %s", c->rank, strerror(errno));
		if (rc <= 0)
			continue;
		ssize_t r = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
		if (atomic_load(&x->abort_req))
			return tcp__aborted(c, e);
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			return err_set(e, ST_IO, "comm tcp rank %d: %s closed the connection%s%s (its process exited, "
						 "crashed or aborted)",
				       c->rank, tcp__peer_name(c, peer, who, sizeof who), r < 0 ? ": " : "",
				       r < 0 ? strerror(errno) : "");
		p += r;
		n -= (size_t)r;
	}
	return ST_OK;
}

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

struct tcp_hdr {
	int op, dt, root;
	uint64_t n_elems, payload_bytes;
};

static enum status tcp__send_hdr(struct comm *c, int peer, const struct tcp_hdr *h, double dl, struct err *e)
{
	uint8_t b[TCP_HEADER_BYTES];
	put_u32(b, TCP_FRAME_MAGIC);
	b[4] = (uint8_t)h->op;
	b[5] = (uint8_t)h->dt;
	b[6] = (uint8_t)(h->root & 0xff);
	b[7] = (uint8_t)(h->root >> 8);
	put_u64(b + 8, h->n_elems);
	put_u64(b + 16, h->payload_bytes);
	return tcp__io(c, peer, true, b, sizeof b, dl, e);
}

static enum status tcp__recv_hdr(struct comm *c, int peer, struct tcp_hdr *h, double dl, struct err *e)
{
	uint8_t b[TCP_HEADER_BYTES];
	enum status st = tcp__io(c, peer, false, b, sizeof b, dl, e);
	if (st)
		return st;
	if (get_u32(b) != TCP_FRAME_MAGIC)
		return err_set(e, ST_IO, "comm tcp rank %d: garbage from peer %d (bad frame magic)", c->rank, peer);
	h->op = b[4];
	h->dt = b[5];
	h->root = b[6] | b[7] << 8;
	h->n_elems = get_u64(b + 8);
	h->payload_bytes = get_u64(b + 16);
	return ST_OK;
}

static enum status tcp__grow(void **p, size_t *cap, size_t n, struct err *e)
{
	if (n <= *cap)
		return ST_OK;
	void *q = realloc(*p, n);
	if (!q)
		return err_set(e, ST_NOMEM, "comm tcp: out of memory for %zu bytes", n);
	*p = q;
	*cap = n;
	return ST_OK;
}

/* ---- Collectives ---- */

static inline float tcp__load(const void *p, size_t i, enum comm_dtype dt)
{
	if (dt == COMM_DTYPE_F32) {
		float v;
		memcpy(&v, (const uint8_t *)p + i * 4, 4);
		return v;
	}
	uint16_t h;
	memcpy(&h, (const uint8_t *)p + i * 2, 2);
	return comm__bf16_to_f32(h);
}

/* The contribution a rank sends for this call (bytes; 0 = header only). */
static size_t tcp__contrib_bytes(const struct tcp_hdr *h, int rank)
{
	size_t n = (size_t)h->n_elems * comm_dtype_bytes((enum comm_dtype)h->dt);
	switch (h->op) {
	case TCP_OP_ALL_REDUCE:
	case TCP_OP_ALL_GATHER:
		return n;
	case TCP_OP_BROADCAST:
		return h->root == rank ? n : 0;
	}
	return 0;
}

/* Tells every worker why the collective failed, best effort. */
static void tcp__send_error_all(struct comm *c, const char *msg)
{
	struct tcp_ctx *x = c->ctx;
	struct err ignore = {0};
	size_t n = strlen(msg);
	double dl = time_mono_s() + 1.0;
	for (int r = 1; r < x->n_fds; r++) {
		struct tcp_hdr h = {.op = TCP_OP_ERROR, .payload_bytes = n};
		if (!tcp__send_hdr(c, r, &h, dl, &ignore))
			(void)tcp__io(c, r, true, (void *)msg, n, dl, &ignore);
	}
}

static enum status tcp__master(struct comm *c, const struct tcp_hdr *mine, const void *send, void *recv,
			       struct err *e)
{
	struct tcp_ctx *x = c->ctx;
	int n_ranks = c->n_ranks;
	enum comm_dtype dt = (enum comm_dtype)mine->dt;
	size_t eb = comm_dtype_bytes(dt), n = (size_t)mine->n_elems, slot = n * eb;
	double dl = time_mono_s() + x->timeout_ms / 1000.0;
	enum status st;
	if (mine->op == TCP_OP_ALL_REDUCE) {
		if ((st = tcp__grow((void **)&x->acc, &x->acc_cap, n * sizeof(float), e)) ||
		    (st = tcp__grow((void **)&x->scratch, &x->scratch_cap, slot, e)))
			return st;
		for (size_t i = 0; i < n; i++)
			x->acc[i] = tcp__load(send, i, dt);
	} else if (mine->op == TCP_OP_ALL_GATHER) {
		if (slot && send != recv)
			memmove(recv, send, slot);
	} else if (mine->op == TCP_OP_BROADCAST && mine->root == 0) {
		if (slot && send != recv)
			memmove(recv, send, slot);
	}
	for (int r = 1; r < n_ranks; r++) {
		struct tcp_hdr h = {0};
		if ((st = tcp__recv_hdr(c, r, &h, dl, e)))
			return st;
		size_t want = tcp__contrib_bytes(&h, r);
		if (h.op != mine->op || h.dt != mine->dt || h.n_elems != mine->n_elems ||
		    (mine->op == TCP_OP_BROADCAST && h.root != mine->root) || h.payload_bytes != want) {
			err_set(e, ST_INVALID,
				"comm tcp: collective mismatch: rank 0 called %s(n=%llu, %s, root %d) but rank %d called "
				"%s(n=%llu, %s, root %d)",
				tcp__op_name(mine->op), (unsigned long long)mine->n_elems, comm_dtype_name(dt), mine->root, r,
				tcp__op_name(h.op), (unsigned long long)h.n_elems,
				comm_dtype_name((enum comm_dtype)h.dt), h.root);
			tcp__send_error_all(c, e->msg);
			return ST_INVALID;
		}
		if (!want)
			continue;
		if (mine->op == TCP_OP_ALL_REDUCE) {
			if ((st = tcp__io(c, r, false, x->scratch, slot, dl, e)))
				return st;
			for (size_t i = 0; i < n; i++)
				x->acc[i] += tcp__load(x->scratch, i, dt);
		} else if (mine->op == TCP_OP_ALL_GATHER) {
			if ((st = tcp__io(c, r, false, (uint8_t *)recv + (size_t)r * slot, slot, dl, e)))
				return st;
		} else {
			if ((st = tcp__io(c, r, false, recv, slot, dl, e)))
				return st;
		}
	}
	size_t out_bytes = 0;
	if (mine->op == TCP_OP_ALL_REDUCE) {
		for (size_t i = 0; i < n; i++) {
			if (dt == COMM_DTYPE_F32) {
				memcpy((uint8_t *)recv + i * 4, &x->acc[i], 4);
			} else {
				uint16_t h = comm__f32_to_bf16(x->acc[i]);
				memcpy((uint8_t *)recv + i * 2, &h, 2);
			}
		}
		out_bytes = slot;
	} else if (mine->op == TCP_OP_ALL_GATHER) {
		out_bytes = slot * (size_t)n_ranks;
	} else if (mine->op == TCP_OP_BROADCAST) {
		out_bytes = slot;
	}
	for (int r = 1; r < n_ranks; r++) {
		struct tcp_hdr h = *mine;
		h.payload_bytes = (mine->op == TCP_OP_BROADCAST && mine->root == r) ? 0 : out_bytes;
		if ((st = tcp__send_hdr(c, r, &h, dl, e)))
			return st;
		if (h.payload_bytes && (st = tcp__io(c, r, true, recv, h.payload_bytes, dl, e)))
			return st;
	}
	return ST_OK;
}

static enum status tcp__worker(struct comm *c, const struct tcp_hdr *mine, const void *send, void *recv,
			       struct err *e)
{
	struct tcp_ctx *x = c->ctx;
	double dl = time_mono_s() + x->timeout_ms / 1000.0;
	struct tcp_hdr h = *mine;
	h.payload_bytes = tcp__contrib_bytes(mine, c->rank);
	enum status st = tcp__send_hdr(c, 0, &h, dl, e);
	if (!st && h.payload_bytes)
		st = tcp__io(c, 0, true, (void *)send, h.payload_bytes, dl, e);
	if (st)
		return st;
	struct tcp_hdr a = {0}; /* -O2 release: gcc cannot see tcp__recv_hdr fill it on ST_OK */
	if ((st = tcp__recv_hdr(c, 0, &a, dl, e)))
		return st;
	if (a.op == TCP_OP_ERROR) {
		char msg[ERR_MSG_BYTES];
		size_t n = a.payload_bytes < sizeof msg - 1 ? (size_t)a.payload_bytes : sizeof msg - 1;
		if ((st = tcp__io(c, 0, false, msg, n, dl, e)))
			return st;
		msg[n] = '\0';
		return err_set(e, ST_INVALID, "%s", msg);
	}
	size_t slot = (size_t)mine->n_elems * comm_dtype_bytes((enum comm_dtype)mine->dt), want = 0;
	if (mine->op == TCP_OP_ALL_REDUCE)
		want = slot;
	else if (mine->op == TCP_OP_ALL_GATHER)
		want = slot * (size_t)c->n_ranks;
	else if (mine->op == TCP_OP_BROADCAST && mine->root != c->rank)
		want = slot;
	if (a.op != mine->op || a.n_elems != mine->n_elems || a.payload_bytes != want)
		return err_set(e, ST_IO, "comm tcp rank %d: rank 0 answered %s(n=%llu, %llu bytes) to %s(n=%llu)", c->rank,
			       tcp__op_name(a.op), (unsigned long long)a.n_elems, (unsigned long long)a.payload_bytes,
			       tcp__op_name(mine->op), (unsigned long long)mine->n_elems);
	if (want)
		st = tcp__io(c, 0, false, recv, want, dl, e);
	return st;
}

static enum status tcp__run(struct comm *c, int op, const void *send, void *recv, size_t n_elems,
			    enum comm_dtype dt, int root, enum comm_mem mem, struct err *e)
{
	if (mem != COMM_MEM_HOST)
		return err_set(e, ST_UNSUPPORTED, "comm tcp: %s: device buffers are not supported (use nccl)",
			       tcp__op_name(op));
	if (atomic_load(&((struct tcp_ctx *)c->ctx)->abort_req))
		return tcp__aborted(c, e);
	struct tcp_hdr h = {.op = op, .dt = (int)dt, .root = root, .n_elems = n_elems};
	if (c->n_ranks == 1) {
		size_t b = n_elems * comm_dtype_bytes(dt);
		if (op != TCP_OP_BARRIER && b && send != recv && (op != TCP_OP_BROADCAST || root == c->rank))
			memmove(recv, send, b);
		return ST_OK;
	}
	enum status st = c->rank == 0 ? tcp__master(c, &h, send, recv, e) : tcp__worker(c, &h, send, recv, e);
	if (st) {
		/* The comm is dead (the error sticks): close the connections so
		 * that every peer fails now instead of at its timeout. */
		struct tcp_ctx *x = c->ctx;
		for (int i = 0; i < x->n_fds; i++)
			if (x->fds[i] >= 0)
				shutdown(x->fds[i], SHUT_RDWR);
	}
	return st;
}

static enum status tcp_all_reduce_sum(struct comm *c, const void *send, void *recv, size_t n_elems,
				      enum comm_dtype dt, enum comm_mem mem, struct err *e)
{
	return tcp__run(c, TCP_OP_ALL_REDUCE, send, recv, n_elems, dt, 0, mem, e);
}

static enum status tcp_all_gather(struct comm *c, const void *send, void *recv, size_t n_elems, enum comm_dtype dt,
				  enum comm_mem mem, struct err *e)
{
	return tcp__run(c, TCP_OP_ALL_GATHER, send, recv, n_elems, dt, 0, mem, e);
}

static enum status tcp_broadcast(struct comm *c, const void *send, void *recv, size_t n_elems, enum comm_dtype dt,
				 int root, enum comm_mem mem, struct err *e)
{
	return tcp__run(c, TCP_OP_BROADCAST, send, recv, n_elems, dt, root, mem, e);
}

static enum status tcp_barrier(struct comm *c, struct err *e)
{
	return tcp__run(c, TCP_OP_BARRIER, NULL, NULL, 0, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e);
}

static void tcp_abort(struct comm *c, const char *reason)
{
	struct tcp_ctx *x = c->ctx;
	snprintf(x->abort_reason, sizeof x->abort_reason, "rank %d aborted: %s", c->rank, reason);
	atomic_store(&x->abort_req, 1);
	/* Wakes this rank's wait and tells every peer at once. shutdown() is
	 * safe while the owner thread polls the fd; close() waits for destroy. */
	for (int i = 0; i < x->n_fds; i++)
		if (x->fds[i] >= 0)
			shutdown(x->fds[i], SHUT_RDWR);
}

static void tcp_destroy(struct comm *c)
{
	struct tcp_ctx *x = c->ctx;
	for (int i = 0; i < x->n_fds; i++)
		if (x->fds[i] >= 0)
			close(x->fds[i]);
	free(x->fds);
	free(x->acc);
	free(x->scratch);
	free(x);
}

static const struct comm_ops tcp_ops = {
	.name = "tcp",
	.all_reduce_sum = tcp_all_reduce_sum,
	.all_gather = tcp_all_gather,
	.broadcast = tcp_broadcast,
	.barrier = tcp_barrier,
	.sync = NULL,
	.abort = tcp_abort,
	.destroy = tcp_destroy,
};

/* ---- Set-up ---- */

static void tcp__nodelay(int fd)
{
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

enum status comm_tcp_listen(struct comm_tcp_listener **out, const char *addr, int port,
			    const struct comm_secret *secret, struct err *e)
{
	*out = NULL;
	struct comm_tcp_listener *l = calloc(1, sizeof *l);
	if (!l)
		return err_set(e, ST_NOMEM, "comm tcp: out of memory");
	l->fd = -1;
	if (secret)
		l->secret = *secret;
	int rnd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (rnd < 0 || read(rnd, &l->nonce, sizeof l->nonce) != (ssize_t)sizeof l->nonce)
		l->nonce = (uint64_t)time_wall_s() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
	if (rnd >= 0)
		close(rnd);
	char ps[16];
	snprintf(ps, sizeof ps, "%d", port);
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *res = NULL;
	const char *node = addr && addr[0] ? addr : NULL;
	int rc = getaddrinfo(node, ps, &hints, &res);
	if (rc == 0) {
		for (struct addrinfo *ai = res; ai && l->fd < 0; ai = ai->ai_next) {
			int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
			if (s < 0)
				continue;
			int one = 1;
			(void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
			if (bind(s, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s, COMM_MAX_RANKS) == 0)
				l->fd = s;
			else
				close(s);
		}
		freeaddrinfo(res);
	}
	if (l->fd < 0 && node) {
		/* not an address of this machine (as the bootstrap): all interfaces */
		comm_tcp_listener_destroy(l);
		return comm_tcp_listen(out, NULL, port, secret, e);
	}
	if (l->fd < 0) {
		int en = errno;
		free(l);
		return err_set(e, ST_IO, "comm tcp: cannot listen on port %d: %s", port,
			       rc ? gai_strerror(rc) : strerror(en));
	}
	struct sockaddr_in sa;
	socklen_t len = sizeof sa;
	if (getsockname(l->fd, (struct sockaddr *)&sa, &len) == 0)
		l->port = ntohs(sa.sin_port);
	*out = l;
	return ST_OK;
}

int comm_tcp_listener_port(const struct comm_tcp_listener *l) { return l->port; }

void comm_tcp_id_pack(const struct comm_tcp_listener *l, uint8_t id[COMM_UNIQUE_ID_BYTES])
{
	memset(id, 0, COMM_UNIQUE_ID_BYTES);
	memcpy(id, TCP_ID_MAGIC, sizeof TCP_ID_MAGIC);
	put_u32(id + 8, (uint32_t)l->port);
	put_u64(id + 16, l->nonce);
}

enum status comm_tcp_id_unpack(const uint8_t id[COMM_UNIQUE_ID_BYTES], int *port, uint64_t *nonce, struct err *e)
{
	if (memcmp(id, TCP_ID_MAGIC, sizeof TCP_ID_MAGIC))
		return err_set(e, ST_INVALID, "comm tcp: rank 0 did not offer a TCP data channel (an NCCL group?)");
	uint32_t p = get_u32(id + 8);
	if (p < 1 || p > 65535)
		return err_set(e, ST_INVALID, "comm tcp: bad port %u in the id", p);
	*port = (int)p;
	*nonce = get_u64(id + 16);
	return ST_OK;
}

void comm_tcp_listener_destroy(struct comm_tcp_listener *l)
{
	if (!l)
		return;
	if (l->fd >= 0)
		close(l->fd);
	free(l);
}

static enum status tcp__wrap(struct comm **out, int *fds, int n_fds, int rank, int n_ranks, int timeout_ms,
			     struct err *e)
{
	struct tcp_ctx *x = calloc(1, sizeof *x);
	if (!x)
		return err_set(e, ST_NOMEM, "comm tcp: out of memory");
	x->fds = fds;
	x->n_fds = n_fds;
	x->timeout_ms = timeout_ms;
	atomic_init(&x->abort_req, 0);
	enum status st = comm__wrap(out, &tcp_ops, x, rank, n_ranks, e);
	if (st)
		free(x);
	return st;
}

/* Reads exactly n bytes from fd before the deadline (set-up only). */
static bool tcp__read_raw(int fd, void *buf, size_t n, double dl)
{
	uint8_t *p = buf;
	while (n) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int rc = poll(&pfd, 1, tcp__left_ms(dl));
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0)
			return false;
		ssize_t r = recv(fd, p, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		p += r;
		n -= (size_t)r;
	}
	return true;
}

static bool tcp__write_raw(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

enum status comm_tcp_accept(struct comm **out, struct comm_tcp_listener *l, int n_ranks, int timeout_ms,
			    struct err *e)
{
	*out = NULL;
	if (n_ranks < 1 || n_ranks > COMM_MAX_RANKS)
		return err_set(e, ST_INVALID, "comm tcp: n_ranks %d out of range", n_ranks);
	int tmo = timeout_ms > 0 ? timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
	int *fds = malloc((size_t)n_ranks * sizeof *fds);
	if (!fds)
		return err_set(e, ST_NOMEM, "comm tcp: out of memory");
	for (int i = 0; i < n_ranks; i++)
		fds[i] = -1;
	double dl = time_mono_s() + tmo / 1000.0;
	int n_joined = 0;
	enum status st = ST_OK;
	while (n_joined < n_ranks - 1) {
		struct pollfd pfd = {.fd = l->fd, .events = POLLIN};
		int rc = poll(&pfd, 1, tcp__left_ms(dl));
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc == 0) {
			st = err_set(e, ST_TIMEOUT, "comm tcp: %d of %d worker(s) joined the data channel (port %d) "
						    "within %d ms",
				     n_joined, n_ranks - 1, l->port, tmo);
			break;
		}
		int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		uint8_t h[TCP_HELLO_BYTES], ch[TCP_CHAL_BYTES], mac[COMM_MAC_BYTES];
		double hdl = time_mono_s() + TCP_HELLO_TIMEOUT_MS / 1000.0;
		if (hdl > dl)
			hdl = dl;
		put_u32(ch, TCP_CHAL_MAGIC);
		bool ok = comm_random_bytes(ch + 4, COMM_CHALLENGE_BYTES, e) == ST_OK;
		ok = ok && tcp__write_raw(fd, ch, sizeof ch) && tcp__read_raw(fd, h, sizeof h, hdl) &&
		     get_u32(h) == TCP_HELLO_MAGIC && get_u64(h + 16) == l->nonce;
		if (ok) {
			comm_auth_mac(&l->secret, "dsv4 tcp hello", ch + 4, COMM_CHALLENGE_BYTES, h,
				      TCP_HELLO_BYTES - COMM_MAC_BYTES, mac);
			ok = comm_mac_equal(mac, h + TCP_HELLO_BYTES - COMM_MAC_BYTES);
		}
		if (!ok) {
			/* a stranger, a replay, another group: it cannot end this one */
			log_msg(LOG_WARN, "comm", "comm tcp: dropped a connection that is not an authenticated worker of "
				"this group");
			err_clear(e);
			close(fd);
			continue;
		}
		int rank = (int)get_u32(h + 4), nr = (int)get_u32(h + 8);
		if (nr != n_ranks || rank < 1 || rank >= n_ranks || fds[rank] >= 0) {
			close(fd);
			st = err_set(e, ST_INVALID, "comm tcp: worker says rank %d of %d; this group has %d ranks%s", rank,
				     nr, n_ranks, rank >= 1 && rank < n_ranks && fds[rank] >= 0 ? " (duplicate)" : "");
			break;
		}
		uint8_t ack[TCP_ACK_BYTES];
		put_u32(ack, TCP_ACK_MAGIC);
		comm_auth_mac(&l->secret, "dsv4 tcp ack", h + 24, COMM_CHALLENGE_BYTES, ack, 4, ack + 4);
		if (!tcp__write_raw(fd, ack, sizeof ack)) {
			close(fd);
			continue;
		}
		tcp__nodelay(fd);
		fds[rank] = fd;
		n_joined++;
	}
	if (!st)
		st = tcp__wrap(out, fds, n_ranks, 0, n_ranks, tmo, e);
	if (st) {
		for (int i = 0; i < n_ranks; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		free(fds);
	}
	return st;
}

enum status comm_tcp_connect(struct comm **out, const char *host, int port, uint64_t nonce,
			     const struct comm_secret *secret, int rank, int n_ranks, int timeout_ms, struct err *e)
{
	*out = NULL;
	if (rank < 1 || rank >= n_ranks || n_ranks > COMM_MAX_RANKS)
		return err_set(e, ST_INVALID, "comm tcp: worker rank %d of %d out of range", rank, n_ranks);
	int tmo = timeout_ms > 0 ? timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
	double dl = time_mono_s() + tmo / 1000.0;
	char ps[16], last[160] = "no attempt";
	snprintf(ps, sizeof ps, "%d", port);
	int fd = -1;
	while (fd < 0) {
		struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
		struct addrinfo *res = NULL;
		int rc = getaddrinfo(host, ps, &hints, &res);
		if (rc) {
			snprintf(last, sizeof last, "%s", gai_strerror(rc));
		} else {
			for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
				int s = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
				if (s < 0)
					continue;
				if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0) {
					fd = s;
				} else {
					snprintf(last, sizeof last, "%s", strerror(errno));
					close(s);
				}
			}
			freeaddrinfo(res);
		}
		if (fd >= 0 || tcp__left_ms(dl) == 0)
			break;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = TCP_CONNECT_RETRY_MS * 1000000L};
		nanosleep(&ts, NULL);
	}
	if (fd < 0)
		return err_set(e, ST_TIMEOUT, "comm tcp rank %d: cannot reach rank 0's data channel at %s:%d within %d ms "
					      "(last error: %s)",
			       rank, host, port, tmo, last);
	uint8_t h[TCP_HELLO_BYTES] = {0}, ch[TCP_CHAL_BYTES], ack[TCP_ACK_BYTES], mac[COMM_MAC_BYTES];
	put_u32(h, TCP_HELLO_MAGIC);
	put_u32(h + 4, (uint32_t)rank);
	put_u32(h + 8, (uint32_t)n_ranks);
	put_u64(h + 16, nonce);
	if (comm_random_bytes(h + 24, COMM_CHALLENGE_BYTES, e)) {
		close(fd);
		return e->st;
	}
	if (!tcp__read_raw(fd, ch, sizeof ch, dl) || get_u32(ch) != TCP_CHAL_MAGIC) {
		close(fd);
		return err_set(e, ST_IO, "comm tcp rank %d: %s:%d is not rank 0's data channel", rank, host, port);
	}
	comm_auth_mac(secret, "dsv4 tcp hello", ch + 4, COMM_CHALLENGE_BYTES, h, TCP_HELLO_BYTES - COMM_MAC_BYTES,
		      h + TCP_HELLO_BYTES - COMM_MAC_BYTES);
	if (!tcp__write_raw(fd, h, sizeof h) || !tcp__read_raw(fd, ack, sizeof ack, dl) ||
	    get_u32(ack) != TCP_ACK_MAGIC) {
		close(fd);
		return err_set(e, ST_IO, "comm tcp rank %d: rank 0 at %s:%d did not accept this worker (another "
			       "--tp-secret-file?)", rank, host, port);
	}
	comm_auth_mac(secret, "dsv4 tcp ack", h + 24, COMM_CHALLENGE_BYTES, ack, 4, mac);
	if (!comm_mac_equal(mac, ack + 4)) {
		close(fd);
		return err_set(e, ST_INVALID, "comm tcp rank %d: %s:%d failed authentication (not rank 0 of this "
			       "group, or another --tp-secret-file)", rank, host, port);
	}
	tcp__nodelay(fd);
	int *fds = malloc(sizeof *fds);
	if (!fds) {
		close(fd);
		return err_set(e, ST_NOMEM, "comm tcp: out of memory");
	}
	fds[0] = fd;
	enum status st = tcp__wrap(out, fds, 1, rank, n_ranks, tmo, e);
	if (st) {
		close(fd);
		free(fds);
	}
	return st;
}
