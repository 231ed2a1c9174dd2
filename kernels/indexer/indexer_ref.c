/*
 * kernels/indexer/indexer_ref.c: CPU reference of the Hadamard rotation, the
 * FP4 simulation and the indexer scores + top-k (dsv4.md §2.2, §3.7).
 */
#include "kernels/indexer/indexer.h"

#include <math.h>

#include "kernels/norm/lowp_sim.h"

enum status kern_hadamard_ref(float *x, int64_t n_rows, int n)
{
	if (n <= 0 || (n & (n - 1)) || n_rows < 0 || (n_rows > 0 && !x))
		return ST_INVALID;
	float sc = 1.0f / sqrtf((float)n);
	for (int64_t r = 0; r < n_rows; r++) {
		float *v = x + r * n;
		for (int h = 1; h < n; h *= 2) /* butterflies: (a, b) -> (a + b, a - b) */
			for (int i = 0; i < n; i += 2 * h)
				for (int j = i; j < i + h; j++) {
					float a = v[j], b = v[j + h];
					v[j] = a + b;
					v[j + h] = a - b;
				}
		for (int i = 0; i < n; i++)
			v[i] *= sc;
	}
	return ST_OK;
}

enum status kern_indexer_rotate_quant_ref(const struct kern_indexer_rotate_args *a)
{
	if (!a || a->fp4_block < 0)
		return ST_INVALID;
	enum status st = kern_hadamard_ref(a->x, a->n_rows, a->dim);
	if (st != ST_OK || !a->fp4_block)
		return st;
	for (int64_t r = 0; r < a->n_rows; r++)
		kern__fp4_qdq(a->x + r * a->dim, a->dim, a->fp4_block);
	return ST_OK;
}

static float score_of(const struct kern_indexer_topk_args *a, int64_t tok, const float *k)
{
	float acc = 0;
	for (int h = 0; h < a->n_heads; h++) {
		const float *q = a->q + (tok * a->n_heads + h) * a->head_dim;
		float dot = 0;
		for (int c = 0; c < a->head_dim; c++)
			dot += q[c] * k[c];
		float w = a->head_w[tok * a->n_heads + h];
		if (a->bf16_scores) {
			dot = kern__bf16_round(dot);
			acc += kern__bf16_round((dot > 0 ? dot : 0) * kern__bf16_round(w * a->weight_scale));
		} else {
			acc += w * (dot > 0 ? dot : 0);
		}
	}
	return a->bf16_scores ? kern__bf16_round(acc) : acc * a->weight_scale;
}

static inline const float *key_of(const struct kern_indexer_topk_args *a, int s, int64_t w)
{
	return a->keys + kern_rowmap_row(a->key_row0, &a->key_paged, s, w) * a->head_dim;
}

/* Checks shared by the scores and top-k ops; need_inputs: q, head_w, keys
 * are read (not when selecting from scores_in). */
static enum status topk_check(const struct kern_indexer_topk_args *a, bool need_inputs)
{
	if (!a->q_off || !a->start_pos || a->q_off[0] != 0 || a->q_off[a->n_seqs] != a->n_tokens)
		return ST_INVALID;
	if (need_inputs && (!a->q || !a->head_w || (!a->key_row0 && !a->key_paged.block_table) ||
			    (a->n_key_rows > 0 && !a->keys)))
		return ST_INVALID;
	for (int s = 0; s < a->n_seqs; s++) {
		int64_t last = a->start_pos[s] + (a->q_off[s + 1] - a->q_off[s]) - 1;
		int64_t n_vis_max = (last + 1) / a->ratio;
		if (a->q_off[s + 1] < a->q_off[s] || a->start_pos[s] < 0)
			return ST_INVALID;
		if (a->scores_in && n_vis_max > a->score_stride)
			return ST_INVALID;
		for (int64_t w = 0; need_inputs && w < n_vis_max; w++) {
			int64_t r = kern_rowmap_row(a->key_row0, &a->key_paged, s, w);
			if (r < 0 || r >= a->n_key_rows)
				return ST_INVALID;
		}
	}
	return ST_OK;
}

enum status kern_indexer_scores_ref(const struct kern_indexer_topk_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->ratio <= 0 || a->n_heads <= 0 || a->head_dim <= 0 ||
	    a->score_stride < 0)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->score_out)
		return ST_INVALID;
	enum status st = topk_check(a, true);
	if (st != ST_OK)
		return st;
	for (int s = 0; s < a->n_seqs; s++) {
		int64_t last = a->start_pos[s] + (a->q_off[s + 1] - a->q_off[s]) - 1;
		if ((last + 1) / a->ratio > a->score_stride)
			return ST_INVALID;
	}
	for (int s = 0; s < a->n_seqs; s++)
		for (int64_t i = a->q_off[s]; i < a->q_off[s + 1]; i++) {
			int64_t n_vis = (a->start_pos[s] + (i - a->q_off[s]) + 1) / a->ratio;
			float *row = a->score_out + i * a->score_stride;
			for (int64_t w = 0; w < a->score_stride; w++)
				row[w] = w < n_vis ? score_of(a, i, key_of(a, s, w)) : -INFINITY;
		}
	return ST_OK;
}

enum status kern_indexer_topk_ref(const struct kern_indexer_topk_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->ratio <= 0 || a->top_k <= 0 ||
	    (!a->scores_in && (a->n_heads <= 0 || a->head_dim <= 0)))
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->topk)
		return ST_INVALID;
	enum status st = topk_check(a, !a->scores_in);
	if (st != ST_OK)
		return st;
	for (int s = 0; s < a->n_seqs; s++) {
		for (int64_t i = a->q_off[s]; i < a->q_off[s + 1]; i++) {
			int64_t t = a->start_pos[s] + (i - a->q_off[s]);
			int64_t n_vis = (t + 1) / a->ratio;
			int n_out = n_vis < a->top_k ? (int)n_vis : a->top_k;
			int32_t *out = a->topk + i * a->top_k;
			float *out_s = a->scores ? a->scores + i * a->top_k : NULL;
			/* Selection by repeated arg-max below the previous pick, in the
			 * order (score desc, w asc): O(k·n) comparisons, no sorting scratch. */
			const float *given = a->scores_in ? a->scores_in + i * a->score_stride : NULL;
			bool cached = !given && a->work && a->work_len >= n_vis;
			for (int64_t w = 0; cached && w < n_vis; w++)
				a->work[w] = score_of(a, i, key_of(a, s, w));
			float prev_s = INFINITY;
			int64_t prev_w = -1;
			for (int j = 0; j < n_out; j++) {
				float best_s = -INFINITY;
				int64_t best_w = -1;
				for (int64_t w = 0; w < n_vis; w++) {
					float sc = given ? given[w]
						 : cached ? a->work[w] : score_of(a, i, key_of(a, s, w));
					bool after_prev = sc < prev_s || (sc == prev_s && w > prev_w);
					if (!after_prev)
						continue;
					if (best_w < 0 || sc > best_s) {
						best_s = sc;
						best_w = w;
					}
				}
				out[j] = (int32_t)best_w;
				if (out_s)
					out_s[j] = best_s;
				prev_s = best_s;
				prev_w = best_w;
			}
			for (int j = n_out; j < a->top_k; j++) {
				out[j] = -1;
				if (out_s)
					out_s[j] = -INFINITY;
			}
			if (a->topk_len)
				a->topk_len[i] = n_out;
		}
	}
	return ST_OK;
}
