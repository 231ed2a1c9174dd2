/*
 * model/exec_open.h: the one way to open a model executor. `dsv4 serve`,
 * `dsv4 generate` and the tests describe what they want (checkpoint, device,
 * sizes, precision, tensor parallelism) and get back an executor for the
 * scheduler (struct exec) with its kernel plan; everything between is here:
 *
 *   1. the device: --device auto|cuda|cpu (auto = GPU 0 when one is usable,
 *      else the CPU; the log says which and why: model_exec_device);
 *   2. the sizes the caller left at 0, for that device (serving: on the CPU a
 *      context of min(model, 16384) tokens and room for four such sequences;
 *      on a GPU the model's context and a KV pool from
 *      --gpu-memory-utilization);
 *   3. the tensor-parallel group: one rank = the executor itself; N ranks on
 *      one node = rank 0 here plus N-1 rank threads over the cpu comm backend
 *      (host-staged, so ranks may share a GPU); N nodes = one process per
 *      node, rank 0 here running the bootstrap (comm/bootstrap.h: version,
 *      checkpoint fingerprint and a shared secret checked) and the tcp comm
 *      backend to the worker processes (model_exec_open_worker);
 *   4. the plan (every layer's kernels), logged once at open and kept for
 *      /metrics (model_exec_open_plan).
 *
 * Start-up order, the same on every rank so that a failure anywhere is an
 * error everywhere: join the group, agree on the executor sizes (rank 0
 * broadcasts them), create the executor, meet at a barrier. A rank whose
 * executor cannot be built aborts the group with its reason.
 *
 * Liveness (tensor parallel): the bootstrap's watcher and every failed
 * collective end in comm_abort() on every rank; on_fail then tells the
 * caller (once, any thread) to stop serving. Idle ranks are pinged from the
 * scheduler's heartbeat (model_exec_open_heartbeat), so a dead rank is found
 * within about a second.
 */
#ifndef DSV4_MODEL_EXEC_OPEN_H
#define DSV4_MODEL_EXEC_OPEN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/exec.h"
#include "model/exec_cpu.h"

struct model_exec_open;

#define MODEL_EXEC_DEFAULT_MASTER_PORT 29555
/* Sizes when the caller leaves them 0: tokens and sequences per step, and
 * serving's context on the CPU. */
#define MODEL_EXEC_DEFAULT_STEP_TOKENS 512
#define MODEL_EXEC_DEFAULT_STEP_SEQS 64
#define MODEL_EXEC_CPU_MAX_MODEL_LEN 16384

/* Tensor parallelism (vLLM's flags; docs/two-gb10.md). */
struct model_exec_parallel {
	int tensor_parallel_size; /* ranks; 0 = 1. With nnodes > 1: 1 or nnodes (one rank per node) */
	int nnodes;               /* processes, one rank each; 0 = 1 */
	int node_rank;            /* this process's rank; 0 runs the scheduler */
	const char *master_addr;  /* rank 0's address (workers: required; rank 0: interface to listen on) */
	int master_port;          /* the bootstrap's TCP port; 0 = MODEL_EXEC_DEFAULT_MASTER_PORT */
	int timeout_ms;           /* start-up and per-collective limit; 0 = the comm defaults */
	const char *secret_file;  /* nnodes > 1: the group secret (comm/auth.h); rank 0 creates it (0600) */
};

/* The world size p describes, or 0 with e naming the flag that is wrong
 * (--tensor-parallel-size, --nnodes, --node-rank, --master-addr,
 * --tp-secret-file). */
int model_exec_parallel_world(const struct model_exec_parallel *p, struct err *e);

struct model_exec_open_options {
	const struct model_checkpoint *ck; /* borrowed; outlives the executor */
	const char *device;                /* "auto" (NULL), "cuda" or "cpu" */
	/* Sizes; 0 = the default (model/exec_cpu.h, or serving's below). */
	uint32_t block_tokens, n_blocks, max_step_tokens, max_step_seqs, max_model_len;
	/* Serving defaults for sizes left 0: CPU: max_model_len min(model's,
	 * 16384), n_blocks room for four sequences of it (at least 64); GPU:
	 * the model's context, the pool from gpu_memory_utilization. */
	bool serving;
	enum model_precision precision;
	bool load_mtp;
	double gpu_memory_utilization;     /* GPU: fraction of the device for this process; 0 = 0.9 */
	const struct kern_disabled *disabled; /* NULL: none */
	bool kernel_selfcheck;
	/* --enforce-eager (vLLM): never capture or replay CUDA graphs; steps
	 * run eagerly (model_exec_cpu_options.enforce_eager). */
	bool enforce_eager;
	struct model_exec_parallel parallel;
	/* ---- speculative decoding ---- --speculative-config JSON (model/spec.h,
	 * docs/speculation.md), NULL = off: the executor drafts and verifies
	 * (one rank; the method must match the checkpoint's draft model). */
	const char *speculative_config;
	/* (optional) tensor parallel: the group failed; any thread, once. */
	void (*on_fail)(void *ctx, const char *msg);
	void *fail_ctx;
};

/* Rank 0: detects the device, builds the group and the executor, logs the
 * plan. A worker process (parallel.node_rank > 0) calls
 * model_exec_open_worker instead. */
enum status model_exec_open(struct model_exec_open **out, const struct model_exec_open_options *opt,
			    struct err *e) DSV4_WUR;
/* Stops the group's other ranks and frees. NULL is a no-op. */
void model_exec_open_destroy(struct model_exec_open *x);

/* The executor the scheduler drives (borrowed; lives as long as x). */
struct exec *model_exec_open_exec(struct model_exec_open *x);
/* Rank 0's own executor: logits of any rows, the plan as text (tests,
 * `dsv4 generate`). Under tensor parallelism its forward calls are
 * collectives the other ranks do not join: use model_exec_open_exec. */
struct model_exec_cpu *model_exec_open_cpu(struct model_exec_open *x);
/* The kernel plan (for /metrics), the device it runs on, the world size. */
const struct kern_plan *model_exec_open_plan(const struct model_exec_open *x);
const struct kern_device *model_exec_open_device(const struct model_exec_open *x);
int model_exec_open_world(const struct model_exec_open *x);
/* The step thread's heartbeat: pings idle ranks (at most twice a second);
 * a no-op for one rank. */
void model_exec_open_heartbeat(struct model_exec_open *x);
/* True once the tensor-parallel group has failed. Any thread. */
bool model_exec_open_failed(const struct model_exec_open *x);

/* A worker process (parallel.nnodes > 1, node_rank > 0): joins rank 0 and
 * runs its step plans until rank 0 shuts the group down (ST_OK) or the group
 * fails (its error). sigs (blocked by the caller; NULL = none) end it early:
 * it leaves the group, *signalled is set and ST_OK returned. n_steps
 * (optional) counts the plans run. */
enum status model_exec_open_worker(const struct model_exec_open_options *opt, const sigset_t *sigs,
				   bool *signalled, uint64_t *n_steps, struct err *e) DSV4_WUR;

#endif
