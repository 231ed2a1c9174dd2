/*
 * server/tp_serve.c: tensor-parallel serving (server/tp_serve.h): the
 * --nnodes/--node-rank/--master-addr/--master-port/--tp-timeout flags, the
 * group set-up on rank 0 (worker threads on one node, or the bootstrap and
 * the TCP data channel across nodes), the worker process's main, and how a
 * failed group turns into 503 and a non-zero exit.
 *
 * Start-up order, the same on every rank so that a failure anywhere is an
 * error everywhere: join the group (bootstrap + data channel, or the cpu
 * group), agree on the executor sizes (rank 0 broadcasts them), create the
 * executor, meet at a barrier. A rank whose executor cannot be built aborts
 * the group with its reason, so rank 0's barrier fails with that message.
 */
#include "server/tp_serve.h"

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
#include "model/exec_tp.h"
#include "server/cli.h"
#include "server/engine.h"

const char *model_dsv4_version(void); /* model/model_version.c */

/* After a group failure rank 0 keeps answering 503 at least this long (so a
 * load balancer or a test can see it) and waits at most TP_FAIL_DRAIN_S for
 * the requests in flight to end before it exits. */
#define TP_FAIL_LINGER_S 1.0
#define TP_FAIL_DRAIN_S 5.0
/* Idle pings: at most one per this interval (the heartbeat comes about once
 * a second when idle, and after every step). */
#define TP_PING_INTERVAL_S 0.5
#define TP_DEFAULT_MASTER_PORT 29555
#define TP_CONFIG_MAGIC 0x47464354u /* "TCFG" */
#define TP_CONFIG_WORDS 8

/* ---- Flags ---- */

static int tp_bad(const char *flag, const char *v, const char *want)
{
	fprintf(stderr, "dsv4 serve: %s '%s': expected %s\n(try 'dsv4 serve --help')\n", flag, v ? v : "", want);
	return CLI_EXIT_USAGE;
}

static bool tp_long(const char *s, long lo, long hi, long *out)
{
	char *end = NULL;
	errno = 0;
	long v = s ? strtol(s, &end, 10) : 0;
	if (!s || errno || !s[0] || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

int tp_args_extract(int *argc, char **argv, struct tp_args *a)
{
	*a = (struct tp_args){.nnodes = 1, .master_port = TP_DEFAULT_MASTER_PORT};
	static const char *names[] = {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--tp-timeout",
				      "--precision", "--tp-secret-file"};
	int out = 1;
	for (int i = 1; i < *argc; i++) {
		const char *arg = argv[i];
		int which = -1;
		const char *v = NULL;
		for (int k = 0; k < (int)(sizeof names / sizeof names[0]) && which < 0; k++) {
			size_t n = strlen(names[k]);
			if (!strncmp(arg, names[k], n) && (arg[n] == '\0' || arg[n] == '=')) {
				which = k;
				v = arg[n] == '=' ? arg + n + 1 : NULL;
			}
		}
		if (!strcmp(arg, "--")) {
			which = -1;
		}
		if (which < 0) {
			argv[out++] = argv[i];
			continue;
		}
		if (!v) {
			if (i + 1 >= *argc) {
				fprintf(stderr, "dsv4 serve: option '%s' needs a value\n(try 'dsv4 serve --help')\n", arg);
				return CLI_EXIT_USAGE;
			}
			v = argv[++i];
		}
		long l;
		switch (which) {
		case 0:
			if (!tp_long(v, 1, 64, &l))
				return tp_bad("--nnodes", v, "an integer in 1..64");
			a->nnodes = (int)l;
			break;
		case 1:
			if (!tp_long(v, 0, 63, &l))
				return tp_bad("--node-rank", v, "an integer in 0..63");
			a->node_rank = (int)l;
			break;
		case 2:
			if (!v[0])
				return tp_bad("--master-addr", v, "a host name or address");
			a->master_addr = v;
			break;
		case 3:
			if (!tp_long(v, 1, 65535, &l))
				return tp_bad("--master-port", v, "an integer in 1..65535");
			a->master_port = (int)l;
			break;
		case 4: {
			char *end = NULL;
			errno = 0;
			double s = strtod(v, &end);
			if (errno || !v[0] || *end || !(s >= 0.1 && s <= 86400))
				return tp_bad("--tp-timeout", v, "seconds in 0.1..86400");
			a->timeout_ms = (int)(s * 1000.0);
			break;
		}
		case 5:
			if (strcmp(v, "reference") && strcmp(v, "fp32"))
				return tp_bad("--precision", v, "'reference' or 'fp32'");
			a->precision = strcmp(v, "fp32") ? MODEL_PREC_REFERENCE : MODEL_PREC_FP32;
			break;
		case 6:
			if (!v[0])
				return tp_bad("--tp-secret-file", v, "a file name");
			a->secret_file = v;
			break;
		}
	}
	argv[out] = NULL;
	*argc = out;
	return 0;
}

const char *tp_args_usage(void)
{
	return "tensor parallel (docs/two-gb10.md):\n"
	       "  --nnodes N                   nodes (processes) in the group, one rank each (default 1)\n"
	       "  --node-rank R                this node's rank: 0 serves HTTP, 1..N-1 are workers (default 0)\n"
	       "  --master-addr HOST           rank 0's address (workers: required; rank 0: address to listen on)\n"
	       "  --master-port P              rank 0's bootstrap TCP port (default 29555)\n"
	       "  --tp-timeout S               seconds to wait for the other ranks, at start-up and in every\n"
	       "                               collective (default 120)\n"
	       "  --tp-secret-file FILE        the group's shared secret (>= 16 bytes; required with --nnodes > 1):\n"
	       "                               authenticates every link; rank 0 creates it (mode 0600) if absent,\n"
	       "                               copy it to every worker node\n"
	       "  --precision reference|fp32   cpu executor numerics (default reference; fp32: TP=N equals TP=1\n"
	       "                               up to fp32 summation order)\n";
}

int tp_args_world(const struct tp_args *a, long tp, bool test_executor)
{
	int world = (int)tp;
	if (a->nnodes > 1) {
		if (tp != 1 && tp != a->nnodes) {
			fprintf(stderr, "dsv4 serve: --tensor-parallel-size %ld with --nnodes %d: one rank per node, so "
					"the tensor-parallel size is the number of nodes (leave it out or pass %d)\n",
				tp, a->nnodes, a->nnodes);
			return -1;
		}
		world = a->nnodes;
		if (a->node_rank >= a->nnodes) {
			fprintf(stderr, "dsv4 serve: --node-rank %d out of range for --nnodes %d (0..%d)\n", a->node_rank,
				a->nnodes, a->nnodes - 1);
			return -1;
		}
		if (!a->secret_file) {
			fprintf(stderr, "dsv4 serve: --nnodes %d needs --tp-secret-file FILE (the group's shared secret; "
					"rank 0 creates it when absent, copy it to every node): without it anyone who "
					"reaches the master port can join the group\n", a->nnodes);
			return -1;
		}
		if (a->node_rank > 0 && !a->master_addr) {
			fprintf(stderr, "dsv4 serve: --node-rank %d needs --master-addr (rank 0's address)\n", a->node_rank);
			return -1;
		}
	} else if (a->node_rank != 0) {
		fprintf(stderr, "dsv4 serve: --node-rank %d needs --nnodes > 1\n", a->node_rank);
		return -1;
	}
	if (world > 1 && test_executor) {
		fprintf(stderr, "dsv4 serve: tensor parallelism runs the cpu executor; --executor test has no ranks\n");
		return -1;
	}
	return world;
}

/* ---- The fingerprint the ranks compare ---- */

/* model_checkpoint_fingerprint() covers config.json, the index and the
 * shard headers, not tensor data: two checkpoints of the same shapes with
 * different weights (another seed, another fine-tune) have the same value.
 * The group also compares a sample of every shard's bytes, TP_SAMPLE_BYTES
 * at its start, middle and end: a few hundred KiB per checkpoint, read once
 * at start-up, and different weights almost surely differ there. */
#define TP_SAMPLE_BYTES (64u << 10)

static uint64_t tp__fnv(uint64_t h, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static uint64_t tp__fingerprint(const struct model_checkpoint *ck)
{
	uint64_t h = model_checkpoint_fingerprint(ck);
	uint8_t *buf = malloc(TP_SAMPLE_BYTES);
	if (!buf)
		return h;
	for (int s = 0; s < model_checkpoint_n_shards(ck); s++) {
		uint64_t size = model_checkpoint_shard_bytes(ck, s);
		int fd = open(model_checkpoint_shard_path(ck, s), O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			h = tp__fnv(h, (const uint8_t *)"?", 1);
			continue;
		}
		uint64_t at[3] = {0, size / 2, size > TP_SAMPLE_BYTES ? size - TP_SAMPLE_BYTES : 0};
		for (int k = 0; k < 3; k++) {
			ssize_t r = pread(fd, buf, TP_SAMPLE_BYTES, (off_t)at[k]);
			if (r > 0)
				h = tp__fnv(h, buf, (size_t)r);
		}
		close(fd);
	}
	free(buf);
	return h;
}

/* ---- Executor sizes, rank 0 -> workers ---- */

static void cfg_pack(uint32_t w[TP_CONFIG_WORDS], const struct model_exec_cpu_options *xo)
{
	w[0] = TP_CONFIG_MAGIC;
	w[1] = xo->block_tokens;
	w[2] = xo->n_blocks;
	w[3] = xo->max_step_tokens;
	w[4] = xo->max_step_seqs;
	w[5] = xo->max_model_len;
	w[6] = (uint32_t)xo->precision;
	w[7] = xo->load_mtp;
}

static enum status cfg_unpack(const uint32_t w[TP_CONFIG_WORDS], struct model_exec_cpu_options *xo, struct err *e)
{
	if (w[0] != TP_CONFIG_MAGIC)
		return err_set(e, ST_INVALID, "tensor parallel: rank 0 sent no executor configuration");
	xo->block_tokens = w[1];
	xo->n_blocks = w[2];
	xo->max_step_tokens = w[3];
	xo->max_step_seqs = w[4];
	xo->max_model_len = w[5];
	xo->precision = (enum model_precision)w[6];
	xo->load_mtp = w[7] != 0;
	return ST_OK;
}

/* ---- Rank 0 ---- */

struct tp_rank {
	struct tp_serve *t;
	int rank;
	pthread_t th;
	bool started;
};

struct tp_serve {
	struct model_exec_cpu_options xo;
	int world;
	struct tp_args args;
	void (*on_fail)(void *ctx, const char *msg);
	void *fail_ctx;
	struct comm_cpu_group *group;
	struct tp_rank *ranks; /* [world]; threads 1..world-1 on one node */
	struct comm_boot *boot;
	struct comm_tcp_listener *lis;
	struct comm *comm; /* rank 0's */
	struct model_exec_cpu *cpu;
	struct model_exec_tp *tp;
	atomic_bool failed;
	atomic_bool stopping;
	double last_ping_s;
};

static void tp__fail(struct tp_serve *t, const char *msg)
{
	if (atomic_exchange(&t->failed, true))
		return;
	if (atomic_load(&t->stopping)) {
		log_msg(LOG_INFO, "tp", "during shutdown: %s", msg);
		return;
	}
	log_msg(LOG_ERROR, "tp", "tensor parallel group failed: %s", msg);
	if (t->on_fail)
		t->on_fail(t->fail_ctx, msg);
}

static void tp__on_exec_fail(void *ctx, const char *msg) { tp__fail(ctx, msg); }

static void tp__on_lost(void *ctx, enum status st, const char *msg)
{
	(void)st;
	struct tp_serve *t = ctx;
	if (t->comm)
		comm_abort(t->comm, msg);
	tp__fail(t, msg);
}

static void *tp__rank_main(void *arg)
{
	struct tp_rank *r = arg;
	struct tp_serve *t = r->t;
	struct err e = {0};
	struct comm *c = NULL;
	struct model_exec_cpu *x = NULL;
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
		st = model_exec_tp_worker_run(model_exec_cpu_exec(x), c, NULL, &e);
	if (st) {
		log_msg(LOG_ERROR, "tp", "rank %d: %s", r->rank, e.msg);
		if (c)
			comm_abort(c, e.msg);
	}
	model_exec_cpu_destroy(x);
	comm_destroy(c);
	return NULL;
}

/* One node: ranks 1..world-1 are threads. */
static enum status tp__start_threads(struct tp_serve *t, struct err *e)
{
	struct comm_cpu_group_options go = {.n_ranks = t->world, .timeout_ms = t->args.timeout_ms};
	enum status st = comm_cpu_group_create(&t->group, &go, e);
	if (st)
		return st;
	if ((st = comm_cpu_create(&t->comm, t->group, 0, e)))
		return st;
	for (int r = 1; r < t->world; r++) {
		t->ranks[r] = (struct tp_rank){.t = t, .rank = r};
		if (pthread_create(&t->ranks[r].th, NULL, tp__rank_main, &t->ranks[r])) {
			comm_abort(t->comm, "cannot start a rank thread");
			return err_set(e, ST_NOMEM, "tensor parallel: cannot start the thread of rank %d", r);
		}
		t->ranks[r].started = true;
	}
	log_msg(LOG_INFO, "tp", "tensor parallel: %d ranks as threads of this process (cpu comm)", t->world);
	return ST_OK;
}

/* The group secret from --tp-secret-file; rank 0 creates the file when it
 * does not exist. */
static enum status tp__secret(const struct tp_args *a, struct comm_secret *s, struct err *e)
{
	if (!a->secret_file)
		return err_set(e, ST_INVALID, "tensor parallel: --nnodes %d needs --tp-secret-file", a->nnodes);
	if (a->node_rank == 0 && access(a->secret_file, F_OK) != 0) {
		enum status st = comm_secret_create_file(a->secret_file, e);
		if (st)
			return st;
		log_msg(LOG_INFO, "tp", "created the group secret %s (mode 0600): copy it to every worker node", a->secret_file);
	}
	return comm_secret_load(s, a->secret_file, e);
}

/* Several nodes: bootstrap, then the TCP data channel, then the sizes. */
static enum status tp__join_nodes(struct tp_serve *t, struct err *e)
{
	const struct tp_args *a = &t->args;
	struct comm_secret secret;
	enum status st = tp__secret(a, &secret, e);
	if (st)
		return st;
	st = comm_tcp_listen(&t->lis, a->master_addr, 0, &secret, e);
	if (st)
		return st;
	uint8_t id[COMM_UNIQUE_ID_BYTES];
	comm_tcp_id_pack(t->lis, id);
	struct comm_boot_options bo = {.n_ranks = t->world, .rank = 0, .master_addr = a->master_addr,
				       .master_port = a->master_port, .version = model_dsv4_version(),
				       .checkpoint_fingerprint = tp__fingerprint(t->xo.ck),
				       .unique_id = id, .timeout_ms = a->timeout_ms, .secret = &secret};
	st = comm_boot_create(&t->boot, &bo, e);
	memset(&secret, 0, sizeof secret);
	if (st)
		return st;
	if ((st = comm_tcp_accept(&t->comm, t->lis, t->world, a->timeout_ms, e)))
		return st;
	comm_tcp_listener_destroy(t->lis);
	t->lis = NULL;
	uint32_t w[TP_CONFIG_WORDS];
	cfg_pack(w, &t->xo);
	if ((st = comm_broadcast(t->comm, w, w, sizeof w, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, e)))
		return st;
	if ((st = comm_boot_watch(t->boot, tp__on_lost, t, e)))
		return st;
	log_msg(LOG_INFO, "tp", "tensor parallel: %d nodes joined (data channel: tcp comm)", t->world);
	return ST_OK;
}

enum status tp_serve_create(struct tp_serve **out, const struct tp_serve_options *opt, struct err *e)
{
	*out = NULL;
	if (!opt || !opt->xo || !opt->xo->ck || opt->world_size < 2)
		return err_set(e, ST_INVALID, "tensor parallel: needs a checkpoint and a world size > 1");
	struct tp_serve *t = calloc(1, sizeof *t);
	struct tp_rank *ranks = calloc((size_t)opt->world_size, sizeof *ranks);
	if (!t || !ranks) {
		free(t);
		free(ranks);
		return err_set(e, ST_NOMEM, "tensor parallel: out of memory");
	}
	t->ranks = ranks;
	t->xo = *opt->xo;
	/* the ranks of one node are threads on the same device (GPU 0 today):
	 * they split its memory budget */
	if (opt->args.nnodes <= 1)
		t->xo.device_share = opt->world_size;
	t->world = opt->world_size;
	t->args = opt->args;
	t->on_fail = opt->on_fail;
	t->fail_ctx = opt->fail_ctx;
	atomic_init(&t->failed, false);
	atomic_init(&t->stopping, false);
	enum status st = t->args.nnodes > 1 ? tp__join_nodes(t, e) : tp__start_threads(t, e);
	if (!st) {
		struct model_exec_cpu_options xo = t->xo;
		xo.rank = 0;
		xo.world_size = t->world;
		xo.comm = t->comm;
		if ((st = model_exec_cpu_create(&t->cpu, &xo, e)))
			comm_abort(t->comm, "rank 0 cannot build its executor");
	}
	if (!st && (st = comm_barrier(t->comm, e)))
		err_prefix(e, "tensor parallel start-up: ");
	if (!st) {
		struct model_exec_tp_options to = {.inner = model_exec_cpu_exec(t->cpu), .comm = t->comm,
						   .on_fail = tp__on_exec_fail, .fail_ctx = t};
		st = model_exec_tp_create(&t->tp, &to, e);
	}
	if (st) {
		atomic_store(&t->stopping, true);
		if (t->comm)
			comm_abort(t->comm, "rank 0 start-up failed");
		tp_serve_destroy(t);
		return st;
	}
	t->last_ping_s = time_mono_s();
	*out = t;
	return ST_OK;
}

struct exec *tp_serve_exec(struct tp_serve *t) { return model_exec_tp_exec(t->tp); }
const struct kern_plan *tp_serve_plan(const struct tp_serve *t) { return model_exec_cpu_plan(t->cpu); }
bool tp_serve_failed(const struct tp_serve *t) { return atomic_load(&t->failed); }

void tp_serve_heartbeat(struct tp_serve *t)
{
	if (!t || atomic_load(&t->failed))
		return;
	double now = time_mono_s();
	if (now - t->last_ping_s < TP_PING_INTERVAL_S)
		return;
	t->last_ping_s = now;
	struct err e = {0};
	if (model_exec_tp_ping(t->tp, &e))
		return; /* the failure has reached on_fail */
}

void tp_serve_fail_engine(struct tp_serve *t, struct engine *en)
{
	(void)t;
	log_msg(LOG_ERROR, "serve", "tensor parallel group failed: /health answers 503; ending the requests in "
				    "flight and exiting non-zero");
	engine_set_failed(en);
	engine_abort_all(en);
	double t0 = time_mono_s();
	for (;;) {
		double dt = time_mono_s() - t0;
		if (dt >= TP_FAIL_DRAIN_S || (dt >= TP_FAIL_LINGER_S && engine_idle(en)))
			break;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}

void tp_serve_destroy(struct tp_serve *t)
{
	if (!t)
		return;
	atomic_store(&t->stopping, true);
	model_exec_tp_destroy(t->tp); /* SHUTDOWN to the workers while the group is healthy */
	if (atomic_load(&t->failed) && t->comm)
		comm_abort(t->comm, "rank 0 is exiting");
	for (int r = 1; r < t->world; r++)
		if (t->ranks[r].started)
			pthread_join(t->ranks[r].th, NULL);
	model_exec_cpu_destroy(t->cpu);
	comm_boot_destroy(t->boot); /* goodbye to the worker nodes */
	comm_destroy(t->comm);
	comm_cpu_group_destroy(t->group);
	comm_tcp_listener_destroy(t->lis);
	free(t->ranks);
	free(t);
}

/* ---- Worker nodes ---- */

struct tp_worker {
	struct comm_boot *boot;
	struct comm *comm;
	const sigset_t *sigs;
	atomic_bool stop;
	atomic_bool signalled;
};

static void tp__worker_lost(void *ctx, enum status st, const char *msg)
{
	(void)st;
	struct tp_worker *w = ctx;
	comm_abort(w->comm, msg);
}

static void *tp__sig_main(void *arg)
{
	struct tp_worker *w = arg;
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

int tp_serve_worker(const struct tp_args *a, const struct model_checkpoint *ck, const sigset_t *sigs)
{
	struct err e = {0};
	struct tp_worker w = {.sigs = sigs};
	atomic_init(&w.stop, false);
	atomic_init(&w.signalled, false);
	struct model_exec_cpu *x = NULL;
	pthread_t sig_th;
	bool sig_started = false;
	uint64_t n_steps = 0;
	struct comm_boot_options bo = {.n_ranks = a->nnodes, .rank = a->node_rank, .master_addr = a->master_addr,
				       .master_port = a->master_port, .version = model_dsv4_version(),
				       .checkpoint_fingerprint = tp__fingerprint(ck),
				       .timeout_ms = a->timeout_ms};
	struct comm_secret secret;
	enum status st = tp__secret(a, &secret, &e);
	bo.secret = &secret;
	if (!st)
		st = comm_boot_create(&w.boot, &bo, &e);
	int port = 0;
	uint64_t nonce = 0;
	if (!st)
		st = comm_tcp_id_unpack(comm_boot_unique_id(w.boot), &port, &nonce, &e);
	if (!st)
		st = comm_tcp_connect(&w.comm, a->master_addr, port, nonce, &secret, a->node_rank, a->nnodes,
				      a->timeout_ms, &e);
	memset(&secret, 0, sizeof secret);
	struct model_exec_cpu_options xo = {.ck = ck, .rank = a->node_rank, .world_size = a->nnodes};
	uint32_t cfg[TP_CONFIG_WORDS];
	if (!st)
		st = comm_broadcast(w.comm, NULL, cfg, sizeof cfg, COMM_DTYPE_BYTES, 0, COMM_MEM_HOST, &e);
	if (!st)
		st = cfg_unpack(cfg, &xo, &e);
	if (!st)
		st = comm_boot_watch(w.boot, tp__worker_lost, &w, &e);
	if (!st) {
		sig_started = pthread_create(&sig_th, NULL, tp__sig_main, &w) == 0;
		xo.comm = w.comm;
		if ((st = model_exec_cpu_create(&x, &xo, &e))) {
			char why[ERR_MSG_BYTES];
			snprintf(why, sizeof why, "rank %d cannot build its executor: %.400s", a->node_rank, e.msg);
			comm_abort(w.comm, why);
			comm_boot_leave(w.boot, why);
		}
	}
	if (!st)
		st = comm_barrier(w.comm, &e);
	if (!st) {
		log_msg(LOG_INFO, "tp", "worker rank %d of %d: running rank 0's step plans", a->node_rank, a->nnodes);
		st = model_exec_tp_worker_run(model_exec_cpu_exec(x), w.comm, &n_steps, &e);
	}
	atomic_store(&w.stop, true);
	if (sig_started)
		pthread_join(sig_th, NULL);
	bool signalled = atomic_load(&w.signalled);
	if (st && !signalled)
		fprintf(stderr, "dsv4 serve: worker rank %d: %s\n", a->node_rank, e.msg);
	else
		log_msg(LOG_INFO, "tp", "worker rank %d: stopped after %llu steps", a->node_rank,
			(unsigned long long)n_steps);
	if (st && !signalled && w.boot)
		comm_boot_leave(w.boot, e.msg);
	model_exec_cpu_destroy(x);
	comm_boot_destroy(w.boot);
	comm_destroy(w.comm);
	return st && !signalled ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
