/*
 * tests/model/test_config.c: config.json parsing and validation.
 *
 * The tiny config and the real DeepSeek-V4-Flash values (dsv4.md §1.1) must
 * parse to the documented struct; every required field, removed, and every
 * listed inconsistency must be refused with a message naming the field.
 */
#include "common/check.h"
#include "model/config.h"
#include "tests/model/ckpt_fixture.h"
#include "tests/test.h"

static enum status parse_json(json_t *c, struct model_config *cfg, struct err *e)
{
	char *s = json_dumps(c, 0);
	err_clear(e);
	enum status st = model_config_parse(s, strlen(s), "config.json", cfg, e);
	free(s);
	return st;
}

/* Expect c to be refused with status st and a message containing needle. */
#define T_REFUSED(c, want_st, needle)                                                             \
	do {                                                                                      \
		struct model_config cfg_;                                                         \
		struct err e_;                                                                    \
		enum status st_ = parse_json((c), &cfg_, &e_);                                    \
		T_CHECKF(st_ == (want_st), "status %s for '%s' (%s)", status_str(st_), (needle), e_.msg); \
		T_STR_CONTAINS(e_.msg, (needle));                                                 \
		T_STR_CONTAINS(e_.msg, "config.json");                                            \
	} while (0)

static json_t *with(const char *key, json_t *val)
{
	json_t *c = fx_tiny_config(129280);
	if (val)
		json_object_set_new(c, key, val);
	else
		json_object_del(c, key);
	return c;
}

static void test_tiny(void)
{
	json_t *c = fx_tiny_config(129280);
	struct model_config cfg;
	struct err e;
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(!strcmp(cfg.architecture, "DeepseekV4ForCausalLM"));
	T_CHECK(!strcmp(cfg.model_type, "deepseek_v4"));
	T_CHECK(cfg.vocab_size == 129280 && cfg.hidden_size == 64 && cfg.num_hidden_layers == 6);
	T_CHECK(cfg.num_attention_heads == 8 && cfg.num_key_value_heads == 1 && cfg.head_dim == 64);
	T_CHECK(cfg.qk_rope_head_dim == 16 && cfg.q_lora_rank == 64 && cfg.o_groups == 4 && cfg.o_lora_rank == 32);
	T_CHECK(cfg.moe_intermediate_size == 32 && cfg.n_routed_experts == 8 && cfg.n_shared_experts == 1);
	T_CHECK(cfg.num_experts_per_tok == 2 && cfg.num_hash_layers == 2);
	T_CHECK(!strcmp(cfg.scoring_func, "sqrtsoftplus") && !strcmp(cfg.topk_method, "noaux_tc"));
	T_CHECK(cfg.norm_topk_prob && !strcmp(cfg.hidden_act, "silu"));
	T_CLOSE(cfg.routed_scaling_factor, 1.5, 0, 0);
	T_CLOSE(cfg.swiglu_limit, 10.0, 0, 0);
	T_CHECK(cfg.sliding_window == 32 && cfg.n_layers_total == 7);
	int32_t want[7] = {0, 0, 4, 8, 4, 8, 0};
	T_CHECK(!memcmp(cfg.compress_ratios, want, sizeof want));
	T_CLOSE(cfg.compress_rope_theta, 160000, 0, 0);
	T_CLOSE(cfg.rope_theta, 10000, 0, 0);
	T_CHECK(cfg.rope_scaling.type == MODEL_ROPE_SCALING_YARN);
	T_CLOSE(cfg.rope_scaling.factor, 16, 0, 0);
	T_CHECK(cfg.rope_scaling.original_max_position_embeddings == 65536);
	T_CLOSE(cfg.rope_scaling.beta_fast, 32, 0, 0);
	T_CLOSE(cfg.rope_scaling.beta_slow, 1, 0, 0);
	T_CHECK(cfg.max_position_embeddings == 1048576);
	T_CHECK(cfg.index_n_heads == 4 && cfg.index_head_dim == 32 && cfg.index_topk == 16);
	T_CHECK(cfg.hc_mult == 4 && cfg.hc_sinkhorn_iters == 20);
	T_CLOSE(cfg.hc_eps, 1e-6, 0, 0);
	T_CLOSE(cfg.rms_norm_eps, 1e-6, 0, 0);
	T_CHECK(cfg.num_nextn_predict_layers == 1 && cfg.bos_token_id == 0 && cfg.eos_token_id == 1);
	T_CHECK(!cfg.tie_word_embeddings && !cfg.attention_bias && cfg.use_cache);
	T_CLOSE(cfg.initializer_range, 0.02, 0, 0);
	T_CHECK(!strcmp(cfg.torch_dtype, "bfloat16") && !strcmp(cfg.transformers_version, "4.57.1"));
	T_CHECK(!cfg.quant.present && cfg.expert_dtype == MODEL_EXPERT_DTYPE_ABSENT);

	/* layer map */
	T_CHECK(model_config_attn_kind(&cfg, 0) == MODEL_ATTN_SLIDING);
	T_CHECK(model_config_attn_kind(&cfg, 2) == MODEL_ATTN_CSA);
	T_CHECK(model_config_attn_kind(&cfg, 3) == MODEL_ATTN_HCA);
	T_CHECK(model_config_attn_kind(&cfg, 6) == MODEL_ATTN_SLIDING);
	T_CHECK(model_config_is_hash_layer(&cfg, 1) && !model_config_is_hash_layer(&cfg, 2));
	T_CHECK(model_config_is_mtp_layer(&cfg, 6) && !model_config_is_mtp_layer(&cfg, 5));
	T_CHECK(!model_config_is_hash_layer(&cfg, 6));

	/* quantization configs of the two releases */
	fx_add_quant(c, 0);
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.quant.present && !strcmp(cfg.quant.quant_method, "fp8") && !strcmp(cfg.quant.fmt, "e4m3"));
	T_CHECK(cfg.quant.weight_block_size[0] == 128 && cfg.quant.weight_block_size[1] == 128);
	T_CHECK(!cfg.quant.moe_nvfp4 && cfg.expert_dtype == MODEL_EXPERT_DTYPE_FP4);
	fx_add_quant(c, 1);
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.quant.moe_nvfp4 && cfg.quant.group_size == 16 && cfg.quant.ignore_mtp);
	T_CHECK(cfg.quant.n_ignore == 4 && cfg.quant.n_quantized_layers == 1);
	T_CHECK(!strcmp(cfg.quant.quant_algo, "MIXED_PRECISION"));
	json_decref(c);

	/* unknown keys ignored, integers accepted for reals, HF's rope_type spelling */
	c = fx_tiny_config(1000);
	json_object_set_new(c, "some_future_key", json_pack("{s:i}", "x", 1));
	json_object_set_new(c, "swiglu_limit", json_integer(10));
	json_object_set_new(c, "rope_scaling", json_pack("{s:s, s:f, s:i}", "rope_type", "yarn", "factor", 16.0,
							 "original_max_position_embeddings", 65536));
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CLOSE(cfg.swiglu_limit, 10, 0, 0);
	T_CLOSE(cfg.rope_scaling.beta_fast, 32, 0, 0); /* default */
	json_decref(c);
}

/* The real DeepSeek-V4-Flash config (dsv4.md §1.1). */
static void test_flash(void)
{
	json_t *c = fx_flash_config();
	fx_add_quant(c, 0);
	json_object_del(c, "expert_dtype"); /* absent in the dump dsv4.md saw */
	struct model_config cfg;
	struct err e;
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.n_layers_total == 44);
	int n_csa = 0, n_hca = 0, n_swa = 0;
	for (int L = 0; L < 43; L++) {
		enum model_attn_kind k = model_config_attn_kind(&cfg, L);
		n_csa += k == MODEL_ATTN_CSA;
		n_hca += k == MODEL_ATTN_HCA;
		n_swa += k == MODEL_ATTN_SLIDING;
	}
	T_CHECK(n_swa == 2 && n_csa == 21 && n_hca == 20);
	T_CHECK(model_config_attn_kind(&cfg, 42) == MODEL_ATTN_CSA);
	T_CHECK(model_config_attn_kind(&cfg, 43) == MODEL_ATTN_SLIDING && model_config_is_mtp_layer(&cfg, 43));
	T_CHECK(model_config_is_hash_layer(&cfg, 2) && !model_config_is_hash_layer(&cfg, 3));
	json_decref(c);
}

static const char *const required[] = {
	"architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_nextn_predict_layers",
	"num_attention_heads", "num_key_value_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_groups",
	"o_lora_rank", "max_position_embeddings", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
	"num_experts_per_tok", "num_hash_layers", "sliding_window", "index_n_heads", "index_head_dim", "index_topk",
	"hc_mult", "hc_sinkhorn_iters", "bos_token_id", "eos_token_id", "scoring_func", "hidden_act",
	"norm_topk_prob", "routed_scaling_factor", "swiglu_limit", "rope_theta", "compress_rope_theta", "hc_eps",
	"rms_norm_eps", "compress_ratios",
};

static void test_missing(void)
{
	for (size_t i = 0; i < ARRAY_LEN(required); i++) {
		json_t *c = with(required[i], NULL);
		if (!strcmp(required[i], "architectures")) /* model_type deepseek_v4 stands in for it (transformers) */
			json_object_del(c, "model_type");
		char needle[128];
		snprintf(needle, sizeof needle, "field %s: missing", required[i]);
		T_REFUSED(c, ST_INVALID, needle);
		json_decref(c);
	}
	/* rope_scaling is optional, except that compressed layers need it */
	json_t *c = with("rope_scaling", NULL);
	T_REFUSED(c, ST_INVALID, "field rope_scaling: missing");
	json_object_set_new(c, "compress_ratios", json_pack("[i,i,i,i,i,i,i]", 0, 0, 0, 0, 0, 0, 0));
	struct model_config cfg;
	struct err e;
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	json_decref(c);
}

struct bad {
	const char *key;
	const char *json; /* new value, or NULL to delete */
	enum status st;
	const char *needle;
};

static const struct bad bads[] = {
	/* types */
	{"hidden_size", "\"64\"", ST_INVALID, "field hidden_size: must be an integer"},
	{"hidden_size", "64.0", ST_INVALID, "field hidden_size: must be an integer"},
	{"hidden_size", "true", ST_INVALID, "field hidden_size: must be an integer"},
	{"hidden_size", "-1", ST_INVALID, "field hidden_size: -1 out of range"},
	{"hidden_size", "0", ST_INVALID, "field hidden_size: 0 out of range"},
	{"vocab_size", "99999999999", ST_INVALID, "field vocab_size"},
	{"rms_norm_eps", "\"x\"", ST_INVALID, "field rms_norm_eps: must be a number"},
	{"rms_norm_eps", "0", ST_INVALID, "field rms_norm_eps"},
	{"rope_theta", "-5", ST_INVALID, "field rope_theta"},
	{"norm_topk_prob", "1", ST_INVALID, "field norm_topk_prob: must be true or false"},
	{"architectures", "\"DeepseekV4ForCausalLM\"", ST_INVALID, "field architectures"},
	{"architectures", "[]", ST_INVALID, "field architectures"},
	{"architectures", "[3]", ST_INVALID, "field architectures[0]"},
	{"model_type", "7", ST_INVALID, "field model_type: must be a string"},
	{"torch_dtype", "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"", ST_INVALID,
	 "field torch_dtype: string too long"},
	/* not this model / not implemented */
	{"architectures", "[\"LlamaForCausalLM\"]", ST_UNSUPPORTED, "field architectures"},
	{"model_type", "\"llama\"", ST_UNSUPPORTED, "field model_type"},
	{"scoring_func", "\"sigmoid\"", ST_UNSUPPORTED, "field scoring_func"},
	{"topk_method", "\"greedy\"", ST_UNSUPPORTED, "field topk_method"},
	{"hidden_act", "\"gelu\"", ST_UNSUPPORTED, "field hidden_act"},
	{"num_key_value_heads", "2", ST_UNSUPPORTED, "field num_key_value_heads"},
	{"attention_bias", "true", ST_UNSUPPORTED, "field attention_bias"},
	{"expert_dtype", "\"int4\"", ST_UNSUPPORTED, "field expert_dtype"},
	/* consistency */
	{"num_attention_heads", "6", ST_INVALID, "field o_groups: 4 does not divide num_attention_heads 6"},
	{"head_dim", "8", ST_INVALID, "field head_dim: 8 is smaller than qk_rope_head_dim 16"},
	{"qk_rope_head_dim", "15", ST_INVALID, "field qk_rope_head_dim"},
	{"num_hash_layers", "7", ST_INVALID, "field num_hash_layers: 7 exceeds num_hidden_layers 6"},
	{"num_experts_per_tok", "9", ST_INVALID, "field num_experts_per_tok"},
	{"index_topk", "0", ST_INVALID, "field index_topk: 0 must be > 0 with CSA layers"},
	{"index_topk", "-3", ST_INVALID, "field index_topk"},
	{"index_n_heads", "0", ST_INVALID, "field index_n_heads"},
	{"index_head_dim", "8", ST_INVALID, "field index_head_dim"},
	{"bos_token_id", "129280", ST_INVALID, "field bos_token_id"},
	{"eos_token_id", "200000", ST_INVALID, "field eos_token_id"},
	{"compress_ratios", "[0,0,4,8,4,8]", ST_INVALID, "field compress_ratios: has 6 entries, expected 7"},
	{"compress_ratios", "[0,0,4,8,4]", ST_INVALID, "field compress_ratios: has 5 entries, expected at least 6"},
	{"compress_ratios", "[0,0,4,6,4,8,0]", ST_INVALID, "field compress_ratios[3]: 6 is not"},
	{"compress_ratios", "[0,0,4,2,4,8,0]", ST_INVALID, "field compress_ratios[3]: 2 is not"},
	{"compress_ratios", "[0,0,4,8,4,-8,0]", ST_INVALID, "field compress_ratios[5]"},
	{"compress_ratios", "[0,0,4,8,4,8.0,0]", ST_INVALID, "field compress_ratios[5]: must be an integer"},
	{"compress_ratios", "[0,0,4,8,4,131072,0]", ST_INVALID, "field compress_ratios[5]"},
	{"compress_ratios", "{}", ST_INVALID, "field compress_ratios: must be an array"},
	{"layer_types", "[\"sliding_attention\",\"sliding_attention\",\"compressed_sparse_attention\",8,"
			"\"compressed_sparse_attention\",8]", ST_INVALID, "field layer_types[3]: must be"},
	{"layer_types", "[\"sliding_attention\",\"sliding_attention\",\"compressed_sparse_attention\","
			"\"x\",\"compressed_sparse_attention\",\"sliding_attention\"]", ST_INVALID, "field layer_types[3]"},
	{"layer_types", "[\"sliding_attention\",\"sliding_attention\",\"compressed_sparse_attention\","
			"\"sliding_attention\"]", ST_INVALID, "field layer_types[3]: ratio 0 contradicts compress_ratios[3] 8"},
	{"mlp_layer_types", "[\"hash_moe\",\"moe\",\"moe\",\"moe\",\"moe\",\"moe\"]", ST_INVALID,
	 "field mlp_layer_types: 1 hash_moe layers contradict num_hash_layers 2"},
	{"mlp_layer_types", "[\"hash_moe\",\"moe\",\"hash_moe\",\"moe\",\"moe\",\"moe\"]", ST_UNSUPPORTED,
	 "field mlp_layer_types[2]"},
	{"mlp_layer_types", "[\"hash_moe\",\"hash_moe\"]", ST_INVALID, "field mlp_layer_types: must be an array of 6"},
	{"eos_token_id", "[]", ST_INVALID, "field eos_token_id"},
	{"dspark_block_size", "5", ST_INVALID, "field dspark_noise_token_id: missing"},
	{"max_position_embeddings", "2097152", ST_INVALID, "field max_position_embeddings"},
	{"rope_scaling", "[]", ST_INVALID, "field rope_scaling"},
	{"rope_scaling", "{\"type\":\"linear\",\"factor\":2}", ST_UNSUPPORTED, "field rope_scaling.type"},
	{"rope_scaling", "{\"type\":\"yarn\",\"original_max_position_embeddings\":65536}", ST_INVALID,
	 "field rope_scaling.factor: missing"},
	{"rope_scaling", "{\"type\":\"yarn\",\"factor\":16}", ST_INVALID,
	 "field rope_scaling.original_max_position_embeddings: missing"},
	{"rope_scaling", "{\"type\":\"yarn\",\"factor\":16,\"original_max_position_embeddings\":65536,"
			 "\"beta_fast\":1,\"beta_slow\":32}",
	 ST_INVALID, "field rope_scaling.beta_fast"},
	{"rope_scaling", "{\"factor\":16}", ST_INVALID, "field rope_scaling.rope_type: missing"},
	/* quantization */
	{"quantization_config", "7", ST_INVALID, "field quantization_config: must be an object"},
	{"quantization_config", "{\"fmt\":\"e4m3\",\"weight_block_size\":[128,128]}", ST_INVALID,
	 "field quantization_config.quant_method: missing"},
	{"quantization_config", "{\"quant_method\":\"awq\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128]}",
	 ST_UNSUPPORTED, "field quantization_config.quant_method"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]}",
	 ST_UNSUPPORTED, "field quantization_config.fmt"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\"}", ST_INVALID,
	 "field quantization_config.weight_block_size: missing"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128]}", ST_INVALID,
	 "field quantization_config.weight_block_size"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,0]}",
	 ST_INVALID, "field quantization_config.weight_block_size[1]"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128],"
				"\"moe_quant_algo\":\"NVFP4\",\"group_size\":32}",
	 ST_UNSUPPORTED, "field quantization_config.group_size"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128],"
				"\"moe_quant_algo\":\"MXFP8\"}",
	 ST_UNSUPPORTED, "field quantization_config.moe_quant_algo"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128],"
				"\"ignore\":\"mtp.*\"}",
	 ST_INVALID, "field quantization_config.ignore"},
	{"quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"weight_block_size\":[128,128],"
				"\"ignore\":[1]}",
	 ST_INVALID, "field quantization_config.ignore[0]"},
	{"expert_dtype", "\"fp4\"", ST_INVALID, "field expert_dtype: \"fp4\" without quantization_config"},
};

static void test_bad(void)
{
	for (size_t i = 0; i < ARRAY_LEN(bads); i++) {
		json_error_t je;
		json_t *v = bads[i].json ? json_loads(bads[i].json, JSON_DECODE_ANY, &je) : NULL;
		T_CHECKF(v || !bads[i].json, "bad fixture %s", bads[i].json);
		json_t *c = with(bads[i].key, v);
		T_REFUSED(c, bads[i].st, bads[i].needle);
		json_decref(c);
	}
	/* nvfp4 with expert_dtype fp8 contradicts */
	json_t *c = fx_tiny_config(1000);
	fx_add_quant(c, 1);
	json_object_set_new(c, "expert_dtype", json_string("fp8"));
	T_REFUSED(c, ST_INVALID, "field expert_dtype");
	json_decref(c);
}

static void test_not_json(void)
{
	static const char *const texts[] = {"", "{", "[]", "42", "{\"a\":1,\"a\":2}", "{\"hidden_size\": 64,}",
					    "\xff\xfe"};
	static const char *const needles[] = {"not valid JSON", "not valid JSON", "top level", "not valid JSON",
					      "not valid JSON", "not valid JSON", "not valid JSON"};
	for (size_t i = 0; i < ARRAY_LEN(texts); i++) {
		struct model_config cfg;
		struct err e;
		err_clear(&e);
		T_CHECK(model_config_parse(texts[i], strlen(texts[i]), "x/config.json", &cfg, &e) == ST_INVALID);
		T_STR_CONTAINS(e.msg, needles[i]);
		T_STR_CONTAINS(e.msg, "x/config.json");
	}
	/* not NUL-terminated: only n bytes are read */
	char buf[4] = {'{', '}', 'x', 'x'};
	struct model_config cfg;
	struct err e;
	T_CHECK(model_config_parse(buf, 2, "c", &cfg, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "field architectures: missing");
	T_CHECK(model_config_load("/nonexistent/dir/config.json", &cfg, &e) == ST_NOTFOUND);
	T_STR_CONTAINS(e.msg, "/nonexistent/dir/config.json");
}

/* The tiny config with the 0731 keys: stages listed in compress_ratios. */
static json_t *tiny_0731(void)
{
	json_t *c = fx_tiny_config(129280);
	json_object_set_new(c, "compress_ratios", json_pack("[i,i,i,i,i,i,i,i,i]", 0, 0, 4, 8, 4, 8, 0, 0, 0));
	json_object_set_new(c, "dspark_block_size", json_integer(5));
	json_object_set_new(c, "dspark_noise_token_id", json_integer(128799));
	json_object_set_new(c, "dspark_target_layer_ids", json_pack("[i,i,i]", 3, 4, 5));
	json_object_set_new(c, "dspark_markov_rank", json_integer(16));
	return c;
}

static void test_0731(void)
{
	json_t *c = tiny_0731();
	struct model_config cfg;
	struct err e;
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.draft_kind == MODEL_DRAFT_DSPARK && cfg.n_draft_layers == 3 && cfg.n_layers_total == 9);
	T_CHECK(cfg.num_nextn_predict_layers == 1 && cfg.n_compress_ratios == 9); /* the leftover key is kept */
	T_CHECK(cfg.dspark.present && cfg.dspark.block_size == 5 && cfg.dspark.noise_token_id == 128799);
	T_CHECK(cfg.dspark.n_target_layers == 3 && cfg.dspark.target_layer_ids[2] == 5 && cfg.dspark.markov_rank == 16);
	T_CHECK(model_config_is_dspark_layer(&cfg, 6) && model_config_is_dspark_layer(&cfg, 8));
	T_CHECK(!model_config_is_dspark_layer(&cfg, 5) && model_config_attn_kind(&cfg, 8) == MODEL_ATTN_SLIDING);
	/* the tensors settle the count */
	T_CHECK(model_config_set_draft_stages(&cfg, 2, true, false, "x", &e) == ST_INVALID); /* 3 listed */
	T_STR_CONTAINS(e.msg, "tensor mtp.2.*: missing");
	T_CHECK(model_config_set_draft_stages(&cfg, 3, true, false, "x", &e) == ST_OK);
	T_CHECK(cfg.n_draft_layers == 3 && cfg.n_layers_total == 9 && cfg.draft_kind == MODEL_DRAFT_DSPARK);
	T_CHECK(model_config_set_draft_stages(&cfg, 0, false, false, "x", &e) == ST_OK);
	T_CHECK(cfg.draft_kind == MODEL_DRAFT_NONE && cfg.n_layers_total == 6);
	T_CHECK(model_config_set_draft_stages(&cfg, 4, true, false, "x/model.safetensors", &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "tensor mtp.3.");
	T_CHECK(model_config_set_draft_stages(&cfg, 1, false, true, "x", &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "tensor mtp.0.e_proj.weight");
	T_CHECK(model_config_set_draft_stages(&cfg, 1, true, true, "x", &e) == ST_INVALID);
	/* stages not listed (transformers keeps num_hidden_layers entries): the tensors decide */
	json_object_set_new(c, "compress_ratios", json_pack("[i,i,i,i,i,i]", 0, 0, 4, 8, 4, 8));
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.draft_kind == MODEL_DRAFT_DSPARK && cfg.n_draft_layers == 3 && cfg.n_layers_total == 9);
	T_CHECK(model_config_set_draft_stages(&cfg, 2, true, false, "x", &e) == ST_OK);
	T_CHECK(cfg.n_draft_layers == 2 && cfg.n_layers_total == 8 && cfg.compress_ratios[7] == 0);
	json_decref(c);

	/* June config with DSpark tensors: refused naming the missing keys */
	c = fx_tiny_config(129280);
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.draft_kind == MODEL_DRAFT_MTP && cfg.n_draft_layers == 1);
	T_CHECK(model_config_set_draft_stages(&cfg, 3, true, false, "x", &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "dspark_target_layer_ids");
	T_CHECK(model_config_set_draft_stages(&cfg, 2, false, true, "x", &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "tensor mtp.1.");
	/* extra entries without DSpark keys are ignored */
	json_object_set_new(c, "compress_ratios", json_pack("[i,i,i,i,i,i,i,i]", 0, 0, 4, 8, 4, 8, 0, 0));
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.n_layers_total == 7 && cfg.n_compress_ratios == 8);
	json_object_set_new(c, "num_nextn_predict_layers", json_integer(0));
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.n_layers_total == 6 && cfg.draft_kind == MODEL_DRAFT_NONE);
	json_decref(c);

	/* refusals */
	static const struct bad b0731[] = {
		{"dspark_target_layer_ids", "[3, 4, 6]", ST_INVALID, "field dspark_target_layer_ids[2]: must be a main layer index in [0, 5]"},
		{"dspark_target_layer_ids", "[-1]", ST_INVALID, "field dspark_target_layer_ids[0]"},
		{"dspark_target_layer_ids", "[]", ST_INVALID, "field dspark_target_layer_ids"},
		{"dspark_target_layer_ids", "3", ST_INVALID, "field dspark_target_layer_ids"},
		{"dspark_noise_token_id", "129280", ST_INVALID, "field dspark_noise_token_id"},
		{"dspark_block_size", "0", ST_INVALID, "field dspark_block_size"},
		{"dspark_markov_rank", NULL, ST_INVALID, "field dspark_markov_rank: missing"},
		{"compress_ratios", "[0,0,4,8,4,8,0,4,0]", ST_INVALID, "field compress_ratios[7]: 4 for DSpark stage 1"},
	};
	for (size_t i = 0; i < ARRAY_LEN(b0731); i++) {
		json_error_t je;
		c = tiny_0731();
		if (b0731[i].json)
			json_object_set_new(c, b0731[i].key, json_loads(b0731[i].json, JSON_DECODE_ANY, &je));
		else
			json_object_del(c, b0731[i].key);
		T_REFUSED(c, b0731[i].st, b0731[i].needle);
		json_decref(c);
	}
}

/* The key set transformers' DeepseekV4Config writes (config.h). */
static void test_hf_style(void)
{
	json_t *c = fx_tiny_config(129280);
	struct model_config ref, cfg;
	struct err e;
	T_CHECKF(parse_json(c, &ref, &e) == ST_OK, "%s", e.msg);
	json_object_del(c, "compress_ratios");
	json_object_del(c, "num_hash_layers");
	json_object_del(c, "qk_rope_head_dim");
	json_object_del(c, "topk_method");
	json_object_del(c, "rope_scaling");
	json_object_del(c, "rope_theta");
	json_object_del(c, "torch_dtype");
	json_object_set_new(c, "dtype", json_string("bfloat16"));
	json_object_set_new(c, "eos_token_id", json_pack("[i,i]", 1, 7));
	json_object_set_new(c, "layer_types",
			    json_pack("[s,s,s,s,s,s]", "sliding_attention", "sliding_attention", "compressed_sparse_attention",
				      "heavily_compressed_attention", "compressed_sparse_attention",
				      "heavily_compressed_attention"));
	json_object_set_new(c, "compress_rates", json_pack("{s:i, s:i}", "compressed_sparse_attention", 4,
							   "heavily_compressed_attention", 8));
	json_object_set_new(c, "mlp_layer_types", json_pack("[s,s,s,s,s,s]", "hash_moe", "hash_moe", "moe", "moe", "moe", "moe"));
	json_object_set_new(c, "partial_rotary_factor", json_real(0.25));
	json_object_set_new(c, "rope_parameters",
			    json_pack("{s:{s:s, s:f, s:f}, s:{s:s, s:f, s:f, s:f, s:i, s:f, s:f, s:f}}", "main", "rope_type",
				      "default", "rope_theta", 10000.0, "partial_rotary_factor", 0.25, "compress", "rope_type",
				      "yarn", "rope_theta", 160000.0, "partial_rotary_factor", 0.25, "factor", 16.0,
				      "original_max_position_embeddings", 65536, "beta_fast", 32.0, "beta_slow", 1.0,
				      "attention_factor", 1.0));
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.hf_style && !ref.hf_style);
	T_CHECK(cfg.n_layers_total == 7 && !memcmp(cfg.compress_ratios, ref.compress_ratios, 7 * sizeof(int32_t)));
	T_CHECK(cfg.num_hash_layers == 2 && cfg.qk_rope_head_dim == 16 && !strcmp(cfg.topk_method, "noaux_tc"));
	T_CHECK(cfg.rope_scaling.type == MODEL_ROPE_SCALING_YARN && cfg.rope_scaling.factor == 16);
	T_CHECK(cfg.rope_scaling.original_max_position_embeddings == 65536 && cfg.rope_theta == 10000);
	T_CHECK(cfg.compress_rope_theta == 160000 && cfg.eos_token_id == 1 && !strcmp(cfg.torch_dtype, "bfloat16"));
	/* plain RoPE on the compressed layers too (transformers' default) */
	json_object_set_new(json_object_get(json_object_get(c, "rope_parameters"), "compress"), "rope_type",
			    json_string("default"));
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg);
	T_CHECK(cfg.rope_scaling.type == MODEL_ROPE_SCALING_NONE);
	json_object_set_new(json_object_get(json_object_get(c, "rope_parameters"), "compress"), "rope_type",
			    json_string("llama3"));
	T_REFUSED(c, ST_UNSUPPORTED, "field rope_parameters.compress.rope_type");
	json_object_set_new(json_object_get(json_object_get(c, "rope_parameters"), "compress"), "rope_type",
			    json_string("default"));
	json_object_set_new(c, "partial_rotary_factor", json_real(0.3));
	T_REFUSED(c, ST_INVALID, "field partial_rotary_factor");
	json_object_del(c, "partial_rotary_factor");
	T_CHECKF(parse_json(c, &cfg, &e) == ST_OK, "%s", e.msg); /* rope_parameters.main's */
	T_CHECK(cfg.qk_rope_head_dim == 16);
	json_decref(c);
}

int main(void)
{
	test_0731();
	test_hf_style();
	test_tiny();
	test_flash();
	test_missing();
	test_bad();
	test_not_json();
	return test_exit();
}
