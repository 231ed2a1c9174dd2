/*
 * comm/bootstrap.h: how the ranks of a multi-node tensor-parallel group find
 * each other, and learn when one of them is gone.
 *
 * `dsv4 serve --nnodes 2 --node-rank 1 --master-addr HOST --master-port P`
 * becomes comm_boot_create() with rank 1; the master (rank 0) calls it with
 * rank 0 and the same port. Rank 0 listens on a TCP port; every worker
 * connects (retrying until its deadline, so start order does not matter) and
 * sends a hello: protocol magic and version, the dsv4 version string, a 64-bit
 * checkpoint fingerprint, the world size and its rank. The master checks all
 * of it (same protocol, same dsv4 version, same fingerprint, same world size,
 * rank in [1, n_ranks) and not taken) and, once every worker has joined,
 * sends each the 128-byte NCCL unique id (opaque here: the caller makes it
 * with comm_nccl_unique_id()). A check that fails is a clear error on both
 * sides (the master sends the worker its reason); nothing hangs: every step
 * has the deadline.
 *
 * After the handshake the connections stay open as a liveness channel (with
 * TCP keepalive): comm_boot_poll(), or a watcher thread with a callback,
 * reports a peer whose process exited or crashed (connection closed), whose
 * machine vanished (keepalive, about 11 s), or which left with a reason
 * (comm_boot_destroy() / comm_boot_leave() send a goodbye). The server turns
 * that into 503 on /health, comm_abort() on its communicator and a non-zero
 * exit. Topology is a star: the master sees every worker; a worker sees only
 * the master, and learns of another worker's death when the master exits.
 *
 * comm/ does not depend on model/: the version string and the fingerprint
 * are parameters (model_dsv4_version() and the checkpoint's fingerprint in
 * the server).
 *
 * Authentication (protocol 2, comm/auth.h): the master opens every accepted
 * connection with a fresh random challenge; the hello carries the worker's
 * own challenge and an HMAC with the group secret over the master's challenge
 * and the hello; the welcome an HMAC over the worker's challenge and the
 * welcome. A connection whose hello is missing, malformed, or fails the MAC
 * (a stranger, a port scan, a wrong-secret worker, a replayed hello) is
 * logged and dropped (a wrong-secret worker is told why) and the master
 * keeps waiting for the real workers: nothing a stranger sends ends the
 * group. Checks of an authenticated hello (version, fingerprint, world size,
 * rank) still fail the group, as before, with the reason on both sides.
 *
 * Wire format (all integers little-endian), one frame per message:
 *   header    u32 magic 'DSV4' (0x34565344), u16 protocol version, u16 type,
 *             u32 payload bytes (<= COMM_BOOT_MAX_PAYLOAD_BYTES)
 *   CHALLENGE (master -> worker, first) 32 random bytes
 *   HELLO     (worker -> master) u32 rank, u32 n_ranks, u64 fingerprint,
 *             u16 version bytes, version (no NUL), 32-byte worker challenge,
 *             32-byte MAC("dsv4 boot hello", master challenge, all before it)
 *   WELCOME   (master -> worker) u32 n_ranks, 128 bytes unique id,
 *             32-byte MAC("dsv4 boot welcome", worker challenge, all before it)
 *   REJECT    (master -> worker) reason text
 *   BYE       (either way, after the handshake) reason text
 */
#ifndef DSV4_COMM_BOOTSTRAP_H
#define DSV4_COMM_BOOTSTRAP_H

#include <stdint.h>

#include "comm/auth.h"
#include "comm/comm.h"
#include "common/status.h"

#define COMM_BOOT_MAGIC 0x34565344u /* "DSV4" in little-endian byte order */
#define COMM_BOOT_PROTOCOL_VERSION 2

struct comm_boot;

struct comm_boot_options {
	int n_ranks;          /* world size (nodes), >= 1 */
	int rank;             /* 0 = master (listens), 1..n_ranks-1 = worker (connects) */
	const char *master_addr; /* worker: master's host name or address (required);
				  * master: address to listen on, NULL or "" = all interfaces
				  * (also when it is not an address of this machine) */
	int master_port;      /* TCP port, 1..65535 */
	const char *version;  /* dsv4 version string, compared exactly (required) */
	uint64_t checkpoint_fingerprint; /* compared exactly */
	const uint8_t *unique_id; /* master: COMM_UNIQUE_ID_BYTES to ship (NULL = zeros); worker: ignored */
	int timeout_ms;       /* deadline of the whole handshake; 0 = COMM_BOOT_DEFAULT_TIMEOUT_MS */
	const struct comm_secret *secret; /* the group secret; NULL = the empty key (tests only) */
};

/* Runs the handshake: the master returns when every worker has joined, a
 * worker when the master has accepted it. Errors: ST_TIMEOUT (the peer did
 * not come; the message says who and where), ST_INVALID (version,
 * fingerprint, world size or rank mismatch; both sides get the reason),
 * ST_IO (garbage on the socket, connection lost, cannot listen). */
DSV4_WUR enum status comm_boot_create(struct comm_boot **out, const struct comm_boot_options *opt, struct err *e);

int comm_boot_rank(const struct comm_boot *b);
int comm_boot_n_ranks(const struct comm_boot *b);
/* The NCCL unique id: the master's own, or what the master sent the worker.
 * COMM_UNIQUE_ID_BYTES, owned by b. */
const uint8_t *comm_boot_unique_id(const struct comm_boot *b);

/* Liveness check, waiting up to wait_ms (0 = do not wait) for news. ST_OK:
 * every peer is still connected. ST_IO: a peer's connection closed or broke
 * (it exited, crashed, or its machine vanished). ST_ABORTED: a peer left with
 * a goodbye (the message carries its reason). The first loss sticks: later
 * calls return it at once. Thread-safe. */
DSV4_WUR enum status comm_boot_poll(struct comm_boot *b, int wait_ms, struct err *e);

/* Called once, from the watcher thread, when a peer is lost (st and msg as
 * comm_boot_poll() would return them; msg is valid during the call only).
 * It should be quick: set a flag, comm_abort(), wake the main loop. It must
 * not call comm_boot_destroy() (which joins the watcher thread). */
typedef void (*comm_boot_lost_fn)(void *ctx, enum status st, const char *msg);

/* Starts a watcher thread that polls the peers and calls lost() once on the
 * first loss. At most one watcher per comm_boot; stopped by destroy. */
DSV4_WUR enum status comm_boot_watch(struct comm_boot *b, comm_boot_lost_fn lost, void *ctx, struct err *e);

/* Sends a goodbye with reason to every peer (they see ST_ABORTED "rank N
 * left: reason"), then closes the connections. For a rank that fails and
 * wants its peers to log why. Idempotent; destroy still needed. */
void comm_boot_leave(struct comm_boot *b, const char *reason);

/* Stops the watcher, says goodbye ("shutting down") if comm_boot_leave() was
 * not called, closes and frees. NULL is a no-op. */
void comm_boot_destroy(struct comm_boot *b);

#endif
