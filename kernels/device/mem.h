/*
 * kernels/device/mem.h: the memory of one backend, host or CUDA device.
 *
 * The forward pass, the block pool and the weights are written once against
 * this interface (design.md "The executor": one forward pass for every
 * backend). A struct kern_mem says where the buffers live and which stream
 * orders the work on them; the plan's variants for that backend read and
 * write only such buffers. On the host every call is the obvious libc one,
 * so the CPU executor pays nothing for the indirection. Device copies are
 * ordered on the stream (cudaMemcpyAsync); kern_mem_sync waits for them.
 *
 * All functions are safe to call with n == 0 (no-op) and return ST_CUDA with
 * the runtime's message on a device failure; ST_UNSUPPORTED for a device
 * kern_mem in a binary built without CUDA.
 */
#ifndef DSV4_KERNELS_MEM_H
#define DSV4_KERNELS_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct kern_mem {
	bool device;   /* false: host memory (malloc); true: the current CUDA device */
	void *stream;  /* cudaStream_t the device copies are ordered on (NULL: the default stream) */
};

/* A new stream for m (device: cudaStreamCreateWithFlags non-blocking;
 * host: nothing, NULL). */
enum status kern_mem_stream_create(struct kern_mem *m, struct err *e) DSV4_WUR;
void kern_mem_stream_destroy(struct kern_mem *m);

/* bytes of zeroed memory (device: cudaMalloc + memset, 256-byte aligned).
 * *out is NULL on failure. */
enum status kern_mem_alloc(const struct kern_mem *m, size_t bytes, void **out, struct err *e) DSV4_WUR;
void kern_mem_free(const struct kern_mem *m, void *p);

/* Host staging memory for per-step uploads (device: page-locked, so that
 * copies are truly asynchronous; host: malloc). Zeroed. */
enum status kern_mem_host_alloc(const struct kern_mem *m, size_t bytes, void **out, struct err *e) DSV4_WUR;
void kern_mem_host_free(const struct kern_mem *m, void *p);

/* dst (m's memory) <- src (host). */
enum status kern_mem_upload(const struct kern_mem *m, void *dst, const void *src, size_t n, struct err *e) DSV4_WUR;
/* dst (host) <- src (m's memory). Synchronous: dst is valid on return. */
enum status kern_mem_download(const struct kern_mem *m, void *dst, const void *src, size_t n,
			      struct err *e) DSV4_WUR;
/* dst <- src, both m's memory. */
enum status kern_mem_copy(const struct kern_mem *m, void *dst, const void *src, size_t n, struct err *e) DSV4_WUR;
/* n bytes of m's memory set to byte. */
enum status kern_mem_set(const struct kern_mem *m, void *p, int byte, size_t n, struct err *e) DSV4_WUR;
/* Wait for everything queued on m's stream; then the first asynchronous
 * kernel error (if any) is reported. */
enum status kern_mem_sync(const struct kern_mem *m, struct err *e) DSV4_WUR;

/* Free and total bytes of the current device (host: 0, 0). */
void kern_mem_info(const struct kern_mem *m, uint64_t *free_bytes, uint64_t *total_bytes);

#endif
