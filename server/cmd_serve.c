/*
 * server/cmd_serve.c: `dsv4 serve MODEL_DIR` (or --model), the
 * OpenAI-compatible server, with vLLM's flag names where they exist: a vLLM
 * command line starts it unchanged (flags that mean nothing here are
 * accepted with one log line saying why; a value that cannot be honoured is
 * an error naming the flag).
 *
 * The main thread owns process life: it parses flags (exit 2 on a bad one),
 * binds the port (a busy port fails before anything loads), resolves the
 * model (`tiny` builds and caches the tiny checkpoint), opens the executor
 * (model/exec_open.h: device, plan, tensor-parallel group), starts the
 * engine, tells systemd READY=1 once the port is open, and then
 * waits for signals. WATCHDOG=1 is sent at half of $WATCHDOG_USEC, but only
 * while the scheduler's step loop shows a recent heartbeat, so a hung loop
 * lets systemd restart us. SIGTERM / SIGINT: STOPPING=1, stop admitting,
 * drain in-flight requests for up to --shutdown-timeout seconds, abort what
 * is left, exit 0. A second signal cuts the drain short.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "common/log.h"
#include "common/timeutil.h"
#include "kernels/registry/registry.h"
#include "model/checkpoint.h"
#include "model/exec_open.h"
#include "model/exec_test.h"
#include "scheduler/limits.h"
#include "server/load_args.h"
#include "server/engine.h"
#include "server/flags.h"
#include "server/http.h"
#include "server/notify.h"
#include "server/serve_guard.h" /* ---- hardening ---- */


struct serve_args {
	const char *model;
	const char *host;
	int port;
	const char *served_model_name;
	const char *api_key;
	long max_model_len, max_num_seqs, max_num_batched_tokens, max_queued;
	double gpu_memory_utilization;
	double shutdown_timeout_s;
	const char *executor;
	long num_blocks;
	bool priority;
	long http_threads;
	const char *disable_kernels; /* --disable-kernel a,b (with $DSV4_DISABLED_KERNELS) */
	bool kernel_selfcheck;
	long max_logprobs;           /* --max-logprobs (evaluation) */
	long responses_store_bytes;  /* --responses-store-bytes (agents) */
	/* ---- cli: vLLM's common flags ---- */
	bool disable_prefix_caching; /* --no-enable-prefix-caching */
	bool disable_log_requests;   /* --disable-log-requests: read by the access log (server/api) */
	double log_stats_interval_s; /* --log-stats-interval S (0: the engine's default); --disable-log-stats: -1 */
	bool enforce_eager;          /* --enforce-eager: no CUDA graphs (model_exec_open_options) */
	bool gpu_memory_utilization_set;
	const char *notes[24];       /* one log line each, after the log is up: flags accepted with no effect */
	int n_notes;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: dsv4 serve MODEL_DIR|tiny [options]     (or --model MODEL_DIR|tiny)\n"
		"\n"
		"Serve the OpenAI-compatible API (docs/api.md) for the checkpoint in MODEL_DIR, on the GPU\n"
		"when one is usable, else on the CPU (--device). 'tiny' builds the tiny random checkpoint\n"
		"once (scripts/make_tiny_model), caches it and serves it. A vLLM command line works as is:\n"
		"its flags below either act as in vLLM or are accepted with one log line saying why they\n"
		"change nothing here; a value dsv4 cannot honour is an error naming the flag.\n"
		"\n"
		"options (vLLM's names):\n"
		"  --model DIR                  checkpoint directory (config.json, shards, tokenizer.json), or 'tiny'\n"
		"  --host HOST                  address or name to listen on, IPv4 or IPv6 (default 127.0.0.1);\n"
		"                               the port is bound before the weights load\n"
		"  --port N                     TCP port (default 8000; 0 = any free port)\n"
		"  --served-model-name NAME     model id clients must send (default: the directory name)\n"
		"  --api-key KEY                require 'Authorization: Bearer KEY' on /v1 (or $DSV4_API_KEY,\n"
		"                               else vLLM's $VLLM_API_KEY)\n"
		"  --max-model-len N            context length, prompt + output tokens (default: GPU: the model's,\n"
		"                               capped by the KV cache; CPU: min(the model's, %d))\n"
		"  --max-num-seqs N             sequences per step (default %d)\n"
		"  --max-num-batched-tokens N   tokens per step (default %d)\n"
		"  --max-num-queued-reqs N      waiting requests before 429 (default %d)\n"
		"  --gpu-memory-utilization F   GPU: fraction of the GPU's total memory this process may use for\n"
		"                               weights, activations and the KV cache, (0, 1] (default 0.9); the\n"
		"                               KV cache gets what is left. CPU: no effect (the KV cache holds\n"
		"                               4 sequences of --max-model-len, or --num-gpu-blocks-override)\n"
		"  --scheduling-policy P        fcfs (default) or priority (lower \"priority\" runs first)\n"
		"  --shutdown-timeout S         seconds to drain requests on SIGTERM (default 30)\n"
		"  --executor model|test        model: the forward pass on --device (default; 'cpu' is accepted\n"
		"                               for it); test: the deterministic test executor (no weights\n"
		"                               read; for API tests)\n"
		"  --num-gpu-blocks-override N  KV blocks to allocate (default: GPU: from --gpu-memory-utilization;\n"
		"                               CPU: 4 sequences of max-model-len, at least 64)\n"
		"  --enable-prefix-caching      reuse the KV blocks of a shared prompt prefix (default: on)\n"
		"  --no-enable-prefix-caching   compute every prompt token\n"
		"  --enforce-eager              never use CUDA graphs (steps run eagerly)\n"
		"  --disable-log-requests       no per-request line in the log (--enable-log-requests: the default)\n"
		"  --log-stats-interval S       seconds between the periodic stats lines (default 10, or\n"
		"                               $DSV4_LOG_STATS_INTERVAL); --disable-log-stats: none\n"
		"  --http-threads N             HTTP worker threads (default 8)\n"
		"  --disable-kernel A,B         remove kernel variants from selection (also $DSV4_DISABLED_KERNELS)\n"
		"  --kernel-selfcheck           check each chosen kernel against the CPU reference at load\n"
		"  --max-logprobs N             most logprobs / top_logprobs / prompt_logprobs a request may ask\n"
		"                               for, 1..20 (default 20)\n"
		"  --responses-store-bytes N    memory for stored /v1/responses answers, oldest out first;\n"
		"                               lost on restart (default 64 MiB)\n"
		"  -h, --help                   this text\n"
		"vLLM flags accepted with no effect (one log line each says why):\n"
		"  --trust-remote-code, --enable-auto-tool-choice, --enable-expert-parallel,\n"
		"  --dtype auto|bfloat16, --kv-cache-dtype auto|fp8|fp8_e4m3|fp8_ds_mla,\n"
		"  --tool-call-parser deepseek_v4|deepseekv4, --reasoning-parser deepseek_v4|deepseekv4|deepseek_r1,\n"
		"  --tokenizer-mode auto|deepseek_v4|hf, --uvicorn-log-level LEVEL, --swap-space GiB,\n"
		"  --pipeline-parallel-size 1 (-pp), --data-parallel-size 1 (-dp)\n",
		MODEL_EXEC_CPU_MAX_MODEL_LEN, MODEL_EXEC_DEFAULT_STEP_SEQS, MODEL_EXEC_DEFAULT_STEP_TOKENS,
		SCHED_DEFAULT_MAX_QUEUED_REQUESTS);
	fputs(load_args_exec_usage(), f); /* --device, --precision, tensor parallel */
	fputs(load_args_usage(), f); /* dummy-load */
	fputs(serve_guard_usage(), f); /* ---- hardening ---- */
}

static int bad(const char *fmt, const char *a)
{
	fprintf(stderr, "dsv4 serve: ");
	fprintf(stderr, fmt, a);
	fprintf(stderr, "\n(try 'dsv4 serve --help')\n");
	return CLI_EXIT_USAGE;
}

enum {
	O_HOST = 256, O_PORT, O_NAME, O_KEY, O_MAXLEN, O_SEQS, O_BATCHED, O_QUEUED, O_GPU, O_SHUTDOWN,
	O_EXECUTOR, O_THREADS, O_BLOCKS, O_POLICY, O_DISABLE_KERNEL, O_SELFCHECK,
	O_MAX_LOGPROBS,
	O_RESP_STORE,
	/* ---- cli: vLLM's common flags ---- */
	O_TRUST, O_DTYPE, O_AUTO_TOOL, O_TOOL_PARSER, O_REASONING, O_PREFIX_ON, O_PREFIX_OFF, O_KV_DTYPE,
	O_NO_LOG_REQ, O_LOG_REQ, O_UVICORN, O_EAGER, O_EXPERT_PAR, O_TOK_MODE, O_SWAP, O_PP, O_DP,
	O_STATS_INTERVAL, O_NO_STATS,
};

/* A vLLM flag accepted with no effect here: one log line later (the log
 * level is not set up while parsing). */
static void note(struct serve_args *a, const char *line)
{
	if (a->n_notes < (int)(sizeof a->notes / sizeof a->notes[0]))
		a->notes[a->n_notes++] = line;
}

static bool one_of(const char *v, const char *const *words)
{
	for (; *words; words++)
		if (!strcmp(v, *words))
			return true;
	return false;
}

static const struct option serve_opts[] = {
	{"model", required_argument, NULL, 'm'},
	{"host", required_argument, NULL, O_HOST},
	{"port", required_argument, NULL, O_PORT},
	{"served-model-name", required_argument, NULL, O_NAME},
	{"api-key", required_argument, NULL, O_KEY},
	{"max-model-len", required_argument, NULL, O_MAXLEN},
	{"max-num-seqs", required_argument, NULL, O_SEQS},
	{"max-num-batched-tokens", required_argument, NULL, O_BATCHED},
	{"max-num-queued-reqs", required_argument, NULL, O_QUEUED},
	{"gpu-memory-utilization", required_argument, NULL, O_GPU},
	{"shutdown-timeout", required_argument, NULL, O_SHUTDOWN},
	{"executor", required_argument, NULL, O_EXECUTOR},
	{"http-threads", required_argument, NULL, O_THREADS},
	{"num-gpu-blocks-override", required_argument, NULL, O_BLOCKS},
	{"scheduling-policy", required_argument, NULL, O_POLICY},
	{"disable-kernel", required_argument, NULL, O_DISABLE_KERNEL},
	{"kernel-selfcheck", no_argument, NULL, O_SELFCHECK},
	{"max-logprobs", required_argument, NULL, O_MAX_LOGPROBS},
	{"responses-store-bytes", required_argument, NULL, O_RESP_STORE},
	{"trust-remote-code", no_argument, NULL, O_TRUST},
	{"dtype", required_argument, NULL, O_DTYPE},
	{"enable-auto-tool-choice", no_argument, NULL, O_AUTO_TOOL},
	{"tool-call-parser", required_argument, NULL, O_TOOL_PARSER},
	{"reasoning-parser", required_argument, NULL, O_REASONING},
	{"enable-prefix-caching", no_argument, NULL, O_PREFIX_ON},
	{"no-enable-prefix-caching", no_argument, NULL, O_PREFIX_OFF},
	{"kv-cache-dtype", required_argument, NULL, O_KV_DTYPE},
	{"disable-log-requests", no_argument, NULL, O_NO_LOG_REQ},
	{"log-stats-interval", required_argument, NULL, O_STATS_INTERVAL},
	{"disable-log-stats", no_argument, NULL, O_NO_STATS},
	{"enable-log-requests", no_argument, NULL, O_LOG_REQ},
	{"uvicorn-log-level", required_argument, NULL, O_UVICORN},
	{"enforce-eager", no_argument, NULL, O_EAGER},
	{"enable-expert-parallel", no_argument, NULL, O_EXPERT_PAR},
	{"tokenizer-mode", required_argument, NULL, O_TOK_MODE},
	{"swap-space", required_argument, NULL, O_SWAP},
	{"pipeline-parallel-size", required_argument, NULL, O_PP},
	{"data-parallel-size", required_argument, NULL, O_DP},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* Not a flag of this family (serve_flag, vllm_flag). */
#define FLAG_NOT_MINE (-2)

/* dsv4's own flags, and vLLM's that act here. 0, -1 (help printed), an
 * exit code, or FLAG_NOT_MINE. */
static int serve_flag(int c, const char *v, struct serve_args *a)
{
	switch (c) {
	case 'h':
		usage(stdout);
		return -1;
	case 'm':
		a->model = v;
		break;
	case O_HOST:
		a->host = v;
		break;
	case O_PORT: {
		long p;
		if (!flag_parse_long(v, 0, 65535, &p))
			return bad("--port '%s': expected an integer in 0..65535", v);
		a->port = (int)p;
		break;
	}
	case O_NAME:
		if (!v[0])
			return bad("--served-model-name must not be empty%s", "");
		a->served_model_name = v;
		break;
	case O_KEY:
		a->api_key = v;
		break;
	case O_MAXLEN:
		if (!flag_parse_long(v, 1, INT32_MAX, &a->max_model_len))
			return bad("--max-model-len '%s': expected a positive integer", v);
		break;
	case O_SEQS:
		if (!flag_parse_long(v, 1, 65536, &a->max_num_seqs))
			return bad("--max-num-seqs '%s': expected an integer in 1..65536", v);
		break;
	case O_BATCHED:
		if (!flag_parse_long(v, 1, INT32_MAX, &a->max_num_batched_tokens))
			return bad("--max-num-batched-tokens '%s': expected a positive integer", v);
		break;
	case O_QUEUED:
		if (!flag_parse_long(v, 1, INT32_MAX, &a->max_queued))
			return bad("--max-num-queued-reqs '%s': expected a positive integer", v);
		break;
	case O_GPU:
		if (!flag_parse_double(v, 1e-6, 1.0, &a->gpu_memory_utilization))
			return bad("--gpu-memory-utilization '%s': expected a number in (0, 1]", v);
		a->gpu_memory_utilization_set = true;
		break;
	case O_SHUTDOWN:
		if (!flag_parse_double(v, 0, 86400, &a->shutdown_timeout_s))
			return bad("--shutdown-timeout '%s': expected seconds in 0..86400", v);
		break;
	case O_EXECUTOR:
		if (strcmp(v, "test") && strcmp(v, "cpu") && strcmp(v, "auto") && strcmp(v, "model"))
			return bad("--executor '%s': expected 'model' or 'test'", v);
		a->executor = v;
		break;
	case O_DISABLE_KERNEL:
		a->disable_kernels = v;
		break;
	case O_SELFCHECK:
		a->kernel_selfcheck = true;
		break;
	case O_THREADS:
		if (!flag_parse_long(v, 1, 256, &a->http_threads))
			return bad("--http-threads '%s': expected an integer in 1..256", v);
		break;
	case O_POLICY:
		if (strcmp(v, "fcfs") && strcmp(v, "priority"))
			return bad("--scheduling-policy '%s': expected 'fcfs' or 'priority'", v);
		a->priority = !strcmp(v, "priority");
		break;
	case O_MAX_LOGPROBS:
		if (!flag_parse_long(v, 1, SCHED_MAX_TOP_LOGPROBS, &a->max_logprobs))
			return bad("--max-logprobs '%s': expected an integer in 1..20", v);
		break;
	case O_RESP_STORE:
		if (!flag_parse_long(v, 1024, 1L << 40, &a->responses_store_bytes))
			return bad("--responses-store-bytes '%s': expected an integer in 1024..2^40", v);
		break;
	case O_BLOCKS:
		if (!flag_parse_long(v, 1, 1L << 30, &a->num_blocks))
			return bad("--num-gpu-blocks-override '%s': expected a positive integer", v);
		break;
	default:
		return FLAG_NOT_MINE;
	}
	return 0;
}

/* ---- cli: vLLM's common flags ---- */
/* vLLM's flags that change nothing here (a note each says why) or switch
 * something on and off. 0, an exit code, or FLAG_NOT_MINE. */
static int vllm_flag(int c, const char *v, struct serve_args *a)
{
	switch (c) {
	case O_TRUST:
		note(a, "--trust-remote-code: no effect: dsv4 implements DeepSeek-V4 itself and runs no code "
			"from the checkpoint");
		break;
	case O_DTYPE:
		if (strcmp(v, "auto") && strcmp(v, "bfloat16"))
			return bad("--dtype '%s': not supported: the weights run in the checkpoint's own formats "
				   "(bf16/FP8/FP4) with bf16 activations; use 'auto' (or --precision fp32 for float32 "
				   "numerics)", v);
		note(a, "--dtype: no effect: the weights run in the checkpoint's own formats with bf16 "
			"activations (what 'auto' means in vLLM for this model)");
		break;
	case O_AUTO_TOOL:
		note(a, "--enable-auto-tool-choice: no effect: tool_choice \"auto\" is always available");
		break;
	case O_TOOL_PARSER: {
		static const char *const ok[] = {"deepseek_v4", "deepseekv4", NULL};
		if (!one_of(v, ok))
			return bad("--tool-call-parser '%s': dsv4 parses DeepSeek-V4's DSML tool calls only "
				   "(deepseek_v4)", v);
		note(a, "--tool-call-parser: no effect: DeepSeek-V4's DSML tool-call parser is built in");
		break;
	}
	case O_REASONING: {
		static const char *const ok[] = {"deepseek_v4", "deepseekv4", "deepseek_r1", NULL};
		if (!one_of(v, ok))
			return bad("--reasoning-parser '%s': dsv4 parses DeepSeek-V4's <think> blocks only "
				   "(deepseek_v4)", v);
		note(a, "--reasoning-parser: no effect: the thinking block is always returned as "
			"reasoning_content by the built-in parser");
		break;
	}
	case O_PREFIX_ON:
		a->disable_prefix_caching = false;
		break;
	case O_PREFIX_OFF:
		a->disable_prefix_caching = true;
		break;
	case O_KV_DTYPE: {
		static const char *const ok[] = {"auto", "fp8", "fp8_e4m3", "fp8_ds_mla", NULL};
		if (!one_of(v, ok))
			return bad("--kv-cache-dtype '%s': not supported (auto, fp8, fp8_e4m3 or fp8_ds_mla)", v);
		if (strcmp(v, "auto"))
			note(a, "--kv-cache-dtype: no effect: the KV cache is stored in fp32; at --precision "
				"reference its entries are rounded to FP8 as DeepSeek's cache is");
		break;
	}
	case O_NO_LOG_REQ:
		a->disable_log_requests = true;
		break;
	case O_STATS_INTERVAL:
		if (!flag_parse_double(v, 0.1, 86400, &a->log_stats_interval_s))
			return bad("--log-stats-interval '%s': expected seconds in 0.1..86400", v);
		break;
	case O_NO_STATS:
		a->log_stats_interval_s = -1;
		break;
	case O_LOG_REQ:
		a->disable_log_requests = false;
		break;
	case O_UVICORN: {
		static const char *const ok[] = {"critical", "error", "warning", "info", "debug", "trace", NULL};
		if (!one_of(v, ok))
			return bad("--uvicorn-log-level '%s': expected critical, error, warning, info, debug or trace", v);
		note(a, "--uvicorn-log-level: no effect: dsv4 has no uvicorn; $DSV4_LOG_LEVEL sets the log level");
		break;
	}
	case O_EAGER:
		a->enforce_eager = true;
		break;
	case O_EXPERT_PAR:
		note(a, "--enable-expert-parallel: no effect: the experts are already split across the "
			"tensor-parallel ranks");
		break;
	case O_TOK_MODE: {
		static const char *const ok[] = {"auto", "deepseek_v4", "hf", "slow", NULL};
		if (!one_of(v, ok))
			return bad("--tokenizer-mode '%s': expected auto, deepseek_v4, hf or slow", v);
		note(a, "--tokenizer-mode: no effect: the built-in tokenizer reads the checkpoint's "
			"tokenizer.json and DeepSeek-V4's chat encoding");
		break;
	}
	case O_SWAP: {
		double gib;
		if (!flag_parse_double(v, 0, 1 << 20, &gib))
			return bad("--swap-space '%s': expected GiB >= 0", v);
		note(a, "--swap-space: no effect: preempted sequences are recomputed, never swapped to host memory");
		break;
	}
	case O_PP:
	case O_DP: {
		long n;
		const char *flag = c == O_PP ? "--pipeline-parallel-size" : "--data-parallel-size";
		if (!flag_parse_long(v, 1, 1, &n)) {
			fprintf(stderr, "dsv4 serve: %s '%s': only 1 is supported (split the model with "
					"--tensor-parallel-size)\n(try 'dsv4 serve --help')\n", flag, v);
			return CLI_EXIT_USAGE;
		}
		break;
	}
	default:
		return FLAG_NOT_MINE;
	}
	return 0;
}

static int parse_args(int argc, char **argv, struct serve_args *a)
{
	*a = (struct serve_args){.host = "127.0.0.1", .port = 8000, .gpu_memory_utilization = 0.9,
				 .shutdown_timeout_s = 30.0,
				 .max_logprobs = SCHED_MAX_TOP_LOGPROBS};
	a->api_key = getenv("DSV4_API_KEY");
	if (!a->api_key || !a->api_key[0])
		a->api_key = getenv("VLLM_API_KEY"); /* a vLLM set-up's environment works as is */
	for (int i = 1; i < argc; i++) /* vLLM's two-letter short forms; getopt knows one letter */
		if (!strcmp(argv[i], "-pp"))
			argv[i] = "--pipeline-parallel-size";
		else if (!strcmp(argv[i], "-dp"))
			argv[i] = "--data-parallel-size";
	opterr = 0;
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, ":hm:", serve_opts, NULL)) != -1) {
		if (c == ':')
			return bad("option '%s' needs a value", argv[optind - 1]);
		int r = serve_flag(c, optarg, a);
		if (r == FLAG_NOT_MINE)
			r = vllm_flag(c, optarg, a);
		if (r == FLAG_NOT_MINE)
			return bad("unknown option '%s'", argv[optind - 1]);
		if (r)
			return r;
	}
	/* `dsv4 serve MODEL_DIR`, as `vllm serve MODEL` */
	if (optind < argc) {
		if (a->model && strcmp(a->model, argv[optind]))
			return bad("two models: --model and '%s'", argv[optind]);
		a->model = argv[optind++];
	}
	if (optind < argc)
		return bad("unexpected argument '%s'", argv[optind]);
	if (!a->model)
		return bad("a model is required: dsv4 serve MODEL_DIR (or --model MODEL_DIR, or 'tiny')%s", "");
	return 0;
}

/* ---- watchdog heartbeat ---- */

static _Atomic double g_heartbeat_s;

static void on_heartbeat(void *ctx)
{
	(void)ctx;
	atomic_store(&g_heartbeat_s, time_mono_s());
}

static void notify(const char *state)
{
	struct err e = {0};
	if (server_notify(state, &e))
		log_msg(LOG_WARN, "serve", "%s", e.msg);
}

static const char *base_name(const char *dir)
{
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	const char *p = dir + n;
	while (p > dir && p[-1] != '/')
		p--;
	return p;
}

/* ---- tensor parallel ---- */
static atomic_bool g_tp_failed;

static void on_tp_fail(void *ctx, const char *msg)
{
	(void)ctx;
	(void)msg; /* logged by model/exec_open.c */
	atomic_store(&g_tp_failed, true);
}

static void on_exec_heartbeat(void *ctx)
{
	on_heartbeat(NULL);
	model_exec_open_heartbeat(ctx);
}

/* After a group failure the server keeps answering 503 at least this long
 * (so a load balancer or a test can see it) and waits at most
 * TP_FAIL_DRAIN_S for the requests in flight to end before it exits. */
#define TP_FAIL_LINGER_S 1.0
#define TP_FAIL_DRAIN_S 5.0

static void tp_fail_engine(struct engine *en)
{
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
/* ---- end tensor parallel ---- */

/* One serve run: what the steps of cmd_serve hand to each other. */
struct serve_run {
	struct serve_args a;
	struct serve_guard_args ga;                /* ---- hardening ---- */
	struct model_checkpoint_options load_opts; /* dummy-load: --load-format, --hf-overrides */
	struct model_exec_open_options xo;         /* --device, --precision, the tensor-parallel group */
	struct kern_disabled disabled;
	bool use_test;
	sigset_t sigs;
	int bound_fd;                              /* -1, or ours until the engine takes it */
	char dir[PATH_MAX];
	char name[256];
	struct model_checkpoint *ck;
	struct exec *ex, *test_ex;
	struct model_exec_open *mx;
	struct engine *en;
};

/* Flags, with every check that needs no model: 0, -1 (help printed) or an
 * exit code. */
static int serve_parse(int argc, char **argv, struct serve_run *r)
{
	if (load_args_extract(&argc, argv, "serve", true, &r->load_opts))
		return CLI_EXIT_USAGE;
	int rc = load_args_extract_exec(&argc, argv, "serve", &r->xo);
	if (rc)
		return rc;
	if ((rc = serve_guard_extract(&argc, argv, &r->ga))) /* ---- hardening ---- */
		return rc;
	rc = parse_args(argc, argv, &r->a);
	if (rc)
		return rc;
	if ((rc = serve_guard_check(&r->ga, r->a.host, &r->a.api_key))) /* ---- hardening ---- */
		return rc;
	for (int i = 0; i < r->a.n_notes; i++) /* vLLM flags that change nothing here */
		log_msg(LOG_INFO, "serve", "%s", r->a.notes[i]);
	if (r->load_opts.dummy_seed && r->load_opts.load_format != MODEL_LOAD_DUMMY)
		log_msg(LOG_INFO, "serve", "--seed: no effect: it seeds --load-format dummy weights only; requests "
					   "carry their own \"seed\"");
	r->xo.enforce_eager = r->a.enforce_eager;
	r->use_test = r->a.executor && !strcmp(r->a.executor, "test");
	struct err pe = {0};
	if (r->use_test && model_exec_parallel_world(&r->xo.parallel, &pe) > 1) {
		fprintf(stderr, "dsv4 serve: tensor parallelism runs the model executor; --executor test has no ranks\n");
		return CLI_EXIT_USAGE;
	}
	/* Kernel overrides are checked before anything loads: a misspelt name is a usage error. */
	struct err de = {0};
	int n_ops = 0;
	const struct kern_op *const *ops = kern_registry_ops(&n_ops);
	if (kern_disabled_init(&r->disabled, r->a.disable_kernels, true, &de) ||
	    kern_disabled_check(&r->disabled, ops, n_ops, &de)) {
		fprintf(stderr, "dsv4 serve: --disable-kernel / DSV4_DISABLED_KERNELS: %s\n", de.msg);
		return CLI_EXIT_USAGE;
	}
	return 0;
}

/* The port is bound before anything slow (tiny build, weights): a busy
 * port or a bad --host fails in a second. Listening starts with the
 * server, so a client that comes early is refused, not kept waiting.
 * Worker ranks serve no HTTP. */
static int serve_bind(struct serve_run *r)
{
	if (r->xo.parallel.node_rank != 0)
		return 0;
	struct err e = {0};
	int bound_port = 0;
	double t0 = time_mono_s();
	if (http_bind(r->a.host, r->a.port, &r->bound_fd, &bound_port, &e)) {
		fprintf(stderr, "dsv4 serve: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	log_msg(LOG_INFO, "serve", "bound %s port %d in %.3f s (listening once the model is loaded)", r->a.host,
		bound_port, time_mono_s() - t0);
	return 0;
}

/* The model directory ('tiny' is built once), the served name, the
 * checkpoint, and the executor options sized from the flags. */
static int serve_load(struct serve_run *r)
{
	bool tiny = !strcmp(r->a.model, "tiny");
	if (load_args_model_dir(r->a.model, r->dir, sizeof r->dir))
		return CLI_EXIT_FAIL;
	snprintf(r->name, sizeof r->name, "%s",
		 r->a.served_model_name ? r->a.served_model_name : tiny ? "tiny" : base_name(r->dir));
	struct err e = {0};
	struct model_checkpoint_options co = r->load_opts; /* dummy-load */
	co.dir = r->dir;
	if (model_checkpoint_create(&r->ck, &co, &e)) {
		fprintf(stderr, "dsv4 serve: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	struct model_exec_open_options *xo = &r->xo;
	xo->ck = r->ck;
	xo->gpu_memory_utilization = r->a.gpu_memory_utilization;
	xo->n_blocks = (uint32_t)r->a.num_blocks;
	xo->max_step_tokens = (uint32_t)r->a.max_num_batched_tokens;
	xo->max_step_seqs = (uint32_t)r->a.max_num_seqs;
	xo->max_model_len = (uint32_t)r->a.max_model_len;
	xo->disabled = &r->disabled;
	xo->kernel_selfcheck = r->a.kernel_selfcheck;
	return 0;
}

/* Test hooks of the test executor: $DSV4_TEST_EXEC_STEP_MS (a delay per
 * step) and $DSV4_TEST_EXEC_SCRIPT (whitespace-separated token ids every
 * output starts with). */
static int serve_test_hooks(struct serve_run *r)
{
	const char *delay = getenv("DSV4_TEST_EXEC_STEP_MS");
	if (delay && delay[0] && r->test_ex)
		model_exec_test_set_step_delay(r->test_ex, (uint32_t)strtoul(delay, NULL, 10));
	const char *script = getenv("DSV4_TEST_EXEC_SCRIPT");
	if (!script || !script[0])
		return 0;
	if (!r->test_ex) {
		fprintf(stderr, "dsv4 serve: DSV4_TEST_EXEC_SCRIPT needs --executor test\n");
		return CLI_EXIT_USAGE;
	}
	int32_t ids[4096];
	uint32_t n = 0;
	for (char *p = (char *)script, *end; *p && n < 4096; p = end) {
		long v = strtol(p, &end, 10);
		if (end == p)
			break;
		ids[n++] = (int32_t)v;
	}
	struct err e = {0};
	if (model_exec_test_script(r->test_ex, ids, n, &e)) {
		fprintf(stderr, "dsv4 serve: DSV4_TEST_EXEC_SCRIPT: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	log_msg(LOG_INFO, "serve", "test executor scripted with %u tokens", n);
	return 0;
}

/* The executor: the deterministic test one (--executor test), or the
 * model on its device (model/exec_open.h: device, sizes, the group). */
static int serve_open_executor(struct serve_run *r)
{
	struct err e = {0};
	const struct model_config *cfg = model_checkpoint_config(r->ck);
	uint32_t model_len = cfg->max_position_embeddings > INT32_MAX ? INT32_MAX
								      : (uint32_t)cfg->max_position_embeddings;
	if (r->use_test) {
		uint32_t len = r->a.max_model_len ? (uint32_t)r->a.max_model_len
						  : (model_len < 65536 ? model_len : 65536);
		if (model_exec_test_create(&r->test_ex, (uint32_t)cfg->vocab_size, (int32_t)cfg->eos_token_id, len,
					   &e)) {
			fprintf(stderr, "dsv4 serve: %s\n", e.msg);
			return CLI_EXIT_FAIL;
		}
		r->ex = r->test_ex;
		log_msg(LOG_WARN, "serve", "--executor test: output comes from the deterministic test executor, "
					   "not from the model");
	} else {
		/* device, sizes for it, the group, the executor; logs the plan */
		if (model_exec_open(&r->mx, &r->xo, &e)) {
			fprintf(stderr, "dsv4 serve: %s\n", e.msg);
			return CLI_EXIT_FAIL;
		}
		r->ex = model_exec_open_exec(r->mx);
		if (r->a.gpu_memory_utilization_set && !model_exec_open_device(r->mx)->cc_major)
			log_msg(LOG_INFO, "serve", "--gpu-memory-utilization: no effect on the CPU (the KV cache is sized "
						   "from --max-model-len, or --num-gpu-blocks-override)");
	}
	return serve_test_hooks(r);
}

/* The engine (scheduler loop, API, HTTP server on the bound socket), then
 * READY=1 for systemd. */
static int serve_start(struct serve_run *r)
{
	const struct serve_args *a = &r->a;
	atomic_store(&g_heartbeat_s, time_mono_s());
	struct engine_options eo = {
		.model_dir = r->dir,
		.served_model_name = r->name,
		.api_key = a->api_key,
		.host = a->host,
		.port = a->port,
		.n_http_threads = (int)a->http_threads,
		.max_body_bytes = (size_t)r->ga.max_body_mb << 20, /* ---- hardening ---- */
		.max_connections = (unsigned)r->ga.max_connections,
		.max_connections_per_ip = (unsigned)r->ga.max_connections_per_ip,
		.request_deadline_s = (unsigned)r->ga.max_request_seconds,
		.max_model_len = (uint32_t)a->max_model_len,
		.max_num_seqs = (uint32_t)a->max_num_seqs,
		.max_num_batched_tokens = (uint32_t)a->max_num_batched_tokens,
		.max_queued_requests = (uint32_t)a->max_queued,
		.priority_scheduling = a->priority,
		.max_logprobs = (uint32_t)a->max_logprobs,
		.responses_store_bytes = (size_t)a->responses_store_bytes,
		.exec = r->ex,
		.plan = r->mx ? model_exec_open_plan(r->mx) : NULL,
		.heartbeat = r->mx ? on_exec_heartbeat : on_heartbeat, /* pings idle TP ranks */
		.heartbeat_ctx = r->mx,
		/* ---- hardening: /health 503 when a rank is late ---- */
		.health_stall_s = r->mx && model_exec_open_world(r->mx) > 1 ? 10.0 : 0,
		.use_bound_fd = r->bound_fd >= 0, /* cli: bound before loading; the engine owns it now */
		.bound_fd = r->bound_fd,
		.disable_prefix_caching = a->disable_prefix_caching,
		.disable_log_requests = a->disable_log_requests,
		.log_stats_interval_s = a->log_stats_interval_s,
	};
	r->bound_fd = -1;
	struct err e = {0};
	if (engine_create(&r->en, &eo, &e)) {
		fprintf(stderr, "dsv4 serve: %s\n", e.msg);
		return CLI_EXIT_FAIL;
	}
	engine_set_ready(r->en);
	log_msg(LOG_INFO, "serve", "serving '%s' from %s on http://%s:%d (max_model_len %u)", r->name, r->dir,
		a->host, engine_port(r->en), engine_max_model_len(r->en));
	char ready[512];
	snprintf(ready, sizeof ready, "READY=1\nSTATUS=serving %s on port %d", r->name, engine_port(r->en));
	notify(ready);
	return 0;
}

/* Wait for signals, sending WATCHDOG=1 while the step loop's heartbeat is
 * recent; on SIGTERM / SIGINT drain for up to --shutdown-timeout, then
 * abort what is left (a second signal cuts the drain short). Returns when
 * drained, or when the tensor-parallel group failed. */
static void serve_wait(struct serve_run *r)
{
	struct engine *en = r->en;
	uint64_t wd_usec = server_notify_watchdog_usec();
	double wd_s = wd_usec ? (double)wd_usec * 1e-6 : 0.0;
	double tick_s = wd_s > 0 ? wd_s / 2 : 1.0;
	if (tick_s > 1.0)
		tick_s = 1.0;
	bool draining = false;
	double drain_deadline = 0, hard_deadline = 0;
	for (;;) {
		struct timespec ts = {.tv_sec = (time_t)tick_s, .tv_nsec = (long)((tick_s - (double)(time_t)tick_s) * 1e9)};
		if (draining)
			ts = (struct timespec){.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
		int sig = sigtimedwait(&r->sigs, NULL, &ts);
		/* ---- tensor parallel ---- */
		if (r->mx && atomic_load(&g_tp_failed)) {
			notify("STOPPING=1\nSTATUS=tensor parallel group failed");
			tp_fail_engine(en);
			break;
		}
		/* ---- end tensor parallel ---- */
		double now = time_mono_s();
		if (wd_s > 0 && now - atomic_load(&g_heartbeat_s) < wd_s)
			notify("WATCHDOG=1");
		if (sig == SIGTERM || sig == SIGINT) {
			if (!draining) {
				log_msg(LOG_INFO, "serve", "%s: draining (up to %.0f s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
					r->a.shutdown_timeout_s);
				notify("STOPPING=1");
				engine_begin_drain(en);
				draining = true;
				drain_deadline = now + r->a.shutdown_timeout_s;
			} else if (!hard_deadline) {
				log_msg(LOG_WARN, "serve", "second signal: aborting the requests in flight");
				drain_deadline = now;
			}
		}
		if (draining) {
			if (engine_idle(en))
				break;
			if (now >= drain_deadline && !hard_deadline) {
				log_msg(LOG_WARN, "serve", "shutdown timeout: aborting the requests still running");
				engine_abort_all(en);
				hard_deadline = now + 5.0;
			}
			if (hard_deadline && now >= hard_deadline)
				break;
		}
	}
}

/* Everything the run holds, in the reverse order of its steps. */
static void serve_close(struct serve_run *r)
{
	engine_destroy(r->en);
	model_exec_test_destroy(r->test_ex);
	model_exec_open_destroy(r->mx);
	model_checkpoint_destroy(r->ck);
	if (r->bound_fd >= 0)
		close(r->bound_fd);
}

int cmd_serve(int argc, char **argv)
{
	struct serve_run r = {.xo = {.device = "auto", .serving = true, .on_fail = on_tp_fail}, .bound_fd = -1};
	int rc = serve_parse(argc, argv, &r);
	if (rc)
		return rc < 0 ? CLI_EXIT_OK : rc;
	/* Signals go to the main thread only: block them before any thread starts. */
	sigemptyset(&r.sigs);
	sigaddset(&r.sigs, SIGTERM);
	sigaddset(&r.sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &r.sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	if ((rc = serve_bind(&r)) || (rc = serve_load(&r))) {
		serve_close(&r);
		return rc;
	}
	/* ---- tensor parallel ---- */
	if (r.xo.parallel.node_rank > 0) { /* a worker node: no HTTP server, runs rank 0's plans */
		struct err e = {0};
		bool signalled = false;
		if (model_exec_open_worker(&r.xo, &r.sigs, &signalled, NULL, &e))
			fprintf(stderr, "dsv4 serve: worker rank %d: %s\n", r.xo.parallel.node_rank, e.msg);
		serve_close(&r);
		return e.st && !signalled ? CLI_EXIT_FAIL : CLI_EXIT_OK;
	}
	/* ---- end tensor parallel ---- */
	if ((rc = serve_open_executor(&r)) || (rc = serve_start(&r))) {
		serve_close(&r);
		return rc;
	}
	serve_wait(&r);
	log_msg(LOG_INFO, "serve", "drained; stopping");
	bool tp_failed = r.mx && atomic_load(&g_tp_failed);
	serve_close(&r);
	log_msg(LOG_INFO, "serve", "stopped");
	return tp_failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
