/*
 * server/cmd_generate.c: `dsv4 generate`, one prompt through the model
 * executor (model/exec_open.h: the CPU, or the GPU when one is usable;
 * --tensor-parallel-size N splits it over N rank threads) without HTTP or
 * the scheduler: prefill in
 * chunks of the step budget, then decode token by token with the executor's
 * own sampling, printing the ids, (with a tokenizer in the model directory)
 * the text, and the prefill and decode speeds.
 *
 *   dsv4 generate MODEL_DIR (-p TEXT | --prompt-ids 0,1,2) [-n N]
 *                 [--temperature T] [--seed S]
 *                 [--precision reference|fp32] [--kernel-plan]
 *                 [--device auto|cuda|cpu] [--tensor-parallel-size N]
 *
 * MODEL_DIR 'tiny' is the tiny random checkpoint `dsv4 serve --model tiny`
 * builds and caches. Aliases: --model DIR for MODEL_DIR, --prompt for -p, --max-tokens for -n
 * (default 16). -p TEXT is encoded with the model's tokenizer.json (added
 * tokens recognised) and BOS is put in front unless the text already starts
 * with it. --kernel-plan prints the per-layer kernel plan first (alone, it
 * prints the plan and exits). Output on stdout:
 *   prompt_ids: 0 1 2
 *   output_ids: 17 4 ...
 *   text: ...        (when the tokenizer loads)
 *   prefill: 3 tokens in 0.012 s, 250.0 tokens/s, cpu 0.011 s
 *   decode: 15 tokens in 0.060 s, 250.0 tokens/s, cpu 0.058 s
 * Prefill is the time from the first step to the first sampled token (it
 * is sampled from the last prefill step); decode covers the tokens after
 * it, one step each. --prompt-logprobs scores the prompt instead of
 * generating: the forward pass's logits of every prompt row, log-softmax on
 * the host in double, one line
 *   prompt_logprobs: null -3.25 -0.5 ...   (log P(token p | tokens < p))
 * (a reference for the server's prompt log-probabilities, docs/eval.md). Seconds and tokens/s are wall-clock; cpu is this
 * process's CPU time over the same span (the executor is one thread, so on
 * a loaded machine tokens / cpu is the steadier figure).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "model/checkpoint.h"
#include "model/exec_open.h"
#include "model/tokenizer.h"
#include "server/load_args.h"

static void usage(void)
{
	fprintf(stderr, "usage: dsv4 generate MODEL_DIR|tiny (-p TEXT | --prompt-ids 0,1,2) [-n N] [--temperature T]\n"
			"                     [--seed S] [--kernel-plan] [--prompt-logprobs]\n"
			"       (--model DIR, --prompt TEXT, --max-tokens N: the same; -n defaults to 16,\n"
			"        --temperature to 0 (greedy), --seed to 0)\n"
			"%s%s", load_args_exec_usage(), load_args_usage());
}

static double clock_s(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_ids(const char *s, int32_t **out, size_t *n)
{
	size_t cap = 16, k = 0;
	int32_t *v = malloc(cap * sizeof *v);
	if (!v)
		return -1;
	while (*s) {
		char *end;
		errno = 0;
		long x = strtol(s, &end, 10);
		if (end == s || errno || x < 0 || x > INT32_MAX) {
			free(v);
			return -1;
		}
		if (k == cap) {
			int32_t *p = realloc(v, 2 * cap * sizeof *v);
			if (!p) {
				free(v);
				return -1;
			}
			v = p;
			cap *= 2;
		}
		v[k++] = (int32_t)x;
		s = end;
		if (*s == ',')
			s++;
		else if (*s) {
			free(v);
			return -1;
		}
	}
	*out = v;
	*n = k;
	return k ? 0 : -1;
}

/* --prompt-logprobs: the prompt in chunks through model_exec_cpu_forward
 * with every row's logits, log P(ids[p] | ids[<p]) printed per position. */
static enum status score_prompt(struct model_exec_cpu *x, const int32_t *ids, uint32_t n, int32_t *pos,
				const uint32_t *blocks, struct err *e)
{
	const struct exec_info *in = &model_exec_cpu_exec(x)->info;
	uint32_t T = in->max_step_tokens, V = in->vocab_size, B = in->block_tokens;
	float *lg = malloc((size_t)T * V * sizeof *lg);
	uint32_t *rows = malloc((size_t)T * sizeof *rows);
	enum status st = ST_OK;
	if (!lg || !rows)
		st = err_set(e, ST_NOMEM, "out of memory for %u rows of logits", T);
	printf("prompt_logprobs: null");
	for (uint32_t done = 0; !st && done < n;) {
		uint32_t q = n - done < T ? n - done : T;
		for (uint32_t k = 0; k < q; k++) {
			pos[k] = (int32_t)(done + k);
			rows[k] = k;
		}
		struct exec_seq es = {.seq_id = 1, .n_cached_tokens = done, .n_context_tokens = done + q,
				      .n_blocks = (done + q + B - 1) / B};
		uint32_t qs[2] = {0, q};
		struct exec_step step = {.n_tokens = q, .token_ids = ids + done, .positions = pos, .n_seqs = 1,
					 .seqs = &es, .query_start = qs, .block_ids = blocks, .n_block_ids = es.n_blocks};
		if ((st = model_exec_cpu_forward(x, &step, rows, q, lg, e)))
			break;
		for (uint32_t k = 0; k < q && done + k + 1 < n; k++) {
			const float *l = lg + (size_t)k * V;
			double mx = -INFINITY, s = 0;
			for (uint32_t v = 0; v < V; v++)
				mx = l[v] > mx ? l[v] : mx;
			for (uint32_t v = 0; v < V; v++)
				s += exp((double)l[v] - mx);
			printf(" %.9g", (double)l[ids[done + k + 1]] - (mx + log(s)));
		}
		done += q;
	}
	printf("\n");
	free(lg);
	free(rows);
	return st;
}

struct gen_args {
	const char *model, *prompt, *prompt_ids;
	long max_tokens;
	double temperature;
	unsigned long long seed;
	bool plan, score;
};

/* The command line after the load and executor flags. 0: go on; -1: help
 * was printed; else the exit code. */
static int parse_args(int argc, char **argv, struct gen_args *g)
{
	*g = (struct gen_args){.max_tokens = 16};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--kernel-plan")) {
			g->plan = true;
			continue;
		}
		if (!strcmp(a, "--prompt-logprobs")) {
			g->score = true;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return -1;
		}
		if (a[0] != '-') {
			if (g->model) {
				fprintf(stderr, "dsv4 generate: one model directory (got %s and %s)\n", g->model, a);
				usage();
				return CLI_EXIT_USAGE;
			}
			g->model = a;
			continue;
		}
		if (!v) {
			fprintf(stderr, "dsv4 generate: %s needs a value\n", a);
			usage();
			return CLI_EXIT_USAGE;
		}
		char *end = NULL;
		if (!strcmp(a, "--model")) {
			if (g->model) {
				fprintf(stderr, "dsv4 generate: one model directory (got %s and %s)\n", g->model, v);
				return CLI_EXIT_USAGE;
			}
			g->model = v;
		} else if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
			g->prompt = v;
		else if (!strcmp(a, "--prompt-ids"))
			g->prompt_ids = v;
		else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
			g->max_tokens = strtol(v, &end, 10);
			if (*end || g->max_tokens < 0 || g->max_tokens > 1000000)
				goto bad;
		} else if (!strcmp(a, "--temperature")) {
			g->temperature = strtod(v, &end);
			if (*end || !(g->temperature >= 0))
				goto bad;
		} else if (!strcmp(a, "--seed")) {
			g->seed = strtoull(v, &end, 10);
			if (*end)
				goto bad;
		} else {
			fprintf(stderr, "dsv4 generate: unknown option %s\n", a);
			usage();
			return CLI_EXIT_USAGE;
		}
		i++;
		continue;
bad:
		fprintf(stderr, "dsv4 generate: bad value for %s: %s\n", a, v);
		return CLI_EXIT_USAGE;
	}
	if (!g->model || (!g->plan && !g->prompt == !g->prompt_ids) || (g->prompt && g->prompt_ids)) {
		usage();
		return CLI_EXIT_USAGE;
	}
	return 0;
}

/* The prompt's ids: --prompt-ids as given, or -p encoded with BOS in front
 * unless the text starts with it. 0 or the exit code (after a message). */
static int prompt_tokens(const struct gen_args *g, const struct model_tokenizer *tok, int32_t **ids, size_t *n_prompt,
			 struct err *e)
{
	if (g->prompt_ids && parse_ids(g->prompt_ids, ids, n_prompt)) {
		fprintf(stderr, "dsv4 generate: --prompt-ids wants comma-separated token ids\n");
		return CLI_EXIT_USAGE;
	}
	if (!g->prompt)
		return 0;
	int32_t *enc = NULL;
	size_t n_enc = 0;
	if (model_tokenizer_encode_alloc(tok, g->prompt, strlen(g->prompt), MODEL_TOK_ADDED_ALL, &enc, &n_enc, e)) {
		fprintf(stderr, "dsv4 generate: encode: %s\n", e->msg);
		return CLI_EXIT_FAIL;
	}
	int32_t bos = model_tokenizer_bos_id(tok);
	bool add_bos = bos >= 0 && (n_enc == 0 || enc[0] != bos);
	*ids = malloc((n_enc + 1) * sizeof **ids);
	if (!*ids) {
		free(enc);
		return CLI_EXIT_FAIL;
	}
	size_t n = 0;
	if (add_bos)
		(*ids)[n++] = bos;
	if (n_enc)
		memcpy(*ids + n, enc, n_enc * sizeof **ids);
	*n_prompt = n + n_enc;
	free(enc);
	return 0;
}

/* Wall-clock and CPU time at the start, the first sampled token and the end. */
struct gen_times {
	double t_start, t_first, t_end;
	double c_start, c_first, c_end;
};

/* Prefill in chunks of the step budget, then one token a step until
 * max_tokens or EOS. all holds the prompt and receives the output. */
static enum status decode(struct exec *ex, const struct gen_args *g, const int32_t *ids, uint32_t n_prompt,
			  int32_t *all, const uint32_t *blocks, int32_t *pos, uint32_t *n_out_ret, struct gen_times *tm,
			  struct err *e)
{
	uint32_t B = ex->info.block_tokens;
	struct kern_sampling_params sp = {.temperature = (float)g->temperature, .top_p = 1, .repetition_penalty = 1,
					  .seed = g->seed};
	uint32_t done = 0, len = n_prompt, n_out = 0;
	tm->t_start = tm->t_first = clock_s(CLOCK_MONOTONIC);
	tm->c_start = tm->c_first = clock_s(CLOCK_PROCESS_CPUTIME_ID);
	while (n_out < (uint32_t)g->max_tokens) {
		uint32_t q = len - done;
		if (q > ex->info.max_step_tokens)
			q = ex->info.max_step_tokens;
		bool last = done + q == len;
		for (uint32_t k = 0; k < q; k++)
			pos[k] = (int32_t)(done + k);
		struct exec_seq es = {.seq_id = 1, .n_cached_tokens = done, .n_context_tokens = done + q,
				      .n_blocks = (done + q + B - 1) / B, .sample = last, .sampling = &sp,
				      .prompt_ids = ids, .n_prompt = n_prompt, .output_ids = all + n_prompt,
				      .n_output = n_out};
		uint32_t qs[2] = {0, q};
		struct exec_step step = {.n_tokens = q, .token_ids = all + done, .positions = pos, .n_seqs = 1,
					 .seqs = &es, .query_start = qs, .block_ids = blocks, .n_block_ids = es.n_blocks,
					 .n_sample = last ? 1 : 0};
		struct exec_sample smp;
		enum status st = ex->ops->step(ex->ctx, &step, &smp, e);
		if (st) {
			*n_out_ret = n_out;
			return st;
		}
		done += q;
		if (!last)
			continue;
		all[len++] = smp.out.token_id;
		if (n_out++ == 0) {
			tm->t_first = clock_s(CLOCK_MONOTONIC);
			tm->c_first = clock_s(CLOCK_PROCESS_CPUTIME_ID);
		}
		if (smp.out.token_id == ex->info.eos_token_id)
			break;
	}
	tm->t_end = clock_s(CLOCK_MONOTONIC);
	tm->c_end = clock_s(CLOCK_PROCESS_CPUTIME_ID);
	*n_out_ret = n_out;
	return ST_OK;
}

/* The ids, the text (with a tokenizer) and the prefill and decode speeds. */
static void print_result(const int32_t *ids, size_t n_prompt, const int32_t *all, uint32_t n_out,
			 const struct model_tokenizer *tok, const struct gen_times *tm)
{
	printf("prompt_ids:");
	for (size_t i = 0; i < n_prompt; i++)
		printf(" %d", ids[i]);
	printf("\noutput_ids:");
	for (uint32_t i = 0; i < n_out; i++)
		printf(" %d", all[n_prompt + i]);
	printf("\n");
	if (tok) {
		char *text = NULL;
		size_t tl = 0;
		struct err e = {0};
		if (model_tokenizer_decode(tok, all + n_prompt, n_out, 0, &text, &tl, &e) == ST_OK)
			printf("text: %s\n", text);
		free(text);
	}
	/* prefill: the prompt up to the first sampled token; decode: the rest */
	uint32_t n_pre = n_out ? (uint32_t)n_prompt : 0, n_dec = n_out > 1 ? n_out - 1 : 0;
	double s_pre = n_out ? tm->t_first - tm->t_start : 0, s_dec = n_out > 1 ? tm->t_end - tm->t_first : 0;
	double cpu_pre = n_out ? tm->c_first - tm->c_start : 0, cpu_dec = n_out > 1 ? tm->c_end - tm->c_first : 0;
	printf("prefill: %u tokens in %.3f s, %.1f tokens/s, cpu %.3f s\n", n_pre, s_pre,
	       s_pre > 0 ? n_pre / s_pre : 0.0, cpu_pre);
	printf("decode: %u tokens in %.3f s, %.1f tokens/s, cpu %.3f s\n", n_dec, s_dec,
	       s_dec > 0 ? n_dec / s_dec : 0.0, cpu_dec);
}

int cmd_generate(int argc, char **argv)
{
	struct model_checkpoint_options load_opts = {0}; /* dummy-load: --load-format, --hf-overrides */
	if (load_args_extract(&argc, argv, "generate", false, &load_opts))
		return CLI_EXIT_USAGE;
	struct model_exec_open_options xo = {.device = "auto"};
	if (load_args_extract_exec(&argc, argv, "generate", &xo))
		return CLI_EXIT_USAGE;
	if (xo.parallel.nnodes > 1) {
		fprintf(stderr, "dsv4 generate: --nnodes %d: generate runs in one process (use serve for several "
				"nodes)\n", xo.parallel.nnodes);
		return CLI_EXIT_USAGE;
	}
	struct gen_args g;
	int rc = parse_args(argc, argv, &g);
	if (rc)
		return rc < 0 ? CLI_EXIT_OK : rc;
	if (g.score && xo.parallel.tensor_parallel_size > 1) {
		fprintf(stderr, "dsv4 generate: --prompt-logprobs runs one rank (leave out --tensor-parallel-size)\n");
		return CLI_EXIT_USAGE;
	}
	char tiny_dir[4096];
	if (!strcmp(g.model, "tiny")) {
		if (load_args_model_dir(g.model, tiny_dir, sizeof tiny_dir))
			return CLI_EXIT_FAIL;
		g.model = tiny_dir;
	}

	rc = CLI_EXIT_FAIL;
	struct err e = {0};
	struct model_checkpoint *ck = NULL;
	struct model_exec_open *mx = NULL;
	struct model_exec_cpu *x = NULL;
	struct model_tokenizer *tok = NULL;
	int32_t *ids = NULL, *all = NULL, *pos = NULL;
	uint32_t *blocks = NULL;
	size_t n_prompt = 0;
	struct model_checkpoint_options co = load_opts; /* dummy-load */
	co.dir = g.model;
	if (model_checkpoint_create(&ck, &co, &e)) {
		fprintf(stderr, "dsv4 generate: %s\n", e.msg);
		goto out;
	}
	if (model_tokenizer_load(&tok, g.model, &e)) {
		if (g.prompt) {
			fprintf(stderr, "dsv4 generate: tokenizer: %s\n", e.msg);
			goto out;
		}
		tok = NULL;
	}
	int prc = prompt_tokens(&g, tok, &ids, &n_prompt, &e);
	if (prc) {
		rc = prc;
		goto out;
	}
	if (g.score)
		g.max_tokens = 0;
	uint32_t total = (uint32_t)(n_prompt + (size_t)g.max_tokens);
	uint32_t B = 256, nb = (total + B - 1) / B + 1;
	struct kern_disabled disabled;
	if (kern_disabled_init(&disabled, NULL, true, &e)) {
		fprintf(stderr, "dsv4 generate: DSV4_DISABLED_KERNELS: %s\n", e.msg);
		goto out;
	}
	xo.ck = ck;
	xo.n_blocks = nb < 2 ? 2 : nb;
	xo.max_step_tokens = 256;
	xo.max_step_seqs = 1;
	xo.disabled = &disabled;
	if (model_exec_open(&mx, &xo, &e)) {
		fprintf(stderr, "dsv4 generate: %s\n", e.msg);
		goto out;
	}
	x = model_exec_open_cpu(mx);
	struct exec *ex = model_exec_open_exec(mx);
	if (g.plan) {
		size_t need = model_exec_cpu_plan_str(x, NULL, 0);
		char *buf = malloc(need + 1);
		if (buf) {
			model_exec_cpu_plan_str(x, buf, need + 1);
			fputs(buf, stdout);
			free(buf);
		}
		if (!g.prompt && !g.prompt_ids) {
			rc = CLI_EXIT_OK;
			goto out;
		}
	}
	B = ex->info.block_tokens;
	if (total > ex->info.max_model_len) {
		fprintf(stderr, "dsv4 generate: %u tokens exceed the model length %u\n", total, ex->info.max_model_len);
		goto out;
	}
	for (size_t i = 0; i < n_prompt; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= ex->info.vocab_size) {
			fprintf(stderr, "dsv4 generate: token id %d outside the vocabulary\n", ids[i]);
			rc = CLI_EXIT_USAGE;
			goto out;
		}
	all = malloc(((size_t)total + 1) * sizeof *all);
	blocks = malloc(((size_t)total / B + 2) * sizeof *blocks);
	pos = malloc((size_t)ex->info.max_step_tokens * sizeof *pos);
	if (!all || !blocks || !pos)
		goto out;
	memcpy(all, ids, n_prompt * sizeof *all);
	for (uint32_t k = 0; k < total / B + 2; k++)
		blocks[k] = k;
	if (g.score) {
		rc = score_prompt(x, ids, (uint32_t)n_prompt, pos, blocks, &e) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
		if (rc)
			fprintf(stderr, "dsv4 generate: %s\n", e.msg);
		goto out;
	}
	struct gen_times tm;
	uint32_t n_out = 0;
	if (decode(ex, &g, ids, (uint32_t)n_prompt, all, blocks, pos, &n_out, &tm, &e)) {
		fprintf(stderr, "dsv4 generate: step: %s\n", e.msg);
		goto out;
	}
	print_result(ids, n_prompt, all, n_out, tok, &tm);
	rc = CLI_EXIT_OK;
out:
	free(pos);
	free(all);
	free(blocks);
	free(ids);
	model_exec_open_destroy(mx);
	model_tokenizer_destroy(tok);
	model_checkpoint_destroy(ck);
	return rc;
}
