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
	const char *model = NULL, *prompt = NULL, *prompt_ids = NULL;
	long max_tokens = 16;
	double temperature = 0;
	unsigned long long seed = 0;
	bool plan = false, score = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--kernel-plan")) {
			plan = true;
			continue;
		}
		if (!strcmp(a, "--prompt-logprobs")) {
			score = true;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return CLI_EXIT_OK;
		}
		if (a[0] != '-') {
			if (model) {
				fprintf(stderr, "dsv4 generate: one model directory (got %s and %s)\n", model, a);
				usage();
				return CLI_EXIT_USAGE;
			}
			model = a;
			continue;
		}
		if (!v) {
			fprintf(stderr, "dsv4 generate: %s needs a value\n", a);
			usage();
			return CLI_EXIT_USAGE;
		}
		char *end = NULL;
		if (!strcmp(a, "--model")) {
			if (model) {
				fprintf(stderr, "dsv4 generate: one model directory (got %s and %s)\n", model, v);
				return CLI_EXIT_USAGE;
			}
			model = v;
		} else if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
			prompt = v;
		else if (!strcmp(a, "--prompt-ids"))
			prompt_ids = v;
		else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
			max_tokens = strtol(v, &end, 10);
			if (*end || max_tokens < 0 || max_tokens > 1000000)
				goto bad;
		} else if (!strcmp(a, "--temperature")) {
			temperature = strtod(v, &end);
			if (*end || !(temperature >= 0))
				goto bad;
		} else if (!strcmp(a, "--seed")) {
			seed = strtoull(v, &end, 10);
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
	if (!model || (!plan && !prompt == !prompt_ids) || (prompt && prompt_ids)) {
		usage();
		return CLI_EXIT_USAGE;
	}
	if (score && xo.parallel.tensor_parallel_size > 1) {
		fprintf(stderr, "dsv4 generate: --prompt-logprobs runs one rank (leave out --tensor-parallel-size)\n");
		return CLI_EXIT_USAGE;
	}
	char tiny_dir[4096];
	if (!strcmp(model, "tiny")) {
		if (load_args_model_dir(model, tiny_dir, sizeof tiny_dir))
			return CLI_EXIT_FAIL;
		model = tiny_dir;
	}

	int rc = CLI_EXIT_FAIL;
	struct err e = {0};
	struct model_checkpoint *ck = NULL;
	struct model_exec_open *mx = NULL;
	struct model_exec_cpu *x = NULL;
	struct model_tokenizer *tok = NULL;
	int32_t *ids = NULL, *all = NULL;
	uint32_t *blocks = NULL;
	size_t n_prompt = 0;
	char *text = NULL;
	struct model_checkpoint_options co = load_opts; /* dummy-load */
	co.dir = model;
	if (model_checkpoint_create(&ck, &co, &e)) {
		fprintf(stderr, "dsv4 generate: %s\n", e.msg);
		goto out;
	}
	if (model_tokenizer_load(&tok, model, &e)) {
		if (prompt) {
			fprintf(stderr, "dsv4 generate: tokenizer: %s\n", e.msg);
			goto out;
		}
		tok = NULL;
	}
	if (prompt_ids && parse_ids(prompt_ids, &ids, &n_prompt)) {
		fprintf(stderr, "dsv4 generate: --prompt-ids wants comma-separated token ids\n");
		rc = CLI_EXIT_USAGE;
		goto out;
	}
	if (prompt) {
		int32_t *enc = NULL;
		size_t n_enc = 0;
		if (model_tokenizer_encode_alloc(tok, prompt, strlen(prompt), MODEL_TOK_ADDED_ALL, &enc, &n_enc, &e)) {
			fprintf(stderr, "dsv4 generate: encode: %s\n", e.msg);
			goto out;
		}
		int32_t bos = model_tokenizer_bos_id(tok);
		bool add_bos = bos >= 0 && (n_enc == 0 || enc[0] != bos);
		ids = malloc((n_enc + 1) * sizeof *ids);
		if (!ids) {
			free(enc);
			goto out;
		}
		n_prompt = 0;
		if (add_bos)
			ids[n_prompt++] = bos;
		if (n_enc)
			memcpy(ids + n_prompt, enc, n_enc * sizeof *ids);
		n_prompt += n_enc;
		free(enc);
	}
	if (score)
		max_tokens = 0;
	uint32_t total = (uint32_t)(n_prompt + (size_t)max_tokens);
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
	if (plan) {
		size_t need = model_exec_cpu_plan_str(x, NULL, 0);
		char *buf = malloc(need + 1);
		if (buf) {
			model_exec_cpu_plan_str(x, buf, need + 1);
			fputs(buf, stdout);
			free(buf);
		}
		if (!prompt && !prompt_ids) {
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
	if (!all || !blocks)
		goto out;
	memcpy(all, ids, n_prompt * sizeof *all);
	for (uint32_t k = 0; k < total / B + 2; k++)
		blocks[k] = k;
	struct kern_sampling_params sp = {.temperature = (float)temperature, .top_p = 1, .repetition_penalty = 1,
					  .seed = seed};
	uint32_t done = 0, len = (uint32_t)n_prompt, n_out = 0;
	int32_t *pos = malloc((size_t)ex->info.max_step_tokens * sizeof *pos);
	if (!pos)
		goto out;
	if (score) {
		rc = score_prompt(x, ids, (uint32_t)n_prompt, pos, blocks, &e) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
		if (rc)
			fprintf(stderr, "dsv4 generate: %s\n", e.msg);
		free(pos);
		goto out;
	}
	double t_start = clock_s(CLOCK_MONOTONIC), t_first = t_start;
	double c_start = clock_s(CLOCK_PROCESS_CPUTIME_ID), c_first = c_start;
	while (n_out < (uint32_t)max_tokens) {
		uint32_t q = len - done;
		if (q > ex->info.max_step_tokens)
			q = ex->info.max_step_tokens;
		bool last = done + q == len;
		for (uint32_t k = 0; k < q; k++)
			pos[k] = (int32_t)(done + k);
		struct exec_seq es = {.seq_id = 1, .n_cached_tokens = done, .n_context_tokens = done + q,
				      .n_blocks = (done + q + B - 1) / B, .sample = last, .sampling = &sp,
				      .prompt_ids = ids, .n_prompt = (uint32_t)n_prompt, .output_ids = all + n_prompt,
				      .n_output = n_out};
		uint32_t qs[2] = {0, q};
		struct exec_step step = {.n_tokens = q, .token_ids = all + done, .positions = pos, .n_seqs = 1,
					 .seqs = &es, .query_start = qs, .block_ids = blocks, .n_block_ids = es.n_blocks,
					 .n_sample = last ? 1 : 0};
		struct exec_sample smp;
		if (ex->ops->step(ex->ctx, &step, &smp, &e)) {
			fprintf(stderr, "dsv4 generate: step: %s\n", e.msg);
			free(pos);
			goto out;
		}
		done += q;
		if (!last)
			continue;
		all[len++] = smp.out.token_id;
		if (n_out++ == 0) {
			t_first = clock_s(CLOCK_MONOTONIC);
			c_first = clock_s(CLOCK_PROCESS_CPUTIME_ID);
		}
		if (smp.out.token_id == ex->info.eos_token_id)
			break;
	}
	double t_end = clock_s(CLOCK_MONOTONIC), c_end = clock_s(CLOCK_PROCESS_CPUTIME_ID);
	free(pos);
	printf("prompt_ids:");
	for (size_t i = 0; i < n_prompt; i++)
		printf(" %d", ids[i]);
	printf("\noutput_ids:");
	for (uint32_t i = 0; i < n_out; i++)
		printf(" %d", all[n_prompt + i]);
	printf("\n");
	if (tok) {
		size_t tl = 0;
		if (model_tokenizer_decode(tok, all + n_prompt, n_out, 0, &text, &tl, &e) == ST_OK)
			printf("text: %s\n", text);
	}
	/* prefill: the prompt up to the first sampled token; decode: the rest */
	uint32_t n_pre = n_out ? (uint32_t)n_prompt : 0, n_dec = n_out > 1 ? n_out - 1 : 0;
	double s_pre = n_out ? t_first - t_start : 0, s_dec = n_out > 1 ? t_end - t_first : 0;
	double cpu_pre = n_out ? c_first - c_start : 0, cpu_dec = n_out > 1 ? c_end - c_first : 0;
	printf("prefill: %u tokens in %.3f s, %.1f tokens/s, cpu %.3f s\n", n_pre, s_pre,
	       s_pre > 0 ? n_pre / s_pre : 0.0, cpu_pre);
	printf("decode: %u tokens in %.3f s, %.1f tokens/s, cpu %.3f s\n", n_dec, s_dec,
	       s_dec > 0 ? n_dec / s_dec : 0.0, cpu_dec);
	rc = CLI_EXIT_OK;
out:
	free(text);
	free(all);
	free(blocks);
	free(ids);
	model_exec_open_destroy(mx);
	model_tokenizer_destroy(tok);
	model_checkpoint_destroy(ck);
	return rc;
}
