/*
 * comm/comm_tcp.h: a third comm backend, ranks as processes (on one or more
 * machines) connected by TCP, host buffers only.
 *
 * It exists so that the CPU executor runs tensor parallel across processes
 * (the cpu backend is threads-only and NCCL needs GPUs): the two-process
 * serving tests run the real model with it, and it is a fallback data plane
 * for small models. It is not fast: every collective goes through rank 0
 * (a star), which is fine for step plans and a tiny model, not for a 150 GiB
 * one (use NCCL there).
 *
 * Results are those of the cpu backend, bit for bit: rank 0 gathers every
 * rank's contribution and sums each element in rank order 0, 1, ..., n-1 in
 * fp32 (bf16 widened, summed, rounded once to nearest even), then sends the
 * one result to everyone. Every call carries a header (op, dtype, count,
 * root) that rank 0 checks against its own: ranks that call different
 * collectives fail with ST_INVALID naming both calls, never corrupt memory.
 *
 * Waits have the communicator's timeout. comm_abort() shuts the sockets down,
 * so this rank's waits end at once with ST_ABORTED and every peer sees its
 * connection close (ST_IO, "rank N closed the connection") instead of
 * waiting for the timeout. A peer that dies is the same ST_IO.
 *
 * Setting up: rank 0 opens a listener (an ephemeral port by default) before
 * the bootstrap, packs its port and a random nonce into the 128-byte id that
 * the bootstrap ships (comm_tcp_id_pack), and accepts the workers; each
 * worker unpacks the id and connects to the master's address. Every data
 * connection is authenticated with the group secret (comm/auth.h): rank 0
 * sends a fresh challenge, the worker's hello carries the nonce, its own
 * challenge and a MAC over rank 0's challenge, rank 0's ack a MAC over the
 * worker's. A connection that fails any of it (a stranger, a replay, another
 * group) is logged and dropped; rank 0 keeps accepting until its deadline.
 */
#ifndef DSV4_COMM_COMM_TCP_H
#define DSV4_COMM_COMM_TCP_H

#include <stdint.h>

#include "comm/auth.h"
#include "comm/comm.h"
#include "common/status.h"

struct comm_tcp_listener;

/* Rank 0: listens on addr (NULL / "" = all interfaces; an address that is
 * not this machine's falls back to all interfaces) and port (0 = an
 * ephemeral one); a nonce is drawn from /dev/urandom. secret (copied; NULL =
 * the empty key, tests only) authenticates the workers. */
DSV4_WUR enum status comm_tcp_listen(struct comm_tcp_listener **out, const char *addr, int port,
				     const struct comm_secret *secret, struct err *e);
int comm_tcp_listener_port(const struct comm_tcp_listener *l);
/* The id for comm_boot_options.unique_id: "DSV4TCP" magic, port, nonce. */
void comm_tcp_id_pack(const struct comm_tcp_listener *l, uint8_t id[COMM_UNIQUE_ID_BYTES]);
/* ST_INVALID when the id is not a TCP id (for example an NCCL one). */
DSV4_WUR enum status comm_tcp_id_unpack(const uint8_t id[COMM_UNIQUE_ID_BYTES], int *port, uint64_t *nonce,
					 struct err *e);
/* Closes the listener (after comm_tcp_accept). NULL is a no-op. */
void comm_tcp_listener_destroy(struct comm_tcp_listener *l);

/* Rank 0: accepts n_ranks - 1 workers (each says its rank and the nonce)
 * within timeout_ms (0 = COMM_DEFAULT_TIMEOUT_MS), which also bounds every
 * later wait. */
DSV4_WUR enum status comm_tcp_accept(struct comm **out, struct comm_tcp_listener *l, int n_ranks, int timeout_ms,
				     struct err *e);

/* Rank 1..n_ranks-1: connects to host:port (retrying until the timeout) and
 * joins with the nonce and the group secret (NULL = the empty key). */
DSV4_WUR enum status comm_tcp_connect(struct comm **out, const char *host, int port, uint64_t nonce,
				      const struct comm_secret *secret, int rank, int n_ranks, int timeout_ms,
				      struct err *e);

#endif
