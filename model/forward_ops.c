/*
 * model/forward_ops.c: the pieces every pass of the forward (main layers,
 * head, MTP, DSpark, speculative replay) calls: buffers in the pool's memory,
 * the per-step metadata arena and its one upload, the trace aid, and thin
 * wrappers that fill one op's args from the forward's state and call the
 * plan's variant (linear, norm, row copy, bf16 rounding, mHC, the
 * tensor-parallel collectives).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "model/forward_internal.h"

/* ---- memory ---- */

enum status fwd__mem_alloc(struct model_fwd *f, void *pp, size_t bytes, struct err *e)
{
	void *p = NULL;
	enum status st = kern_mem_alloc(&f->mem, bytes, &p, e);
	memcpy(pp, &p, sizeof p);
	return st;
}
/* n bytes of the arena (16-byte aligned), NULL when the arena is full (a
 * sizing bug, reported by the caller). */
void *fwd__meta_take(struct model_fwd *f, size_t n)
{
	size_t off = (f->meta_used + 15) & ~(size_t)15;
	if (off + n > f->meta_cap)
		return NULL;
	f->meta_used = off + n;
	return f->meta_h + off;
}

/* Empty the arena for a new step. Its host side is reused: the previous
 * step's uploads must be done first. */
enum status fwd__meta_reset(struct model_fwd *f, struct err *e)
{
	enum status st = kern_mem_sync(&f->mem, e);
	if (st)
		return st;
	f->meta_used = f->meta_flushed = 0;
	return ST_OK;
}

/* Upload what was taken since the last flush. */
enum status fwd__meta_flush(struct model_fwd *f, struct err *e)
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
void fwd__trace(const struct model_fwd *f, const char *what, int layer, const float *x, int64_t n)
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
/* ---- op wrappers ---- */

enum status fwd__round_bf16(const struct model_fwd *f, float *x, int64_t n, struct err *e)
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
enum status fwd__collective(struct model_fwd *f, float *x, float *out, int64_t n, bool gather, struct err *e)
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

enum status fwd__all_reduce(struct model_fwd *f, float *x, int64_t n, struct err *e)
{
	return fwd__collective(f, x, NULL, n, false, e);
}

/* y[T, out] = x[T, in]·Wᵀ through the layer plan's variant; round: the
 * reference keeps this output in bf16. */
enum status fwd__lin(const struct model_fwd *f, const struct model_lin *l, const float *x, int64_t ldx, int64_t T,
		       float *y, int64_t ldy, bool round, int layer, struct err *e)
{
	struct kern_linear_args a = {.n_tokens = T, .x = x, .x_dtype = KERN_DT_F32, .ldx = ldx, .y = y,
				     .y_dtype = KERN_DT_F32, .ldy = ldy, .w = &l->w,
				     .act_quant_block = l->act_quant_block, .stream = f->mem.stream,
				     .workspace = f->lt_ws, .workspace_bytes = f->lt_ws_bytes, .ctx = f->opt.kctx};
	OK(layer, (l->run_dec && T <= l->dec_tokens ? l->run_dec : l->run)(&a));
	if (!ldy)
		fwd__trace(f, l->v->name, layer, y, T * l->w.rows);
	if (round && f->opt.bf16_round) {
		int64_t ly = ldy ? ldy : l->w.rows;
		if (ly == l->w.rows)
			return fwd__round_bf16(f, y, T * ly, e);
		for (int64_t t = 0; t < T; t++) {
			enum status st = fwd__round_bf16(f, y + t * ly, l->w.rows, e);
			if (st)
				return st;
		}
	}
	return ST_OK;
}

enum status fwd__norm(const struct model_fwd *f, const struct model_layer *ly, float *x, float *y, int64_t rows,
			int dim, const uint16_t *w, bool round, int layer, struct err *e)
{
	struct kern_rmsnorm_args a = {.x = x, .y = y, .w_bf16 = w, .n_rows = rows, .dim = dim,
				      .eps = (float)f->cfg->rms_norm_eps, .bf16_out = round && f->opt.bf16_round,
				      .stream = f->mem.stream};
	OK(layer, ly->ops.rmsnorm(&a));
	return ST_OK;
}

enum status fwd__copy_rows(const struct model_fwd *f, float *dst, int64_t dst_stride, const int32_t *dst_idx,
			     const float *src, int64_t src_stride, const int32_t *src_idx, int64_t n_rows, int64_t dim,
			     struct err *e)
{
	struct kern_copy_rows_args a = {.dst = dst, .dst_stride = dst_stride, .dst_idx = dst_idx, .src = src,
					.src_stride = src_stride, .src_idx = src_idx, .n_rows = n_rows, .dim = dim,
					.stream = f->mem.stream};
	OK(-1, f->g->copy_rows(&a));
	return ST_OK;
}
/* ---- mHC ---- */

/* (pre, post, comb) of site hc for streams x, and u = Σ pre_j x_j. */
enum status fwd__hc_pre(struct model_fwd *f, const struct model_layer *ly, const struct model_hc *hc,
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

enum status fwd__hc_post(struct model_fwd *f, const struct model_layer *ly, const float *fo, const float *x,
			   float *x_out, int layer, struct err *e)
{
	struct kern_hc_post_args a = {.f = fo, .x = x, .post = f->post, .comb = f->comb, .x_out = x_out,
				      .n_tokens = f->T, .n_streams = (int)f->n, .dim = (int)f->D,
				      .bf16_out = f->opt.bf16_round, .stream = f->mem.stream};
	OK(layer, ly->ops.hc_post(&a));
	return ST_OK;
}
