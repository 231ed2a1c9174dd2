/*
 * comm/comm.h: the tensor-parallel communicator of dsv4.
 *
 * A struct comm is one rank's handle on a group of n_ranks ranks. Every rank
 * calls the same collectives in the same order with the same counts (the CPU
 * backend checks this and fails all ranks with ST_INVALID if they disagree).
 * Two backends sit behind one vtable (struct comm_ops, comm/internal.h):
 *
 *   cpu   ranks are threads of one process sharing a struct comm_cpu_group.
 *         Host buffers only. Collectives are synchronous and deterministic:
 *         every element of a sum is added in rank order 0, 1, ..., n-1 in
 *         fp32 (bf16 is widened, summed, and rounded once, to nearest even),
 *         by exactly one thread, and copied to every rank, so results are
 *         bitwise identical on every rank and across runs.
 *   nccl  one GPU per rank (threads of one process or processes on several
 *         nodes). Device buffers are the fast path: the collective is enqueued
 *         on the communicator's CUDA stream and completes in stream order;
 *         comm_sync() waits for it (with the timeout) and reports asynchronous
 *         NCCL errors. Host buffers are supported through a device staging
 *         buffer allocated at create time (chunked when larger); such calls
 *         are synchronous. Sums follow NCCL's own order and rounding (bf16
 *         may round per step), so they can differ in the last bits from the
 *         cpu backend. Only built with CUDA (comm_nccl_create() returns
 *         ST_UNSUPPORTED otherwise). NCCL's environment (NCCL_SOCKET_IFNAME,
 *         NCCL_IB_HCA, NCCL_DEBUG, ...) is passed through untouched.
 *
 * Errors are values and they stick: after the first failure (timeout, abort,
 * a peer that left, an NCCL error) every later call on that comm returns the
 * same status and message. No call waits forever for a peer: every wait for
 * another rank has the communicator's timeout, and comm_abort() from any
 * thread wakes every rank of the group that is waiting, with ST_ABORTED.
 * (The cpu backend's final step of a collective, after every rank has
 * joined, is bounded work and is not interrupted: ranks are still touching
 * each other's buffers then.)
 *
 * Buffers: send and recv of one rank may be the same pointer (in place; for
 * all-gather, in place means send == recv + rank * n_elems * elem_bytes, as in
 * NCCL). Buffers of different ranks must not overlap. Counts are elements of
 * dtype, not bytes.
 *
 * Threads: a struct comm is used by one thread at a time (its rank's thread),
 * except comm_abort(), comm_rank(), comm_n_ranks() and comm_backend_name(),
 * which any thread may call at any time.
 */
#ifndef DSV4_COMM_COMM_H
#define DSV4_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct comm;

enum comm_dtype {
	COMM_DTYPE_F32 = 0,  /* float */
	COMM_DTYPE_BF16 = 1, /* bfloat16 stored as uint16_t */
	COMM_DTYPE_BYTES = 2, /* uint8_t; all-gather and broadcast only (no sum) */
};

/* Where the buffers of one call live. */
enum comm_mem {
	COMM_MEM_HOST = 0,   /* ordinary host memory (malloc, stack, pinned) */
	COMM_MEM_DEVICE = 1, /* CUDA device memory of this rank's GPU */
};

/* Size of an NCCL unique id (ncclUniqueId), the blob the bootstrap ships. */
#define COMM_UNIQUE_ID_BYTES 128

/* ---- Common calls ---- */

int comm_rank(const struct comm *c);
int comm_n_ranks(const struct comm *c);
/* "cpu" or "nccl"; static. */
const char *comm_backend_name(const struct comm *c);

/* Element size in bytes of dt (4, 2, 1); 0 for an unknown value. */
size_t comm_dtype_bytes(enum comm_dtype dt);
const char *comm_dtype_name(enum comm_dtype dt);

/* recv[i] = sum over ranks of send[i], for i < n_elems, on every rank.
 * dt: F32 or BF16. send == recv is allowed (in place). */
DSV4_WUR enum status comm_all_reduce_sum(struct comm *c, const void *send, void *recv, size_t n_elems,
					 enum comm_dtype dt, enum comm_mem mem, struct err *e);

/* recv[r * n_elems + i] = send of rank r [i]: recv holds n_ranks * n_elems
 * elements, in rank order. send == recv + rank * n_elems elements is in place. */
DSV4_WUR enum status comm_all_gather(struct comm *c, const void *send, void *recv, size_t n_elems,
				     enum comm_dtype dt, enum comm_mem mem, struct err *e);

/* recv[i] = send of rank root [i] on every rank (root included). send is read
 * on root only and may be NULL elsewhere; send == recv on root is in place. */
DSV4_WUR enum status comm_broadcast(struct comm *c, const void *send, void *recv, size_t n_elems,
				    enum comm_dtype dt, int root, enum comm_mem mem, struct err *e);

/* Returns when every rank has entered the barrier (NCCL: and the device work
 * enqueued before it on every rank has completed). */
DSV4_WUR enum status comm_barrier(struct comm *c, struct err *e);

/* Waits until the device work this comm enqueued has completed, up to the
 * timeout; reports asynchronous NCCL errors. A no-op returning the sticky
 * status on the CPU backend, whose calls are synchronous. */
DSV4_WUR enum status comm_sync(struct comm *c, struct err *e);

/* The sticky status: ST_OK until a call on this comm failed (or the group was
 * aborted and a call noticed it). */
enum status comm_status(const struct comm *c);

/* Aborts the whole group, from any thread: every rank that is waiting in (or
 * later calls) a collective returns ST_ABORTED with a message naming this rank
 * and reason. NCCL: the local communicator is marked aborted and the
 * waiting thread returns; ncclCommAbort runs in comm_destroy(); remote ranks
 * learn of it through their own timeout or the bootstrap liveness channel
 * (comm/bootstrap.h), whose loss the caller turns into comm_abort() there.
 * reason may be NULL. Idempotent. */
void comm_abort(struct comm *c, const char *reason);

/* Frees the rank's handle; NULL is a no-op. CPU: marks the rank as gone, so a
 * rank still waiting for it fails at once instead of at its timeout. NCCL:
 * ncclCommFinalize + ncclCommDestroy, or ncclCommAbort after an error/abort.
 * After a timeout or abort on NCCL, an NCCL kernel may still be spinning on
 * the GPU over the collective's buffers: destroy the comm (which kills it)
 * before freeing those buffers, or cudaFree will wait for it. */
void comm_destroy(struct comm *c);

/* ---- CPU backend (threads of one process) ---- */

struct comm_cpu_group;

struct comm_cpu_group_options {
	int n_ranks;    /* >= 1 */
	int timeout_ms; /* every wait; 0 = COMM_DEFAULT_TIMEOUT_MS (comm/limits.h) */
};

DSV4_WUR enum status comm_cpu_group_create(struct comm_cpu_group **out, const struct comm_cpu_group_options *opt,
					   struct err *e);
/* Every comm of the group must be destroyed first. NULL is a no-op. */
void comm_cpu_group_destroy(struct comm_cpu_group *g);

/* The handle of rank `rank` (0 <= rank < n_ranks, each taken once) on group g,
 * which must outlive it. Usually called by the rank's own thread. */
DSV4_WUR enum status comm_cpu_create(struct comm **out, struct comm_cpu_group *g, int rank, struct err *e);

/* ---- NCCL backend (one GPU per rank) ---- */

struct comm_nccl_options {
	int n_ranks;
	int rank;
	int cuda_device;          /* cudaSetDevice() index for this rank */
	const uint8_t *unique_id; /* COMM_UNIQUE_ID_BYTES, the same on every rank (from rank 0) */
	void *cuda_stream;        /* cudaStream_t for the collectives; NULL = create one */
	int timeout_ms;           /* init and every wait; 0 = COMM_DEFAULT_TIMEOUT_MS */
	size_t host_staging_bytes; /* device buffer for host-memory calls; 0 = COMM_NCCL_STAGING_BYTES */
};

/* Rank 0 calls this and ships the id to the others (comm/bootstrap.h).
 * ST_UNSUPPORTED without CUDA. */
DSV4_WUR enum status comm_nccl_unique_id(uint8_t id[COMM_UNIQUE_ID_BYTES], struct err *e);

/* Joins the group (ncclCommInitRankConfig, non-blocking, polled up to the
 * timeout: a rank that never comes is ST_TIMEOUT, not a hang). Every rank
 * calls it, each from its own thread or process; it makes cuda_device the
 * calling thread's current device, and host-memory calls do the same.
 * ST_UNSUPPORTED without CUDA or without a GPU. */
DSV4_WUR enum status comm_nccl_create(struct comm **out, const struct comm_nccl_options *opt, struct err *e);

#endif
