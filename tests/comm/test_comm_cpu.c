/*
 * tests/comm/test_comm_cpu.c: the CPU communicator with 1, 2 and 4 ranks as
 * threads.
 *
 * Every collective, in place and out of place, f32 and bf16 (and bytes where
 * allowed), on fresh random inputs, is compared bitwise with a straightforward
 * sum in rank order computed here, which also proves that every rank got the
 * same bits; repeating a call proves run-to-run determinism. Then the failure
 * paths: abort wakes every waiting rank with ST_ABORTED, a missing rank is a
 * timeout naming it, a destroyed rank fails the others at once, ranks calling
 * different collectives all fail, and bad arguments are ST_INVALID or
 * ST_UNSUPPORTED. Worker threads count their own failures; the main thread
 * turns the counts into checks (tests/test.h is not thread-safe).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "common/check.h"
#include "tests/test.h"

#define CHECK_OR_DIE(cond) CHECK(cond)

#define MAX_RANKS 4

/* Test's own bf16 conversion (round to nearest even), independent of comm/. */
static float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t lsb = (u >> 16) & 1u;
	return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

static uint64_t rng_state;
static uint32_t rng_u32(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 11);
}
static float rng_f32(void) { return ((float)(rng_u32() & 0xffffff) / 16777216.0f) * 2.0f - 1.0f; }

/* ---- Per-thread state ---- */

struct rank_ctx {
	int rank;
	int n_ranks;
	struct comm_cpu_group *g;
	int n_failed;
	/* inputs (read-only) */
	const float *in_f32[MAX_RANKS];
	const uint16_t *in_bf16[MAX_RANKS];
	const uint8_t *in_bytes[MAX_RANKS];
	const float *ref_sum_f32;
	const uint16_t *ref_sum_bf16;
	size_t n;
};

#define R_CHECK(ctx, cond)                                                                        \
	do {                                                                                      \
		if (!(cond)) {                                                                    \
			(ctx)->n_failed++;                                                        \
			fprintf(stderr, "%s:%d: rank %d/%d: check failed: %s\n", __FILE__, __LINE__, \
				(ctx)->rank, (ctx)->n_ranks, #cond);                              \
		}                                                                                 \
	} while (0)

#define RANK_OK(ctx, call)                                                                           \
	do {                                                                                      \
		struct err e_;                                                                    \
		err_clear(&e_);                                                                   \
		enum status st_ = (call);                                                         \
		if (st_ != ST_OK) {                                                               \
			(ctx)->n_failed++;                                                        \
			fprintf(stderr, "%s:%d: rank %d: %s failed: %s\n", __FILE__, __LINE__,    \
				(ctx)->rank, #call, e_.msg);                                      \
		}                                                                                 \
	} while (0)

static void *rank_main(void *arg)
{
	struct rank_ctx *x = arg;
	int r = x->rank, nr = x->n_ranks;
	size_t n = x->n;
	struct comm *c = NULL;
	struct err e;
	err_clear(&e);
	if (comm_cpu_create(&c, x->g, r, &e) != ST_OK) {
		fprintf(stderr, "rank %d: create: %s\n", r, e.msg);
		x->n_failed++;
		return NULL;
	}
	R_CHECK(x, comm_rank(c) == r && comm_n_ranks(c) == nr && !strcmp(comm_backend_name(c), "cpu"));

	float *f = malloc((n * nr + 1) * sizeof *f);
	float *f2 = malloc((n * nr + 1) * sizeof *f2);
	uint16_t *h = malloc((n * nr + 1) * sizeof *h);
	uint8_t *b = malloc(n * nr + 1);

	/* all-reduce f32, out of place, then in place, then again (determinism). */
	for (int rep = 0; rep < 2; rep++) {
		memset(f, 0xcc, n * sizeof *f);
		RANK_OK(x, comm_all_reduce_sum(c, x->in_f32[r], f, n, COMM_DTYPE_F32, COMM_MEM_HOST, &e_));
		R_CHECK(x, !memcmp(f, x->ref_sum_f32, n * sizeof *f));
	}
	memcpy(f2, x->in_f32[r], n * sizeof *f2);
	RANK_OK(x, comm_all_reduce_sum(c, f2, f2, n, COMM_DTYPE_F32, COMM_MEM_HOST, &e_));
	R_CHECK(x, !memcmp(f2, x->ref_sum_f32, n * sizeof *f2));
	/* Against a double-precision sum too (tolerance: fp32 rounding). */
	for (size_t i = 0; i < n; i++) {
		double s = 0, mag = 0;
		for (int k = 0; k < nr; k++) {
			s += x->in_f32[k][i];
			mag += fabs(x->in_f32[k][i]);
		}
		double tol = nr * mag * 0x1p-23;
		if (fabs(f2[i] - s) > tol) {
			R_CHECK(x, fabs(f2[i] - s) <= tol);
			break;
		}
	}

	/* all-reduce bf16, out of place and in place. */
	memset(h, 0xcc, n * sizeof *h);
	RANK_OK(x, comm_all_reduce_sum(c, x->in_bf16[r], h, n, COMM_DTYPE_BF16, COMM_MEM_HOST, &e_));
	R_CHECK(x, !memcmp(h, x->ref_sum_bf16, n * sizeof *h));
	memcpy(h, x->in_bf16[r], n * sizeof *h);
	RANK_OK(x, comm_all_reduce_sum(c, h, h, n, COMM_DTYPE_BF16, COMM_MEM_HOST, &e_));
	R_CHECK(x, !memcmp(h, x->ref_sum_bf16, n * sizeof *h));

	/* all-gather: f32 out of place, f32 in place, bf16, bytes. */
	memset(f, 0xcc, n * nr * sizeof *f);
	RANK_OK(x, comm_all_gather(c, x->in_f32[r], f, n, COMM_DTYPE_F32, COMM_MEM_HOST, &e_));
	for (int k = 0; k < nr; k++)
		R_CHECK(x, !memcmp(f + (size_t)k * n, x->in_f32[k], n * sizeof *f));
	memset(f, 0xcc, n * nr * sizeof *f);
	memcpy(f + (size_t)r * n, x->in_f32[r], n * sizeof *f);
	RANK_OK(x, comm_all_gather(c, f + (size_t)r * n, f, n, COMM_DTYPE_F32, COMM_MEM_HOST, &e_));
	for (int k = 0; k < nr; k++)
		R_CHECK(x, !memcmp(f + (size_t)k * n, x->in_f32[k], n * sizeof *f));
	RANK_OK(x, comm_all_gather(c, x->in_bf16[r], h, n, COMM_DTYPE_BF16, COMM_MEM_HOST, &e_));
	for (int k = 0; k < nr; k++)
		R_CHECK(x, !memcmp(h + (size_t)k * n, x->in_bf16[k], n * sizeof *h));
	RANK_OK(x, comm_all_gather(c, x->in_bytes[r], b, n, COMM_DTYPE_BYTES, COMM_MEM_HOST, &e_));
	for (int k = 0; k < nr; k++)
		R_CHECK(x, !memcmp(b + (size_t)k * n, x->in_bytes[k], n));

	/* broadcast from every root: f32 out of place, bf16 in place on root, bytes. */
	for (int root = 0; root < nr; root++) {
		memset(f, 0xcc, n * sizeof *f);
		RANK_OK(x, comm_broadcast(c, r == root ? x->in_f32[r] : NULL, f, n, COMM_DTYPE_F32, root,
				       COMM_MEM_HOST, &e_));
		R_CHECK(x, !memcmp(f, x->in_f32[root], n * sizeof *f));
		if (r == root)
			memcpy(h, x->in_bf16[r], n * sizeof *h);
		else
			memset(h, 0xcc, n * sizeof *h);
		RANK_OK(x, comm_broadcast(c, r == root ? h : NULL, h, n, COMM_DTYPE_BF16, root, COMM_MEM_HOST, &e_));
		R_CHECK(x, !memcmp(h, x->in_bf16[root], n * sizeof *h));
		memset(b, 0, n);
		RANK_OK(x, comm_broadcast(c, x->in_bytes[r], b, n, COMM_DTYPE_BYTES, root, COMM_MEM_HOST, &e_));
		R_CHECK(x, !memcmp(b, x->in_bytes[root], n));
	}

	/* barrier, zero-length collectives, sync is a no-op. */
	RANK_OK(x, comm_barrier(c, &e_));
	RANK_OK(x, comm_all_reduce_sum(c, NULL, NULL, 0, COMM_DTYPE_F32, COMM_MEM_HOST, &e_));
	RANK_OK(x, comm_sync(c, &e_));

	/* Argument errors are local and do not break the group. */
	R_CHECK(x, comm_all_reduce_sum(c, f, f, n, COMM_DTYPE_BYTES, COMM_MEM_HOST, &e) == ST_INVALID);
	R_CHECK(x, comm_broadcast(c, f, f, n, COMM_DTYPE_F32, nr, COMM_MEM_HOST, &e) == ST_INVALID);
	R_CHECK(x, comm_all_reduce_sum(c, f, f, n, (enum comm_dtype)9, COMM_MEM_HOST, &e) == ST_INVALID);
	R_CHECK(x, comm_all_gather(c, f, NULL, 4, COMM_DTYPE_F32, COMM_MEM_HOST, &e) == ST_INVALID);
	R_CHECK(x, comm_status(c) == ST_OK);
	RANK_OK(x, comm_barrier(c, &e_));

	free(f);
	free(f2);
	free(h);
	free(b);
	comm_destroy(c);
	return NULL;
}

static void run_world(int n_ranks, size_t n)
{
	struct comm_cpu_group *g = NULL;
	struct err e;
	err_clear(&e);
	struct comm_cpu_group_options opt = { .n_ranks = n_ranks, .timeout_ms = 20000 };
	T_CHECK(comm_cpu_group_create(&g, &opt, &e) == ST_OK);
	if (!g)
		return;
	float *in_f32[MAX_RANKS];
	uint16_t *in_bf16[MAX_RANKS];
	uint8_t *in_bytes[MAX_RANKS];
	for (int k = 0; k < n_ranks; k++) {
		in_f32[k] = malloc((n + 1) * sizeof(float));
		in_bf16[k] = malloc((n + 1) * sizeof(uint16_t));
		in_bytes[k] = malloc(n + 1);
		for (size_t i = 0; i < n; i++) {
			/* Mixed magnitudes so that summation order matters. */
			float scale = (rng_u32() & 7) == 0 ? 1000.0f : 1.0f;
			in_f32[k][i] = rng_f32() * scale;
			in_bf16[k][i] = f32_to_bf16(rng_f32() * scale);
			in_bytes[k][i] = (uint8_t)rng_u32();
		}
	}
	float *ref_f32 = malloc((n + 1) * sizeof(float));
	uint16_t *ref_bf16 = malloc((n + 1) * sizeof(uint16_t));
	for (size_t i = 0; i < n; i++) {
		float s = in_f32[0][i], t = bf16_to_f32(in_bf16[0][i]);
		for (int k = 1; k < n_ranks; k++) {
			s += in_f32[k][i];
			t += bf16_to_f32(in_bf16[k][i]);
		}
		ref_f32[i] = s;
		ref_bf16[i] = f32_to_bf16(t);
	}
	struct rank_ctx ctx[MAX_RANKS];
	pthread_t th[MAX_RANKS];
	for (int r = 0; r < n_ranks; r++) {
		ctx[r] = (struct rank_ctx){ .rank = r, .n_ranks = n_ranks, .g = g, .n = n,
					    .ref_sum_f32 = ref_f32, .ref_sum_bf16 = ref_bf16 };
		for (int k = 0; k < n_ranks; k++) {
			ctx[r].in_f32[k] = in_f32[k];
			ctx[r].in_bf16[k] = in_bf16[k];
			ctx[r].in_bytes[k] = in_bytes[k];
		}
		pthread_create(&th[r], NULL, rank_main, &ctx[r]);
	}
	for (int r = 0; r < n_ranks; r++) {
		pthread_join(th[r], NULL);
		T_CHECKF(ctx[r].n_failed == 0, "world %d, n=%zu, rank %d: %d failures", n_ranks, n, r,
			 ctx[r].n_failed);
	}
	comm_cpu_group_destroy(g);
	for (int k = 0; k < n_ranks; k++) {
		free(in_f32[k]);
		free(in_bf16[k]);
		free(in_bytes[k]);
	}
	free(ref_f32);
	free(ref_bf16);
}

/* ---- Failure paths ---- */

struct fail_ctx {
	struct comm *c;
	int what; /* 0 barrier, 1 all-reduce */
	enum status st;
	struct err e;
	atomic_int *n_waiting;
};

static void *fail_main(void *arg)
{
	struct fail_ctx *x = arg;
	float buf[8] = { 0 };
	err_clear(&x->e);
	atomic_fetch_add(x->n_waiting, 1);
	if (x->what == 0)
		x->st = comm_barrier(x->c, &x->e);
	else
		x->st = comm_all_reduce_sum(x->c, buf, buf, 8, COMM_DTYPE_F32, COMM_MEM_HOST, &x->e);
	return NULL;
}

static struct comm_cpu_group *make_group(int n_ranks, int timeout_ms, struct comm **c)
{
	struct comm_cpu_group *g = NULL;
	struct err e;
	struct comm_cpu_group_options opt = { .n_ranks = n_ranks, .timeout_ms = timeout_ms };
	CHECK_OR_DIE(comm_cpu_group_create(&g, &opt, &e) == ST_OK);
	for (int r = 0; r < n_ranks; r++)
		CHECK_OR_DIE(comm_cpu_create(&c[r], g, r, &e) == ST_OK);
	return g;
}

static void start(pthread_t *th, struct fail_ctx *x, struct comm *c, int what, atomic_int *n_waiting)
{
	*x = (struct fail_ctx){ .c = c, .what = what, .n_waiting = n_waiting };
	pthread_create(th, NULL, fail_main, x);
}

/* Rank 0 aborts while ranks 1..3 wait (timeout far beyond the test's): all
 * wake with ST_ABORTED naming rank 0 and the reason; later calls stick. */
static void test_abort(void)
{
	struct comm *c[4];
	struct comm_cpu_group *g = make_group(4, 600000, c);
	struct err e;
	struct comm *dup = NULL;
	T_CHECK(comm_cpu_create(&dup, g, 2, &e) == ST_INVALID && dup == NULL);
	T_STR_CONTAINS(e.msg, "already");
	T_CHECK(comm_cpu_create(&dup, g, 4, &e) == ST_INVALID);

	atomic_int n_waiting = 0;
	pthread_t th[4];
	struct fail_ctx x[4];
	for (int r = 1; r < 4; r++)
		start(&th[r], &x[r], c[r], r % 2, &n_waiting);
	while (atomic_load(&n_waiting) < 3)
		usleep(1000);
	usleep(20000); /* let them reach the wait; correctness does not depend on it */
	comm_abort(c[0], "test says stop");
	comm_abort(c[0], "second abort is a no-op");
	for (int r = 1; r < 4; r++) {
		pthread_join(th[r], NULL);
		T_CHECK(x[r].st == ST_ABORTED);
		T_STR_CONTAINS(x[r].e.msg, "rank 0 aborted: test says stop");
		T_CHECK(comm_status(c[r]) == ST_ABORTED);
		/* Sticky: the next call fails the same way without waiting. */
		T_CHECK(comm_barrier(c[r], &e) == ST_ABORTED);
		T_STR_CONTAINS(e.msg, "test says stop");
	}
	T_CHECK(comm_barrier(c[0], &e) == ST_ABORTED);
	for (int r = 0; r < 4; r++)
		comm_destroy(c[r]);
	comm_cpu_group_destroy(g);
}

/* Rank 1 never comes: rank 0 times out naming it; rank 1 then finds the
 * group broken; rank 0's error sticks. */
static void test_timeout(void)
{
	struct comm *c[3];
	struct comm_cpu_group *g = make_group(3, 150, c);
	atomic_int n_waiting = 0;
	pthread_t th[3];
	struct fail_ctx x[3];
	start(&th[0], &x[0], c[0], 1, &n_waiting);
	start(&th[2], &x[2], c[2], 1, &n_waiting);
	pthread_join(th[0], NULL);
	pthread_join(th[2], NULL);
	/* One of the two waiting ranks timed out first; the other was woken. */
	int n_timeout = (x[0].st == ST_TIMEOUT) + (x[2].st == ST_TIMEOUT);
	int n_aborted = (x[0].st == ST_ABORTED) + (x[2].st == ST_ABORTED);
	T_CHECKF(n_timeout >= 1 && n_timeout + n_aborted == 2, "%s / %s", status_str(x[0].st), status_str(x[2].st));
	T_STR_CONTAINS(x[0].e.msg, "waiting for rank(s) 1");
	T_STR_CONTAINS(x[2].e.msg, "waiting for rank(s) 1");
	T_STR_CONTAINS(x[0].e.msg, "150 ms");
	struct err e;
	float v = 1;
	T_CHECK(comm_all_reduce_sum(c[1], &v, &v, 1, COMM_DTYPE_F32, COMM_MEM_HOST, &e) == ST_ABORTED);
	T_STR_CONTAINS(e.msg, "timed out");
	T_CHECK(comm_barrier(c[0], &e) == x[0].st);
	for (int r = 0; r < 3; r++)
		comm_destroy(c[r]);
	comm_cpu_group_destroy(g);
}

/* A rank that destroys its comm fails a waiting peer at once (the timeout is
 * far beyond the test's). */
static void test_rank_gone(void)
{
	struct comm *c[2];
	struct comm_cpu_group *g = make_group(2, 600000, c);
	atomic_int n_waiting = 0;
	pthread_t th;
	struct fail_ctx x;
	start(&th, &x, c[0], 0, &n_waiting);
	while (atomic_load(&n_waiting) < 1)
		usleep(1000);
	comm_destroy(c[1]);
	pthread_join(th, NULL);
	T_CHECK(x.st == ST_ABORTED);
	T_STR_CONTAINS(x.e.msg, "rank 1 left the group");
	comm_destroy(c[0]);
	comm_cpu_group_destroy(g);
}

/* Ranks in different collectives: every rank fails with the same message. */
struct mismatch_ctx {
	struct comm *c;
	size_t n;
	int use_gather;
	enum status st;
	struct err e;
};

static void *mismatch_main(void *arg)
{
	struct mismatch_ctx *x = arg;
	float buf[64] = { 0 };
	err_clear(&x->e);
	if (x->use_gather)
		x->st = comm_all_gather(x->c, buf, buf + 32, x->n, COMM_DTYPE_F32, COMM_MEM_HOST, &x->e);
	else
		x->st = comm_all_reduce_sum(x->c, buf, buf, x->n, COMM_DTYPE_F32, COMM_MEM_HOST, &x->e);
	return NULL;
}

static void test_mismatch(void)
{
	for (int variant = 0; variant < 2; variant++) {
		struct comm *c[2];
		struct comm_cpu_group *g = make_group(2, 600000, c);
		struct mismatch_ctx x[2] = {
			{ .c = c[0], .n = 10, .use_gather = 0 },
			{ .c = c[1], .n = variant == 0 ? 11 : 10, .use_gather = variant == 1 },
		};
		pthread_t th[2];
		for (int r = 0; r < 2; r++)
			pthread_create(&th[r], NULL, mismatch_main, &x[r]);
		for (int r = 0; r < 2; r++) {
			pthread_join(th[r], NULL);
			T_CHECK(x[r].st == ST_INVALID);
			T_STR_CONTAINS(x[r].e.msg, "collective mismatch");
		}
		T_CHECK(!strcmp(x[0].e.msg, x[1].e.msg));
		for (int r = 0; r < 2; r++)
			comm_destroy(c[r]);
		comm_cpu_group_destroy(g);
	}
}

/* Device memory is refused at once, and the peer is not left waiting. */
static void test_device_refused(void)
{
	struct comm *c[2];
	struct comm_cpu_group *g = make_group(2, 600000, c);
	atomic_int n_waiting = 0;
	pthread_t th;
	struct fail_ctx x;
	start(&th, &x, c[1], 1, &n_waiting);
	struct err e;
	float v = 0;
	T_CHECK(comm_all_reduce_sum(c[0], &v, &v, 1, COMM_DTYPE_F32, COMM_MEM_DEVICE, &e) == ST_UNSUPPORTED);
	T_STR_CONTAINS(e.msg, "device buffers are not supported");
	pthread_join(th, NULL);
	T_CHECK(x.st == ST_ABORTED);
	T_STR_CONTAINS(x.e.msg, "device memory");
	for (int r = 0; r < 2; r++)
		comm_destroy(c[r]);
	comm_cpu_group_destroy(g);
}

/* Many small collectives back to back (slot reuse between rounds is where a
 * missing barrier would show), each checked. */
struct stress_ctx {
	struct comm_cpu_group *g;
	int rank;
	int n_failed;
};

static void *stress_main(void *arg)
{
	struct stress_ctx *x = arg;
	struct comm *c = NULL;
	struct err e;
	if (comm_cpu_create(&c, x->g, x->rank, &e) != ST_OK) {
		x->n_failed++;
		return NULL;
	}
	int nr = comm_n_ranks(c);
	for (int it = 0; it < 300; it++) {
		float v[3] = { (float)(x->rank + it), 1.0f, (float)it };
		if (comm_all_reduce_sum(c, v, v, 3, COMM_DTYPE_F32, COMM_MEM_HOST, &e) != ST_OK ||
		    v[0] != (float)(nr * (nr - 1) / 2 + nr * it) || v[1] != (float)nr || v[2] != (float)(nr * it))
			x->n_failed++;
		int mine = x->rank * 1000 + it, all[4] = { 0 };
		if (comm_all_gather(c, &mine, all, sizeof mine, COMM_DTYPE_BYTES, COMM_MEM_HOST, &e) != ST_OK)
			x->n_failed++;
		for (int k = 0; k < nr; k++)
			if (all[k] != k * 1000 + it)
				x->n_failed++;
		uint8_t b = (uint8_t)(x->rank == it % nr ? it : 0);
		if (comm_broadcast(c, &b, &b, 1, COMM_DTYPE_BYTES, it % nr, COMM_MEM_HOST, &e) != ST_OK ||
		    b != (uint8_t)it)
			x->n_failed++;
	}
	comm_destroy(c);
	return NULL;
}

static void test_stress(void)
{
	struct comm_cpu_group *g;
	struct err e;
	struct comm_cpu_group_options opt = { .n_ranks = 4, .timeout_ms = 30000 };
	T_CHECK(comm_cpu_group_create(&g, &opt, &e) == ST_OK);
	pthread_t th[4];
	struct stress_ctx x[4];
	for (int r = 0; r < 4; r++) {
		x[r] = (struct stress_ctx){ .g = g, .rank = r };
		pthread_create(&th[r], NULL, stress_main, &x[r]);
	}
	for (int r = 0; r < 4; r++) {
		pthread_join(th[r], NULL);
		T_CHECKF(x[r].n_failed == 0, "stress rank %d: %d failures", r, x[r].n_failed);
	}
	comm_cpu_group_destroy(g);
}

static void test_bad_group(void)
{
	struct comm_cpu_group *g = (struct comm_cpu_group *)1;
	struct err e;
	struct comm_cpu_group_options opt = { .n_ranks = 0 };
	T_CHECK(comm_cpu_group_create(&g, &opt, &e) == ST_INVALID && g == NULL);
	opt.n_ranks = 100000;
	T_CHECK(comm_cpu_group_create(&g, &opt, &e) == ST_INVALID);
	comm_cpu_group_destroy(NULL);
	comm_destroy(NULL);
	T_CHECK(comm_dtype_bytes(COMM_DTYPE_BF16) == 2 && comm_dtype_bytes(COMM_DTYPE_F32) == 4 &&
		comm_dtype_bytes(COMM_DTYPE_BYTES) == 1);
}

int main(void)
{
	rng_state = ((uint64_t)time(NULL) ^ (uint64_t)getpid() << 32) * 0x9e3779b97f4a7c15ull | 1;
	fprintf(stderr, "seed %llu\n", (unsigned long long)rng_state);
	static const size_t sizes[] = { 0, 1, 3, 257, 4099 };
	static const int worlds[] = { 1, 2, 4 };
	for (size_t w = 0; w < ARRAY_LEN(worlds); w++)
		for (size_t s = 0; s < ARRAY_LEN(sizes); s++)
			run_world(worlds[w], sizes[s]);
	test_bad_group();
	test_stress();
	test_abort();
	test_timeout();
	test_rank_gone();
	test_mismatch();
	test_device_refused();
	return test_exit();
}
