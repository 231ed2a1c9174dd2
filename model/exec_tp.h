/*
 * model/exec_tp.h: tensor-parallel serving over the executor interface.
 *
 * Rank 0 runs the server and the scheduler; its executor is a wrapper
 * (model_exec_tp) around rank 0's own executor that, before every step,
 * broadcasts the step plan to the other ranks over the group's comm. The
 * other ranks run model_exec_tp_worker_run(): receive a plan, run their own
 * executor's step on it (their sampling output is ignored: only rank 0
 * samples), until rank 0 says shut down. The collectives inside the forward
 * pass keep the ranks in lockstep.
 *
 * Messages, all comm_broadcast from root 0 in COMM_DTYPE_BYTES:
 *   header (MODEL_TP_HEADER_BYTES): u32 magic 'TPMS', u32 kind (PLAN, PING,
 *          SHUTDOWN), u64 payload bytes;
 *   payload (PLAN only): the encoded plan (model_exec_tp_plan_encode).
 * PING keeps idle workers from reaching the comm timeout and finds a dead
 * rank within a second: call model_exec_tp_ping() from the step thread
 * while idle (the scheduler loop's heartbeat).
 *
 * Plan encoding: native byte order (the header carries a byte-order mark
 * and a version; a mismatch is a clear error), everything a step carries:
 * token ids, positions, query_start, block ids, and per sequence its
 * metadata, sampling parameters (with logit bias) and token histories.
 * Decoding checks every count against the buffer and every index against the
 * arrays, so a corrupt plan is ST_INVALID, never an out-of-bounds read.
 */
#ifndef DSV4_MODEL_EXEC_TP_H
#define DSV4_MODEL_EXEC_TP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/exec.h"

struct comm;

#define MODEL_TP_HEADER_BYTES 16

/* ---- Plan encoding ---- */

/* A growable byte buffer (data is malloc'ed; free() it). */
struct model_tp_buf {
	uint8_t *data;
	size_t n, cap;
};

/* Encodes step into b (b->n reset first; b's storage reused). */
enum status model_exec_tp_plan_encode(const struct exec_step *step, struct model_tp_buf *b, struct err *e) DSV4_WUR;

/* A decoded plan: step points into arrays owned here. */
struct model_tp_plan {
	struct exec_step step;
	void *mem; /* one allocation behind every array */
	size_t mem_cap;
};

/* Decodes data[0..n) into p (reusing p's storage; zero-initialise p first). */
enum status model_exec_tp_plan_decode(struct model_tp_plan *p, const uint8_t *data, size_t n,
				      struct err *e) DSV4_WUR;
void model_exec_tp_plan_free(struct model_tp_plan *p);

/* ---- Rank 0: the broadcasting wrapper ---- */

struct model_exec_tp;

struct model_exec_tp_options {
	struct exec *inner; /* rank 0's executor (borrowed) */
	struct comm *comm;  /* rank 0 of the group (borrowed; used only from the step thread and destroy) */
	/* (optional) called once, on the step thread, when the group has
	 * failed (a rank died, aborted, timed out or desynchronised): the
	 * caller should stop serving. msg is valid during the call only. */
	void (*on_fail)(void *ctx, const char *msg);
	void *fail_ctx;
};

enum status model_exec_tp_create(struct model_exec_tp **out, const struct model_exec_tp_options *opt,
				 struct err *e) DSV4_WUR;
/* The executor the scheduler drives (info is the inner one's). */
struct exec *model_exec_tp_exec(struct model_exec_tp *t);
/* Broadcasts a PING (step thread, idle). Failure calls on_fail. */
enum status model_exec_tp_ping(struct model_exec_tp *t, struct err *e) DSV4_WUR;
/* True once the group has failed. Any thread. */
bool model_exec_tp_failed(const struct model_exec_tp *t);
/* Tells the workers to stop (broadcast SHUTDOWN) unless the group failed;
 * idempotent. Call after the step thread has stopped. */
void model_exec_tp_shutdown(struct model_exec_tp *t);
/* Shuts down (as above) and frees. NULL is a no-op. */
void model_exec_tp_destroy(struct model_exec_tp *t);

/* ---- Ranks 1..n-1 ---- */

/* Receives and runs plans on inner until rank 0 sends SHUTDOWN (ST_OK) or
 * the group fails (its error). A step that fails while the group is healthy
 * is logged and the loop goes on, as rank 0's scheduler does. n_steps_out
 * (optional) counts the plans run. */
enum status model_exec_tp_worker_run(struct exec *inner, struct comm *comm, uint64_t *n_steps_out,
				     struct err *e) DSV4_WUR;

#endif
