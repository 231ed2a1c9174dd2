/*
 * server/tp_serve.h: tensor-parallel serving for `dsv4 serve`: the flags,
 * the group set-up (threads of one process, or one process per node with
 * the TCP bootstrap), rank 0's executor and the worker ranks' main.
 *
 * One node, --tensor-parallel-size N: N ranks as threads over the cpu comm
 * backend; rank 0 is the scheduler's executor (model/exec_tp.h), ranks
 * 1..N-1 are threads that run the plans it broadcasts.
 * Several nodes, --nnodes N --node-rank R: one rank per node (process).
 * Rank 0 opens a TCP data listener, runs the bootstrap (comm/bootstrap.h:
 * dsv4 version, checkpoint fingerprint, world size and rank are checked;
 * the 128-byte id carries the data listener's port and a nonce), accepts the
 * workers on the TCP comm backend (comm/comm_tcp.h; both links authenticated
 * with the --tp-secret-file secret, both listeners on --master-addr's
 * interface) and sends them its
 * executor sizes, so that every rank builds the same block pool. Workers
 * run no HTTP server.
 *
 * Liveness: the bootstrap's watcher and every failed collective end in
 * comm_abort() on every rank; rank 0's on_fail callback then makes the
 * server answer 503 and exit non-zero (tp_serve_fail_engine); a worker
 * exits non-zero. Idle ranks ping once a second (the scheduler loop's
 * heartbeat), so a dead rank is found within about a second, never a hang.
 */
#ifndef DSV4_SERVER_TP_SERVE_H
#define DSV4_SERVER_TP_SERVE_H

#include <signal.h>
#include <stdbool.h>

#include "common/status.h"
#include "model/checkpoint.h"
#include "model/exec_cpu.h"

struct engine;
struct tp_serve;

struct tp_args {
	int nnodes;              /* --nnodes (default 1) */
	int node_rank;           /* --node-rank (default 0) */
	const char *master_addr; /* --master-addr (workers: required) */
	int master_port;         /* --master-port (default 29555) */
	int timeout_ms;          /* --tp-timeout seconds * 1000; 0 = the comm/bootstrap defaults */
	const char *secret_file; /* --tp-secret-file: the group secret (comm/auth.h); --nnodes > 1: required,
				  * rank 0 creates it (0600) when it does not exist */
	/* --precision reference|fp32 (as `dsv4 generate`): the CPU executor's
	 * numerics. Parsed here because fp32 is what makes TP=N equal TP=1 up
	 * to fp32 summation order; reference precision rounds each rank's
	 * partial sums to bf16, so a near tie can flip. */
	enum model_precision precision;
};

/* Takes the tensor-parallel flags out of argv (shifting the rest down and
 * updating *argc) into a. 0, or CLI_EXIT_USAGE after printing why. */
int tp_args_extract(int *argc, char **argv, struct tp_args *a);
/* The usage lines of these flags. */
const char *tp_args_usage(void);
/* The world size from --tensor-parallel-size and --nnodes, or -1 after
 * printing why the combination is refused. test_executor: --executor test. */
int tp_args_world(const struct tp_args *a, long tensor_parallel_size, bool test_executor);

struct tp_serve_options {
	const struct model_exec_cpu_options *xo; /* rank 0's executor options (ck, sizes) */
	int world_size;                          /* > 1 */
	struct tp_args args;
	void (*on_fail)(void *ctx, const char *msg); /* (optional) any thread, once */
	void *fail_ctx;
};

/* Rank 0 (node rank 0): builds the group and rank 0's executor. */
enum status tp_serve_create(struct tp_serve **out, const struct tp_serve_options *opt, struct err *e) DSV4_WUR;
struct exec *tp_serve_exec(struct tp_serve *t);
const struct kern_plan *tp_serve_plan(const struct tp_serve *t);
/* On the scheduler's step thread (its heartbeat): pings idle workers. */
void tp_serve_heartbeat(struct tp_serve *t);
bool tp_serve_failed(const struct tp_serve *t);
/* After a failure: /health 503, new requests 503, the requests in flight
 * ended, and a short linger so that the 503 can be seen; then returns and
 * the caller exits non-zero. */
void tp_serve_fail_engine(struct tp_serve *t, struct engine *en);
/* Stops the workers (after engine_destroy) and frees. NULL is a no-op. */
void tp_serve_destroy(struct tp_serve *t);

/* `dsv4 serve --node-rank R` with R > 0: joins rank 0, runs its plans until
 * rank 0 shuts the group down (exit 0) or the group fails (exit 1). sigs
 * (blocked by the caller) end it early: it leaves the group and exits 0. */
int tp_serve_worker(const struct tp_args *a, const struct model_checkpoint *ck, const sigset_t *sigs);

#endif
