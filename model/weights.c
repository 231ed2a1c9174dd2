/*
 * model/weights.c: the weight loader (model/weights.h, step 2).
 *
 * model_weights_load derives the formats from the checkpoint, builds the
 * kernel plan (model/plan.c), and then only views the tensors and runs the
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

/* plain() of tensor "<lp>.<suffix>" of a layer. */
static enum status plain_at(struct loader *L, const char *lp, const char *suffix, enum model_dtype dt,
			    uint64_t n_elems, const void **out, struct err *e)
{
	char name[192];
	snprintf(name, sizeof name, "%s.%s", lp, suffix);
	return plain(L, name, dt, n_elems, out, e);
}

/* The address of a typed tensor pointer, as plain() fills it. */
#define VPTR(p) ((const void **)(p))

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
	out->run_dec = pl->v_dec ? (kern_linear_fn)pl->v_dec->run : NULL;
	out->dec_tokens = pl->dec_tokens;
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
	x->vdec = pl->moe_dec;
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
	if ((st = plain(L, name, MODEL_DTYPE_F32, (uint64_t)n_out * cfg->hc_mult * cfg->hidden_size, VPTR(&hc->fn), e)))
		return st;
	snprintf(name, sizeof name, "%s_base", prefix);
	if ((st = plain(L, name, MODEL_DTYPE_F32, (uint64_t)n_out, VPTR(&hc->base), e)))
		return st;
	snprintf(name, sizeof name, "%s_scale", prefix);
	return plain(L, name, MODEL_DTYPE_F32, (uint64_t)n_scale, VPTR(&hc->scale), e);
}

/* The weight-free ops' run pointers of a planned layer. */
static void layer_ops_set(const struct model_layer_plan *pl, struct model_layer_ops *ops)
{
	const struct kern_variant *const *o = pl->op;
#define OP(idx, field) ops->field = o[idx] ? (__typeof__(ops->field))o[idx]->run : NULL
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
}

/* Columns [c0, c0+n) of the stored linear full as this rank's shard (a copy
 * the weights own; the whole matrix when there is one rank). */
static enum status cols_shard(struct loader *L, const char *name, const struct kern_wmat *full, int64_t c0, int64_t n,
			      struct kern_wmat *part, struct err *e)
{
	if (L->w->world_size == 1) {
		*part = *full;
		return ST_OK;
	}
	enum status st = cols_copy(full, c0, n, part, e);
	if (st)
		return err_prefix(e, "%s", name);
	/* the weights own the shard (a prepared view may alias it) */
	if ((st = own(L->w, part->owned, e)))
		return st;
	part->owned = NULL;
	return ST_OK;
}

/* The norms and the two mHC sites every layer has. */
static enum status layer_load_common(struct loader *L, const char *lp, struct model_layer *ly, struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	const uint64_t D = (uint64_t)cfg->hidden_size;
	const int n = (int)cfg->hc_mult;
	char name[192];
	enum status st;
	if ((st = plain_at(L, lp, "attn_norm.weight", MODEL_DTYPE_BF16, D, VPTR(&ly->attn_norm), e)) ||
	    (st = plain_at(L, lp, "ffn_norm.weight", MODEL_DTYPE_BF16, D, VPTR(&ly->ffn_norm), e)))
		return st;
	snprintf(name, sizeof name, "%s.hc_attn", lp);
	if ((st = hc_site(L, name, (2 + n) * n, 3, &ly->hc_attn, e)))
		return st;
	snprintf(name, sizeof name, "%s.hc_ffn", lp);
	return hc_site(L, name, (2 + n) * n, 3, &ly->hc_ffn, e);
}

/* Attention: projections (this rank's heads of wq_b as a row view, its
 * o_groups' rows of wo_a and columns of wo_b), norms, sink, rope table. */
static enum status layer_load_attn(struct loader *L, const struct model_layer_plan *pl, const char *lp,
				   struct model_layer *ly, struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	const int64_t d = cfg->head_dim, HL = L->w->n_heads_local, GL = L->w->n_groups_local, R = cfg->o_lora_rank;
	const int r = (int)cfg->qk_rope_head_dim;
	char name[192];
	enum status st;
	struct kern_wmat full, part;
	if ((st = lin(L, pl, lp, MODEL_LIN_WQ_A, &ly->wq_a, e)) || (st = lin(L, pl, lp, MODEL_LIN_WKV, &ly->wkv, e)))
		return st;
	snprintf(name, sizeof name, "%s.attn.wq_b", lp);
	if ((st = wmat_of(L, name, &full, e)))
		return st;
	if ((st = rows_view(&full, L->w->rank * HL * d, HL * d, &part, e)))
		return err_prefix(e, "%s", name);
	if ((st = lin_setup(&pl->lin[MODEL_LIN_WQ_B], name, &part, &ly->wq_b, e)))
		return st;
	snprintf(name, sizeof name, "%s.attn.wo_b", lp);
	if ((st = wmat_of(L, name, &full, e)) || (st = cols_shard(L, name, &full, L->w->rank * GL * R, GL * R, &part, e)) ||
	    (st = lin_setup(&pl->lin[MODEL_LIN_WO_B], name, &part, &ly->wo_b, e)))
		return st;
	snprintf(name, sizeof name, "%s.attn.wo_a", lp);
	if ((st = wmat_of(L, name, &full, e)))
		return st;
	if (GL > MODEL_MAX_O_GROUPS)
		return err_set(e, ST_UNSUPPORTED, "o_groups %lld > %d", (long long)GL, MODEL_MAX_O_GROUPS);
	for (int64_t g = 0; g < GL; g++) {
		if ((st = rows_view(&full, (L->w->rank * GL + g) * R, R, &part, e)))
			return err_prefix(e, "%s group %lld", name, (long long)g);
		if ((st = lin_setup(&pl->lin[MODEL_LIN_WO_A], name, &part, &ly->wo_a[g], e)))
			return st;
	}
	if ((st = plain_at(L, lp, "attn.q_norm.weight", MODEL_DTYPE_BF16, (uint64_t)cfg->q_lora_rank,
			   VPTR(&ly->q_norm), e)) ||
	    (st = plain_at(L, lp, "attn.kv_norm.weight", MODEL_DTYPE_BF16, (uint64_t)d, VPTR(&ly->kv_norm), e)) ||
	    (st = plain_at(L, lp, "attn.attn_sink", MODEL_DTYPE_F32, (uint64_t)cfg->num_attention_heads,
			   VPTR(&ly->attn_sink), e)))
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
	return st ? err_set(e, st, "layer %d: rope table", ly->layer) : ST_OK;
}

/* The KV compressor (CSA and HCA layers) and the lightning indexer (CSA). */
static enum status layer_load_compressors(struct loader *L, const struct model_layer_plan *pl, const char *lp,
					  struct model_layer *ly, struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	const int64_t d = cfg->head_dim, id = cfg->index_head_dim;
	enum status st = ST_OK;
	if (ly->ratio) {
		const int64_t c = ly->kind == MODEL_ATTN_CSA ? 2 : 1;
		if ((st = lin(L, pl, lp, MODEL_LIN_CMP_WKV, &ly->cmp_wkv, e)) ||
		    (st = lin(L, pl, lp, MODEL_LIN_CMP_WGATE, &ly->cmp_wgate, e)) ||
		    (st = plain_at(L, lp, "attn.compressor.ape", MODEL_DTYPE_F32, (uint64_t)(ly->ratio * c * d),
				   VPTR(&ly->cmp_ape), e)) ||
		    (st = plain_at(L, lp, "attn.compressor.norm.weight", MODEL_DTYPE_BF16, (uint64_t)d,
				   VPTR(&ly->cmp_norm), e)))
			return st;
	}
	if (ly->kind == MODEL_ATTN_CSA) {
		if ((st = lin(L, pl, lp, MODEL_LIN_IDX_WQ_B, &ly->idx_wq_b, e)) ||
		    (st = lin(L, pl, lp, MODEL_LIN_IDX_WPROJ, &ly->idx_wproj, e)) ||
		    (st = lin(L, pl, lp, MODEL_LIN_IDX_CMP_WKV, &ly->idx_cmp_wkv, e)) ||
		    (st = lin(L, pl, lp, MODEL_LIN_IDX_CMP_WGATE, &ly->idx_cmp_wgate, e)) ||
		    (st = plain_at(L, lp, "attn.indexer.compressor.ape", MODEL_DTYPE_F32, (uint64_t)(ly->ratio * 2 * id),
				   VPTR(&ly->idx_cmp_ape), e)) ||
		    (st = plain_at(L, lp, "attn.indexer.compressor.norm.weight", MODEL_DTYPE_BF16, (uint64_t)id,
				   VPTR(&ly->idx_cmp_norm), e)))
			return st;
	}
	return st;
}

/* MoE: the router (gate, and its bias or hash table), this rank's routed
 * experts, and the shared expert's intermediate dim split (w1/w3 rows, w2
 * columns). */
static enum status layer_load_moe(struct loader *L, const struct model_layer_plan *pl, const char *lp,
				  struct model_layer *ly, struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	const int64_t E = cfg->n_routed_experts, K = cfg->num_experts_per_tok;
	char name[192];
	enum status st;
	if ((st = lin(L, pl, lp, MODEL_LIN_GATE, &ly->gate, e)))
		return st;
	if (ly->hash) {
		const int64_t *t64;
		if ((st = plain_at(L, lp, "ffn.gate.tid2eid", MODEL_DTYPE_I64, (uint64_t)(cfg->vocab_size * K), VPTR(&t64),
				   e)))
			return st;
		ly->tid2eid = malloc((size_t)(cfg->vocab_size * K) * sizeof(int32_t));
		if (!ly->tid2eid)
			return err_set(e, ST_NOMEM, "tid2eid of layer %d", ly->layer);
		for (int64_t i = 0; i < cfg->vocab_size * K; i++) {
			if (t64[i] < 0 || t64[i] >= E)
				return err_set(e, ST_INVALID, "%s.ffn.gate.tid2eid: entry %lld is expert %lld of %lld", lp,
					       (long long)i, (long long)t64[i], (long long)E);
			ly->tid2eid[i] = (int32_t)t64[i];
		}
	} else if ((st = plain_at(L, lp, "ffn.gate.bias", MODEL_DTYPE_F32, (uint64_t)E, VPTR(&ly->gate_bias), e))) {
		return st;
	}
	if ((st = experts_setup(L, pl, lp, &ly->experts, e)))
		return st;
	const int64_t IS = cfg->moe_intermediate_size * (cfg->n_shared_experts > 0 ? cfg->n_shared_experts : 1);
	const int64_t IL = IS / L->w->world_size, i0 = L->w->rank * IL;
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
	if ((st = wmat_of(L, name, &full, e)) || (st = cols_shard(L, name, &full, i0, IL, &part, e)))
		return st;
	return lin_setup(&pl->lin[MODEL_LIN_SH_W2], name, &part, &ly->sh_w2, e);
}

/* The NextN MTP layer's own tensors: its projections, norms and head mHC. */
static enum status layer_load_mtp(struct loader *L, const struct model_layer_plan *pl, const char *lp,
				  struct model_layer *ly, struct err *e)
{
	const uint64_t D = (uint64_t)L->w->cfg->hidden_size;
	char name[192];
	enum status st;
	if ((st = lin(L, pl, lp, MODEL_LIN_E_PROJ, &ly->e_proj, e)) ||
	    (st = lin(L, pl, lp, MODEL_LIN_H_PROJ, &ly->h_proj, e)) ||
	    (st = plain_at(L, lp, "enorm.weight", MODEL_DTYPE_BF16, D, VPTR(&ly->enorm), e)) ||
	    (st = plain_at(L, lp, "hnorm.weight", MODEL_DTYPE_BF16, D, VPTR(&ly->hnorm), e)) ||
	    (st = plain_at(L, lp, "norm.weight", MODEL_DTYPE_BF16, D, VPTR(&ly->mtp_norm), e)))
		return st;
	snprintf(name, sizeof name, "%s.hc_head", lp);
	return hc_site(L, name, (int)L->w->cfg->hc_mult, 1, &ly->mtp_hc_head, e);
}

/* A DSpark stage's own tensors (dsv4-0731.md): stage 0 the input projection
 * of the target captures, the last stage the head and the Markov head. */
static enum status layer_load_dspark(struct loader *L, const char *lp, struct model_layer *ly, struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	const uint64_t D = (uint64_t)cfg->hidden_size, V = (uint64_t)cfg->vocab_size;
	const int stage = ly->layer - (int)cfg->num_hidden_layers;
	char name[192];
	enum status st;
	if (stage == 0) {
		struct kern_wmat m;
		snprintf(name, sizeof name, "%s.main_proj", lp);
		if ((st = wmat_of(L, name, &m, e)) ||
		    (st = lin_setup(&L->w->kernels.dspark_main_proj, name, &m, &ly->main_proj, e)) ||
		    (st = plain_at(L, lp, "main_norm.weight", MODEL_DTYPE_BF16, D, VPTR(&ly->main_norm), e)))
			return st;
	}
	if (stage != cfg->n_draft_layers - 1)
		return ST_OK;
	uint64_t r = (uint64_t)cfg->dspark.markov_rank;
	if ((st = plain_at(L, lp, "norm.weight", MODEL_DTYPE_BF16, D, VPTR(&ly->mtp_norm), e)) ||
	    (st = plain_at(L, lp, "markov_head.markov_w1.weight", MODEL_DTYPE_BF16, V * r, VPTR(&ly->markov_w1), e)) ||
	    (st = plain_at(L, lp, "markov_head.markov_w2.weight", MODEL_DTYPE_BF16, V * r, VPTR(&ly->markov_w2), e)))
		return st;
	snprintf(name, sizeof name, "%s.hc_head", lp);
	return hc_site(L, name, (int)cfg->hc_mult, 1, &ly->mtp_hc_head, e);
}

/* One layer of the plan: its identity, op pointers, then its tensors step
 * by step. */
static enum status layer_load(struct loader *L, const struct model_layer_plan *pl, struct model_layer *ly,
			      struct err *e)
{
	const struct model_config *cfg = L->w->cfg;
	const int layer = pl->layer;
	char lp[64];
	model_schema_layer_prefix(cfg, layer, lp, sizeof lp);
	ly->layer = layer;
	ly->kind = model_config_attn_kind(cfg, layer);
	ly->ratio = cfg->compress_ratios[layer];
	ly->hash = model_config_is_hash_layer(cfg, layer);
	ly->dspark = model_config_is_dspark_layer(cfg, layer);
	ly->mtp = model_config_is_mtp_layer(cfg, layer) && !ly->dspark;
	layer_ops_set(pl, &ly->ops);
	enum status st;
	if ((st = layer_load_common(L, lp, ly, e)) || (st = layer_load_attn(L, pl, lp, ly, e)) ||
	    (st = layer_load_compressors(L, pl, lp, ly, e)) || (st = layer_load_moe(L, pl, lp, ly, e)))
		return st;
	if (ly->dspark)
		return layer_load_dspark(L, lp, ly, e);
	return ly->mtp ? layer_load_mtp(L, pl, lp, ly, e) : ST_OK;
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
					.load_mtp = opt->load_mtp, .plan_dspark = opt->load_mtp && (!opt->dev || opt->dev->index < 0),
					.world_size = ws, .selfcheck = opt->selfcheck};
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
	w->n_dspark = w->kernels.n_dspark;
	w->layers = calloc((size_t)(w->n_layers + w->n_mtp + w->n_dspark), sizeof *w->layers);
	if (!w->layers) {
		st = err_set(e, ST_NOMEM, "layers");
		goto fail;
	}
	int64_t D = cfg->hidden_size, V = cfg->vocab_size;
	struct kern_wmat hm, hv;
	if ((st = plain(&L, "embed.weight", MODEL_DTYPE_BF16, (uint64_t)(V * D), VPTR(&w->embed), e)) ||
	    (st = plain(&L, "norm.weight", MODEL_DTYPE_BF16, (uint64_t)D, VPTR(&w->norm), e)) ||
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
	for (int l = 0; l < w->n_layers + w->n_mtp + w->n_dspark; l++)
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
	for (int l = 0; w->layers && l < w->n_layers + w->n_mtp + w->n_dspark; l++) {
		struct model_layer *ly = &w->layers[l];
		struct model_lin *ls[] = {&ly->wq_a, &ly->wq_b, &ly->wkv, &ly->wo_b, &ly->cmp_wkv, &ly->cmp_wgate,
					  &ly->idx_wq_b, &ly->idx_wproj, &ly->idx_cmp_wkv, &ly->idx_cmp_wgate,
					  &ly->gate, &ly->sh_w1, &ly->sh_w3, &ly->sh_w2, &ly->e_proj, &ly->h_proj,
					  &ly->main_proj};
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
	for (int l = -1; l < p->n_layers + p->n_mtp + p->n_dspark; l++)
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
