/*
 * kernels/attention/attention_ref.c: CPU reference of the sparse MQA
 * attention with sink and inverse output rope, and of the SWA/CSA/HCA index
 * builders (dsv4.md §3.3, §3.5, §3.7, §3.8). Online softmax is not needed
 * here: a max pass, then an exp-sum pass, in fp32.
 */
#include "kernels/attention/attention.h"

#include <math.h>

#include "kernels/norm/lowp_sim.h"

static const float *row_of(const struct kern_sparse_attn_args *a, int64_t i, int64_t stride)
{
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		if (i < a->kv_rows[s])
			return a->kv[s] + i * stride;
		i -= a->kv_rows[s];
	}
	return NULL;
}

/* Two passes (max, then exp-sum) recompute the logit instead of storing it,
 * so the reference needs no scratch memory. */
static inline float logit_of(const float *q, const float *e, int d, float scale)
{
	float dot = 0;
	for (int c = 0; c < d; c++)
		dot += q[c] * e[c];
	return dot * scale;
}

enum status kern_sparse_attn_ref(const struct kern_sparse_attn_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_heads <= 0 || a->head_dim <= 0 || a->idx_stride < 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->q || !a->out || (a->idx_stride > 0 && !a->idx))
		return ST_INVALID;
	if (a->omega && (!a->pos || a->rope_dim <= 0 || a->rope_dim % 2 || a->rope_dim > a->head_dim))
		return ST_INVALID;
	int64_t stride = a->kv_stride ? a->kv_stride : a->head_dim;
	if (stride < a->head_dim)
		return ST_INVALID;
	int64_t total = 0;
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		if (a->kv_rows[s] < 0 || (a->kv_rows[s] > 0 && !a->kv[s]))
			return ST_INVALID;
		total += a->kv_rows[s];
	}
	for (int64_t t = 0; t < a->n_tokens; t++) {
		int len = a->idx_len ? a->idx_len[t] : a->idx_stride;
		if (len < 0 || len > a->idx_stride)
			return ST_INVALID;
		for (int j = 0; j < len; j++) {
			int32_t i = a->idx[t * a->idx_stride + j];
			if (i < -1 || i >= total)
				return ST_INVALID;
		}
	}
	int H = a->n_heads, d = a->head_dim;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		const int32_t *ix = a->idx + t * a->idx_stride;
		int len = a->idx_len ? a->idx_len[t] : a->idx_stride;
		for (int h = 0; h < H; h++) {
			const float *q = a->q + (t * H + h) * d;
			float *o = a->out + (t * H + h) * d;
			float mx = a->sink ? a->sink[h] : -INFINITY;
			for (int j = 0; j < len; j++) {
				if (ix[j] < 0)
					continue;
				mx = fmaxf(mx, logit_of(q, row_of(a, ix[j], stride), d, a->softmax_scale));
			}
			for (int c = 0; c < d; c++)
				o[c] = 0;
			float den = a->sink ? expf(a->sink[h] - mx) : 0.0f;
			for (int j = 0; j < len; j++) {
				if (ix[j] < 0)
					continue;
				const float *e = row_of(a, ix[j], stride);
				float p = expf(logit_of(q, e, d, a->softmax_scale) - mx);
				den += p;
				for (int c = 0; c < d; c++)
					o[c] += p * e[c];
			}
			float inv = den > 0 ? 1.0f / den : 0.0f;
			for (int c = 0; c < d; c++)
				o[c] *= inv;
			if (a->omega) {
				float tp = (float)a->pos[t];
				for (int i = 0; i < a->rope_dim / 2; i++) {
					float ang = tp * a->omega[i];
					float cs = (float)cos((double)ang), sn = -(float)sin((double)ang);
					float *p = o + d - a->rope_dim + 2 * i;
					float re = p[0], im = p[1];
					p[0] = re * cs - im * sn;
					p[1] = re * sn + im * cs;
				}
			}
			if (a->bf16_out)
				for (int c = 0; c < d; c++)
					o[c] = kern__bf16_round(o[c]);
		}
	}
	return ST_OK;
}

enum status kern_attn_index_ref(const struct kern_attn_index_args *a)
{
	if (!a || a->n_seqs < 0 || a->n_tokens < 0 || a->window <= 0 || a->ratio < 0 || a->idx_stride < 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->q_off || !a->start_pos || !a->idx || !a->idx_len || a->q_off[0] != 0 ||
	    a->q_off[a->n_seqs] != a->n_tokens || (a->ratio > 0 && !a->cmp_row0 && !a->cmp_paged.block_table) ||
	    (a->topk && (a->ratio == 0 || a->topk_stride < 0)))
		return ST_INVALID;
	for (int s = 0; s < a->n_seqs; s++) {
		if (a->q_off[s + 1] < a->q_off[s] || a->start_pos[s] < 0 || (a->start_pos[s] > 0 && !a->ring_row0))
			return ST_INVALID;
		for (int32_t i = a->q_off[s]; i < a->q_off[s + 1]; i++) {
			int64_t t = a->start_pos[s] + (i - a->q_off[s]);
			int32_t *row = a->idx + (int64_t)i * a->idx_stride;
			int n = 0;
			int64_t p0 = t - a->window + 1 < 0 ? 0 : t - a->window + 1;
			for (int64_t p = p0; p <= t; p++) {
				if (n >= a->idx_stride)
					return ST_INVALID;
				int64_t r = p >= a->start_pos[s] ? a->cur_row0 + a->q_off[s] + (p - a->start_pos[s])
								 : a->ring_row0[s] + p % a->window;
				if (r < 0 || r > INT32_MAX)
					return ST_INVALID;
				row[n++] = (int32_t)r;
			}
			if (a->ratio > 0) {
				int64_t n_vis = (t + 1) / a->ratio;
				if (!a->topk) {
					for (int64_t w = 0; w < n_vis; w++) {
						if (n >= a->idx_stride)
							return ST_INVALID;
						int64_t r = kern_rowmap_row(a->cmp_row0, &a->cmp_paged, s, w);
						if (r < 0 || r > INT32_MAX)
							return ST_INVALID;
						row[n++] = (int32_t)r;
					}
				} else {
					const int32_t *tk = a->topk + (int64_t)i * a->topk_stride;
					for (int j = 0; j < a->topk_stride; j++) {
						if (tk[j] < 0)
							continue;
						int64_t r = kern_rowmap_row(a->cmp_row0, &a->cmp_paged, s, tk[j]);
						if (tk[j] >= n_vis || n >= a->idx_stride || r < 0 || r > INT32_MAX)
							return ST_INVALID;
						row[n++] = (int32_t)r;
					}
				}
			}
			a->idx_len[i] = n;
			for (int j = n; j < a->idx_stride; j++)
				row[j] = -1;
		}
	}
	return ST_OK;
}

enum status kern_ring_write_ref(const struct kern_ring_write_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->window <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	int64_t ss = a->src_stride ? a->src_stride : a->dim, rs = a->ring_stride ? a->ring_stride : a->dim;
	if (!a->src || !a->ring || !a->ring_row0 || !a->q_off || !a->start_pos || ss < a->dim || rs < a->dim ||
	    a->q_off[0] != 0 || a->q_off[a->n_seqs] != a->n_tokens)
		return ST_INVALID;
	for (int s = 0; s < a->n_seqs; s++)
		if (a->q_off[s + 1] < a->q_off[s] || a->start_pos[s] < 0 ||
		    (a->q_off[s + 1] > a->q_off[s] &&
		     (a->ring_row0[s] < 0 || a->ring_row0[s] + a->window > a->n_ring_rows)))
			return ST_INVALID;
	for (int s = 0; s < a->n_seqs; s++) {
		int64_t first = a->q_off[s + 1] - a->window > a->q_off[s] ? a->q_off[s + 1] - a->window : a->q_off[s];
		for (int64_t i = first; i < a->q_off[s + 1]; i++) {
			int64_t p = a->start_pos[s] + (i - a->q_off[s]);
			float *dst = a->ring + (a->ring_row0[s] + p % a->window) * rs;
			for (int c = 0; c < a->dim; c++)
				dst[c] = a->src[i * ss + c];
		}
	}
	return ST_OK;
}
