/*
 * tests/comm/test_bootstrap.c: the two-node bootstrap on loopback, with real
 * processes (fork) doing the real handshake.
 *
 * Success: a world of 2 (the worker starts before the master, so it has to
 * retry) and of 3; the unique id arrives intact; then the liveness channel:
 * a worker that dies without a word, a worker that says goodbye, a master
 * that dies, and the watcher callback. Failures, each a clear error on both
 * sides and never a hang: no master, no worker, wrong fingerprint, wrong
 * version, wrong world size, rank out of range, rank 0 claimed, duplicate rank,
 * garbage from a fake master, a fake master that never answers, a fake master
 * without the secret. Strangers (HTTP, an oversized frame, an unauthenticated
 * or replayed hello, a wrong-secret worker) are dropped and the group still
 * forms. Children report through their exit status
 * (0 = all their checks passed).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "tests/test.h"

#define VERSION "0.1.0-test"
#define FP 0x0123456789abcdefull

static uint8_t the_id[COMM_UNIQUE_ID_BYTES];
static struct comm_secret the_secret, other_secret;

static int free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0) {
		close(s);
		return 0;
	}
	close(s);
	return ntohs(a.sin_port);
}

static struct comm_boot_options opts(int n_ranks, int rank, int port, int timeout_ms)
{
	return (struct comm_boot_options){
		.n_ranks = n_ranks, .rank = rank, .master_addr = "127.0.0.1", .master_port = port,
		.version = VERSION, .checkpoint_fingerprint = FP, .unique_id = rank == 0 ? the_id : NULL,
		.timeout_ms = timeout_ms, .secret = &the_secret,
	};
}

/* ---- Children ---- */

enum after {
	AFTER_DIE,      /* _exit right after the handshake: no goodbye */
	AFTER_DESTROY,  /* comm_boot_destroy: goodbye */
	AFTER_WAIT_MASTER_GONE, /* poll until the master is gone; expect ST_ABORTED (its goodbye) */
	AFTER_WAIT_MASTER_KILLED, /* poll until the master is gone; expect ST_IO */
	AFTER_HOLD,     /* keep the connection until the parent kills us */
};

/* A worker that must succeed and check the id, then do `after`. */
static pid_t spawn_worker_ok(int n_ranks, int rank, int port, enum after after)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(n_ranks, rank, port, 10000);
	if (comm_boot_create(&b, &o, &e) != ST_OK) {
		fprintf(stderr, "worker %d: %s\n", rank, e.msg);
		_exit(10);
	}
	if (memcmp(comm_boot_unique_id(b), the_id, COMM_UNIQUE_ID_BYTES) != 0 || comm_boot_rank(b) != rank ||
	    comm_boot_n_ranks(b) != n_ranks) {
		fprintf(stderr, "worker %d: wrong id or rank\n", rank);
		_exit(11);
	}
	if (after != AFTER_WAIT_MASTER_GONE && comm_boot_poll(b, 0, &e) != ST_OK) {
		fprintf(stderr, "worker %d: poll right after the handshake: %s\n", rank, e.msg);
		_exit(12);
	}
	switch (after) {
	case AFTER_DIE:
		_exit(0);
	case AFTER_DESTROY:
		comm_boot_destroy(b);
		_exit(0);
	case AFTER_HOLD:
		for (;;)
			pause();
	case AFTER_WAIT_MASTER_GONE:
	case AFTER_WAIT_MASTER_KILLED: {
		enum status st = ST_OK;
		for (int i = 0; i < 200 && st == ST_OK; i++)
			st = comm_boot_poll(b, 50, &e);
		enum status want = after == AFTER_WAIT_MASTER_GONE ? ST_ABORTED : ST_IO;
		if (st != want || !strstr(e.msg, "master rank 0")) {
			fprintf(stderr, "worker %d: expected %s about the master, got %s: %s\n", rank, status_str(want),
				status_str(st), e.msg);
			_exit(13);
		}
		/* Sticky. */
		if (comm_boot_poll(b, 0, &e) != want)
			_exit(14);
		comm_boot_destroy(b);
		_exit(0);
	}
	}
	_exit(15);
}

/* A worker that must fail with status want and a message containing needle. */
static pid_t spawn_worker_fail(struct comm_boot_options o, enum status want, const char *needle)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	struct comm_boot *b = NULL;
	struct err e;
	err_clear(&e);
	enum status st = comm_boot_create(&b, &o, &e);
	if (st != want || b != NULL || !strstr(e.msg, needle)) {
		fprintf(stderr, "worker: expected %s with '%s', got %s: %s\n", status_str(want), needle, status_str(st),
			e.msg);
		_exit(20);
	}
	_exit(0);
}

static int wait_child(pid_t pid)
{
	int ws = 0;
	if (waitpid(pid, &ws, 0) != pid)
		return -1;
	return WIFEXITED(ws) ? WEXITSTATUS(ws) : 100 + (WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Runs a master that must fail with want/needle. */
static void master_fail(struct comm_boot_options o, enum status want, const char *needle)
{
	struct comm_boot *b = NULL;
	struct err e;
	err_clear(&e);
	enum status st = comm_boot_create(&b, &o, &e);
	T_CHECKF(st == want && b == NULL, "master: expected %s, got %s: %s", status_str(want), status_str(st), e.msg);
	T_STR_CONTAINS(e.msg, needle);
	comm_boot_destroy(b);
}

/* ---- Success and liveness ---- */

static void test_world2_and_worker_dies(void)
{
	int port = free_port();
	/* The worker starts first: it must retry until the master listens. */
	pid_t w = spawn_worker_ok(2, 1, port, AFTER_DIE);
	sleep_ms(300);
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(2, 0, port, 10000);
	T_CHECKF(comm_boot_create(&b, &o, &e) == ST_OK, "%s", e.msg);
	T_CHECK(wait_child(w) == 0);
	if (!b)
		return;
	T_CHECK(!memcmp(comm_boot_unique_id(b), the_id, COMM_UNIQUE_ID_BYTES));
	/* The worker process has exited without a goodbye. */
	enum status st = ST_OK;
	for (int i = 0; i < 200 && st == ST_OK; i++)
		st = comm_boot_poll(b, 50, &e);
	T_CHECK(st == ST_IO);
	T_STR_CONTAINS(e.msg, "worker rank 1");
	T_STR_CONTAINS(e.msg, "closed the connection");
	T_CHECK(comm_boot_poll(b, 0, &e) == ST_IO); /* sticky */
	comm_boot_destroy(b);
}

static void test_worker_says_goodbye(void)
{
	int port = free_port();
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(2, 0, port, 10000);
	pid_t w = spawn_worker_ok(2, 1, port, AFTER_DESTROY);
	T_CHECKF(comm_boot_create(&b, &o, &e) == ST_OK, "%s", e.msg);
	T_CHECK(wait_child(w) == 0);
	if (!b)
		return;
	enum status st = ST_OK;
	for (int i = 0; i < 200 && st == ST_OK; i++)
		st = comm_boot_poll(b, 50, &e);
	T_CHECK(st == ST_ABORTED);
	T_STR_CONTAINS(e.msg, "left: shutting down");
	comm_boot_destroy(b);
}

/* A --master-addr that is not an address of the master's machine (here a
 * TEST-NET address) makes it listen on all interfaces instead of failing. */
static void test_master_addr_fallback(void)
{
	int port = free_port();
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(2, 0, port, 10000);
	o.master_addr = "192.0.2.1";
	pid_t w = spawn_worker_ok(2, 1, port, AFTER_DESTROY);
	T_CHECKF(comm_boot_create(&b, &o, &e) == ST_OK, "%s", e.msg);
	T_CHECK(wait_child(w) == 0);
	comm_boot_destroy(b);
}

/* Master leaves with a reason; then a master that is killed (SIGKILL: the
 * kernel closes its sockets). Both workers notice. */
static void test_master_gone(void)
{
	int port = free_port();
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(2, 0, port, 10000);
	pid_t w = spawn_worker_ok(2, 1, port, AFTER_WAIT_MASTER_GONE);
	T_CHECKF(comm_boot_create(&b, &o, &e) == ST_OK, "%s", e.msg);
	comm_boot_destroy(b);
	T_CHECK(wait_child(w) == 0);

	port = free_port();
	pid_t m = fork();
	if (m == 0) {
		struct comm_boot *mb = NULL;
		struct comm_boot_options mo = opts(2, 0, port, 10000);
		if (comm_boot_create(&mb, &mo, &e) != ST_OK)
			_exit(30);
		for (;;)
			pause();
	}
	w = spawn_worker_ok(2, 1, port, AFTER_WAIT_MASTER_KILLED);
	/* Give the handshake time; if it has not happened yet, the worker fails
	 * with a connect/handshake error instead and the check below says so. */
	sleep_ms(500);
	kill(m, SIGKILL);
	T_CHECK(wait_child(m) == 100 + SIGKILL);
	T_CHECK(wait_child(w) == 0);
}

struct watch_seen {
	atomic_int n_calls;
	enum status st;
	char msg[ERR_MSG_BYTES];
};

static void on_lost(void *ctx, enum status st, const char *msg)
{
	struct watch_seen *s = ctx;
	s->st = st;
	snprintf(s->msg, sizeof s->msg, "%s", msg);
	atomic_fetch_add(&s->n_calls, 1);
}

/* World of 3; the watcher thread reports the death of one worker. */
static void test_world3_watch(void)
{
	int port = free_port();
	pid_t w1 = spawn_worker_ok(3, 1, port, AFTER_HOLD);
	pid_t w2 = spawn_worker_ok(3, 2, port, AFTER_HOLD);
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(3, 0, port, 10000);
	T_CHECKF(comm_boot_create(&b, &o, &e) == ST_OK, "%s", e.msg);
	if (b) {
		struct watch_seen seen = { .n_calls = 0 };
		T_CHECK(comm_boot_watch(b, on_lost, &seen, &e) == ST_OK);
		T_CHECK(comm_boot_watch(b, on_lost, &seen, &e) == ST_INVALID);
		kill(w2, SIGKILL);
		for (int i = 0; i < 1000 && atomic_load(&seen.n_calls) == 0; i++)
			sleep_ms(10);
		T_CHECK(atomic_load(&seen.n_calls) == 1);
		T_CHECK(seen.st == ST_IO);
		T_STR_CONTAINS(seen.msg, "worker rank 2");
		comm_boot_destroy(b);
	}
	kill(w1, SIGKILL);
	kill(w2, SIGKILL);
	wait_child(w1);
	wait_child(w2);
}

/* ---- Failures ---- */

static void test_no_peer(void)
{
	int port = free_port();
	struct comm_boot_options o = opts(2, 1, port, 400);
	struct comm_boot *b = NULL;
	struct err e;
	T_CHECK(comm_boot_create(&b, &o, &e) == ST_TIMEOUT && b == NULL);
	T_STR_CONTAINS(e.msg, "no dsv4 master at 127.0.0.1");
	T_STR_CONTAINS(e.msg, "Connection refused");

	o = opts(2, 0, port, 300);
	master_fail(o, ST_TIMEOUT, "waiting for worker rank(s) 1 (0 of 1 joined)");
}

static void test_mismatches(void)
{
	struct {
		struct comm_boot_options w;
		const char *needle;
	} cases[4];
	int port[4];
	for (int i = 0; i < 4; i++) {
		port[i] = free_port();
		cases[i].w = opts(2, 1, port[i], 5000);
	}
	cases[0].w.checkpoint_fingerprint = FP ^ 1;
	cases[0].needle = "checkpoint fingerprint differs";
	cases[1].w.version = "0.2.0";
	cases[1].needle = "dsv4 version differs: master " VERSION ", worker rank 1";
	cases[2].w.n_ranks = 3;
	cases[2].needle = "world size differs";
	cases[3].w.n_ranks = 3;
	cases[3].w.rank = 2;
	cases[3].needle = "world size differs";
	for (int i = 0; i < 4; i++) {
		pid_t w = spawn_worker_fail(cases[i].w, ST_INVALID, cases[i].needle);
		master_fail(opts(2, 0, port[i], 5000), ST_INVALID, cases[i].needle);
		T_CHECKF(wait_child(w) == 0, "case %d", i);
	}
}

static void test_duplicate_rank(void)
{
	int port = free_port();
	pid_t w1 = spawn_worker_fail(opts(3, 1, port, 5000), ST_INVALID, "duplicate rank 1");
	sleep_ms(200); /* so that the first claim reaches the master first; either order fails both */
	pid_t w2 = spawn_worker_fail(opts(3, 1, port, 5000), ST_INVALID, "duplicate rank 1");
	master_fail(opts(3, 0, port, 5000), ST_INVALID, "duplicate rank 1");
	T_CHECK(wait_child(w1) == 0);
	T_CHECK(wait_child(w2) == 0);
}

/* A loopback connection to port, retried for about 2 s while the master
 * starts listening; -1 when none is made. */
static int connect_retry(int port)
{
	for (int i = 0; i < 100; i++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		if (connect(s, (struct sockaddr *)&a, sizeof a) == 0)
			return s;
		close(s);
		sleep_ms(20);
	}
	return -1;
}

#define REPLY_BYTES (4096 + 13)

/* Reads from s until the master closes it into buf (REPLY_BYTES, left
 * NUL-terminated); a forked client exits with timeout_code when nothing
 * arrives for 5 s. Returns the bytes read. */
static size_t read_until_close(int s, uint8_t *buf, int timeout_code)
{
	size_t got = 0;
	for (;;) {
		struct pollfd p = { .fd = s, .events = POLLIN };
		if (poll(&p, 1, 5000) <= 0)
			_exit(timeout_code);
		ssize_t r = recv(s, buf + got, REPLY_BYTES - 1 - got, 0);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	buf[got] = 0;
	return got;
}

/* Whether the reply frame buf (got bytes) has type want_type and a text
 * containing needle; says what it got on stderr, as who, when not. */
static bool reply_is(const uint8_t *buf, size_t got, int want_type, const char *needle, const char *who)
{
	if (got >= 12 && buf[6] == want_type && strstr((const char *)buf + 12, needle))
		return true;
	fprintf(stderr, "%s: reply type %d '%s', wanted %d '%s'\n", who, got >= 12 ? buf[6] : -1,
		got >= 12 ? (const char *)buf + 12 : "", want_type, needle);
	return false;
}

/* A raw client: connects to port (retrying), sends bytes, reads the reply
 * frame, checks its type and text. */
static pid_t spawn_raw_client(int port, const uint8_t *bytes, size_t n, int want_type, const char *needle)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	int s = connect_retry(port);
	if (s < 0)
		_exit(40);
	if (send(s, bytes, n, MSG_NOSIGNAL) != (ssize_t)n)
		_exit(41);
	if (want_type < 0) /* a port probe: connect, close */
		_exit(0);
	uint8_t buf[REPLY_BYTES];
	size_t got = read_until_close(s, buf, 42);
	if (want_type == 0) /* just held the connection until the master dropped it */
		_exit(0);
	if (!reply_is(buf, got, want_type, needle, "raw client"))
		_exit(43);
	_exit(0);
}

/* A hello frame as a worker builds it: MACed with key over challenge (the
 * master's, or a stale one for a replay); with_mac false = protocol 1's hello
 * (no challenge, no MAC); len_override sets the length field. */
static size_t make_hello(uint8_t *p, uint32_t rank, uint32_t n_ranks, uint32_t len_override,
			 const struct comm_secret *key, const uint8_t *challenge, bool with_mac)
{
	const char *v = VERSION;
	size_t vlen = strlen(v), n = 18 + vlen + (with_mac ? 64 : 0);
	uint32_t h[3] = { COMM_BOOT_MAGIC, COMM_BOOT_PROTOCOL_VERSION | (1u << 16), len_override ? len_override : (uint32_t)n };
	memcpy(p, h, 12); /* little-endian host assumed by this test */
	memcpy(p + 12, &rank, 4);
	memcpy(p + 16, &n_ranks, 4);
	uint64_t fp = FP;
	memcpy(p + 20, &fp, 8);
	uint16_t vl = (uint16_t)vlen;
	memcpy(p + 28, &vl, 2);
	memcpy(p + 30, v, vlen);
	if (with_mac) {
		memset(p + 30 + vlen, 7, 32);
		comm_auth_mac(key, "dsv4 boot hello", challenge, 32, p + 12, 18 + vlen + 32, p + 12 + 18 + vlen + 32);
	}
	return 12 + n;
}

/* A raw client that reads the master's challenge first, then sends a hello
 * made by make_hello (stale = MAC over an all-zero challenge: a replay), and
 * checks the reply as spawn_raw_client. */
static pid_t spawn_hello_client(int port, uint32_t rank, const struct comm_secret *key, bool stale, int want_type,
				const char *needle)
{
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	int s = connect_retry(port);
	if (s < 0)
		_exit(50);
	uint8_t ch[44];
	size_t got = 0;
	while (got < sizeof ch) {
		ssize_t r = recv(s, ch + got, sizeof ch - got, 0);
		if (r <= 0)
			_exit(51);
		got += (size_t)r;
	}
	if (ch[6] != 5 || ch[8] != 32)
		_exit(52);
	uint8_t zero[32] = { 0 }, hello[256];
	size_t n = make_hello(hello, rank, 2, 0, key, stale ? zero : ch + 12, true);
	if (send(s, hello, n, MSG_NOSIGNAL) != (ssize_t)n)
		_exit(53);
	uint8_t buf[REPLY_BYTES];
	got = read_until_close(s, buf, 54);
	if (want_type == 0)
		_exit(got == 0 ? 0 : 55); /* dropped without a word */
	if (!reply_is(buf, got, want_type, needle, "hello client"))
		_exit(56);
	_exit(0);
}

/* A port probe (connect, close) does not disturb the master, which then
 * accepts the real worker. */
static void test_probe_ignored(void)
{
	int port = free_port();
	struct comm_boot *b = NULL;
	struct err e;
	pid_t probe = spawn_raw_client(port, (const uint8_t *)"", 0, -1, "");
	sleep_ms(100);
	pid_t w = -1;
	pid_t m = fork();
	if (m == 0) {
		/* the worker starts a little after the probe has connected */
		sleep_ms(300);
		w = spawn_worker_ok(2, 1, port, AFTER_DESTROY);
		_exit(wait_child(w));
	}
	struct comm_boot_options o = opts(2, 0, port, 10000);
	T_CHECKF(comm_boot_create(&b, &o, &e) == ST_OK, "%s", e.msg);
	T_CHECK(wait_child(probe) == 0);
	T_CHECK(wait_child(m) == 0);
	comm_boot_destroy(b);
}

/* An authenticated hello with a bad rank still fails the group (both sides
 * told why), as any mismatch of a member. */
static void test_master_refuses_rank(void)
{
	uint32_t bad_ranks[2] = { 5, 0 };
	for (int i = 0; i < 2; i++) {
		int port = free_port();
		pid_t c = spawn_hello_client(port, bad_ranks[i], &the_secret, false, 3 /* REJECT */, "out of range");
		master_fail(opts(2, 0, port, 5000), ST_INVALID, "out of range");
		T_CHECK(wait_child(c) == 0);
	}
}

/* Strangers cannot end or join the group: HTTP at the bootstrap port, an
 * oversized length field, a protocol-1 hello without a MAC, a hello replayed
 * from another connection, a worker with another secret (told "failed
 * authentication"): each is dropped, and the master then forms the group
 * with the real worker. Before authentication the first of them made the
 * master exit ("bad magic") and the protocol-1 hello joined. */
static void test_strangers_dropped(void)
{
	int port = free_port();
	uint8_t hello[256];
	pid_t kids[6];
	int n_kids = 0;
	pid_t m = fork();
	if (m == 0) {
		const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
		int bad = 0;
		pid_t c = spawn_raw_client(port, (const uint8_t *)http, strlen(http), 0, "");
		bad |= wait_child(c) << 0;
		size_t n = make_hello(hello, 1, 2, 1u << 30, NULL, NULL, false);
		c = spawn_raw_client(port, hello, n, 0, "");
		bad |= wait_child(c);
		n = make_hello(hello, 1, 2, 0, NULL, NULL, false);
		c = spawn_raw_client(port, hello, n, 0, "");
		bad |= wait_child(c);
		c = spawn_hello_client(port, 1, &the_secret, true, 3, "failed authentication");
		bad |= wait_child(c);
		struct comm_boot_options wo = opts(2, 1, port, 5000);
		wo.secret = &other_secret;
		c = spawn_worker_fail(wo, ST_INVALID, "failed authentication");
		bad |= wait_child(c);
		c = spawn_worker_ok(2, 1, port, AFTER_DESTROY);
		bad |= wait_child(c);
		_exit(bad ? 1 : 0);
	}
	kids[n_kids++] = m;
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(2, 0, port, 20000);
	T_CHECKF(comm_boot_create(&b, &o, &e) == ST_OK, "%s", e.msg);
	for (int i = 0; i < n_kids; i++)
		T_CHECK(wait_child(kids[i]) == 0);
	comm_boot_destroy(b);
}

/* A master with another secret: the worker refuses its welcome (it would
 * otherwise run that master's step plans). */
static void test_worker_refuses_wrong_master(void)
{
	int port = free_port();
	pid_t w = spawn_worker_fail(opts(2, 1, port, 5000), ST_INVALID, "failed authentication");
	struct comm_boot_options mo = opts(2, 0, port, 5000);
	mo.secret = &other_secret;
	master_fail(mo, ST_TIMEOUT, "timed out");
	T_CHECK(wait_child(w) == 0);
}

/* A fake master: listens, accepts one worker, answers with `reply` (or
 * nothing), and holds the connection until the worker is done. */
static void fake_master(const uint8_t *reply, size_t n, enum status want, const char *needle, int timeout_ms)
{
	int port = free_port();
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	T_CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4) == 0);
	pid_t w = spawn_worker_fail(opts(2, 1, port, timeout_ms), want, needle);
	int s = accept(l, NULL, NULL);
	T_CHECK(s >= 0);
	if (n)
		T_CHECK(send(s, reply, n, MSG_NOSIGNAL) == (ssize_t)n);
	T_CHECK(wait_child(w) == 0);
	close(s);
	close(l);
}

static void test_worker_refuses_garbage(void)
{
	const char *junk = "SSH-2.0-OpenSSH_9.2\r\n";
	fake_master((const uint8_t *)junk, strlen(junk), ST_IO, "not a dsv4 bootstrap peer", 5000);
	fake_master(NULL, 0, ST_TIMEOUT, "did not answer", 500);
	/* A well-formed header of an unknown message type. */
	uint8_t h[12] = { 0x44, 0x53, 0x56, 0x34, COMM_BOOT_PROTOCOL_VERSION, 0, 9, 0, 0, 0, 0, 0 };
	fake_master(h, sizeof h, ST_IO, "unexpected message type 9", 5000);
	/* A challenge, then a welcome whose MAC is not over this worker's
	 * challenge (a fake master without the secret). */
	uint8_t fw[12 + 32 + 12 + 4 + COMM_UNIQUE_ID_BYTES + 32] = { 0x44, 0x53, 0x56, 0x34, COMM_BOOT_PROTOCOL_VERSION, 0, 5, 0, 32 };
	uint8_t *wh = fw + 44;
	memcpy(wh, (uint8_t[]){ 0x44, 0x53, 0x56, 0x34, COMM_BOOT_PROTOCOL_VERSION, 0, 2, 0, 4 + COMM_UNIQUE_ID_BYTES + 32 }, 9);
	wh[12] = 2; /* n_ranks */
	fake_master(fw, sizeof fw, ST_INVALID, "failed authentication (not the master of this group", 5000);
	/* Another protocol version. */
	h[4] = 77;
	fake_master(h, sizeof h, ST_INVALID, "protocol version 77", 5000);
}

static void test_bad_options(void)
{
	struct comm_boot *b = NULL;
	struct err e;
	struct comm_boot_options o = opts(2, 2, 1234, 100);
	T_CHECK(comm_boot_create(&b, &o, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "rank 2 out of range");
	o = opts(2, 1, 0, 100);
	T_CHECK(comm_boot_create(&b, &o, &e) == ST_INVALID);
	o = opts(2, 1, 1234, 100);
	o.master_addr = NULL;
	T_CHECK(comm_boot_create(&b, &o, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "--master-addr");
	o = opts(2, 1, 1234, 100);
	o.version = NULL;
	T_CHECK(comm_boot_create(&b, &o, &e) == ST_INVALID);
	/* A world of one needs no network. */
	o = opts(1, 0, 1234, 100);
	T_CHECK(comm_boot_create(&b, &o, &e) == ST_OK && b);
	T_CHECK(comm_boot_poll(b, 0, &e) == ST_OK);
	comm_boot_destroy(b);
	comm_boot_destroy(NULL);
}

int main(void)
{
	uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
	for (size_t i = 0; i < sizeof the_id; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		the_id[i] = (uint8_t)(seed >> 56);
	}
	struct err e;
	uint8_t k[32];
	if (comm_random_bytes(k, sizeof k, &e) || comm_secret_set(&the_secret, k, sizeof k, &e))
		return 1;
	k[0] ^= 1;
	if (comm_secret_set(&other_secret, k, sizeof k, &e))
		return 1;
	test_bad_options();
	test_world2_and_worker_dies();
	test_worker_says_goodbye();
	test_master_addr_fallback();
	test_master_gone();
	test_world3_watch();
	test_no_peer();
	test_mismatches();
	test_duplicate_rank();
	test_master_refuses_rank();
	test_strangers_dropped();
	test_worker_refuses_wrong_master();
	test_probe_ignored();
	test_worker_refuses_garbage();
	return test_exit();
}
