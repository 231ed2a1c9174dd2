/*
 * comm/comm_nccl.c: the NCCL backend (compiled only with CUDA).
 *
 * One rank = one GPU = one ncclComm_t, created non-blocking
 * (ncclConfig_t.blocking = 0) so that no NCCL call can hang the caller:
 * initialisation, lazy connection set-up and completion are all polled with
 * the communicator's timeout, and comm_abort() (any thread) makes the polling
 * thread give up at once with ST_ABORTED. ncclCommAbort itself runs in
 * comm_destroy(), on the owning thread, because it frees the communicator
 * another thread may still be polling.
 *
 * Device buffers: the collective is enqueued on the comm's stream and the
 * call returns; comm_sync() waits. Host buffers: copied through a device
 * staging buffer allocated at create (chunked when larger) and waited for
 * before returning. The environment (NCCL_SOCKET_IFNAME, NCCL_IB_HCA,
 * NCCL_DEBUG, ...) is never touched; the NCCL_* variables present are logged
 * once at create, since a stale one is a classic cause of a GB10 set-up that
 * hangs or crawls (docs/two-gb10.md).
 */
#include "comm/internal.h"

#include <limits.h> /* nccl.h uses INT_MIN without including it */

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/limits.h"
#include "common/log.h"
#include "common/timeutil.h"

_Static_assert(sizeof(ncclUniqueId) == COMM_UNIQUE_ID_BYTES, "ncclUniqueId is not 128 bytes");

extern char **environ;

struct nccl_ctx {
	ncclComm_t nc;
	cudaStream_t stream;
	bool own_stream;
	int device;
	int timeout_ms;
	void *staging; /* device memory, staging_bytes */
	size_t staging_bytes;
	atomic_int abort_req;
	char abort_reason[256]; /* written once, before abort_req is set */
	bool failed;            /* an error or timeout: destroy must abort */
};

/* ---- Waiting ---- */

static void nccl__pause(int n_polls)
{
	/* Spin briefly (a decode all-reduce takes microseconds), then sleep in
	 * small steps so that a long wait does not burn a core. */
	if (n_polls < 2000) {
		sched_yield();
		return;
	}
	struct timespec ts = { .tv_sec = 0, .tv_nsec = 50000 };
	nanosleep(&ts, NULL);
}

static enum status nccl__aborted(struct comm *c, const char *what, struct err *e)
{
	struct nccl_ctx *x = c->ctx;
	x->failed = true;
	return err_set(e, ST_ABORTED, "comm nccl rank %d: %s: aborted: %s", c->rank, what, x->abort_reason);
}

/* Every entry point first honours an abort requested by another thread. */
#define NCCL_RETURN_IF_ABORTED(c, what, e)                                  \
	do {                                                                \
		if (atomic_load(&((struct nccl_ctx *)(c)->ctx)->abort_req)) \
			return nccl__aborted((c), (what), (e));             \
	} while (0)

/* After an NCCL call on a non-blocking communicator: wait until it is no
 * longer in progress. */
static enum status nccl__settle(struct comm *c, ncclResult_t r, const char *what, struct err *e)
{
	struct nccl_ctx *x = c->ctx;
	double deadline = time_mono_s() + x->timeout_ms / 1000.0;
	for (int n = 0; r == ncclInProgress; n++) {
		if (atomic_load(&x->abort_req))
			return nccl__aborted(c, what, e);
		if (time_mono_s() > deadline) {
			x->failed = true;
			return err_set(e, ST_TIMEOUT, "comm nccl rank %d: %s: still in progress after %d ms (a peer did not join?)",
				       c->rank, what, x->timeout_ms);
		}
		nccl__pause(n);
		if (ncclCommGetAsyncError(x->nc, &r) != ncclSuccess)
			break;
	}
	if (r != ncclSuccess) {
		x->failed = true;
		return err_set(e, ST_CUDA, "comm nccl rank %d: %s: %s (%s)", c->rank, what, ncclGetErrorString(r),
			       ncclGetLastError(x->nc));
	}
	return ST_OK;
}

static enum status nccl__cuda(struct comm *c, cudaError_t ce, const char *what, struct err *e)
{
	if (ce == cudaSuccess)
		return ST_OK;
	((struct nccl_ctx *)c->ctx)->failed = true;
	return err_set(e, ce == cudaErrorMemoryAllocation ? ST_NOMEM : ST_CUDA, "comm nccl rank %d: %s: %s", c->rank,
		       what, cudaGetErrorString(ce));
}

/* Waits for the comm's stream, watching NCCL's asynchronous error, the
 * abort flag and the deadline. */
static enum status nccl_sync(struct comm *c, struct err *e)
{
	NCCL_RETURN_IF_ABORTED(c, "sync", e);
	struct nccl_ctx *x = c->ctx;
	double deadline = time_mono_s() + x->timeout_ms / 1000.0;
	for (int n = 0;; n++) {
		cudaError_t ce = cudaStreamQuery(x->stream);
		if (ce == cudaSuccess)
			return ST_OK;
		if (ce != cudaErrorNotReady)
			return nccl__cuda(c, ce, "waiting for the stream", e);
		ncclResult_t r = ncclSuccess;
		if (ncclCommGetAsyncError(x->nc, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
			x->failed = true;
			return err_set(e, ST_CUDA, "comm nccl rank %d: asynchronous error: %s (%s)", c->rank,
				       ncclGetErrorString(r), ncclGetLastError(x->nc));
		}
		if (atomic_load(&x->abort_req))
			return nccl__aborted(c, "waiting for the stream", e);
		if (time_mono_s() > deadline) {
			x->failed = true;
			return err_set(e, ST_TIMEOUT,
				       "comm nccl rank %d: collective not complete after %d ms (a peer is gone or stuck?)",
				       c->rank, x->timeout_ms);
		}
		nccl__pause(n);
	}
}

/* Host paths issue CUDA copies: make sure they target this rank's GPU even
 * when the calling thread's current device is another one. */
static enum status nccl__device(struct comm *c, struct err *e)
{
	int cur = -1;
	struct nccl_ctx *x = c->ctx;
	if (cudaGetDevice(&cur) == cudaSuccess && cur == x->device)
		return ST_OK;
	return nccl__cuda(c, cudaSetDevice(x->device), "cudaSetDevice", e);
}

static ncclDataType_t nccl__dtype(enum comm_dtype dt)
{
	switch (dt) {
	case COMM_DTYPE_F32: return ncclFloat32;
	case COMM_DTYPE_BF16: return ncclBfloat16;
	case COMM_DTYPE_BYTES: return ncclUint8;
	}
	return ncclUint8;
}

/* ---- Collectives ---- */

/* Host buffers go host -> staging -> collective -> wait -> staging -> host,
 * chunk by chunk. The wait before copying back matters: a device-to-host copy
 * into pageable memory blocks the thread until the stream gets there, and
 * with a peer gone it would never get there. */

static enum status nccl_all_reduce_sum(struct comm *c, const void *send, void *recv, size_t n_elems,
				       enum comm_dtype dt, enum comm_mem mem, struct err *e)
{
	NCCL_RETURN_IF_ABORTED(c, "all_reduce_sum", e);
	struct nccl_ctx *x = c->ctx;
	ncclDataType_t t = nccl__dtype(dt);
	if (mem == COMM_MEM_DEVICE)
		return nccl__settle(c, ncclAllReduce(send, recv, n_elems, t, ncclSum, x->nc, x->stream), "all_reduce_sum", e);
	enum status dst = nccl__device(c, e);
	if (dst != ST_OK)
		return dst;
	size_t esz = comm_dtype_bytes(dt), chunk = x->staging_bytes / esz;
	for (size_t off = 0; off < n_elems; off += chunk) {
		size_t m = n_elems - off < chunk ? n_elems - off : chunk;
		enum status st = nccl__cuda(c, cudaMemcpyAsync(x->staging, (const char *)send + off * esz, m * esz,
							      cudaMemcpyHostToDevice, x->stream), "copy to staging", e);
		if (st == ST_OK)
			st = nccl__settle(c, ncclAllReduce(x->staging, x->staging, m, t, ncclSum, x->nc, x->stream),
					  "all_reduce_sum (host)", e);
		if (st == ST_OK)
			st = nccl_sync(c, e); /* before a pageable D2H copy, which would block without a timeout */
		if (st == ST_OK)
			st = nccl__cuda(c, cudaMemcpyAsync((char *)recv + off * esz, x->staging, m * esz,
							   cudaMemcpyDeviceToHost, x->stream), "copy from staging", e);
		if (st == ST_OK)
			st = nccl_sync(c, e);
		if (st != ST_OK)
			return st;
	}
	return ST_OK;
}

static enum status nccl_all_gather(struct comm *c, const void *send, void *recv, size_t n_elems,
				   enum comm_dtype dt, enum comm_mem mem, struct err *e)
{
	NCCL_RETURN_IF_ABORTED(c, "all_gather", e);
	struct nccl_ctx *x = c->ctx;
	ncclDataType_t t = nccl__dtype(dt);
	if (mem == COMM_MEM_DEVICE)
		return nccl__settle(c, ncclAllGather(send, recv, n_elems, t, x->nc, x->stream), "all_gather", e);
	/* Host: gather chunks of each rank's part into the staging buffer
	 * (rank-major), then scatter them to their places in recv. */
	enum status dst = nccl__device(c, e);
	if (dst != ST_OK)
		return dst;
	size_t esz = comm_dtype_bytes(dt), n_ranks = (size_t)c->n_ranks;
	size_t chunk = x->staging_bytes / esz / n_ranks;
	if (chunk == 0)
		return err_set(e, ST_INVALID, "comm nccl: staging buffer of %zu bytes is too small for %zu ranks",
			       x->staging_bytes, n_ranks);
	for (size_t off = 0; off < n_elems; off += chunk) {
		size_t m = n_elems - off < chunk ? n_elems - off : chunk;
		char *mine = (char *)x->staging + (size_t)c->rank * m * esz;
		enum status st = nccl__cuda(c, cudaMemcpyAsync(mine, (const char *)send + off * esz, m * esz,
							      cudaMemcpyHostToDevice, x->stream), "copy to staging", e);
		if (st == ST_OK)
			st = nccl__settle(c, ncclAllGather(mine, x->staging, m, t, x->nc, x->stream), "all_gather (host)", e);
		if (st == ST_OK)
			st = nccl_sync(c, e);
		if (st == ST_OK)
			st = nccl__cuda(c, cudaMemcpy2DAsync((char *)recv + off * esz, n_elems * esz, x->staging, m * esz,
							     m * esz, n_ranks, cudaMemcpyDeviceToHost, x->stream),
					"copy from staging", e);
		if (st == ST_OK)
			st = nccl_sync(c, e);
		if (st != ST_OK)
			return st;
	}
	return ST_OK;
}

static enum status nccl_broadcast(struct comm *c, const void *send, void *recv, size_t n_elems,
				  enum comm_dtype dt, int root, enum comm_mem mem, struct err *e)
{
	NCCL_RETURN_IF_ABORTED(c, "broadcast", e);
	struct nccl_ctx *x = c->ctx;
	ncclDataType_t t = nccl__dtype(dt);
	if (mem == COMM_MEM_DEVICE)
		return nccl__settle(c, ncclBroadcast(c->rank == root ? send : recv, recv, n_elems, t, root, x->nc, x->stream),
				    "broadcast", e);
	enum status dst = nccl__device(c, e);
	if (dst != ST_OK)
		return dst;
	size_t esz = comm_dtype_bytes(dt), chunk = x->staging_bytes / esz;
	for (size_t off = 0; off < n_elems; off += chunk) {
		size_t m = n_elems - off < chunk ? n_elems - off : chunk;
		enum status st = ST_OK;
		if (c->rank == root)
			st = nccl__cuda(c, cudaMemcpyAsync(x->staging, (const char *)send + off * esz, m * esz,
							   cudaMemcpyHostToDevice, x->stream), "copy to staging", e);
		if (st == ST_OK)
			st = nccl__settle(c, ncclBroadcast(x->staging, x->staging, m, t, root, x->nc, x->stream),
					  "broadcast (host)", e);
		if (st == ST_OK)
			st = nccl_sync(c, e);
		if (st == ST_OK)
			st = nccl__cuda(c, cudaMemcpyAsync((char *)recv + off * esz, x->staging, m * esz,
							   cudaMemcpyDeviceToHost, x->stream), "copy from staging", e);
		if (st == ST_OK)
			st = nccl_sync(c, e);
		if (st != ST_OK)
			return st;
	}
	return ST_OK;
}

/* A one-element all-reduce on the staging buffer, waited for. */
static enum status nccl_barrier(struct comm *c, struct err *e)
{
	NCCL_RETURN_IF_ABORTED(c, "barrier", e);
	struct nccl_ctx *x = c->ctx;
	enum status st = nccl__settle(c, ncclAllReduce(x->staging, x->staging, 1, ncclFloat32, ncclSum, x->nc, x->stream),
				      "barrier", e);
	return st == ST_OK ? nccl_sync(c, e) : st;
}

static void nccl_abort(struct comm *c, const char *reason)
{
	struct nccl_ctx *x = c->ctx;
	snprintf(x->abort_reason, sizeof x->abort_reason, "rank %d: %s", c->rank, reason);
	atomic_store(&x->abort_req, 1);
}

static void nccl__free(struct nccl_ctx *x, int rank)
{
	if (x->nc) {
		bool clean = !x->failed && !atomic_load(&x->abort_req);
		if (clean) {
			/* Finalize flushes pending work; poll it like everything else. */
			ncclResult_t r = ncclCommFinalize(x->nc);
			double deadline = time_mono_s() + x->timeout_ms / 1000.0;
			for (int n = 0; r == ncclInProgress && time_mono_s() < deadline; n++) {
				nccl__pause(n);
				if (ncclCommGetAsyncError(x->nc, &r) != ncclSuccess)
					break;
			}
			clean = r == ncclSuccess;
			if (!clean)
				log_msg(LOG_WARN, "comm", "nccl rank %d: finalize failed (%s); aborting the communicator", rank,
					ncclGetErrorString(r));
		}
		if (clean)
			(void)ncclCommDestroy(x->nc);
		else
			(void)ncclCommAbort(x->nc);
	}
	if (x->staging)
		(void)cudaFree(x->staging);
	if (x->own_stream && x->stream)
		(void)cudaStreamDestroy(x->stream);
	free(x);
}

static void nccl_destroy(struct comm *c)
{
	nccl__free(c->ctx, c->rank);
}

static const struct comm_ops nccl_ops = {
	.name = "nccl",
	.all_reduce_sum = nccl_all_reduce_sum,
	.all_gather = nccl_all_gather,
	.broadcast = nccl_broadcast,
	.barrier = nccl_barrier,
	.sync = nccl_sync,
	.abort = nccl_abort,
	.destroy = nccl_destroy,
};

/* ---- Creation ---- */

enum status comm_nccl_unique_id(uint8_t id[COMM_UNIQUE_ID_BYTES], struct err *e)
{
	ncclUniqueId u;
	ncclResult_t r = ncclGetUniqueId(&u);
	if (r != ncclSuccess)
		return err_set(e, ST_CUDA, "comm nccl: ncclGetUniqueId: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
	memcpy(id, &u, COMM_UNIQUE_ID_BYTES);
	return ST_OK;
}

static void nccl__log_env(int rank)
{
	char line[1024];
	size_t len = 0;
	for (char **p = environ; p && *p; p++)
		if (!strncmp(*p, "NCCL_", 5) && len + 2 < sizeof line)
			len += (size_t)snprintf(line + len, sizeof line - len, "%s%s", len ? " " : "", *p);
	if (len >= sizeof line)
		len = sizeof line - 1;
	line[len] = '\0';
	log_msg(LOG_INFO, "comm", "nccl rank %d: environment: %s", rank, len ? line : "(no NCCL_* variables)");
}

enum status comm_nccl_create(struct comm **out, const struct comm_nccl_options *opt, struct err *e)
{
	*out = NULL;
	if (!opt || opt->n_ranks < 1 || opt->n_ranks > COMM_MAX_RANKS || opt->rank < 0 || opt->rank >= opt->n_ranks)
		return err_set(e, ST_INVALID, "comm nccl: rank %d of %d out of range", opt ? opt->rank : -1,
			       opt ? opt->n_ranks : 0);
	if (!opt->unique_id)
		return err_set(e, ST_INVALID, "comm nccl: rank %d: no unique id (rank 0 makes it with comm_nccl_unique_id)",
			       opt->rank);
	if (opt->timeout_ms < 0)
		return err_set(e, ST_INVALID, "comm nccl: timeout_ms %d is negative", opt->timeout_ms);
	int n_dev = 0;
	cudaError_t ce = cudaGetDeviceCount(&n_dev);
	if (ce != cudaSuccess || n_dev == 0) {
		(void)cudaGetLastError();
		return err_set(e, ST_UNSUPPORTED, "comm nccl: rank %d: no CUDA device (%s)", opt->rank,
			       ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
	}
	if (opt->cuda_device < 0 || opt->cuda_device >= n_dev)
		return err_set(e, ST_INVALID, "comm nccl: rank %d: CUDA device %d out of range [0, %d)", opt->rank,
			       opt->cuda_device, n_dev);

	struct nccl_ctx *x = calloc(1, sizeof *x);
	if (!x)
		return err_set(e, ST_NOMEM, "comm nccl: out of memory");
	x->device = opt->cuda_device;
	x->timeout_ms = opt->timeout_ms ? opt->timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
	x->staging_bytes = opt->host_staging_bytes ? opt->host_staging_bytes : COMM_NCCL_STAGING_BYTES;
	if (x->staging_bytes < 64)
		x->staging_bytes = 64;
	atomic_init(&x->abort_req, 0);
	snprintf(x->abort_reason, sizeof x->abort_reason, "(none)");

	struct comm *c = NULL;
	enum status st = comm__wrap(&c, &nccl_ops, x, opt->rank, opt->n_ranks, e);
	if (st != ST_OK) {
		free(x);
		return st;
	}
	st = nccl__cuda(c, cudaSetDevice(x->device), "cudaSetDevice", e);
	if (st == ST_OK) {
		if (opt->cuda_stream) {
			x->stream = (cudaStream_t)opt->cuda_stream;
		} else {
			st = nccl__cuda(c, cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking), "create stream", e);
			x->own_stream = st == ST_OK;
		}
	}
	if (st == ST_OK)
		st = nccl__cuda(c, cudaMalloc(&x->staging, x->staging_bytes), "allocate the staging buffer", e);
	if (st == ST_OK) {
		nccl__log_env(opt->rank);
		ncclUniqueId id;
		memcpy(&id, opt->unique_id, COMM_UNIQUE_ID_BYTES);
		/* NCCL's initializer leaves fields out; that is its business. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
		ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
#pragma GCC diagnostic pop
		cfg.blocking = 0;
		ncclResult_t r = ncclCommInitRankConfig(&x->nc, opt->n_ranks, id, opt->rank, &cfg);
		if (r != ncclSuccess && r != ncclInProgress) {
			x->failed = true;
			st = err_set(e, ST_CUDA, "comm nccl rank %d: ncclCommInitRankConfig: %s (%s)", opt->rank,
				     ncclGetErrorString(r), ncclGetLastError(NULL));
		} else {
			st = nccl__settle(c, r, "ncclCommInitRank (waiting for every rank to join)", e);
		}
	}
	if (st != ST_OK) {
		nccl__free(x, opt->rank);
		free(c);
		return st;
	}
	int runtime_version = 0;
	(void)ncclGetVersion(&runtime_version);
	log_msg(LOG_INFO, "comm", "nccl rank %d/%d: ready on CUDA device %d (NCCL %d, built against %d)", opt->rank,
		opt->n_ranks, x->device, runtime_version, NCCL_VERSION_CODE);
	*out = c;
	return ST_OK;
}
