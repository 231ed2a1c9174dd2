/*
 * kernels/device/mem.c: kern_mem on the host, and the device half's
 * stand-in in builds without CUDA (every device call is ST_UNSUPPORTED).
 * The device half is kernels/device/mem_cuda.cu.
 */
#include "kernels/device/mem.h"

#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"

#if DSV4_HAVE_CUDA
/* mem_cuda.cu */
enum status kern_mem__dev_stream_create(void **s, struct err *e);
void kern_mem__dev_stream_destroy(void *s);
enum status kern_mem__dev_alloc(size_t bytes, void **out, struct err *e);
void kern_mem__dev_free(void *p);
enum status kern_mem__dev_host_alloc(size_t bytes, void **out, struct err *e);
void kern_mem__dev_host_free(void *p);
enum status kern_mem__dev_copy(void *dst, const void *src, size_t n, int kind, void *stream, bool wait,
			       struct err *e);
enum status kern_mem__dev_set(void *p, int byte, size_t n, void *stream, struct err *e);
enum status kern_mem__dev_sync(void *stream, struct err *e);
void kern_mem__dev_info(uint64_t *free_bytes, uint64_t *total_bytes);
#define NO_CUDA(e) ST_OK
#else
#define NO_CUDA(e) err_set(e, ST_UNSUPPORTED, "device memory: this binary was built without CUDA")
#endif

/* copy kinds for kern_mem__dev_copy (cudaMemcpyKind values) */
enum { H2D = 1, D2H = 2, D2D = 3 };

enum status kern_mem_stream_create(struct kern_mem *m, struct err *e)
{
	m->stream = NULL;
	if (!m->device)
		return ST_OK;
#if DSV4_HAVE_CUDA
	return kern_mem__dev_stream_create(&m->stream, e);
#else
	return NO_CUDA(e);
#endif
}

void kern_mem_stream_destroy(struct kern_mem *m)
{
#if DSV4_HAVE_CUDA
	if (m->device && m->stream)
		kern_mem__dev_stream_destroy(m->stream);
#endif
	m->stream = NULL;
}

enum status kern_mem_alloc(const struct kern_mem *m, size_t bytes, void **out, struct err *e)
{
	*out = NULL;
	if (m->device) {
#if DSV4_HAVE_CUDA
		return kern_mem__dev_alloc(bytes, out, e);
#else
		return NO_CUDA(e);
#endif
	}
	*out = calloc(1, bytes ? bytes : 1);
	return *out ? ST_OK : err_set(e, ST_NOMEM, "%zu bytes of host memory", bytes);
}

void kern_mem_free(const struct kern_mem *m, void *p)
{
	if (!p)
		return;
#if DSV4_HAVE_CUDA
	if (m->device) {
		kern_mem__dev_free(p);
		return;
	}
#endif
	if (!m->device)
		free(p);
}

enum status kern_mem_host_alloc(const struct kern_mem *m, size_t bytes, void **out, struct err *e)
{
	(void)m;
	*out = NULL;
#if DSV4_HAVE_CUDA
	if (m->device)
		return kern_mem__dev_host_alloc(bytes, out, e);
#endif
	*out = calloc(1, bytes ? bytes : 1);
	return *out ? ST_OK : err_set(e, ST_NOMEM, "%zu bytes of host memory", bytes);
}

void kern_mem_host_free(const struct kern_mem *m, void *p)
{
	(void)m;
	if (!p)
		return;
#if DSV4_HAVE_CUDA
	if (m->device) {
		kern_mem__dev_host_free(p);
		return;
	}
#endif
	free(p);
}

static enum status copy(const struct kern_mem *m, void *dst, const void *src, size_t n, int kind, bool wait,
			struct err *e)
{
	if (!n || dst == src)
		return ST_OK;
	if (!m->device) {
		memmove(dst, src, n);
		return ST_OK;
	}
#if DSV4_HAVE_CUDA
	return kern_mem__dev_copy(dst, src, n, kind, m->stream, wait, e);
#else
	(void)kind;
	(void)wait;
	return NO_CUDA(e);
#endif
}

enum status kern_mem_upload(const struct kern_mem *m, void *dst, const void *src, size_t n, struct err *e)
{
	return copy(m, dst, src, n, H2D, false, e);
}

enum status kern_mem_download(const struct kern_mem *m, void *dst, const void *src, size_t n, struct err *e)
{
	return copy(m, dst, src, n, D2H, true, e);
}

enum status kern_mem_copy(const struct kern_mem *m, void *dst, const void *src, size_t n, struct err *e)
{
	return copy(m, dst, src, n, D2D, false, e);
}

enum status kern_mem_set(const struct kern_mem *m, void *p, int byte, size_t n, struct err *e)
{
	if (!n)
		return ST_OK;
	if (!m->device) {
		memset(p, byte, n);
		return ST_OK;
	}
#if DSV4_HAVE_CUDA
	return kern_mem__dev_set(p, byte, n, m->stream, e);
#else
	return NO_CUDA(e);
#endif
}

enum status kern_mem_sync(const struct kern_mem *m, struct err *e)
{
	if (!m->device)
		return ST_OK;
#if DSV4_HAVE_CUDA
	return kern_mem__dev_sync(m->stream, e);
#else
	return NO_CUDA(e);
#endif
}

void kern_mem_info(const struct kern_mem *m, uint64_t *free_bytes, uint64_t *total_bytes)
{
	*free_bytes = *total_bytes = 0;
#if DSV4_HAVE_CUDA
	if (m->device)
		kern_mem__dev_info(free_bytes, total_bytes);
#else
	(void)m;
#endif
}
