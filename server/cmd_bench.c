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
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli.h"
#include "common/log.h"
#include "dsv4_config.h"
#include "kernels/hc/hc.h"
#include "kernels/linear/linear.h"
#include "kernels/registry/registry.h"
#include "kernels/routing/routing.h"
#include "model/checkpoint.h"
#include "kernels/device/graph.h"
#include "model/exec_cpu.h"
#include "model/exec_open.h"
#include "server/load_args.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/moe_gemm/moe_gemv.h"
#endif

#define BENCH_MAX_LIST 32
#define BENCH_MAX_LAYERS 128

/* 2 x GB10 reference points (docs/perf.md): vLLM stock, and its forks */
#define VLLM_GB10_TOKS 26.4

struct bench_opts {
	const char *model, *device, *json, *prec;
	uint32_t contexts[BENCH_MAX_LIST], batches[BENCH_MAX_LIST];
	int n_contexts, n_batches;
	uint32_t steps, warmup, prefixes, chunk, bw_mib;
	uint64_t seed;
	bool profile, enforce_eager;
	double gb10_gbps, ar_latency_us, ar_gbps, gpu_util;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* ---- the profiling hook's user side ---- */

struct prof_rec {
	const char *op, *variant;
	int layer;        /* -1: embedding; 0..L-1; L: head and sampling */
	double us;
	int64_t rows, cols; /* linear: the weight's shape */
};

struct prof {
	bool gpu, timing;
	int n_layers, top_k, n_experts;
	int n_post, n_route;
	double t0;
	struct prof_rec *recs;
	int n_recs, cap_recs;
	int32_t *ids;       /* [n_layers][max_tokens * top_k] chosen experts */
	int64_t *ids_n;     /* [n_layers] entries captured */
	int64_t ids_cap;    /* entries per layer */
	bool failed;
};

static void prof_sync(const struct prof *p)
{
#if DSV4_HAVE_CUDA
	if (p->gpu)
		cudaDeviceSynchronize();
#else
	(void)p;
#endif
}

static void prof_before(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args)
{
	struct prof *p = u;
	(void)op;
	(void)base;
	(void)args;
	if (!p->timing)
		return;
	prof_sync(p);
	p->t0 = now_s();
}

static void prof_after(void *u, const struct kern_op *op, const struct kern_variant *base, const void *args,
		       enum status st)
{
	struct prof *p = u;
	int layer = p->n_post / 2 < p->n_layers ? p->n_post / 2 : p->n_layers;
	if (!strcmp(op->name, "embed"))
		layer = -1;
	if (p->timing) {
		prof_sync(p);
		double us = (now_s() - p->t0) * 1e6;
		if (p->n_recs == p->cap_recs) {
			int cap = p->cap_recs ? 2 * p->cap_recs : 256;
			struct prof_rec *r = realloc(p->recs, (size_t)cap * sizeof *r);
			if (!r) {
				p->failed = true;
				return;
			}
			p->recs = r;
			p->cap_recs = cap;
		}
		struct prof_rec *r = &p->recs[p->n_recs++];
		*r = (struct prof_rec){.op = op->name, .variant = base->name, .layer = layer, .us = us};
		if (!strcmp(op->name, "linear")) {
			const struct kern_linear_args *a = args;
			r->rows = a->w ? a->w->rows : 0;
			r->cols = a->w ? a->w->cols : 0;
		}
	}
	if (!strcmp(op->name, "hc_post"))
		p->n_post++;
	if (!strcmp(op->name, "route") && st == ST_OK && layer >= 0 && layer < p->n_layers) {
		const struct kern_route_args *a = args;
		int64_t n = a->n_tokens * a->top_k;
		if (n > p->ids_cap || a->top_k != p->top_k) {
			p->failed = true;
			return;
		}
		int32_t *dst = p->ids + (size_t)layer * (size_t)p->ids_cap;
#if DSV4_HAVE_CUDA
		if (p->gpu) {
			cudaDeviceSynchronize();
			if (cudaMemcpy(dst, a->expert_ids, (size_t)n * sizeof *dst, cudaMemcpyDeviceToHost) != cudaSuccess)
				p->failed = true;
		} else
#endif
			memcpy(dst, a->expert_ids, (size_t)n * sizeof *dst);
		p->ids_n[layer] = n;
		p->n_route++;
	}
}

/* ---- read bandwidth, measured in this run ---- */

static enum status read_bw(bool gpu, uint32_t mib, double *gbps, struct err *e)
{
	size_t bytes = (size_t)mib << 20;
	*gbps = 0;
#if DSV4_HAVE_CUDA
	if (gpu) {
		void *src = NULL, *sink = NULL;
		if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&sink, 1 << 16) != cudaSuccess) {
			cudaFree(src);
			cudaGetLastError();
			return err_set(e, ST_NOMEM, "read bandwidth: cudaMalloc of %u MiB failed", mib);
		}
		cudaMemset(src, 0x5a, bytes);
		double best = 0;
		enum status st = ST_OK;
		for (int i = 0; i < 8 && !st; i++) {
			cudaDeviceSynchronize();
			double t0 = now_s();
			st = kern_moe_gemv_bench_read(src, bytes, sink, NULL);
			cudaDeviceSynchronize();
			double dt = now_s() - t0;
			if (i >= 2 && (best == 0 || dt < best))
				best = dt;
		}
		cudaFree(src);
		cudaFree(sink);
		if (st)
			return err_set(e, st, "read bandwidth: the read kernel failed");
		*gbps = (double)bytes / best / 1e9;
		return ST_OK;
	}
#else
	(void)gpu;
#endif
	uint64_t *buf = malloc(bytes);
	if (!buf)
		return err_set(e, ST_NOMEM, "read bandwidth: %u MiB", mib);
	size_t n = bytes / sizeof *buf;
	for (size_t i = 0; i < n; i++)
		buf[i] = i * 0x9E3779B97F4A7C15ull;
	double best = 0;
	volatile uint64_t sink = 0;
	for (int r = 0; r < 4; r++) {
		double t0 = now_s();
		uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
		for (size_t i = 0; i + 3 < n; i += 4) {
			a0 += buf[i];
			a1 ^= buf[i + 1];
			a2 += buf[i + 2];
			a3 ^= buf[i + 3];
		}
		sink = sink + (a0 ^ a1 ^ a2 ^ a3);
		double dt = now_s() - t0;
		if (r >= 1 && (best == 0 || dt < best))
			best = dt;
	}
	free(buf);
	*gbps = (double)bytes / best / 1e9;
	return ST_OK;
}

/* ---- what a step must read ---- */

struct layer_bytes {
	int ratio;              /* 0 sliding, else the compress ratio */
	uint64_t dense;         /* every tensor of the layer but the routed experts and tid2eid */
	uint64_t tid2eid_row;   /* bytes of one tid2eid row, 0 = not a hash layer */
	uint64_t expert;        /* one routed expert (w1 + w2 + w3 with scales) */
};

struct model_bytes {
	int n_layers;
	struct layer_bytes layer[BENCH_MAX_LAYERS];
	uint64_t global;        /* head, final norm, head mHC */
	uint64_t embed_row;     /* one embedding row */
};

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

static void model_bytes_of(const struct model_checkpoint *ck, struct model_bytes *mb)
{
	const struct model_config *cfg = model_checkpoint_config(ck);
	memset(mb, 0, sizeof *mb);
	mb->n_layers = (int)cfg->num_hidden_layers < BENCH_MAX_LAYERS ? (int)cfg->num_hidden_layers : BENCH_MAX_LAYERS;
	for (int l = 0; l < mb->n_layers; l++)
		mb->layer[l].ratio = cfg->compress_ratios[l];
	for (size_t i = 0; i < model_checkpoint_n_tensors(ck); i++) {
		const struct model_tensor *t = model_checkpoint_tensor_at(ck, i);
		if (t->layer < 0) {
			if (strstr(t->name, "embed"))
				mb->embed_row = t->shape[0] ? t->n_bytes / (uint64_t)t->shape[0] : 0;
			else
				mb->global += t->n_bytes;
			continue;
		}
		if (t->layer >= mb->n_layers)
			continue; /* MTP */
		struct layer_bytes *lb = &mb->layer[t->layer];
		if (t->group == MODEL_GROUP_ROUTED_EXPERTS) {
			/* expert 0 stands for every expert of the layer (same shapes and formats) */
			const char *x = strstr(t->name, ".experts.");
			if (x && !strncmp(x, ".experts.0.", 11))
				lb->expert += t->n_bytes;
		} else if (ends_with(t->name, "tid2eid")) {
			lb->tid2eid_row = t->shape[0] ? t->n_bytes / (uint64_t)t->shape[0] : 0;
		} else {
			lb->dense += t->n_bytes;
		}
	}
}

/* State bytes one sequence's attention reads in one layer at context c. */
static uint64_t state_bytes(const struct exec_info *in, const struct model_config *cfg, int ratio, uint64_t c)
{
	const struct exec_layer_mix *m = &in->mix;
	const struct exec_layer_kind *k = ratio == 0 ? &m->swa : ratio == (int)m->csa.compress_ratio ? &m->csa : &m->hca;
	uint64_t ring = c < m->sliding_window ? c : m->sliding_window;
	uint64_t b = ring * k->ring_entry_bytes;
	if (ratio > 0) {
		uint64_t rows = c / (uint64_t)ratio;
		uint64_t attended = k->indexer_entry_bytes && rows > (uint64_t)cfg->index_topk ? (uint64_t)cfg->index_topk
											 : rows;
		b += attended * k->kv_entry_bytes + rows * k->indexer_entry_bytes;
		b += (uint64_t)(k->overlap ? 2 : 1) * (uint64_t)ratio * k->compressor_token_bytes;
	}
	return b;
}

/* ---- one configuration ---- */

struct op_sum {
	const char *op, *variant;
	int64_t rows, cols;
	int calls;
	double us;
};

struct result {
	uint32_t ctx, batch;
	bool skipped;
	char why[160];
	double ms_median, ms_mean, ms_min, tok_s;
	double ctx_mean;
	uint64_t b_dense, b_experts, b_global, b_state, b_total;
	double experts_per_layer;
	double gbps, frac;
	/* profile */
	double prof_total_us, prof_layer_us[BENCH_MAX_LAYERS + 2]; /* [0] embed, [1+l] layer l, [1+L] head */
	struct op_sum *ops;
	int n_ops;
	/* derived */
	double full_ms, full_tok_s, full_frac;
	uint64_t full_bytes, full_state;
	double gb10_tok_s, gb10_ms, gb10_rank_bytes;
};

struct full_cfg {
	int n_layers;
	int32_t ratios[BENCH_MAX_LAYERS];
};

static int op_sum_cmp(const void *a, const void *b)
{
	double x = ((const struct op_sum *)a)->us, y = ((const struct op_sum *)b)->us;
	return x < y ? 1 : x > y ? -1 : 0;
}

static enum status summarise_profile(const struct prof *p, struct result *r, struct err *e)
{
	int L = p->n_layers;
	r->ops = calloc((size_t)p->n_recs + 1, sizeof *r->ops);
	if (!r->ops)
		return err_set(e, ST_NOMEM, "profile summary");
	for (int i = 0; i < p->n_recs; i++) {
		const struct prof_rec *q = &p->recs[i];
		r->prof_total_us += q->us;
		int slot = q->layer < 0 ? 0 : q->layer >= L ? L + 1 : q->layer + 1;
		r->prof_layer_us[slot] += q->us;
		int k = 0;
		while (k < r->n_ops && !(r->ops[k].op == q->op && r->ops[k].variant == q->variant &&
					 r->ops[k].rows == q->rows && r->ops[k].cols == q->cols))
			k++;
		if (k == r->n_ops)
			r->ops[r->n_ops++] = (struct op_sum){.op = q->op, .variant = q->variant, .rows = q->rows,
							     .cols = q->cols};
		r->ops[k].calls++;
		r->ops[k].us += q->us;
	}
	qsort(r->ops, (size_t)r->n_ops, sizeof *r->ops, op_sum_cmp);
	return ST_OK;
}

static void derive(const struct bench_opts *o, const struct model_config *cfg, const struct exec_info *in,
		   const struct model_bytes *mb, const struct full_cfg *full, int L, struct result *r)
{
	/* per-layer time: the layer's share of the profiled step times the step */
	double share_scale = r->prof_total_us > 0 ? r->ms_median / r->prof_total_us : 0;
	double kind_ms[3] = {0}, kind_n[3] = {0}, all_ms = 0;
	uint64_t kind_dense[3] = {0};
	for (int l = 0; l < L; l++) {
		int k = mb->layer[l].ratio == 0 ? 0 : mb->layer[l].ratio == (int)in->mix.csa.compress_ratio ? 1 : 2;
		double t = share_scale > 0 ? r->prof_layer_us[l + 1] * share_scale : r->ms_median / (L + 1);
		kind_ms[k] += t;
		kind_n[k] += 1;
		kind_dense[k] = mb->layer[l].dense;
		all_ms += t;
	}
	double head_ms = share_scale > 0 ? (r->prof_layer_us[0] + r->prof_layer_us[L + 1]) * share_scale
					 : r->ms_median / (L + 1);
	double full_ms = head_ms;
	uint64_t full_bytes = r->b_global, full_state = 0, experts_b = 0;
	for (int l = 0; l < full->n_layers; l++) {
		int ratio = full->ratios[l];
		int k = ratio == 0 ? 0 : ratio == (int)in->mix.csa.compress_ratio ? 1 : 2;
		full_ms += kind_n[k] > 0 ? kind_ms[k] / kind_n[k] : all_ms / L;
		uint64_t dense = kind_n[k] > 0 ? kind_dense[k] : mb->layer[0].dense;
		uint64_t ex = (uint64_t)llround(r->experts_per_layer * (double)mb->layer[0].expert);
		uint64_t st = (uint64_t)r->batch * state_bytes(in, cfg, ratio, (uint64_t)r->ctx_mean);
		full_bytes += dense + ex + st;
		full_state += st;
		experts_b += ex;
	}
	r->full_ms = full_ms;
	r->full_tok_s = full_ms > 0 ? r->batch / (full_ms * 1e-3) : 0;
	r->full_bytes = full_bytes;
	r->full_state = full_state;
	r->full_frac = r->gbps > 0 && full_ms > 0 ? (double)full_bytes / (full_ms * 1e-3) / 1e9 / (r->gbps / r->frac) : 0;
	/* 2 x GB10, TP=2: weights split between the ranks, state replicated */
	double rank_bytes = (double)(full_bytes - full_state) / 2 + (double)full_state;
	double eff = r->frac > 0 ? r->frac : 1;
	double t_mem = rank_bytes / (o->gb10_gbps * 1e9 * eff);
	double msg = (double)r->batch * (double)cfg->hidden_size * 4;
	double n_ar = 2.0 * full->n_layers + 2; /* a sublayer each, the embedding, the head's gather */
	double t_ar = o->ar_latency_us * 1e-6 + msg / (o->ar_gbps * 1e9);
	r->gb10_rank_bytes = rank_bytes;
	r->gb10_ms = (t_mem + n_ar * t_ar) * 1e3;
	r->gb10_tok_s = r->batch / (t_mem + n_ar * t_ar);
	(void)experts_b;
}

struct bench {
	const struct bench_opts *o;
	struct model_exec_open *mx;
	struct exec *ex;
	const struct model_config *cfg;
	struct prof *prof;
	uint32_t B, S;
	int32_t *prompts;  /* [prefixes][ctx] */
	uint32_t *block_ids;
	uint64_t seq_id;
};

/* Open the executor (model/exec_open.h) with the block size B the contexts were rounded to. */
static enum status bench_open(struct bench *b, const struct model_exec_open_options *xo, uint32_t B, struct err *e)
{
	enum status st = model_exec_open(&b->mx, xo, e);
	if (st)
		return st;
	b->ex = model_exec_open_exec(b->mx);
	b->B = b->ex->info.block_tokens;
	if (b->B != B)
		return err_set(e, ST_INVALID, "the executor chose blocks of %u tokens (expected %u)", b->B, B);
	return ST_OK;
}

static enum status prefill(struct bench *b, uint32_t C, uint32_t np, double *tok_s, struct err *e)
{
	const struct exec_info *in = &b->ex->info;
	uint32_t T = in->max_step_tokens, nbc = C / b->B;
	int32_t *pos = malloc((size_t)T * sizeof *pos);
	if (!pos)
		return err_set(e, ST_NOMEM, "prefill positions");
	struct kern_sampling_params sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
	enum status st = ST_OK;
	double t0 = now_s();
	for (uint32_t p = 0; p < np && !st; p++) {
		const int32_t *ids = b->prompts + (size_t)p * C;
		uint64_t sid = ++b->seq_id;
		for (uint32_t done = 0; done < C && !st;) {
			uint32_t q = C - done < T ? C - done : T;
			for (uint32_t k = 0; k < q; k++)
				pos[k] = (int32_t)(done + k);
			bool last = done + q == C;
			struct exec_seq es = {.seq_id = sid, .n_cached_tokens = done, .n_context_tokens = done + q,
					      .n_blocks = (done + q + b->B - 1) / b->B, .block_table_start = 0,
					      .state_slot = in->n_state_slots ? 0 : EXEC_NO_SLOT,
					      .restore_state = done == 0, .sample = last,
					      .sampling = &sp, .prompt_ids = ids, .n_prompt = C};
			uint32_t qs[2] = {0, q};
			struct exec_step step = {.n_tokens = q, .token_ids = ids + done, .positions = pos, .n_seqs = 1,
						 .seqs = &es, .query_start = qs, .block_ids = b->block_ids + (size_t)p * nbc,
						 .n_block_ids = es.n_blocks, .n_sample = last ? 1 : 0};
			struct exec_sample smp;
			st = b->ex->ops->step(b->ex->ctx, &step, &smp, e);
			done += q;
		}
		if (b->ex->ops->seq_release)
			b->ex->ops->seq_release(b->ex->ctx, sid);
	}
	double dt = now_s() - t0;
	*tok_s = dt > 0 ? (double)C * np / dt : 0;
	free(pos);
	return st;
}

static int dbl_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* b sequences from the prefilled prompts: warmup + steps timed (profile false), or
 * one warm step and one profiled step (profile true: the hook's timing and the
 * routing capture; needs an eager executor, as a CUDA graph replay calls no host code). */
static enum status decode_run(struct bench *b, uint32_t C, uint32_t np, uint32_t batch, bool profile,
			      struct result *r, struct err *e)
{
	const struct bench_opts *o = b->o;
	uint32_t n_steps = profile ? 2 : o->warmup + o->steps, nbc = C / b->B;
	uint32_t nt = (n_steps + b->B - 1) / b->B + 1, bt = nbc + nt;
	uint32_t need = np * nbc + batch * nt;
	if (need > b->ex->info.n_blocks) {
		r->skipped = true;
		snprintf(r->why, sizeof r->why, "needs %u blocks, the pool has %u", need, b->ex->info.n_blocks);
		return ST_OK;
	}
	bool slots = b->ex->info.n_state_slots > 0; /* slot mode: one live-state slot per sequence */
	if (slots && batch > b->ex->info.n_state_slots) {
		r->skipped = true;
		snprintf(r->why, sizeof r->why, "needs %u state slots, the executor has %u", batch,
			 b->ex->info.n_state_slots);
		return ST_OK;
	}
	struct exec_seq *seqs = calloc(batch, sizeof *seqs);
	uint32_t *qs = calloc(batch + 1, sizeof *qs), *bids = calloc((size_t)batch * bt, sizeof *bids);
	int32_t *tok = calloc(batch, sizeof *tok), *pos = calloc(batch, sizeof *pos);
	int32_t *outs = calloc((size_t)batch * n_steps, sizeof *outs);
	struct exec_sample *smp = calloc(batch, sizeof *smp);
	double *ms = calloc(o->steps, sizeof *ms);
	enum status st = ST_OK;
	if (!seqs || !qs || !bids || !tok || !pos || !outs || !smp || !ms) {
		st = err_set(e, ST_NOMEM, "decode batch %u", batch);
		goto out;
	}
	struct kern_sampling_params sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
	uint64_t rs = o->seed ^ ((uint64_t)C << 20) ^ batch;
	for (uint32_t i = 0; i < batch; i++) {
		uint32_t p = i % np;
		for (uint32_t k = 0; k < nbc; k++)
			bids[(size_t)i * bt + k] = b->block_ids[(size_t)p * nbc + k];
		for (uint32_t k = 0; k < nt; k++)
			bids[(size_t)i * bt + nbc + k] = np * nbc + i * nt + k;
		tok[i] = (int32_t)(rng_next(&rs) % (b->ex->info.vocab_size - 2)) + 2;
		qs[i] = i;
		seqs[i] = (struct exec_seq){.seq_id = ++b->seq_id, .block_table_start = i * bt,
					    .state_slot = slots ? i : EXEC_NO_SLOT,
					    .sample = true, .sampling = &sp, .prompt_ids = b->prompts + (size_t)p * C,
					    .n_prompt = C, .output_ids = outs + (size_t)i * n_steps};
	}
	qs[batch] = batch;
	for (uint32_t s = 0; s < n_steps && !st; s++) {
		bool profiled = profile && s == n_steps - 1;
		for (uint32_t i = 0; i < batch; i++) {
			struct exec_seq *q = &seqs[i];
			q->n_cached_tokens = C + s;
			q->n_context_tokens = C + s + 1;
			q->n_blocks = (C + s + 1 + b->B - 1) / b->B;
			q->restore_state = s == 0;
			q->n_output = s;
			pos[i] = (int32_t)(C + s);
		}
		struct exec_step step = {.n_tokens = batch, .token_ids = tok, .positions = pos, .n_seqs = batch,
					 .seqs = seqs, .query_start = qs, .block_ids = bids, .n_block_ids = batch * bt,
					 .n_sample = batch};
		if (profiled) {
			struct prof *p = b->prof;
			p->timing = true;
			p->n_post = p->n_route = p->n_recs = 0;
			memset(p->ids_n, 0, (size_t)p->n_layers * sizeof *p->ids_n);
			kern_profile_set_active(true);
		}
		double t0 = now_s();
		st = b->ex->ops->step(b->ex->ctx, &step, smp, e);
		double dt = now_s() - t0;
		if (profiled)
			kern_profile_set_active(false);
		if (st)
			break;
		if (!profile && s >= o->warmup)
			ms[s - o->warmup] = dt * 1e3;
		for (uint32_t j = 0; j < batch; j++) {
			uint32_t i = smp[j].seq_index < batch ? smp[j].seq_index : j;
			tok[i] = smp[j].out.token_id;
			outs[(size_t)i * n_steps + s] = tok[i];
		}
	}
	if (st || profile)
		goto out;
	double sum = 0;
	for (uint32_t i = 0; i < o->steps; i++)
		sum += ms[i];
	qsort(ms, o->steps, sizeof *ms, dbl_cmp);
	r->ms_mean = sum / o->steps;
	r->ms_min = ms[0];
	r->ms_median = o->steps % 2 ? ms[o->steps / 2] : 0.5 * (ms[o->steps / 2 - 1] + ms[o->steps / 2]);
	r->tok_s = batch / (r->ms_median * 1e-3);
	r->ctx_mean = C + o->warmup + 0.5 * (o->steps - 1);
out:
	if (b->ex->ops->seq_release && seqs)
		for (uint32_t i = 0; i < batch; i++)
			b->ex->ops->seq_release(b->ex->ctx, seqs[i].seq_id);
	free(seqs);
	free(qs);
	free(bids);
	free(tok);
	free(pos);
	free(outs);
	free(smp);
	free(ms);
	return st;
}

static void count_bytes(const struct bench *b, const struct model_bytes *mb, int L, struct result *r)
{
	const struct prof *p = b->prof;
	uint64_t dense = 0, ex = 0, state = 0;
	double distinct_sum = 0;
	int n_moe = 0;
	char *seen = calloc((size_t)p->n_experts, 1);
	for (int l = 0; l < L && seen; l++) {
		const struct layer_bytes *lb = &mb->layer[l];
		dense += lb->dense + lb->tid2eid_row * r->batch;
		memset(seen, 0, (size_t)p->n_experts);
		int d = 0;
		const int32_t *ids = p->ids + (size_t)l * (size_t)p->ids_cap;
		for (int64_t i = 0; i < p->ids_n[l]; i++)
			if (ids[i] >= 0 && ids[i] < p->n_experts && !seen[ids[i]]) {
				seen[ids[i]] = 1;
				d++;
			}
		if (p->ids_n[l]) {
			distinct_sum += d;
			n_moe++;
		}
		ex += (uint64_t)d * lb->expert;
		state += (uint64_t)r->batch * state_bytes(&b->ex->info, b->cfg, lb->ratio, (uint64_t)r->ctx_mean);
	}
	free(seen);
	r->b_dense = dense;
	r->b_experts = ex;
	r->b_global = mb->global + mb->embed_row * r->batch;
	r->b_state = state;
	r->b_total = dense + ex + r->b_global + state;
	r->experts_per_layer = n_moe ? distinct_sum / n_moe : 0;
}

/* config.json as written (before --hf-overrides): the full model's layers. */
static void full_model(const char *dir, const struct model_config *cfg, struct full_cfg *f)
{
	f->n_layers = (int)cfg->num_hidden_layers;
	for (int l = 0; l < f->n_layers && l < BENCH_MAX_LAYERS; l++)
		f->ratios[l] = cfg->compress_ratios[l];
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", dir);
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);
	if (!j)
		return;
	json_t *n = json_object_get(j, "num_hidden_layers"), *cr = json_object_get(j, "compress_ratios");
	if (json_is_integer(n) && json_is_array(cr) && json_integer_value(n) > 0 &&
	    json_integer_value(n) <= BENCH_MAX_LAYERS && (int64_t)json_array_size(cr) >= json_integer_value(n)) {
		f->n_layers = (int)json_integer_value(n);
		for (int l = 0; l < f->n_layers; l++)
			f->ratios[l] = (int32_t)json_integer_value(json_array_get(cr, (size_t)l));
	}
	json_decref(j);
}

/* ---- output ---- */

static void print_table(const struct bench_opts *o, const struct result *rs, int n, int L, int full_layers,
			double bw, bool gpu)
{
	printf("\nread bandwidth measured in this run: %.1f GB/s (%s)\n\n", bw,
	       gpu ? "read kernel of bench_kernels, 1 GiB" : "summing loop over host memory, one thread");
	printf("| context | batch | ms/step | tok/s | MB read/step (weights+experts+head+state) | GB/s | of read bw | "
	       "experts/layer | full %d-layer ms/step (derived) | full tok/s (derived) | full GB/step | 2xGB10 TP=2 "
	       "tok/s (projected; vLLM %.1f) |\n",
	       full_layers, VLLM_GB10_TOKS);
	printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < n; i++) {
		const struct result *r = &rs[i];
		if (r->skipped) {
			printf("| %u | %u | skipped: %s |||||||||||\n", r->ctx, r->batch, r->why);
			continue;
		}
		printf("| %u | %u | %.3f | %.1f | %.1f (%.1f+%.1f+%.1f+%.1f) | %.1f | %.1f %% | %.1f | %.2f | %.1f | %.2f | "
		       "%.1f |\n",
		       r->ctx, r->batch, r->ms_median, r->tok_s, r->b_total / 1e6, r->b_dense / 1e6, r->b_experts / 1e6,
		       r->b_global / 1e6, r->b_state / 1e6, r->gbps, 100 * r->frac, r->experts_per_layer, r->full_ms,
		       r->full_tok_s, r->full_bytes / 1e9, r->gb10_tok_s);
	}
	printf("\nmeasured: %d layer(s) + head; derived: the full model from the measured layers of each kind; "
	       "projected: 2 x GB10 at %.0f GB/s x the efficiency measured here + %d all-reduces of %.0f us + bytes / "
	       "%.0f GB/s\n",
	       L, o->gb10_gbps, 2 * full_layers + 2, o->ar_latency_us, o->ar_gbps);
}

static void print_profile(const struct result *r, int L)
{
	printf("\n#### per-op profile: context %u, batch %u (one step, device synchronised around every op: "
	       "%.3f ms against %.3f ms unprofiled)\n\n",
	       r->ctx, r->batch, r->prof_total_us / 1e3, r->ms_median);
	printf("| op | variant | shape | calls | us | share |\n|---|---|---|---|---|---|\n");
	for (int i = 0; i < r->n_ops; i++) {
		const struct op_sum *s = &r->ops[i];
		char shape[48] = "";
		if (s->rows)
			snprintf(shape, sizeof shape, "%lld x %lld", (long long)s->rows, (long long)s->cols);
		printf("| %s | %s | %s | %d | %.1f | %.1f %% |\n", s->op, s->variant, shape, s->calls, s->us,
		       r->prof_total_us > 0 ? 100 * s->us / r->prof_total_us : 0.0);
	}
	printf("\nper layer (us): embed %.1f", r->prof_layer_us[0]);
	for (int l = 0; l < L; l++)
		printf(", L%d %.1f", l, r->prof_layer_us[l + 1]);
	printf(", head+sample %.1f\n", r->prof_layer_us[L + 1]);
}

static json_t *result_json(const struct result *r, int L)
{
	json_t *j = json_object();
	json_object_set_new(j, "context", json_integer(r->ctx));
	json_object_set_new(j, "batch", json_integer(r->batch));
	if (r->skipped) {
		json_object_set_new(j, "skipped", json_string(r->why));
		return j;
	}
	json_object_set_new(j, "ms_per_step_median", json_real(r->ms_median));
	json_object_set_new(j, "ms_per_step_mean", json_real(r->ms_mean));
	json_object_set_new(j, "ms_per_step_min", json_real(r->ms_min));
	json_object_set_new(j, "tokens_per_s", json_real(r->tok_s));
	json_object_set_new(j, "context_mean", json_real(r->ctx_mean));
	json_t *b = json_object();
	json_object_set_new(b, "layer_weights", json_integer((json_int_t)r->b_dense));
	json_object_set_new(b, "routed_experts", json_integer((json_int_t)r->b_experts));
	json_object_set_new(b, "head_embed", json_integer((json_int_t)r->b_global));
	json_object_set_new(b, "state", json_integer((json_int_t)r->b_state));
	json_object_set_new(b, "total", json_integer((json_int_t)r->b_total));
	json_object_set_new(j, "bytes_per_step", b);
	json_object_set_new(j, "distinct_experts_per_layer", json_real(r->experts_per_layer));
	json_object_set_new(j, "achieved_gbps", json_real(r->gbps));
	json_object_set_new(j, "fraction_of_read_bw", json_real(r->frac));
	json_t *d = json_object();
	json_object_set_new(d, "ms_per_step", json_real(r->full_ms));
	json_object_set_new(d, "tokens_per_s", json_real(r->full_tok_s));
	json_object_set_new(d, "bytes_per_step", json_integer((json_int_t)r->full_bytes));
	json_object_set_new(d, "state_bytes_per_step", json_integer((json_int_t)r->full_state));
	json_object_set_new(d, "fraction_of_read_bw", json_real(r->full_frac));
	json_object_set_new(j, "full_model_derived", d);
	json_t *g = json_object();
	json_object_set_new(g, "bytes_per_rank_per_step", json_real(r->gb10_rank_bytes));
	json_object_set_new(g, "ms_per_step", json_real(r->gb10_ms));
	json_object_set_new(g, "tokens_per_s", json_real(r->gb10_tok_s));
	json_object_set_new(g, "vllm_tokens_per_s", json_real(VLLM_GB10_TOKS));
	json_object_set_new(j, "gb10_tp2_projected", g);
	json_t *p = json_object();
	json_object_set_new(p, "total_us", json_real(r->prof_total_us));
	json_t *layers = json_array();
	for (int l = 0; l < L + 2; l++)
		json_array_append_new(layers, json_real(r->prof_layer_us[l]));
	json_object_set_new(p, "us_embed_layers_head", layers);
	json_t *ops = json_array();
	for (int i = 0; i < r->n_ops; i++) {
		const struct op_sum *s = &r->ops[i];
		json_t *oj = json_object();
		json_object_set_new(oj, "op", json_string(s->op));
		json_object_set_new(oj, "variant", json_string(s->variant));
		if (s->rows) {
			json_object_set_new(oj, "rows", json_integer(s->rows));
			json_object_set_new(oj, "cols", json_integer(s->cols));
		}
		json_object_set_new(oj, "calls", json_integer(s->calls));
		json_object_set_new(oj, "us", json_real(s->us));
		json_array_append_new(ops, oj);
	}
	json_object_set_new(p, "ops", ops);
	json_object_set_new(j, "profile", p);
	return j;
}

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
	int n_rs = 0;
	struct kern_profile_hooks hooks = {.user = &prof, .before = prof_before, .after = prof_after};
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
	/* the block size rounds the contexts and sizes the CPU pool: 256 raised to the
	 * sliding window and to a multiple of every compress ratio (the executor's own
	 * default rule), passed explicitly and checked against what the executor reports */
	uint32_t T = o.chunk > max_b ? o.chunk : max_b;
	uint32_t n_steps = o.warmup + o.steps > 2 ? o.warmup + o.steps : 2;
	uint32_t B = 256;
	if (B < (uint32_t)b.cfg->sliding_window)
		B = (uint32_t)b.cfg->sliding_window;
	for (bool again = true; again;) {
		again = false;
		for (int l = 0; l < b.cfg->n_layers_total; l++) {
			uint32_t m = (uint32_t)b.cfg->compress_ratios[l];
			if (m && B % m) {
				B = (B / m + 1) * m;
				again = true;
			}
		}
	}
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
	if (bench_open(&b, &xo, B, &e)) {
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
	if (read_bw(gpu, gpu ? o.bw_mib : (o.bw_mib < 256 ? o.bw_mib : 256), &bw, &e)) {
		fprintf(stderr, "dsv4 bench decode: %s\n", e.msg);
		goto out;
	}
	struct model_bytes mb;
	model_bytes_of(ck, &mb);
	struct full_cfg full;
	full_model(o.model, b.cfg, &full);
	printf("dsv4 bench decode: %s, %d layer(s) measured (full model: %d), %s, blocks of %u tokens, pool %u "
	       "blocks, %s, %s\n",
	       o.model, L, full.n_layers, gpu ? dev.name : "CPU", b.B, b.ex->info.n_blocks,
	       model_checkpoint_is_dummy(ck) ? "dummy weights" : "checkpoint weights",
	       graphs ? "decode steps as CUDA graphs (the profiled steps run on a second, eager executor)" : "eager");
	/* pass 0: the timed steps (and, on an eager executor, the profiled ones);
	 * pass 1 (CUDA graphs only): a second executor, eager, for the profiled steps */
	for (int pass = 0; pass < (graphs ? 2 : 1); pass++) {
		if (pass == 1) {
			model_exec_open_destroy(b.mx);
			b.mx = NULL;
			xo.enforce_eager = true;
			if (bench_open(&b, &xo, B, &e)) {
				fprintf(stderr, "dsv4 bench decode: the eager executor for the profile: %s\n", e.msg);
				goto out;
			}
			printf("profiling on an eager executor\n");
		}
		uint64_t rs_seed = o.seed;
		for (int ci = 0; ci < o.n_contexts; ci++) {
			uint32_t C = (o.contexts[ci] + b.B - 1) / b.B * b.B;
			uint32_t np = o.prefixes < max_b ? o.prefixes : max_b;
			for (size_t i = 0; i < (size_t)np * C; i++)
				b.prompts[i] = (int32_t)(rng_next(&rs_seed) % (b.ex->info.vocab_size - 2)) + 2;
			for (uint32_t i = 0; i < np * (C / b.B); i++)
				b.block_ids[i] = i;
			double pre_tok_s = 0;
			if (np * (C / b.B) + 1 > b.ex->info.n_blocks) {
				fprintf(stderr, "dsv4 bench decode: context %u: %u prompts need %u blocks, the pool has %u\n",
					C, np, np * (C / b.B), b.ex->info.n_blocks);
				goto out;
			}
			if (prefill(&b, C, np, &pre_tok_s, &e)) {
				fprintf(stderr, "dsv4 bench decode: prefill of %u tokens: %s\n", C, e.msg);
				goto out;
			}
			if (pass == 0)
				printf("context %u: %u prompt(s) prefilled at %.1f tokens/s\n", C, np, pre_tok_s);
			fflush(stdout);
			for (int bi = 0; bi < o.n_batches; bi++) {
				struct result *r = &rs[ci * o.n_batches + bi];
				if (pass == 0) {
					n_rs++;
					r->ctx = C;
					r->batch = o.batches[bi];
					if (decode_run(&b, C, np, r->batch, false, r, &e)) {
						fprintf(stderr, "dsv4 bench decode: context %u batch %u: %s\n", C, r->batch,
							e.msg);
						goto out;
					}
				}
				if (r->skipped || (pass == 0 && graphs))
					continue;
				if (decode_run(&b, C, np, r->batch, true, r, &e)) {
					fprintf(stderr, "dsv4 bench decode: context %u batch %u, profiled step: %s\n", C,
						r->batch, e.msg);
					goto out;
				}
				if (r->skipped)
					continue;
				if (prof.failed || prof.n_route == 0) {
					fprintf(stderr, "dsv4 bench decode: context %u batch %u: the profiled step captured %d "
							"routing calls%s\n",
						C, r->batch, prof.n_route, prof.failed ? " (a capture failed)" : "");
					goto out;
				}
				if (summarise_profile(&prof, r, &e)) {
					fprintf(stderr, "dsv4 bench decode: %s\n", e.msg);
					goto out;
				}
				count_bytes(&b, &mb, L, r);
				r->gbps = (double)r->b_total / (r->ms_median * 1e-3) / 1e9;
				r->frac = bw > 0 ? r->gbps / bw : 0;
				derive(&o, b.cfg, &b.ex->info, &mb, &full, L, r);
				printf("  batch %u: %.3f ms/step, %.1f tokens/s, %.1f MB/step, %.1f %% of the read "
				       "bandwidth\n",
				       r->batch, r->ms_median, r->tok_s, r->b_total / 1e6, 100 * r->frac);
				fflush(stdout);
			}
		}
	}
	print_table(&o, rs, n_rs, L, full.n_layers, bw, gpu);
	if (o.profile)
		for (int i = 0; i < n_rs; i++)
			if (!rs[i].skipped)
				print_profile(&rs[i], L);
	if (o.json) {
		json_t *root = json_object();
		json_object_set_new(root, "benchmark", json_string("decode"));
		json_object_set_new(root, "model", json_string(o.model));
		json_object_set_new(root, "device", json_string(gpu ? dev.name : "cpu"));
		json_object_set_new(root, "dummy_weights", json_boolean(model_checkpoint_is_dummy(ck)));
		json_object_set_new(root, "layers_measured", json_integer(L));
		json_object_set_new(root, "layers_full", json_integer(full.n_layers));
		json_object_set_new(root, "block_tokens", json_integer(b.B));
		json_object_set_new(root, "steps", json_integer(o.steps));
		json_object_set_new(root, "warmup", json_integer(o.warmup));
		json_object_set_new(root, "prefixes", json_integer(o.prefixes));
		json_object_set_new(root, "read_bw_gbps", json_real(bw));
		json_t *as = json_object();
		json_object_set_new(as, "gb10_gbps", json_real(o.gb10_gbps));
		json_object_set_new(as, "allreduce_latency_us", json_real(o.ar_latency_us));
		json_object_set_new(as, "allreduce_gbps", json_real(o.ar_gbps));
		json_object_set_new(as, "allreduces_per_step", json_integer(2 * full.n_layers + 2));
		json_object_set_new(root, "gb10_assumptions", as);
		json_t *arr = json_array();
		for (int i = 0; i < n_rs; i++)
			json_array_append_new(arr, result_json(&rs[i], L));
		json_object_set_new(root, "results", arr);
		int wr = json_dump_file(root, o.json, JSON_INDENT(1) | JSON_REAL_PRECISION(8));
		json_decref(root);
		if (wr) {
			fprintf(stderr, "dsv4 bench decode: cannot write %s\n", o.json);
			goto out;
		}
	}
	rc = CLI_EXIT_OK;
out:
	model_exec_open_destroy(b.mx);
	kern_profile_install(NULL);
	model_checkpoint_destroy(ck);
	for (int i = 0; i < n_rs; i++)
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
