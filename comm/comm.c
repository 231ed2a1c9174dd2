/*
 * comm/comm.c: the backend-independent half of struct comm.
 *
 * Every public collective passes through here: arguments are checked once
 * (so both backends see only well-formed calls), the sticky error is returned
 * without touching the backend once the comm has failed, and a new failure is
 * recorded as the sticky error. The collectives themselves live in
 * comm_cpu.c and comm_nccl.c behind struct comm_ops.
 */
#include "comm/internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

enum status comm__wrap(struct comm **out, const struct comm_ops *ops, void *ctx, int rank, int n_ranks,
		       struct err *e)
{
	struct comm *c = calloc(1, sizeof *c);
	if (!c)
		return err_set(e, ST_NOMEM, "comm: out of memory");
	c->ops = ops;
	c->ctx = ctx;
	c->rank = rank;
	c->n_ranks = n_ranks;
	err_clear(&c->sticky);
	atomic_init(&c->aborted, 0);
	*out = c;
	return ST_OK;
}

int comm_rank(const struct comm *c) { return c->rank; }
int comm_n_ranks(const struct comm *c) { return c->n_ranks; }
const char *comm_backend_name(const struct comm *c) { return c->ops->name; }
enum status comm_status(const struct comm *c) { return c->sticky.st; }

size_t comm_dtype_bytes(enum comm_dtype dt)
{
	switch (dt) {
	case COMM_DTYPE_F32: return 4;
	case COMM_DTYPE_BF16: return 2;
	case COMM_DTYPE_BYTES: return 1;
	}
	return 0;
}

const char *comm_dtype_name(enum comm_dtype dt)
{
	switch (dt) {
	case COMM_DTYPE_F32: return "f32";
	case COMM_DTYPE_BF16: return "bf16";
	case COMM_DTYPE_BYTES: return "bytes";
	}
	return "unknown";
}

/* ---- Sticky error ---- */

/* Returns the sticky status (copying its message into e) if the comm has
 * failed before; ST_OK otherwise. */
static enum status comm__check_sticky(struct comm *c, struct err *e)
{
	if (c->sticky.st == ST_OK)
		return ST_OK;
	return err_set(e, c->sticky.st, "%s", c->sticky.msg);
}

/* Records a failure of the backend call as the sticky error. */
static enum status comm__record(struct comm *c, enum status st, struct err *e)
{
	if (st == ST_OK)
		return ST_OK;
	if (c->sticky.st == ST_OK) {
		c->sticky.st = st;
		snprintf(c->sticky.msg, sizeof c->sticky.msg, "%s", (e && e->st == st) ? e->msg : status_str(st));
		log_msg(LOG_ERROR, "comm", "rank %d/%d (%s): %s", c->rank, c->n_ranks, c->ops->name, c->sticky.msg);
	}
	return st;
}

/* ---- Argument checks ---- */

static enum status comm__check_args(struct comm *c, const char *op, const void *send, const void *recv,
				    size_t n_elems, enum comm_dtype dt, enum comm_mem mem, bool send_needed,
				    struct err *e)
{
	if (comm_dtype_bytes(dt) == 0)
		return err_set(e, ST_INVALID, "comm %s: unknown dtype %d", op, (int)dt);
	if (mem != COMM_MEM_HOST && mem != COMM_MEM_DEVICE)
		return err_set(e, ST_INVALID, "comm %s: unknown memory kind %d", op, (int)mem);
	if (n_elems > 0 && ((send_needed && !send) || !recv))
		return err_set(e, ST_INVALID, "comm %s: NULL %s buffer for %zu elements", op,
			       !recv ? "recv" : "send", n_elems);
	if (n_elems > SIZE_MAX / 8 / (size_t)c->n_ranks)
		return err_set(e, ST_INVALID, "comm %s: %zu elements is too many", op, n_elems);
	return ST_OK;
}

/* ---- Collectives ---- */

enum status comm_all_reduce_sum(struct comm *c, const void *send, void *recv, size_t n_elems,
				enum comm_dtype dt, enum comm_mem mem, struct err *e)
{
	enum status st = comm__check_sticky(c, e);
	if (st != ST_OK)
		return st;
	st = comm__check_args(c, "all_reduce_sum", send, recv, n_elems, dt, mem, true, e);
	if (st != ST_OK)
		return st;
	if (dt == COMM_DTYPE_BYTES)
		return err_set(e, ST_INVALID, "comm all_reduce_sum: dtype bytes cannot be summed (use f32 or bf16)");
	return comm__record(c, c->ops->all_reduce_sum(c, send, recv, n_elems, dt, mem, e), e);
}

enum status comm_all_gather(struct comm *c, const void *send, void *recv, size_t n_elems,
			    enum comm_dtype dt, enum comm_mem mem, struct err *e)
{
	enum status st = comm__check_sticky(c, e);
	if (st != ST_OK)
		return st;
	st = comm__check_args(c, "all_gather", send, recv, n_elems, dt, mem, true, e);
	if (st != ST_OK)
		return st;
	/* In place must be exactly this rank's slot of recv, as in NCCL. */
	size_t slot_bytes = n_elems * comm_dtype_bytes(dt);
	const char *s = send, *r = recv;
	if (n_elems > 0 && s != r + (size_t)c->rank * slot_bytes && s + slot_bytes > r &&
	    s < r + (size_t)c->n_ranks * slot_bytes)
		return err_set(e, ST_INVALID, "comm all_gather: send overlaps recv but is not rank %d's slot", c->rank);
	return comm__record(c, c->ops->all_gather(c, send, recv, n_elems, dt, mem, e), e);
}

enum status comm_broadcast(struct comm *c, const void *send, void *recv, size_t n_elems, enum comm_dtype dt,
			   int root, enum comm_mem mem, struct err *e)
{
	enum status st = comm__check_sticky(c, e);
	if (st != ST_OK)
		return st;
	if (root < 0 || root >= c->n_ranks)
		return err_set(e, ST_INVALID, "comm broadcast: root %d out of range [0, %d)", root, c->n_ranks);
	st = comm__check_args(c, "broadcast", send, recv, n_elems, dt, mem, c->rank == root, e);
	if (st != ST_OK)
		return st;
	return comm__record(c, c->ops->broadcast(c, send, recv, n_elems, dt, root, mem, e), e);
}

enum status comm_barrier(struct comm *c, struct err *e)
{
	enum status st = comm__check_sticky(c, e);
	if (st != ST_OK)
		return st;
	return comm__record(c, c->ops->barrier(c, e), e);
}

enum status comm_sync(struct comm *c, struct err *e)
{
	enum status st = comm__check_sticky(c, e);
	if (st != ST_OK || !c->ops->sync)
		return st;
	return comm__record(c, c->ops->sync(c, e), e);
}

void comm_abort(struct comm *c, const char *reason)
{
	if (!c)
		return;
	if (atomic_exchange(&c->aborted, 1))
		return;
	c->ops->abort(c, reason ? reason : "no reason given");
}

void comm_destroy(struct comm *c)
{
	if (!c)
		return;
	c->ops->destroy(c);
	free(c);
}
