/*
 * kernels/device/mem_cuda.cu: the device half of kern_mem (kernels/device/
 * mem.h) over the CUDA runtime. Allocation failures are ST_NOMEM (the
 * context stays usable); every other runtime error is ST_CUDA with its text.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "common/status.h"
}

static enum status cerr(cudaError_t ce, const char *what, struct err *e)
{
	if (ce == cudaSuccess)
		return ST_OK;
	cudaGetLastError();
	if (ce == cudaErrorMemoryAllocation)
		return err_set(e, ST_NOMEM, "%s: %s", what, cudaGetErrorString(ce));
	return err_set(e, ST_CUDA, "%s: %s", what, cudaGetErrorString(ce));
}

extern "C" enum status kern_mem__dev_stream_create(void **s, struct err *e)
{
	cudaStream_t st = NULL;
	enum status r = cerr(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate", e);
	*s = r ? NULL : (void *)st;
	return r;
}

extern "C" void kern_mem__dev_stream_destroy(void *s)
{
	cudaStreamDestroy((cudaStream_t)s);
}

extern "C" enum status kern_mem__dev_alloc(size_t bytes, void **out, struct err *e)
{
	*out = NULL;
	void *p = NULL;
	enum status r = cerr(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc", e);
	if (r) {
		err_prefix(e, "%zu bytes of device memory", bytes);
		return r;
	}
	if ((r = cerr(cudaMemset(p, 0, bytes), "cudaMemset", e))) {
		cudaFree(p);
		return r;
	}
	*out = p;
	return ST_OK;
}

extern "C" void kern_mem__dev_free(void *p)
{
	cudaFree(p);
}

extern "C" enum status kern_mem__dev_host_alloc(size_t bytes, void **out, struct err *e)
{
	*out = NULL;
	void *p = NULL;
	enum status r = cerr(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost", e);
	if (r)
		return r;
	memset(p, 0, bytes);
	*out = p;
	return ST_OK;
}

extern "C" void kern_mem__dev_host_free(void *p)
{
	cudaFreeHost(p);
}

extern "C" enum status kern_mem__dev_copy(void *dst, const void *src, size_t n, int kind, void *stream, bool wait,
					  struct err *e)
{
	cudaStream_t s = (cudaStream_t)stream;
	enum status r = cerr(cudaMemcpyAsync(dst, src, n, (cudaMemcpyKind)kind, s), "cudaMemcpyAsync", e);
	if (!r && wait)
		r = cerr(cudaStreamSynchronize(s), "cudaStreamSynchronize", e);
	return r;
}

extern "C" enum status kern_mem__dev_set(void *p, int byte, size_t n, void *stream, struct err *e)
{
	return cerr(cudaMemsetAsync(p, byte, n, (cudaStream_t)stream), "cudaMemsetAsync", e);
}

extern "C" enum status kern_mem__dev_sync(void *stream, struct err *e)
{
	enum status r = cerr(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize", e);
	if (!r)
		r = cerr(cudaGetLastError(), "kernel", e);
	return r;
}

extern "C" void kern_mem__dev_info(uint64_t *free_bytes, uint64_t *total_bytes)
{
	size_t f = 0, t = 0;
	if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
		cudaGetLastError();
		f = t = 0;
	}
	*free_bytes = f;
	*total_bytes = t;
}
