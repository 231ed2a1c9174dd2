/*
 * tests/comm/test_nccl.c: the NCCL backend through the real NCCL calls, on a
 * world of one rank (ncclGetUniqueId, ncclCommInitRankConfig with one rank,
 * all-reduce / all-gather / broadcast / barrier on device buffers, and the
 * host-buffer path through the staging buffer, with chunks smaller than the
 * data). With one rank every collective is the identity, so the expected
 * values are the inputs; bf16 and f32, in place and out of place. Exits 77
 * (SKIP) without a GPU. Suite 'gpu'.
 */
#include <cuda_runtime.h>
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
	return test_exit();
}
