/*
 * model/forward.c: the forward pass of DeepSeek-V4 over a flat batch
 * (model/forward.h), one code path for every backend. Every numeric op and
 * every data movement is the variant of the plan (model/weights.h): the CPU
 * references on the host, the CUDA variants on a GPU, over buffers of the
 * same struct kern_mem (kernels/device/mem.h) as the weights and the block
 * pool. What stays on the host is the step's planning: segments, waves,
 * index lists and offsets, computed from the step plan in
 * fwd__batch_prepare (model/forward_batch.c) into a small metadata arena
 * that is uploaded once per step (plus, in the fp32 golden-comparison mode
 * only, one small list per compressed layer).
 *
 * This file owns the object (create, destroy, the size estimate) and drives
 * a step: embedding, the blocks, the head, the MTP layer. The other
 * forward_*.c files hold the parts (model/forward_internal.h lists them).
 */
#include "model/forward.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels/device/graph.h"
#include "model/forward_internal.h"

/* The forward's dimensions, from the config and this rank's weight shards. */
static void fwd_set_dims(struct model_fwd *f, const struct model_weights *w, struct model_state *s,
			 const struct model_fwd_options *opt)
{
	const struct model_config *c = w->cfg;
	f->w = w;
	f->st = s;
	f->opt = *opt;
	const char *tr = getenv("DSV4_FWD_TRACE");
	f->trace_steps = tr ? atoi(tr) : 0;
	f->perturb = getenv("DSV4_FWD_PERTURB") != NULL;
	f->cfg = c;
	f->mem = s->mem;
	f->g = &w->gops;
	f->D = c->hidden_size;
	f->n = c->hc_mult;
	f->H = w->n_heads_local;
	f->d = c->head_dim;
	f->r = c->qk_rope_head_dim;
	f->G = w->n_groups_local;
	f->EL = w->n_experts_local;
	f->EB = w->expert_begin;
	f->VL = w->vocab_local;
	f->VB = w->vocab_begin;
	f->rank = w->rank;
	f->ws = w->world_size;
	f->R = c->o_lora_rank;
	f->QL = c->q_lora_rank;
	f->I = c->moe_intermediate_size;
	f->E = c->n_routed_experts;
	f->K = c->num_experts_per_tok;
	f->NHI = c->index_n_heads;
	f->ID = c->index_head_dim;
	f->V = c->vocab_size;
}

/* The widest index set a token's attention may read: its ring and the most
 * compressed rows any layer (or a DSpark query's block) adds. */
static enum status plan_index_stride(struct model_fwd *f, struct err *e)
{
	const struct model_weights *w = f->w;
	const struct model_config *c = f->cfg;
	const struct model_fwd_options *opt = &f->opt;
	int64_t W = c->sliding_window;
	int64_t stride = W;
	for (int l = 0; l < w->n_layers + w->n_mtp; l++) {
		const struct model_layer *ly = &w->layers[l];
		int64_t k = ly->kind == MODEL_ATTN_CSA ? c->index_topk
			    : ly->kind == MODEL_ATTN_HCA ? (int64_t)opt->max_context / ly->ratio + 1
							 : 0;
		if (W + k > stride)
			stride = W + k;
	}
	if (w->n_dspark && W + c->dspark.block_size > stride) /* a DSpark query: its ring and the block */
		stride = W + c->dspark.block_size;
	if (stride > (1 << 24))
		return err_set(e, ST_INVALID, "forward: index set of %lld rows per token", (long long)stride);
	f->idx_stride = (int)stride;
	return ST_OK;
}

/* The distinct compressed-row pool sizes, for the per-kind ring rows. */
static void plan_kinds(struct model_fwd *f)
{
	const struct model_state *s = f->st;
	f->kind_rows[f->n_kinds++] = 0;
	for (int l = 0; l < s->n_layers; l++) {
		int rows = s->ls[l].ratio ? s->ls[l].per_block * (int)s->n_blocks : 0;
		bool seen = false;
		for (int k = 0; k < f->n_kinds; k++)
			seen |= f->kind_rows[k] == rows;
		if (!seen && f->n_kinds < MAX_KINDS)
			f->kind_rows[f->n_kinds++] = rows;
	}
}

/* The host arrays of a step's plan (segments, waves, block tables) and the
 * metadata arena, sized for the capacities. */
static enum status alloc_step_plan(struct model_fwd *f, struct err *e)
{
	const struct model_fwd_options *opt = &f->opt;
	const struct model_state *s = f->st;
	int64_t T = opt->max_tokens, S = opt->max_seqs, B = s->block_tokens;
	f->bt_stride = (int32_t)((opt->max_context + B - 1) / B + 1);
	int64_t max_segs = S + T / B + S; /* each sequence: ceil(len/B) + 1 at most */
	f->segs = calloc((size_t)max_segs + 1, sizeof *f->segs);
	f->seg_first = calloc((size_t)S + 2, sizeof *f->seg_first);
	f->bt_h = calloc((size_t)(S * f->bt_stride) + 1, sizeof *f->bt_h);
	f->entry_blk = calloc((size_t)S + 1, sizeof *f->entry_blk);
	f->waves = calloc((size_t)max_segs + 1, sizeof *f->waves);
	if (!f->segs || !f->seg_first || !f->bt_h || !f->entry_blk || !f->waves)
		return err_set(e, ST_NOMEM, "forward buffers for %u tokens", opt->max_tokens);
	/* arena bound: step arrays, per-kind ring rows, every wave's arrays, the
	 * fp32 lists of every compressed layer, the head's rows */
	size_t ints = (size_t)(4 * T + 4 * S + S * f->bt_stride + 2 * MAX_KINDS * S) +
		      (size_t)(max_segs * (8 + f->bt_stride) + T) + (size_t)(2 * T + 8) * (size_t)(s->n_layers + 1) * 2 +
		      (size_t)(2 * T * f->ws + 64);
	f->meta_cap = ints * 4 + 16 * (size_t)(64 + 4 * max_segs + 4 * s->n_layers);
	enum status st;
	if ((st = kern_mem_host_alloc(&f->mem, f->meta_cap, (void **)&f->meta_h, e)))
		return st;
	if (f->mem.device) {
		if ((st = fwd__mem_alloc(f, &f->meta_d, f->meta_cap, e)))
			return st;
	} else {
		f->meta_d = f->meta_h;
	}
	return ST_OK;
}

/* The activations in the pool's memory, for max_tokens. */
static enum status alloc_activations(struct model_fwd *f, struct err *e)
{
	const struct model_fwd_options *opt = &f->opt;
	const struct model_state *s = f->st;
	const struct model_config *c = f->cfg;
	int64_t T = opt->max_tokens, n = f->n, D = f->D, P = T * f->K;
	enum status st;
#define ALLOC(p, count)                                                                            \
	do {                                                                                       \
		if ((st = fwd__mem_alloc(f, &(p), ((size_t)(count) + 1) * sizeof *(p), e)))        \
			return st;                                                                 \
	} while (0)
	ALLOC(f->x, T * n * D);
	ALLOC(f->x2, T * n * D);
	ALLOC(f->u, T * D);
	ALLOC(f->xn, T * D);
	ALLOC(f->fo, T * D);
	ALLOC(f->mix, T * (2 + n) * n);
	ALLOC(f->sqr, T);
	ALLOC(f->pre, T * n);
	ALLOC(f->post, T * n);
	ALLOC(f->comb, T * n * n);
	ALLOC(f->qr, T * f->QL);
	ALLOC(f->q, T * f->H * f->d);
	ALLOC(f->kv, T * f->d);
	ALLOC(f->o, T * f->H * f->d);
	ALLOC(f->z, T * f->G * f->R);
	ALLOC(f->kvp, T * 2 * f->d);
	ALLOC(f->gp, T * 2 * f->d);
	ALLOC(f->ikvp, T * 2 * f->ID);
	ALLOC(f->igp, T * 2 * f->ID);
	int64_t wave_w = 2 * (f->d > f->ID ? f->d : f->ID); /* widest compressor input row */
	ALLOC(f->wa, T * wave_w);
	ALLOC(f->wb, T * wave_w);
	ALLOC(f->qi, T * f->NHI * f->ID);
	ALLOC(f->hw, T * f->NHI);
	ALLOC(f->topk_work, opt->max_context / 4 + 1);
	ALLOC(f->topk, T * c->index_topk);
	ALLOC(f->idx, T * f->idx_stride);
	ALLOC(f->idx_len, T);
	ALLOC(f->glog, T * f->E);
	ALLOC(f->ew, P);
	ALLOC(f->rw, P);
	ALLOC(f->eids, P);
	ALLOC(f->offsets, f->EL + 1);
	ALLOC(f->row_src, P);
	ALLOC(f->row_slot, P);
	ALLOC(f->slot_row, P);
	ALLOC(f->n_rows, 1);
	if (f->ws > 1) {
		ALLOC(f->lg_local, T * f->VL);
		ALLOC(f->lg_all, T * f->V);
	}
	if (f->comm_staged) {
		f->comm_host = malloc((size_t)(T * (n * D > f->V ? n * D : f->V)) * sizeof(float) + 4);
		if (!f->comm_host)
			return err_set(e, ST_NOMEM, "forward buffers for %u tokens", opt->max_tokens);
	}
	ALLOC(f->h1, P * f->I);
	ALLOC(f->h3, P * f->I);
	ALLOC(f->y2, P * D);
	ALLOC(f->sh1, T * f->I);
	ALLOC(f->sh3, T * f->I);
	ALLOC(f->shy, T * D);
	ALLOC(f->hh, T * n * D);
	ALLOC(f->m1, T * n * D);
	ALLOC(f->m2, T * n * D);
	if (!opt->bf16_round) {
		int64_t mx = 0;
		for (int l = 0; l < s->n_layers; l++) {
			int64_t rows = (int64_t)s->ls[l].per_block * s->n_blocks;
			int64_t k = rows * (f->d > f->ID ? f->d : f->ID);
			if (k > mx)
				mx = k;
		}
		ALLOC(f->pooled, mx);
	}
	/* one linear workspace for the largest linear the plan runs */
	f->lt_ws_bytes = model_weights_linear_workspace_bytes(f->w, T);
	if (f->lt_ws_bytes)
		ALLOC(f->lt_ws, f->lt_ws_bytes);
#undef ALLOC
	return ST_OK;
}

enum status model_fwd_create(struct model_fwd **out, const struct model_weights *w, struct model_state *s,
			     const struct model_fwd_options *opt, struct err *e)
{
	*out = NULL;
	struct model_fwd *f = calloc(1, sizeof *f);
	if (!f)
		return err_set(e, ST_NOMEM, "forward");
	fwd_set_dims(f, w, s, opt);
	if (f->ws > 1 && (!opt->comm || comm_n_ranks(opt->comm) != f->ws || comm_rank(opt->comm) != f->rank)) {
		free(f);
		return err_set(e, ST_INVALID, "forward: world size %d needs a communicator of that size with rank %d",
			       w->world_size, w->rank);
	}
	if (w->on_device != s->mem.device) {
		free(f);
		return err_set(e, ST_INVALID, "forward: weights on the %s, block pool on the %s",
			       w->on_device ? "device" : "host", s->mem.device ? "device" : "host");
	}
	f->comm_staged = f->ws > 1 && f->mem.device && strcmp(comm_backend_name(opt->comm), "nccl") != 0;
	enum status st = plan_index_stride(f, e);
	if (st) {
		free(f);
		return st;
	}
	plan_kinds(f);
	if ((st = alloc_step_plan(f, e)) || (st = alloc_activations(f, e))) {
		model_fwd_destroy(f);
		return st;
	}
	*out = f;
	return ST_OK;
}

uint64_t model_fwd_estimate_bytes(const struct model_weights *w, uint32_t max_tokens, uint32_t max_seqs,
				  uint32_t max_context)
{
	const struct model_config *c = w->cfg;
	uint64_t T = max_tokens, n = (uint64_t)c->hc_mult, D = (uint64_t)c->hidden_size, d = (uint64_t)c->head_dim;
	uint64_t ID = (uint64_t)c->index_head_dim, H = (uint64_t)w->n_heads_local, K = (uint64_t)c->num_experts_per_tok;
	uint64_t I = (uint64_t)c->moe_intermediate_size, E = (uint64_t)c->n_routed_experts;
	uint64_t wide = d > ID ? d : ID;
	uint64_t idx = (uint64_t)c->sliding_window + (uint64_t)c->index_topk + max_context / 4 + 1;
	uint64_t floats = T * (8 * n * D + 4 * D + 2 * H * d + (uint64_t)c->q_lora_rank + 6 * wide + 4 * ID +
			       (uint64_t)(c->index_n_heads * c->index_head_dim) + E + 3 * I + 2 * K * I + K * D +
			       (uint64_t)c->o_lora_rank * (uint64_t)w->n_groups_local + 2 * idx +
			       (uint64_t)c->index_topk + 8 * K) +
			  max_context / 4 + (w->world_size > 1 ? 2 * T * (uint64_t)c->vocab_size : 0);
	(void)max_seqs;
	/* + the linear workspace, the metadata arena and allocator slack */
	return floats * 4 + model_weights_linear_workspace_bytes(w, T) + ((uint64_t)64 << 20);
}

void model_fwd_destroy(struct model_fwd *f)
{
	if (!f)
		return;
	void *ps[] = {f->x, f->x2, f->u, f->xn, f->fo, f->mix, f->sqr, f->pre, f->post, f->comb, f->qr, f->q, f->kv,
		      f->o, f->z, f->kvp, f->gp, f->ikvp, f->igp, f->wa, f->wb, f->qi, f->hw, f->topk_work, f->topk,
		      f->idx, f->idx_len, f->glog, f->ew, f->rw, f->eids, f->offsets, f->row_src, f->row_slot,
		      f->slot_row, f->n_rows, f->lg_local, f->lg_all, f->h1, f->h3, f->y2, f->sh1, f->sh3, f->shy,
		      f->hh, f->m1, f->m2, f->pooled, f->lt_ws};
	for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
		kern_mem_free(&f->mem, ps[i]);
	fwd__spec_free(f);
	kern_mem_free(&f->mem, f->mtp_bidx);
	free(f->dsp_cap);
	if (f->meta_d != f->meta_h)
		kern_mem_free(&f->mem, f->meta_d);
	kern_mem_host_free(&f->mem, f->meta_h);
	free(f->comm_host);
	free(f->segs);
	free(f->seg_first);
	free(f->bt_h);
	free(f->entry_blk);
	free(f->waves);
	free(f);
}

const float *model_fwd_streams(const struct model_fwd *f)
{
	return f->x_final;
}

/* ---- one block ---- */

static enum status block(struct model_fwd *f, int l, struct err *e)
{
	const struct model_layer *ly = &f->w->layers[l];
	int64_t T = f->T, D = f->D;
	enum status st;
	if ((st = fwd__hc_pre(f, ly, &ly->hc_attn, f->x, f->u, l, e)) ||
	    (st = fwd__norm(f, ly, f->u, f->xn, T, (int)D, ly->attn_norm, true, l, e)) ||
	    (st = fwd__attention(f, ly, l, f->xn, f->fo, e)) || (st = fwd__hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
		return st;
	fwd__trace(f, "attn_out", l, f->fo, T * D);
	fwd__trace(f, "x_attn", l, f->x2, T * f->n * D);
	float *t = f->x;
	f->x = f->x2;
	f->x2 = t;
	if ((st = fwd__hc_pre(f, ly, &ly->hc_ffn, f->x, f->u, l, e)) ||
	    (st = fwd__norm(f, ly, f->u, f->xn, T, (int)D, ly->ffn_norm, true, l, e)) ||
	    (st = fwd__moe(f, ly, l, f->xn, f->fo, e)) || (st = fwd__hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
		return st;
	fwd__trace(f, "moe_out", l, f->fo, T * D);
	fwd__trace(f, "x_ffn", l, f->x2, T * f->n * D);
	t = f->x;
	f->x = f->x2;
	f->x2 = t;
	return ST_OK;
}
/* The embedding rows of the step's ids, copied n_copies times per token (the
 * mHC streams). Vocab-parallel: a rank holds rows [VB, VB+VL) and
 * contributes zeros for other ids; the sum over ranks is exact (one nonzero
 * term). */
enum status fwd__embed(struct model_fwd *f, float *out, int64_t n_copies, struct err *e)
{
	struct kern_embed_args a = {.table = f->w->embed, .vocab_begin = f->VB, .vocab_rows = f->VL,
				    .ids = DEV(f, f->ids), .n_tokens = f->T, .dim = f->D, .n_copies = (int)n_copies,
				    .out = out, .stream = f->mem.stream};
	OK(-1, f->g->embed(&a));
	return fwd__all_reduce(f, out, f->T * n_copies * f->D, e);
}
static enum status layers_run(struct model_fwd *f, struct err *e);

enum status model_fwd_run(struct model_fwd *f, const struct exec_step *step, struct err *e)
{
	enum status st = fwd__batch_prepare(f, step, e);
	if (st)
		return st;
	f->x_final = NULL;
	/* A decode-only step (one token per sequence) of a single-GPU executor
	 * runs as a CUDA graph: captured as it launches, replayed as one launch
	 * (kernels/device/graph.h); the key is its batch size. Host collectives
	 * (tensor parallel) synchronise inside the step, so graphs need ws 1;
	 * the trace aid downloads inside the step, so it runs eagerly. */
	bool graph = f->opt.graph && f->ws == 1 && f->T == (uint32_t)f->S && f->step_no >= f->trace_steps &&
		     kern_graph_warm(f->opt.graph, f->T);
	if (graph && (st = kern_graph_begin(f->opt.graph, e)))
		return st;
	st = layers_run(f, e);
	if (graph) {
		enum status st2 = kern_graph_end(f->opt.graph, f->T, st == ST_OK, e);
		if (!st)
			st = st2;
	}
	if (st)
		return st;
	f->x_final = f->x;
	f->step_no++;
	return ST_OK;
}

/* The embedding and every layer of the step batch_prepare made ready. */
static enum status layers_run(struct model_fwd *f, struct err *e)
{
	enum status st;
	if ((st = fwd__embed(f, f->x, f->n, e)))
		return st;
	fwd__trace(f, "embed", -1, f->x, f->T * f->n * f->D);
	/* Test aid (DSV4_FWD_PERTURB set when the executor is created, host
	 * only): every 7th embedding value times 1 + 2^-22, about one fp32 ulp —
	 * the size of a reduction-order difference. At reference precision a
	 * tiny random model carries such a difference across a bf16 / e4m3
	 * rounding boundary and on through the layers; the logits then move as
	 * much as they do between two correct backends, which is the noise floor
	 * test_exec_gpu compares the GPU with. */
	if (!f->mem.device && f->perturb)
		for (int64_t i = 0; i < f->T * f->n * f->D; i += 7)
			f->x[i] *= 1.0f + 1.0f / (1 << 22);
	for (int l = 0; l < f->w->n_layers; l++)
		if ((st = block(f, l, e)) || (f->dsp_cap && (st = fwd__dspark_capture(f, l, e))))
			return st;
	return ST_OK;
}
enum status fwd__head(struct model_fwd *f, const struct model_layer *ly0, const struct model_hc *hc,
			const uint16_t *norm_w, const float *streams, const uint32_t *rows, uint32_t n_rows,
			float *logits, struct err *e)
{
	int n = (int)f->n, k = (int)(f->n * f->D);
	int64_t D = f->D;
	void *sm = f->mem.stream;
	if (n_rows > f->opt.max_tokens)
		return err_set(e, ST_INVALID, "head: %u rows > %u", n_rows, f->opt.max_tokens);
	int32_t *idx;
	TAKE(f, idx, n_rows);
	for (uint32_t i = 0; i < n_rows; i++)
		idx[i] = (int32_t)rows[i];
	int32_t *perm = NULL;
	if (f->ws > 1) {
		/* vocab-parallel: rank rk's rows for row i land at [i, rk*VL ..) */
		TAKE(f, perm, (int64_t)n_rows * f->ws);
		for (uint32_t i = 0; i < n_rows; i++)
			for (int rk = 0; rk < f->ws; rk++)
				perm[(size_t)i * f->ws + rk] = (int32_t)((uint32_t)rk * n_rows + i);
	}
	enum status st = fwd__meta_flush(f, e);
	if (st || (st = fwd__copy_rows(f, f->hh, k, NULL, streams, k, DEV(f, idx), n_rows, k, e)))
		return st;
	struct kern_hc_prenorm_args pa = {.x = f->hh, .fn = hc->fn, .mix = f->mix, .sqr_sum = f->sqr,
					  .n_tokens = n_rows, .k = k, .n_out = n, .stream = sm};
	OK(-1, ly0->ops.hc_prenorm(&pa));
	struct kern_hc_split_args sa = {.mix = f->mix, .sqr_sum = f->sqr, .n_tokens = n_rows, .n_streams = n, .k = k,
					.norm_eps = (float)f->cfg->rms_norm_eps, .scale = hc->scale, .base = hc->base,
					.sinkhorn_iters = (int)f->cfg->hc_sinkhorn_iters,
					.hc_eps = (float)f->cfg->hc_eps, .head = true, .pre = f->pre, .stream = sm};
	OK(-1, ly0->ops.hc_split(&sa));
	fwd__trace(f, "head_pre", -1, f->pre, (int64_t)n_rows * n);
	struct kern_hc_pre_combine_args ca = {.x = f->hh, .pre = f->pre, .u = f->u, .n_tokens = n_rows,
					      .n_streams = n, .dim = (int)D, .bf16_out = f->opt.bf16_round,
					      .stream = sm};
	OK(-1, ly0->ops.hc_pre_combine(&ca));
	fwd__trace(f, "head_u", -1, f->u, (int64_t)n_rows * D);
	if ((st = fwd__norm(f, ly0, f->u, f->u, n_rows, (int)D, norm_w, true, -1, e)))
		return st;
	if (f->ws == 1)
		return fwd__lin(f, &f->w->head, f->u, 0, n_rows, logits, 0, false, -1, e);
	if ((st = fwd__lin(f, &f->w->head, f->u, 0, n_rows, f->lg_local, 0, false, -1, e)) ||
	    (st = fwd__collective(f, f->lg_local, f->lg_all, (int64_t)n_rows * f->VL, true, e)))
		return st;
	return fwd__copy_rows(f, logits, f->VL, NULL, f->lg_all, f->VL, DEV(f, perm), (int64_t)n_rows * f->ws, f->VL, e);
}

enum status model_fwd_logits(struct model_fwd *f, const float *streams, const uint32_t *rows, uint32_t n_rows,
			     float *logits, struct err *e)
{
	return fwd__head(f, &f->w->layers[0], &f->w->hc_head, f->w->norm, streams, rows, n_rows, logits, e);
}

/* ---- MTP (June release, speculative decoding) ---- */

/* The MTP block over step (model/forward.h); its output streams end in f->x. */
static enum status mtp_block(struct model_fwd *f, const struct exec_step *step, const float *streams, struct err *e)
{
	if (!f->w->n_mtp)
		return err_set(e, ST_UNSUPPORTED, "the MTP layer is not loaded");
	int l = f->w->n_layers;
	const struct model_layer *ly = &f->w->layers[l];
	enum status st = fwd__batch_prepare(f, step, e);
	if (st)
		return st;
	int64_t T = f->T, D = f->D, n = f->n;
	if (!f->mtp_bidx) {
		/* the broadcast below: stream row t * n + j reads row t */
		size_t nb = (size_t)(f->opt.max_tokens * n);
		int32_t *h = malloc(nb * sizeof *h);
		if (!h)
			return err_set(e, ST_NOMEM, "MTP broadcast index");
		for (size_t i = 0; i < nb; i++)
			h[i] = (int32_t)(i / (size_t)n);
		if (!(st = fwd__mem_alloc(f, &f->mtp_bidx, nb * sizeof *h, e)) &&
		    (st = kern_mem_upload(&f->mem, f->mtp_bidx, h, nb * sizeof *h, e))) {
			kern_mem_free(&f->mem, f->mtp_bidx);
			f->mtp_bidx = NULL;
		}
		if (!st)
			st = kern_mem_sync(&f->mem, e); /* h is freed right after */
		free(h);
		if (st)
			return st;
	}
	/* streams may be f->x (the main pass's result): copy them out of the way first */
	if ((st = kern_mem_copy(&f->mem, f->m2, streams, (size_t)(T * n * D) * sizeof(float), e)) ||
	    (st = fwd__embed(f, f->fo, 1, e)) ||
	    (st = kern_mem_copy(&f->mem, f->u, f->fo, (size_t)(T * D) * sizeof(float), e)))
		return st;
	if ((st = fwd__norm(f, ly, f->u, f->u, T, (int)D, ly->enorm, true, l, e)) ||
	    (st = fwd__lin(f, &ly->e_proj, f->u, 0, T, f->fo, 0, true, l, e)) ||
	    (st = fwd__norm(f, ly, f->m2, f->m1, T * n, (int)D, ly->hnorm, true, l, e)) ||
	    (st = fwd__lin(f, &ly->h_proj, f->m1, 0, T * n, f->m2, 0, true, l, e)))
		return st;
	/* X0 = e_proj(e) broadcast over the streams + h_proj(x) per stream */
	if ((st = fwd__copy_rows(f, f->x, D, NULL, f->fo, D, f->mtp_bidx, T * n, D, e)))
		return st;
	struct kern_add_args aa = {.y = f->x, .x = f->m2, .n = T * n * D, .stream = f->mem.stream};
	OK(l, f->g->add(&aa));
	if ((st = fwd__round_bf16(f, f->x, T * n * D, e)) || (st = block(f, l, e)))
		return st;
	return ST_OK;
}

enum status model_fwd_mtp_rows(struct model_fwd *f, const struct exec_step *step, const float *streams,
			       const uint32_t *rows, uint32_t n_rows, float *logits, struct err *e)
{
	enum status st = mtp_block(f, step, streams, e);
	if (st || !n_rows)
		return st;
	const struct model_layer *ly = &f->w->layers[f->w->n_layers];
	for (uint32_t i = 0; i < n_rows; i++)
		if (rows[i] >= f->T)
			return err_set(e, ST_INVALID, "MTP logit row %u of a %u-token step", rows[i], f->T);
	return fwd__head(f, ly, &ly->mtp_hc_head, ly->mtp_norm, f->x, rows, n_rows, logits, e);
}

const float *model_fwd_mtp_streams(const struct model_fwd *f)
{
	return f->x;
}

const struct kern_mem *model_fwd_mem(const struct model_fwd *f)
{
	return &f->mem;
}

enum status model_fwd_mtp(struct model_fwd *f, const struct exec_step *step, const float *streams, float *logits,
			  struct err *e)
{
	uint32_t *rows = malloc((size_t)step->n_tokens * sizeof *rows + 4);
	if (!rows)
		return err_set(e, ST_NOMEM, "mtp rows");
	for (uint32_t i = 0; i < step->n_tokens; i++)
		rows[i] = i;
	enum status st = model_fwd_mtp_rows(f, step, streams, rows, step->n_tokens, logits, e);
	free(rows);
	return st;
}
