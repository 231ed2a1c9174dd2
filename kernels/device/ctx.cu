/*
 * kernels/device/ctx.cu: per-executor kernel state (ctx.h).
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>

extern "C" {
#include "kernels/device/ctx.h"
}

struct kern_ctx {
	int device;
	cudaStream_t stream;
	void *scratch;
	size_t scratch_bytes;
	void *slot[KERN_CTX_SLOTS];
	void (*slot_release[KERN_CTX_SLOTS])(void *);
};

#define CTX_DEFAULT_DEVICES 16
static pthread_mutex_t ctx_default_mu = PTHREAD_MUTEX_INITIALIZER;
static struct kern_ctx *ctx_default[CTX_DEFAULT_DEVICES];

extern "C" enum status kern_ctx_create(int device, void *stream, struct kern_ctx **out, struct err *e)
{
	*out = NULL;
	int prev = -1;
	if (cudaGetDevice(&prev) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
		cudaGetLastError();
		return err_set(e, ST_CUDA, "kern_ctx: cannot select CUDA device %d", device);
	}
	if (prev != device)
		(void)cudaSetDevice(prev);
	struct kern_ctx *c = (struct kern_ctx *)calloc(1, sizeof *c);
	if (!c)
		return err_set(e, ST_NOMEM, "kern_ctx");
	c->device = device;
	c->stream = (cudaStream_t)stream;
	*out = c;
	return ST_OK;
}

extern "C" void kern_ctx_destroy(struct kern_ctx *c)
{
	if (!c)
		return;
	int prev = -1;
	if (cudaGetDevice(&prev) == cudaSuccess && prev != c->device)
		(void)cudaSetDevice(c->device);
	(void)cudaDeviceSynchronize();
	for (int i = 0; i < KERN_CTX_SLOTS; i++)
		if (c->slot[i] && c->slot_release[i])
			c->slot_release[i](c->slot[i]);
	cudaFree(c->scratch);
	cudaGetLastError();
	if (prev >= 0 && prev != c->device)
		(void)cudaSetDevice(prev);
	free(c);
}

extern "C" struct kern_ctx *kern_ctx_default(void)
{
	int dev = -1;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= CTX_DEFAULT_DEVICES) {
		cudaGetLastError();
		return NULL;
	}
	pthread_mutex_lock(&ctx_default_mu);
	if (!ctx_default[dev]) {
		struct err e = {};
		if (kern_ctx_create(dev, NULL, &ctx_default[dev], &e) != ST_OK)
			ctx_default[dev] = NULL;
	}
	struct kern_ctx *c = ctx_default[dev];
	pthread_mutex_unlock(&ctx_default_mu);
	return c;
}

extern "C" struct kern_ctx *kern_ctx_or_default(void *c)
{
	return c ? (struct kern_ctx *)c : kern_ctx_default();
}

extern "C" void *kern_ctx_stream(const struct kern_ctx *c)
{
	return c ? (void *)c->stream : NULL;
}

extern "C" int kern_device_sm_count(void)
{
	static int cache[CTX_DEFAULT_DEVICES]; /* 0: not read yet; racing readers write the same value */
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
		cudaGetLastError();
		return 1;
	}
	if (dev < CTX_DEFAULT_DEVICES && cache[dev] > 0)
		return cache[dev];
	int n = 0;
	if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
		cudaGetLastError();
		n = 1;
	}
	if (dev < CTX_DEFAULT_DEVICES)
		cache[dev] = n;
	return n;
}

extern "C" int kern_ctx_device(const struct kern_ctx *c)
{
	return c ? c->device : -1;
}

static enum status ctx_grow(struct kern_ctx *c, size_t bytes)
{
	if (bytes <= c->scratch_bytes)
		return ST_OK;
	bytes = (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1); /* whole MiB: fewer regrowths */
	if (c->scratch) {
		/* A launch still in flight may read the old buffer. */
		if (cudaDeviceSynchronize() != cudaSuccess)
			return ST_CUDA;
		cudaFree(c->scratch);
		c->scratch = NULL;
		c->scratch_bytes = 0;
	}
	if (cudaMalloc(&c->scratch, bytes) != cudaSuccess) {
		cudaGetLastError();
		c->scratch = NULL;
		return ST_NOMEM;
	}
	c->scratch_bytes = bytes;
	return ST_OK;
}

extern "C" enum status kern_ctx_reserve(struct kern_ctx *c, size_t bytes, struct err *e)
{
	if (!c)
		return err_set(e, ST_INVALID, "kern_ctx_reserve: no context");
	enum status st = ctx_grow(c, bytes);
	if (st)
		return err_set(e, st, "kern_ctx: %zu bytes of device scratch on device %d", bytes, c->device);
	return ST_OK;
}

extern "C" void *kern_ctx_scratch(struct kern_ctx *c, size_t bytes, void *stream)
{
	if (!c)
		return NULL;
	if (bytes <= c->scratch_bytes)
		return c->scratch;
	cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
	if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
		cudaGetLastError();
		return NULL;
	}
	return ctx_grow(c, bytes) == ST_OK ? c->scratch : NULL;
}

extern "C" void *kern_ctx_slot(const struct kern_ctx *c, enum kern_ctx_slot_id id)
{
	return c && id >= 0 && id < KERN_CTX_SLOTS ? c->slot[id] : NULL;
}

extern "C" void kern_ctx_set_slot(struct kern_ctx *c, enum kern_ctx_slot_id id, void *p, void (*release)(void *))
{
	if (!c || id < 0 || id >= KERN_CTX_SLOTS)
		return;
	c->slot[id] = p;
	c->slot_release[id] = release;
}
