/*
 * tests/comm/test_comm_tcp.c: the TCP comm backend (comm/comm_tcp.h) on
 * loopback, ranks as threads (each with its own sockets, exactly as
 * processes would have), against the cpu backend's semantics:
 *
 * - all-reduce f32 and bf16 of fresh random data is bitwise the rank-order
 *   fp32 sum (bf16 rounded once), on every rank, in place and not;
 * - all-gather (in place and not), broadcast from every root, barrier;
 * - a connection with the wrong nonce, a protocol-1 hello (no MAC) and a
 *   worker with another secret are dropped, and the group still forms;
 * - ranks that call different collectives all fail with ST_INVALID naming
 *   the mismatch, and the error sticks;
 * - comm_abort() on one rank ends the others' waits at once (well before
 *   the timeout); a rank that never joins a collective is ST_TIMEOUT.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/comm_tcp.h"
#include "common/timeutil.h"
#include "tests/test.h"

#define N 3
#define N_ELEMS 1000

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd32(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (uint32_t)(g_rng >> 16);
}

static float bf(uint16_t h)
{
	union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
	return v.f;
}

static uint16_t to_bf(float f)
{
	union { float f; uint32_t u; } v = {.f = f};
	return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

static struct comm_tcp_listener *g_lis;
static uint64_t g_nonce;
static int g_port;
static struct comm_secret g_secret, g_other_secret;
static float g_in[N][N_ELEMS];
static uint16_t g_in_bf[N][N_ELEMS];
static int g_scenario; /* 0 = collectives, 1 = mismatch, 2 = abort, 3 = timeout */

struct job {
	int rank;
	struct comm *c;
	enum status st;
	char msg[ERR_MSG_BYTES];
	int n_bad;
	double wait_s;
};

static void collectives(struct job *j, struct err *e)
{
	struct comm *c = j->c;
	int r = j->rank;
	float *f = malloc(N_ELEMS * sizeof *f);
	uint16_t *h = malloc(N_ELEMS * sizeof *h);
	memcpy(f, g_in[r], sizeof g_in[r]);
	memcpy(h, g_in_bf[r], sizeof g_in_bf[r]);
	if (comm_all_reduce_sum(c, f, f, N_ELEMS, COMM_DTYPE_F32, COMM_MEM_HOST, e) ||
	    comm_all_reduce_sum(c, h, h, N_ELEMS, COMM_DTYPE_BF16, COMM_MEM_HOST, e)) {
		j->n_bad++;
		goto out;
	}
	for (int i = 0; i < N_ELEMS; i++) {
		float a = g_in[0][i], b = bf(g_in_bf[0][i]);
		for (int k = 1; k < N; k++) {
			a += g_in[k][i];
			b += bf(g_in_bf[k][i]);
		}
		if (memcmp(&a, &f[i], 4) || to_bf(b) != h[i])
			j->n_bad++;
	}
	/* all-gather, not in place and in place */
	uint32_t mine[7], all[N * 7];
	for (int k = 0; k < 7; k++)
		mine[k] = (uint32_t)(r * 100 + k);
	if (comm_all_gather(c, mine, all, 7 * 4, COMM_DTYPE_BYTES, COMM_MEM_HOST, e)) {
		j->n_bad++;
		goto out;
	}
	for (int q = 0; q < N; q++)
		for (int k = 0; k < 7; k++)
			j->n_bad += all[q * 7 + k] != (uint32_t)(q * 100 + k);
	memset(all, 0, sizeof all);
	memcpy(all + r * 7, mine, sizeof mine);
	if (comm_all_gather(c, all + r * 7, all, 7, COMM_DTYPE_F32, COMM_MEM_HOST, e)) {
		j->n_bad++;
		goto out;
	}
	for (int q = 0; q < N; q++)
		for (int k = 0; k < 7; k++)
			j->n_bad += all[q * 7 + k] != (uint32_t)(q * 100 + k);
	/* broadcast from every root */
	for (int root = 0; root < N; root++) {
		uint8_t b[333];
		for (int k = 0; k < 333; k++)
			b[k] = r == root ? (uint8_t)(root * 7 + k) : 0;
		if (comm_broadcast(c, r == root ? b : NULL, b, sizeof b, COMM_DTYPE_BYTES, root, COMM_MEM_HOST, e)) {
			j->n_bad++;
			goto out;
		}
		for (int k = 0; k < 333; k++)
			j->n_bad += b[k] != (uint8_t)(root * 7 + k);
	}
	if (comm_barrier(c, e))
		j->n_bad++;
out:
	free(f);
	free(h);
}

static void *rank_main(void *arg)
{
	struct job *j = arg;
	struct err e = {0};
	int tmo = g_scenario == 3 ? 600 : 10000;
	if (j->rank == 0)
		j->st = comm_tcp_accept(&j->c, g_lis, N, tmo, &e);
	else
		j->st = comm_tcp_connect(&j->c, "127.0.0.1", g_port, g_nonce, &g_secret, j->rank, N, tmo, &e);
	if (j->st) {
		snprintf(j->msg, sizeof j->msg, "%s", e.msg);
		return NULL;
	}
	double t0 = time_mono_s();
	if (g_scenario == 0) {
		collectives(j, &e);
		j->st = e.st;
	} else if (g_scenario == 1) {
		/* rank 2 broadcasts where the others all-reduce */
		float x[4] = {1, 2, 3, 4};
		if (j->rank == 2)
			j->st = comm_broadcast(j->c, NULL, x, 4, COMM_DTYPE_F32, 0, COMM_MEM_HOST, &e);
		else
			j->st = comm_all_reduce_sum(j->c, x, x, 4, COMM_DTYPE_F32, COMM_MEM_HOST, &e);
		struct err e2 = {0};
		if (comm_barrier(j->c, &e2) != j->st)
			j->n_bad++; /* sticky */
	} else if (g_scenario == 2) {
		if (j->rank == 1) {
			struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
			nanosleep(&ts, NULL);
			comm_abort(j->c, "test abort");
		}
		j->st = comm_barrier(j->c, &e);
	} else {
		if (j->rank != 2)
			j->st = comm_barrier(j->c, &e);
		else
			j->st = ST_TIMEOUT; /* never joins */
	}
	j->wait_s = time_mono_s() - t0;
	snprintf(j->msg, sizeof j->msg, "%s", e.msg);
	if (g_scenario == 3 && j->rank == 2) {
		/* stay connected until the others gave up, as a hung rank would */
		struct timespec ts = {.tv_sec = 1, .tv_nsec = 0};
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* A worker with the group's nonce but another secret: must be refused. */
static void *intruder_main(void *arg)
{
	struct job *j = arg;
	struct err e = {0};
	j->st = comm_tcp_connect(&j->c, "127.0.0.1", g_port, g_nonce, &g_other_secret, j->rank, N, 3000, &e);
	snprintf(j->msg, sizeof j->msg, "%s", e.msg);
	return NULL;
}

static void run(int scenario, struct job jobs[N])
{
	struct err e = {0};
	g_scenario = scenario;
	T_CHECKF(comm_tcp_listen(&g_lis, "127.0.0.1", 0, &g_secret, &e) == ST_OK, "%s", e.msg);
	uint8_t id[COMM_UNIQUE_ID_BYTES];
	comm_tcp_id_pack(g_lis, id);
	T_CHECK(comm_tcp_id_unpack(id, &g_port, &g_nonce, &e) == ST_OK);
	if (scenario == 0) {
		/* a stray client with the wrong nonce is dropped */
		int s = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
		inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
		T_CHECK(connect(s, (struct sockaddr *)&a, sizeof a) == 0);
		uint8_t junk[24] = {0x44, 0x54, 0x43, 0x48, 1, 0, 0, 0, 3, 0, 0, 0};
		T_CHECK(write(s, junk, sizeof junk) == (ssize_t)sizeof junk);
		close(s);
	}
	pthread_t th[N], intruder;
	struct job bad = {.rank = 1};
	if (scenario == 0)
		pthread_create(&intruder, NULL, intruder_main, &bad);
	for (int r = 0; r < N; r++) {
		jobs[r] = (struct job){.rank = r};
		pthread_create(&th[r], NULL, rank_main, &jobs[r]);
	}
	for (int r = 0; r < N; r++)
		pthread_join(th[r], NULL);
	if (scenario == 0) {
		pthread_join(intruder, NULL);
		T_CHECKF(bad.st != ST_OK && bad.c == NULL, "a worker with another secret joined: %s", bad.msg);
	}
	for (int r = 0; r < N; r++)
		comm_destroy(jobs[r].c);
	comm_tcp_listener_destroy(g_lis);
	g_lis = NULL;
}

int main(void)
{
	const char *seed = getenv("DSV4_TEST_SEED");
	g_rng ^= seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
	for (int r = 0; r < N; r++)
		for (int i = 0; i < N_ELEMS; i++) {
			g_in[r][i] = ((float)(rnd32() % 2000001) - 1000000.0f) * 1e-3f * (float)(1 + rnd32() % 1000);
			g_in_bf[r][i] = to_bf(((float)(rnd32() % 20001) - 10000.0f) * 1e-2f);
		}
	struct err e;
	uint8_t k[32];
	for (int i = 0; i < 32; i++)
		k[i] = (uint8_t)rnd32();
	T_CHECK(comm_secret_set(&g_secret, k, sizeof k, &e) == ST_OK);
	k[31] ^= 0x80;
	T_CHECK(comm_secret_set(&g_other_secret, k, sizeof k, &e) == ST_OK);
	struct job jobs[N];
	run(0, jobs);
	for (int r = 0; r < N; r++)
		T_CHECKF(jobs[r].st == ST_OK && jobs[r].n_bad == 0, "collectives rank %d: %s (%d bad)", r, jobs[r].msg,
			 jobs[r].n_bad);
	fprintf(stderr, "collectives: all-reduce f32/bf16 bitwise rank-order sums, all-gather, broadcast: ok\n");

	run(1, jobs);
	for (int r = 0; r < N; r++) {
		T_CHECKF(jobs[r].st == ST_INVALID, "mismatch rank %d: %s", r, jobs[r].msg);
		T_CHECKF(strstr(jobs[r].msg, "mismatch") != NULL, "mismatch rank %d: message '%s'", r, jobs[r].msg);
		T_CHECK(jobs[r].n_bad == 0);
	}
	fprintf(stderr, "mismatch: %s\n", jobs[1].msg);

	run(2, jobs);
	for (int r = 0; r < N; r++) {
		T_CHECKF(jobs[r].st == ST_ABORTED || jobs[r].st == ST_IO, "abort rank %d: %s", r, jobs[r].msg);
		T_CHECKF(jobs[r].wait_s < 5.0, "abort rank %d waited %.1f s", r, jobs[r].wait_s);
	}
	fprintf(stderr, "abort: rank 0 '%s'; rank 2 '%s'\n", jobs[0].msg, jobs[2].msg);

	run(3, jobs);
	T_CHECKF(jobs[0].st == ST_TIMEOUT, "timeout rank 0: %s", jobs[0].msg);
	T_CHECKF(jobs[1].st == ST_TIMEOUT || jobs[1].st == ST_IO, "timeout rank 1: %s", jobs[1].msg);
	fprintf(stderr, "timeout: %s\n", jobs[0].msg);
	return test_exit();
}
