/*
 * model/config.c: config.json -> struct model_config, with validation.
 *
 * Owns the one place where the config's fields are read and checked. The JSON
 * tree (jansson) lives only inside model_config_parse(); what leaves is the
 * plain struct. Each check produces a message naming the file and the field
 * so that a bad checkpoint is diagnosed before any tensor is touched.
 * Both the release's key set and the one transformers' DeepseekV4Config
 * writes are read here (config.h says which keys), and the 0731 release's
 * DSpark draft keys; model_config_set_draft_stages() settles the draft model
 * once the checkpoint's tensor names are known.
 */
#include "model/config.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/log.h"

/* ---- Typed field readers ---- */

/* Parse context: the file name for messages. */
struct cfg_ctx {
	const char *file;
	struct err *e;
	json_t *root;
};

static enum status field_int(const struct cfg_ctx *c, json_t *obj, const char *prefix, const char *key,
			     bool required, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (required)
			return err_set(c->e, ST_INVALID, "%s: field %s%s: missing", c->file, prefix, key);
		*out = def;
		return ST_OK;
	}
	if (!json_is_integer(v))
		return err_set(c->e, ST_INVALID, "%s: field %s%s: must be an integer", c->file, prefix, key);
	json_int_t x = json_integer_value(v);
	if (x < lo || x > hi)
		return err_set(c->e, ST_INVALID, "%s: field %s%s: %lld out of range [%lld, %lld]", c->file,
			       prefix, key, (long long)x, (long long)lo, (long long)hi);
	*out = (int64_t)x;
	return ST_OK;
}

/* A real number; JSON integers are accepted too (10 for 10.0). lo_open makes
 * the lower bound exclusive (for "must be > 0"). */
static enum status field_real(const struct cfg_ctx *c, json_t *obj, const char *prefix, const char *key,
			      bool required, double def, double lo, bool lo_open, double hi, double *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (required)
			return err_set(c->e, ST_INVALID, "%s: field %s%s: missing", c->file, prefix, key);
		*out = def;
		return ST_OK;
	}
	if (!json_is_number(v))
		return err_set(c->e, ST_INVALID, "%s: field %s%s: must be a number", c->file, prefix, key);
	double x = json_number_value(v);
	if (!isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
		return err_set(c->e, ST_INVALID, "%s: field %s%s: %g out of range %s%g, %g]", c->file, prefix,
			       key, x, lo_open ? "(" : "[", lo, hi);
	*out = x;
	return ST_OK;
}

static enum status field_bool(const struct cfg_ctx *c, json_t *obj, const char *key, bool required,
			      bool def, bool *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (required)
			return err_set(c->e, ST_INVALID, "%s: field %s: missing", c->file, key);
		*out = def;
		return ST_OK;
	}
	if (!json_is_boolean(v))
		return err_set(c->e, ST_INVALID, "%s: field %s: must be true or false", c->file, key);
	*out = json_is_true(v);
	return ST_OK;
}

static enum status field_str(const struct cfg_ctx *c, json_t *obj, const char *prefix, const char *key,
			     bool required, char out[MODEL_CONFIG_STR_BYTES])
{
	out[0] = '\0';
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (required)
			return err_set(c->e, ST_INVALID, "%s: field %s%s: missing", c->file, prefix, key);
		return ST_OK;
	}
	if (!json_is_string(v))
		return err_set(c->e, ST_INVALID, "%s: field %s%s: must be a string", c->file, prefix, key);
	size_t n = json_string_length(v);
	const char *s = json_string_value(v);
	if (n >= MODEL_CONFIG_STR_BYTES || strlen(s) != n)
		return err_set(c->e, ST_INVALID, "%s: field %s%s: string too long or contains NUL", c->file,
			       prefix, key);
	memcpy(out, s, n + 1);
	return ST_OK;
}

/* A string field that must equal one of the values this program implements. */
static enum status field_str_one_of(const struct cfg_ctx *c, json_t *obj, const char *prefix,
				    const char *key, bool required, const char *const *allowed,
				    char out[MODEL_CONFIG_STR_BYTES])
{
	enum status st = field_str(c, obj, prefix, key, required, out);
	if (st != ST_OK || !out[0])
		return st;
	for (const char *const *a = allowed; *a; a++)
		if (!strcmp(out, *a))
			return ST_OK;
	return err_set(c->e, ST_UNSUPPORTED, "%s: field %s%s: \"%s\" is not supported (expected \"%s\")",
		       c->file, prefix, key, out, allowed[0]);
}

#define TRY(expr)                                  \
	do {                                       \
		enum status st_ = (expr);          \
		if (st_ != ST_OK)                  \
			return st_;                \
	} while (0)

#define INT_REQ(key, lo, hi) TRY(field_int(c, root, "", #key, true, 0, (lo), (hi), &cfg->key))

/* ---- Sections ---- */

/* architectures must name DeepseekV4ForCausalLM. */
static enum status parse_architectures(const struct cfg_ctx *c, json_t *arch)
{
	if (!arch)
		return err_set(c->e, ST_INVALID, "%s: field architectures: missing", c->file);
	if (!json_is_array(arch) || json_array_size(arch) == 0)
		return err_set(c->e, ST_INVALID, "%s: field architectures: must be a non-empty array of strings",
			       c->file);
	bool found = false;
	size_t i;
	json_t *a;
	json_array_foreach(arch, i, a) {
		if (!json_is_string(a))
			return err_set(c->e, ST_INVALID, "%s: field architectures[%zu]: must be a string", c->file, i);
		if (!strcmp(json_string_value(a), "DeepseekV4ForCausalLM"))
			found = true;
	}
	if (!found)
		return err_set(c->e, ST_UNSUPPORTED,
			       "%s: field architectures: \"%s\" is not DeepseekV4ForCausalLM", c->file,
			       json_is_string(json_array_get(arch, 0)) ? json_string_value(json_array_get(arch, 0)) : "?");
	return ST_OK;
}

static enum status parse_identity(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	json_t *arch = json_object_get(root, "architectures");
	json_t *mt_v = json_object_get(root, "model_type");
	/* DeepseekV4Config.save_pretrained() without a model writes no
	 * architectures: model_type deepseek_v4 names the model then */
	bool hf_bare = (!arch || json_is_null(arch)) && json_is_string(mt_v) &&
		       !strcmp(json_string_value(mt_v), "deepseek_v4");
	if (!hf_bare)
		TRY(parse_architectures(c, arch));
	snprintf(cfg->architecture, sizeof cfg->architecture, "DeepseekV4ForCausalLM");
	static const char *const mt[] = {"deepseek_v4", NULL};
	TRY(field_str_one_of(c, root, "", "model_type", false, mt, cfg->model_type));
	TRY(field_str(c, root, "", "torch_dtype", false, cfg->torch_dtype));
	if (!cfg->torch_dtype[0]) /* transformers 5 writes "dtype" */
		TRY(field_str(c, root, "", "dtype", false, cfg->torch_dtype));
	TRY(field_str(c, root, "", "transformers_version", false, cfg->transformers_version));
	return ST_OK;
}

/* rope_parameters.<which> when it is an object (transformers' nesting), else NULL. */
static json_t *rope_params(json_t *root, const char *which)
{
	json_t *rp = json_object_get(root, "rope_parameters");
	json_t *v = json_is_object(rp) ? json_object_get(rp, which) : NULL;
	return json_is_object(v) ? v : NULL;
}

/* qk_rope_head_dim, or transformers' partial_rotary_factor x head_dim. */
static enum status parse_rope_dim(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	if (json_object_get(root, "qk_rope_head_dim"))
		return field_int(c, root, "", "qk_rope_head_dim", true, 0, 0, 65536, &cfg->qk_rope_head_dim);
	json_t *obj = root;
	const char *prefix = "";
	if (!json_object_get(root, "partial_rotary_factor") && rope_params(root, "main")) {
		obj = rope_params(root, "main");
		prefix = "rope_parameters.main.";
	}
	if (!json_object_get(obj, "partial_rotary_factor"))
		return err_set(c->e, ST_INVALID, "%s: field qk_rope_head_dim: missing", c->file);
	double f;
	TRY(field_real(c, obj, prefix, "partial_rotary_factor", true, 0, 0, false, 1, &f));
	double dims = f * (double)cfg->head_dim;
	if (fabs(dims - nearbyint(dims)) > 1e-6)
		return err_set(c->e, ST_INVALID, "%s: field %spartial_rotary_factor: %g x head_dim %lld is not a whole "
			       "number of dims", c->file, prefix, f, (long long)cfg->head_dim);
	cfg->qk_rope_head_dim = (int64_t)nearbyint(dims);
	cfg->hf_style = true;
	return ST_OK;
}

/* num_hash_layers, or the leading "hash_moe" entries of transformers'
 * mlp_layer_types; both present must agree. */
static enum status parse_hash_layers(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	json_t *types = json_object_get(root, "mlp_layer_types");
	bool have_n = json_object_get(root, "num_hash_layers") != NULL;
	if (have_n)
		TRY(field_int(c, root, "", "num_hash_layers", true, 0, 0, MODEL_MAX_LAYERS, &cfg->num_hash_layers));
	if (!types || json_is_null(types)) {
		if (!have_n)
			return err_set(c->e, ST_INVALID, "%s: field num_hash_layers: missing", c->file);
		return ST_OK;
	}
	if (!json_is_array(types) || json_array_size(types) < (size_t)cfg->num_hidden_layers)
		return err_set(c->e, ST_INVALID, "%s: field mlp_layer_types: must be an array of %lld strings", c->file,
			       (long long)cfg->num_hidden_layers);
	int64_t n_hash = 0;
	for (size_t i = 0; i < (size_t)cfg->num_hidden_layers; i++) {
		const char *t = json_string_value(json_array_get(types, i));
		bool hash = t && !strcmp(t, "hash_moe");
		if (!t || (!hash && strcmp(t, "moe")))
			return err_set(c->e, ST_INVALID, "%s: field mlp_layer_types[%zu]: must be \"hash_moe\" or \"moe\"",
				       c->file, i);
		if (hash && n_hash != (int64_t)i)
			return err_set(c->e, ST_UNSUPPORTED,
				       "%s: field mlp_layer_types[%zu]: hash_moe after a moe layer (hash layers come first)",
				       c->file, i);
		n_hash += hash;
	}
	if (have_n && n_hash != cfg->num_hash_layers)
		return err_set(c->e, ST_INVALID, "%s: field mlp_layer_types: %lld hash_moe layers contradict num_hash_layers "
			       "%lld", c->file, (long long)n_hash, (long long)cfg->num_hash_layers);
	cfg->num_hash_layers = n_hash;
	cfg->hf_style = true;
	return ST_OK;
}

/* eos_token_id: an integer, or (transformers) a list whose first entry is used. */
static enum status parse_eos(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	json_t *v = json_object_get(root, "eos_token_id");
	if (json_is_array(v)) {
		if (json_array_size(v) == 0 || !json_is_integer(json_array_get(v, 0)))
			return err_set(c->e, ST_INVALID, "%s: field eos_token_id: must be an integer or a list of them",
				       c->file);
		v = json_array_get(v, 0);
		json_int_t x = json_integer_value(v);
		if (x < 0 || x > MODEL_MAX_VOCAB)
			return err_set(c->e, ST_INVALID, "%s: field eos_token_id[0]: %lld out of range", c->file,
				       (long long)x);
		cfg->eos_token_id = x;
		return ST_OK;
	}
	return field_int(c, root, "", "eos_token_id", true, 0, 0, MODEL_MAX_VOCAB, &cfg->eos_token_id);
}

static enum status parse_sizes(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	INT_REQ(vocab_size, 1, MODEL_MAX_VOCAB);
	INT_REQ(hidden_size, 1, MODEL_MAX_DIM);
	INT_REQ(num_hidden_layers, 1, MODEL_MAX_LAYERS - 16);
	INT_REQ(num_nextn_predict_layers, 0, 16);
	INT_REQ(num_attention_heads, 1, 4096);
	INT_REQ(num_key_value_heads, 1, 4096);
	INT_REQ(head_dim, 1, 65536);
	TRY(parse_rope_dim(c, root, cfg));
	INT_REQ(q_lora_rank, 1, MODEL_MAX_DIM);
	INT_REQ(o_groups, 1, 4096);
	INT_REQ(o_lora_rank, 1, MODEL_MAX_DIM);
	INT_REQ(max_position_embeddings, 1, (int64_t)1 << 40);
	INT_REQ(moe_intermediate_size, 1, MODEL_MAX_DIM);
	INT_REQ(n_routed_experts, 1, MODEL_MAX_EXPERTS);
	INT_REQ(n_shared_experts, 0, 64);
	INT_REQ(num_experts_per_tok, 1, MODEL_MAX_EXPERTS);
	TRY(parse_hash_layers(c, root, cfg));
	INT_REQ(sliding_window, 1, (int64_t)1 << 30);
	INT_REQ(index_n_heads, 0, 4096);
	INT_REQ(index_head_dim, 0, 65536);
	INT_REQ(index_topk, -((int64_t)1 << 30), (int64_t)1 << 30); /* sign checked with the layer mix */
	INT_REQ(hc_mult, 1, 64);
	INT_REQ(hc_sinkhorn_iters, 1, 100000);
	INT_REQ(bos_token_id, 0, MODEL_MAX_VOCAB);
	TRY(parse_eos(c, root, cfg));
	return ST_OK;
}

static enum status parse_scalars(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	static const char *const scoring[] = {"sqrtsoftplus", NULL};
	static const char *const topk[] = {"noaux_tc", NULL};
	static const char *const act[] = {"silu", NULL};
	TRY(field_str_one_of(c, root, "", "scoring_func", true, scoring, cfg->scoring_func));
	TRY(field_str_one_of(c, root, "", "topk_method", false, topk, cfg->topk_method));
	if (!cfg->topk_method[0]) /* transformers' config has no topk_method: V4 routes noaux_tc */
		snprintf(cfg->topk_method, sizeof cfg->topk_method, "noaux_tc");
	TRY(field_str_one_of(c, root, "", "hidden_act", true, act, cfg->hidden_act));
	TRY(field_bool(c, root, "norm_topk_prob", true, false, &cfg->norm_topk_prob));
	TRY(field_real(c, root, "", "routed_scaling_factor", true, 0, 0, true, 1e6, &cfg->routed_scaling_factor));
	TRY(field_real(c, root, "", "swiglu_limit", true, 0, 0, true, 1e30, &cfg->swiglu_limit));
	json_t *rp_main = rope_params(root, "main"), *rp_cmp = rope_params(root, "compress");
	if (!json_object_get(root, "rope_theta") && rp_main)
		TRY(field_real(c, rp_main, "rope_parameters.main.", "rope_theta", true, 0, 0, true, 1e30, &cfg->rope_theta));
	else
		TRY(field_real(c, root, "", "rope_theta", true, 0, 0, true, 1e30, &cfg->rope_theta));
	if (!json_object_get(root, "compress_rope_theta") && rp_cmp)
		TRY(field_real(c, rp_cmp, "rope_parameters.compress.", "rope_theta", true, 0, 0, true, 1e30,
			       &cfg->compress_rope_theta));
	else
		TRY(field_real(c, root, "", "compress_rope_theta", true, 0, 0, true, 1e30, &cfg->compress_rope_theta));
	TRY(field_real(c, root, "", "hc_eps", true, 0, 0, true, 1, &cfg->hc_eps));
	TRY(field_real(c, root, "", "rms_norm_eps", true, 0, 0, true, 1, &cfg->rms_norm_eps));
	TRY(field_bool(c, root, "tie_word_embeddings", false, false, &cfg->tie_word_embeddings));
	TRY(field_bool(c, root, "attention_bias", false, false, &cfg->attention_bias));
	TRY(field_bool(c, root, "use_cache", false, true, &cfg->use_cache));
	TRY(field_real(c, root, "", "attention_dropout", false, 0, 0, false, 1, &cfg->attention_dropout));
	TRY(field_real(c, root, "", "initializer_range", false, 0.02, 0, false, 1e6, &cfg->initializer_range));
	return ST_OK;
}

/* One compress ratio: 0, 4 or a power of two up to the limit. */
static enum status check_ratio(const struct cfg_ctx *c, const char *key, size_t i, json_int_t x)
{
	bool pow2 = x >= 4 && x <= MODEL_MAX_COMPRESS_RATIO && (x & (x - 1)) == 0;
	if (x != 0 && !pow2)
		return err_set(c->e, ST_INVALID,
			       "%s: field %s[%zu]: %lld is not 0 (sliding), 4 (CSA) or a power of two >= 4 up to %d (HCA)",
			       c->file, key, i, (long long)x, MODEL_MAX_COMPRESS_RATIO);
	return ST_OK;
}

/* transformers' layer_types (+ compress_rates) as ratios into r[]; *n entries. */
static enum status parse_layer_types(const struct cfg_ctx *c, json_t *root, int32_t *r, size_t *n)
{
	json_t *lt = json_object_get(root, "layer_types");
	if (!json_is_array(lt))
		return err_set(c->e, ST_INVALID, "%s: field layer_types: must be an array of strings", c->file);
	if (json_array_size(lt) > MODEL_MAX_LAYERS)
		return err_set(c->e, ST_INVALID, "%s: field layer_types: more than %d entries", c->file, MODEL_MAX_LAYERS);
	int64_t csa = 4, hca = 128;
	json_t *rates = json_object_get(root, "compress_rates");
	if (rates && !json_is_null(rates)) {
		if (!json_is_object(rates))
			return err_set(c->e, ST_INVALID, "%s: field compress_rates: must be an object", c->file);
		TRY(field_int(c, rates, "compress_rates.", "compressed_sparse_attention", false, 4, 4, 4, &csa));
		TRY(field_int(c, rates, "compress_rates.", "heavily_compressed_attention", false, 128, 4,
			      MODEL_MAX_COMPRESS_RATIO, &hca));
		TRY(check_ratio(c, "compress_rates.heavily_compressed_attention", 0, hca));
	}
	*n = json_array_size(lt);
	for (size_t i = 0; i < *n; i++) {
		const char *t = json_string_value(json_array_get(lt, i));
		if (t && !strcmp(t, "sliding_attention"))
			r[i] = 0;
		else if (t && !strcmp(t, "compressed_sparse_attention"))
			r[i] = (int32_t)csa;
		else if (t && !strcmp(t, "heavily_compressed_attention"))
			r[i] = (int32_t)hca;
		else
			return err_set(c->e, ST_INVALID,
				       "%s: field layer_types[%zu]: must be sliding_attention, compressed_sparse_attention or "
				       "heavily_compressed_attention", c->file, i);
	}
	return ST_OK;
}

/* The dspark_* keys (0731): all four or none. */
static enum status parse_dspark(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	struct model_dspark_config *d = &cfg->dspark;
	static const char *const keys[] = {"dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids",
					   "dspark_markov_rank"};
	int n_present = 0;
	for (size_t i = 0; i < 4; i++) {
		json_t *v = json_object_get(root, keys[i]);
		n_present += v && !json_is_null(v);
	}
	if (n_present == 0)
		return ST_OK;
	for (size_t i = 0; i < 4; i++)
		if (!json_object_get(root, keys[i]) || json_is_null(json_object_get(root, keys[i])))
			return err_set(c->e, ST_INVALID, "%s: field %s: missing (the other dspark_* keys are present)",
				       c->file, keys[i]);
	d->present = true;
	TRY(field_int(c, root, "", "dspark_block_size", true, 0, 1, 64, &d->block_size));
	TRY(field_int(c, root, "", "dspark_noise_token_id", true, 0, 0, cfg->vocab_size - 1, &d->noise_token_id));
	TRY(field_int(c, root, "", "dspark_markov_rank", true, 0, 1, MODEL_MAX_DIM, &d->markov_rank));
	json_t *ids = json_object_get(root, "dspark_target_layer_ids");
	if (!json_is_array(ids) || json_array_size(ids) == 0 || json_array_size(ids) > MODEL_MAX_DSPARK_TARGETS)
		return err_set(c->e, ST_INVALID, "%s: field dspark_target_layer_ids: must be an array of 1 to %d layer "
			       "indices", c->file, MODEL_MAX_DSPARK_TARGETS);
	d->n_target_layers = (int)json_array_size(ids);
	for (int i = 0; i < d->n_target_layers; i++) {
		json_t *x = json_array_get(ids, (size_t)i);
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) >= cfg->num_hidden_layers)
			return err_set(c->e, ST_INVALID,
				       "%s: field dspark_target_layer_ids[%d]: must be a main layer index in [0, %lld]",
				       c->file, i, (long long)cfg->num_hidden_layers - 1);
		d->target_layer_ids[i] = json_integer_value(x);
	}
	return ST_OK;
}

/*
 * The layer schedule: compress_ratios (release) and/or layer_types
 * (transformers; they must agree where both are given), then the draft
 * layers. With the dspark_* keys, the entries past num_hidden_layers are the
 * DSpark stages (sliding; 0731 has 3); without them num_nextn_predict_layers
 * NextN layers follow and any further entries are ignored.
 */
static enum status parse_compress_ratios(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	TRY(parse_dspark(c, root, cfg));
	json_t *v = json_object_get(root, "compress_ratios");
	json_t *lt = json_object_get(root, "layer_types");
	bool have_cr = v && !json_is_null(v), have_lt = lt && !json_is_null(lt);
	size_t n = 0, n_lt = 0;
	int32_t lt_local[MODEL_MAX_LAYERS];
	if (have_lt) {
		TRY(parse_layer_types(c, root, lt_local, &n_lt));
		cfg->hf_style = true;
	}
	if (have_cr) {
		if (!json_is_array(v))
			return err_set(c->e, ST_INVALID, "%s: field compress_ratios: must be an array", c->file);
		n = json_array_size(v);
		if (n > MODEL_MAX_LAYERS)
			return err_set(c->e, ST_INVALID, "%s: field compress_ratios: more than %d entries", c->file,
				       MODEL_MAX_LAYERS);
		for (size_t i = 0; i < n; i++) {
			json_t *r = json_array_get(v, i);
			if (!json_is_integer(r))
				return err_set(c->e, ST_INVALID, "%s: field compress_ratios[%zu]: must be an integer",
					       c->file, i);
			TRY(check_ratio(c, "compress_ratios", i, json_integer_value(r)));
			cfg->compress_ratios[i] = (int32_t)json_integer_value(r);
		}
		for (size_t i = 0; i < n_lt && i < n; i++)
			if (lt_local[i] != cfg->compress_ratios[i])
				return err_set(c->e, ST_INVALID, "%s: field layer_types[%zu]: ratio %d contradicts "
					       "compress_ratios[%zu] %d", c->file, i, lt_local[i], i,
					       cfg->compress_ratios[i]);
	} else if (have_lt) {
		n = n_lt;
		memcpy(cfg->compress_ratios, lt_local, n * sizeof *lt_local);
	} else {
		return err_set(c->e, ST_INVALID, "%s: field compress_ratios: missing", c->file);
	}
	cfg->n_compress_ratios = (int)n;
	int64_t n_main = cfg->num_hidden_layers;
	const char *key = have_cr ? "compress_ratios" : "layer_types";
	if ((int64_t)n < n_main)
		return err_set(c->e, ST_INVALID, "%s: field %s: has %zu entries, expected at least %lld (num_hidden_layers)",
			       c->file, key, n, (long long)n_main);
	if (cfg->dspark.present) {
		/* stages beyond the listed ones (transformers keeps num_hidden_layers
		 * entries only) are sliding too; the tensors settle how many exist */
		int listed = (int)((int64_t)n - n_main);
		cfg->draft_kind = MODEL_DRAFT_DSPARK;
		cfg->n_draft_layers_max = listed > 0 ? listed : MODEL_MAX_DRAFT_LAYERS;
		if (cfg->n_draft_layers_max > MODEL_MAX_DRAFT_LAYERS)
			return err_set(c->e, ST_INVALID, "%s: field %s: %d DSpark stages past num_hidden_layers (at most %d)",
				       c->file, key, listed, MODEL_MAX_DRAFT_LAYERS);
		cfg->n_draft_layers = listed > 0 ? listed : cfg->dspark.n_target_layers;
		for (int i = 0; i < MODEL_MAX_DRAFT_LAYERS; i++) {
			size_t at = (size_t)n_main + (size_t)i;
			if (at < n && cfg->compress_ratios[at] != 0)
				return err_set(c->e, ST_INVALID, "%s: field %s[%zu]: %d for DSpark stage %d (draft stages are "
					       "sliding-window blocks, ratio 0)", c->file, key, at, cfg->compress_ratios[at], i);
			if (at >= n)
				cfg->compress_ratios[at] = 0;
		}
	} else {
		int64_t nextn = cfg->num_nextn_predict_layers;
		cfg->draft_kind = nextn > 0 ? MODEL_DRAFT_MTP : MODEL_DRAFT_NONE;
		cfg->n_draft_layers = cfg->n_draft_layers_max = (int)nextn;
		if ((int64_t)n < n_main + nextn) {
			if (have_cr)
				return err_set(c->e, ST_INVALID,
					       "%s: field compress_ratios: has %zu entries, expected %lld (num_hidden_layers "
					       "%lld + num_nextn_predict_layers %lld)", c->file, n, (long long)(n_main + nextn),
					       (long long)n_main, (long long)nextn);
			/* transformers lists the main layers only: NextN layers are sliding */
			for (int64_t i = (int64_t)n; i < n_main + nextn; i++)
				cfg->compress_ratios[i] = 0;
		} else if ((int64_t)n > n_main + nextn) {
			log_msg(LOG_INFO, "config", "%s: %s has %zu entries; the %lld past num_hidden_layers %lld + "
				"num_nextn_predict_layers %lld are ignored", c->file, key, n,
				(long long)((int64_t)n - n_main - nextn), (long long)n_main, (long long)nextn);
		}
	}
	cfg->n_layers_total = (int)(n_main + cfg->n_draft_layers);
	return ST_OK;
}

static enum status parse_rope_scaling(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	struct model_rope_scaling *rs = &cfg->rope_scaling;
	memset(rs, 0, sizeof *rs);
	json_t *v = json_object_get(root, "rope_scaling");
	const char *p = "rope_scaling.";
	if ((!v || json_is_null(v)) && rope_params(root, "compress")) {
		/* transformers: rope_parameters.compress is the compressed layers'
		 * rope ("default": plain RoPE everywhere, as transformers runs it) */
		cfg->hf_style = true;
		json_t *m = rope_params(root, "main");
		char mt[MODEL_CONFIG_STR_BYTES] = "";
		if (m)
			TRY(field_str(c, m, "rope_parameters.main.", "rope_type", false, mt));
		if (mt[0] && strcmp(mt, "default"))
			return err_set(c->e, ST_UNSUPPORTED, "%s: field rope_parameters.main.rope_type: \"%s\" is not "
				       "supported (default)", c->file, mt);
		v = rope_params(root, "compress");
		p = "rope_parameters.compress.";
		char ct[MODEL_CONFIG_STR_BYTES] = "";
		TRY(field_str(c, v, p, json_object_get(v, "rope_type") ? "rope_type" : "type", false, ct));
		if (!ct[0] || !strcmp(ct, "default"))
			return ST_OK;
	}
	if (!v || json_is_null(v))
		return ST_OK;
	if (!json_is_object(v))
		return err_set(c->e, ST_INVALID, "%s: field rope_scaling: must be an object or null", c->file);
	char type[MODEL_CONFIG_STR_BYTES];
	/* HF writes "rope_type", the original checkpoint "type". */
	const char *tk = json_object_get(v, "type") ? "type" : "rope_type";
	TRY(field_str(c, v, p, tk, true, type));
	if (strcmp(type, "yarn"))
		return err_set(c->e, ST_UNSUPPORTED, "%s: field %s%s: \"%s\" is not supported (yarn)", c->file, p, tk,
			       type);
	rs->type = MODEL_ROPE_SCALING_YARN;
	TRY(field_real(c, v, p, "factor", true, 0, 1, false, 1e6, &rs->factor));
	TRY(field_int(c, v, p, "original_max_position_embeddings", true, 0, 1, (int64_t)1 << 40,
		      &rs->original_max_position_embeddings));
	TRY(field_real(c, v, p, "beta_fast", false, 32, 0, true, 1e6, &rs->beta_fast));
	TRY(field_real(c, v, p, "beta_slow", false, 1, 0, true, 1e6, &rs->beta_slow));
	if (rs->beta_fast < rs->beta_slow)
		return err_set(c->e, ST_INVALID, "%s: field %sbeta_fast: %g is below beta_slow %g", c->file, p,
			       rs->beta_fast, rs->beta_slow);
	return ST_OK;
}

static enum status parse_string_list(const struct cfg_ctx *c, json_t *q, const char *key, int *n_out,
				     bool *matches_mtp)
{
	*n_out = 0;
	json_t *v = json_object_get(q, key);
	if (!v || json_is_null(v))
		return ST_OK;
	if (!json_is_array(v))
		return err_set(c->e, ST_INVALID, "%s: field quantization_config.%s: must be an array of strings",
			       c->file, key);
	size_t i;
	json_t *s;
	json_array_foreach(v, i, s) {
		if (!json_is_string(s))
			return err_set(c->e, ST_INVALID, "%s: field quantization_config.%s[%zu]: must be a string",
				       c->file, key, i);
		if (matches_mtp && (fnmatch(json_string_value(s), "mtp.0.ffn.experts.0.w1", 0) == 0 ||
				    fnmatch(json_string_value(s), "mtp.0.ffn.experts", 0) == 0))
			*matches_mtp = true;
	}
	if (json_array_size(v) > 1000000)
		return err_set(c->e, ST_INVALID, "%s: field quantization_config.%s: more than 1000000 entries", c->file,
			       key);
	*n_out = (int)json_array_size(v);
	return ST_OK;
}

static enum status parse_quant(const struct cfg_ctx *c, json_t *root, struct model_config *cfg)
{
	struct model_quant_config *q = &cfg->quant;
	memset(q, 0, sizeof *q);
	static const char *const ed[] = {"fp4", "fp8", "bf16", NULL};
	char expert_dtype[MODEL_CONFIG_STR_BYTES];
	TRY(field_str_one_of(c, root, "", "expert_dtype", false, ed, expert_dtype));
	json_t *qc = json_object_get(root, "quantization_config");
	if (!expert_dtype[0] && json_is_object(qc)) /* transformers moves it into quantization_config */
		TRY(field_str_one_of(c, qc, "quantization_config.", "expert_dtype", false, ed, expert_dtype));
	cfg->expert_dtype = !expert_dtype[0]                 ? MODEL_EXPERT_DTYPE_ABSENT
			    : !strcmp(expert_dtype, "fp4") ? MODEL_EXPERT_DTYPE_FP4
			    : !strcmp(expert_dtype, "fp8") ? MODEL_EXPERT_DTYPE_FP8
							   : MODEL_EXPERT_DTYPE_BF16;

	json_t *v = json_object_get(root, "quantization_config");
	if (!v || json_is_null(v))
		return ST_OK;
	if (!json_is_object(v))
		return err_set(c->e, ST_INVALID, "%s: field quantization_config: must be an object", c->file);
	q->present = true;
	static const char *const method[] = {"fp8", NULL};
	static const char *const fmt[] = {"e4m3", NULL};
	static const char *const sfmt[] = {"ue8m0", NULL};
	static const char *const act[] = {"dynamic", NULL};
	static const char *const moe[] = {"NVFP4", NULL};
	const char *p = "quantization_config.";
	TRY(field_str_one_of(c, v, p, "quant_method", true, method, q->quant_method));
	TRY(field_str_one_of(c, v, p, "fmt", true, fmt, q->fmt));
	TRY(field_str_one_of(c, v, p, "scale_fmt", false, sfmt, q->scale_fmt));
	TRY(field_str_one_of(c, v, p, "activation_scheme", false, act, q->activation_scheme));
	TRY(field_str(c, v, p, "quant_algo", false, q->quant_algo));
	TRY(field_str_one_of(c, v, p, "moe_quant_algo", false, moe, q->moe_quant_algo));
	q->moe_nvfp4 = !strcmp(q->moe_quant_algo, "NVFP4");
	TRY(field_int(c, v, p, "group_size", false, 0, 1, 4096, &q->group_size));
	if (q->moe_nvfp4 && q->group_size == 0)
		q->group_size = 16;
	if (q->moe_nvfp4 && q->group_size != 16)
		return err_set(c->e, ST_UNSUPPORTED,
			       "%s: field quantization_config.group_size: %lld with moe_quant_algo NVFP4 (only 16)",
			       c->file, (long long)q->group_size);

	json_t *bs = json_object_get(v, "weight_block_size");
	if (!bs || json_is_null(bs))
		return err_set(c->e, ST_INVALID, "%s: field quantization_config.weight_block_size: missing", c->file);
	if (!json_is_array(bs) || json_array_size(bs) != 2)
		return err_set(c->e, ST_INVALID,
			       "%s: field quantization_config.weight_block_size: must be an array of 2 integers",
			       c->file);
	for (size_t i = 0; i < 2; i++) {
		json_t *x = json_array_get(bs, i);
		if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 65536)
			return err_set(c->e, ST_INVALID,
				       "%s: field quantization_config.weight_block_size[%zu]: must be an integer in "
				       "[1, 65536]",
				       c->file, i);
		q->weight_block_size[i] = json_integer_value(x);
	}
	TRY(parse_string_list(c, v, "quantized_layers", &q->n_quantized_layers, &q->quantized_mtp));
	TRY(parse_string_list(c, v, "ignore", &q->n_ignore, &q->ignore_mtp));
	return ST_OK;
}

/* ---- Cross-field consistency ---- */

static enum status validate(const struct cfg_ctx *c, struct model_config *cfg)
{
	const char *f = c->file;
	struct err *e = c->e;
	if (cfg->num_key_value_heads != 1)
		return err_set(e, ST_UNSUPPORTED,
			       "%s: field num_key_value_heads: %lld (DeepSeek-V4 has one shared K=V head)", f,
			       (long long)cfg->num_key_value_heads);
	if (cfg->num_attention_heads % cfg->o_groups)
		return err_set(e, ST_INVALID, "%s: field o_groups: %lld does not divide num_attention_heads %lld", f,
			       (long long)cfg->o_groups, (long long)cfg->num_attention_heads);
	if (cfg->head_dim < cfg->qk_rope_head_dim)
		return err_set(e, ST_INVALID, "%s: field head_dim: %lld is smaller than qk_rope_head_dim %lld", f,
			       (long long)cfg->head_dim, (long long)cfg->qk_rope_head_dim);
	if (cfg->qk_rope_head_dim % 2)
		return err_set(e, ST_INVALID, "%s: field qk_rope_head_dim: %lld must be even (rope pairs)", f,
			       (long long)cfg->qk_rope_head_dim);
	if (cfg->num_hash_layers > cfg->num_hidden_layers)
		return err_set(e, ST_INVALID, "%s: field num_hash_layers: %lld exceeds num_hidden_layers %lld", f,
			       (long long)cfg->num_hash_layers, (long long)cfg->num_hidden_layers);
	if (cfg->num_experts_per_tok > cfg->n_routed_experts)
		return err_set(e, ST_INVALID, "%s: field num_experts_per_tok: %lld exceeds n_routed_experts %lld", f,
			       (long long)cfg->num_experts_per_tok, (long long)cfg->n_routed_experts);
	if (cfg->bos_token_id >= cfg->vocab_size || cfg->eos_token_id >= cfg->vocab_size)
		return err_set(e, ST_INVALID, "%s: field %s: %lld is not below vocab_size %lld", f,
			       cfg->bos_token_id >= cfg->vocab_size ? "bos_token_id" : "eos_token_id",
			       (long long)(cfg->bos_token_id >= cfg->vocab_size ? cfg->bos_token_id
										 : cfg->eos_token_id),
			       (long long)cfg->vocab_size);
	if (cfg->attention_bias)
		return err_set(e, ST_UNSUPPORTED, "%s: field attention_bias: true is not supported", f);
	if (cfg->o_groups * cfg->o_lora_rank > MODEL_MAX_DIM ||
	    cfg->num_attention_heads * cfg->head_dim > MODEL_MAX_DIM * 4 ||
	    cfg->hc_mult * cfg->hidden_size > MODEL_MAX_DIM * 4)
		return err_set(e, ST_INVALID, "%s: field num_attention_heads: derived widths are too large", f);

	bool any_csa = false, any_compressed = false;
	for (int i = 0; i < cfg->n_layers_total; i++) {
		any_csa |= cfg->compress_ratios[i] == 4;
		any_compressed |= cfg->compress_ratios[i] != 0;
	}
	if (any_csa) {
		if (cfg->index_topk <= 0)
			return err_set(e, ST_INVALID, "%s: field index_topk: %lld must be > 0 with CSA layers", f,
				       (long long)cfg->index_topk);
		if (cfg->index_n_heads <= 0)
			return err_set(e, ST_INVALID, "%s: field index_n_heads: %lld must be > 0 with CSA layers", f,
				       (long long)cfg->index_n_heads);
		if (cfg->index_head_dim < cfg->qk_rope_head_dim || cfg->index_head_dim <= 0)
			return err_set(e, ST_INVALID,
				       "%s: field index_head_dim: %lld must be > 0 and >= qk_rope_head_dim %lld", f,
				       (long long)cfg->index_head_dim, (long long)cfg->qk_rope_head_dim);
	} else if (cfg->index_topk < 0) {
		return err_set(e, ST_INVALID, "%s: field index_topk: %lld is negative", f, (long long)cfg->index_topk);
	}
	if (any_compressed && cfg->rope_scaling.type == MODEL_ROPE_SCALING_NONE && !json_object_get(c->root, "rope_parameters"))
		return err_set(e, ST_INVALID, "%s: field rope_scaling: missing (compressed layers use YaRN)", f);
	if (cfg->rope_scaling.type == MODEL_ROPE_SCALING_YARN &&
	    (double)cfg->rope_scaling.original_max_position_embeddings * cfg->rope_scaling.factor <
		    (double)cfg->max_position_embeddings * 0.999)
		return err_set(e, ST_INVALID,
			       "%s: field max_position_embeddings: %lld exceeds rope_scaling factor %g x "
			       "original_max_position_embeddings %lld",
			       f, (long long)cfg->max_position_embeddings, cfg->rope_scaling.factor,
			       (long long)cfg->rope_scaling.original_max_position_embeddings);
	if (cfg->quant.moe_nvfp4 && cfg->expert_dtype == MODEL_EXPERT_DTYPE_FP8)
		return err_set(e, ST_INVALID,
			       "%s: field expert_dtype: \"fp8\" contradicts quantization_config.moe_quant_algo NVFP4", f);
	if (!cfg->quant.present && (cfg->expert_dtype == MODEL_EXPERT_DTYPE_FP4 ||
				    cfg->expert_dtype == MODEL_EXPERT_DTYPE_FP8))
		return err_set(e, ST_INVALID, "%s: field expert_dtype: \"%s\" without quantization_config", f,
			       model_expert_dtype_str(cfg->expert_dtype));
	return ST_OK;
}

/* ---- Public ---- */

enum status model_config_parse(const char *json, size_t n_bytes, const char *file_name,
			       struct model_config *out, struct err *e)
{
	struct cfg_ctx c = {.file = file_name ? file_name : "config.json", .e = e};
	memset(out, 0, sizeof *out);
	if (n_bytes > MODEL_MAX_CONFIG_BYTES)
		return err_set(e, ST_INVALID, "%s: %zu bytes is more than %u", c.file, n_bytes,
			       MODEL_MAX_CONFIG_BYTES);
	json_error_t je;
	json_t *root = json_loadb(json, n_bytes, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return err_set(e, ST_INVALID, "%s: not valid JSON: line %d column %d: %s", c.file, je.line,
			       je.column, je.text);
	enum status st;
	if (!json_is_object(root))
		st = err_set(e, ST_INVALID, "%s: top level must be a JSON object", c.file);
	else if ((c.root = root), (st = parse_identity(&c, root, out)) == ST_OK && (st = parse_sizes(&c, root, out)) == ST_OK &&
		 (st = parse_scalars(&c, root, out)) == ST_OK &&
		 (st = parse_compress_ratios(&c, root, out)) == ST_OK &&
		 (st = parse_rope_scaling(&c, root, out)) == ST_OK && (st = parse_quant(&c, root, out)) == ST_OK)
		st = validate(&c, out);
	json_decref(root);
	return st;
}

enum status model_config_load(const char *path, struct model_config *out, struct err *e)
{
	char *buf;
	size_t n;
	enum status st = file_read_all(path, MODEL_MAX_CONFIG_BYTES, &buf, &n, e);
	if (st == ST_OK)
		st = model_config_parse(buf, n, path, out, e);
	free(buf);
	return st;
}

enum model_attn_kind model_config_attn_kind(const struct model_config *cfg, int layer)
{
	if (layer < 0 || layer >= cfg->n_layers_total)
		return MODEL_ATTN_SLIDING;
	int32_t r = cfg->compress_ratios[layer];
	return r == 0 ? MODEL_ATTN_SLIDING : r == 4 ? MODEL_ATTN_CSA : MODEL_ATTN_HCA;
}

bool model_config_is_hash_layer(const struct model_config *cfg, int layer)
{
	return layer >= 0 && layer < cfg->num_hash_layers && layer < cfg->num_hidden_layers;
}

bool model_config_is_mtp_layer(const struct model_config *cfg, int layer)
{
	return layer >= cfg->num_hidden_layers && layer < cfg->n_layers_total;
}

const char *model_attn_kind_str(enum model_attn_kind k)
{
	switch (k) {
	case MODEL_ATTN_SLIDING: return "sliding";
	case MODEL_ATTN_CSA: return "CSA";
	case MODEL_ATTN_HCA: return "HCA";
	}
	return "?";
}

const char *model_expert_dtype_str(enum model_expert_dtype d)
{
	switch (d) {
	case MODEL_EXPERT_DTYPE_ABSENT: return "absent";
	case MODEL_EXPERT_DTYPE_FP4: return "fp4";
	case MODEL_EXPERT_DTYPE_FP8: return "fp8";
	case MODEL_EXPERT_DTYPE_BF16: return "bf16";
	}
	return "?";
}

bool model_config_is_dspark_layer(const struct model_config *cfg, int layer)
{
	return cfg->draft_kind == MODEL_DRAFT_DSPARK && model_config_is_mtp_layer(cfg, layer);
}

const char *model_draft_kind_str(enum model_draft_kind k)
{
	switch (k) {
	case MODEL_DRAFT_NONE: return "none";
	case MODEL_DRAFT_MTP: return "mtp";
	case MODEL_DRAFT_DSPARK: return "dspark";
	}
	return "?";
}

enum status model_config_set_draft_stages(struct model_config *cfg, int n_stages, bool dspark_layout,
					  bool mtp_layout, const char *file, struct err *e)
{
	if (n_stages < 0 || n_stages > MODEL_MAX_DRAFT_LAYERS)
		return err_set(e, ST_INVALID, "%s: tensor mtp.%d.*: more than %d draft stages", file, n_stages - 1,
			       MODEL_MAX_DRAFT_LAYERS);
	if (dspark_layout && mtp_layout)
		return err_set(e, ST_INVALID, "%s: tensor mtp.0.main_proj.weight: beside mtp.0.e_proj.weight (DSpark and "
			       "NextN MTP layouts mixed)", file);
	int max = cfg->n_draft_layers_max;
	if (dspark_layout && !cfg->dspark.present)
		return err_set(e, ST_INVALID, "%s: tensor mtp.0.main_proj.weight: a DSpark draft stage, but config.json has "
			       "no dspark_* keys (field dspark_target_layer_ids: missing)", file);
	if (mtp_layout && cfg->dspark.present)
		return err_set(e, ST_INVALID, "%s: tensor mtp.0.e_proj.weight: a NextN MTP layer, but config.json has the "
			       "DSpark keys (field dspark_target_layer_ids)", file);
	if (n_stages > max)
		return err_set(e, ST_INVALID, "%s: tensor mtp.%d.*: draft layer %d has no entry in config.json (%s allows "
			       "%d)", file, n_stages - 1, n_stages - 1,
			       cfg->dspark.present ? "compress_ratios" : "num_nextn_predict_layers", max);
	int listed = cfg->n_compress_ratios - (int)cfg->num_hidden_layers;
	if (cfg->dspark.present && listed > 0 && n_stages > 0 && n_stages < listed)
		return err_set(e, ST_INVALID, "%s: tensor mtp.%d.*: missing (config.json compress_ratios lists %d DSpark "
			       "stages, the checkpoint has %d)", file, n_stages, listed, n_stages);
	cfg->n_draft_layers = n_stages;
	cfg->draft_kind = n_stages == 0 ? MODEL_DRAFT_NONE : cfg->dspark.present ? MODEL_DRAFT_DSPARK : MODEL_DRAFT_MTP;
	cfg->n_layers_total = (int)cfg->num_hidden_layers + n_stages;
	return ST_OK;
}
