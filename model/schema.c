/*
 * model/schema.c: expected tensors of a DeepSeek-V4 checkpoint, from config.
 *
 * One walk over the layer schedule (dsv4.md §1.2, §5.2) that emits plain
 * tensors and linears through a visitor, so the checkpoint reader, the tests
 * and any future writer share the one definition of the layout. Shapes are
 * computed in int64 from validated config values (model/config.c bounds every
 * width), so nothing here overflows.
 */
#include "model/schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FMT_BIT(f) (1u << (f))
#define DENSE_FORMATS (FMT_BIT(MODEL_FMT_BF16) | FMT_BIT(MODEL_FMT_F32) | FMT_BIT(MODEL_FMT_FP8_BLOCK))
#define EXPERT_FORMATS (DENSE_FORMATS | FMT_BIT(MODEL_FMT_MXFP4) | FMT_BIT(MODEL_FMT_NVFP4))

/* ---- Emission helpers ---- */

struct walk {
	const struct model_config *cfg;
	const struct model_schema_visitor *v;
	struct err *e;
	int layer;
	char prefix[32]; /* "layers.3." or "mtp.0." or "" */
};

static enum status plain(struct walk *w, enum model_dtype dt, int n_dims, int64_t d0, int64_t d1,
			 const char *fmt, ...) DSV4_PRINTF(6, 7);
static enum status plain(struct walk *w, enum model_dtype dt, int n_dims, int64_t d0, int64_t d1,
			 const char *fmt, ...)
{
	struct model_schema_tensor t = {.dtype = dt, .n_dims = n_dims, .shape = {d0, d1},
					.layer = w->layer, .group = MODEL_GROUP_OTHER, .role = MODEL_ROLE_PLAIN};
	size_t n = (size_t)snprintf(t.name, sizeof t.name, "%s", w->prefix);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t.name + n, sizeof t.name - n, fmt, ap);
	va_end(ap);
	return w->v->plain(w->v->ctx, &t, w->e);
}

static enum status linear(struct walk *w, enum model_group g, int expert, int64_t out, int64_t in,
			  const char *fmt, ...) DSV4_PRINTF(6, 7);
static enum status linear(struct walk *w, enum model_group g, int expert, int64_t out, int64_t in,
			  const char *fmt, ...)
{
	struct model_schema_linear l = {.layer = w->layer, .expert = expert, .group = g, .out = out, .in = in,
					.allowed = g == MODEL_GROUP_ROUTED_EXPERTS ? EXPERT_FORMATS : DENSE_FORMATS};
	size_t n = (size_t)snprintf(l.prefix, sizeof l.prefix, "%s", w->prefix);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l.prefix + n, sizeof l.prefix - n, fmt, ap);
	va_end(ap);
	return w->v->linear(w->v->ctx, &l, w->e);
}

#define TRY(expr)                                  \
	do {                                       \
		enum status st_ = (expr);          \
		if (st_ != ST_OK)                  \
			return st_;                \
	} while (0)

#define F32 MODEL_DTYPE_F32
#define BF16 MODEL_DTYPE_BF16

/* hc_{attn,ffn}_{fn,base,scale}: mix = (2 + hc) * hc rows over hc * D inputs. */
static enum status hc_block(struct walk *w, const char *which)
{
	const struct model_config *c = w->cfg;
	int64_t mix = (2 + c->hc_mult) * c->hc_mult;
	TRY(plain(w, F32, 2, mix, c->hc_mult * c->hidden_size, "hc_%s_fn", which));
	TRY(plain(w, F32, 1, mix, 0, "hc_%s_base", which));
	return plain(w, F32, 1, 3, 0, "hc_%s_scale", which);
}

/* The final hyper-connection head (global, and per MTP layer). */
static enum status hc_head(struct walk *w)
{
	const struct model_config *c = w->cfg;
	TRY(plain(w, F32, 2, c->hc_mult, c->hc_mult * c->hidden_size, "hc_head_fn"));
	TRY(plain(w, F32, 1, c->hc_mult, 0, "hc_head_base"));
	return plain(w, F32, 1, 1, 0, "hc_head_scale");
}

static enum status attention(struct walk *w)
{
	const struct model_config *c = w->cfg;
	int64_t D = c->hidden_size, H = c->num_attention_heads, d = c->head_dim;
	enum model_group A = MODEL_GROUP_ATTN;
	TRY(plain(w, F32, 1, H, 0, "attn.attn_sink"));
	TRY(linear(w, A, -1, c->q_lora_rank, D, "attn.wq_a"));
	TRY(plain(w, BF16, 1, c->q_lora_rank, 0, "attn.q_norm.weight"));
	TRY(linear(w, A, -1, H * d, c->q_lora_rank, "attn.wq_b"));
	TRY(linear(w, A, -1, c->num_key_value_heads * d, D, "attn.wkv"));
	TRY(plain(w, BF16, 1, d, 0, "attn.kv_norm.weight"));
	TRY(linear(w, A, -1, c->o_groups * c->o_lora_rank, (H / c->o_groups) * d, "attn.wo_a"));
	TRY(linear(w, A, -1, D, c->o_groups * c->o_lora_rank, "attn.wo_b"));

	int32_t ratio = c->compress_ratios[w->layer];
	if (ratio == 0)
		return ST_OK;
	/* CSA windows overlap (two halves of the feature), HCA ones do not. */
	int64_t coff = ratio == 4 ? 2 : 1;
	TRY(plain(w, BF16, 2, coff * d, D, "attn.compressor.wkv.weight"));
	TRY(plain(w, BF16, 2, coff * d, D, "attn.compressor.wgate.weight"));
	TRY(plain(w, F32, 2, ratio, coff * d, "attn.compressor.ape"));
	TRY(plain(w, BF16, 1, d, 0, "attn.compressor.norm.weight"));
	if (ratio != 4)
		return ST_OK;
	int64_t ih = c->index_n_heads, id = c->index_head_dim;
	TRY(linear(w, A, -1, ih * id, c->q_lora_rank, "attn.indexer.wq_b"));
	TRY(plain(w, BF16, 2, ih, D, "attn.indexer.weights_proj.weight"));
	TRY(plain(w, BF16, 2, 2 * id, D, "attn.indexer.compressor.wkv.weight"));
	TRY(plain(w, BF16, 2, 2 * id, D, "attn.indexer.compressor.wgate.weight"));
	TRY(plain(w, F32, 2, 4, 2 * id, "attn.indexer.compressor.ape"));
	return plain(w, BF16, 1, id, 0, "attn.indexer.compressor.norm.weight");
}

static enum status moe(struct walk *w)
{
	const struct model_config *c = w->cfg;
	int64_t D = c->hidden_size, I = c->moe_intermediate_size, E = c->n_routed_experts;
	TRY(plain(w, BF16, 2, E, D, "ffn.gate.weight"));
	if (model_config_is_hash_layer(c, w->layer))
		TRY(plain(w, MODEL_DTYPE_I64, 2, c->vocab_size, c->num_experts_per_tok, "ffn.gate.tid2eid"));
	else
		TRY(plain(w, F32, 1, E, 0, "ffn.gate.bias"));
	if (c->n_shared_experts > 0) {
		int64_t Is = I * c->n_shared_experts;
		enum model_group S = MODEL_GROUP_SHARED_EXPERTS;
		TRY(linear(w, S, -1, Is, D, "ffn.shared_experts.w1"));
		TRY(linear(w, S, -1, D, Is, "ffn.shared_experts.w2"));
		TRY(linear(w, S, -1, Is, D, "ffn.shared_experts.w3"));
	}
	enum model_group R = MODEL_GROUP_ROUTED_EXPERTS;
	for (int x = 0; x < E; x++) {
		TRY(linear(w, R, x, I, D, "ffn.experts.%d.w1", x));
		TRY(linear(w, R, x, D, I, "ffn.experts.%d.w2", x));
		TRY(linear(w, R, x, I, D, "ffn.experts.%d.w3", x));
	}
	return ST_OK;
}

/* What a DSpark stage adds to its V4 block (dsv4-0731.md): the first stage
 * projects the target layers' outputs (main_proj, main_norm), the last one
 * carries the heads (norm, hc_head, Markov head, confidence head). */
static enum status dspark_extras(struct walk *w, int stage)
{
	const struct model_config *c = w->cfg;
	int64_t D = c->hidden_size, V = c->vocab_size, r = c->dspark.markov_rank;
	if (stage == 0) {
		TRY(linear(w, MODEL_GROUP_MTP_PROJ, -1, D, D * c->dspark.n_target_layers, "main_proj"));
		TRY(plain(w, BF16, 1, D, 0, "main_norm.weight"));
	}
	if (stage != c->n_draft_layers - 1)
		return ST_OK;
	TRY(plain(w, BF16, 1, D, 0, "norm.weight"));
	TRY(hc_head(w));
	TRY(plain(w, BF16, 2, V, r, "markov_head.markov_w1.weight"));
	TRY(plain(w, BF16, 2, V, r, "markov_head.markov_w2.weight"));
	return plain(w, BF16, 2, 1, D + r, "confidence_head.proj.weight");
}

static enum status layer(struct walk *w, int L)
{
	const struct model_config *c = w->cfg;
	w->layer = L;
	model_schema_layer_prefix(c, L, w->prefix, sizeof w->prefix - 1);
	strcat(w->prefix, ".");
	int64_t D = c->hidden_size;
	TRY(plain(w, BF16, 1, D, 0, "attn_norm.weight"));
	TRY(plain(w, BF16, 1, D, 0, "ffn_norm.weight"));
	TRY(hc_block(w, "attn"));
	TRY(hc_block(w, "ffn"));
	TRY(attention(w));
	TRY(moe(w));
	if (!model_config_is_mtp_layer(c, L))
		return ST_OK;
	if (model_config_is_dspark_layer(c, L))
		return dspark_extras(w, L - (int)c->num_hidden_layers);
	TRY(linear(w, MODEL_GROUP_MTP_PROJ, -1, D, D, "e_proj"));
	TRY(linear(w, MODEL_GROUP_MTP_PROJ, -1, D, D, "h_proj"));
	TRY(plain(w, BF16, 1, D, 0, "enorm.weight"));
	TRY(plain(w, BF16, 1, D, 0, "hnorm.weight"));
	TRY(plain(w, BF16, 1, D, 0, "norm.weight"));
	return hc_head(w);
}

/* ---- Public ---- */

void model_schema_layer_prefix(const struct model_config *cfg, int layer, char *buf, size_t n)
{
	if (model_config_is_mtp_layer(cfg, layer))
		snprintf(buf, n, "mtp.%d", layer - (int)cfg->num_hidden_layers);
	else
		snprintf(buf, n, "layers.%d", layer);
}

enum status model_schema_walk(const struct model_config *cfg, const struct model_schema_visitor *v,
			      struct err *e)
{
	struct walk w = {.cfg = cfg, .v = v, .e = e, .layer = -1, .prefix = ""};
	int64_t V = cfg->vocab_size, D = cfg->hidden_size;
	TRY(plain(&w, BF16, 2, V, D, "embed.weight"));
	if (!cfg->tie_word_embeddings)
		TRY(plain(&w, BF16, 2, V, D, "head.weight"));
	TRY(plain(&w, BF16, 1, D, 0, "norm.weight"));
	TRY(hc_head(&w));
	for (int L = 0; L < cfg->n_layers_total; L++)
		TRY(layer(&w, L));
	return ST_OK;
}

static void part(struct model_schema_tensor *t, const struct model_schema_linear *l, const char *suffix,
		 enum model_tensor_role role, enum model_dtype dt, int n_dims, int64_t d0, int64_t d1)
{
	memset(t, 0, sizeof *t);
	snprintf(t->name, sizeof t->name, "%s%s", l->prefix, suffix);
	t->dtype = dt;
	t->n_dims = n_dims;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->layer = l->layer;
	t->group = l->group;
	t->role = role;
}

enum status model_schema_linear_parts(const struct model_config *cfg, const struct model_schema_linear *l,
				      enum model_weight_format fmt,
				      struct model_schema_tensor parts[MODEL_SCHEMA_MAX_PARTS], int *n_parts,
				      struct err *e)
{
	*n_parts = 0;
	int64_t out = l->out, in = l->in;
	switch (fmt) {
	case MODEL_FMT_BF16:
		part(&parts[0], l, ".weight", MODEL_ROLE_WEIGHT, MODEL_DTYPE_BF16, 2, out, in);
		*n_parts = 1;
		return ST_OK;
	case MODEL_FMT_F32:
		part(&parts[0], l, ".weight", MODEL_ROLE_WEIGHT, MODEL_DTYPE_F32, 2, out, in);
		*n_parts = 1;
		return ST_OK;
	case MODEL_FMT_FP8_BLOCK: {
		int64_t bo = cfg->quant.weight_block_size[0] > 0 ? cfg->quant.weight_block_size[0] : 128;
		int64_t bi = cfg->quant.weight_block_size[1] > 0 ? cfg->quant.weight_block_size[1] : 128;
		part(&parts[0], l, ".weight", MODEL_ROLE_WEIGHT, MODEL_DTYPE_F8_E4M3, 2, out, in);
		part(&parts[1], l, ".scale", MODEL_ROLE_SCALE, MODEL_DTYPE_F8_E8M0, 2, (out + bo - 1) / bo,
		     (in + bi - 1) / bi);
		*n_parts = 2;
		return ST_OK;
	}
	case MODEL_FMT_MXFP4:
		if (in % 32)
			return err_set(e, ST_INVALID, "tensor %s.weight: MXFP4 needs in (%lld) to be a multiple of 32",
				       l->prefix, (long long)in);
		part(&parts[0], l, ".weight", MODEL_ROLE_WEIGHT, MODEL_DTYPE_I8, 2, out, in / 2);
		part(&parts[1], l, ".scale", MODEL_ROLE_SCALE, MODEL_DTYPE_F8_E8M0, 2, out, in / 32);
		*n_parts = 2;
		return ST_OK;
	case MODEL_FMT_NVFP4:
		if (in % 16)
			return err_set(e, ST_INVALID, "tensor %s.weight: NVFP4 needs in (%lld) to be a multiple of 16",
				       l->prefix, (long long)in);
		part(&parts[0], l, ".weight", MODEL_ROLE_WEIGHT, MODEL_DTYPE_U8, 2, out, in / 2);
		part(&parts[1], l, ".weight_scale", MODEL_ROLE_SCALE, MODEL_DTYPE_F8_E4M3, 2, out, in / 16);
		part(&parts[2], l, ".weight_scale_2", MODEL_ROLE_WEIGHT_SCALE_2, MODEL_DTYPE_F32, 0, 0, 0);
		part(&parts[3], l, ".input_scale", MODEL_ROLE_INPUT_SCALE, MODEL_DTYPE_F32, 0, 0, 0);
		*n_parts = 4;
		return ST_OK;
	case MODEL_FMT_NONE:
	case MODEL_FMT_COUNT:
		break;
	}
	return err_set(e, ST_INVALID, "tensor %s.weight: no storage format", l->prefix);
}

enum model_weight_format model_format_of_weight_dtype(enum model_dtype dt)
{
	switch (dt) {
	case MODEL_DTYPE_BF16: return MODEL_FMT_BF16;
	case MODEL_DTYPE_F32: return MODEL_FMT_F32;
	case MODEL_DTYPE_F8_E4M3: return MODEL_FMT_FP8_BLOCK;
	case MODEL_DTYPE_I8: return MODEL_FMT_MXFP4;
	case MODEL_DTYPE_U8: return MODEL_FMT_NVFP4;
	default: return MODEL_FMT_NONE;
	}
}

bool model_format_is_quantized(enum model_weight_format f)
{
	return f == MODEL_FMT_FP8_BLOCK || f == MODEL_FMT_MXFP4 || f == MODEL_FMT_NVFP4;
}

const char *model_weight_format_str(enum model_weight_format f)
{
	switch (f) {
	case MODEL_FMT_NONE: return "-";
	case MODEL_FMT_BF16: return "BF16";
	case MODEL_FMT_F32: return "F32";
	case MODEL_FMT_FP8_BLOCK: return "FP8";
	case MODEL_FMT_MXFP4: return "MXFP4";
	case MODEL_FMT_NVFP4: return "NVFP4";
	case MODEL_FMT_COUNT: break;
	}
	return "?";
}

const char *model_group_str(enum model_group g)
{
	switch (g) {
	case MODEL_GROUP_OTHER: return "other";
	case MODEL_GROUP_ATTN: return "attention";
	case MODEL_GROUP_SHARED_EXPERTS: return "shared experts";
	case MODEL_GROUP_ROUTED_EXPERTS: return "routed experts";
	case MODEL_GROUP_MTP_PROJ: return "mtp projections";
	case MODEL_GROUP_COUNT: break;
	}
	return "?";
}
