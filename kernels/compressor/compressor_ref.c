/*
 * kernels/compressor/compressor_ref.c: CPU reference of the CSA/HCA KV
 * compressor as the reference's incremental state machine (dsv4.md §3.6),
 * token by token, then the norm / rope / quant post-processing per entry.
 */
#include "kernels/compressor/compressor.h"

#include <math.h>

#include "kernels/indexer/indexer.h"
#include "kernels/norm/lowp_sim.h"
#include "kernels/norm/norm.h"
#include "kernels/rope/rope.h"

void kern_compressor_state_init(float *kv_state, float *score_state, int ratio, bool overlap, int head_dim)
{
	int c = overlap ? 2 : 1;
	int64_t n = (int64_t)c * ratio * c * head_dim;
	for (int64_t i = 0; i < n; i++) {
		kv_state[i] = 0.0f;
		score_state[i] = -INFINITY;
	}
}

/* Pool, normalise, rotate and quantise entry w of one sequence. */
static enum status emit(const struct kern_compressor_args *a, const float *kv, const float *sc, int64_t w,
			float *out, float *pooled)
{
	int m = a->ratio, d = a->head_dim, cd = (a->overlap ? 2 : 1) * d;
	int n_slots = a->overlap ? 2 * m : m;
	for (int ch = 0; ch < d; ch++) {
		/* slot j < m: row j, column ch (HCA, or CSA previous window's first half);
		 * CSA slot j >= m: row j, column d + ch (this window's second half). */
		float mx = -INFINITY;
		for (int j = 0; j < n_slots; j++) {
			int col = a->overlap && j >= m ? d + ch : ch;
			mx = fmaxf(mx, sc[(int64_t)j * cd + col]);
		}
		float den = 0, acc = 0;
		for (int j = 0; j < n_slots; j++) {
			int col = a->overlap && j >= m ? d + ch : ch;
			float s = sc[(int64_t)j * cd + col];
			if (s == -INFINITY)
				continue; /* an empty slot (w = 0 of CSA) weighs 0 */
			float p = expf(s - mx);
			den += p;
			acc += p * kv[(int64_t)j * cd + col];
		}
		out[ch] = acc / den;
	}
	if (pooled)
		for (int ch = 0; ch < d; ch++)
			pooled[ch] = out[ch];
	struct kern_rmsnorm_args na = {.x = out, .y = out, .w_bf16 = a->norm_w, .n_rows = 1, .dim = d,
				       .eps = a->norm_eps, .bf16_in = true, .bf16_out = true};
	enum status st = kern_rmsnorm_ref(&na);
	if (st != ST_OK)
		return st;
	int32_t pos = (int32_t)(w * m);
	struct kern_rope_args ra = {.x = out, .pos = &pos, .omega = a->omega, .n_rows = 1, .n_heads = 1,
				    .head_dim = d, .rope_dim = a->rope_dim, .bf16_out = true};
	st = kern_rope_ref(&ra);
	if (st != ST_OK)
		return st;
	if (a->post == KERN_CMP_POST_FP8_NOPE) {
		kern__fp8_qdq(out, d - a->rope_dim, 64);
	} else if (a->post == KERN_CMP_POST_HADAMARD_FP4) {
		st = kern_hadamard_ref(out, 1, d);
		if (st != ST_OK)
			return st;
		for (int ch = 0; ch < d; ch++)
			out[ch] = kern__bf16_round(out[ch]);
		kern__fp4_qdq(out, d, 32);
	}
	return ST_OK;
}

enum status kern_compressor_ref(const struct kern_compressor_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_seqs < 0 || a->ratio <= 0 || a->head_dim <= 0 || a->rope_dim <= 0 ||
	    a->rope_dim > a->head_dim || a->rope_dim % 2 || a->post < KERN_CMP_POST_FP8_NOPE ||
	    a->post > KERN_CMP_POST_NONE)
		return ST_INVALID;
	if (a->post == KERN_CMP_POST_HADAMARD_FP4 && (a->head_dim & (a->head_dim - 1)))
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	if (!a->kv_proj || !a->gate_proj || !a->ape || !a->q_off || !a->start_pos || !a->kv_state ||
	    !a->score_state || !a->state_slot || !a->norm_w || !a->omega || !a->out ||
	    (!a->out_row0 && !a->out_paged.block_table) || a->q_off[0] != 0 || a->q_off[a->n_seqs] != a->n_tokens)
		return ST_INVALID;
	for (int s = 0; s < a->n_seqs; s++) {
		int64_t len = a->q_off[s + 1] - a->q_off[s];
		if (len < 0 || a->start_pos[s] < 0 || a->state_slot[s] < 0 || a->state_slot[s] >= a->n_state_slots)
			return ST_INVALID;
		int64_t n_new = kern_compressor_n_emitted(a->start_pos[s], len, a->ratio);
		int64_t w0 = a->start_pos[s] / a->ratio;
		for (int64_t w = w0; w < w0 + n_new; w++) {
			int64_t r = kern_rowmap_row(a->out_row0, &a->out_paged, s, w);
			if (r < 0 || r >= a->n_out_rows)
				return ST_INVALID;
		}
	}
	int m = a->ratio, d = a->head_dim, c = a->overlap ? 2 : 1, cd = c * d;
	int64_t state_floats = (int64_t)c * m * cd;
	for (int s = 0; s < a->n_seqs; s++) {
		float *kv = a->kv_state + a->state_slot[s] * state_floats;
		float *sc = a->score_state + a->state_slot[s] * state_floats;
		for (int64_t i = a->q_off[s]; i < a->q_off[s + 1]; i++) {
			int64_t t = a->start_pos[s] + (i - a->q_off[s]);
			int64_t row = (a->overlap ? m : 0) + t % m;
			const float *ape = a->ape + (t % m) * cd;
			for (int ch = 0; ch < cd; ch++) {
				kv[row * cd + ch] = a->kv_proj[i * cd + ch];
				sc[row * cd + ch] = a->gate_proj[i * cd + ch] + ape[ch];
			}
			if ((t + 1) % m)
				continue;
			int64_t w = (t + 1) / m - 1;
			int64_t orow = kern_rowmap_row(a->out_row0, &a->out_paged, s, w);
			enum status st = emit(a, kv, sc, w, a->out + orow * d, a->pooled ? a->pooled + orow * d : NULL);
			if (st != ST_OK)
				return st;
			if (a->overlap)
				for (int64_t k = 0; k < (int64_t)m * cd; k++) {
					kv[k] = kv[(int64_t)m * cd + k];
					sc[k] = sc[(int64_t)m * cd + k];
				}
		}
	}
	return ST_OK;
}
