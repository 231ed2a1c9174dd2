/*
 * model/weights.c: builds the per-layer plan (model/weights.h) from a
 * validated checkpoint: views of every tensor, the GEMM variants chosen by
 * kern_select for each weight's format and shape, and the weight-free ops'
 * variants. The checkpoint reader already checked names, dtypes and shapes,
 * so failures here are "no variant fits" or a tensor the schema does not
 * require but the forward pass does (which would be a schema bug).
 */
#include "model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

struct loader {
	struct model_weights *w;
	const struct model_weights_options *opt;
	const struct model_checkpoint *ck;
	struct kern_device dev;
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
		snprintf(name, sizeof name, "%s.weight", prefix);
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

static enum status plan_add(struct loader *L, int layer, const struct kern_op *op, const struct kern_variant *v,
			    struct err *e)
{
	return kern_plan_add(&L->w->plan, layer, op, v, e);
}

/* Select and prepare a linear of the stored weight m (owned views are
 * released by model_weights_free through the layer walk). */
static enum status lin_setup(struct loader *L, int layer, struct kern_wmat *m, bool allow_aq, struct model_lin *out,
			     struct err *e)
{
	bool quantized = m->fmt == KERN_WFMT_FP8_E8M0_B128 || m->fmt == KERN_WFMT_FP8_F32_B128 ||
			 m->fmt == KERN_WFMT_MXFP4 || m->fmt == KERN_WFMT_NVFP4;
	int aq = allow_aq && quantized && L->opt->quant_sim ? 128 : 0;
	struct kern_linear_shape sh = {.in = m->cols, .out = m->rows, .max_tokens = L->opt->max_step_tokens,
				       .act_quant_block = aq, .x_dtype = KERN_DT_F32, .y_dtype = KERN_DT_F32};
	struct kern_problem p = {.wfmt = m->fmt, .tp_size = L->opt->world_size, .shape = &sh};
	const struct kern_variant *v;
	enum status st = kern_select(&kern_op_linear, &p, &L->dev, L->opt->disabled, layer, &v, e);
	if (st)
		return st;
	memset(out, 0, sizeof *out);
	st = kern_prepare_weight(v, m, &out->w, e);
	if (st)
		return st;
	out->v = v;
	out->run = (kern_linear_fn)v->run;
	out->act_quant_block = aq;
	return plan_add(L, layer, &kern_op_linear, v, e);
}

static enum status lin(struct loader *L, int layer, const char *prefix, bool allow_aq, struct model_lin *out,
		       struct err *e)
{
	struct kern_wmat m;
	enum status st = wmat_of(L, prefix, &m, e);
	return st ? st : lin_setup(L, layer, &m, allow_aq, out, e);
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

static enum status experts_setup(struct loader *L, int layer, const char *lp, struct model_experts *x, struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	int64_t E = L->w->n_experts_local, e0 = L->w->expert_begin;
	x->w1 = calloc((size_t)E * 3, sizeof *x->w1);
	if (!x->w1)
		return err_set(e, ST_NOMEM, "experts of layer %d", layer);
	x->w3 = x->w1 + E;
	x->w2 = x->w3 + E;
	char name[160];
	enum status st;
	for (int64_t k = 0; k < E; k++) {
		snprintf(name, sizeof name, "%s.ffn.experts.%lld.w1", lp, (long long)(e0 + k));
		if ((st = wmat_of(L, name, &x->w1[k], e)))
			return st;
		snprintf(name, sizeof name, "%s.ffn.experts.%lld.w3", lp, (long long)(e0 + k));
		if ((st = wmat_of(L, name, &x->w3[k], e)))
			return st;
		snprintf(name, sizeof name, "%s.ffn.experts.%lld.w2", lp, (long long)(e0 + k));
		if ((st = wmat_of(L, name, &x->w2[k], e)))
			return st;
	}
	enum kern_wfmt f = x->w1[0].fmt;
	bool quantized = f != KERN_WFMT_BF16 && f != KERN_WFMT_F32;
	x->act_quant_block = quantized && L->opt->quant_sim ? 128 : 0;
	for (int pass = 0; pass < 2; pass++) {
		struct kern_wmat *w = pass ? x->w2 : x->w1;
		struct kern_moe_gemm_shape sh = {.in = w[0].cols, .out = w[0].rows, .n_experts = E,
						 .max_rows = L->opt->max_step_tokens * cfg->num_experts_per_tok,
						 .act_quant_block = x->act_quant_block, .x_dtype = KERN_DT_F32,
						 .y_dtype = KERN_DT_F32};
		struct kern_problem p = {.wfmt = w[0].fmt, .tp_size = L->opt->world_size, .shape = &sh};
		const struct kern_variant *v;
		if ((st = kern_select(&kern_op_moe_gemm, &p, &L->dev, L->opt->disabled, layer, &v, e)))
			return st;
		/* the layout the chosen variant consumes (a view when it has no prepare) */
		for (int a = 0; a < (pass ? 1 : 2); a++) {
			struct kern_wmat *arr = pass ? x->w2 : a ? x->w3 : x->w1;
			for (int64_t k = 0; k < E; k++) {
				struct kern_wmat raw = arr[k];
				if ((st = kern_prepare_weight(v, &raw, &arr[k], e)))
					return err_prefix(e, "layer %d expert %lld", layer, (long long)(e0 + k));
			}
		}
		if (pass) {
			x->v2 = v;
			x->run2 = (kern_moe_gemm_fn)v->run;
		} else {
			x->v13 = v;
			x->run13 = (kern_moe_gemm_fn)v->run;
		}
		if ((st = plan_add(L, layer, &kern_op_moe_gemm, v, e)))
			return st;
	}
	return ST_OK;
}

/* Select a weight-free op; stores the run pointer. */
static enum status sel(struct loader *L, int layer, const struct kern_op *op, kern_fn *out, struct err *e)
{
	struct kern_problem p = {.wfmt = KERN_WFMT_NONE, .tp_size = L->opt->world_size, .shape = NULL};
	const struct kern_variant *v;
	enum status st = kern_select(op, &p, &L->dev, L->opt->disabled, layer, &v, e);
	if (st)
		return st;
	*out = v->run;
	return plan_add(L, layer, op, v, e);
}

#define SEL(op, field)                                                                             \
	do {                                                                                       \
		kern_fn f_;                                                                        \
		if ((st = sel(L, layer, &(op), &f_, e)))                                           \
			return st;                                                                 \
		ly->ops.field = (__typeof__(ly->ops.field))f_;                                     \
	} while (0)

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

static enum status layer_load(struct loader *L, int layer, struct model_layer *ly, struct err *e)
{
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

	SEL(kern_op_rmsnorm, rmsnorm);
	SEL(kern_op_rope, rope);
	SEL(kern_op_hc_prenorm, hc_prenorm);
	SEL(kern_op_hc_split, hc_split);
	SEL(kern_op_hc_pre_combine, hc_pre_combine);
	SEL(kern_op_hc_post, hc_post);
	SEL(kern_op_attn_index, attn_index);
	SEL(kern_op_sparse_attn, sparse_attn);
	if (ly->ratio)
		SEL(kern_op_compressor, compressor);
	if (ly->kind == MODEL_ATTN_CSA) {
		SEL(kern_op_indexer_rotate, indexer_rotate);
		SEL(kern_op_indexer_topk, indexer_topk);
	}
	SEL(kern_op_route, route);
	SEL(kern_op_moe_group, moe_group);
	SEL(kern_op_swiglu, swiglu);

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
#define LIN(suffix, aq, field)                                                                    \
	do {                                                                                      \
		snprintf(name, sizeof name, "%s.%s", lp, suffix);                                 \
		if ((st = lin(L, layer, name, aq, &ly->field, e)))                                \
			return st;                                                                \
	} while (0)
	LIN("attn.wq_a", true, wq_a);
	LIN("attn.wkv", true, wkv);
	int64_t HL = L->w->n_heads_local, GL = L->w->n_groups_local, R = cfg->o_lora_rank;
	{
		/* this rank's heads of wq_b (a row view) and its o_groups' columns of wo_b (a copy) */
		struct kern_wmat full, part;
		snprintf(name, sizeof name, "%s.attn.wq_b", lp);
		if ((st = wmat_of(L, name, &full, e)) ||
		    (st = rows_view(&full, L->w->rank * HL * d, HL * d, &part, e)) ||
		    (st = lin_setup(L, layer, &part, true, &ly->wq_b, e)))
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
		if ((st = lin_setup(L, layer, &part, true, &ly->wo_b, e)))
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
			/* no act_quant: the reference runs this grouped einsum in bf16 on
			 * dequantized weights (dsv4.md §3.3 output path, step 2) */
			if ((st = lin_setup(L, layer, &gv, false, &ly->wo_a[g], e)))
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
		LIN("attn.compressor.wkv", false, cmp_wkv);
		LIN("attn.compressor.wgate", false, cmp_wgate);
		snprintf(name, sizeof name, "%s.attn.compressor.ape", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)ly->ratio * c * d, &ly->cmp_ape)))
			return st;
		snprintf(name, sizeof name, "%s.attn.compressor.norm.weight", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)d, &ly->cmp_norm)))
			return st;
	}
	if (ly->kind == MODEL_ATTN_CSA) {
		int64_t id = cfg->index_head_dim;
		LIN("attn.indexer.wq_b", true, idx_wq_b);
		LIN("attn.indexer.weights_proj", false, idx_wproj);
		LIN("attn.indexer.compressor.wkv", false, idx_cmp_wkv);
		LIN("attn.indexer.compressor.wgate", false, idx_cmp_wgate);
		snprintf(name, sizeof name, "%s.attn.indexer.compressor.ape", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_F32, (uint64_t)ly->ratio * 2 * id, &ly->idx_cmp_ape)))
			return st;
		snprintf(name, sizeof name, "%s.attn.indexer.compressor.norm.weight", lp);
		if ((st = PLAIN(L, name, MODEL_DTYPE_BF16, (uint64_t)id, &ly->idx_cmp_norm)))
			return st;
	}

	/* MoE */
	LIN("ffn.gate", false, gate);
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
	if ((st = experts_setup(L, layer, lp, &ly->experts, e)))
		return st;
	{
		/* the shared expert's intermediate dim split: w1/w3 rows, w2 columns */
		int64_t IS = cfg->moe_intermediate_size * (cfg->n_shared_experts > 0 ? cfg->n_shared_experts : 1);
		int64_t IL = IS / L->w->world_size, i0 = L->w->rank * IL;
		struct kern_wmat full, part;
		const char *wn[2] = {"w1", "w3"};
		struct model_lin *dst[2] = {&ly->sh_w1, &ly->sh_w3};
		for (int k = 0; k < 2; k++) {
			snprintf(name, sizeof name, "%s.ffn.shared_experts.%s", lp, wn[k]);
			if ((st = wmat_of(L, name, &full, e)) || (st = rows_view(&full, i0, IL, &part, e)) ||
			    (st = lin_setup(L, layer, &part, true, dst[k], e)))
				return err_prefix(e, "%s", name);
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
		if ((st = lin_setup(L, layer, &part, true, &ly->sh_w2, e)))
			return st;
	}

	if (ly->mtp) {
		LIN("e_proj", true, e_proj);
		LIN("h_proj", true, h_proj);
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
	if (opt->dev)
		L.dev = *opt->dev;
	else
		kern_device_cpu(&L.dev);
	const struct model_config *cfg = model_checkpoint_config(opt->ck);
	w->cfg = cfg;
	int ws = opt->world_size;
	if (ws < 1 || opt->rank < 0 || opt->rank >= ws)
		return err_set(e, ST_INVALID, "rank %d of world size %d", opt->rank, ws);
	if (cfg->num_attention_heads % ws || cfg->o_groups % ws || cfg->n_routed_experts % ws || cfg->vocab_size % ws ||
	    cfg->moe_intermediate_size % ws)
		return err_set(e, ST_UNSUPPORTED,
			       "world size %d does not divide heads %lld, o_groups %lld, experts %lld, moe_intermediate_size "
			       "%lld and vocab %lld", ws, (long long)cfg->num_attention_heads, (long long)cfg->o_groups,
			       (long long)cfg->n_routed_experts, (long long)cfg->moe_intermediate_size,
			       (long long)cfg->vocab_size);
	w->rank = opt->rank;
	w->world_size = ws;
	w->n_heads_local = cfg->num_attention_heads / ws;
	w->n_groups_local = cfg->o_groups / ws;
	w->n_experts_local = cfg->n_routed_experts / ws;
	w->expert_begin = opt->rank * w->n_experts_local;
	w->vocab_local = cfg->vocab_size / ws;
	w->vocab_begin = opt->rank * w->vocab_local;
	w->n_layers = (int)cfg->num_hidden_layers;
	w->n_mtp = opt->load_mtp && cfg->num_nextn_predict_layers > 0 ? 1 : 0;
	w->layers = calloc((size_t)(w->n_layers + w->n_mtp), sizeof *w->layers);
	if (!w->layers)
		return err_set(e, ST_NOMEM, "layers");
	enum status st;
	int64_t D = cfg->hidden_size, V = cfg->vocab_size;
	struct kern_wmat hm, hv;
	if ((st = PLAIN(&L, "embed.weight", MODEL_DTYPE_BF16, (uint64_t)(V * D), &w->embed)) ||
	    (st = PLAIN(&L, "norm.weight", MODEL_DTYPE_BF16, (uint64_t)D, &w->norm)) ||
	    (st = hc_site(&L, "hc_head", (int)cfg->hc_mult, 1, &w->hc_head, e)) ||
	    (st = wmat_of(&L, "head", &hm, e)) ||
	    (st = rows_view(&hm, w->vocab_begin, w->vocab_local, &hv, e)) ||
	    (st = lin_setup(&L, -1, &hv, false, &w->head, e))) {
		err_prefix(e, "global tensors (embed, norm, hc_head, head)");
		goto fail;
	}
	for (int l = 0; l < w->n_layers + w->n_mtp; l++)
		if ((st = layer_load(&L, l, &w->layers[l], e))) {
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
		free(ly->omega);
		free(ly->tid2eid);
		for (int64_t k = 0; ly->experts.w1 && k < 3 * w->n_experts_local; k++)
			kern_wmat_release(&ly->experts.w1[k]);
		free(ly->experts.w1);
	}
	free(w->layers);
	lin_free(&w->head);
	for (int i = 0; i < w->n_owned; i++)
		free(w->owned[i]);
	free(w->owned);
	kern_plan_free(&w->plan);
	memset(w, 0, sizeof *w);
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

/* " linear[fmt]=variant" once per distinct (format, variant) pair. */
static void pb_lins(struct plan_buf *b, const struct model_lin *const *ls, int n)
{
	for (int i = 0; i < n; i++) {
		if (!ls[i]->v)
			continue;
		bool seen = false;
		for (int j = 0; j < i; j++)
			seen |= ls[j]->v == ls[i]->v && ls[j]->w.fmt == ls[i]->w.fmt;
		if (!seen)
			pb_add(b, " linear[%s]=%s", kern_wfmt_name(ls[i]->w.fmt), ls[i]->v->name);
	}
}

size_t model_weights_plan_str(const struct model_weights *w, char *buf, size_t n)
{
	struct plan_buf b = {.buf = buf, .n = n};
	if (n)
		buf[0] = 0;
	const struct model_lin *hl[] = {&w->head};
	pb_add(&b, "%s%s:", "head", "");
	pb_lins(&b, hl, 1);
	pb_add(&b, "%s%s\n", "", "");
	for (int l = 0; l < w->n_layers + w->n_mtp; l++) {
		const struct model_layer *ly = &w->layers[l];
		char lbl[64];
		snprintf(lbl, sizeof lbl, "layer %d (%s%s%s):", l, model_attn_kind_str(ly->kind), ly->mtp ? ", MTP" : "",
			 ly->hash ? ", hash-routed" : "");
		pb_add(&b, "%s%s", lbl, "");
		const struct model_lin *ls[] = {&ly->wq_a, &ly->wq_b, &ly->wkv, &ly->wo_a[0], &ly->wo_b, &ly->cmp_wkv,
						&ly->idx_wq_b, &ly->idx_wproj, &ly->gate, &ly->sh_w1, &ly->sh_w2,
						&ly->e_proj, &ly->h_proj};
		pb_lins(&b, ls, (int)(sizeof ls / sizeof ls[0]));
		pb_add(&b, " moe_gemm[%s]=%s", kern_wfmt_name(ly->experts.w1[0].fmt), ly->experts.v13->name);
		if (ly->experts.v2 != ly->experts.v13)
			pb_add(&b, " moe_gemm[%s]=%s", kern_wfmt_name(ly->experts.w2[0].fmt), ly->experts.v2->name);
		/* the weight-free ops, from the plan records of this layer */
		for (int i = 0; i < w->plan.n; i++) {
			const struct kern_plan_entry *pe = &w->plan.entries[i];
			if (pe->layer != l || !strcmp(pe->op, "linear") || !strcmp(pe->op, "moe_gemm"))
				continue;
			pb_add(&b, " %s=%s", pe->op, pe->variant);
		}
		pb_add(&b, "%s%s\n", "", "");
	}
	return b.len;
}
