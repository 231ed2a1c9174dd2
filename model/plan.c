/*
 * model/plan.c: the kernel plan of the forward pass (model/weights.h,
 * step 1).
 *
 * The one place where kernels are selected: from the config, the stored
 * format of each weight group and the shapes this rank runs, kern_select
 * picks a variant for every linear site, the routed experts' GEMMs, the
 * weight-free ops of each layer, the global data-movement ops and the head.
 * It needs no tensor, so `dsv4 kernels` plans a real config.json for any
 * simulated device; model_weights_load (model/weights.c) plans the same way
 * from the checkpoint's formats before it views a single tensor.
 */
#include "model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

/* ---- formats ---- */

void model_formats_from_checkpoint(const struct model_checkpoint *ck, struct model_layer_formats *fmts)
{
	const struct model_config *cfg = model_checkpoint_config(ck);
	for (int l = 0; l < cfg->n_layers_total; l++)
		for (int g = 0; g < MODEL_GROUP_COUNT; g++)
			fmts[l].group[g] = model_checkpoint_group_format(ck, l, (enum model_group)g);
}

enum status model_formats_from_config(const struct model_config *cfg, struct model_layer_formats *fmts,
				      struct err *e)
{
	bool q = cfg->quant.present;
	enum model_expert_dtype ed = cfg->expert_dtype;
	if (!q && (ed == MODEL_EXPERT_DTYPE_FP4 || ed == MODEL_EXPERT_DTYPE_FP8))
		return err_set(e, ST_INVALID, "config.json: expert_dtype %s without quantization_config",
			       model_expert_dtype_str(ed));
	if (q && cfg->quant.moe_nvfp4 && (ed == MODEL_EXPERT_DTYPE_FP8 || ed == MODEL_EXPERT_DTYPE_BF16))
		return err_set(e, ST_INVALID, "config.json: expert_dtype %s contradicts moe_quant_algo NVFP4",
			       model_expert_dtype_str(ed));
	enum model_weight_format dense = q ? MODEL_FMT_FP8_BLOCK : MODEL_FMT_BF16;
	enum model_weight_format experts = !q                           ? MODEL_FMT_BF16
					   : ed == MODEL_EXPERT_DTYPE_FP8  ? MODEL_FMT_FP8_BLOCK
					   : ed == MODEL_EXPERT_DTYPE_BF16 ? MODEL_FMT_BF16
									   : MODEL_FMT_MXFP4;
	for (int l = 0; l < cfg->n_layers_total; l++) {
		struct model_layer_formats *f = &fmts[l];
		bool mtp = model_config_is_mtp_layer(cfg, l);
		memset(f, 0, sizeof *f);
		f->group[MODEL_GROUP_ATTN] = dense;
		if (cfg->n_shared_experts > 0)
			f->group[MODEL_GROUP_SHARED_EXPERTS] = dense;
		f->group[MODEL_GROUP_ROUTED_EXPERTS] = experts;
		if (q && cfg->quant.moe_nvfp4)
			f->group[MODEL_GROUP_ROUTED_EXPERTS] = mtp && cfg->quant.ignore_mtp ? MODEL_FMT_MXFP4 : MODEL_FMT_NVFP4;
		if (mtp && (!model_config_is_dspark_layer(cfg, l) || l == cfg->num_hidden_layers))
			f->group[MODEL_GROUP_MTP_PROJ] = dense; /* e_proj/h_proj, or DSpark mtp.0.main_proj */
	}
	return ST_OK;
}

/* ---- the plan ---- */

/* Per site: the name suffix after "layers.L.", the group whose format it is
 * stored in (OTHER: a plain BF16 matrix), and whether the reference
 * quantizes its activations (simulation on, quantized weight). */
static const struct {
	const char *name;
	enum model_group group;
	bool act_quant;
} site_info[MODEL_LIN_COUNT] = {
	[MODEL_LIN_WQ_A] = {"attn.wq_a", MODEL_GROUP_ATTN, true},
	[MODEL_LIN_WQ_B] = {"attn.wq_b", MODEL_GROUP_ATTN, true},
	[MODEL_LIN_WKV] = {"attn.wkv", MODEL_GROUP_ATTN, true},
	/* no act_quant: the reference runs this grouped einsum in bf16 on
	 * dequantized weights (dsv4.md §3.3 output path, step 2) */
	[MODEL_LIN_WO_A] = {"attn.wo_a", MODEL_GROUP_ATTN, false},
	[MODEL_LIN_WO_B] = {"attn.wo_b", MODEL_GROUP_ATTN, true},
	[MODEL_LIN_CMP_WKV] = {"attn.compressor.wkv", MODEL_GROUP_OTHER, false},
	[MODEL_LIN_CMP_WGATE] = {"attn.compressor.wgate", MODEL_GROUP_OTHER, false},
	[MODEL_LIN_IDX_WQ_B] = {"attn.indexer.wq_b", MODEL_GROUP_ATTN, true},
	[MODEL_LIN_IDX_WPROJ] = {"attn.indexer.weights_proj", MODEL_GROUP_OTHER, false},
	[MODEL_LIN_IDX_CMP_WKV] = {"attn.indexer.compressor.wkv", MODEL_GROUP_OTHER, false},
	[MODEL_LIN_IDX_CMP_WGATE] = {"attn.indexer.compressor.wgate", MODEL_GROUP_OTHER, false},
	[MODEL_LIN_GATE] = {"ffn.gate", MODEL_GROUP_OTHER, false},
	[MODEL_LIN_SH_W1] = {"ffn.shared_experts.w1", MODEL_GROUP_SHARED_EXPERTS, true},
	[MODEL_LIN_SH_W3] = {"ffn.shared_experts.w3", MODEL_GROUP_SHARED_EXPERTS, true},
	[MODEL_LIN_SH_W2] = {"ffn.shared_experts.w2", MODEL_GROUP_SHARED_EXPERTS, true},
	[MODEL_LIN_EXP_W13] = {"ffn.experts.w1,w3", MODEL_GROUP_ROUTED_EXPERTS, true},
	[MODEL_LIN_EXP_W2] = {"ffn.experts.w2", MODEL_GROUP_ROUTED_EXPERTS, true},
	[MODEL_LIN_E_PROJ] = {"e_proj", MODEL_GROUP_MTP_PROJ, true},
	[MODEL_LIN_H_PROJ] = {"h_proj", MODEL_GROUP_MTP_PROJ, true},
};

static const struct kern_op *const layer_ops[MODEL_OP_COUNT] = {
	[MODEL_OP_RMSNORM] = &kern_op_rmsnorm,
	[MODEL_OP_ROPE] = &kern_op_rope,
	[MODEL_OP_HC_PRENORM] = &kern_op_hc_prenorm,
	[MODEL_OP_HC_SPLIT] = &kern_op_hc_split,
	[MODEL_OP_HC_PRE_COMBINE] = &kern_op_hc_pre_combine,
	[MODEL_OP_HC_POST] = &kern_op_hc_post,
	[MODEL_OP_ATTN_INDEX] = &kern_op_attn_index,
	[MODEL_OP_SPARSE_ATTN] = &kern_op_sparse_attn,
	[MODEL_OP_COMPRESSOR] = &kern_op_compressor,
	[MODEL_OP_INDEXER_ROTATE] = &kern_op_indexer_rotate,
	[MODEL_OP_INDEXER_TOPK] = &kern_op_indexer_topk,
	[MODEL_OP_ROUTE] = &kern_op_route,
	[MODEL_OP_SWIGLU] = &kern_op_swiglu,
};

static const struct kern_op *const global_ops[MODEL_GOP_COUNT] = {
	[MODEL_GOP_EMBED] = &kern_op_embed,
	[MODEL_GOP_COPY_ROWS] = &kern_op_copy_rows,
	[MODEL_GOP_BLOCK_COPY] = &kern_op_block_copy,
	[MODEL_GOP_BLOCK_FILL] = &kern_op_block_fill,
	[MODEL_GOP_ROUND_BF16] = &kern_op_round_bf16,
	[MODEL_GOP_ADD] = &kern_op_add,
	[MODEL_GOP_ACT_QUANT_SIM] = &kern_op_act_quant_sim,
	[MODEL_GOP_RING_WRITE] = &kern_op_ring_write,
	[MODEL_GOP_MOE_DISPATCH] = &kern_op_moe_dispatch,
	[MODEL_GOP_MOE_ROW_WEIGHT] = &kern_op_moe_row_weight,
	[MODEL_GOP_MOE_COMBINE] = &kern_op_moe_combine,
	[MODEL_GOP_SAMPLE] = &kern_op_sample,
	[MODEL_GOP_TOKEN_LOGPROBS] = &kern_op_token_logprobs,
};

const char *model_lin_site_name(enum model_lin_site s)
{
	return (unsigned)s < MODEL_LIN_COUNT ? site_info[s].name : "?";
}

const struct kern_op *model_layer_op_kern(enum model_layer_op o)
{
	return (unsigned)o < MODEL_OP_COUNT ? layer_ops[o] : NULL;
}

const struct kern_op *model_global_op_kern(enum model_global_op o)
{
	return (unsigned)o < MODEL_GOP_COUNT ? global_ops[o] : NULL;
}

static bool wfmt_quantized(enum kern_wfmt f)
{
	return f != KERN_WFMT_NONE && f != KERN_WFMT_BF16 && f != KERN_WFMT_F32;
}

struct planner {
	const struct model_config *cfg;
	const struct model_layer_formats *fmts;
	const struct model_plan_options *opt;
	struct kern_device dev;
	struct kern_disabled dis; /* opt->disabled plus what the self-check dropped */
	struct model_plan *p;
};

/* The one selection call of the planner: kern_select, or with --kernel-selfcheck
 * kern_select_checked, which adds a variant that disagrees with the reference
 * to P->dis so that later layers skip it too. */
static enum status select_variant(struct planner *P, const struct kern_op *op, const struct kern_problem *pr,
				  int layer, const struct kern_variant **v, struct err *e)
{
	if (P->opt->selfcheck)
		return kern_select_checked(op, pr, &P->dev, &P->dis, layer, v, e);
	return kern_select(op, pr, &P->dev, &P->dis, layer, v, e);
}

/* A row per distinct (layer, op, variant); the rows of one layer are contiguous. */
static enum status row_add(struct model_plan *p, int layer, const struct kern_op *op, const struct kern_variant *v,
			   struct err *e)
{
	for (int i = p->rows.n - 1; i >= 0 && p->rows.entries[i].layer == layer; i--)
		if (p->rows.entries[i].op == op->name && p->rows.entries[i].variant == v->name)
			return ST_OK;
	return kern_plan_add(&p->rows, layer, op, v, e);
}

/* A stored format as the kernels name it (FP8 checkpoints have E8M0 block
 * scales, model/schema.h). */
static enum status kern_wfmt_of(const struct model_config *cfg, enum model_weight_format f, enum kern_wfmt *out,
				struct err *e)
{
	switch (f) {
	case MODEL_FMT_BF16: *out = KERN_WFMT_BF16; return ST_OK;
	case MODEL_FMT_F32: *out = KERN_WFMT_F32; return ST_OK;
	case MODEL_FMT_FP8_BLOCK:
		if (cfg->quant.present && (cfg->quant.weight_block_size[0] != 128 || cfg->quant.weight_block_size[1] != 128))
			return err_set(e, ST_UNSUPPORTED, "FP8 block size %lldx%lld (only 128x128)",
				       (long long)cfg->quant.weight_block_size[0], (long long)cfg->quant.weight_block_size[1]);
		*out = KERN_WFMT_FP8_E8M0_B128;
		return ST_OK;
	case MODEL_FMT_MXFP4: *out = KERN_WFMT_MXFP4; return ST_OK;
	case MODEL_FMT_NVFP4: *out = KERN_WFMT_NVFP4; return ST_OK;
	case MODEL_FMT_NONE:
	case MODEL_FMT_COUNT: break;
	}
	return err_set(e, ST_INVALID, "no storage format");
}

/* Does layer have site s, and with what local [out, in]? */
static bool site_shape(const struct planner *P, const struct model_layer_plan *ly, enum model_lin_site s,
		       int64_t *out, int64_t *in)
{
	const struct model_config *c = P->cfg;
	int64_t ws = P->opt->world_size, D = c->hidden_size, H = c->num_attention_heads, d = c->head_dim;
	int64_t G = c->o_groups, R = c->o_lora_rank, Q = c->q_lora_rank, ih = c->index_n_heads, id = c->index_head_dim;
	int64_t I = c->moe_intermediate_size, IL = I * c->n_shared_experts / ws;
	bool csa = ly->kind == MODEL_ATTN_CSA;
	int64_t coff = csa ? 2 : 1;
	struct { bool has; int64_t out, in; } t;
	switch (s) {
	case MODEL_LIN_WQ_A: t.has = true, t.out = Q, t.in = D; break;
	case MODEL_LIN_WQ_B: t.has = true, t.out = H / ws * d, t.in = Q; break;
	case MODEL_LIN_WKV: t.has = true, t.out = c->num_key_value_heads * d, t.in = D; break;
	case MODEL_LIN_WO_A: t.has = true, t.out = R, t.in = H / G * d; break;
	case MODEL_LIN_WO_B: t.has = true, t.out = D, t.in = G / ws * R; break;
	case MODEL_LIN_CMP_WKV:
	case MODEL_LIN_CMP_WGATE: t.has = ly->ratio != 0, t.out = coff * d, t.in = D; break;
	case MODEL_LIN_IDX_WQ_B: t.has = csa, t.out = ih * id, t.in = Q; break;
	case MODEL_LIN_IDX_WPROJ: t.has = csa, t.out = ih, t.in = D; break;
	case MODEL_LIN_IDX_CMP_WKV:
	case MODEL_LIN_IDX_CMP_WGATE: t.has = csa, t.out = 2 * id, t.in = D; break;
	case MODEL_LIN_GATE: t.has = true, t.out = c->n_routed_experts, t.in = D; break;
	case MODEL_LIN_SH_W1:
	case MODEL_LIN_SH_W3: t.has = true, t.out = IL, t.in = D; break;
	case MODEL_LIN_SH_W2: t.has = true, t.out = D, t.in = IL; break;
	case MODEL_LIN_EXP_W13: t.has = true, t.out = I, t.in = D; break;
	case MODEL_LIN_EXP_W2: t.has = true, t.out = D, t.in = I; break;
	case MODEL_LIN_E_PROJ:
	case MODEL_LIN_H_PROJ: t.has = ly->mtp, t.out = D, t.in = D; break;
	default: t.has = false, t.out = t.in = 0; break;
	}
	*out = t.out;
	*in = t.in;
	return t.has;
}

/* Decode-sized steps: at most this many tokens (a batch of decodes). */
#define LIN_DEC_TOKENS 16

/* Select the linear (or expert GEMM) of one site; where names it in errors. */
static enum status plan_lin(struct planner *P, int layer, const char *where, bool moe, enum kern_wfmt f, int64_t out,
			    int64_t in, bool allow_aq, struct model_lin_plan *x, struct err *e)
{
	const struct model_plan_options *o = P->opt;
	int aq = allow_aq && wfmt_quantized(f) && o->quant_sim ? 128 : 0;
	struct kern_linear_shape ls = {.in = in, .out = out, .max_tokens = o->max_step_tokens, .act_quant_block = aq,
				       .x_dtype = KERN_DT_F32, .y_dtype = KERN_DT_F32};
	struct kern_moe_gemm_shape ms = {.in = in, .out = out, .n_experts = P->cfg->n_routed_experts / o->world_size,
					 .max_rows = o->max_step_tokens * P->cfg->num_experts_per_tok,
					 .act_quant_block = aq, .x_dtype = KERN_DT_F32, .y_dtype = KERN_DT_F32};
	struct kern_problem pr = {.wfmt = f, .tp_size = o->world_size, .shape = moe ? (const void *)&ms : (const void *)&ls};
	const struct kern_op *op = moe ? &kern_op_moe_gemm : &kern_op_linear;
	const struct kern_variant *v;
	enum status st = select_variant(P, op, &pr, -1, &v, e);
	if (st) {
		if (layer >= 0)
			return err_prefix(e, "layer %d (%s)", layer, where);
		return err_prefix(e, "%s", where);
	}
	*x = (struct model_lin_plan){.v = v, .op = op, .wfmt = f, .out = out, .in = in, .act_quant_block = aq};
	if ((st = row_add(P->p, layer, op, v, e)))
		return st;
	/* a decode slot: the variant a step of at most LIN_DEC_TOKENS tokens
	 * would get, kept when it differs and reads what v's prepare() writes */
	if (!moe && o->max_step_tokens > LIN_DEC_TOKENS) {
		const struct kern_variant *vd = NULL;
		ls.max_tokens = LIN_DEC_TOKENS;
		if (select_variant(P, op, &pr, -1, &vd, NULL) == ST_OK && vd != v && vd->prepare == v->prepare &&
		    vd->backend == v->backend) {
			x->v_dec = vd;
			x->dec_tokens = LIN_DEC_TOKENS;
			return row_add(P->p, layer, op, vd, e);
		}
	}
	return ST_OK;
}

/* The fused routed-expert pass of small steps (op moe_decode), where a GPU
 * variant takes the layer's experts as the expert GEMMs' variants hold them
 * (no prepare); otherwise, and on the CPU, none: the unfused ops run every
 * step. */
static enum status plan_moe_decode(struct planner *P, int layer, struct model_layer_plan *ly, struct err *e)
{
	const struct model_lin_plan *p13 = &ly->lin[MODEL_LIN_EXP_W13], *p2 = &ly->lin[MODEL_LIN_EXP_W2];
	ly->moe_dec = NULL;
	if (!p13->v || !p2->v || p13->v->prepare || p2->v->prepare || p13->wfmt != p2->wfmt)
		return ST_OK;
	const int64_t mt = P->opt->max_step_tokens;
	struct kern_moe_decode_shape sh = {.dim = p13->in, .inter = p13->out,
					   .n_experts = P->cfg->n_routed_experts / P->opt->world_size,
					   .top_k = (int)P->cfg->num_experts_per_tok,
					   .max_tokens = mt < KERN_MOE_DECODE_MAX_TOKENS ? mt : KERN_MOE_DECODE_MAX_TOKENS,
					   .act_quant_block = p13->act_quant_block};
	struct kern_problem pr = {.wfmt = p13->wfmt, .tp_size = P->opt->world_size, .shape = &sh};
	const struct kern_variant *v = NULL;
	if (select_variant(P, &kern_op_moe_decode, &pr, layer, &v, NULL) != ST_OK ||
	    v->backend == KERN_BACKEND_CPU)
		return ST_OK;
	ly->moe_dec = v;
	return row_add(P->p, layer, &kern_op_moe_decode, v, e);
}

static enum status plan_layer(struct planner *P, int layer, struct model_layer_plan *ly, struct err *e)
{
	const struct model_config *cfg = P->cfg;
	enum status st;
	ly->layer = layer;
	ly->kind = model_config_attn_kind(cfg, layer);
	ly->ratio = cfg->compress_ratios[layer];
	ly->hash = model_config_is_hash_layer(cfg, layer);
	ly->dspark = model_config_is_dspark_layer(cfg, layer);
	ly->mtp = model_config_is_mtp_layer(cfg, layer) && !ly->dspark;
	/* the weight-free ops, in the order the forward pass meets them */
	for (int o = 0; o < MODEL_OP_COUNT; o++) {
		if (o == MODEL_OP_COMPRESSOR && !ly->ratio)
			continue;
		if ((o == MODEL_OP_INDEXER_ROTATE || o == MODEL_OP_INDEXER_TOPK) && ly->kind != MODEL_ATTN_CSA)
			continue;
		struct kern_problem pr = {.wfmt = KERN_WFMT_NONE, .tp_size = P->opt->world_size, .shape = NULL};
		if ((st = select_variant(P, layer_ops[o], &pr, layer, &ly->op[o], e)) ||
		    (st = row_add(P->p, layer, layer_ops[o], ly->op[o], e)))
			return st;
	}
	char lp[48], where[160];
	model_schema_layer_prefix(cfg, layer, lp, sizeof lp);
	for (int s = 0; s < MODEL_LIN_COUNT; s++) {
		int64_t out, in;
		if (!site_shape(P, ly, (enum model_lin_site)s, &out, &in))
			continue;
		snprintf(where, sizeof where, "%s.%s", lp, site_info[s].name);
		enum model_group g = site_info[s].group;
		enum model_weight_format mf = g == MODEL_GROUP_OTHER ? MODEL_FMT_BF16 : P->fmts[layer].group[g];
		if (mf == MODEL_FMT_NONE)
			return err_set(e, ST_INVALID, "layer %d (%s): no storage format for group %s", layer, where,
				       model_group_str(g));
		enum kern_wfmt f = KERN_WFMT_NONE;
		if ((st = kern_wfmt_of(cfg, mf, &f, e)))
			return err_prefix(e, "layer %d (%s)", layer, where);
		bool moe = s == MODEL_LIN_EXP_W13 || s == MODEL_LIN_EXP_W2;
		if ((st = plan_lin(P, layer, where, moe, f, out, in, site_info[s].act_quant, &ly->lin[s], e)))
			return st;
	}
	return plan_moe_decode(P, layer, ly, e);
}

/* The DSpark stages' input projection (mtp.0.main_proj, rows with stage 0's
 * layer L0): an FP8 block GEMM over the target layers' outputs. */
static enum status plan_dspark_main_proj(struct planner *P, int L0, struct model_lin_plan *x, struct err *e)
{
	const struct model_config *cfg = P->cfg;
	enum model_weight_format mf = P->fmts[L0].group[MODEL_GROUP_MTP_PROJ];
	enum kern_wfmt f = KERN_WFMT_NONE;
	if (mf == MODEL_FMT_NONE)
		return err_set(e, ST_INVALID, "layer %d (mtp.0.main_proj): no storage format", L0);
	enum status st = kern_wfmt_of(cfg, mf, &f, e);
	if (st)
		return err_prefix(e, "layer %d (mtp.0.main_proj)", L0);
	return plan_lin(P, L0, "mtp.0.main_proj", false, f, cfg->hidden_size,
			cfg->hidden_size * cfg->dspark.n_target_layers, true, x, e);
}

enum status model_plan_build(const struct model_config *cfg, const struct model_layer_formats *fmts,
			     const struct model_plan_options *opt, struct model_plan *out, struct err *e)
{
	memset(out, 0, sizeof *out);
	kern_plan_init(&out->rows);
	int ws = opt->world_size;
	if (ws < 1)
		return err_set(e, ST_INVALID, "world size %d", ws);
	if (cfg->num_attention_heads % ws || cfg->o_groups % ws || cfg->n_routed_experts % ws || cfg->vocab_size % ws ||
	    cfg->moe_intermediate_size % ws)
		return err_set(e, ST_UNSUPPORTED,
			       "world size %d does not divide heads %lld, o_groups %lld, experts %lld, moe_intermediate_size "
			       "%lld and vocab %lld", ws, (long long)cfg->num_attention_heads, (long long)cfg->o_groups,
			       (long long)cfg->n_routed_experts, (long long)cfg->moe_intermediate_size,
			       (long long)cfg->vocab_size);
	if (cfg->n_shared_experts < 1)
		return err_set(e, ST_UNSUPPORTED, "n_shared_experts %lld: the forward pass runs one shared expert",
			       (long long)cfg->n_shared_experts);
	struct planner P = {.cfg = cfg, .fmts = fmts, .opt = opt, .p = out};
	if (opt->disabled)
		P.dis = *opt->disabled;
	if (opt->dev)
		P.dev = *opt->dev;
	else
		kern_device_cpu(&P.dev);
	out->n_layers = (int)cfg->num_hidden_layers;
	out->n_mtp = opt->load_mtp && cfg->draft_kind == MODEL_DRAFT_MTP && cfg->n_draft_layers > 0 ? 1 : 0;
	out->n_dspark = opt->plan_dspark && cfg->draft_kind == MODEL_DRAFT_DSPARK ? cfg->n_draft_layers : 0;
	out->layers = calloc((size_t)(out->n_layers + out->n_mtp + out->n_dspark), sizeof *out->layers);
	enum status st = ST_OK;
	if (!out->layers) {
		st = err_set(e, ST_NOMEM, "kernel plan: %d layers", out->n_layers + out->n_mtp);
		goto fail;
	}
	for (int l = 0; l < out->n_layers + out->n_mtp + out->n_dspark; l++) {
		if ((st = plan_layer(&P, l, &out->layers[l], e)))
			goto fail;
		if (l == out->n_layers && out->n_dspark && (st = plan_dspark_main_proj(&P, l, &out->dspark_main_proj, e)))
			goto fail;
	}
	if ((st = plan_lin(&P, -1, "head", false, KERN_WFMT_BF16, cfg->vocab_size / ws, cfg->hidden_size, false,
			   &out->head, e)))
		goto fail;
	struct kern_moe_dispatch_shape dsh = {.n_experts = cfg->n_routed_experts / ws,
					      .top_k = (int)cfg->num_experts_per_tok,
					      .max_tokens = opt->max_step_tokens};
	for (int o = 0; o < MODEL_GOP_COUNT; o++) {
		struct kern_problem pr = {.wfmt = KERN_WFMT_NONE, .tp_size = ws,
					  .shape = o == MODEL_GOP_MOE_DISPATCH ? (const void *)&dsh : NULL};
		if ((st = select_variant(&P, global_ops[o], &pr, -1, &out->gop[o], e)) ||
		    (st = row_add(out, -1, global_ops[o], out->gop[o], e)))
			goto fail;
	}
	return ST_OK;
fail:
	model_plan_free(out);
	return st;
}

void model_plan_free(struct model_plan *p)
{
	if (!p)
		return;
	free(p->layers);
	kern_plan_free(&p->rows);
	memset(p, 0, sizeof *p);
}

struct plan_buf {
	char *buf;
	size_t n, len;
};

static void pb_add(struct plan_buf *b, const char *fmt, const char *x, const char *y)
{
	int k = snprintf(b->len < b->n ? b->buf + b->len : NULL, b->len < b->n ? b->n - b->len : 0, fmt, x, y);
	if (k > 0)
		b->len += (size_t)k;
}

/* " op[fmt]=variant" once per distinct (op, format, variant) of ls[0..n). */
static void pb_lins(struct plan_buf *b, const struct model_lin_plan *ls, int n)
{
	for (int i = 0; i < n; i++) {
		if (!ls[i].v)
			continue;
		bool seen = false;
		for (int j = 0; j < i; j++)
			seen |= ls[j].v == ls[i].v && ls[j].v_dec == ls[i].v_dec && ls[j].wfmt == ls[i].wfmt;
		if (seen)
			continue;
		char key[KERN_NAME_BYTES + 32];
		snprintf(key, sizeof key, "%s[%s]", ls[i].op->name, kern_wfmt_name(ls[i].wfmt));
		pb_add(b, " %s=%s", key, ls[i].v->name);
		if (ls[i].v_dec) {
			char lim[32];
			snprintf(lim, sizeof lim, "%lld", (long long)ls[i].dec_tokens);
			pb_add(b, "(<=%s tokens: %s)", lim, ls[i].v_dec->name);
		}
	}
}

size_t model_plan_str(const struct model_plan *p, char *buf, size_t n)
{
	struct plan_buf b = {.buf = buf, .n = n};
	if (n)
		buf[0] = 0;
	pb_add(&b, "%s%s:", "head", "");
	pb_lins(&b, &p->head, 1);
	pb_add(&b, "%s%s\n", "", "");
	for (int l = 0; l < p->n_layers + p->n_mtp + p->n_dspark; l++) {
		const struct model_layer_plan *ly = &p->layers[l];
		char lbl[64];
		snprintf(lbl, sizeof lbl, "layer %d (%s%s%s):", l, model_attn_kind_str(ly->kind),
			 ly->mtp ? ", MTP" : ly->dspark ? ", DSpark" : "", ly->hash ? ", hash-routed" : "");
		pb_add(&b, "%s%s", lbl, "");
		pb_lins(&b, ly->lin, MODEL_LIN_COUNT);
		for (int o = 0; o < MODEL_OP_COUNT; o++)
			if (ly->op[o])
				pb_add(&b, " %s=%s", layer_ops[o]->name, ly->op[o]->name);
		if (ly->moe_dec)
			pb_add(&b, " %s=%s", kern_op_moe_decode.name, ly->moe_dec->name);
		pb_add(&b, "%s%s\n", "", "");
	}
	return b.len;
}
