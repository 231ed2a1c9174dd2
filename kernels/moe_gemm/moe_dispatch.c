/*
 * kernels/moe_gemm/moe_dispatch.c: CPU references of moe_dispatch (a stable
 * counting sort of (token, slot) pairs by local expert) and moe_combine, and
 * their registry tables.
 */
#include "kernels/moe_gemm/moe_dispatch.h"

#include <stdio.h>
#include <string.h>

#include "dsv4_config.h"

enum status kern_moe_dispatch_ref(const struct kern_moe_dispatch_args *a)
{
	if (a->n_tokens < 0 || a->top_k <= 0 || a->n_experts <= 0 || !a->expert_offsets || !a->slot_row ||
	    !a->row_src || !a->n_rows || (a->n_tokens && !a->topk_ids) ||
	    a->n_tokens * a->top_k > INT32_MAX)
		return ST_INVALID;
	int64_t S = a->n_tokens * a->top_k, E = a->n_experts;
	int32_t *off = a->expert_offsets;
	memset(off, 0, sizeof(int32_t) * (size_t)(E + 1));
	for (int64_t s = 0; s < S; s++) {
		int64_t x = (int64_t)a->topk_ids[s] - a->expert_base;
		if (a->topk_ids[s] >= 0 && x >= 0 && x < E)
			off[x + 1]++;
	}
	for (int64_t x = 0; x < E; x++)
		off[x + 1] += off[x];
	/* Stable placement: slot order within each expert. off[x] is used as
	 * the fill cursor and restored afterwards. */
	for (int64_t s = 0; s < S; s++) {
		int64_t x = (int64_t)a->topk_ids[s] - a->expert_base;
		if (a->topk_ids[s] < 0 || x < 0 || x >= E) {
			a->slot_row[s] = -1;
			continue;
		}
		int32_t r = off[x]++;
		a->slot_row[s] = r;
		a->row_src[r] = (int32_t)(s / a->top_k);
		if (a->row_slot)
			a->row_slot[r] = (int32_t)s;
	}
	for (int64_t x = E; x > 0; x--)
		off[x] = off[x - 1];
	off[0] = 0;
	*a->n_rows = off[E];
	return ST_OK;
}

enum status kern_moe_combine_ref(const struct kern_moe_combine_args *a)
{
	if (a->n_tokens < 0 || a->top_k <= 0 || a->dim <= 0 || (a->n_tokens && (!a->slot_row || !a->out)) ||
	    (a->ldy && a->ldy < a->dim) || (a->ldo && a->ldo < a->dim))
		return ST_INVALID;
	int64_t ldy = a->ldy ? a->ldy : a->dim, ldo = a->ldo ? a->ldo : a->dim;
	for (int64_t t = 0; t < a->n_tokens; t++) {
		for (int64_t d = 0; d < a->dim; d++) {
			float acc = a->accumulate ? kern_load_f32(a->out, a->out_dtype, t * ldo + d) : 0.0f;
			for (int j = 0; j < a->top_k; j++) {
				int64_t s = t * a->top_k + j;
				int32_t r = a->slot_row[s];
				if (r < 0)
					continue;
				float v = kern_load_f32(a->y, a->y_dtype, (int64_t)r * ldy + d);
				acc += a->slot_weight ? a->slot_weight[s] * v : v;
			}
			kern_store_f32(a->out, a->out_dtype, t * ldo + d, acc);
		}
	}
	return ST_OK;
}

static bool dispatch_cuda_supports(const struct kern_problem *p, const struct kern_device *dev, char *why, size_t n)
{
	(void)dev;
	const struct kern_moe_dispatch_shape *s = p->shape;
	if (s && s->n_experts > 1024) {
		snprintf(why, n, "%lld local experts (at most 1024)", (long long)s->n_experts);
		return false;
	}
	return true;
}

static const struct kern_variant moe_dispatch_variants[] = {
	KERN_ROW_CPU_REF("moe_dispatch_cpu_ref", kern_moe_dispatch_ref,
	                 .desc = "CPU reference: stable counting sort of (token, slot) by local expert"),
	KERN_ROW_SM80("moe_dispatch_cuda_generic", 10, kern_moe_dispatch_cuda_generic,
	              kern_moe_dispatch_cuda_generic_host, .supports = dispatch_cuda_supports,
	              .desc = "portable CUDA dispatch: one block, deterministic stable placement"),
};

const struct kern_op kern_op_moe_dispatch = {
	.name = "moe_dispatch",
	.variants = moe_dispatch_variants,
	.n_variants = (int)(sizeof moe_dispatch_variants / sizeof moe_dispatch_variants[0]),
};

static const struct kern_variant moe_combine_variants[] = {
	KERN_ROW_CPU_REF("moe_combine_cpu_ref", kern_moe_combine_ref,
	                 .desc = "CPU reference: per-token sum of its expert rows, f32"),
	KERN_ROW_SM80("moe_combine_cuda_generic", 10, kern_moe_combine_cuda_generic, kern_moe_combine_cuda_generic_host,
	              .desc = "portable CUDA combine: a gather per token, fixed order"),
};

const struct kern_op kern_op_moe_combine = {
	.name = "moe_combine",
	.variants = moe_combine_variants,
	.n_variants = (int)(sizeof moe_combine_variants / sizeof moe_combine_variants[0]),
};
