/*
 * comm/comm_cpu.c: the CPU backend, ranks as threads of one process.
 *
 * It exists so that tensor parallelism runs, and is tested, on machines
 * without GPUs, and so that the NCCL results have a deterministic reference.
 *
 * Every collective is "publish, barrier, work, barrier": each rank writes a
 * slot describing its call (op, count, dtype, root, buffers), waits until all
 * ranks have published, checks that all slots agree (a mismatch fails every
 * rank with the same message instead of corrupting memory), does its share of
 * the work directly on the other ranks' buffers, and waits again so that no
 * rank reuses or frees a buffer another rank is still reading. Only the
 * first wait can time out or be aborted: past it, every rank is in bounded
 * work and the second wait must not let anyone leave early (see cpu__exit).
 *
 * All-reduce: rank r owns the contiguous slice r of the elements; for each
 * element of its slice it adds the inputs in rank order 0..n-1 in fp32 and
 * writes the one result to every rank's recv. Each element is computed once,
 * always in the same order, so the result is bitwise the same on every rank
 * and in every run; bf16 is rounded once at the end (nearest even).
 *
 * Waits are pthread condition waits on CLOCK_MONOTONIC with the group's
 * timeout. The first failure (a timeout, an abort, a rank that destroyed its
 * comm, a mismatch) breaks the group: every rank waiting now or later returns
 * an error that names the rank and the cause.
 */
#include "comm/internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/limits.h"
#include "common/check.h"

enum cpu_op {
	CPU_OP_ALL_REDUCE_SUM = 1,
	CPU_OP_ALL_GATHER = 2,
	CPU_OP_BROADCAST = 3,
	CPU_OP_BARRIER = 4,
};

/* One rank's description of the collective it is in. */
struct cpu_slot {
	enum cpu_op op;
	size_t n_elems;
	enum comm_dtype dt;
	int root;
	const void *send;
	void *recv;
};

struct comm_cpu_group {
	int n_ranks;
	int timeout_ms;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t n_completed;  /* barriers completed by the whole group */
	int n_arrived;         /* ranks waiting in the current barrier */
	uint64_t *n_entered;   /* per rank: barriers entered (names the missing ranks) */
	bool *taken;           /* per rank: comm_cpu_create() done */
	bool *gone;            /* per rank: comm destroyed */
	/* ST_OK while healthy; the first failure otherwise. Under mu. */
	enum status broken_st;
	char broken_msg[ERR_MSG_BYTES];
	struct cpu_slot *slots; /* per rank; written by its owner before a barrier */
};

/* Elements processed per block of the all-reduce (a stack accumulator). */
#define CPU_REDUCE_BLOCK_ELEMS 256

static const char *cpu__op_name(enum cpu_op op)
{
	switch (op) {
	case CPU_OP_ALL_REDUCE_SUM: return "all_reduce_sum";
	case CPU_OP_ALL_GATHER: return "all_gather";
	case CPU_OP_BROADCAST: return "broadcast";
	case CPU_OP_BARRIER: return "barrier";
	}
	return "?";
}

/* ---- Group state ---- */

/* Breaks the group (first cause wins) and wakes every waiter. Caller holds mu. */
static void cpu__break_locked(struct comm_cpu_group *g, enum status st, const char *fmt, ...) DSV4_PRINTF(3, 4);
static void cpu__break_locked(struct comm_cpu_group *g, enum status st, const char *fmt, ...)
{
	if (g->broken_st == ST_OK) {
		g->broken_st = st;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(g->broken_msg, sizeof g->broken_msg, fmt, ap);
		va_end(ap);
	}
	pthread_cond_broadcast(&g->cv);
}

/* The error a rank gets when it finds the group broken by someone else. */
static enum status cpu__broken_err_locked(struct comm_cpu_group *g, struct err *e)
{
	return err_set(e, ST_ABORTED, "comm cpu: group failed: %s", g->broken_msg);
}

static struct timespec cpu__deadline(int timeout_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

/* The entry barrier: publishes this rank's slot and waits until all n_ranks
 * ranks have entered; ST_TIMEOUT after the group's timeout (which breaks the
 * group), ST_ABORTED if the group breaks. The slot is written under the lock
 * and only while the group is healthy, so that once a group is broken no
 * slot changes under a rank that is still reading the slots. */
static enum status cpu__barrier(struct comm_cpu_group *g, int rank, const struct cpu_slot *mine, const char *what,
				struct err *e)
{
	pthread_mutex_lock(&g->mu);
	if (g->broken_st != ST_OK) {
		enum status st = cpu__broken_err_locked(g, e);
		pthread_mutex_unlock(&g->mu);
		return st;
	}
	g->slots[rank] = *mine;
	uint64_t my_round = g->n_completed;
	g->n_entered[rank]++;
	if (++g->n_arrived == g->n_ranks) {
		g->n_arrived = 0;
		g->n_completed++;
		pthread_cond_broadcast(&g->cv);
		pthread_mutex_unlock(&g->mu);
		return ST_OK;
	}
	struct timespec deadline = cpu__deadline(g->timeout_ms);
	while (g->n_completed == my_round) {
		if (g->broken_st != ST_OK) {
			enum status st = cpu__broken_err_locked(g, e);
			pthread_mutex_unlock(&g->mu);
			return st;
		}
		int rc = pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
		if (rc == ETIMEDOUT && g->n_completed == my_round && g->broken_st == ST_OK) {
			char missing[256] = "";
			size_t len = 0;
			for (int k = 0; k < g->n_ranks && len + 8 < sizeof missing; k++)
				if (g->n_entered[k] < g->n_entered[rank])
					len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
								len ? "," : "", k);
			cpu__break_locked(g, ST_TIMEOUT, "rank %d timed out after %d ms in %s waiting for rank(s) %s",
					  rank, g->timeout_ms, what, missing);
			enum status st = err_set(e, ST_TIMEOUT, "comm cpu: %s", g->broken_msg);
			pthread_mutex_unlock(&g->mu);
			return st;
		}
	}
	pthread_mutex_unlock(&g->mu);
	return ST_OK;
}

/* Publishes this rank's slot, waits for all, and checks that every rank is in
 * the same collective. Every rank sees the same slots, so a mismatch fails all
 * of them identically. */
static enum status cpu__enter(struct comm *c, const struct cpu_slot *mine, struct err *e)
{
	struct comm_cpu_group *g = c->ctx;
	enum status st = cpu__barrier(g, c->rank, mine, cpu__op_name(mine->op), e);
	if (st != ST_OK)
		return st;
	const struct cpu_slot *a = &g->slots[0];
	for (int k = 1; k < g->n_ranks; k++) {
		const struct cpu_slot *b = &g->slots[k];
		bool same = a->op == b->op && a->n_elems == b->n_elems && a->dt == b->dt &&
			    (a->op != CPU_OP_BROADCAST || a->root == b->root);
		if (same)
			continue;
		char msg[ERR_MSG_BYTES];
		snprintf(msg, sizeof msg,
			 "collective mismatch: rank 0 called %s(n=%zu, %s, root %d) but rank %d called %s(n=%zu, %s, root %d)",
			 cpu__op_name(a->op), a->n_elems, comm_dtype_name(a->dt), a->root, k, cpu__op_name(b->op),
			 b->n_elems, comm_dtype_name(b->dt), b->root);
		pthread_mutex_lock(&g->mu);
		cpu__break_locked(g, ST_INVALID, "%s", msg);
		pthread_mutex_unlock(&g->mu);
		return err_set(e, ST_INVALID, "comm cpu: %s", msg);
	}
	return ST_OK;
}

/* The exit barrier: once every rank has passed the entry barrier, each one
 * reads and writes the others' buffers until it arrives here, so no rank may
 * leave (and free its buffers) before all have arrived. It therefore ignores
 * aborts and has no timeout: every rank that passed the entry barrier gets
 * here after a bounded amount of memcpy and arithmetic, with nothing in
 * between that can block. An abort during the work is reported by the next
 * call. */
static enum status cpu__exit(struct comm *c, enum cpu_op op, struct err *e)
{
	(void)op;
	(void)e;
	struct comm_cpu_group *g = c->ctx;
	pthread_mutex_lock(&g->mu);
	uint64_t my_round = g->n_completed;
	g->n_entered[c->rank]++;
	if (++g->n_arrived == g->n_ranks) {
		g->n_arrived = 0;
		g->n_completed++;
		pthread_cond_broadcast(&g->cv);
	}
	while (g->n_completed == my_round)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
	return ST_OK;
}

/* Device buffers are a caller bug on this backend; fail this rank at once and
 * break the group so that the others do not wait for it until the timeout. */
static enum status cpu__host_only(struct comm *c, const char *op, enum comm_mem mem, struct err *e)
{
	if (mem == COMM_MEM_HOST)
		return ST_OK;
	struct comm_cpu_group *g = c->ctx;
	pthread_mutex_lock(&g->mu);
	cpu__break_locked(g, ST_UNSUPPORTED, "rank %d called %s on device memory, which the cpu backend does not support",
			  c->rank, op);
	pthread_mutex_unlock(&g->mu);
	return err_set(e, ST_UNSUPPORTED, "comm cpu: %s: device buffers are not supported by the cpu backend (use nccl)",
		       op);
}

/* ---- Collectives ---- */

static inline float cpu__load(const void *p, size_t i, enum comm_dtype dt)
{
	if (dt == COMM_DTYPE_F32)
		return ((const float *)p)[i];
	return comm__bf16_to_f32(((const uint16_t *)p)[i]);
}

static inline void cpu__store(void *p, size_t i, enum comm_dtype dt, float v)
{
	if (dt == COMM_DTYPE_F32)
		((float *)p)[i] = v;
	else
		((uint16_t *)p)[i] = comm__f32_to_bf16(v);
}

static enum status cpu_all_reduce_sum(struct comm *c, const void *send, void *recv, size_t n_elems,
				      enum comm_dtype dt, enum comm_mem mem, struct err *e)
{
	enum status st = cpu__host_only(c, "all_reduce_sum", mem, e);
	if (st != ST_OK)
		return st;
	struct cpu_slot mine = { .op = CPU_OP_ALL_REDUCE_SUM, .n_elems = n_elems, .dt = dt, .root = 0,
				 .send = send, .recv = recv };
	st = cpu__enter(c, &mine, e);
	if (st != ST_OK)
		return st;
	struct comm_cpu_group *g = c->ctx;
	int n_ranks = g->n_ranks;
	/* n_elems * n_ranks cannot overflow: comm.c bounds n_elems. */
	size_t lo = n_elems * (size_t)c->rank / (size_t)n_ranks;
	size_t hi = n_elems * (size_t)(c->rank + 1) / (size_t)n_ranks;
	float acc[CPU_REDUCE_BLOCK_ELEMS];
	for (size_t i0 = lo; i0 < hi; i0 += CPU_REDUCE_BLOCK_ELEMS) {
		size_t m = hi - i0 < CPU_REDUCE_BLOCK_ELEMS ? hi - i0 : CPU_REDUCE_BLOCK_ELEMS;
		/* Read every input of the block before writing any output: in
		 * place, a rank's send is its recv. */
		for (size_t j = 0; j < m; j++)
			acc[j] = cpu__load(g->slots[0].send, i0 + j, dt);
		for (int k = 1; k < n_ranks; k++)
			for (size_t j = 0; j < m; j++)
				acc[j] += cpu__load(g->slots[k].send, i0 + j, dt);
		for (int k = 0; k < n_ranks; k++)
			for (size_t j = 0; j < m; j++)
				cpu__store(g->slots[k].recv, i0 + j, dt, acc[j]);
	}
	return cpu__exit(c, mine.op, e);
}

static enum status cpu_all_gather(struct comm *c, const void *send, void *recv, size_t n_elems,
				  enum comm_dtype dt, enum comm_mem mem, struct err *e)
{
	enum status st = cpu__host_only(c, "all_gather", mem, e);
	if (st != ST_OK)
		return st;
	struct cpu_slot mine = { .op = CPU_OP_ALL_GATHER, .n_elems = n_elems, .dt = dt, .root = 0,
				 .send = send, .recv = recv };
	st = cpu__enter(c, &mine, e);
	if (st != ST_OK)
		return st;
	struct comm_cpu_group *g = c->ctx;
	size_t slot_bytes = n_elems * comm_dtype_bytes(dt);
	for (int k = 0; k < g->n_ranks && slot_bytes > 0; k++) {
		char *dst = (char *)recv + (size_t)k * slot_bytes;
		if (dst != (const char *)g->slots[k].send)
			memcpy(dst, g->slots[k].send, slot_bytes);
	}
	return cpu__exit(c, mine.op, e);
}

static enum status cpu_broadcast(struct comm *c, const void *send, void *recv, size_t n_elems,
				 enum comm_dtype dt, int root, enum comm_mem mem, struct err *e)
{
	enum status st = cpu__host_only(c, "broadcast", mem, e);
	if (st != ST_OK)
		return st;
	struct cpu_slot mine = { .op = CPU_OP_BROADCAST, .n_elems = n_elems, .dt = dt, .root = root,
				 .send = send, .recv = recv };
	st = cpu__enter(c, &mine, e);
	if (st != ST_OK)
		return st;
	struct comm_cpu_group *g = c->ctx;
	size_t n_bytes = n_elems * comm_dtype_bytes(dt);
	const void *src = g->slots[root].send;
	if (n_bytes > 0 && recv != src)
		memmove(recv, src, n_bytes);
	return cpu__exit(c, mine.op, e);
}

static enum status cpu_barrier(struct comm *c, struct err *e)
{
	struct cpu_slot mine = { .op = CPU_OP_BARRIER };
	enum status st = cpu__enter(c, &mine, e);
	if (st != ST_OK)
		return st;
	return cpu__exit(c, mine.op, e);
}

static void cpu_abort(struct comm *c, const char *reason)
{
	struct comm_cpu_group *g = c->ctx;
	pthread_mutex_lock(&g->mu);
	cpu__break_locked(g, ST_ABORTED, "rank %d aborted: %s", c->rank, reason);
	pthread_mutex_unlock(&g->mu);
}

static void cpu_destroy(struct comm *c)
{
	struct comm_cpu_group *g = c->ctx;
	pthread_mutex_lock(&g->mu);
	g->gone[c->rank] = true;
	/* Nobody can complete a collective without this rank any more: say so
	 * now rather than at the others' timeout. A rank still waking from the
	 * last completed barrier is unaffected (it checks completion first). */
	cpu__break_locked(g, ST_ABORTED, "rank %d left the group (its comm was destroyed)", c->rank);
	pthread_mutex_unlock(&g->mu);
}

static const struct comm_ops cpu_ops = {
	.name = "cpu",
	.all_reduce_sum = cpu_all_reduce_sum,
	.all_gather = cpu_all_gather,
	.broadcast = cpu_broadcast,
	.barrier = cpu_barrier,
	.sync = NULL,
	.abort = cpu_abort,
	.destroy = cpu_destroy,
};

/* ---- Group and handles ---- */

enum status comm_cpu_group_create(struct comm_cpu_group **out, const struct comm_cpu_group_options *opt,
				  struct err *e)
{
	*out = NULL;
	if (!opt || opt->n_ranks < 1 || opt->n_ranks > COMM_MAX_RANKS)
		return err_set(e, ST_INVALID, "comm cpu: n_ranks %d out of range [1, %d]", opt ? opt->n_ranks : 0,
			       COMM_MAX_RANKS);
	if (opt->timeout_ms < 0)
		return err_set(e, ST_INVALID, "comm cpu: timeout_ms %d is negative", opt->timeout_ms);
	struct comm_cpu_group *g = calloc(1, sizeof *g);
	if (!g)
		return err_set(e, ST_NOMEM, "comm cpu: out of memory");
	int n = opt->n_ranks;
	g->n_ranks = n;
	g->timeout_ms = opt->timeout_ms ? opt->timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
	g->n_entered = calloc((size_t)n, sizeof *g->n_entered);
	g->taken = calloc((size_t)n, sizeof *g->taken);
	g->gone = calloc((size_t)n, sizeof *g->gone);
	g->slots = calloc((size_t)n, sizeof *g->slots);
	if (!g->n_entered || !g->taken || !g->gone || !g->slots) {
		free(g->n_entered);
		free(g->taken);
		free(g->gone);
		free(g->slots);
		free(g);
		return err_set(e, ST_NOMEM, "comm cpu: out of memory");
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&g->mu, NULL);
	g->broken_st = ST_OK;
	*out = g;
	return ST_OK;
}

void comm_cpu_group_destroy(struct comm_cpu_group *g)
{
	if (!g)
		return;
	for (int k = 0; k < g->n_ranks; k++)
		CHECK(!g->taken[k] || g->gone[k]); /* a live comm still points here */
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g->n_entered);
	free(g->taken);
	free(g->gone);
	free(g->slots);
	free(g);
}

enum status comm_cpu_create(struct comm **out, struct comm_cpu_group *g, int rank, struct err *e)
{
	*out = NULL;
	if (!g)
		return err_set(e, ST_INVALID, "comm cpu: NULL group");
	if (rank < 0 || rank >= g->n_ranks)
		return err_set(e, ST_INVALID, "comm cpu: rank %d out of range [0, %d)", rank, g->n_ranks);
	pthread_mutex_lock(&g->mu);
	enum status st = ST_OK;
	if (g->taken[rank])
		st = err_set(e, ST_INVALID, "comm cpu: rank %d already has a comm in this group", rank);
	else if (g->broken_st != ST_OK)
		st = cpu__broken_err_locked(g, e);
	else
		g->taken[rank] = true;
	pthread_mutex_unlock(&g->mu);
	if (st != ST_OK)
		return st;
	st = comm__wrap(out, &cpu_ops, g, rank, g->n_ranks, e);
	if (st != ST_OK) {
		pthread_mutex_lock(&g->mu);
		g->gone[rank] = true;
		cpu__break_locked(g, st, "rank %d could not create its comm", rank);
		pthread_mutex_unlock(&g->mu);
	}
	return st;
}
