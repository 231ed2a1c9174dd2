/*
 * tests/comm/test_nccl.c: the NCCL backend through the real NCCL calls, on a
 * world of one rank (ncclGetUniqueId, ncclCommInitRankConfig with one rank,
 * all-reduce / all-gather / broadcast / barrier on device buffers, and the
 * host-buffer path through the staging buffer, with chunks smaller than the
 * data). With one rank every collective is the identity, so the expected
 * values are the inputs; bf16 and f32, in place and out of place. Then a
 * world of two where the second rank never comes (a timeout, not a hang),
 * and, with two GPUs, two ranks as threads checked against a + b. Exits 77
 * (SKIP) without a GPU. Suite 'gpu'.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include "comm/comm.h"
#include "tests/test.h"

#define N 5000

static int same_as_device(const void *dev, const void *host, size_t bytes)
{
	void *tmp = malloc(bytes);
	if (!tmp || cudaMemcpy(tmp, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
		free(tmp);
		return 0;
	}
	int ok = !memcmp(tmp, host, bytes);
	free(tmp);
	return ok;
}

/* A world of two where rank 1 never comes: rank 0's create is ST_TIMEOUT
 * (not a hang), and the half-made communicator is aborted cleanly. */
static void test_init_timeout(void)
{
	struct err e;
	uint8_t id[COMM_UNIQUE_ID_BYTES];
	T_CHECK(comm_nccl_unique_id(id, &e) == ST_OK);
	struct comm *c = NULL;
	struct comm_nccl_options opt = { .n_ranks = 2, .rank = 0, .cuda_device = 0, .unique_id = id, .timeout_ms = 2000 };
	enum status st = comm_nccl_create(&c, &opt, &e);
	T_CHECKF(st == ST_TIMEOUT && c == NULL, "%s: %s", status_str(st), e.msg);
	T_STR_CONTAINS(e.msg, "still in progress");
	comm_destroy(c);
}

/* ---- Two ranks as two threads on two GPUs ---- */

#define N2 3001

struct rank2 {
	int rank;
	const uint8_t *id;
	const float *in[2];      /* host inputs of both ranks */
	float *out_dev_sum;      /* host copy of the device all-reduce result */
	float *out_host_sum;     /* host-path all-reduce result */
	float *out_gather;       /* 2 * N2 */
	float *out_bcast;        /* from root 1 */
	enum status st;
	char msg[ERR_MSG_BYTES];
};

static void *rank2_main(void *arg)
{
	struct rank2 *x = arg;
	struct err e;
	err_clear(&e);
	struct comm *c = NULL;
	struct comm_nccl_options opt = { .n_ranks = 2, .rank = x->rank, .cuda_device = x->rank, .unique_id = x->id,
					 .timeout_ms = 60000, .host_staging_bytes = 8192 };
	x->st = comm_nccl_create(&c, &opt, &e);
	void *d = NULL, *g = NULL;
	if (x->st == ST_OK && (cudaMalloc(&d, N2 * sizeof(float)) != cudaSuccess ||
			       cudaMalloc(&g, 2 * N2 * sizeof(float)) != cudaSuccess))
		x->st = err_set(&e, ST_NOMEM, "cudaMalloc");
	if (x->st == ST_OK) {
		cudaMemcpy(d, x->in[x->rank], N2 * sizeof(float), cudaMemcpyHostToDevice);
		x->st = comm_all_reduce_sum(c, d, d, N2, COMM_DTYPE_F32, COMM_MEM_DEVICE, &e);
	}
	if (x->st == ST_OK)
		x->st = comm_sync(c, &e);
	if (x->st == ST_OK)
		cudaMemcpy(x->out_dev_sum, d, N2 * sizeof(float), cudaMemcpyDeviceToHost);
	if (x->st == ST_OK)
		x->st = comm_all_reduce_sum(c, x->in[x->rank], x->out_host_sum, N2, COMM_DTYPE_F32, COMM_MEM_HOST, &e);
	if (x->st == ST_OK)
		x->st = comm_all_gather(c, x->in[x->rank], x->out_gather, N2, COMM_DTYPE_F32, COMM_MEM_HOST, &e);
	if (x->st == ST_OK)
		x->st = comm_broadcast(c, x->in[x->rank], x->out_bcast, N2, COMM_DTYPE_F32, 1, COMM_MEM_HOST, &e);
	if (x->st == ST_OK)
		x->st = comm_barrier(c, &e);
	snprintf(x->msg, sizeof x->msg, "%s", e.msg);
	comm_destroy(c);
	cudaFree(d);
	cudaFree(g);
	return NULL;
}

static void test_two_ranks(void)
{
	struct err e;
	uint8_t id[COMM_UNIQUE_ID_BYTES];
	T_CHECK(comm_nccl_unique_id(id, &e) == ST_OK);
	float *in[2];
	struct rank2 x[2];
	for (int r = 0; r < 2; r++) {
		in[r] = malloc(N2 * sizeof(float));
		for (int i = 0; i < N2; i++)
			in[r][i] = (float)rand() / (float)RAND_MAX - 0.5f;
	}
	pthread_t th[2];
	for (int r = 0; r < 2; r++) {
		x[r] = (struct rank2){ .rank = r, .id = id, .in = { in[0], in[1] } };
		x[r].out_dev_sum = malloc(N2 * sizeof(float));
		x[r].out_host_sum = malloc(N2 * sizeof(float));
		x[r].out_gather = malloc(2 * N2 * sizeof(float));
		x[r].out_bcast = malloc(N2 * sizeof(float));
		pthread_create(&th[r], NULL, rank2_main, &x[r]);
	}
	for (int r = 0; r < 2; r++)
		pthread_join(th[r], NULL);
	for (int r = 0; r < 2; r++) {
		T_CHECKF(x[r].st == ST_OK, "rank %d: %s", r, x[r].msg);
		if (x[r].st != ST_OK)
			continue;
		int bad_sum = 0, bad_host = 0, bad_gather = 0, bad_bcast = 0;
		for (int i = 0; i < N2; i++) {
			float want = in[0][i] + in[1][i]; /* one rounding, either order */
			bad_sum += x[r].out_dev_sum[i] != want;
			bad_host += x[r].out_host_sum[i] != want;
			bad_gather += x[r].out_gather[i] != in[0][i] || x[r].out_gather[N2 + i] != in[1][i];
			bad_bcast += x[r].out_bcast[i] != in[1][i];
		}
		T_CHECKF(!bad_sum && !bad_host && !bad_gather && !bad_bcast, "rank %d: %d %d %d %d wrong", r, bad_sum,
			 bad_host, bad_gather, bad_bcast);
		T_CHECK(!memcmp(x[r].out_dev_sum, x[0].out_dev_sum, N2 * sizeof(float)));
	}
	for (int r = 0; r < 2; r++) {
		free(in[r]);
		free(x[r].out_dev_sum);
		free(x[r].out_host_sum);
		free(x[r].out_gather);
		free(x[r].out_bcast);
	}
}

int main(void)
{
	int n_dev = 0;
	if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0)
		return test_skip("no CUDA device");

	struct err e;
	err_clear(&e);
	uint8_t id[COMM_UNIQUE_ID_BYTES];
	T_CHECKF(comm_nccl_unique_id(id, &e) == ST_OK, "%s", e.msg);

	struct comm *c = NULL;
	struct comm_nccl_options opt = { .n_ranks = 1, .rank = 0, .cuda_device = 0, .unique_id = id,
					 .timeout_ms = 60000, .host_staging_bytes = 4096 /* forces chunks */ };
	T_CHECKF(comm_nccl_create(&c, &opt, &e) == ST_OK, "%s", e.msg);
	if (!c)
		return test_exit();
	T_CHECK(comm_rank(c) == 0 && comm_n_ranks(c) == 1 && !strcmp(comm_backend_name(c), "nccl"));

	srand((unsigned)time(NULL));
	float *hf = malloc(N * sizeof *hf), *hf2 = malloc(N * sizeof *hf2);
	uint16_t *hb = malloc(N * sizeof *hb);
	uint8_t *hy = malloc(N);
	for (int i = 0; i < N; i++) {
		hf[i] = (float)rand() / (float)RAND_MAX - 0.5f;
		hb[i] = (uint16_t)(rand() & 0x7f7f); /* finite bf16 patterns */
		hy[i] = (uint8_t)rand();
	}
	void *d_in, *d_out;
	T_CHECK(cudaMalloc(&d_in, N * sizeof(float)) == cudaSuccess);
	T_CHECK(cudaMalloc(&d_out, N * sizeof(float)) == cudaSuccess);

	/* Device all-reduce f32, out of place then in place. */
	cudaMemcpy(d_in, hf, N * sizeof *hf, cudaMemcpyHostToDevice);
	cudaMemset(d_out, 0, N * sizeof(float));
	T_CHECKF(comm_all_reduce_sum(c, d_in, d_out, N, COMM_DTYPE_F32, COMM_MEM_DEVICE, &e) == ST_OK, "%s", e.msg);
	T_CHECKF(comm_sync(c, &e) == ST_OK, "%s", e.msg);
	T_CHECK(same_as_device(d_out, hf, N * sizeof *hf));
	T_CHECKF(comm_all_reduce_sum(c, d_in, d_in, N, COMM_DTYPE_F32, COMM_MEM_DEVICE, &e) == ST_OK, "%s", e.msg);
	T_CHECK(comm_sync(c, &e) == ST_OK);
	T_CHECK(same_as_device(d_in, hf, N * sizeof *hf));

	/* Device all-reduce bf16. */
	cudaMemcpy(d_in, hb, N * sizeof *hb, cudaMemcpyHostToDevice);
	T_CHECKF(comm_all_reduce_sum(c, d_in, d_out, N, COMM_DTYPE_BF16, COMM_MEM_DEVICE, &e) == ST_OK, "%s", e.msg);
	T_CHECK(comm_sync(c, &e) == ST_OK);
	T_CHECK(same_as_device(d_out, hb, N * sizeof *hb));

	/* Device all-gather (bytes) and broadcast (f32 from root 0). */
	cudaMemcpy(d_in, hy, N, cudaMemcpyHostToDevice);
	T_CHECKF(comm_all_gather(c, d_in, d_out, N, COMM_DTYPE_BYTES, COMM_MEM_DEVICE, &e) == ST_OK, "%s", e.msg);
	T_CHECK(comm_sync(c, &e) == ST_OK);
	T_CHECK(same_as_device(d_out, hy, N));
	cudaMemcpy(d_in, hf, N * sizeof *hf, cudaMemcpyHostToDevice);
	cudaMemset(d_out, 0, N * sizeof(float));
	T_CHECKF(comm_broadcast(c, d_in, d_out, N, COMM_DTYPE_F32, 0, COMM_MEM_DEVICE, &e) == ST_OK, "%s", e.msg);
	T_CHECK(comm_sync(c, &e) == ST_OK);
	T_CHECK(same_as_device(d_out, hf, N * sizeof *hf));
	T_CHECKF(comm_barrier(c, &e) == ST_OK, "%s", e.msg);

	/* Host buffers through the staging buffer (4 KiB: several chunks). */
	memset(hf2, 0, N * sizeof *hf2);
	T_CHECKF(comm_all_reduce_sum(c, hf, hf2, N, COMM_DTYPE_F32, COMM_MEM_HOST, &e) == ST_OK, "%s", e.msg);
	T_CHECK(!memcmp(hf, hf2, N * sizeof *hf));
	memset(hf2, 0, N * sizeof *hf2);
	T_CHECKF(comm_all_gather(c, hf, hf2, N, COMM_DTYPE_F32, COMM_MEM_HOST, &e) == ST_OK, "%s", e.msg);
	T_CHECK(!memcmp(hf, hf2, N * sizeof *hf));
	memset(hf2, 0, N * sizeof *hf2);
	T_CHECKF(comm_broadcast(c, hf, hf2, N, COMM_DTYPE_F32, 0, COMM_MEM_HOST, &e) == ST_OK, "%s", e.msg);
	T_CHECK(!memcmp(hf, hf2, N * sizeof *hf));

	/* Argument errors stay local; abort sticks. */
	T_CHECK(comm_broadcast(c, hf, hf2, N, COMM_DTYPE_F32, 1, COMM_MEM_HOST, &e) == ST_INVALID);
	T_CHECK(comm_status(c) == ST_OK);
	comm_abort(c, "test abort");
	T_CHECK(comm_barrier(c, &e) == ST_ABORTED);
	T_STR_CONTAINS(e.msg, "test abort");
	T_CHECK(comm_sync(c, &e) == ST_ABORTED);
	comm_destroy(c);

	cudaFree(d_in);
	cudaFree(d_out);
	free(hf);
	free(hf2);
	free(hb);
	free(hy);

	test_init_timeout();
	if (n_dev >= 2)
		test_two_ranks();
	else
		fprintf(stderr, "note: one GPU, two-rank part skipped\n");
	return test_exit();
}
