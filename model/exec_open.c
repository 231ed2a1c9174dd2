/*
 * model/exec_open.c: opening an executor (model/exec_open.h): device
 * detection, the sizes for that device, the tensor-parallel group (rank
 * threads over the cpu comm backend, or the bootstrap and the tcp comm
 * backend across processes), rank 0's executor with its broadcasting
 * wrapper, and a worker process's main. One place, so that serve, generate
 * and the tests cannot build executors or groups differently.
 */
#include "model/exec_open.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/comm_tcp.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "kernels/registry/registry.h"
#include "model/exec_tp.h"
#include "model/spec.h"

const char *model_dsv4_version(void); /* model/model_version.c */

/* Idle pings: at most one per this interval (the heartbeat comes about once
 * a second when idle, and after every step). */
#define EXEC_OPEN_PING_INTERVAL_S 0.5
#define EXEC_OPEN_CONFIG_MAGIC 0x47464354u /* "TCFG" */
#define EXEC_OPEN_CONFIG_WORDS 8

int model_exec_parallel_world(const struct model_exec_parallel *p, struct err *e)
{
	int tp = p->tensor_parallel_size > 0 ? p->tensor_parallel_size : 1;
	int nnodes = p->nnodes > 0 ? p->nnodes : 1;
	if (tp > 64 || (tp & (tp - 1))) {
		err_set(e, ST_INVALID, "--tensor-parallel-size %d: expected a power of two in 1..64", tp);
		return 0;
	}
	if (nnodes > 1) {
		if (tp != 1 && tp != nnodes) {
			err_set(e, ST_INVALID, "--tensor-parallel-size %d with --nnodes %d: one rank per node, so the "
					       "tensor-parallel size is the number of nodes (leave it out or pass %d)",
				tp, nnodes, nnodes);
			return 0;
		}
		if (p->node_rank < 0 || p->node_rank >= nnodes) {
			err_set(e, ST_INVALID, "--node-rank %d out of range for --nnodes %d (0..%d)", p->node_rank, nnodes,
				nnodes - 1);
			return 0;
		}
		if (!p->secret_file) {
			err_set(e, ST_INVALID, "--nnodes %d needs --tp-secret-file FILE (the group's shared secret; rank 0 "
					       "creates it when absent, copy it to every node): without it anyone who "
					       "reaches the master port can join the group", nnodes);
			return 0;
		}
		if (p->node_rank > 0 && !p->master_addr) {
			err_set(e, ST_INVALID, "--node-rank %d needs --master-addr (rank 0's address)", p->node_rank);
			return 0;
		}
		return nnodes;
	}
	if (p->node_rank != 0) {
		err_set(e, ST_INVALID, "--node-rank %d needs --nnodes > 1", p->node_rank);
		return 0;
	}
	return tp;
}

/* ---- The fingerprint the ranks compare ---- */

/* model_checkpoint_fingerprint() covers config.json, the index and the
 * shard headers, not tensor data: two checkpoints of the same shapes with
 * different weights (another seed, another fine-tune) have the same value.
 * The group also compares a sample of every shard's bytes, SAMPLE_BYTES at
 * its start, middle and end: a few hundred KiB per checkpoint, read once at
 * start-up, and different weights almost surely differ there. */
#define EXEC_OPEN_SAMPLE_BYTES (64u << 10)

static uint64_t exec_open__fnv(uint64_t h, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static uint64_t exec_open__fingerprint(const struct model_checkpoint *ck)
{
	uint64_t h = model_checkpoint_fingerprint(ck);
	uint8_t *buf = malloc(EXEC_OPEN_SAMPLE_BYTES);
	if (!buf)
		return h;
	for (int s = 0; s < model_checkpoint_n_shards(ck); s++) {
		uint64_t size = model_checkpoint_shard_bytes(ck, s);
		int fd = open(model_checkpoint_shard_path(ck, s), O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			h = exec_open__fnv(h, (const uint8_t *)"?", 1);
			continue;
		}
		uint64_t at[3] = {0, size / 2, size > EXEC_OPEN_SAMPLE_BYTES ? size - EXEC_OPEN_SAMPLE_BYTES : 0};
		for (int k = 0; k < 3; k++) {
			ssize_t r = pread(fd, buf, EXEC_OPEN_SAMPLE_BYTES, (off_t)at[k]);
			if (r > 0)
				h = exec_open__fnv(h, buf, (size_t)r);
		}
		close(fd);
	}
	free(buf);
	return h;
}

/* ---- Executor sizes, rank 0 -> worker processes ---- */

/* w[7]: load_mtp in bit 0, the speculative method in bits 8..15 and K in
 * bits 16..23 (every rank wraps its executor the same way). */
static void cfg_pack(uint32_t w[EXEC_OPEN_CONFIG_WORDS], const struct model_exec_cpu_options *xo,
		     const struct spec_config *sc)
{
	w[0] = EXEC_OPEN_CONFIG_MAGIC;
	w[1] = xo->block_tokens;
	w[2] = xo->n_blocks;
	w[3] = xo->max_step_tokens;
	w[4] = xo->max_step_seqs;
	w[5] = xo->max_model_len;
	w[6] = (uint32_t)xo->precision;
	w[7] = (uint32_t)xo->load_mtp | (uint32_t)sc->method << 8 | sc->num_speculative_tokens << 16;
}

static enum status cfg_unpack(const uint32_t w[EXEC_OPEN_CONFIG_WORDS], struct model_exec_cpu_options *xo,
			      struct spec_config *sc, struct err *e)
{
	if (w[0] != EXEC_OPEN_CONFIG_MAGIC)
		return err_set(e, ST_INVALID, "tensor parallel: rank 0 sent no executor configuration");
	xo->block_tokens = w[1];
	xo->n_blocks = w[2];
	xo->max_step_tokens = w[3];
	xo->max_step_seqs = w[4];
	xo->max_model_len = w[5];
	xo->precision = (enum model_precision)w[6];
	xo->load_mtp = w[7] & 1;
	*sc = (struct spec_config){.method = (enum model_draft_kind)(w[7] >> 8 & 0xff),
				   .num_speculative_tokens = w[7] >> 16 & 0xff};
	return ST_OK;
}

/* The group secret from --tp-secret-file; rank 0 creates the file when it
 * does not exist. */
static enum status exec_open__secret(const struct model_exec_parallel *p, struct comm_secret *s, struct err *e)
{
	if (!p->secret_file)
		return err_set(e, ST_INVALID, "tensor parallel: --nnodes %d needs --tp-secret-file", p->nnodes);
	if (p->node_rank == 0 && access(p->secret_file, F_OK) != 0) {
		enum status st = comm_secret_create_file(p->secret_file, e);
		if (st)
			return st;
		log_msg(LOG_INFO, "tp", "created the group secret %s (mode 0600): copy it to every worker node",
			p->secret_file);
	}
	return comm_secret_load(s, p->secret_file, e);
}

/* Every rank's pool must serve the block ids and context the scheduler
 * uses, and a GPU rank sizes its pool from its own free memory: the ranks
 * compare their sizes (one all-gather) and rank 0 tells the scheduler the
 * smallest pool and context of any rank (a rank's larger pool is left
 * partly unused). Different block sizes fail every rank alike. */
static enum status exec_open__agree(struct comm *c, struct model_exec_cpu *x, struct err *e)
{
	struct exec_info *in = &model_exec_cpu_exec(x)->info;
	uint32_t mine[3] = {in->n_blocks, in->max_model_len, in->block_tokens};
	int n = comm_n_ranks(c);
	uint32_t *all = calloc((size_t)n * 3, sizeof *all);
	if (!all)
		return err_set(e, ST_NOMEM, "tensor parallel: out of memory");
	enum status st = comm_all_gather(c, mine, all, sizeof mine, COMM_DTYPE_BYTES, COMM_MEM_HOST, e);
	uint32_t nb = all[0], len = all[1];
	for (int r = 1; !st && r < n; r++) {
		const uint32_t *o = all + 3 * r;
		if (o[2] != all[2])
			st = err_set(e, ST_INVALID, "tensor parallel: rank %d uses KV blocks of %u tokens, rank 0 of %u",
				     r, o[2], all[2]);
		nb = o[0] < nb ? o[0] : nb;
		len = o[1] < len ? o[1] : len;
	}
	if (!st && comm_rank(c) == 0 && (nb < in->n_blocks || len < in->max_model_len)) {
		log_msg(LOG_INFO, "tp", "tensor parallel: the smallest rank holds %u KV blocks and %u positions: "
					"serving with those (rank 0 has room for %u and %u)", nb, len, in->n_blocks,
			in->max_model_len);
		in->n_blocks = nb;
		in->max_model_len = len;
	}
	free(all);
	return st;
}

/* ---- Rank 0 ---- */

struct exec_open_rank {
	struct model_exec_open *x;
	int rank;
	pthread_t th;
	bool started;
};

struct model_exec_open {
	struct kern_device dev;
	struct model_exec_cpu_options xo; /* rank 0's sizes, shared with the rank threads */
	int world;
	struct model_exec_parallel par;
	void (*on_fail)(void *ctx, const char *msg);
	void *fail_ctx;
	struct comm_cpu_group *group;
	struct exec_open_rank *ranks; /* [world]; threads 1..world-1 on one node */
	struct comm_boot *boot;
	struct comm_tcp_listener *lis;
	struct comm *comm; /* rank 0's */
	struct model_exec_cpu *cpu;
	struct model_exec_tp *tp;
	struct model_spec_exec *spec; /* ---- speculative decoding ---- or NULL */
	struct spec_config sc;        /* every rank wraps its executor in a speculating one */
	atomic_bool failed;
	atomic_bool stopping;
	double last_ping_s;
};

static void exec_open__fail(struct model_exec_open *x, const char *msg)
{
	if (atomic_exchange(&x->failed, true))
		return;
	if (atomic_load(&x->stopping)) {
		log_msg(LOG_INFO, "tp", "during shutdown: %s", msg);
		return;
	}
	log_msg(LOG_ERROR, "tp", "tensor parallel group failed: %s", msg);
	if (x->on_fail)
		x->on_fail(x->fail_ctx, msg);
}

static void exec_open__on_exec_fail(void *ctx, const char *msg) { exec_open__fail(ctx, msg); }

static void exec_open__on_lost(void *ctx, enum status st, const char *msg)
{
	(void)st;
	struct model_exec_open *x = ctx;
	if (x->comm)
		comm_abort(x->comm, msg);
	exec_open__fail(x, msg);
}

/* ---- speculative decoding ---- the speculating executor around x when sc
 * asks for one (*out NULL otherwise); comm is the TP group or NULL. Every
 * rank makes one, after exec_open__agree (its info is x's from then on). */
static enum status exec_open__spec(struct model_spec_exec **out, struct model_exec_cpu *x,
				   const struct spec_config *sc, struct comm *comm, struct err *e)
{
	*out = NULL;
	if (!sc->method)
		return ST_OK;
	struct model_spec_exec_options so = {.x = x, .cfg = *sc, .comm = comm};
	enum status st = model_spec_exec_create(out, &so, e);
	if (st && comm)
		comm_abort(comm, e->msg);
	return st;
}

static void *exec_open__rank_main(void *arg)
{
	struct exec_open_rank *r = arg;
	struct model_exec_open *t = r->x;
	struct err e = {0};
	struct comm *c = NULL;
	struct model_exec_cpu *x = NULL;
	struct model_spec_exec *sx = NULL;
	enum status st = comm_cpu_create(&c, t->group, r->rank, &e);
	if (!st) {
		struct model_exec_cpu_options xo = t->xo;
		xo.rank = r->rank;
		xo.world_size = t->world;
		xo.comm = c;
		if ((st = model_exec_cpu_create(&x, &xo, &e))) {
			char why[ERR_MSG_BYTES];
			snprintf(why, sizeof why, "rank %d cannot build its executor: %.400s", r->rank, e.msg);
			comm_abort(c, why);
		}
	}
	if (!st)
		st = comm_barrier(c, &e);
	if (!st)
		st = exec_open__agree(c, x, &e);
	if (!st)
		st = exec_open__spec(&sx, x, &t->sc, c, &e);
	if (!st)
		st = model_exec_tp_worker_run(sx ? model_spec_exec_exec(sx) : model_exec_cpu_exec(x), c, NULL, &e);
	if (st) {
		log_msg(LOG_ERROR, "tp", "rank %d: %s", r->rank, e.msg);
		if (c)
			comm_abort(c, e.msg);
	}
	model_spec_exec_destroy(sx);
	model_exec_cpu_destroy(x);
	comm_destroy(c);
	return NULL;
}

/* One node: ranks 1..world-1 are threads. */
static enum status exec_open__start_threads(struct model_exec_open *x, struct err *e)
{
	struct comm_cpu_group_options go = {.n_ranks = x->world, .timeout_ms = x->par.timeout_ms};
	enum status st = comm_cpu_group_create(&x->group, &go, e);
	if (st)
		return st;
	if ((st = comm_cpu_create(&x->comm, x->group, 0, e)))
		return st;
	for (int r = 1; r < x->world; r++) {
		x->ranks[r] = (struct exec_open_rank){.x = x, .rank = r};
		if (pthread_create(&x->ranks[r].th, NULL, exec_open__rank_main, &x->ranks[r])) {
			comm_abort(x->comm, "cannot start a rank thread");
			return err_set(e, ST_NOMEM, "tensor parallel: cannot start the thread of rank %d", r);
		}
		x->ranks[r].started = true;
	}
	log_msg(LOG_INFO, "tp", "tensor parallel: %d ranks as threads of this process (cpu comm)", x->world);
	return ST_OK;
}

/* Several nodes: bootstrap, then the TCP data channel, then the sizes. */
static enum status exec_open__join_nodes(struct model_exec_open *x, struct err *e)
{
	const struct model_exec_parallel *p = &x->par;
	struct comm_secret secret;
	enum status st = exec_open__secret(p, &secret, e);
	if (st)
		return st;
	st = comm_tcp_listen(&x->lis, p->master_addr, 0, &secret, e);
	if (st) {
		memset(&secret, 0, sizeof secret);
		return st;
	}
	uint8_t id[COMM_UNIQUE_ID_BYTES];
	comm_tcp_id_pack(x->lis, id);
	struct comm_boot_options bo = {.n_ranks = x->world, .rank = 0, .master_addr = p->master_addr,
				       .master_port = p->master_port ? p->master_port : MODEL_EXEC_DEFAULT_MASTER_PORT,
				       .version = model_dsv4_version(),
				       .checkpoint_fingerprint = exec_open__fingerprint(x->xo.ck),
				       .unique_id = id, .timeout_ms = p->timeout_ms, .secret = &secret};
	st = comm_boot_create(&x->boot, &bo, e);
	memset(&secret, 0, sizeof secret);
	if (st)
		return st;
	if ((st = comm_tcp_accept(&x->comm, x->lis, x->world, p->timeout_ms, e)))
		return st;
	comm_tcp_listener_destroy(x->lis);
	x->lis = NULL;
	uint32_t w[EXEC_OPEN_CONFIG_WORDS];
	cfg_pack(w, &x->xo, &x->sc);
	if ((st = comm_broadcast(x->comm, w, w, sizeof w, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e)))
		return st;
	if ((st = comm_boot_watch(x->boot, exec_open__on_lost, x, e)))
		return st;
	log_msg(LOG_INFO, "tp", "tensor parallel: %d nodes joined (data channel: tcp comm)", x->world);
	return ST_OK;
}

/* The executor options of opt for device dev, serving defaults applied. */
static struct model_exec_cpu_options exec_open__xo(const struct model_exec_open_options *opt,
						   const struct kern_device *dev)
{
	struct model_exec_cpu_options xo = {
		.ck = opt->ck,
		.dev = dev,
		.block_tokens = opt->block_tokens,
		.n_blocks = opt->n_blocks,
		.max_step_tokens = opt->max_step_tokens ? opt->max_step_tokens : MODEL_EXEC_DEFAULT_STEP_TOKENS,
		.max_step_seqs = opt->max_step_seqs ? opt->max_step_seqs : MODEL_EXEC_DEFAULT_STEP_SEQS,
		.max_model_len = opt->max_model_len,
		.precision = opt->precision,
		.load_mtp = opt->load_mtp,
		.gpu_memory_utilization = opt->gpu_memory_utilization,
		.disabled = opt->disabled,
		.kernel_selfcheck = opt->kernel_selfcheck,
		.enforce_eager = opt->enforce_eager,
	};
	bool gpu = dev->cc_major > 0;
	if (opt->serving && !gpu) {
		/* On the CPU the state is fp32 host memory: a modest context and
		 * room for four full-length sequences. On a GPU the KV pool is
		 * sized from gpu_memory_utilization and the context is the
		 * model's, capped by the pool (model_exec_cpu_create). */
		const struct model_config *cfg = model_checkpoint_config(opt->ck);
		uint32_t model_len = cfg->max_position_embeddings > INT32_MAX ? INT32_MAX
									      : (uint32_t)cfg->max_position_embeddings;
		uint32_t len = opt->max_model_len ? opt->max_model_len
				: model_len < (uint32_t)MODEL_EXEC_CPU_MAX_MODEL_LEN ? model_len : (uint32_t)MODEL_EXEC_CPU_MAX_MODEL_LEN;
		uint32_t per_seq = (len + 255) / 256;
		xo.max_model_len = len;
		if (!xo.n_blocks)
			xo.n_blocks = per_seq * 4 < 64 ? 64 : per_seq * 4;
	}
	return xo;
}

enum status model_exec_open(struct model_exec_open **out, const struct model_exec_open_options *opt,
			    struct err *e)
{
	*out = NULL;
	if (!opt || !opt->ck)
		return err_set(e, ST_INVALID, "executor: no checkpoint");
	int world = model_exec_parallel_world(&opt->parallel, e);
	if (!world)
		return e->st;
	if (opt->parallel.node_rank > 0)
		return err_set(e, ST_INVALID, "executor: node rank %d is a worker (model_exec_open_worker)",
			       opt->parallel.node_rank);
	struct model_exec_open *x = calloc(1, sizeof *x);
	struct exec_open_rank *ranks = calloc((size_t)world, sizeof *ranks);
	if (!x || !ranks) {
		free(x);
		free(ranks);
		return err_set(e, ST_NOMEM, "executor: out of memory");
	}
	x->ranks = ranks;
	x->world = world;
	x->par = opt->parallel;
	x->on_fail = opt->on_fail;
	x->fail_ctx = opt->fail_ctx;
	atomic_init(&x->failed, false);
	atomic_init(&x->stopping, false);
	enum status st = model_exec_device(opt->device ? opt->device : "auto", &x->dev, e);
	if (st) {
		free(ranks);
		free(x);
		return st;
	}
	x->xo = exec_open__xo(opt, &x->dev);
	/* ---- speculative decoding ---- */
	struct spec_config sc;
	if ((st = spec_config_parse(opt->speculative_config, &sc, e)) ||
	    (st = spec_config_check(&sc, model_checkpoint_config(opt->ck), e))) {
		model_exec_open_destroy(x);
		return st;
	}
	x->xo.load_mtp |= sc.method == MODEL_DRAFT_MTP || sc.method == MODEL_DRAFT_DSPARK; /* the draft model */
	x->sc = sc;
	if (world == 1) {
		if ((st = model_exec_cpu_create(&x->cpu, &x->xo, e))) {
			model_exec_open_destroy(x);
			return st;
		}
		if ((st = exec_open__spec(&x->spec, x->cpu, &sc, NULL, e))) {
			model_exec_open_destroy(x);
			return st;
		}
	} else {
		/* the ranks of one node are threads on the same device (GPU 0):
		 * they split its memory budget */
		if (x->par.nnodes <= 1)
			x->xo.device_share = world;
		st = x->par.nnodes > 1 ? exec_open__join_nodes(x, e) : exec_open__start_threads(x, e);
		if (!st) {
			struct model_exec_cpu_options xo = x->xo;
			xo.rank = 0;
			xo.world_size = world;
			xo.comm = x->comm;
			if ((st = model_exec_cpu_create(&x->cpu, &xo, e)))
				comm_abort(x->comm, "rank 0 cannot build its executor");
		}
		if (!st && (st = comm_barrier(x->comm, e)))
			err_prefix(e, "tensor parallel start-up: ");
		if (!st)
			st = exec_open__agree(x->comm, x->cpu, e);
		if (!st)
			st = exec_open__spec(&x->spec, x->cpu, &sc, x->comm, e);
		if (!st) {
			struct exec *inner = x->spec ? model_spec_exec_exec(x->spec) : model_exec_cpu_exec(x->cpu);
			struct model_exec_tp_options to = {.inner = inner, .comm = x->comm,
							   .on_fail = exec_open__on_exec_fail, .fail_ctx = x};
			st = model_exec_tp_create(&x->tp, &to, e);
		}
		if (st) {
			atomic_store(&x->stopping, true);
			if (x->comm)
				comm_abort(x->comm, "rank 0 start-up failed");
			model_exec_open_destroy(x);
			return st;
		}
	}
	/* The plan chosen at load, one line per distinct layer plan (design.md step 6). */
	kern_plan_log(model_exec_cpu_plan(x->cpu));
	x->last_ping_s = time_mono_s();
	*out = x;
	return ST_OK;
}

struct exec *model_exec_open_exec(struct model_exec_open *x)
{
	if (x->tp) /* it broadcasts, then runs the speculating executor when there is one */
		return model_exec_tp_exec(x->tp);
	return x->spec ? model_spec_exec_exec(x->spec) : model_exec_cpu_exec(x->cpu); /* ---- speculative decoding ---- */
}

struct model_exec_cpu *model_exec_open_cpu(struct model_exec_open *x) { return x->cpu; }
const struct kern_plan *model_exec_open_plan(const struct model_exec_open *x) { return model_exec_cpu_plan(x->cpu); }
const struct kern_device *model_exec_open_device(const struct model_exec_open *x) { return &x->dev; }
int model_exec_open_world(const struct model_exec_open *x) { return x->world; }
bool model_exec_open_failed(const struct model_exec_open *x) { return atomic_load(&x->failed); }

void model_exec_open_heartbeat(struct model_exec_open *x)
{
	if (!x || !x->tp || atomic_load(&x->failed))
		return;
	double now = time_mono_s();
	if (now - x->last_ping_s < EXEC_OPEN_PING_INTERVAL_S)
		return;
	x->last_ping_s = now;
	struct err e = {0};
	if (model_exec_tp_ping(x->tp, &e))
		return; /* the failure has reached on_fail */
}

void model_exec_open_destroy(struct model_exec_open *x)
{
	if (!x)
		return;
	atomic_store(&x->stopping, true);
	model_exec_tp_destroy(x->tp); /* SHUTDOWN to the other ranks while the group is healthy */
	if (atomic_load(&x->failed) && x->comm)
		comm_abort(x->comm, "rank 0 is exiting");
	for (int r = 1; r < x->world; r++)
		if (x->ranks[r].started)
			pthread_join(x->ranks[r].th, NULL);
	model_spec_exec_destroy(x->spec); /* ---- speculative decoding ---- */
	model_exec_cpu_destroy(x->cpu);
	comm_boot_destroy(x->boot); /* goodbye to the worker nodes */
	comm_destroy(x->comm);
	comm_cpu_group_destroy(x->group);
	comm_tcp_listener_destroy(x->lis);
	free(x->ranks);
	free(x);
}

/* ---- Worker processes ---- */

struct exec_open_worker {
	struct comm_boot *boot;
	struct comm *comm;
	const sigset_t *sigs;
	atomic_bool stop;
	atomic_bool signalled;
};

static void exec_open__worker_lost(void *ctx, enum status st, const char *msg)
{
	(void)st;
	struct exec_open_worker *w = ctx;
	comm_abort(w->comm, msg);
}

static void *exec_open__sig_main(void *arg)
{
	struct exec_open_worker *w = arg;
	while (!atomic_load(&w->stop)) {
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
		int sig = sigtimedwait(w->sigs, NULL, &ts);
		if (sig == SIGTERM || sig == SIGINT) {
			log_msg(LOG_INFO, "tp", "%s: leaving the group", sig == SIGTERM ? "SIGTERM" : "SIGINT");
			atomic_store(&w->signalled, true);
			comm_boot_leave(w->boot, sig == SIGTERM ? "worker stopped by SIGTERM" : "worker stopped by SIGINT");
			comm_abort(w->comm, "worker stopped by a signal");
			break;
		}
	}
	return NULL;
}

enum status model_exec_open_worker(const struct model_exec_open_options *opt, const sigset_t *sigs,
				   bool *signalled, uint64_t *n_steps, struct err *e)
{
	if (signalled)
		*signalled = false;
	if (n_steps)
		*n_steps = 0;
	if (!opt || !opt->ck)
		return err_set(e, ST_INVALID, "executor: no checkpoint");
	const struct model_exec_parallel *p = &opt->parallel;
	int world = model_exec_parallel_world(p, e);
	if (!world)
		return e->st;
	if (p->nnodes <= 1 || p->node_rank < 1)
		return err_set(e, ST_INVALID, "executor: a worker process needs --nnodes > 1 and --node-rank > 0");
	struct exec_open_worker w = {.sigs = sigs};
	atomic_init(&w.stop, false);
	atomic_init(&w.signalled, false);
	struct model_exec_cpu *x = NULL;
	struct model_spec_exec *sx = NULL;
	struct spec_config sc = {0};
	pthread_t sig_th;
	bool sig_started = false;
	uint64_t steps = 0;
	struct kern_device dev;
	struct comm_boot_options bo = {.n_ranks = world, .rank = p->node_rank, .master_addr = p->master_addr,
				       .master_port = p->master_port ? p->master_port : MODEL_EXEC_DEFAULT_MASTER_PORT,
				       .version = model_dsv4_version(),
				       .checkpoint_fingerprint = exec_open__fingerprint(opt->ck),
				       .timeout_ms = p->timeout_ms};
	enum status st = model_exec_device(opt->device ? opt->device : "auto", &dev, e);
	struct comm_secret secret;
	memset(&secret, 0, sizeof secret);
	if (!st)
		st = exec_open__secret(p, &secret, e);
	bo.secret = &secret;
	if (!st)
		st = comm_boot_create(&w.boot, &bo, e);
	int port = 0;
	uint64_t nonce = 0;
	if (!st)
		st = comm_tcp_id_unpack(comm_boot_unique_id(w.boot), &port, &nonce, e);
	if (!st)
		st = comm_tcp_connect(&w.comm, p->master_addr, port, nonce, &secret, p->node_rank, world, p->timeout_ms,
				      e);
	memset(&secret, 0, sizeof secret);
	struct model_exec_cpu_options xo = {.ck = opt->ck, .dev = &dev, .rank = p->node_rank, .world_size = world,
					    .disabled = opt->disabled, .kernel_selfcheck = opt->kernel_selfcheck,
					    .gpu_memory_utilization = opt->gpu_memory_utilization,
					    .enforce_eager = opt->enforce_eager};
	uint32_t cfg[EXEC_OPEN_CONFIG_WORDS];
	if (!st)
		st = comm_broadcast(w.comm, NULL, cfg, sizeof cfg, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e);
	if (!st)
		st = cfg_unpack(cfg, &xo, &sc, e);
	if (!st)
		st = comm_boot_watch(w.boot, exec_open__worker_lost, &w, e);
	if (!st) {
		sig_started = sigs && pthread_create(&sig_th, NULL, exec_open__sig_main, &w) == 0;
		xo.comm = w.comm;
		if ((st = model_exec_cpu_create(&x, &xo, e))) {
			char why[ERR_MSG_BYTES];
			snprintf(why, sizeof why, "rank %d cannot build its executor: %.400s", p->node_rank, e->msg);
			comm_abort(w.comm, why);
			comm_boot_leave(w.boot, why);
		}
	}
	if (!st)
		st = comm_barrier(w.comm, e);
	if (!st)
		st = exec_open__agree(w.comm, x, e);
	if (!st)
		st = exec_open__spec(&sx, x, &sc, w.comm, e);
	if (!st) {
		log_msg(LOG_INFO, "tp", "worker rank %d of %d: running rank 0's step plans", p->node_rank, world);
		st = model_exec_tp_worker_run(sx ? model_spec_exec_exec(sx) : model_exec_cpu_exec(x), w.comm, &steps, e);
	}
	atomic_store(&w.stop, true);
	if (sig_started)
		pthread_join(sig_th, NULL);
	bool sig = atomic_load(&w.signalled);
	if (!st || sig)
		log_msg(LOG_INFO, "tp", "worker rank %d: stopped after %llu steps", p->node_rank,
			(unsigned long long)steps);
	if (st && !sig && w.boot)
		comm_boot_leave(w.boot, e->msg);
	model_spec_exec_destroy(sx);
	model_exec_cpu_destroy(x);
	comm_boot_destroy(w.boot);
	comm_destroy(w.comm);
	if (signalled)
		*signalled = sig;
	if (n_steps)
		*n_steps = steps;
	if (sig) {
		err_clear(e);
		return ST_OK;
	}
	return st;
}
