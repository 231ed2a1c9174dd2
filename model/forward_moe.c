/*
 * model/forward_moe.c: a layer's MoE (dsv4.md §3): gate and routing, the
 * dispatch into the grouped expert layout, the routed experts (the fused
 * decode pass for small steps), the combine, and the shared expert.
 *
 * MoE rows: the grouped layout has at most n_tokens * top_k rows (all of
 * them when this rank holds every expert); the expert ops run on that bound
 * and the dispatch's row count, which stays where it was computed, decides
 * which rows exist, so no value travels back to the host inside a step.
 */
#include "model/forward_internal.h"

enum status fwd__moe(struct model_fwd *f, const struct model_layer *ly, int l, const float *xn, float *out,
		       struct err *e)
{
	int64_t T = f->T, D = f->D, I = f->I, E = f->E, K = f->K, EL = f->EL;
	int64_t P = T * K; /* rows of the grouped layout at most; n_rows holds how many exist */
	void *sm = f->mem.stream;
	enum status st;
	if ((st = fwd__lin(f, &ly->gate, xn, 0, T, f->glog, 0, false, l, e)))
		return st;
	struct kern_route_args ra = {.logits = f->glog, .bias = ly->hash ? NULL : ly->gate_bias,
				     .tid2eid = ly->hash ? ly->tid2eid : NULL, .token_ids = DEV(f, f->ids),
				     .vocab = f->V, .n_tokens = T, .n_experts = (int)E, .top_k = (int)K,
				     .route_scale = (float)f->cfg->routed_scaling_factor, .expert_ids = f->eids,
				     .weights = f->ew, .stream = sm};
	OK(l, ly->ops.route(&ra));
	fwd__trace(f, "route_w", l, f->ew, T * K);
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
	fwd__trace(f, x->v13->name, l, f->h1, P * I);
	fwd__trace(f, "h3", l, f->h3, P * I);
	if ((st = fwd__round_bf16(f, f->h1, P * I, e)) || (st = fwd__round_bf16(f, f->h3, P * I, e)))
		return st;
	struct kern_swiglu_args sa = {.gate = f->h1, .up = f->h3, .out = f->h1, .row_weight = f->rw, .n_rows = P,
				      .dim = (int)I, .limit = limit, .bf16_out = f->opt.bf16_round, .stream = sm};
	OK(l, ly->ops.swiglu(&sa));
	struct kern_moe_gemm_args m2 = {.n_rows = P, .n_experts = EL, .expert_offsets = f->offsets, .n_x_rows = P,
					.x = f->h1, .x_dtype = KERN_DT_F32, .y = f->y2, .y_dtype = KERN_DT_F32,
					.w = x->w2, .w_dev = x->w2_dev, .act_quant_block = x->act_quant_block,
					.stream = sm, .ctx = f->opt.kctx};
	OK(l, x->run2(&m2));
	fwd__trace(f, x->v2->name, l, f->y2, P * D);
	if ((st = fwd__round_bf16(f, f->y2, P * D, e)))
		return st;
	struct kern_moe_combine_args ca = {.n_tokens = T, .top_k = (int)K, .dim = D, .slot_row = f->slot_row,
					   .y = f->y2, .y_dtype = KERN_DT_F32, .out = out, .out_dtype = KERN_DT_F32,
					   .stream = sm};
	OK(l, f->g->moe_combine(&ca));
combined:
	fwd__trace(f, "combine", l, out, T * D);
	/* shared expert (same clamp, weight 1); under TP each rank holds a slice
	 * of its intermediate dim and the all-reduce sums the partial outputs */
	int64_t IL = ly->sh_w1.w.rows;
	if ((st = fwd__lin(f, &ly->sh_w1, xn, 0, T, f->sh1, 0, true, l, e)) ||
	    (st = fwd__lin(f, &ly->sh_w3, xn, 0, T, f->sh3, 0, true, l, e)))
		return st;
	struct kern_swiglu_args ss = {.gate = f->sh1, .up = f->sh3, .out = f->sh1, .n_rows = T, .dim = (int)IL,
				      .limit = limit, .bf16_out = f->opt.bf16_round, .stream = sm};
	OK(l, ly->ops.swiglu(&ss));
	if ((st = fwd__lin(f, &ly->sh_w2, f->sh1, 0, T, f->shy, 0, f->ws == 1, l, e)))
		return st;
	fwd__trace(f, "shared", l, f->shy, T * D);
	struct kern_add_args aa = {.y = out, .x = f->shy, .n = T * D, .stream = sm};
	OK(l, f->g->add(&aa));
	if ((st = fwd__all_reduce(f, out, T * D, e)))
		return st;
	return fwd__round_bf16(f, out, T * D, e);
}
