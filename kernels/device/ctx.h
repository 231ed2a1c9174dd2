/*
 * kernels/device/ctx.h: per-executor kernel state (CUDA builds only).
 *
 * A struct kern_ctx belongs to one executor (one device, one stream) and
 * holds what kernels would otherwise keep in file-level globals: the stream
 * they launch on, a device scratch buffer that grows at load and never on the
 * hot path, and opaque per-library slots (the cuBLASLt handle and plan cache
 * of linear_cublaslt.cu). Owning it per executor keeps two executors in one
 * process apart and lets a step be captured into a CUDA graph: nothing is
 * allocated, created or looked up globally while a stream is capturing.
 *
 * The executor's side:
 *   struct kern_ctx *kc;
 *   kern_ctx_create(dev->index, stream, &kc, &e);      once, at load
 *   kern_ctx_reserve(kc, bytes, &e);                   at load: the largest scratch any selected
 *                                                      variant needs (its *_scratch_bytes())
 *   args.ctx = kc;                                     every call (kern_linear_args, kern_moe_gemm_args)
 *   kern_ctx_destroy(kc);                              at shutdown, after the stream is idle
 * ctx == NULL in a call means the process-default context of the calling
 * thread's current device (tests, run_host, the CPU executor's tools); that
 * one grows its scratch on demand and is never destroyed before exit.
 *
 * Thread rules: one thread (the executor's) uses a context at a time; the
 * default contexts are created under a mutex.
 */
#ifndef DSV4_KERNELS_CTX_H
#define DSV4_KERNELS_CTX_H

#include <stddef.h>

#include "common/status.h"

struct kern_ctx;

/* One context for CUDA device `device`, launching on `stream` (a
 * cudaStream_t; NULL = the legacy default stream). ST_CUDA if the device
 * cannot be selected, ST_NOMEM. */
enum status kern_ctx_create(int device, void *stream, struct kern_ctx **out, struct err *e) DSV4_WUR;
/* Synchronises the device, frees the scratch and runs every slot's release. NULL-safe. */
void kern_ctx_destroy(struct kern_ctx *c);

/* The process-default context of the current device (created on first use), or NULL. */
struct kern_ctx *kern_ctx_default(void);
/* c, or the default context when c is NULL. */
struct kern_ctx *kern_ctx_or_default(void *c);

void *kern_ctx_stream(const struct kern_ctx *c);
/* The current device's multiprocessor count, queried once per device and
 * kept (a hardware constant: kernels size their grids by it on every call);
 * 1 when it cannot be read. */
int kern_device_sm_count(void);
int kern_ctx_device(const struct kern_ctx *c);

/* Make the scratch at least `bytes` large (allocates; synchronises the device
 * first when it replaces a buffer). Call at load. */
enum status kern_ctx_reserve(struct kern_ctx *c, size_t bytes, struct err *e) DSV4_WUR;
/* The scratch, at least `bytes` long (256-byte aligned), for one call on the
 * context's stream. Grows it only when `stream` is not capturing a graph;
 * returns NULL when it is too small and cannot grow (the caller answers
 * ST_NOMEM: reserve more at load). */
void *kern_ctx_scratch(struct kern_ctx *c, size_t bytes, void *stream);

/* Opaque per-library state: slot `id` holds a pointer and the function that
 * releases it at kern_ctx_destroy. */
enum kern_ctx_slot_id {
	KERN_CTX_SLOT_CUBLASLT = 0,
	KERN_CTX_SLOTS
};
void *kern_ctx_slot(const struct kern_ctx *c, enum kern_ctx_slot_id id);
void kern_ctx_set_slot(struct kern_ctx *c, enum kern_ctx_slot_id id, void *p, void (*release)(void *));

#endif
