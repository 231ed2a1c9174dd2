/*
 * server/cmd_bench.c: `dsv4 bench decode`, the decode benchmark of the
 * decode-roofline issue: how close a decode step comes to the memory
 * bandwidth it must spend, per context length and batch size.
 *
 *   dsv4 bench decode --model DIR [--load-format dummy] [--hf-overrides JSON]
 *                     [--device auto|cuda|cpu] [--contexts 1024,32768]
 *                     [--batches 1,2,4,8,16,32,64] [--steps 16] [--warmup 3]
 *                     [--prefixes 8] [--chunk 2048] [--json FILE] [--profile]
 *                     [--enforce-eager]
 *
 * It opens the executor as `dsv4 generate` does, then for every context C
 * (rounded up to a multiple of the block size) fills the state by a real
 * prefill of --prefixes distinct random prompts of C tokens (in chunks of
 * --chunk tokens), and for every batch size b runs b sequences that continue
 * from those prompts (sequence i from prompt i mod prefixes: the prompt's
 * complete blocks shared as the prefix cache shares them, its own tail block)
 * for --warmup untimed and --steps timed decode steps (one token per
 * sequence, greedy sampling on the executor, the sampled token fed back),
 * as serving runs them (CUDA graphs on one GPU unless --enforce-eager).
 * Then the same sequences run again for one warm and one profiled step with
 * the registry's profiling hook active (kern_profile_install): every op is
 * timed with a device synchronisation around it, and the routing op's
 * expert ids are copied out, so the bytes the step must read count the
 * routed experts its tokens actually chose. A graph replay calls no host
 * code, so when the timed executor uses graphs the profiled steps run on a
 * second, eager executor opened after it (the prompts prefilled again).
 *
 * Bytes a step must read (as stored): every tensor of every layer except the
 * routed experts (attention, compressors, indexer, mHC, norms, gate, shared
 * expert; tid2eid only the rows of the step's tokens), the distinct routed
 * experts each layer's tokens chose (from the profiled step), the head and
 * final norms, the embedding rows of the step's tokens; plus the state rows
 * attention reads at the mean context of the timed steps, in the executor's
 * own row sizes (exec_info.mix): the sliding ring, CSA the top-k compressed
 * rows and every indexer key, HCA every compressed row, the open compressor
 * windows. That over the median step time is compared with the read
 * bandwidth measured in the same run (the read kernel of bench_kernels on a
 * GPU, a summing loop over host memory on the CPU).
 *
 * Derived (labelled so): the full model (num_hidden_layers and
 * compress_ratios of config.json as written, before --hf-overrides) from
 * the measured layers of each kind (per-layer shares of the step from the
 * profile, scaled to the unprofiled step time), and a 2 x GB10 TP=2
 * projection: bytes per rank per step (weights halved, state replicated) at
 * --gb10-gbps and the efficiency measured here, plus one all-reduce per
 * sublayer (--ar-latency-us + bytes / --ar-gbps), beside vLLM's published
 * 26.4 tokens/s. Prints a markdown table (and with --profile or
 * DSV4_PROFILE=1 the per-op breakdown of every configuration); --json FILE
 * writes everything.
 *
 * This file holds the options and the walk over contexts and batch sizes;
 * server/bench_decode.h names the modules that run the steps, profile them,
 * count the bytes and write the report.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kernels/device/graph.h"
#include "kernels/registry/registry.h"
#include "model/checkpoint.h"
#include "model/exec_cpu.h"
#include "model/exec_open.h"
#include "server/bench_decode.h"
#include "server/load_args.h"

/* ---- arguments ---- */

static void usage(void)
{
	fprintf(stderr,
		"usage: dsv4 bench decode --model DIR [--device auto|cuda|cpu] [--contexts 1024,32768]\n"
		"                         [--batches 1,2,4,8,16,32,64] [--steps N] [--warmup N] [--prefixes N]\n"
		"                         [--chunk TOKENS] [--json FILE] [--profile] [--enforce-eager]\n"
		"                         [--precision reference|fp32]\n"
		"                         [--seed N] [--bw-mib MIB] [--gpu-memory-utilization F]\n"
		"                         [--gb10-gbps 273] [--ar-latency-us 20] [--ar-gbps 25]\n%s",
		load_args_usage());
}

static int parse_list(const char *s, uint32_t *out, int *n)
{
	*n = 0;
	while (*s) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(s, &end, 10);
		if (end == s || errno || v == 0 || v > (1ul << 24) || *n == BENCH_MAX_LIST)
			return -1;
		if (*end == 'k' || *end == 'K') {
			v *= 1024;
			end++;
		}
		out[(*n)++] = (uint32_t)v;
		s = end;
		if (*s == ',')
			s++;
		else if (*s)
			return -1;
	}
	return *n ? 0 : -1;
}

static int parse_args(int argc, char **argv, struct bench_opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--profile")) {
			o->profile = true;
			continue;
		}
		if (!strcmp(a, "--enforce-eager")) {
			o->enforce_eager = true;
			continue;
		}
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return -1;
		}
		if (!v) {
			fprintf(stderr, "dsv4 bench decode: %s needs a value\n", a);
			return CLI_EXIT_USAGE;
		}
		char *end = NULL;
		double d = 0;
		unsigned long long u = 0;
		bool ok = true;
		if (!strcmp(a, "--model"))
			o->model = v;
		else if (!strcmp(a, "--device"))
			o->device = v;
		else if (!strcmp(a, "--json"))
			o->json = v;
		else if (!strcmp(a, "--precision"))
			o->prec = v;
		else if (!strcmp(a, "--contexts"))
			ok = !parse_list(v, o->contexts, &o->n_contexts);
		else if (!strcmp(a, "--batches"))
			ok = !parse_list(v, o->batches, &o->n_batches);
		else if (!strcmp(a, "--steps") || !strcmp(a, "--warmup") || !strcmp(a, "--prefixes") ||
			 !strcmp(a, "--chunk") || !strcmp(a, "--seed") || !strcmp(a, "--bw-mib")) {
			errno = 0;
			u = strtoull(v, &end, 10);
			ok = !errno && *end == '\0' && v[0] != '-' && u < (1ull << 31);
			if (!strcmp(a, "--steps"))
				o->steps = (uint32_t)u, ok = ok && u > 0;
			else if (!strcmp(a, "--warmup"))
				o->warmup = (uint32_t)u;
			else if (!strcmp(a, "--prefixes"))
				o->prefixes = (uint32_t)u, ok = ok && u > 0;
			else if (!strcmp(a, "--chunk"))
				o->chunk = (uint32_t)u, ok = ok && u > 0;
			else if (!strcmp(a, "--bw-mib"))
				o->bw_mib = (uint32_t)u, ok = ok && u > 0;
			else
				o->seed = u;
		} else if (!strcmp(a, "--gb10-gbps") || !strcmp(a, "--ar-latency-us") || !strcmp(a, "--ar-gbps") ||
			   !strcmp(a, "--gpu-memory-utilization")) {
			d = strtod(v, &end);
			ok = *end == '\0' && d > 0;
			if (!strcmp(a, "--gb10-gbps"))
				o->gb10_gbps = d;
			else if (!strcmp(a, "--ar-latency-us"))
				o->ar_latency_us = d;
			else if (!strcmp(a, "--ar-gbps"))
				o->ar_gbps = d;
			else
				o->gpu_util = d, ok = ok && d <= 1;
		} else {
			fprintf(stderr, "dsv4 bench decode: unknown option %s\n", a);
			usage();
			return CLI_EXIT_USAGE;
		}
		if (!ok) {
			fprintf(stderr, "dsv4 bench decode: bad value for %s: %s\n", a, v);
			return CLI_EXIT_USAGE;
		}
		i++;
	}
	if (!o->model) {
		usage();
		return CLI_EXIT_USAGE;
	}
	return 0;
}

/* ---- the command ---- */

/* What measuring a configuration needs besides the executor: fixed for the run,
 * but for n_rs, the configurations the timed pass has reached. */
struct decode_env {
	struct model_exec_open_options *xo; /* reopened eager for the profile pass */
	uint32_t B, max_b;
	bool graphs;                         /* the timed executor replays CUDA graphs */
	double bw;                           /* read bandwidth measured in this run, GB/s */
	const struct model_bytes *mb;
	const struct full_cfg *full;
	int L;
	struct result *rs;                   /* [n_contexts][n_batches] */
	int n_rs;
};

/* The block size rounds the contexts and sizes the CPU pool: 256 raised to the
 * sliding window and to a multiple of every compress ratio (the executor's own
 * default rule), passed explicitly and checked against what the executor reports. */
static uint32_t block_tokens_of(const struct model_config *cfg)
{
	uint32_t B = 256;
	if (B < (uint32_t)cfg->sliding_window)
		B = (uint32_t)cfg->sliding_window;
	for (bool again = true; again;) {
		again = false;
		for (int l = 0; l < cfg->n_layers_total; l++) {
			uint32_t m = (uint32_t)cfg->compress_ratios[l];
			if (m && B % m) {
				B = (B / m + 1) * m;
				again = true;
			}
		}
	}
	return B;
}

/* One batch size at context C: the timed steps (pass 0), then, unless skipped or
 * left to the eager pass, the profiled step, the bytes it read and what they
 * derive. 0, or -1 once the reason is printed. */
static int measure_batch(struct bench *b, const struct decode_env *env, int pass, uint32_t C, uint32_t np,
			 struct result *r)
{
	struct err e = {0};
	const struct prof *prof = b->prof;
	if (pass == 0 && bench__decode_run(b, C, np, r->batch, false, r, &e)) {
		fprintf(stderr, "dsv4 bench decode: context %u batch %u: %s\n", C, r->batch, e.msg);
		return -1;
	}
	if (r->skipped || (pass == 0 && env->graphs))
		return 0;
	if (bench__decode_run(b, C, np, r->batch, true, r, &e)) {
		fprintf(stderr, "dsv4 bench decode: context %u batch %u, profiled step: %s\n", C, r->batch, e.msg);
		return -1;
	}
	if (r->skipped)
		return 0;
	if (prof->failed || prof->n_route == 0) {
		fprintf(stderr, "dsv4 bench decode: context %u batch %u: the profiled step captured %d routing calls%s\n",
			C, r->batch, prof->n_route, prof->failed ? " (a capture failed)" : "");
		return -1;
	}
	if (bench__summarise_profile(prof, r, &e)) {
		fprintf(stderr, "dsv4 bench decode: %s\n", e.msg);
		return -1;
	}
	bench__count_bytes(b, env->mb, env->L, r);
	r->gbps = (double)r->b_total / (r->ms_median * 1e-3) / 1e9;
	r->frac = env->bw > 0 ? r->gbps / env->bw : 0;
	bench__derive(b->o, b->cfg, &b->ex->info, env->mb, env->full, env->L, r);
	printf("  batch %u: %.3f ms/step, %.1f tokens/s, %.1f MB/step, %.1f %% of the read bandwidth\n", r->batch,
	       r->ms_median, r->tok_s, r->b_total / 1e6, 100 * r->frac);
	fflush(stdout);
	return 0;
}

/* Context ci: fresh random prompts prefilled, then every batch size continues
 * from them. 0, or -1 once the reason is printed. */
static int measure_context(struct bench *b, struct decode_env *env, int pass, int ci, uint64_t *rs_seed)
{
	const struct bench_opts *o = b->o;
	struct err e = {0};
	uint32_t C = (o->contexts[ci] + b->B - 1) / b->B * b->B;
	uint32_t np = o->prefixes < env->max_b ? o->prefixes : env->max_b;
	for (size_t i = 0; i < (size_t)np * C; i++)
		b->prompts[i] = (int32_t)(bench__rng_next(rs_seed) % (b->ex->info.vocab_size - 2)) + 2;
	for (uint32_t i = 0; i < np * (C / b->B); i++)
		b->block_ids[i] = i;
	double pre_tok_s = 0;
	if (np * (C / b->B) + 1 > b->ex->info.n_blocks) {
		fprintf(stderr, "dsv4 bench decode: context %u: %u prompts need %u blocks, the pool has %u\n", C, np,
			np * (C / b->B), b->ex->info.n_blocks);
		return -1;
	}
	if (bench__prefill(b, C, np, &pre_tok_s, &e)) {
		fprintf(stderr, "dsv4 bench decode: prefill of %u tokens: %s\n", C, e.msg);
		return -1;
	}
	if (pass == 0)
		printf("context %u: %u prompt(s) prefilled at %.1f tokens/s\n", C, np, pre_tok_s);
	fflush(stdout);
	for (int bi = 0; bi < o->n_batches; bi++) {
		struct result *r = &env->rs[ci * o->n_batches + bi];
		if (pass == 0) {
			env->n_rs++;
			r->ctx = C;
			r->batch = o->batches[bi];
		}
		if (measure_batch(b, env, pass, C, np, r))
			return -1;
	}
	return 0;
}

/* pass 0: the timed steps (and, on an eager executor, the profiled ones);
 * pass 1 (CUDA graphs only): a second executor, eager, for the profiled steps.
 * 0, or -1 once the reason is printed. */
static int run_passes(struct bench *b, struct decode_env *env)
{
	struct err e = {0};
	for (int pass = 0; pass < (env->graphs ? 2 : 1); pass++) {
		if (pass == 1) {
			model_exec_open_destroy(b->mx);
			b->mx = NULL;
			env->xo->enforce_eager = true;
			if (bench__open(b, env->xo, env->B, &e)) {
				fprintf(stderr, "dsv4 bench decode: the eager executor for the profile: %s\n", e.msg);
				return -1;
			}
			printf("profiling on an eager executor\n");
		}
		uint64_t rs_seed = b->o->seed;
		for (int ci = 0; ci < b->o->n_contexts; ci++)
			if (measure_context(b, env, pass, ci, &rs_seed))
				return -1;
	}
	return 0;
}

static int bench_decode(int argc, char **argv)
{
	struct model_checkpoint_options co = {0};
	if (load_args_extract(&argc, argv, "bench decode", false, &co))
		return CLI_EXIT_USAGE;
	struct bench_opts o = {.device = "auto", .prec = "reference", .steps = 16, .warmup = 3, .prefixes = 8,
			       .chunk = 2048, .bw_mib = 1024, .seed = 1, .gb10_gbps = 273, .ar_latency_us = 20,
			       .ar_gbps = 25, .contexts = {1024, 32768}, .n_contexts = 2,
			       .batches = {1, 2, 4, 8, 16, 32, 64}, .n_batches = 7};
	int rc = parse_args(argc, argv, &o);
	if (rc)
		return rc < 0 ? CLI_EXIT_OK : rc;
	const char *pe = getenv("DSV4_PROFILE");
	if (pe && *pe && strcmp(pe, "0"))
		o.profile = true;
	enum model_precision precision;
	if (!strcmp(o.prec, "reference"))
		precision = MODEL_PREC_REFERENCE;
	else if (!strcmp(o.prec, "fp32"))
		precision = MODEL_PREC_FP32;
	else {
		fprintf(stderr, "dsv4 bench decode: --precision must be reference or fp32\n");
		return CLI_EXIT_USAGE;
	}
	uint32_t max_b = 0, max_c = 0;
	for (int i = 0; i < o.n_batches; i++)
		max_b = o.batches[i] > max_b ? o.batches[i] : max_b;
	for (int i = 0; i < o.n_contexts; i++)
		max_c = o.contexts[i] > max_c ? o.contexts[i] : max_c;

	rc = CLI_EXIT_FAIL;
	struct err e = {0};
	struct model_checkpoint *ck = NULL;
	struct prof prof = {0};
	struct result *rs = NULL;
	struct bench b = {.o = &o, .prof = &prof};
	struct decode_env env = {0};
	struct kern_profile_hooks hooks = {.user = &prof, .before = bench__prof_before, .after = bench__prof_after};
	co.dir = o.model;
	if (model_checkpoint_create(&ck, &co, &e)) {
		fprintf(stderr, "dsv4 bench decode: %s\n", e.msg);
		goto out;
	}
	b.cfg = model_checkpoint_config(ck);
	int L = (int)b.cfg->num_hidden_layers;
	if (L > BENCH_MAX_LAYERS) {
		fprintf(stderr, "dsv4 bench decode: more than %d layers\n", BENCH_MAX_LAYERS);
		goto out;
	}
	struct kern_disabled disabled;
	if (kern_disabled_init(&disabled, NULL, true, &e)) {
		fprintf(stderr, "dsv4 bench decode: DSV4_DISABLED_KERNELS: %s\n", e.msg);
		goto out;
	}
	struct kern_device dev;
	if (model_exec_device(o.device, &dev, &e)) {
		fprintf(stderr, "dsv4 bench decode: --device %s: %s\n", o.device, e.msg);
		goto out;
	}
	bool gpu = dev.index >= 0;
	uint32_t T = o.chunk > max_b ? o.chunk : max_b;
	uint32_t n_steps = o.warmup + o.steps > 2 ? o.warmup + o.steps : 2;
	uint32_t B = block_tokens_of(b.cfg);
	uint32_t max_c_r = (max_c + B - 1) / B * B;
	uint32_t nb = o.prefixes * (max_c_r / B) + max_b * ((n_steps + B - 1) / B + 1) + 2;
	/* the registry's hook: every variant the plan selects runs through it (inactive but for the
	 * profiled step of each configuration) */
	kern_profile_install(&hooks);
	struct model_exec_open_options xo = {.ck = ck, .device = o.device, .block_tokens = B, .n_blocks = gpu ? 0 : nb,
					     .max_step_tokens = T, .max_step_seqs = max_b,
					     .max_model_len = max_c_r + n_steps + B, .precision = precision,
					     .disabled = &disabled, .gpu_memory_utilization = o.gpu_util,
					     .enforce_eager = o.enforce_eager};
	if (bench__open(&b, &xo, B, &e)) {
		fprintf(stderr, "dsv4 bench decode: %s\n", e.msg);
		goto out;
	}
	struct kern_graph_stats gs;
	bool graphs = model_exec_cpu_graph_stats(model_exec_open_cpu(b.mx), &gs);
	prof = (struct prof){.gpu = gpu, .n_layers = L, .top_k = (int)b.cfg->num_experts_per_tok,
			     .n_experts = (int)b.cfg->n_routed_experts, .ids_cap = (int64_t)max_b * b.cfg->num_experts_per_tok};
	prof.ids = calloc((size_t)L * (size_t)prof.ids_cap + 1, sizeof *prof.ids);
	prof.ids_n = calloc((size_t)L + 1, sizeof *prof.ids_n);
	b.prompts = malloc((size_t)o.prefixes * max_c_r * sizeof *b.prompts);
	b.block_ids = malloc((size_t)o.prefixes * (max_c_r / B) * sizeof *b.block_ids);
	rs = calloc((size_t)o.n_contexts * o.n_batches, sizeof *rs);
	if (!prof.ids || !prof.ids_n || !b.prompts || !b.block_ids || !rs) {
		fprintf(stderr, "dsv4 bench decode: out of memory\n");
		goto out;
	}
	double bw = 0;
	if (bench__read_bw(gpu, gpu ? o.bw_mib : (o.bw_mib < 256 ? o.bw_mib : 256), &bw, &e)) {
		fprintf(stderr, "dsv4 bench decode: %s\n", e.msg);
		goto out;
	}
	struct model_bytes mb;
	bench__model_bytes_of(ck, &mb);
	struct full_cfg full;
	bench__full_model(o.model, b.cfg, &full);
	printf("dsv4 bench decode: %s, %d layer(s) measured (full model: %d), %s, blocks of %u tokens, pool %u "
	       "blocks, %s, %s\n",
	       o.model, L, full.n_layers, gpu ? dev.name : "CPU", b.B, b.ex->info.n_blocks,
	       model_checkpoint_is_dummy(ck) ? "dummy weights" : "checkpoint weights",
	       graphs ? "decode steps as CUDA graphs (the profiled steps run on a second, eager executor)" : "eager");
	env = (struct decode_env){.xo = &xo, .B = B, .max_b = max_b, .graphs = graphs, .bw = bw, .mb = &mb,
				  .full = &full, .L = L, .rs = rs};
	if (run_passes(&b, &env))
		goto out;
	bench__print_table(&o, rs, env.n_rs, L, full.n_layers, bw, gpu);
	if (o.profile)
		for (int i = 0; i < env.n_rs; i++)
			if (!rs[i].skipped)
				bench__print_profile(&rs[i], L);
	struct bench_run_info info = {.device = gpu ? dev.name : "cpu", .dummy_weights = model_checkpoint_is_dummy(ck),
				      .layers_measured = L, .layers_full = full.n_layers, .block_tokens = b.B,
				      .read_bw_gbps = bw};
	if (o.json && bench__write_json(&o, &info, rs, env.n_rs))
		goto out;
	rc = CLI_EXIT_OK;
out:
	model_exec_open_destroy(b.mx);
	kern_profile_install(NULL);
	model_checkpoint_destroy(ck);
	for (int i = 0; i < env.n_rs; i++)
		free(rs[i].ops);
	free(rs);
	free(prof.recs);
	free(prof.ids);
	free(prof.ids_n);
	free(b.prompts);
	free(b.block_ids);
	return rc;
}

int cmd_bench(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		fprintf(stderr, "usage: dsv4 bench decode [options]   (dsv4 bench decode --help)\n");
		return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
	}
	if (!strcmp(argv[1], "decode"))
		return bench_decode(argc - 1, argv + 1);
	fprintf(stderr, "dsv4 bench: unknown benchmark '%s' (decode)\n", argv[1]);
	return CLI_EXIT_USAGE;
}
