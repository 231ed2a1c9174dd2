/*
 * model/weights.c: the kernel plan of the forward pass and the per-layer
 * weights that follow it (model/weights.h).
 *
 * The plan (model_plan_build) is the one place where kernels are selected:
 * from the config, the stored format of each weight group and the shapes
 * this rank runs, kern_select picks a variant for every linear site, the
 * routed experts' GEMMs, the weight-free ops of each layer and the head. It
 * needs no tensor, so `dsv4 kernels` plans a real config.json for any
 * simulated device. model_weights_load derives the formats from the
 * checkpoint, builds the plan, and then only views the tensors and runs the
 * chosen variants' prepare(): the checkpoint reader already checked names,
 * dtypes and shapes, so a loader failure after planning is a tensor the
 * plan and the schema disagree on (a bug) or a TP shard the stored blocks
 * cannot express.
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
	return row_add(P->p, layer, op, v, e);
}

/* moe-decode: the fused routed-expert pass of small steps (op moe_decode), where a GPU variant takes
 * the layer's experts as the expert GEMMs' variants hold them (no prepare); otherwise, and on the CPU,
 * none: the unfused ops run every step. */
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
			seen |= ls[j].v == ls[i].v && ls[j].wfmt == ls[i].wfmt;
		if (seen)
			continue;
		char key[KERN_NAME_BYTES + 32];
		snprintf(key, sizeof key, "%s[%s]", ls[i].op->name, kern_wfmt_name(ls[i].wfmt));
		pb_add(b, " %s=%s", key, ls[i].v->name);
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
		if (ly->moe_dec) /* moe-decode */
			pb_add(&b, " %s=%s", kern_op_moe_decode.name, ly->moe_dec->name);
		pb_add(&b, "%s%s\n", "", "");
	}
	return b.len;
}

/* ---- the weights ---- */

struct loader {
	struct model_weights *w;
	const struct model_weights_options *opt;
	const struct model_checkpoint *ck;
};

static enum status own(struct model_weights *w, void *p, struct err *e)
{
	if (w->n_owned == w->cap_owned) {
		int cap = w->cap_owned ? 2 * w->cap_owned : 64;
		void **n = realloc(w->owned, (size_t)cap * sizeof *n);
		if (!n) {
			free(p);
			return err_set(e, ST_NOMEM, "weights: owned list");
		}
		w->owned = n;
		w->cap_owned = cap;
	}
	w->owned[w->n_owned++] = p;
	return ST_OK;
}

/* A plain tensor's data, checked for dtype and element count; copied when
 * the file leaves it misaligned for its element type. */
static enum status plain(struct loader *L, const char *name, enum model_dtype dt, uint64_t n_elems,
			 const void **out, struct err *e)
{
	const struct model_tensor *t = model_checkpoint_tensor(L->ck, name);
	if (!t)
		return err_set(e, ST_NOTFOUND, "weights: tensor %s missing", name);
	if (t->dtype != dt || t->n_elements != n_elems)
		return err_set(e, ST_INVALID, "weights: tensor %s: dtype %s, %llu elements (want %s, %llu)", name,
			       model_dtype_str(t->dtype), (unsigned long long)t->n_elements, model_dtype_str(dt),
			       (unsigned long long)n_elems);
	size_t al = model_dtype_bytes(dt);
	if ((uintptr_t)t->data % al) {
		void *p = malloc(t->n_bytes);
		if (!p)
			return err_set(e, ST_NOMEM, "weights: copy of %s", name);
		memcpy(p, t->data, t->n_bytes);
		enum status st = own(L->w, p, e);
		if (st)
			return st;
		*out = p;
		return ST_OK;
	}
	*out = t->data;
	return ST_OK;
}

#define PLAIN(L, name, dt, n, ptr) plain((L), (name), (dt), (n), (const void **)(ptr), e)

/* The view of a stored linear in its own format. */
static enum status wmat_of(struct loader *L, const char *prefix, struct kern_wmat *m, struct err *e)
{
	struct model_linear l;
	memset(m, 0, sizeof *m);
	enum status st = model_checkpoint_linear(L->ck, prefix, &l, NULL);
	if (st == ST_NOTFOUND) {
		/* a plain bf16/f32 matrix (head, gate, compressor, weights_proj) */
		char name[192];
		if (snprintf(name, sizeof name, "%s.weight", prefix) >= (int)sizeof name) /* release -Werror */
			return err_set(e, ST_NOTFOUND, "weights: tensor name %.100s... too long", prefix);
		const struct model_tensor *t = model_checkpoint_tensor(L->ck, name);
		if (!t || t->n_dims != 2 || (t->dtype != MODEL_DTYPE_BF16 && t->dtype != MODEL_DTYPE_F32))
			return err_set(e, ST_NOTFOUND, "weights: no matrix %s", name);
		m->fmt = t->dtype == MODEL_DTYPE_BF16 ? KERN_WFMT_BF16 : KERN_WFMT_F32;
		m->rows = t->shape[0];
		m->cols = t->shape[1];
		m->global_scale = 1.0f;
		if ((st = plain(L, name, t->dtype, t->n_elements, &m->data, e)))
			return st;
		return kern_wmat_validate(m, prefix, e);
	}
	if (st)
		return model_checkpoint_linear(L->ck, prefix, &l, e);
	m->rows = l.out;
	m->cols = l.in;
	m->data = l.weight->data;
	m->global_scale = 1.0f;
	const struct model_config *cfg = model_checkpoint_config(L->ck);
	switch (l.format) {
	case MODEL_FMT_BF16:
		m->fmt = KERN_WFMT_BF16;
		break;
	case MODEL_FMT_F32:
		m->fmt = KERN_WFMT_F32;
		break;
	case MODEL_FMT_FP8_BLOCK:
		if (cfg->quant.present && (cfg->quant.weight_block_size[0] != 128 || cfg->quant.weight_block_size[1] != 128))
			return err_set(e, ST_UNSUPPORTED, "%s: FP8 block size %lldx%lld (only 128x128)", prefix,
				       (long long)cfg->quant.weight_block_size[0], (long long)cfg->quant.weight_block_size[1]);
		m->fmt = l.scale->dtype == MODEL_DTYPE_F32 ? KERN_WFMT_FP8_F32_B128 : KERN_WFMT_FP8_E8M0_B128;
		m->scale = l.scale->data;
		break;
	case MODEL_FMT_MXFP4:
		m->fmt = KERN_WFMT_MXFP4;
		m->scale = l.scale->data;
		break;
	case MODEL_FMT_NVFP4:
		m->fmt = KERN_WFMT_NVFP4;
		m->scale = l.scale->data;
		memcpy(&m->global_scale, l.scale_2->data, sizeof(float));
		break;
	default:
		return err_set(e, ST_UNSUPPORTED, "%s: weight format %s", prefix, model_weight_format_str(l.format));
	}
	return kern_wmat_validate(m, prefix, e);
}

/* The chosen variant's layout of the stored (possibly sharded) weight m of
 * plan site pl, whose format and local shape must be what the plan was made
 * for (both come from the schema, so a mismatch is a bug, named here). */
static enum status lin_setup(const struct model_lin_plan *pl, const char *name, struct kern_wmat *m,
			     struct model_lin *out, struct err *e)
{
	if (!pl->v)
		return err_set(e, ST_INVALID, "%s: not in the kernel plan", name);
	if (m->fmt != pl->wfmt || m->rows != pl->out || m->cols != pl->in)
		return err_set(e, ST_INVALID, "%s: stored %s [%lld, %lld], but the plan is for %s [%lld, %lld]", name,
			       kern_wfmt_name(m->fmt), (long long)m->rows, (long long)m->cols, kern_wfmt_name(pl->wfmt),
			       (long long)pl->out, (long long)pl->in);
	memset(out, 0, sizeof *out);
	enum status st = kern_prepare_weight(pl->v, m, &out->w, e);
	if (st)
		return err_prefix(e, "%s", name);
	out->v = pl->v;
	out->run = (kern_linear_fn)pl->v->run;
	out->act_quant_block = pl->act_quant_block;
	return ST_OK;
}

/* A whole stored matrix of site s of layer ly (no shard). */
static enum status lin(struct loader *L, const struct model_layer_plan *ly, const char *lp, enum model_lin_site s,
		       struct model_lin *out, struct err *e)
{
	char name[192];
	snprintf(name, sizeof name, "%s.%s", lp, model_lin_site_name(s));
	struct kern_wmat m;
	enum status st = wmat_of(L, name, &m, e);
	return st ? st : lin_setup(&ly->lin[s], name, &m, out, e);
}

/* Rows [r0, r0+n) of m as a view. Valid when the rows' scale blocks are
 * addressable from the view: any range for unscaled and per-row-scaled
 * (FP4) formats; for FP8 128-row blocks, an aligned start or a range inside
 * one block (then every view row maps to that block's scale row). */
static enum status rows_view(const struct kern_wmat *m, int64_t r0, int64_t n, struct kern_wmat *out, struct err *e)
{
	*out = *m;
	out->owned = NULL;
	out->rows = n;
	size_t row_bytes;
	switch (m->fmt) {
	case KERN_WFMT_F32:
		row_bytes = (size_t)m->cols * 4;
		break;
	case KERN_WFMT_BF16:
		row_bytes = (size_t)m->cols * 2;
		break;
	case KERN_WFMT_FP8_E8M0_B128:
	case KERN_WFMT_FP8_F32_B128: {
		if (r0 % 128 && r0 / 128 != (r0 + n - 1) / 128)
			return err_set(e, ST_UNSUPPORTED, "row range [%lld, %lld) crosses an FP8 scale block unaligned",
				       (long long)r0, (long long)(r0 + n));
		row_bytes = (size_t)m->cols;
		size_t sc = (size_t)((m->cols + 127) / 128) * (m->fmt == KERN_WFMT_FP8_F32_B128 ? 4 : 1);
		out->scale = (const uint8_t *)m->scale + (size_t)(r0 / 128) * sc;
		break;
	}
	case KERN_WFMT_MXFP4:
		row_bytes = (size_t)m->cols / 2;
		out->scale = (const uint8_t *)m->scale + (size_t)r0 * (size_t)(m->cols / 32);
		break;
	case KERN_WFMT_NVFP4:
		row_bytes = (size_t)m->cols / 2;
		out->scale = (const uint8_t *)m->scale + (size_t)r0 * (size_t)(m->cols / 16);
		break;
	default:
		return err_set(e, ST_INVALID, "rows view of format %s", kern_wfmt_name(m->fmt));
	}
	out->data = (const uint8_t *)m->data + (size_t)r0 * row_bytes;
	return ST_OK;
}

/* Columns [c0, c0+n) of m into a matrix owned by out (the wo_b shard of a
 * rank). FP8 needs c0 on a 128 boundary or the range inside one 128-column
 * block: new scale column j is then old column c0/128 + j, exactly. */
static enum status cols_copy(const struct kern_wmat *m, int64_t c0, int64_t n, struct kern_wmat *out, struct err *e)
{
	memset(out, 0, sizeof *out);
	*out = *m;
	out->owned = NULL;
	out->cols = n;
	size_t el;
	bool fp8 = m->fmt == KERN_WFMT_FP8_E8M0_B128 || m->fmt == KERN_WFMT_FP8_F32_B128;
	if (m->fmt == KERN_WFMT_F32)
		el = 4;
	else if (m->fmt == KERN_WFMT_BF16)
		el = 2;
	else if (fp8)
		el = 1;
	else
		return err_set(e, ST_UNSUPPORTED, "column shard of format %s", kern_wfmt_name(m->fmt));
	if (fp8 && c0 % 128 && c0 / 128 != (c0 + n - 1) / 128)
		return err_set(e, ST_UNSUPPORTED, "column range [%lld, %lld) crosses an FP8 scale block unaligned",
			       (long long)c0, (long long)(c0 + n));
	int64_t sc_old = (m->cols + 127) / 128, sc_new = (n + 127) / 128, srows = (m->rows + 127) / 128;
	size_t sel = m->fmt == KERN_WFMT_FP8_F32_B128 ? 4 : 1;
	size_t data_bytes = (size_t)(m->rows * n) * el, scale_bytes = fp8 ? (size_t)(srows * sc_new) * sel : 0;
	uint8_t *buf = malloc(data_bytes + scale_bytes + 1);
	if (!buf)
		return err_set(e, ST_NOMEM, "column shard");
	for (int64_t r = 0; r < m->rows; r++)
		memcpy(buf + (size_t)r * n * el, (const uint8_t *)m->data + ((size_t)r * m->cols + c0) * el, (size_t)n * el);
	if (fp8)
		for (int64_t r = 0; r < srows; r++)
			memcpy(buf + data_bytes + (size_t)(r * sc_new) * sel,
			       (const uint8_t *)m->scale + ((size_t)(r * sc_old) + (size_t)(c0 / 128)) * sel,
			       (size_t)sc_new * sel);
	out->data = buf;
	out->scale = fp8 ? buf + data_bytes : NULL;
	out->owned = buf;
	return ST_OK;
}

static enum status experts_setup(struct loader *L, const struct model_layer_plan *pl, const char *lp,
				 struct model_experts *x, struct err *e)
{
	int layer = pl->layer;
	int64_t E = L->w->n_experts_local, e0 = L->w->expert_begin;
	x->w1 = calloc((size_t)E * 3, sizeof *x->w1);
	if (!x->w1)
		return err_set(e, ST_NOMEM, "experts of layer %d", layer);
	x->w3 = x->w1 + E;
	x->w2 = x->w3 + E;
	const struct model_lin_plan *p13 = &pl->lin[MODEL_LIN_EXP_W13], *p2 = &pl->lin[MODEL_LIN_EXP_W2];
	char name[160];
	enum status st;
	for (int a = 0; a < 3; a++) {
		struct kern_wmat *arr = a == 0 ? x->w1 : a == 1 ? x->w3 : x->w2;
		const struct model_lin_plan *p = a == 2 ? p2 : p13;
		for (int64_t k = 0; k < E; k++) {
			snprintf(name, sizeof name, "%s.ffn.experts.%lld.w%d", lp, (long long)(e0 + k), a == 0 ? 1 : a == 1 ? 3 : 2);
			struct kern_wmat raw;
			if ((st = wmat_of(L, name, &raw, e)))
				return st;
			if (raw.fmt != p->wfmt || raw.rows != p->out || raw.cols != p->in)
				return err_set(e, ST_INVALID, "%s: stored %s [%lld, %lld], but the plan is for %s [%lld, %lld]",
					       name, kern_wfmt_name(raw.fmt), (long long)raw.rows, (long long)raw.cols,
					       kern_wfmt_name(p->wfmt), (long long)p->out, (long long)p->in);
			/* the layout the chosen variant consumes (a view when it has no prepare) */
			if ((st = kern_prepare_weight(p->v, &raw, &arr[k], e)))
				return err_prefix(e, "%s", name);
		}
	}
	x->act_quant_block = p13->act_quant_block;
	x->v13 = p13->v;
	x->run13 = (kern_moe_gemm_fn)p13->v->run;
	x->v2 = p2->v;
	x->run2 = (kern_moe_gemm_fn)p2->v->run;
	x->vdec = pl->moe_dec; /* moe-decode */
	x->run_dec = pl->moe_dec ? (kern_moe_decode_fn)pl->moe_dec->run : NULL;
	return ST_OK;
}

static enum status hc_site(struct loader *L, const char *prefix, int n_out, int n_scale, struct model_hc *hc,
			   struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	char name[160];
	enum status st;
	snprintf(name, sizeof name, "%s_fn", prefix);
	if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)n_out * cfg->hc_mult * cfg->hidden_size, &hc->fn)))
		return st;
	snprintf(name, sizeof name, "%s_base", prefix);
	if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)n_out, &hc->base)))
		return st;
	snprintf(name, sizeof name, "%s_scale", prefix);
	return PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)n_scale, &hc->scale);
}

static enum status layer_load(struct loader *L, const struct model_layer_plan *pl, struct model_layer *ly,
			      struct err *e)
{
	int layer = pl->layer;
	const struct model_config *cfg = L->w->cfg;
	enum status st;
	char lp[64], name[192];
	model_schema_layer_prefix(cfg, layer, lp, sizeof lp);
	int64_t D = cfg->hidden_size, n = cfg->hc_mult, H = cfg->num_attention_heads, d = cfg->head_dim;
	int r = (int)cfg->qk_rope_head_dim;
	ly->layer = layer;
	ly->kind = model_config_attn_kind(cfg, layer);
	ly->ratio = cfg->compress_ratios[layer];
	ly->hash = model_config_is_hash_layer(cfg, layer);
	ly->mtp = model_config_is_mtp_layer(cfg, layer);

	/* the weight-free ops' run pointers */
	const struct kern_variant *const *o = pl->op;
#define OP(idx, field)                                                                              \
	ly->ops.field = o[idx] ? (__typeof__(ly->ops.field))o[idx]->run : NULL
	OP(MODEL_OP_RMSNORM, rmsnorm);
	OP(MODEL_OP_ROPE, rope);
	OP(MODEL_OP_HC_PRENORM, hc_prenorm);
	OP(MODEL_OP_HC_SPLIT, hc_split);
	OP(MODEL_OP_HC_PRE_COMBINE, hc_pre_combine);
	OP(MODEL_OP_HC_POST, hc_post);
	OP(MODEL_OP_ATTN_INDEX, attn_index);
	OP(MODEL_OP_SPARSE_ATTN, sparse_attn);
	OP(MODEL_OP_COMPRESSOR, compressor);
	OP(MODEL_OP_INDEXER_ROTATE, indexer_rotate);
	OP(MODEL_OP_INDEXER_TOPK, indexer_topk);
	OP(MODEL_OP_ROUTE, route);
	OP(MODEL_OP_SWIGLU, swiglu);
#undef OP

	snprintf(name, sizeof name, "%s.attn_norm.weight", lp);
	if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)D, &ly->attn_norm)))
		return st;
	snprintf(name, sizeof name, "%s.ffn_norm.weight", lp);
	if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)D, &ly->ffn_norm)))
		return st;
	snprintf(name, sizeof name, "%s.hc_attn", lp);
	if ((st = hc_site(L, name, (int)((2 + n) * n), 3, &ly->hc_attn, e)))
		return st;
	snprintf(name, sizeof name, "%s.hc_ffn", lp);
	if ((st = hc_site(L, name, (int)((2 + n) * n), 3, &ly->hc_ffn, e)))
		return st;

	/* attention */
#define LIN(site, field)                                                                          \
	do {                                                                                      \
		if ((st = lin(L, pl, lp, site, &ly->field, e)))                                   \
			return st;                                                                \
	} while (0)
	LIN(MODEL_LIN_WQ_A, wq_a);
	LIN(MODEL_LIN_WKV, wkv);
	int64_t HL = L->w->n_heads_local, GL = L->w->n_groups_local, R = cfg->o_lora_rank;
	{
		/* this rank's heads of wq_b (a row view) and its o_groups' columns of wo_b (a copy) */
		struct kern_wmat full, part;
		snprintf(name, sizeof name, "%s.attn.wq_b", lp);
		if ((st = wmat_of(L, name, &full, e)))
			return st;
		if ((st = rows_view(&full, L->w->rank * HL * d, HL * d, &part, e)))
			return err_prefix(e, "%s", name);
		if ((st = lin_setup(&pl->lin[MODEL_LIN_WQ_B], name, &part, &ly->wq_b, e)))
			return st;
		snprintf(name, sizeof name, "%s.attn.wo_b", lp);
		if ((st = wmat_of(L, name, &full, e)))
			return st;
		if (L->w->world_size == 1) {
			part = full;
		} else {
			if ((st = cols_copy(&full, L->w->rank * GL * R, GL * R, &part, e)))
				return err_prefix(e, "%s", name);
			/* the weights own the shard (a prepared view may alias it) */
			if ((st = own(L->w, part.owned, e)))
				return st;
			part.owned = NULL;
		}
		if ((st = lin_setup(&pl->lin[MODEL_LIN_WO_B], name, &part, &ly->wo_b, e)))
			return st;
	}
	{
		struct kern_wmat woa;
		snprintf(name, sizeof name, "%s.attn.wo_a", lp);
		if ((st = wmat_of(L, name, &woa, e)))
			return st;
		if (GL > MODEL_MAX_O_GROUPS)
			return err_set(e, ST_UNSUPPORTED, "o_groups %lld > %d", (long long)GL, MODEL_MAX_O_GROUPS);
		for (int64_t g = 0; g < GL; g++) {
			struct kern_wmat gv;
			if ((st = rows_view(&woa, (L->w->rank * GL + g) * R, R, &gv, e)))
				return err_prefix(e, "%s group %lld", name, (long long)g);
			if ((st = lin_setup(&pl->lin[MODEL_LIN_WO_A], name, &gv, &ly->wo_a[g], e)))
				return st;
		}
	}
	snprintf(name, sizeof name, "%s.attn.q_norm.weight", lp);
	if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)cfg->q_lora_rank, &ly->q_norm)))
		return st;
	snprintf(name, sizeof name, "%s.attn.kv_norm.weight", lp);
	if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)d, &ly->kv_norm)))
		return st;
	snprintf(name, sizeof name, "%s.attn.attn_sink", lp);
	if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)H, &ly->attn_sink)))
		return st;
	ly->attn_sink += L->w->rank * HL;
	ly->omega = calloc((size_t)r / 2 + 1, sizeof(float));
	if (!ly->omega)
		return err_set(e, ST_NOMEM, "rope table");
	if (ly->ratio) {
		struct kern_rope_yarn y = {.factor = cfg->rope_scaling.factor,
					   .original_max_pos = (double)cfg->rope_scaling.original_max_position_embeddings,
					   .beta_fast = cfg->rope_scaling.beta_fast, .beta_slow = cfg->rope_scaling.beta_slow};
		bool yarn = cfg->rope_scaling.type == MODEL_ROPE_SCALING_YARN;
		st = kern_rope_freqs_build(ly->omega, r, cfg->compress_rope_theta, yarn ? &y : NULL);
	} else {
		st = kern_rope_freqs_build(ly->omega, r, cfg->rope_theta, NULL);
	}
	if (st)
		return err_set(e, st, "layer %d: rope table", layer);

	if (ly->ratio) {
		int c = ly->kind == MODEL_ATTN_CSA ? 2 : 1;
		LIN(MODEL_LIN_CMP_WKV, cmp_wkv);
		LIN(MODEL_LIN_CMP_WGATE, cmp_wgate);
		snprintf(name, sizeof name, "%s.attn.compressor.ape", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)ly->ratio * c * d, &ly->cmp_ape)))
			return st;
		snprintf(name, sizeof name, "%s.attn.compressor.norm.weight", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)d, &ly->cmp_norm)))
			return st;
	}
	if (ly->kind == MODEL_ATTN_CSA) {
		int64_t id = cfg->index_head_dim;
		LIN(MODEL_LIN_IDX_WQ_B, idx_wq_b);
		LIN(MODEL_LIN_IDX_WPROJ, idx_wproj);
		LIN(MODEL_LIN_IDX_CMP_WKV, idx_cmp_wkv);
		LIN(MODEL_LIN_IDX_CMP_WGATE, idx_cmp_wgate);
		snprintf(name, sizeof name, "%s.attn.indexer.compressor.ape", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)ly->ratio * 2 * id, &ly->idx_cmp_ape)))
			return st;
		snprintf(name, sizeof name, "%s.attn.indexer.compressor.norm.weight", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)id, &ly->idx_cmp_norm)))
			return st;
	}

	/* MoE */
	LIN(MODEL_LIN_GATE, gate);
	int64_t E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
	if (ly->hash) {
		const int64_t *t64;
		snprintf(name, sizeof name, "%s.ffn.gate.tid2eid", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_I64, (uint64_t)(cfg->vocab_size * K), &t64)))
			return st;
		ly->tid2eid = malloc((size_t)(cfg->vocab_size * K) * sizeof(int32_t));
		if (!ly->tid2eid)
			return err_set(e, ST_NOMEM, "tid2eid of layer %d", layer);
		for (int64_t i = 0; i < cfg->vocab_size * K; i++) {
			if (t64[i] < 0 || t64[i] >= E)
				return err_set(e, ST_INVALID, "%s: entry %lld is expert %lld of %lld", name, (long long)i,
					       (long long)t64[i], (long long)E);
			ly->tid2eid[i] = (int32_t)t64[i];
		}
	} else {
		snprintf(name, sizeof name, "%s.ffn.gate.bias", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)E, &ly->gate_bias)))
			return st;
	}
	if ((st = experts_setup(L, pl, lp, &ly->experts, e)))
		return st;
	{
		/* the shared expert's intermediate dim split: w1/w3 rows, w2 columns */
		int64_t IS = cfg->moe_intermediate_size * (cfg->n_shared_experts > 0 ? cfg->n_shared_experts : 1);
		int64_t IL = IS / L->w->world_size, i0 = L->w->rank * IL;
		struct kern_wmat full, part;
		const char *wn[2] = {"w1", "w3"};
		struct model_lin *dst[2] = {&ly->sh_w1, &ly->sh_w3};
		const struct model_lin_plan *sp[2] = {&pl->lin[MODEL_LIN_SH_W1], &pl->lin[MODEL_LIN_SH_W3]};
		for (int k = 0; k < 2; k++) {
			snprintf(name, sizeof name, "%s.ffn.shared_experts.%s", lp, wn[k]);
			if ((st = wmat_of(L, name, &full, e)))
				return st;
			if ((st = rows_view(&full, i0, IL, &part, e)))
				return err_prefix(e, "%s", name);
			if ((st = lin_setup(sp[k], name, &part, dst[k], e)))
				return st;
		}
		snprintf(name, sizeof name, "%s.ffn.shared_experts.w2", lp);
		if ((st = wmat_of(L, name, &full, e)))
			return st;
		if (L->w->world_size == 1) {
			part = full;
		} else {
			if ((st = cols_copy(&full, i0, IL, &part, e)))
				return err_prefix(e, "%s", name);
			if ((st = own(L->w, part.owned, e)))
				return st;
			part.owned = NULL;
		}
		if ((st = lin_setup(&pl->lin[MODEL_LIN_SH_W2], name, &part, &ly->sh_w2, e)))
			return st;
	}

	if (ly->mtp) {
		LIN(MODEL_LIN_E_PROJ, e_proj);
		LIN(MODEL_LIN_H_PROJ, h_proj);
		snprintf(name, sizeof name, "%s.enorm.weight", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)D, &ly->enorm)))
			return st;
		snprintf(name, sizeof name, "%s.hnorm.weight", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)D, &ly->hnorm)))
			return st;
		snprintf(name, sizeof name, "%s.norm.weight", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)D, &ly->mtp_norm)))
			return st;
		snprintf(name, sizeof name, "%s.hc_head", lp);
		if ((st = hc_site(L, name, (int)n, 1, &ly->mtp_hc_head, e)))
			return st;
	}
#undef LIN
	return ST_OK;
}

enum status model_weights_load(struct model_weights *w, const struct model_weights_options *opt, struct err *e)
{
	memset(w, 0, sizeof *w);
	kern_plan_init(&w->plan);
	struct loader L = {.w = w, .opt = opt, .ck = opt->ck};
	const struct model_config *cfg = model_checkpoint_config(opt->ck);
	w->cfg = cfg;
	int ws = opt->world_size;
	if (ws < 1 || opt->rank < 0 || opt->rank >= ws)
		return err_set(e, ST_INVALID, "rank %d of world size %d", opt->rank, ws);
	/* step 1: the kernels, from the formats the checkpoint holds */
	struct model_layer_formats *fmts = calloc((size_t)cfg->n_layers_total, sizeof *fmts);
	if (!fmts)
		return err_set(e, ST_NOMEM, "weights: formats");
	model_formats_from_checkpoint(opt->ck, fmts);
	struct model_plan_options po = {.dev = opt->dev, .disabled = opt->disabled,
					.max_step_tokens = opt->max_step_tokens, .quant_sim = opt->quant_sim,
					.load_mtp = opt->load_mtp, .world_size = ws, .selfcheck = opt->selfcheck};
	enum status st = model_plan_build(cfg, fmts, &po, &w->kernels, e);
	free(fmts);
	if (st)
		return st;
	w->plan = w->kernels.rows; /* the rows move to the weights */
	kern_plan_init(&w->kernels.rows);

	/* step 2: views of every tensor, in the chosen variants' layouts */
	w->rank = opt->rank;
	w->world_size = ws;
	w->n_heads_local = cfg->num_attention_heads / ws;
	w->n_groups_local = cfg->o_groups / ws;
	w->n_experts_local = cfg->n_routed_experts / ws;
	w->expert_begin = opt->rank * w->n_experts_local;
	w->vocab_local = cfg->vocab_size / ws;
	w->vocab_begin = opt->rank * w->vocab_local;
	w->n_layers = w->kernels.n_layers;
	w->n_mtp = w->kernels.n_mtp;
	w->layers = calloc((size_t)(w->n_layers + w->n_mtp), sizeof *w->layers);
	if (!w->layers) {
		st = err_set(e, ST_NOMEM, "layers");
		goto fail;
	}
	int64_t D = cfg->hidden_size, V = cfg->vocab_size;
	struct kern_wmat hm, hv;
	if ((st = PLAIN(&L, "embed.weight", MODEL_DTYPE_BF16, (uint64_t)(V * D), &w->embed)) ||
	    (st = PLAIN(&L, "norm.weight", MODEL_DTYPE_BF16, (uint64_t)D, &w->norm)) ||
	    (st = hc_site(&L, "hc_head", (int)cfg->hc_mult, 1, &w->hc_head, e)) ||
	    (st = wmat_of(&L, "head", &hm, e)) ||
	    (st = rows_view(&hm, w->vocab_begin, w->vocab_local, &hv, e)) ||
	    (st = lin_setup(&w->kernels.head, "head", &hv, &w->head, e))) {
		err_prefix(e, "global tensors (embed, norm, hc_head, head)");
		goto fail;
	}
	w->embed += w->vocab_begin * D; /* vocab-parallel: this rank's rows */
	{
		const struct kern_variant *const *g = w->kernels.gop;
#define GOP(idx, field) w->gops.field = (__typeof__(w->gops.field))g[idx]->run
		GOP(MODEL_GOP_EMBED, embed);
		GOP(MODEL_GOP_COPY_ROWS, copy_rows);
		GOP(MODEL_GOP_BLOCK_COPY, block_copy);
		GOP(MODEL_GOP_BLOCK_FILL, block_fill);
		GOP(MODEL_GOP_ROUND_BF16, round_bf16);
		GOP(MODEL_GOP_ADD, add);
		GOP(MODEL_GOP_ACT_QUANT_SIM, act_quant_sim);
		GOP(MODEL_GOP_RING_WRITE, ring_write);
		GOP(MODEL_GOP_MOE_DISPATCH, moe_dispatch);
		GOP(MODEL_GOP_MOE_ROW_WEIGHT, moe_row_weight);
		GOP(MODEL_GOP_MOE_COMBINE, moe_combine);
		GOP(MODEL_GOP_SAMPLE, sample);
		GOP(MODEL_GOP_TOKEN_LOGPROBS, token_logprobs);
#undef GOP
	}
	for (int l = 0; l < w->n_layers + w->n_mtp; l++)
		if ((st = layer_load(&L, &w->kernels.layers[l], &w->layers[l], e))) {
			err_prefix(e, "layer %d", l);
			goto fail;
		}
	return ST_OK;
fail:
	model_weights_free(w);
	return st;
}

static void lin_free(struct model_lin *l)
{
	kern_wmat_release(&l->w);
}

void model_weights_free(struct model_weights *w)
{
	if (!w)
		return;
	for (int l = 0; w->layers && l < w->n_layers + w->n_mtp; l++) {
		struct model_layer *ly = &w->layers[l];
		struct model_lin *ls[] = {&ly->wq_a, &ly->wq_b, &ly->wkv, &ly->wo_b, &ly->cmp_wkv, &ly->cmp_wgate,
					  &ly->idx_wq_b, &ly->idx_wproj, &ly->idx_cmp_wkv, &ly->idx_cmp_wgate,
					  &ly->gate, &ly->sh_w1, &ly->sh_w3, &ly->sh_w2, &ly->e_proj, &ly->h_proj};
		for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
			lin_free(ls[i]);
		for (int g = 0; g < MODEL_MAX_O_GROUPS; g++)
			lin_free(&ly->wo_a[g]);
		if (!w->on_device) { /* else they are device copies in dev_owned */
			free(ly->omega);
			free(ly->tid2eid);
		}
		for (int64_t k = 0; ly->experts.w1 && k < 3 * w->n_experts_local; k++)
			kern_wmat_release(&ly->experts.w1[k]);
		free(ly->experts.w1);
	}
	free(w->layers);
	lin_free(&w->head);
	for (int i = 0; i < w->n_owned; i++)
		free(w->owned[i]);
	free(w->owned);
	for (int i = 0; i < w->n_dev_owned; i++)
		kern_mem_free(&w->mem, w->dev_owned[i]);
	free(w->dev_owned);
	kern_plan_free(&w->plan);
	model_plan_free(&w->kernels);
	memset(w, 0, sizeof *w);
}

size_t model_weights_plan_str(const struct model_weights *w, char *buf, size_t n)
{
	return model_plan_str(&w->kernels, buf, n);
}

size_t model_weights_linear_workspace_bytes(const struct model_weights *w, int64_t max_tokens)
{
	size_t mx = 0;
	const struct model_plan *p = &w->kernels;
	for (int l = -1; l < p->n_layers + p->n_mtp; l++)
		for (int s = 0; s < MODEL_LIN_COUNT; s++) {
			const struct model_lin_plan *pl = l < 0 ? (s ? NULL : &p->head) : &p->layers[l].lin[s];
			if (!pl || !pl->v || pl->op != &kern_op_linear)
				continue;
			size_t b = kern_linear_workspace_bytes(pl->v, max_tokens, pl->in);
			if (b > mx)
				mx = b;
		}
	return mx;
}
