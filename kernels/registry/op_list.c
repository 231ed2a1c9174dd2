/*
 * kernels/registry/op_list.c: the list of every op table in the binary, for
 * `dsv4 kernels --list`, for checking --disable-kernel names, and for tests
 * that sweep all variants. Selection itself does not need this list (callers
 * pass the op table they want), so an op missing here still works; it just
 * is not listed.
 *
 * Adding an op: define `const struct kern_op kern_op_<op>` in
 * kernels/<op>/<op>_variants.c (or next to its _ref), declare it `extern` in
 * kernels/<op>/<op>.h, and add one `&kern_op_<op>,` line in the block of
 * your component below (with the #include of your header).
 */
#include <string.h>

#include "kernels/registry/registry.h"

/* ---- kernels-linear ---- */
#include "kernels/linear/linear.h"
#include "kernels/moe_gemm/moe_dispatch.h"
#include "kernels/moe_gemm/moe_gemm.h"
/* ---- kernels-model-ops (includes) ---- */
#include "kernels/norm/norm.h"
#include "kernels/rope/rope.h"
#include "kernels/hc/hc.h"
#include "kernels/attention/attention.h"
#include "kernels/compressor/compressor.h"
#include "kernels/indexer/indexer.h"
#include "kernels/routing/routing.h"
#include "kernels/act/act.h"
/* ---- gpu-ops (includes) ---- */
#include "kernels/movement/movement.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/logprobs.h" /* evaluation */
#include "kernels/fill/fill_random.h"     /* dummy-load */
#include "kernels/moe_gemm/moe_decode.h"   /* moe-decode */
/* ---- end includes ---- */

static const struct kern_op *const all_ops[] = {
	/* ---- kernels-linear ---- */
	&kern_op_linear,
	&kern_op_moe_gemm,
	&kern_op_moe_dispatch,
	&kern_op_moe_combine,
	/* ---- kernels-model-ops (one line per op) ---- */
	&kern_op_rmsnorm,
	&kern_op_rope,
	&kern_op_hc_prenorm,
	&kern_op_hc_split,
	&kern_op_hc_pre_combine,
	&kern_op_hc_post,
	&kern_op_sparse_attn,
	&kern_op_attn_index,
	&kern_op_ring_write,
	&kern_op_compressor,
	&kern_op_indexer_rotate,
	&kern_op_indexer_topk,
	&kern_op_indexer_scores,
	&kern_op_route,
	&kern_op_swiglu,
	/* ---- gpu-ops ---- */
	&kern_op_copy_rows,
	&kern_op_embed,
	&kern_op_block_copy,
	&kern_op_block_fill,
	&kern_op_round_bf16,
	&kern_op_add,
	&kern_op_act_quant_sim,
	&kern_op_moe_row_weight,
	&kern_op_sample,
	/* ---- end ---- */
	&kern_op_token_logprobs, /* evaluation: prompt log-probabilities */
	&kern_op_fill_random,    /* dummy-load: --load-format dummy */
	&kern_op_moe_decode,     /* moe-decode: fused routed-expert decode */
};

const struct kern_op *const *kern_registry_ops(int *n_ops)
{
	*n_ops = (int)(sizeof all_ops / sizeof all_ops[0]);
	return all_ops;
}

const struct kern_op *kern_registry_find_op(const char *name)
{
	for (size_t i = 0; i < sizeof all_ops / sizeof all_ops[0]; i++)
		if (!strcmp(all_ops[i]->name, name))
			return all_ops[i];
	return NULL;
}
