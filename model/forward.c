/*
 * model/forward.c: the forward pass of DeepSeek-V4 over a flat batch
 * (model/forward.h), one code path for every backend. Every numeric op and
 * every data movement is the variant of the plan (model/weights.h): the CPU
 * references on the host, the CUDA variants on a GPU, over buffers of the
 * same struct kern_mem (kernels/device/mem.h) as the weights and the block
 * pool. What stays on the host is the step's planning: segments, waves,
 * index lists and offsets, computed from the step plan in batch_prepare
 * into a small metadata arena that is uploaded once per step (plus, in the
 * fp32 golden-comparison mode only, one small list per compressed layer).
 *
 * Block rule 2 inside a step: a sequence's chunk is cut into segments at
 * block boundaries. Wave j holds the j-th segment of every sequence. Before
 * wave j is compressed, each of its segments that starts a block copies the
 * previous block's compressor state into its own (or initialises it at
 * position 0), so a completed block ends holding its boundary snapshot; the
 * ring is written wave by wave after attention the same way. When every
 * sequence has a single segment (decodes, chunks inside one block) the one
 * wave is the flat batch itself and nothing is gathered.
 *
 * MoE rows: the grouped layout has at most n_tokens * top_k rows (all of
 * them when this rank holds every expert); the expert ops run on that bound
 * and the dispatch's row count, which stays where it was computed, decides
 * which rows exist, so no value travels back to the host inside a step.
 */
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels/device/graph.h"
#include "kernels/quant/quant.h"

/* One segment: the tokens of one sequence inside one block. */
struct seg {
	int s;            /* sequence */
	uint32_t i0, i1;  /* flat tokens */
	int32_t pos0;     /* position of i0 */
	int32_t blk;      /* block id */
	int32_t prev_blk; /* block id of the previous table entry when pos0 % B == 0 and pos0 > 0, else -1 */
};

/* Wave j of the step: host counts and metadata-arena arrays (see DEV). */
struct wave {
	int ns;             /* segments */
	uint32_t nt;        /* tokens */
	int32_t *q_off;     /* [ns + 1] offsets into the wave's gathered tokens */
	int32_t *start;     /* [ns] position of each segment's first token */
	int32_t *slot;      /* [ns] block of each segment (compressor state slot) */
	int32_t *bt;        /* [ns, bt_stride] block table of each segment's sequence */
	int64_t *ring_row0; /* [ns] ring pool row of slot 0 of each segment's block */
	int32_t *gather;    /* [nt] flat token of each wave token; NULL: the flat batch itself */
	int32_t *init_ids;  /* [n_init] blocks whose compressor state starts at position 0 */
	int n_init;
	int32_t *cp_dst, *cp_src; /* [n_cp] block-state copies of rule 2 */
	int n_cp;
};

#define MAX_KINDS 4 /* distinct compressed-row pool sizes (SWA 0, CSA, HCA, spare) */

struct model_fwd {
	const struct model_weights *w;
	struct model_state *st;
	struct model_fwd_options opt;
	const struct model_config *cfg;
	struct kern_mem mem;
	const struct model_global_ops *g;
	int64_t D, n, H, d, r, G, R, QL, I, E, K, NHI, ID, V;
	int64_t EL, EB, VL, VB; /* local experts / vocabulary rows (tensor parallel) */
	int rank, ws;
	bool comm_staged;          /* the communicator takes host buffers only: stage device buffers */
	float *comm_host;          /* [T * n * D] host staging for comm_staged */
	float *lg_local, *lg_all;  /* TP head: this rank's vocabulary shard, the gathered shards */
	int idx_stride;
	void *lt_ws;               /* linear workspace (cuBLASLt), lt_ws_bytes */
	size_t lt_ws_bytes;

	/* the metadata arena: host staging and its device mirror (the same
	 * buffer on the host backend); reset every step */
	char *meta_h, *meta_d;
	size_t meta_cap, meta_used, meta_flushed;
	int perturb; /* DSV4_FWD_PERTURB at create: the 1-ulp input perturbation (host only) */
	int trace_steps, step_no; /* DSV4_FWD_TRACE=N: checksums of every op's output in the first N steps */

	/* the current batch (host values) */
	uint32_t T;
	int S;
	struct seg *segs;
	int n_segs, max_wave;
	int *seg_first;             /* [S + 1] first segment of each sequence */
	int32_t *bt_h;              /* [S, bt_stride] host block tables */
	int32_t *entry_blk;         /* [S] */
	int32_t bt_stride;
	struct wave *waves;         /* [max waves] */
	/* the current batch (arena arrays) */
	int32_t *ids, *pos, *q_off, *start_pos, *bt;
	int n_kinds;
	int kind_rows[MAX_KINDS];   /* compressed-row pool size of each kind */
	int64_t *ring_row0[MAX_KINDS]; /* [S] per kind: index-space row of ring slot 0 of each sequence */

	/* activations (mem) */
	float *x, *x2, *u, *xn, *fo, *mix, *sqr, *pre, *post, *comb;
	float *qr, *q, *kv, *o, *z, *kvp, *gp, *ikvp, *igp, *wa, *wb, *qi, *hw, *topk_work;
	int32_t *topk, *idx, *idx_len;
	float *glog, *ew, *rw, *h1, *h3, *y2, *sh1, *sh3, *shy, *hh, *m1, *m2;
	int32_t *eids, *offsets, *row_src, *row_slot, *slot_row;
	int64_t *n_rows;
	float *pooled;        /* FP32 mode: the compressors' pre-norm entries (largest row pool) */
	float *x_final;
	struct fwd_spec *spec; /* speculative decoding: verify rollback (section at the end), or NULL */
	int32_t *mtp_bidx;     /* MTP: [max_tokens * hc_mult] row t of each stream row (t * n + j), in mem */
	float *dsp_cap;        /* DSpark: [max_tokens, n_targets * D] target-layer captures (host), or NULL */
};

struct fwd_spec;
static enum status fwd_spec_stash(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e);
static void fwd_spec_free(struct model_fwd *f);

/* ---- memory ---- */

static enum status mem_alloc(struct model_fwd *f, void *pp, size_t bytes, struct err *e)
{
	void *p = NULL;
	enum status st = kern_mem_alloc(&f->mem, bytes, &p, e);
	memcpy(pp, &p, sizeof p);
	return st;
}

/* The device address of a host pointer into the metadata arena. */
#define DEV(f, hp) ((__typeof__(hp))(void *)((hp) ? (f)->meta_d + ((const char *)(hp) - (f)->meta_h) : NULL))

/* n bytes of the arena (16-byte aligned), NULL when the arena is full (a
 * sizing bug, reported by the caller). */
static void *meta_take(struct model_fwd *f, size_t n)
{
	size_t off = (f->meta_used + 15) & ~(size_t)15;
	if (off + n > f->meta_cap)
		return NULL;
	f->meta_used = off + n;
	return f->meta_h + off;
}

/* Upload what was taken since the last flush. */
static enum status meta_flush(struct model_fwd *f, struct err *e)
{
	if (f->meta_d == f->meta_h || f->meta_used == f->meta_flushed) {
		f->meta_flushed = f->meta_used;
		return ST_OK;
	}
	enum status st = kern_mem_upload(&f->mem, f->meta_d + f->meta_flushed, f->meta_h + f->meta_flushed,
					 f->meta_used - f->meta_flushed, e);
	f->meta_flushed = f->meta_used;
	return st;
}

/* Debugging aid (DSV4_FWD_TRACE=N): one line per op output of the first N
 * steps — sum, sum of |x| and two values — so that a CPU and a GPU run of the
 * same step can be compared line by line to find the first op that differs.
 * Downloads synchronously: never enabled in serving. */
static void trace(const struct model_fwd *f, const char *what, int layer, const float *x, int64_t n)
{
	if (f->step_no >= f->trace_steps || n <= 0 || !x)
		return;
	float *h = malloc((size_t)n * sizeof *h);
	struct err e = {0};
	if (!h || kern_mem_download(&f->mem, h, x, (size_t)n * sizeof *h, &e)) {
		free(h);
		return;
	}
	double s = 0, a = 0;
	for (int64_t i = 0; i < n; i++) {
		s += h[i];
		a += fabs(h[i]);
	}
	fprintf(stderr, "fwdtrace %s %p step %d layer %d %-24s n=%lld sum=%.7g abs=%.7g x0=%.7g xl=%.7g\n",
		f->mem.device ? "gpu" : "cpu", (const void *)f, f->step_no, layer, what, (long long)n, s, a, h[0], h[n - 1]);
	free(h);
}

#define TAKE(f, p, count)                                                                          \
	do {                                                                                       \
		(p) = meta_take((f), (size_t)(count) * sizeof *(p));                               \
		if (!(p))                                                                          \
			return err_set(e, ST_INVALID, "forward: step metadata over %zu bytes", (f)->meta_cap); \
	} while (0)

enum status model_fwd_create(struct model_fwd **out, const struct model_weights *w, struct model_state *s,
			     const struct model_fwd_options *opt, struct err *e)
{
	*out = NULL;
	struct model_fwd *f = calloc(1, sizeof *f);
	if (!f)
		return err_set(e, ST_NOMEM, "forward");
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
	f->R = c->o_lora_rank;
	f->QL = c->q_lora_rank;
	f->I = c->moe_intermediate_size;
	f->E = c->n_routed_experts;
	f->K = c->num_experts_per_tok;
	f->NHI = c->index_n_heads;
	f->ID = c->index_head_dim;
	f->V = c->vocab_size;
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
	if (stride > (1 << 24)) {
		free(f);
		return err_set(e, ST_INVALID, "forward: index set of %lld rows per token", (long long)stride);
	}
	f->idx_stride = (int)stride;
	/* the distinct compressed-row pool sizes, for the per-kind ring rows */
	f->kind_rows[f->n_kinds++] = 0;
	for (int l = 0; l < s->n_layers; l++) {
		int rows = s->ls[l].ratio ? s->ls[l].per_block * (int)s->n_blocks : 0;
		bool seen = false;
		for (int k = 0; k < f->n_kinds; k++)
			seen |= f->kind_rows[k] == rows;
		if (!seen && f->n_kinds < MAX_KINDS)
			f->kind_rows[f->n_kinds++] = rows;
	}
	int64_t T = opt->max_tokens, S = opt->max_seqs, n = f->n, D = f->D;
	int64_t P = T * f->K, B = s->block_tokens;
	f->bt_stride = (int32_t)((opt->max_context + B - 1) / B + 1);
	int64_t max_segs = S + T / B + S; /* each sequence: ceil(len/B) + 1 at most */
	f->segs = calloc((size_t)max_segs + 1, sizeof *f->segs);
	f->seg_first = calloc((size_t)S + 2, sizeof *f->seg_first);
	f->bt_h = calloc((size_t)(S * f->bt_stride) + 1, sizeof *f->bt_h);
	f->entry_blk = calloc((size_t)S + 1, sizeof *f->entry_blk);
	f->waves = calloc((size_t)max_segs + 1, sizeof *f->waves);
	if (!f->segs || !f->seg_first || !f->bt_h || !f->entry_blk || !f->waves)
		goto nomem;
	/* arena bound: step arrays, per-kind ring rows, every wave's arrays, the
	 * fp32 lists of every compressed layer, the head's rows */
	size_t ints = (size_t)(4 * T + 4 * S + S * f->bt_stride + 2 * MAX_KINDS * S) +
		      (size_t)(max_segs * (8 + f->bt_stride) + T) + (size_t)(2 * T + 8) * (size_t)(s->n_layers + 1) * 2 +
		      (size_t)(2 * T * f->ws + 64);
	f->meta_cap = ints * 4 + 16 * (size_t)(64 + 4 * max_segs + 4 * s->n_layers);
	enum status st;
	if ((st = kern_mem_host_alloc(&f->mem, f->meta_cap, (void **)&f->meta_h, e)))
		goto fail;
	if (f->mem.device) {
		if ((st = mem_alloc(f, &f->meta_d, f->meta_cap, e)))
			goto fail;
	} else {
		f->meta_d = f->meta_h;
	}
#define ALLOC(p, count)                                                                            \
	do {                                                                                       \
		if ((st = mem_alloc(f, &(p), ((size_t)(count) + 1) * sizeof *(p), e)))             \
			goto fail;                                                                 \
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
			goto nomem;
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
	f->lt_ws_bytes = model_weights_linear_workspace_bytes(w, T);
	if (f->lt_ws_bytes)
		ALLOC(f->lt_ws, f->lt_ws_bytes);
#undef ALLOC
	*out = f;
	return ST_OK;
nomem:
	st = err_set(e, ST_NOMEM, "forward buffers for %u tokens", opt->max_tokens);
fail:
	model_fwd_destroy(f);
	return st;
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
	fwd_spec_free(f);
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

/* ---- helpers ---- */

/* A kernel call of layer `layer_` (-1: not one layer's op); a failure
 * becomes the enclosing function's error, in its `e`, naming the call. */
#define OK(layer_, call)                                                                           \
	do {                                                                                       \
		enum status st_ = (call);                                                          \
		if (st_)                                                                           \
			return err_set(e, st_, "layer %d: %s failed", (layer_), #call);            \
	} while (0)

static enum status round_bf16(const struct model_fwd *f, float *x, int64_t n, struct err *e)
{
	if (!f->opt.bf16_round || n <= 0)
		return ST_OK;
	struct kern_round_bf16_args a = {.x = x, .n = n, .stream = f->mem.stream};
	OK(-1, f->g->round_bf16(&a));
	return ST_OK;
}

/* A collective on x (n floats) in place; device buffers go through host
 * staging when the communicator takes host memory only (two ranks sharing a
 * GPU over the CPU or TCP backend). gather: all-gather into out (n per rank). */
static enum status collective(struct model_fwd *f, float *x, float *out, int64_t n, bool gather, struct err *e)
{
	if (f->ws == 1)
		return ST_OK;
	enum status st;
	if (!f->mem.device || !f->comm_staged) {
		enum comm_mem m = f->mem.device ? COMM_MEM_DEVICE : COMM_MEM_HOST;
		return gather ? comm_all_gather(f->opt.comm, x, out, (size_t)n, COMM_DTYPE_F32, m, e)
			      : comm_all_reduce_sum(f->opt.comm, x, x, (size_t)n, COMM_DTYPE_F32, m, e);
	}
	size_t b = (size_t)n * sizeof(float);
	if ((st = kern_mem_download(&f->mem, f->comm_host, x, b, e)))
		return st;
	if (!gather) {
		if ((st = comm_all_reduce_sum(f->opt.comm, f->comm_host, f->comm_host, (size_t)n, COMM_DTYPE_F32,
					      COMM_MEM_HOST, e)))
			return st;
		return kern_mem_upload(&f->mem, x, f->comm_host, b, e);
	}
	float *all = malloc(b * (size_t)f->ws);
	if (!all)
		return err_set(e, ST_NOMEM, "all-gather staging");
	st = comm_all_gather(f->opt.comm, f->comm_host, all, (size_t)n, COMM_DTYPE_F32, COMM_MEM_HOST, e);
	if (!st)
		st = kern_mem_upload(&f->mem, out, all, b * (size_t)f->ws, e);
	if (!st)
		st = kern_mem_sync(&f->mem, e); /* all is freed right after */
	free(all);
	return st;
}

static enum status all_reduce(struct model_fwd *f, float *x, int64_t n, struct err *e)
{
	return collective(f, x, NULL, n, false, e);
}

/* y[T, out] = x[T, in]·Wᵀ through the layer plan's variant; round: the
 * reference keeps this output in bf16. */
static enum status lin(const struct model_fwd *f, const struct model_lin *l, const float *x, int64_t ldx, int64_t T,
		       float *y, int64_t ldy, bool round, int layer, struct err *e)
{
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = KERN_DT_F32, .ldx = ldx, .y = y,
				     .y_dtype = KERN_DT_F32, .ldy = ldy, .w = &l->w,
				     .act_quant_block = l->act_quant_block, .stream = f->mem.stream,
				     .workspace = f->lt_ws, .workspace_bytes = f->lt_ws_bytes, .ctx = f->opt.kctx};
	OK(layer, (l->run_dec && T <= l->dec_tokens ? l->run_dec : l->run)(&a));
	if (!ldy)
		trace(f, l->v->name, layer, y, T * l->w.rows);
	if (round && f->opt.bf16_round) {
		int64_t ly = ldy ? ldy : l->w.rows;
		if (ly == l->w.rows)
			return round_bf16(f, y, T * ly, e);
		for (int64_t t = 0; t < T; t++) {
			enum status st = round_bf16(f, y + t * ly, l->w.rows, e);
			if (st)
				return st;
		}
	}
	return ST_OK;
}

static enum status norm(const struct model_fwd *f, const struct model_layer *ly, float *x, float *y, int64_t rows,
			int dim, const uint16_t *w, bool round, int layer, struct err *e)
{
	struct kern_rmsnorm_args a = {.x = x, .y = y, .w_bf16 = w, .n_rows = rows, .dim = dim,
				      .eps = (float)f->cfg->rms_norm_eps, .bf16_out = round && f->opt.bf16_round,
				      .stream = f->mem.stream};
	OK(layer, ly->ops.rmsnorm(&a));
	return ST_OK;
}

static enum status copy_rows(const struct model_fwd *f, float *dst, int64_t dst_stride, const int32_t *dst_idx,
			     const float *src, int64_t src_stride, const int32_t *src_idx, int64_t n_rows, int64_t dim,
			     struct err *e)
{
	struct kern_copy_rows_args a = {.dst = dst, .dst_stride = dst_stride, .dst_idx = dst_idx, .src = src,
					.src_stride = src_stride, .src_idx = src_idx, .n_rows = n_rows, .dim = dim,
					.stream = f->mem.stream};
	OK(-1, f->g->copy_rows(&a));
	return ST_OK;
}

/* ---- the batch ---- */

/* Check the step, cut it into segments and waves, and write every index
 * array the ops read into the metadata arena; one upload. */
static enum status batch_prepare(struct model_fwd *f, const struct exec_step *step, struct err *e)
{
	uint32_t B = f->st->block_tokens;
	int64_t W = f->cfg->sliding_window;
	if (step->n_tokens > f->opt.max_tokens || step->n_seqs > f->opt.max_seqs)
		return err_set(e, ST_INVALID, "step of %u tokens / %u sequences exceeds %u / %u", step->n_tokens,
			       step->n_seqs, f->opt.max_tokens, f->opt.max_seqs);
	/* the arena's host side is reused: the previous step's uploads must be done */
	enum status st0 = kern_mem_sync(&f->mem, e);
	if (st0)
		return st0;
	f->meta_used = f->meta_flushed = 0;
	f->T = step->n_tokens;
	f->S = (int)step->n_seqs;
	f->n_segs = 0;
	f->max_wave = 0;
	for (uint32_t i = 0; i < step->n_tokens; i++)
		if (step->token_ids[i] < 0 || step->token_ids[i] >= f->V)
			return err_set(e, ST_INVALID, "token id %d outside the vocabulary", step->token_ids[i]);
	TAKE(f, f->ids, f->T);
	TAKE(f, f->pos, f->T);
	TAKE(f, f->q_off, f->S + 1);
	TAKE(f, f->start_pos, f->S);
	TAKE(f, f->bt, (int64_t)f->S * f->bt_stride);
	memcpy(f->ids, step->token_ids, (size_t)f->T * sizeof(int32_t));
	memcpy(f->pos, step->positions, (size_t)f->T * sizeof(int32_t));
	for (int s = 0; s < f->S; s++) {
		const struct exec_seq *sq = &step->seqs[s];
		uint32_t i0 = step->query_start[s], i1 = step->query_start[s + 1];
		if (i1 < i0 || i1 > step->n_tokens || (s == 0 && i0 != 0) ||
		    (s == f->S - 1 && i1 != step->n_tokens))
			return err_set(e, ST_INVALID, "sequence %d: query range [%u, %u)", s, i0, i1);
		uint32_t p = sq->n_cached_tokens;
		if (sq->n_context_tokens != p + (i1 - i0) || sq->n_context_tokens > f->opt.max_context ||
		    (uint64_t)sq->n_blocks * B < sq->n_context_tokens || sq->n_blocks > (uint32_t)f->bt_stride ||
		    sq->block_table_start + sq->n_blocks > step->n_block_ids)
			return err_set(e, ST_INVALID, "sequence %d: %u cached + %u tokens, %u blocks of %u", s, p, i1 - i0,
				       sq->n_blocks, B);
		for (uint32_t i = i0; i < i1; i++)
			if (step->positions[i] != (int32_t)(p + (i - i0)))
				return err_set(e, ST_INVALID, "sequence %d: token %u at position %d, expected %u", s, i,
					       step->positions[i], p + (i - i0));
		f->q_off[s] = (int32_t)i0;
		f->start_pos[s] = (int32_t)p;
		int32_t *bt = f->bt_h + (size_t)s * f->bt_stride;
		for (int32_t k = 0; k < f->bt_stride; k++) {
			int32_t b = -1;
			if ((uint32_t)k < sq->n_blocks) {
				uint32_t id = step->block_ids[sq->block_table_start + k];
				if (id >= f->st->n_blocks)
					return err_set(e, ST_INVALID, "sequence %d: block id %u of %u", s, id, f->st->n_blocks);
				b = (int32_t)id;
			}
			bt[k] = b;
		}
		f->entry_blk[s] = p ? bt[(p - 1) / B] : bt[0];
		/* segments at block boundaries */
		f->seg_first[s] = f->n_segs;
		uint32_t i = i0;
		while (i < i1) {
			uint32_t pos = p + (i - i0);
			uint32_t k = pos / B;
			uint32_t end = (k + 1) * B - p + i0;
			if (end > i1)
				end = i1;
			struct seg *g = &f->segs[f->n_segs++];
			g->s = s;
			g->i0 = i;
			g->i1 = end;
			g->pos0 = (int32_t)pos;
			g->blk = bt[k];
			g->prev_blk = pos % B == 0 && pos > 0 ? bt[k - 1] : -1;
			i = end;
		}
		int nw = f->n_segs - f->seg_first[s];
		if (nw > f->max_wave)
			f->max_wave = nw;
	}
	f->q_off[f->S] = (int32_t)step->n_tokens;
	f->seg_first[f->S] = f->n_segs;
	memcpy(f->bt, f->bt_h, (size_t)f->S * f->bt_stride * sizeof(int32_t));
	/* per kind of layer: the index-space row of each sequence's ring slot 0
	 * (attention's index sets run over [compressed pool | fresh kv | rings]) */
	for (int k = 0; k < f->n_kinds; k++) {
		TAKE(f, f->ring_row0[k], f->S);
		for (int s = 0; s < f->S; s++)
			f->ring_row0[k][s] = f->kind_rows[k] + (int64_t)f->T + (int64_t)f->entry_blk[s] * W;
	}
	/* the waves */
	for (int j = 0; j < f->max_wave; j++) {
		struct wave *wv = &f->waves[j];
		memset(wv, 0, sizeof *wv);
		int ns = 0;
		for (int s = 0; s < f->S; s++)
			ns += f->seg_first[s] + j < f->seg_first[s + 1];
		wv->ns = ns;
		TAKE(f, wv->q_off, ns + 1);
		TAKE(f, wv->start, ns);
		TAKE(f, wv->slot, ns);
		TAKE(f, wv->bt, (int64_t)ns * f->bt_stride);
		TAKE(f, wv->ring_row0, ns);
		TAKE(f, wv->init_ids, ns);
		TAKE(f, wv->cp_dst, ns);
		TAKE(f, wv->cp_src, ns);
		uint32_t nt = 0;
		int k = 0;
		wv->q_off[0] = 0;
		for (int s = 0; s < f->S; s++) {
			int gi = f->seg_first[s] + j;
			if (gi >= f->seg_first[s + 1])
				continue;
			const struct seg *g = &f->segs[gi];
			if (g->pos0 == 0)
				wv->init_ids[wv->n_init++] = g->blk;
			else if (g->prev_blk >= 0) {
				wv->cp_dst[wv->n_cp] = g->blk;
				wv->cp_src[wv->n_cp++] = g->prev_blk;
			}
			wv->start[k] = g->pos0;
			wv->slot[k] = g->blk;
			wv->ring_row0[k] = (int64_t)g->blk * W;
			memcpy(wv->bt + (size_t)k * f->bt_stride, f->bt_h + (size_t)s * f->bt_stride,
			       (size_t)f->bt_stride * sizeof(int32_t));
			nt += g->i1 - g->i0;
			wv->q_off[++k] = (int32_t)nt;
		}
		wv->nt = nt;
		if (f->max_wave > 1) {
			TAKE(f, wv->gather, nt);
			uint32_t t = 0;
			for (int s = 0; s < f->S; s++) {
				int gi = f->seg_first[s] + j;
				if (gi >= f->seg_first[s + 1])
					continue;
				for (uint32_t i = f->segs[gi].i0; i < f->segs[gi].i1; i++)
					wv->gather[t++] = (int32_t)i;
			}
		}
	}
	return meta_flush(f, e);
}

/* ---- mHC ---- */

/* (pre, post, comb) of site hc for streams x, and u = Σ pre_j x_j. */
static enum status hc_pre(struct model_fwd *f, const struct model_layer *ly, const struct model_hc *hc,
			  const float *x, float *u, int layer, struct err *e)
{
	int n = (int)f->n, k = (int)(f->n * f->D);
	void *sm = f->mem.stream;
	struct kern_hc_prenorm_args pa = {.x = x, .fn = hc->fn, .mix = f->mix, .sqr_sum = f->sqr, .n_tokens = f->T,
					  .k = k, .n_out = (2 + n) * n, .stream = sm};
	OK(layer, ly->ops.hc_prenorm(&pa));
	struct kern_hc_split_args sa = {.mix = f->mix, .sqr_sum = f->sqr, .n_tokens = f->T, .n_streams = n, .k = k,
					.norm_eps = (float)f->cfg->rms_norm_eps, .scale = hc->scale, .base = hc->base,
					.sinkhorn_iters = (int)f->cfg->hc_sinkhorn_iters,
					.hc_eps = (float)f->cfg->hc_eps, .pre = f->pre, .post = f->post, .comb = f->comb,
					.stream = sm};
	OK(layer, ly->ops.hc_split(&sa));
	struct kern_hc_pre_combine_args ca = {.x = x, .pre = f->pre, .u = u, .n_tokens = f->T, .n_streams = n,
					      .dim = (int)f->D, .bf16_out = f->opt.bf16_round, .stream = sm};
	OK(layer, ly->ops.hc_pre_combine(&ca));
	return ST_OK;
}

static enum status hc_post(struct model_fwd *f, const struct model_layer *ly, const float *fo, const float *x,
			   float *x_out, int layer, struct err *e)
{
	struct kern_hc_post_args a = {.f = fo, .x = x, .post = f->post, .comb = f->comb, .x_out = x_out,
				      .n_tokens = f->T, .n_streams = (int)f->n, .dim = (int)f->D,
				      .bf16_out = f->opt.bf16_round, .stream = f->mem.stream};
	OK(layer, ly->ops.hc_post(&a));
	return ST_OK;
}

/* ---- block state (rule 2) ---- */

/* Copy (cp) or initialise (init) the regions of the blocks of wave wv in one
 * state array of layer l: region_floats per block, value for init. */
static enum status state_regions(struct model_fwd *f, const struct wave *wv, float *pool, int64_t region_floats,
				 bool init, float value, struct err *e)
{
	if (init && wv->n_init) {
		struct kern_block_fill_args a = {.pool = pool, .region_stride = region_floats,
						 .region_len = region_floats, .ids = DEV(f, wv->init_ids),
						 .n = wv->n_init, .value = value, .stream = f->mem.stream};
		OK(-1, f->g->block_fill(&a));
	}
	if (!init && wv->n_cp) {
		struct kern_block_copy_args a = {.pool = pool, .region_stride = region_floats,
						 .region_len = region_floats, .dst_ids = DEV(f, wv->cp_dst),
						 .src_ids = DEV(f, wv->cp_src), .n = wv->n_cp, .stream = f->mem.stream};
		OK(-1, f->g->block_copy(&a));
	}
	return ST_OK;
}

/* Rule 2 for the compressor state of layer l before wave wv runs. */
static enum status compressor_state(struct model_fwd *f, const struct model_layer_state *q, const struct wave *wv,
				    struct err *e)
{
	enum status st;
	if ((st = state_regions(f, wv, q->cmp_kv, q->cmp_state_floats, true, 0.0f, e)) ||
	    (st = state_regions(f, wv, q->cmp_score, q->cmp_state_floats, true, -INFINITY, e)) ||
	    (st = state_regions(f, wv, q->cmp_kv, q->cmp_state_floats, false, 0, e)) ||
	    (st = state_regions(f, wv, q->cmp_score, q->cmp_state_floats, false, 0, e)))
		return st;
	if (!q->indexer)
		return ST_OK;
	if ((st = state_regions(f, wv, q->icmp_kv, q->icmp_state_floats, true, 0.0f, e)) ||
	    (st = state_regions(f, wv, q->icmp_score, q->icmp_state_floats, true, -INFINITY, e)) ||
	    (st = state_regions(f, wv, q->icmp_kv, q->icmp_state_floats, false, 0, e)) ||
	    (st = state_regions(f, wv, q->icmp_score, q->icmp_state_floats, false, 0, e)))
		return st;
	return ST_OK;
}

/* ---- compressors ---- */

/* FP32 mode: the compressor op rounds its entries to bf16 around the norm
 * and rope, as the reference does; transformers in float32 does not. Redo
 * the norm and rope of the entries wave j emitted from their pooled
 * (pre-norm) values in fp32, with the same ops: gather the pooled rows, norm
 * and rope them, scatter them back over the entries. */
static enum status cmp_fp32_post(struct model_fwd *f, const struct model_layer *ly, int l, int j, float *out,
				 int dim, const uint16_t *norm_w, struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int m = ly->ratio;
	int64_t n = 0;
	for (int s = 0; s < f->S; s++) {
		int gi = f->seg_first[s] + j;
		if (gi < f->seg_first[s + 1])
			n += kern_compressor_n_emitted(f->segs[gi].pos0, f->segs[gi].i1 - f->segs[gi].i0, m);
	}
	if (!n)
		return ST_OK;
	int32_t *rows, *wpos;
	TAKE(f, rows, n);
	TAKE(f, wpos, n);
	int64_t k = 0;
	for (int s = 0; s < f->S; s++) {
		int gi = f->seg_first[s] + j;
		if (gi >= f->seg_first[s + 1])
			continue;
		const struct seg *g = &f->segs[gi];
		int64_t w0 = g->pos0 / m, nw = kern_compressor_n_emitted(g->pos0, g->i1 - g->i0, m);
		for (int64_t w = w0; w < w0 + nw; w++, k++) {
			rows[k] = (int32_t)((int64_t)f->bt_h[s * f->bt_stride + w / q->per_block] * q->per_block +
					    w % q->per_block);
			wpos[k] = (int32_t)w;
		}
	}
	enum status st = meta_flush(f, e);
	if (st)
		return st;
	float *tmp = f->wa; /* free until the indexer's gathers */
	if ((st = copy_rows(f, tmp, dim, NULL, f->pooled, dim, DEV(f, rows), n, dim, e)))
		return st;
	struct kern_rmsnorm_args na = {.x = tmp, .y = tmp, .w_bf16 = norm_w, .n_rows = n, .dim = dim,
				       .eps = (float)f->cfg->rms_norm_eps, .stream = f->mem.stream};
	OK(l, ly->ops.rmsnorm(&na));
	struct kern_rope_args ra = {.x = tmp, .pos = DEV(f, wpos), .omega = ly->omega, .n_rows = n, .n_heads = 1,
				    .head_dim = dim, .rope_dim = (int)f->r, .pos_mul = m, .stream = f->mem.stream};
	OK(l, ly->ops.rope(&ra));
	return copy_rows(f, out, dim, DEV(f, rows), tmp, dim, NULL, n, dim, e);
}

static enum status compress_waves(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int m = ly->ratio, d = (int)f->d, id = (int)f->ID, r = (int)f->r;
	int c = q->overlap ? 2 : 1;
	enum status st;
	for (int j = 0; j < f->max_wave; j++) {
		const struct wave *wv = &f->waves[j];
		if (!wv->ns)
			continue;
		if ((st = compressor_state(f, q, wv, e)))
			return st;
		const float *kv = f->kvp, *gate = f->gp;
		if (wv->gather) {
			if ((st = copy_rows(f, f->wa, 0, NULL, f->kvp, 0, DEV(f, wv->gather), wv->nt, c * d, e)) ||
			    (st = copy_rows(f, f->wb, 0, NULL, f->gp, 0, DEV(f, wv->gather), wv->nt, c * d, e)))
				return st;
			kv = f->wa;
			gate = f->wb;
		}
		struct kern_compressor_args a = {
			.kv_proj = kv, .gate_proj = gate, .ape = ly->cmp_ape, .n_tokens = wv->nt, .n_seqs = wv->ns,
			.q_off = DEV(f, wv->q_off), .start_pos = DEV(f, wv->start), .kv_state = q->cmp_kv,
			.score_state = q->cmp_score, .state_slot = DEV(f, wv->slot), .n_state_slots = f->st->n_blocks,
			.ratio = m, .overlap = q->overlap, .head_dim = d, .rope_dim = r, .norm_w = ly->cmp_norm,
			.norm_eps = (float)f->cfg->rms_norm_eps, .omega = ly->omega,
			.post = f->opt.quant_sim ? KERN_CMP_POST_FP8_NOPE : KERN_CMP_POST_NONE, .out = q->cmp,
			.out_paged = {.block_table = DEV(f, wv->bt), .bt_stride = f->bt_stride, .per_block = q->per_block},
			.n_out_rows = (int64_t)f->st->n_blocks * q->per_block, .pooled = f->pooled,
			.stream = f->mem.stream};
		OK(l, ly->ops.compressor(&a));
		if (f->pooled && (st = cmp_fp32_post(f, ly, l, j, q->cmp, d, ly->cmp_norm, e)))
			return st;
		if (!q->indexer)
			continue;
		/* the indexer's private compressor, same segments */
		kv = f->ikvp;
		gate = f->igp;
		if (wv->gather) {
			if ((st = copy_rows(f, f->wa, 0, NULL, f->ikvp, 0, DEV(f, wv->gather), wv->nt, 2 * id, e)) ||
			    (st = copy_rows(f, f->wb, 0, NULL, f->igp, 0, DEV(f, wv->gather), wv->nt, 2 * id, e)))
				return st;
			kv = f->wa;
			gate = f->wb;
		}
		a.kv_proj = kv;
		a.gate_proj = gate;
		a.ape = ly->idx_cmp_ape;
		a.kv_state = q->icmp_kv;
		a.score_state = q->icmp_score;
		a.head_dim = id;
		a.norm_w = ly->idx_cmp_norm;
		a.post = f->opt.quant_sim ? KERN_CMP_POST_HADAMARD_FP4 : KERN_CMP_POST_NONE;
		a.out = q->ikeys;
		OK(l, ly->ops.compressor(&a));
		if (f->pooled && (st = cmp_fp32_post(f, ly, l, j, q->ikeys, id, ly->idx_cmp_norm, e)))
			return st;
	}
	return ST_OK;
}

/* ---- attention ---- */

static int kind_of(const struct model_fwd *f, int64_t cmp_rows)
{
	for (int k = 0; k < f->n_kinds; k++)
		if (f->kind_rows[k] == cmp_rows)
			return k;
	return -1;
}

/* After attention: this step's raw KV rows into the rings, wave by wave
 * (rule 2 for the ring part of the state). */
static enum status ring_waves(struct model_fwd *f, int l, struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int64_t W = f->cfg->sliding_window, d = f->d;
	enum status st;
	for (int j = 0; j < f->max_wave; j++) {
		const struct wave *wv = &f->waves[j];
		if (!wv->ns)
			continue;
		if ((st = state_regions(f, wv, q->ring, W * d, false, 0, e)))
			return st;
		const float *src = f->kv;
		if (wv->gather) {
			if ((st = copy_rows(f, f->wa, 0, NULL, f->kv, 0, DEV(f, wv->gather), wv->nt, d, e)))
				return st;
			src = f->wa;
		}
		struct kern_ring_write_args a = {.src = src, .ring = q->ring, .ring_row0 = DEV(f, wv->ring_row0),
						 .n_ring_rows = (int64_t)f->st->n_blocks * W, .n_tokens = wv->nt,
						 .n_seqs = wv->ns, .q_off = DEV(f, wv->q_off), .start_pos = DEV(f, wv->start),
						 .window = (int)W, .dim = (int)d, .stream = f->mem.stream};
		OK(l, f->g->ring_write(&a));
	}
	return ST_OK;
}

static enum status attention(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
			     struct err *e)
{
	struct model_layer_state *q = &f->st->ls[l];
	int64_t T = f->T, H = f->H, d = f->d, r = f->r, W = f->cfg->sliding_window;
	void *sm = f->mem.stream;
	const int32_t *pos = DEV(f, f->pos);
	enum status st;
	/* q path */
	if ((st = lin(f, &ly->wq_a, xn, 0, T, f->qr, 0, true, l, e)))
		return st;
	if ((st = norm(f, ly, f->qr, f->qr, T, (int)f->QL, ly->q_norm, true, l, e)))
		return st;
	if ((st = lin(f, &ly->wq_b, f->qr, 0, T, f->q, 0, true, l, e)))
		return st;
	trace(f, "q", l, f->q, T * H * d);
	if ((st = norm(f, ly, f->q, f->q, T * H, (int)d, NULL, true, l, e)))
		return st;
	struct kern_rope_args ra = {.x = f->q, .pos = pos, .omega = ly->omega, .n_rows = T, .n_heads = (int)H,
				    .head_dim = (int)d, .rope_dim = (int)r, .bf16_out = f->opt.bf16_round, .stream = sm};
	OK(l, ly->ops.rope(&ra));
	/* shared K = V */
	if ((st = lin(f, &ly->wkv, xn, 0, T, f->kv, 0, true, l, e)))
		return st;
	if ((st = norm(f, ly, f->kv, f->kv, T, (int)d, ly->kv_norm, true, l, e)))
		return st;
	ra.x = f->kv;
	ra.n_heads = 1;
	OK(l, ly->ops.rope(&ra));
	trace(f, "kv", l, f->kv, T * d);
	if (f->opt.quant_sim) {
		struct kern_act_quant_sim_args qa = {.x = f->kv, .n_rows = T, .n_cols = d - r, .ld = d, .block = 64,
						     .stream = sm};
		OK(l, f->g->act_quant_sim(&qa));
	}

	/* compressed rows of this step (they may serve this step's own queries) */
	if (ly->ratio) {
		if ((st = lin(f, &ly->cmp_wkv, xn, 0, T, f->kvp, 0, false, l, e)) ||
		    (st = lin(f, &ly->cmp_wgate, xn, 0, T, f->gp, 0, false, l, e)))
			return st;
		if (q->indexer && ((st = lin(f, &ly->idx_cmp_wkv, xn, 0, T, f->ikvp, 0, false, l, e)) ||
				   (st = lin(f, &ly->idx_cmp_wgate, xn, 0, T, f->igp, 0, false, l, e))))
			return st;
		if ((st = compress_waves(f, ly, l, e)))
			return st;
		trace(f, "kvp", l, f->kvp, T * ly->cmp_wkv.w.rows);
	}
	struct kern_rowmap_paged paged = {.block_table = DEV(f, f->bt), .bt_stride = f->bt_stride,
					  .per_block = q->per_block};
	if (q->indexer) {
		int NHI = (int)f->NHI, ID = (int)f->ID;
		if ((st = lin(f, &ly->idx_wq_b, f->qr, 0, T, f->qi, 0, true, l, e)))
			return st;
		struct kern_rope_args ia = {.x = f->qi, .pos = pos, .omega = ly->omega, .n_rows = T, .n_heads = NHI,
					    .head_dim = ID, .rope_dim = (int)r, .bf16_out = f->opt.bf16_round,
					    .stream = sm};
		OK(l, ly->ops.rope(&ia));
		if (f->opt.quant_sim) {
			struct kern_indexer_rotate_args qa = {.x = f->qi, .n_rows = T * NHI, .dim = ID, .fp4_block = 32,
							      .stream = sm};
			OK(l, ly->ops.indexer_rotate(&qa));
		}
		if ((st = lin(f, &ly->idx_wproj, xn, 0, T, f->hw, 0, false, l, e)))
			return st;
		struct kern_indexer_topk_args ta = {
			.q = f->qi, .head_w = f->hw, .weight_scale = (float)(1.0 / sqrt((double)ID * NHI)),
			.keys = q->ikeys, .n_key_rows = (int64_t)f->st->n_blocks * q->per_block, .n_tokens = T,
			.n_seqs = f->S, .q_off = DEV(f, f->q_off), .start_pos = DEV(f, f->start_pos),
			.key_paged = paged, .ratio = ly->ratio, .n_heads = NHI, .head_dim = ID,
			.top_k = (int)f->cfg->index_topk, .topk = f->topk, .work = f->topk_work,
			.work_len = f->opt.max_context / 4 + 1, .stream = sm};
		OK(l, ly->ops.indexer_topk(&ta));
	}

	/* index sets over [compressed pool | fresh kv | rings] (compressed rows
	 * first: their paged rows carry no base offset) */
	int64_t cmp_rows = ly->ratio ? (int64_t)f->st->n_blocks * q->per_block : 0;
	int64_t ring_rows = (int64_t)f->st->n_blocks * W;
	int kind = kind_of(f, cmp_rows);
	if (kind < 0)
		return err_set(e, ST_INVALID, "layer %d: compressed pool of %lld rows was not planned", l,
			       (long long)cmp_rows);
	struct kern_attn_index_args xa = {
		.n_tokens = T, .n_seqs = f->S, .q_off = DEV(f, f->q_off), .start_pos = DEV(f, f->start_pos),
		.window = (int)W, .cur_row0 = cmp_rows, .ring_row0 = DEV(f, f->ring_row0[kind]), .ratio = ly->ratio,
		.cmp_paged = ly->ratio ? paged : (struct kern_rowmap_paged){0},
		.topk = q->indexer ? f->topk : NULL, .topk_stride = (int)f->cfg->index_topk, .idx = f->idx,
		.idx_len = f->idx_len, .idx_stride = f->idx_stride, .stream = sm};
	OK(l, ly->ops.attn_index(&xa));
	struct kern_sparse_attn_args aa = {.q = f->q, .out = f->o, .kv_stride = d, .idx = f->idx,
					   .idx_len = f->idx_len, .idx_stride = f->idx_stride, .sink = ly->attn_sink,
					   .softmax_scale = (float)(1.0 / sqrt((double)d)), .pos = pos,
					   .omega = ly->omega, .rope_dim = (int)r, .n_tokens = T, .n_heads = (int)H,
					   .head_dim = (int)d, .bf16_out = f->opt.bf16_round, .stream = sm, .ctx = f->opt.kctx};
	int ns = 0;
	if (ly->ratio) {
		aa.kv[ns] = q->cmp;
		aa.kv_rows[ns++] = cmp_rows;
	}
	aa.kv[ns] = f->kv;
	aa.kv_rows[ns++] = T;
	aa.kv[ns] = q->ring;
	aa.kv_rows[ns++] = ring_rows;
	OK(l, ly->ops.sparse_attn(&aa));
	trace(f, "attn_o", l, f->o, T * H * d);

	/* grouped low-rank output projection */
	int64_t hpg = H / f->G;
	for (int64_t g = 0; g < f->G; g++)
		if ((st = lin(f, &ly->wo_a[g], f->o + g * hpg * d, H * d, T, f->z + g * f->R, f->G * f->R, false, l, e)))
			return st;
	if ((st = round_bf16(f, f->z, T * f->G * f->R, e)) || (st = lin(f, &ly->wo_b, f->z, 0, T, out, 0, false, l, e)) || (st = all_reduce(f, out, T * f->D, e)) ||
	    (st = round_bf16(f, out, T * f->D, e)))
		return st;
	if (f->spec && (st = fwd_spec_stash(f, ly, l, e))) /* speculative decoding: keep the state inputs */
		return st;
	return ring_waves(f, l, e);
}

/* ---- MoE ---- */

static enum status moe(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
		       struct err *e)
{
	int64_t T = f->T, D = f->D, I = f->I, E = f->E, K = f->K, EL = f->EL;
	int64_t P = T * K; /* rows of the grouped layout at most; n_rows holds how many exist */
	void *sm = f->mem.stream;
	enum status st;
	if ((st = lin(f, &ly->gate, xn, 0, T, f->glog, 0, false, l, e)))
		return st;
	struct kern_route_args ra = {.logits = f->glog, .bias = ly->hash ? NULL : ly->gate_bias,
				     .tid2eid = ly->hash ? ly->tid2eid : NULL, .token_ids = DEV(f, f->ids),
				     .vocab = f->V, .n_tokens = T, .n_experts = (int)E, .top_k = (int)K,
				     .route_scale = (float)f->cfg->routed_scaling_factor, .expert_ids = f->eids,
				     .weights = f->ew, .stream = sm};
	OK(l, ly->ops.route(&ra));
	trace(f, "route_w", l, f->ew, T * K);
	struct kern_moe_dispatch_args da = {.n_tokens = T, .top_k = (int)K, .topk_ids = f->eids,
					    .expert_base = (int32_t)f->EB, .n_experts = EL, .expert_offsets = f->offsets,
					    .row_src = f->row_src, .row_slot = f->row_slot, .slot_row = f->slot_row,
					    .n_rows = f->n_rows, .stream = sm};
	OK(l, f->g->moe_dispatch(&da));
	struct kern_moe_row_weight_args wa = {.slot_weight = f->ew, .row_slot = f->row_slot, .n_rows = f->n_rows,
					      .max_rows = P, .row_weight = f->rw, .stream = sm};
	OK(l, f->g->moe_row_weight(&wa));
	const struct model_experts *x = &ly->experts;
	float limit = (float)f->cfg->swiglu_limit;
	/* ---- moe-decode: small steps run the fused routed-expert pass (kernels/moe_gemm/moe_decode.h):
	 * the same numerics as the ops below, into the same buffers, in two launches ---- */
	if (x->run_dec && T <= KERN_MOE_DECODE_MAX_TOKENS) {
		struct kern_moe_decode_args dd = {
			.n_tokens = T, .top_k = (int)K, .n_experts = EL, .expert_offsets = f->offsets,
			.row_src = f->row_src, .slot_row = f->slot_row, .row_weight = f->rw, .x = xn, .h = f->h1,
			.y = f->y2, .out = out, .w1 = x->w1, .w3 = x->w3, .w2 = x->w2, .w1_dev = x->w1_dev,
			.w3_dev = x->w3_dev, .w2_dev = x->w2_dev, .act_quant_block = x->act_quant_block,
			.swiglu_limit = limit, .bf16_round = f->opt.bf16_round, .stream = sm, .ctx = f->opt.kctx};
		OK(l, x->run_dec(&dd));
		goto combined;
	}
	/* ---- end moe-decode ---- */
	struct kern_moe_gemm_args ma = {.n_rows = P, .n_experts = EL, .expert_offsets = f->offsets,
					.row_src = f->row_src, .n_x_rows = T, .x = xn, .x_dtype = KERN_DT_F32,
					.y = f->h1, .y_dtype = KERN_DT_F32, .w = x->w1, .w_dev = x->w1_dev,
					.act_quant_block = x->act_quant_block, .stream = sm, .ctx = f->opt.kctx};
	OK(l, x->run13(&ma));
	ma.y = f->h3;
	ma.w = x->w3;
	ma.w_dev = x->w3_dev;
	OK(l, x->run13(&ma));
	trace(f, x->v13->name, l, f->h1, P * I);
	trace(f, "h3", l, f->h3, P * I);
	if ((st = round_bf16(f, f->h1, P * I, e)) || (st = round_bf16(f, f->h3, P * I, e)))
		return st;
	struct kern_swiglu_args sa = {.gate = f->h1, .up = f->h3, .out = f->h1, .row_weight = f->rw, .n_rows = P,
				      .dim = (int)I, .limit = limit, .bf16_out = f->opt.bf16_round, .stream = sm};
	OK(l, ly->ops.swiglu(&sa));
	struct kern_moe_gemm_args m2 = {.n_rows = P, .n_experts = EL, .expert_offsets = f->offsets, .n_x_rows = P,
					.x = f->h1, .x_dtype = KERN_DT_F32, .y = f->y2, .y_dtype = KERN_DT_F32,
					.w = x->w2, .w_dev = x->w2_dev, .act_quant_block = x->act_quant_block,
					.stream = sm, .ctx = f->opt.kctx};
	OK(l, x->run2(&m2));
	trace(f, x->v2->name, l, f->y2, P * D);
	if ((st = round_bf16(f, f->y2, P * D, e)))
		return st;
	struct kern_moe_combine_args ca = {.n_tokens = T, .top_k = (int)K, .dim = D, .slot_row = f->slot_row,
					   .y = f->y2, .y_dtype = KERN_DT_F32, .out = out, .out_dtype = KERN_DT_F32,
					   .stream = sm};
	OK(l, f->g->moe_combine(&ca));
combined:
	trace(f, "combine", l, out, T * D);
	/* shared expert (same clamp, weight 1); under TP each rank holds a slice
	 * of its intermediate dim and the all-reduce sums the partial outputs */
	int64_t IL = ly->sh_w1.w.rows;
	if ((st = lin(f, &ly->sh_w1, xn, 0, T, f->sh1, 0, true, l, e)) ||
	    (st = lin(f, &ly->sh_w3, xn, 0, T, f->sh3, 0, true, l, e)))
		return st;
	struct kern_swiglu_args ss = {.gate = f->sh1, .up = f->sh3, .out = f->sh1, .n_rows = T, .dim = (int)IL,
				      .limit = limit, .bf16_out = f->opt.bf16_round, .stream = sm};
	OK(l, ly->ops.swiglu(&ss));
	if ((st = lin(f, &ly->sh_w2, f->sh1, 0, T, f->shy, 0, f->ws == 1, l, e)))
		return st;
	trace(f, "shared", l, f->shy, T * D);
	struct kern_add_args aa = {.y = out, .x = f->shy, .n = T * D, .stream = sm};
	OK(l, f->g->add(&aa));
	if ((st = all_reduce(f, out, T * D, e)))
		return st;
	return round_bf16(f, out, T * D, e);
}

/* ---- one block ---- */

static enum status block(struct model_fwd *f, int l, struct err *e)
{
	const struct model_layer *ly = &f->w->layers[l];
	int64_t T = f->T, D = f->D;
	enum status st;
	if ((st = hc_pre(f, ly, &ly->hc_attn, f->x, f->u, l, e)) ||
	    (st = norm(f, ly, f->u, f->xn, T, (int)D, ly->attn_norm, true, l, e)) ||
	    (st = attention(f, ly, l, f->xn, f->fo, e)) || (st = hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
		return st;
	trace(f, "attn_out", l, f->fo, T * D);
	trace(f, "x_attn", l, f->x2, T * f->n * D);
	float *t = f->x;
	f->x = f->x2;
	f->x2 = t;
	if ((st = hc_pre(f, ly, &ly->hc_ffn, f->x, f->u, l, e)) ||
	    (st = norm(f, ly, f->u, f->xn, T, (int)D, ly->ffn_norm, true, l, e)) ||
	    (st = moe(f, ly, l, f->xn, f->fo, e)) || (st = hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
		return st;
	trace(f, "moe_out", l, f->fo, T * D);
	trace(f, "x_ffn", l, f->x2, T * f->n * D);
	t = f->x;
	f->x = f->x2;
	f->x2 = t;
	return ST_OK;
}

/* The embedding rows of the step's ids, copied n_copies times per token (the
 * mHC streams). Vocab-parallel: a rank holds rows [VB, VB+VL) and
 * contributes zeros for other ids; the sum over ranks is exact (one nonzero
 * term). */
static enum status embed(struct model_fwd *f, float *out, int64_t n_copies, struct err *e)
{
	struct kern_embed_args a = {.table = f->w->embed, .vocab_begin = f->VB, .vocab_rows = f->VL,
				    .ids = DEV(f, f->ids), .n_tokens = f->T, .dim = f->D, .n_copies = (int)n_copies,
				    .out = out, .stream = f->mem.stream};
	OK(-1, f->g->embed(&a));
	return all_reduce(f, out, f->T * n_copies * f->D, e);
}

static enum status layers_run(struct model_fwd *f, struct err *e);
static enum status dspark_capture(struct model_fwd *f, int l, struct err *e);

enum status model_fwd_run(struct model_fwd *f, const struct exec_step *step, struct err *e)
{
	enum status st = batch_prepare(f, step, e);
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
	if ((st = embed(f, f->x, f->n, e)))
		return st;
	trace(f, "embed", -1, f->x, f->T * f->n * f->D);
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
		if ((st = block(f, l, e)) || (f->dsp_cap && (st = dspark_capture(f, l, e))))
			return st;
	return ST_OK;
}

static enum status head(struct model_fwd *f, const struct model_layer *ly0, const struct model_hc *hc,
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
	enum status st = meta_flush(f, e);
	if (st || (st = copy_rows(f, f->hh, k, NULL, streams, k, DEV(f, idx), n_rows, k, e)))
		return st;
	struct kern_hc_prenorm_args pa = {.x = f->hh, .fn = hc->fn, .mix = f->mix, .sqr_sum = f->sqr,
					  .n_tokens = n_rows, .k = k, .n_out = n, .stream = sm};
	OK(-1, ly0->ops.hc_prenorm(&pa));
	struct kern_hc_split_args sa = {.mix = f->mix, .sqr_sum = f->sqr, .n_tokens = n_rows, .n_streams = n, .k = k,
					.norm_eps = (float)f->cfg->rms_norm_eps, .scale = hc->scale, .base = hc->base,
					.sinkhorn_iters = (int)f->cfg->hc_sinkhorn_iters,
					.hc_eps = (float)f->cfg->hc_eps, .head = true, .pre = f->pre, .stream = sm};
	OK(-1, ly0->ops.hc_split(&sa));
	trace(f, "head_pre", -1, f->pre, (int64_t)n_rows * n);
	struct kern_hc_pre_combine_args ca = {.x = f->hh, .pre = f->pre, .u = f->u, .n_tokens = n_rows,
					      .n_streams = n, .dim = (int)D, .bf16_out = f->opt.bf16_round,
					      .stream = sm};
	OK(-1, ly0->ops.hc_pre_combine(&ca));
	trace(f, "head_u", -1, f->u, (int64_t)n_rows * D);
	if ((st = norm(f, ly0, f->u, f->u, n_rows, (int)D, norm_w, true, -1, e)))
		return st;
	if (f->ws == 1)
		return lin(f, &f->w->head, f->u, 0, n_rows, logits, 0, false, -1, e);
	if ((st = lin(f, &f->w->head, f->u, 0, n_rows, f->lg_local, 0, false, -1, e)) ||
	    (st = collective(f, f->lg_local, f->lg_all, (int64_t)n_rows * f->VL, true, e)))
		return st;
	return copy_rows(f, logits, f->VL, NULL, f->lg_all, f->VL, DEV(f, perm), (int64_t)n_rows * f->ws, f->VL, e);
}

enum status model_fwd_logits(struct model_fwd *f, const float *streams, const uint32_t *rows, uint32_t n_rows,
			     float *logits, struct err *e)
{
	return head(f, &f->w->layers[0], &f->w->hc_head, f->w->norm, streams, rows, n_rows, logits, e);
}

/* ---- MTP (June release, speculative decoding) ---- */

/* The MTP block over step (model/forward.h); its output streams end in f->x. */
static enum status mtp_block(struct model_fwd *f, const struct exec_step *step, const float *streams, struct err *e)
{
	if (!f->w->n_mtp)
		return err_set(e, ST_UNSUPPORTED, "the MTP layer is not loaded");
	int l = f->w->n_layers;
	const struct model_layer *ly = &f->w->layers[l];
	enum status st = batch_prepare(f, step, e);
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
		if (!(st = mem_alloc(f, &f->mtp_bidx, nb * sizeof *h, e)) &&
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
	    (st = embed(f, f->fo, 1, e)) ||
	    (st = kern_mem_copy(&f->mem, f->u, f->fo, (size_t)(T * D) * sizeof(float), e)))
		return st;
	if ((st = norm(f, ly, f->u, f->u, T, (int)D, ly->enorm, true, l, e)) ||
	    (st = lin(f, &ly->e_proj, f->u, 0, T, f->fo, 0, true, l, e)) ||
	    (st = norm(f, ly, f->m2, f->m1, T * n, (int)D, ly->hnorm, true, l, e)) ||
	    (st = lin(f, &ly->h_proj, f->m1, 0, T * n, f->m2, 0, true, l, e)))
		return st;
	/* X0 = e_proj(e) broadcast over the streams + h_proj(x) per stream */
	if ((st = copy_rows(f, f->x, D, NULL, f->fo, D, f->mtp_bidx, T * n, D, e)))
		return st;
	struct kern_add_args aa = {.y = f->x, .x = f->m2, .n = T * n * D, .stream = f->mem.stream};
	OK(l, f->g->add(&aa));
	if ((st = round_bf16(f, f->x, T * n * D, e)) || (st = block(f, l, e)))
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
	return head(f, ly, &ly->mtp_hc_head, ly->mtp_norm, f->x, rows, n_rows, logits, e);
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

/* ---- DSpark (0731 release, speculative decoding; host memory only) ----
 * model/dspark.c drives these: the target-layer captures during the main
 * pass, main_x, a stage's context KV row, and the draft block through the
 * stages and the last stage's head. */

enum status model_fwd_dspark_enable(struct model_fwd *f, struct err *e)
{
	if (!f->w->n_dspark)
		return err_set(e, ST_UNSUPPORTED, "the DSpark stages are not loaded");
	if (f->mem.device)
		return err_set(e, ST_UNSUPPORTED, "the DSpark drafter runs on the CPU executor only");
	if (f->dsp_cap)
		return ST_OK;
	size_t n = (size_t)f->opt.max_tokens * (size_t)f->cfg->dspark.n_target_layers * (size_t)f->D;
	f->dsp_cap = calloc(n ? n : 1, sizeof(float));
	return f->dsp_cap ? ST_OK : err_set(e, ST_NOMEM, "DSpark captures");
}

const float *model_fwd_dspark_captures(const struct model_fwd *f)
{
	return f->dsp_cap;
}

/* After main layer l: when it is a target layer j, its output averaged over
 * the hc streams into columns [j*D, (j+1)*D) of the captures. */
static enum status dspark_capture(struct model_fwd *f, int l, struct err *e)
{
	const struct model_dspark_config *c = &f->cfg->dspark;
	int64_t D = f->D, n = f->n, nt = c->n_target_layers;
	for (int j = 0; j < nt; j++) {
		if (c->target_layer_ids[j] != l)
			continue;
		for (int64_t t = 0; t < f->T; t++) {
			float *dst = f->dsp_cap + (t * nt + j) * D;
			const float *x = f->x + t * n * D;
			for (int64_t i = 0; i < D; i++) {
				float s = 0;
				for (int64_t k = 0; k < n; k++)
					s += x[k * D + i];
				dst[i] = s / (float)n;
			}
		}
		if ((f->T && f->opt.bf16_round))
			return round_bf16(f, f->dsp_cap, f->T * nt * D, e);
	}
	return ST_OK;
}

static const struct model_layer *dspark_stage(const struct model_fwd *f, int k)
{
	return &f->w->layers[f->w->n_layers + f->w->n_mtp + k];
}

enum status model_fwd_dspark_main(struct model_fwd *f, const float *cap, uint32_t T, float *main_x, struct err *e)
{
	const struct model_layer *ly = dspark_stage(f, 0);
	int l = ly->layer;
	enum status st;
	if (T > f->opt.max_tokens)
		return err_set(e, ST_INVALID, "DSpark main_proj: %u rows > %u", T, f->opt.max_tokens);
	if ((st = lin(f, &ly->main_proj, cap, 0, T, main_x, 0, true, l, e)))
		return st;
	return norm(f, ly, main_x, main_x, T, (int)f->D, ly->main_norm, true, l, e);
}

enum status model_fwd_dspark_kv(struct model_fwd *f, int stage, const float *main_x, const int32_t *pos, uint32_t T,
				float *kv, struct err *e)
{
	const struct model_layer *ly = dspark_stage(f, stage);
	int64_t d = f->d, r = f->r;
	enum status st;
	if ((st = lin(f, &ly->wkv, main_x, 0, T, kv, 0, true, ly->layer, e)) ||
	    (st = norm(f, ly, kv, kv, T, (int)d, ly->kv_norm, true, ly->layer, e)))
		return st;
	struct kern_rope_args ra = {.x = kv, .pos = pos, .omega = ly->omega, .n_rows = T, .n_heads = 1,
				    .head_dim = (int)d, .rope_dim = (int)r, .bf16_out = f->opt.bf16_round,
				    .stream = f->mem.stream};
	OK(ly->layer, ly->ops.rope(&ra));
	if (f->opt.quant_sim) {
		struct kern_act_quant_sim_args qa = {.x = kv, .n_rows = T, .n_cols = d - r, .ld = d, .block = 64,
						     .stream = f->mem.stream};
		OK(ly->layer, f->g->act_quant_sim(&qa));
	}
	return ST_OK;
}

/* A stage's attention over the block: every query of sequence s sees its
 * context rows and all of its block's rows (non-causal inside the block). */
static enum status dspark_attention(struct model_fwd *f, const struct model_layer *ly, int stage,
				    const struct model_fwd_dspark_block *b, const float *xn, float *out, struct err *e)
{
	int l = ly->layer;
	int64_t T = f->T, H = f->H, d = f->d, R = f->R, nb = b->block_tokens;
	enum status st;
	if ((st = lin(f, &ly->wq_a, xn, 0, T, f->qr, 0, true, l, e)) ||
	    (st = norm(f, ly, f->qr, f->qr, T, (int)f->QL, ly->q_norm, true, l, e)) ||
	    (st = lin(f, &ly->wq_b, f->qr, 0, T, f->q, 0, true, l, e)) ||
	    (st = norm(f, ly, f->q, f->q, T * H, (int)d, NULL, true, l, e)))
		return st;
	struct kern_rope_args ra = {.x = f->q, .pos = f->pos, .omega = ly->omega, .n_rows = T, .n_heads = (int)H,
				    .head_dim = (int)d, .rope_dim = (int)f->r, .bf16_out = f->opt.bf16_round,
				    .stream = f->mem.stream};
	OK(ly->layer, ly->ops.rope(&ra));
	if ((st = model_fwd_dspark_kv(f, stage, xn, f->pos, f->T, f->kv, e)))
		return st;
	for (uint32_t s = 0; s < b->n_seqs; s++) {
		uint32_t c0 = b->ctx_off[s], nc = b->ctx_off[s + 1] - c0;
		if (nc + nb > (uint32_t)f->idx_stride)
			return err_set(e, ST_INVALID, "DSpark: %u context rows + %lld block rows > %d", nc, (long long)nb,
				       f->idx_stride);
		for (int64_t i = 0; i < nb; i++) {
			int64_t t = s * nb + i;
			int32_t *ix = f->idx + t * f->idx_stride;
			for (uint32_t j = 0; j < nc; j++)
				ix[j] = (int32_t)(T + c0 + j);
			for (int64_t j = 0; j < nb; j++)
				ix[nc + j] = (int32_t)(s * nb + j);
			f->idx_len[t] = (int32_t)(nc + nb);
		}
	}
	struct kern_sparse_attn_args aa = {.q = f->q, .out = f->o, .kv_stride = d, .idx = f->idx,
					   .idx_len = f->idx_len, .idx_stride = f->idx_stride, .sink = ly->attn_sink,
					   .softmax_scale = (float)(1.0 / sqrt((double)d)), .pos = f->pos,
					   .omega = ly->omega, .rope_dim = (int)f->r, .n_tokens = T, .n_heads = (int)H,
					   .head_dim = (int)d, .bf16_out = f->opt.bf16_round, .stream = f->mem.stream};
	aa.kv[0] = f->kv;
	aa.kv_rows[0] = T;
	aa.kv[1] = b->ctx_kv[stage];
	aa.kv_rows[1] = b->ctx_off[b->n_seqs];
	OK(ly->layer, ly->ops.sparse_attn(&aa));
	int64_t hpg = H / f->G;
	for (int64_t g = 0; g < f->G; g++)
		if ((st = lin(f, &ly->wo_a[g], f->o + g * hpg * d, H * d, T, f->z + g * R, f->G * R, false, l, e)))
			return st;
	if ((st = round_bf16(f, f->z, T * f->G * R, e)) || (st = lin(f, &ly->wo_b, f->z, 0, T, out, 0, false, l, e)))
		return st;
	return round_bf16(f, out, T * f->D, e);
}

enum status model_fwd_dspark_draft(struct model_fwd *f, const struct model_fwd_dspark_block *b, float *logits,
				   struct err *e)
{
	if (!f->dsp_cap)
		return err_set(e, ST_INVALID, "DSpark: model_fwd_dspark_enable was not called");
	uint64_t T = (uint64_t)b->n_seqs * b->block_tokens;
	if (!T || T > f->opt.max_tokens)
		return err_set(e, ST_INVALID, "DSpark block of %llu rows (1..%u)", (unsigned long long)T, f->opt.max_tokens);
	enum status st = kern_mem_sync(&f->mem, e);
	if (st)
		return st;
	f->meta_used = f->meta_flushed = 0;
	f->T = (uint32_t)T;
	f->S = (int)b->n_seqs;
	for (uint64_t i = 0; i < T; i++)
		if (b->ids[i] < 0 || b->ids[i] >= f->V)
			return err_set(e, ST_INVALID, "DSpark: token id %d outside the vocabulary", b->ids[i]);
	TAKE(f, f->ids, T);
	TAKE(f, f->pos, T);
	memcpy(f->ids, b->ids, T * sizeof(int32_t));
	memcpy(f->pos, b->pos, T * sizeof(int32_t));
	if (!b->n_head || b->n_head > b->block_tokens)
		return err_set(e, ST_INVALID, "DSpark: %u head rows of a %u-row block", b->n_head, b->block_tokens);
	uint32_t *rows, nr = b->n_seqs * b->n_head;
	TAKE(f, rows, nr);
	for (uint32_t s = 0; s < b->n_seqs; s++)
		for (uint32_t i = 0; i < b->n_head; i++)
			rows[s * b->n_head + i] = s * b->block_tokens + i;
	if ((st = meta_flush(f, e)) || (st = embed(f, f->x, f->n, e)))
		return st;
	int64_t D = f->D;
	for (int k = 0; k < f->w->n_dspark; k++) {
		const struct model_layer *ly = dspark_stage(f, k);
		int l = ly->layer;
		float *t;
		if ((st = hc_pre(f, ly, &ly->hc_attn, f->x, f->u, l, e)) ||
		    (st = norm(f, ly, f->u, f->xn, f->T, (int)D, ly->attn_norm, true, l, e)) ||
		    (st = dspark_attention(f, ly, k, b, f->xn, f->fo, e)) || (st = hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
			return st;
		t = f->x, f->x = f->x2, f->x2 = t;
		if ((st = hc_pre(f, ly, &ly->hc_ffn, f->x, f->u, l, e)) ||
		    (st = norm(f, ly, f->u, f->xn, f->T, (int)D, ly->ffn_norm, true, l, e)) ||
		    (st = moe(f, ly, l, f->xn, f->fo, e)) || (st = hc_post(f, ly, f->fo, f->x, f->x2, l, e)))
			return st;
		t = f->x, f->x = f->x2, f->x2 = t;
	}
	const struct model_layer *last = dspark_stage(f, f->w->n_dspark - 1);
	return head(f, last, &last->mtp_hc_head, last->mtp_norm, f->x, rows, nr, logits, e);
}

/* ---- speculative decoding: verify rollback (docs/speculation.md) ----
 *
 * model_fwd_spec_save copies, for every covered sequence, everything a step
 * can write for it in layers [lb, le): the state areas of the block-table
 * entries from the one holding its token before the step to the one holding
 * its last token (ring, open compressor windows of the main and the
 * indexer compressor) and the compressed rows and indexer keys of every
 * window its tokens touch. With stash, the next model_fwd_run also keeps,
 * per layer, each covered token's state inputs: its KV row (after rope and
 * the FP8 simulation) and its compressor projections. model_fwd_spec_commit
 * restores the saved bytes and replays the state writes of the kept prefix
 * (rule 2 copies, the compressor op, the ring write) from those inputs: the
 * same ops on the same values as a step that only ever held the kept tokens. */

struct fwd_spec {
	float *save;                /* saved bytes, in f->mem */
	size_t save_cap, save_used; /* floats */
	const struct exec_step *step; /* the step the save covers (borrowed for the commit) */
	uint32_t *n_q;              /* [max_seqs] covered query tokens of each sequence (0: none) */
	int lb, le;                 /* covered layers */
	/* the stash */
	bool armed;                 /* the next model_fwd_run keeps the covered rows */
	bool stashed;               /* and it did */
	uint32_t n_stash, stash_cap;
	int64_t stash_w;            /* floats per row: kv d | kvp 2d | gp 2d | ikvp 2ID | igp 2ID */
	float *stash;               /* [n_layers, stash_cap, stash_w] in f->mem */
	int32_t *rows_h, *rows_d;   /* [stash_cap] flat rows of the stashed tokens (host, f->mem) */
	int32_t *idx_h, *idx_d;     /* [stash_cap] replay: stash row of each replayed token */
	uint32_t *base;             /* [max_seqs] first stash row of each sequence */
	uint32_t *roll, *qs;        /* commit scratch: [max_seqs], [max_seqs + 1] */
	struct exec_seq *rs;        /* [max_seqs] */
	int32_t *ids, *pos;         /* [stash_cap] */
};

static void fwd_spec_free(struct model_fwd *f)
{
	struct fwd_spec *p = f->spec;
	if (!p)
		return;
	kern_mem_free(&f->mem, p->save);
	kern_mem_free(&f->mem, p->stash);
	if (p->rows_d != p->rows_h)
		kern_mem_free(&f->mem, p->rows_d);
	if (p->idx_d != p->idx_h)
		kern_mem_free(&f->mem, p->idx_d);
	free(p->rows_h);
	free(p->idx_h);
	free(p->n_q);
	free(p->base);
	free(p->roll);
	free(p->qs);
	free(p->rs);
	free(p->ids);
	free(p->pos);
	free(p);
	f->spec = NULL;
}

enum status model_fwd_spec_enable(struct model_fwd *f, uint32_t max_stash_tokens, struct err *e)
{
	if (f->spec)
		return ST_OK;
	struct fwd_spec *p = calloc(1, sizeof *p);
	if (!p)
		return err_set(e, ST_NOMEM, "speculative decoding state");
	f->spec = p;
	uint32_t cap = max_stash_tokens ? max_stash_tokens : 1;
	if (cap > f->opt.max_tokens)
		cap = f->opt.max_tokens;
	p->stash_cap = cap;
	p->stash_w = 5 * f->d + 4 * f->ID;
	p->n_q = calloc(f->opt.max_seqs + 1, sizeof *p->n_q);
	p->base = calloc(f->opt.max_seqs + 1, sizeof *p->base);
	p->rows_h = calloc(cap, sizeof *p->rows_h);
	p->idx_h = calloc(cap, sizeof *p->idx_h);
	p->roll = calloc(f->opt.max_seqs + 1, sizeof *p->roll);
	p->qs = calloc(f->opt.max_seqs + 1, sizeof *p->qs);
	p->rs = calloc(f->opt.max_seqs + 1, sizeof *p->rs);
	p->ids = calloc(cap, sizeof *p->ids);
	p->pos = calloc(cap, sizeof *p->pos);
	enum status st = ST_OK;
	if (!p->n_q || !p->base || !p->rows_h || !p->idx_h || !p->roll || !p->qs || !p->rs || !p->ids || !p->pos)
		st = err_set(e, ST_NOMEM, "speculative decoding state");
	if (!st)
		st = mem_alloc(f, &p->stash, (size_t)f->w->n_layers * cap * (size_t)p->stash_w * sizeof(float), e);
	if (!st && f->mem.device) {
		if (!(st = mem_alloc(f, &p->rows_d, cap * sizeof(int32_t), e)))
			st = mem_alloc(f, &p->idx_d, cap * sizeof(int32_t), e);
	} else {
		p->rows_d = p->rows_h;
		p->idx_d = p->idx_h;
	}
	if (st)
		fwd_spec_free(f);
	return st;
}

/* The block id of table entry k of sequence s of step, or -1. */
static int64_t spec_blk(const struct exec_step *step, uint32_t s, uint32_t k)
{
	const struct exec_seq *sq = &step->seqs[s];
	return k < sq->n_blocks ? (int64_t)step->block_ids[sq->block_table_start + k] : -1;
}

/* Walk what a step can write for the covered sequences in the covered
 * layers, copying it to (save) or from (restore) p->save in one fixed order;
 * count only (dry) to size the buffer. */
static enum status spec_walk(struct model_fwd *f, int mode /* 0 dry, 1 save, 2 restore */, const uint32_t *only,
			     struct err *e)
{
	struct fwd_spec *p = f->spec;
	const struct exec_step *step = p->step;
	struct model_state *S = f->st;
	uint32_t B = S->block_tokens;
	int64_t W = f->cfg->sliding_window, d = f->d, id = f->ID;
	size_t at = 0;
	enum status st = ST_OK;
#define SPEC_COPY(ptr, nfl)                                                                              \
	do {                                                                                             \
		size_t n_ = (size_t)(nfl);                                                               \
		if (mode == 1)                                                                           \
			st = kern_mem_copy(&f->mem, p->save + at, (ptr), n_ * sizeof(float), e);         \
		else if (mode == 2 && (!only || only[s]))                                                \
			st = kern_mem_copy(&f->mem, (ptr), p->save + at, n_ * sizeof(float), e);         \
		if (st)                                                                                  \
			return st;                                                                       \
		at += n_;                                                                                \
	} while (0)
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		if (!p->n_q[s])
			continue;
		const struct exec_seq *sq = &step->seqs[s];
		uint32_t p0 = sq->n_context_tokens - p->n_q[s], p1 = sq->n_context_tokens - 1;
		uint32_t e_lo = p0 ? (p0 - 1) / B : 0, e_hi = p1 / B;
		for (int l = p->lb; l < p->le; l++) {
			struct model_layer_state *q = &S->ls[l];
			for (uint32_t k = e_lo; k <= e_hi; k++) {
				int64_t b = spec_blk(step, s, k);
				if (b < 0)
					return err_set(e, ST_INVALID, "speculation: sequence %u has no block at entry %u", s, k);
				SPEC_COPY(q->ring + b * W * d, W * d);
				if (!q->ratio)
					continue;
				SPEC_COPY(q->cmp_kv + b * q->cmp_state_floats, q->cmp_state_floats);
				SPEC_COPY(q->cmp_score + b * q->cmp_state_floats, q->cmp_state_floats);
				if (q->indexer) {
					SPEC_COPY(q->icmp_kv + b * q->icmp_state_floats, q->icmp_state_floats);
					SPEC_COPY(q->icmp_score + b * q->icmp_state_floats, q->icmp_state_floats);
				}
			}
			if (!q->ratio)
				continue;
			for (uint32_t w = p0 / (uint32_t)q->ratio; w <= p1 / (uint32_t)q->ratio; w++) {
				int64_t b = spec_blk(step, s, w / (uint32_t)q->per_block);
				if (b < 0)
					continue;
				int64_t row = b * q->per_block + w % (uint32_t)q->per_block;
				SPEC_COPY(q->cmp + row * d, d);
				if (q->indexer)
					SPEC_COPY(q->ikeys + row * id, id);
			}
		}
	}
#undef SPEC_COPY
	p->save_used = at;
	return ST_OK;
}

enum status model_fwd_spec_save(struct model_fwd *f, const struct exec_step *step, const uint32_t *n_q,
				int layer_begin, int layer_end, bool stash, struct err *e)
{
	struct fwd_spec *p = f->spec;
	if (!p)
		return err_set(e, ST_INVALID, "speculation: model_fwd_spec_enable was not called");
	if (step->n_seqs > f->opt.max_seqs || layer_begin < 0 || layer_end > f->st->n_layers || layer_begin > layer_end)
		return err_set(e, ST_INVALID, "speculation: %u sequences, layers [%d, %d)", step->n_seqs, layer_begin,
			       layer_end);
	if (stash && layer_end > f->w->n_layers)
		return err_set(e, ST_INVALID, "speculation: the stash covers main layers only");
	p->step = step;
	p->lb = layer_begin;
	p->le = layer_end;
	p->armed = p->stashed = false;
	p->n_stash = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		uint32_t nq = step->query_start[s + 1] - step->query_start[s];
		p->n_q[s] = n_q ? n_q[s] : 0;
		if (p->n_q[s] > nq || p->n_q[s] > step->seqs[s].n_context_tokens)
			return err_set(e, ST_INVALID, "speculation: sequence %u covers %u of its %u tokens", s, p->n_q[s], nq);
		p->base[s] = p->n_stash;
		if (stash && p->n_q[s]) {
			if (p->n_stash + p->n_q[s] > p->stash_cap)
				return err_set(e, ST_INVALID, "speculation: more than %u tokens to keep", p->stash_cap);
			for (uint32_t i = 0; i < p->n_q[s]; i++)
				p->rows_h[p->n_stash++] = (int32_t)(step->query_start[s + 1] - p->n_q[s] + i);
		}
	}
	enum status st = spec_walk(f, 0, NULL, e);
	if (st)
		return st;
	if (p->save_used > p->save_cap) {
		kern_mem_free(&f->mem, p->save);
		p->save = NULL;
		p->save_cap = 0;
		if ((st = mem_alloc(f, &p->save, p->save_used * sizeof(float), e)))
			return st;
		p->save_cap = p->save_used;
	}
	if ((st = spec_walk(f, 1, NULL, e)))
		return st;
	if (stash && p->n_stash) {
		if (p->rows_d != p->rows_h &&
		    (st = kern_mem_upload(&f->mem, p->rows_d, p->rows_h, p->n_stash * sizeof(int32_t), e)))
			return st;
		p->armed = true;
	}
	return ST_OK;
}

/* The hook in attention(): layer l's state inputs of the stashed rows. */
static enum status fwd_spec_stash(struct model_fwd *f, const struct model_layer *ly, int l, struct err *e)
{
	struct fwd_spec *p = f->spec;
	if (!p->armed || l < p->lb || l >= p->le)
		return ST_OK;
	if (p->step->n_tokens != f->T)
		return err_set(e, ST_INVALID, "speculation: the stash was armed for another step");
	int64_t d = f->d, id = f->ID, w = p->stash_w;
	float *dst = p->stash + (size_t)l * p->stash_cap * (size_t)w;
	const int32_t *rows = p->rows_d;
	enum status st = copy_rows(f, dst, w, NULL, f->kv, d, rows, p->n_stash, d, e);
	if (!st && ly->ratio) {
		int64_t cd = ly->cmp_wkv.w.rows;
		if (!(st = copy_rows(f, dst + d, w, NULL, f->kvp, cd, rows, p->n_stash, cd, e)))
			st = copy_rows(f, dst + 3 * d, w, NULL, f->gp, cd, rows, p->n_stash, cd, e);
		if (!st && f->st->ls[l].indexer) {
			int64_t ci = ly->idx_cmp_wkv.w.rows;
			if (!(st = copy_rows(f, dst + 5 * d, w, NULL, f->ikvp, ci, rows, p->n_stash, ci, e)))
				st = copy_rows(f, dst + 5 * d + 2 * id, w, NULL, f->igp, ci, rows, p->n_stash, ci, e);
		}
	}
	if (!st && l == p->le - 1) {
		p->armed = false;
		p->stashed = true;
	}
	return st;
}

enum status model_fwd_spec_commit(struct model_fwd *f, const uint32_t *n_keep, struct err *e)
{
	struct fwd_spec *p = f->spec;
	if (!p || !p->step)
		return err_set(e, ST_INVALID, "speculation: commit without a save");
	const struct exec_step *step = p->step;
	p->armed = false;
	/* which sequences roll back: those that keep less than they covered */
	uint32_t *roll = p->roll;
	uint32_t n_roll = 0, n_replay = 0;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		uint32_t k = n_keep ? n_keep[s] : 0;
		if (k > p->n_q[s])
			return err_set(e, ST_INVALID, "speculation: sequence %u keeps %u of %u tokens", s, k, p->n_q[s]);
		roll[s] = p->n_q[s] && k < p->n_q[s];
		n_roll += roll[s];
		n_replay += roll[s] && k;
	}
	enum status st = ST_OK;
	if (n_roll && (st = spec_walk(f, 2, roll, e)))
		return st;
	p->step = NULL;
	if (!n_replay)
		return ST_OK;
	if (!p->stashed)
		return err_set(e, ST_INVALID, "speculation: a partial keep needs the stash of the step");
	p->stashed = false;
	/* the replay step: the kept prefix of every rolled-back sequence */
	uint32_t ns = 0, nt = 0, *qs = p->qs;
	struct exec_seq *rs = p->rs;
	int32_t *ids = p->ids, *pos = p->pos;
	for (uint32_t s = 0; s < step->n_seqs; s++) {
		uint32_t k = n_keep ? n_keep[s] : 0;
		if (!roll[s] || !k)
			continue;
		const struct exec_seq *sq = &step->seqs[s];
		uint32_t i0 = step->query_start[s + 1] - p->n_q[s];
		rs[ns] = *sq;
		rs[ns].n_cached_tokens = sq->n_context_tokens - p->n_q[s];
		rs[ns].n_context_tokens = rs[ns].n_cached_tokens + k;
		rs[ns].sample = false;
		rs[ns].prompt_lp = NULL;
		qs[ns++] = nt;
		for (uint32_t i = 0; i < k; i++) {
			ids[nt] = step->token_ids[i0 + i];
			pos[nt] = step->positions[i0 + i];
			p->idx_h[nt++] = (int32_t)(p->base[s] + i);
		}
	}
	qs[ns] = nt;
	struct exec_step r = {.n_tokens = nt, .token_ids = ids, .positions = pos, .n_seqs = ns, .seqs = rs,
			      .query_start = qs, .block_ids = step->block_ids, .n_block_ids = step->n_block_ids};
	if ((st = batch_prepare(f, &r, e)))
		return st;
	if (p->idx_d != p->idx_h && (st = kern_mem_upload(&f->mem, p->idx_d, p->idx_h, nt * sizeof(int32_t), e)))
		return st;
	int64_t d = f->d, id = f->ID, w = p->stash_w;
	for (int l = p->lb; l < p->le; l++) {
		const struct model_layer *ly = &f->w->layers[l];
		const float *src = p->stash + (size_t)l * p->stash_cap * (size_t)w;
		if ((st = copy_rows(f, f->kv, d, NULL, src, w, p->idx_d, nt, d, e)))
			return st;
		if (ly->ratio) {
			int64_t cd = ly->cmp_wkv.w.rows;
			if ((st = copy_rows(f, f->kvp, cd, NULL, src + d, w, p->idx_d, nt, cd, e)) ||
			    (st = copy_rows(f, f->gp, cd, NULL, src + 3 * d, w, p->idx_d, nt, cd, e)))
				return st;
			if (f->st->ls[l].indexer) {
				int64_t ci = ly->idx_cmp_wkv.w.rows;
				if ((st = copy_rows(f, f->ikvp, ci, NULL, src + 5 * d, w, p->idx_d, nt, ci, e)) ||
				    (st = copy_rows(f, f->igp, ci, NULL, src + 5 * d + 2 * id, w, p->idx_d, nt, ci, e)))
					return st;
			}
			if ((st = compress_waves(f, ly, l, e)))
				return st;
		}
		if ((st = ring_waves(f, l, e)))
			return st;
	}
	return kern_mem_sync(&f->mem, e);
}
