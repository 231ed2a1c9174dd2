/*
 * kernels/hc/hc_ref.c: CPU reference of the mHC ops (dsv4.md §3.2, §3.10):
 * the prenorm GEMM, the per-token sigmoid/softmax/Sinkhorn split, and the
 * pre/post stream combinations. Straight fp32 loops.
 */
#include "kernels/hc/hc.h"

#include <math.h>

#include "kernels/norm/lowp_sim.h"

static inline float sigmoid(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

enum status kern_hc_prenorm_ref(const struct kern_hc_prenorm_args *a)
{
	if (!a || a->n_tokens < 0 || a->k <= 0 || a->n_out <= 0)
		return ST_INVALID;
	if (a->n_tokens > 0 && (!a->x || !a->fn || !a->mix || !a->sqr_sum))
		return ST_INVALID;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		const float *v = a->x + t * a->k;
		float ss = 0;
		for (int i = 0; i < a->k; i++)
			ss += v[i] * v[i];
		a->sqr_sum[t] = ss;
		for (int o = 0; o < a->n_out; o++) {
			const float *w = a->fn + (int64_t)o * a->k;
			float acc = 0;
			for (int i = 0; i < a->k; i++)
				acc += v[i] * w[i];
			a->mix[t * a->n_out + o] = acc;
		}
	}
	return ST_OK;
}

enum status kern_hc_split_ref(const struct kern_hc_split_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->n_streams > KERN_HC_MAX_STREAMS || a->k <= 0 ||
	    a->sinkhorn_iters < 1)
		return ST_INVALID;
	if (a->n_tokens > 0 && (!a->mix || !a->sqr_sum || !a->scale || !a->base || !a->pre ||
				(!a->head && (!a->post || !a->comb))))
		return ST_INVALID;
	int n = a->n_streams;
	int n_out = a->head ? n : (2 + n) * n;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		const float *mix = a->mix + t * n_out;
		float rho = 1.0f / sqrtf(a->sqr_sum[t] / (float)a->k + a->norm_eps);
		for (int j = 0; j < n; j++)
			a->pre[t * n + j] = sigmoid(a->scale[0] * (rho * mix[j]) + a->base[j]) + a->hc_eps;
		if (a->head)
			continue;
		for (int j = 0; j < n; j++)
			a->post[t * n + j] = 2.0f * sigmoid(a->scale[1] * (rho * mix[n + j]) + a->base[n + j]);
		float P[KERN_HC_MAX_STREAMS][KERN_HC_MAX_STREAMS];
		for (int j = 0; j < n; j++) {
			float mx = -INFINITY;
			for (int k = 0; k < n; k++) {
				P[j][k] = a->scale[2] * (rho * mix[2 * n + n * j + k]) + a->base[2 * n + n * j + k];
				mx = fmaxf(mx, P[j][k]);
			}
			float sum = 0;
			for (int k = 0; k < n; k++) {
				P[j][k] = expf(P[j][k] - mx);
				sum += P[j][k];
			}
			for (int k = 0; k < n; k++)
				P[j][k] = P[j][k] / sum + a->hc_eps;
		}
		for (int it = 0; it < a->sinkhorn_iters; it++) {
			if (it > 0) { /* row normalisation (not on the first pass) */
				for (int j = 0; j < n; j++) {
					float s = 0;
					for (int k = 0; k < n; k++)
						s += P[j][k];
					for (int k = 0; k < n; k++)
						P[j][k] /= s + a->hc_eps;
				}
			}
			for (int k = 0; k < n; k++) { /* column normalisation */
				float s = 0;
				for (int j = 0; j < n; j++)
					s += P[j][k];
				for (int j = 0; j < n; j++)
					P[j][k] /= s + a->hc_eps;
			}
		}
		for (int j = 0; j < n; j++)
			for (int k = 0; k < n; k++)
				a->comb[(t * n + j) * n + k] = P[j][k];
	}
	return ST_OK;
}

enum status kern_hc_pre_combine_ref(const struct kern_hc_pre_combine_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens > 0 && (!a->x || !a->pre || !a->u))
		return ST_INVALID;
	int n = a->n_streams, D = a->dim;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		for (int i = 0; i < D; i++) {
			float acc = 0;
			for (int j = 0; j < n; j++)
				acc += a->pre[t * n + j] * a->x[(t * n + j) * D + i];
			a->u[t * D + i] = a->bf16_out ? kern__bf16_round(acc) : acc;
		}
	}
	return ST_OK;
}

enum status kern_hc_post_ref(const struct kern_hc_post_args *a)
{
	if (!a || a->n_tokens < 0 || a->n_streams <= 0 || a->dim <= 0)
		return ST_INVALID;
	if (a->n_tokens > 0 && (!a->f || !a->x || !a->post || !a->comb || !a->x_out || a->x_out == a->x))
		return ST_INVALID;
	int n = a->n_streams, D = a->dim;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		const float *C = a->comb + t * n * n;
		for (int k = 0; k < n; k++) {
			for (int i = 0; i < D; i++) {
				float acc = a->post[t * n + k] * a->f[t * D + i];
				for (int j = 0; j < n; j++)
					acc += C[j * n + k] * a->x[(t * n + j) * D + i];
				a->x_out[(t * n + k) * D + i] = a->bf16_out ? kern__bf16_round(acc) : acc;
			}
		}
	}
	return ST_OK;
}
