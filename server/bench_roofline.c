/*
 * server/bench_roofline.c: the roofline of `dsv4 bench decode`. The bytes a
 * decode step must read, as stored: every tensor of every measured layer but
 * the routed experts (tid2eid only the rows of the step's tokens), the
 * distinct routed experts the profiled step chose, the head, the embedding
 * rows, and the state rows attention reads at the mean context in the
 * executor's own row sizes; the read bandwidth measured in the same run
 * (the read kernel of bench_kernels on a GPU, a summing loop on the CPU);
 * and what follows from both for the full model (config.json as written)
 * and for 2 x GB10 at TP=2.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv4_config.h"
#include "server/bench_decode.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/moe_gemm/moe_gemv.h"
#endif

/* ---- read bandwidth, measured in this run ---- */

enum status bench__read_bw(bool gpu, uint32_t mib, double *gbps, struct err *e)
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
			double t0 = bench__now_s();
			st = kern_moe_gemv_bench_read(src, bytes, sink, NULL);
			cudaDeviceSynchronize();
			double dt = bench__now_s() - t0;
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
		double t0 = bench__now_s();
		uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
		for (size_t i = 0; i + 3 < n; i += 4) {
			a0 += buf[i];
			a1 ^= buf[i + 1];
			a2 += buf[i + 2];
			a3 ^= buf[i + 3];
		}
		sink = sink + (a0 ^ a1 ^ a2 ^ a3);
		double dt = bench__now_s() - t0;
		if (r >= 1 && (best == 0 || dt < best))
			best = dt;
	}
	free(buf);
	*gbps = (double)bytes / best / 1e9;
	return ST_OK;
}

/* ---- what a step must read ---- */

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

void bench__model_bytes_of(const struct model_checkpoint *ck, struct model_bytes *mb)
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

void bench__count_bytes(const struct bench *b, const struct model_bytes *mb, int L, struct result *r)
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
void bench__full_model(const char *dir, const struct model_config *cfg, struct full_cfg *f)
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

void bench__derive(const struct bench_opts *o, const struct model_config *cfg, const struct exec_info *in,
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
