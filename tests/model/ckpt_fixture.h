/*
 * tests/model/ckpt_fixture.h: shared fixtures for the checkpoint tests: the
 * tiny config (docs/tiny-model.md, with a small vocabulary so files stay a
 * few hundred KiB) as a jansson object, and a writer of synthetic
 * safetensors checkpoints that the C tests build and then break.
 *
 * The writer uses model/schema.h to list the tensors, so on its own it only
 * proves self-consistency; the independent checks are the hand-computed
 * names, shapes and counts in test_checkpoint.c and the Python generator's
 * checkpoints in test_inspect.py.
 */
#ifndef DSV4_TESTS_MODEL_CKPT_FIXTURE_H
#define DSV4_TESTS_MODEL_CKPT_FIXTURE_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"
#include "model/schema.h"

/* The tiny config of docs/tiny-model.md; vocab overridable. Caller owns it. */
static inline json_t *fx_tiny_config(int64_t vocab)
{
	json_error_t je;
	json_t *c = json_loads(
		"{\"architectures\": [\"DeepseekV4ForCausalLM\"], \"model_type\": \"deepseek_v4\","
		"\"vocab_size\": 129280, \"hidden_size\": 64, \"num_hidden_layers\": 6,"
		"\"num_attention_heads\": 8, \"num_key_value_heads\": 1, \"head_dim\": 64,"
		"\"qk_rope_head_dim\": 16, \"q_lora_rank\": 64, \"o_groups\": 4, \"o_lora_rank\": 32,"
		"\"moe_intermediate_size\": 32, \"n_routed_experts\": 8, \"n_shared_experts\": 1,"
		"\"num_experts_per_tok\": 2, \"num_hash_layers\": 2, \"scoring_func\": \"sqrtsoftplus\","
		"\"topk_method\": \"noaux_tc\", \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.5,"
		"\"swiglu_limit\": 10.0, \"hidden_act\": \"silu\", \"sliding_window\": 32,"
		"\"compress_ratios\": [0, 0, 4, 8, 4, 8, 0], \"compress_rope_theta\": 160000,"
		"\"rope_theta\": 10000, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16,"
		"\"original_max_position_embeddings\": 65536, \"beta_fast\": 32, \"beta_slow\": 1},"
		"\"max_position_embeddings\": 1048576, \"index_n_heads\": 4, \"index_head_dim\": 32,"
		"\"index_topk\": 16, \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06,"
		"\"rms_norm_eps\": 1e-06, \"num_nextn_predict_layers\": 1, \"bos_token_id\": 0,"
		"\"eos_token_id\": 1, \"tie_word_embeddings\": false, \"attention_bias\": false,"
		"\"attention_dropout\": 0.0, \"initializer_range\": 0.02, \"torch_dtype\": \"bfloat16\","
		"\"use_cache\": true, \"transformers_version\": \"4.57.1\"}",
		0, &je);
	if (!c) {
		fprintf(stderr, "fixture config: %s\n", je.text);
		abort();
	}
	json_object_set_new(c, "vocab_size", json_integer(vocab));
	return c;
}

/* The real DeepSeek-V4-Flash dimensions (dsv4.md §1.1) over the tiny config's
 * other fields: 43 layers + the NextN layer, compress ratios 0, 0, then 4 and
 * 128 alternating, 0; no quantization_config. */
static inline json_t *fx_flash_config(void)
{
	json_t *c = fx_tiny_config(129280);
	json_t *v = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}",
			      "hidden_size", 4096, "num_hidden_layers", 43, "num_attention_heads", 64, "head_dim", 512,
			      "qk_rope_head_dim", 64, "q_lora_rank", 1024, "o_groups", 8, "o_lora_rank", 1024,
			      "moe_intermediate_size", 2048, "n_routed_experts", 256, "num_experts_per_tok", 6,
			      "num_hash_layers", 3, "sliding_window", 128, "index_n_heads", 64, "index_head_dim", 128,
			      "index_topk", 512, "num_nextn_predict_layers", 1);
	json_object_update(c, v);
	json_decref(v);
	json_t *r = json_array();
	json_array_append_new(r, json_integer(0));
	json_array_append_new(r, json_integer(0));
	for (int i = 2; i < 43; i++)
		json_array_append_new(r, json_integer(i % 2 ? 128 : 4));
	json_array_append_new(r, json_integer(0));
	json_object_set_new(c, "compress_ratios", r);
	return c;
}

/* Add the quantization_config of the fp8 (nvfp4=false) or nvfp4 release. */
static inline void fx_add_quant(json_t *c, int nvfp4)
{
	json_t *q = json_pack("{s:s, s:s, s:s, s:[i,i], s:s}", "quant_method", "fp8", "fmt", "e4m3", "scale_fmt",
			      "ue8m0", "weight_block_size", 128, 128, "activation_scheme", "dynamic");
	if (nvfp4) {
		json_object_set_new(q, "quant_algo", json_string("MIXED_PRECISION"));
		json_object_set_new(q, "moe_quant_algo", json_string("NVFP4"));
		json_object_set_new(q, "group_size", json_integer(16));
		json_object_set_new(q, "quantized_layers", json_pack("[s]", "layers.*.ffn.experts.*"));
		json_object_set_new(q, "ignore", json_pack("[s,s,s,s]", "*.attn.*", "*.ffn.shared_experts.*", "head",
							   "mtp.*"));
	}
	json_object_set_new(c, "quantization_config", q);
	json_object_set_new(c, "expert_dtype", json_string("fp4"));
}

/* ---- Synthetic checkpoint writer ---- */

/* FX_NVFP4_ALL also stores the MTP experts as NVFP4 (wrong when ignore has mtp.*). */
enum fx_variant { FX_BF16, FX_FP8, FX_NVFP4, FX_DEQ, FX_NVFP4_ALL };

struct fx_tensor {
	char name[MODEL_SCHEMA_NAME_BYTES];
	enum model_dtype dtype;
	int n_dims;
	int64_t shape[4];
	int shard;
};

struct fx_ckpt {
	struct model_config cfg;
	enum fx_variant variant;
	int n_shards;
	size_t n, cap;
	struct fx_tensor *t;
};

static inline void fx_push(struct fx_ckpt *w, const struct model_schema_tensor *x)
{
	if (w->n == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 256;
		w->t = realloc(w->t, w->cap * sizeof *w->t);
	}
	struct fx_tensor *t = &w->t[w->n++];
	memset(t, 0, sizeof *t);
	size_t nl = strnlen(x->name, sizeof t->name - 1);
	memcpy(t->name, x->name, nl);
	t->name[nl] = '\0';
	t->dtype = x->dtype;
	t->n_dims = x->n_dims;
	memcpy(t->shape, x->shape, sizeof t->shape);
	/* Shards as in the tiny model: globals + layers 0-2, layers 3+, MTP. */
	t->shard = x->layer < 0 ? 0 : model_config_is_mtp_layer(&w->cfg, x->layer) ? 2 : x->layer < 3 ? 0 : 1;
	if (w->n_shards < 3)
		t->shard = t->shard % w->n_shards;
}

static inline enum status fx_plain(void *ctx, const struct model_schema_tensor *x, struct err *e)
{
	(void)e;
	fx_push(ctx, x);
	return ST_OK;
}

static inline enum status fx_linear(void *ctx, const struct model_schema_linear *l, struct err *e)
{
	struct fx_ckpt *w = ctx;
	enum model_weight_format f = MODEL_FMT_BF16;
	bool mtp = model_config_is_mtp_layer(&w->cfg, l->layer);
	switch (w->variant) {
	case FX_BF16: f = MODEL_FMT_BF16; break;
	case FX_DEQ: f = MODEL_FMT_F32; break;
	case FX_FP8:
		f = l->group == MODEL_GROUP_ROUTED_EXPERTS ? MODEL_FMT_MXFP4 : MODEL_FMT_FP8_BLOCK;
		break;
	case FX_NVFP4:
	case FX_NVFP4_ALL:
		f = l->group != MODEL_GROUP_ROUTED_EXPERTS     ? MODEL_FMT_FP8_BLOCK
		    : mtp && w->variant == FX_NVFP4           ? MODEL_FMT_MXFP4
							       : MODEL_FMT_NVFP4;
		break;
	}
	struct model_schema_tensor parts[MODEL_SCHEMA_MAX_PARTS];
	int n;
	enum status st = model_schema_linear_parts(&w->cfg, l, f, parts, &n, e);
	for (int i = 0; st == ST_OK && i < n; i++)
		fx_push(w, &parts[i]);
	return st;
}

/* Build the tensor list for config JSON c in variant v (c is borrowed). */
static inline int fx_build(struct fx_ckpt *w, json_t *c, enum fx_variant v, int n_shards)
{
	memset(w, 0, sizeof *w);
	w->variant = v;
	w->n_shards = n_shards;
	char *s = json_dumps(c, 0);
	struct err e;
	err_clear(&e);
	enum status st = model_config_parse(s, strlen(s), "fixture config.json", &w->cfg, &e);
	free(s);
	if (st != ST_OK) {
		fprintf(stderr, "fixture: %s\n", e.msg);
		return -1;
	}
	struct model_schema_visitor vis = {.ctx = w, .plain = fx_plain, .linear = fx_linear};
	if (model_schema_walk(&w->cfg, &vis, &e) != ST_OK) {
		fprintf(stderr, "fixture: %s\n", e.msg);
		return -1;
	}
	return 0;
}

static inline void fx_free(struct fx_ckpt *w)
{
	free(w->t);
	memset(w, 0, sizeof *w);
}

static inline int64_t fx_find(const struct fx_ckpt *w, const char *name)
{
	for (size_t i = 0; i < w->n; i++)
		if (!strcmp(w->t[i].name, name))
			return (int64_t)i;
	return -1;
}

static inline uint64_t fx_bytes(const struct fx_tensor *t)
{
	uint64_t n = model_dtype_bytes(t->dtype);
	for (int d = 0; d < t->n_dims; d++)
		n *= (uint64_t)t->shape[d];
	return n;
}

static inline void fx_write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
		fprintf(stderr, "fixture: cannot write %s\n", path);
		abort();
	}
}

static inline void fx_shard_name(char *buf, size_t n, int s, int n_shards)
{
	snprintf(buf, n, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
}

/* Write config c (borrowed), the index and the shards of w into dir (created).
 * Data bytes are a deterministic pattern; the reader never interprets them. */
static inline void fx_write(const struct fx_ckpt *w, json_t *c, const char *dir)
{
	mkdir(dir, 0755);
	char path[1024];
	snprintf(path, sizeof path, "%s/config.json", dir);
	char *s = json_dumps(c, JSON_INDENT(2));
	fx_write_file(path, s, strlen(s));
	free(s);
	json_t *wm = json_object();
	uint64_t total = 0;
	for (int sh = 0; sh < w->n_shards; sh++) {
		json_t *h = json_object();
		json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
		uint64_t off = 0;
		char fname[64];
		fx_shard_name(fname, sizeof fname, sh, w->n_shards);
		for (size_t i = 0; i < w->n; i++) {
			const struct fx_tensor *t = &w->t[i];
			if (t->shard != sh)
				continue;
			json_t *shape = json_array();
			for (int d = 0; d < t->n_dims; d++)
				json_array_append_new(shape, json_integer(t->shape[d]));
			uint64_t b = fx_bytes(t);
			json_object_set_new(h, t->name, json_pack("{s:s, s:o, s:[I,I]}", "dtype", model_dtype_str(t->dtype),
								  "shape", shape, "data_offsets", (json_int_t)off,
								  (json_int_t)(off + b)));
			json_object_set_new(wm, t->name, json_string(fname));
			off += b;
		}
		total += off;
		char *hs = json_dumps(h, JSON_COMPACT);
		size_t hl = strlen(hs), pad = (8 - hl % 8) % 8;
		size_t file_bytes = 8 + hl + pad + off;
		uint8_t *buf = malloc(file_bytes);
		uint64_t n = hl + pad;
		for (int i = 0; i < 8; i++)
			buf[i] = (uint8_t)(n >> (8 * i));
		memcpy(buf + 8, hs, hl);
		memset(buf + 8 + hl, ' ', pad);
		for (uint64_t i = 0; i < off; i++)
			buf[8 + n + i] = (uint8_t)(i * 131 + 7);
		snprintf(path, sizeof path, "%s/%s", dir, fname);
		fx_write_file(path, buf, file_bytes);
		free(buf);
		free(hs);
		json_decref(h);
	}
	json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wm);
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
	s = json_dumps(idx, JSON_INDENT(2));
	fx_write_file(path, s, strlen(s));
	free(s);
	json_decref(idx);
}

/* Rewrite the JSON file at path through edit(root, ctx). */
static inline void fx_edit_json(const char *path, void (*edit)(json_t *root, void *ctx), void *ctx)
{
	json_error_t je;
	json_t *root = json_load_file(path, 0, &je);
	if (!root) {
		fprintf(stderr, "fixture: %s: %s\n", path, je.text);
		abort();
	}
	edit(root, ctx);
	char *s = json_dumps(root, JSON_INDENT(1));
	fx_write_file(path, s, strlen(s));
	free(s);
	json_decref(root);
}

/* Rewrite the header of the safetensors file at path through edit(header,
 * ctx), keeping its data section as it is. */
static inline void fx_edit_shard(const char *path, void (*edit)(json_t *hdr, void *ctx), void *ctx)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		abort();
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc((size_t)n);
	if (fread(b, 1, (size_t)n, f) != (size_t)n)
		abort();
	fclose(f);
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = (hl << 8) | b[i];
	json_error_t je;
	json_t *h = json_loadb((const char *)b + 8, (size_t)hl, 0, &je);
	if (!h)
		abort();
	edit(h, ctx);
	char *hs = json_dumps(h, JSON_COMPACT);
	size_t nl = strlen(hs), pad = (8 - nl % 8) % 8;
	size_t data = (size_t)n - 8 - (size_t)hl;
	uint8_t *o = malloc(8 + nl + pad + data);
	for (int i = 0; i < 8; i++)
		o[i] = (uint8_t)((nl + pad) >> (8 * i));
	memcpy(o + 8, hs, nl);
	memset(o + 8 + nl, ' ', pad);
	memcpy(o + 8 + nl + pad, b + 8 + hl, data);
	fx_write_file(path, o, 8 + nl + pad + data);
	free(o);
	free(hs);
	free(b);
	json_decref(h);
}

#endif
