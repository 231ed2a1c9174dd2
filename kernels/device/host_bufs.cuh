/*
 * kernels/device/host_bufs.cuh: the run_host side of a CUDA variant, once.
 *
 * Every variant has a run_host (self-checks at load, the kernel tests) that
 * takes host arrays: it copies each onto the device, calls the variant's
 * run() on the default stream, waits, copies the outputs back and frees
 * everything. Outputs are copied in as well, so what the op leaves untouched
 * (a test's NaN sentinels, rows it does not own) comes back unchanged.
 *
 *   struct kern_hbufs b = {};
 *   d.x = (const float *)kern_hb_up(&b, a->x, x_bytes, false);
 *   d.y = (float *)kern_hb_up(&b, a->y, y_bytes, true);
 *   d.stream = 0;
 *   return kern_hb_finish(&b, b.ce == cudaSuccess ? run(&d) : ST_CUDA);
 *
 * A failed allocation or copy is remembered in b.ce (later calls do nothing)
 * and turns into ST_CUDA at kern_hb_finish; a status from run() wins.
 */
#ifndef DSV4_KERNELS_DEVICE_HOST_BUFS_CUH
#define DSV4_KERNELS_DEVICE_HOST_BUFS_CUH

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>

extern "C" {
#include "common/status.h"
}

#define KERN_HB_MAX 16 /* buffers one wrapper holds (moe_decode: 8 arrays + 2 per expert projection) */

struct kern_hbufs {
	void *host[KERN_HB_MAX];
	void *dev[KERN_HB_MAX];
	size_t bytes[KERN_HB_MAX];
	bool out[KERN_HB_MAX];
	int n;
	cudaError_t ce;
};

/* bytes of device memory (at least 16, 256-byte aligned), not copied in or
 * out: scratch, or a buffer the caller fills with kern_hb_copy_in. */
static inline void *kern_hb_alloc(struct kern_hbufs *b, size_t bytes)
{
	if (b->ce != cudaSuccess)
		return NULL;
	if (b->n >= KERN_HB_MAX) {
		b->ce = cudaErrorMemoryAllocation;
		return NULL;
	}
	void *d = NULL;
	b->ce = cudaMalloc(&d, bytes ? bytes : 16);
	if (b->ce != cudaSuccess)
		return NULL;
	b->host[b->n] = NULL;
	b->dev[b->n] = d;
	b->bytes[b->n] = 0;
	b->out[b->n] = false;
	b->n++;
	return d;
}

/* A device copy of host array h (NULL stays NULL); is_out: copied back at
 * kern_hb_finish. */
static inline void *kern_hb_up(struct kern_hbufs *b, const void *h, size_t bytes, bool is_out)
{
	if (!h)
		return NULL;
	void *d = kern_hb_alloc(b, bytes);
	if (!d)
		return NULL;
	if (bytes)
		b->ce = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
	b->host[b->n - 1] = (void *)h;
	b->bytes[b->n - 1] = bytes;
	b->out[b->n - 1] = is_out;
	return d;
}

/* dst (device) <- src (host), into memory from kern_hb_alloc. */
static inline void kern_hb_copy_in(struct kern_hbufs *b, void *dst, const void *src, size_t bytes)
{
	if (b->ce == cudaSuccess && bytes)
		b->ce = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
}

/* Waits for the device (when st is ST_OK), copies the outputs back, frees
 * every buffer; returns st, else ST_CUDA for a device failure, else ST_OK. */
static inline enum status kern_hb_finish(struct kern_hbufs *b, enum status st)
{
	if (st == ST_OK && b->ce == cudaSuccess)
		b->ce = cudaDeviceSynchronize();
	for (int i = 0; i < b->n && st == ST_OK && b->ce == cudaSuccess; i++)
		if (b->out[i] && b->bytes[i])
			b->ce = cudaMemcpy(b->host[i], b->dev[i], b->bytes[i], cudaMemcpyDeviceToHost);
	for (int i = 0; i < b->n; i++)
		cudaFree(b->dev[i]);
	b->n = 0;
	if (st)
		return st;
	if (b->ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

#endif
