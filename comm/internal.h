/*
 * comm/internal.h: what the backends share: struct comm and the vtable
 * behind it. Not for use outside comm/.
 */
#ifndef DSV4_COMM_INTERNAL_H
#define DSV4_COMM_INTERNAL_H

#include <stdatomic.h>

#include "comm/comm.h"

/* One backend. comm.c validates arguments and keeps the sticky error, so the
 * members see only well-formed calls on a comm that has not failed yet; they
 * fill e and return a status. */
struct comm_ops {
	const char *name;
	enum status (*all_reduce_sum)(struct comm *c, const void *send, void *recv, size_t n_elems,
				      enum comm_dtype dt, enum comm_mem mem, struct err *e);
	enum status (*all_gather)(struct comm *c, const void *send, void *recv, size_t n_elems,
				  enum comm_dtype dt, enum comm_mem mem, struct err *e);
	enum status (*broadcast)(struct comm *c, const void *send, void *recv, size_t n_elems,
				 enum comm_dtype dt, int root, enum comm_mem mem, struct err *e);
	enum status (*barrier)(struct comm *c, struct err *e);
	/* (optional) wait for enqueued device work; NULL = synchronous backend. */
	enum status (*sync)(struct comm *c, struct err *e);
	/* Thread-safe; wakes waiters of the group. reason is never NULL. */
	void (*abort)(struct comm *c, const char *reason);
	/* Frees ctx (not the struct comm). */
	void (*destroy)(struct comm *c);
};

struct comm {
	const struct comm_ops *ops;
	void *ctx; /* backend state */
	int rank;
	int n_ranks;
	/* First failure of a call on this comm (owner thread only). */
	struct err sticky;
	/* Set by comm_abort() from any thread. */
	atomic_int aborted;
};

/* Allocates a struct comm around ops/ctx. */
enum status comm__wrap(struct comm **out, const struct comm_ops *ops, void *ctx, int rank, int n_ranks,
		       struct err *e) DSV4_WUR;

/* bf16 <-> f32, round to nearest even, NaN kept quiet. */
static inline float comm__bf16_to_f32(uint16_t h)
{
	union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
	return v.f;
}

static inline uint16_t comm__f32_to_bf16(float f)
{
	union { float f; uint32_t u; } v = { .f = f };
	if ((v.u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((v.u >> 16) | 0x40u);
	return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

#endif
