/*
 * tests/bench/make_bench_checkpoint.c: writes a real-dimension checkpoint of
 * N layers, in the real layout, for the load benchmark (scripts/bench_load).
 *
 *   make_bench_checkpoint CONFIG.json N_LAYERS OUT_DIR [TOKENIZER_DIR]
 *
 * The weights must come from somewhere and never from a hub: this takes the
 * real config (tests/model/data/...), keeps its first N layers and the MTP
 * layer, and writes every tensor the schema (model/schema.h) expects for it
 * — routed experts NVFP4 when the config's moe_quant_algo says so (MXFP4
 * otherwise, and in the MTP layer, which the conversion leaves alone), the other linears FP8 with E8M0 block scales, plain tensors
 * as the schema types them — in safetensors shards of at most 4 GiB with an
 * index, as the released checkpoints are. The values are deterministic and
 * finite with sane magnitudes (no NaN codes, scales near 2^-8), cut from
 * pools of pseudo-random bytes per kind so that tens of GiB are written at
 * disk speed; they are not a trained model. TOKENIZER_DIR's tokenizer files
 * are copied beside (any tiny checkpoint has them).
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/config.h"
#include "model/schema.h"

#define POOL_BYTES ((size_t)64 << 20)
#define SHARD_MAX_BYTES ((uint64_t)4 << 30)

enum kind { K_BF16, K_F32, K_E4M3_W, K_E4M3_S, K_E8M0, K_FP4, K_N };

struct tens {
	char name[MODEL_SCHEMA_NAME_BYTES];
	enum model_dtype dt;
	int nd;
	int64_t shape[4];
	uint64_t bytes;
	enum kind kind;
	int shard;
	uint64_t off;
};

struct gen {
	const struct model_config *cfg;
	struct tens *t;
	size_t n, cap;
	enum model_weight_format routed;
};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void)
{
	uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static int add(struct gen *g, const struct model_schema_tensor *s)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 4096;
		struct tens *n = realloc(g->t, cap * sizeof *n);
		if (!n)
			return -1;
		g->t = n;
		g->cap = cap;
	}
	struct tens *t = &g->t[g->n++];
	memset(t, 0, sizeof *t);
	if (snprintf(t->name, sizeof t->name, "%s", s->name) >= (int)sizeof t->name)
		return -1; /* a name longer than the table holds (release -Werror) */
	t->dt = s->dtype;
	t->nd = s->n_dims;
	uint64_t el = 1;
	for (int i = 0; i < s->n_dims; i++)
		el *= (uint64_t)(t->shape[i] = s->shape[i]);
	t->bytes = el * model_dtype_bytes(s->dtype);
	switch (s->dtype) {
	case MODEL_DTYPE_BF16: t->kind = K_BF16; break;
	case MODEL_DTYPE_F32: t->kind = K_F32; break;
	case MODEL_DTYPE_F8_E4M3: t->kind = s->role == MODEL_ROLE_SCALE ? K_E4M3_S : K_E4M3_W; break;
	case MODEL_DTYPE_F8_E8M0: t->kind = K_E8M0; break;
	default: t->kind = K_FP4; break; /* U8 / I8 packed e2m1; integers are written by value */
	}
	return 0;
}

static enum status on_plain(void *ctx, const struct model_schema_tensor *s, struct err *e)
{
	return add(ctx, s) ? err_set(e, ST_NOMEM, "tensor list") : ST_OK;
}

static enum status on_linear(void *ctx, const struct model_schema_linear *l, struct err *e)
{
	struct gen *g = ctx;
	enum model_weight_format f = MODEL_FMT_FP8_BLOCK;
	/* the NVFP4 conversion leaves mtp.* as released: MXFP4 routed experts */
	if (l->group == MODEL_GROUP_ROUTED_EXPERTS)
		f = l->layer < g->cfg->num_hidden_layers ? g->routed : MODEL_FMT_MXFP4;
	if (!(l->allowed & (1u << f)))
		f = MODEL_FMT_BF16;
	struct model_schema_tensor parts[MODEL_SCHEMA_MAX_PARTS];
	int np = 0;
	enum status st = model_schema_linear_parts(g->cfg, l, f, parts, &np, e);
	for (int i = 0; !st && i < np; i++)
		if (add(g, &parts[i]))
			st = err_set(e, ST_NOMEM, "tensor list");
	return st;
}

/* Pools of bytes per kind: finite values near what a checkpoint holds. */
static uint8_t *make_pool(enum kind k)
{
	uint8_t *p = malloc(POOL_BYTES);
	if (!p)
		return NULL;
	for (size_t i = 0; i < POOL_BYTES; i += 8) {
		uint64_t r = next_u64();
		for (int j = 0; j < 8; j++) {
			uint8_t b = (uint8_t)(r >> (8 * j));
			switch (k) {
			case K_E4M3_W: /* any code but the two NaNs */
				if ((b & 0x7f) == 0x7f)
					b ^= 0x01;
				break;
			case K_E4M3_S: /* positive, 2^-4 .. 2^0 */
				b = (uint8_t)(0x20 + (b % 25));
				break;
			case K_E8M0: /* 2^-10 .. 2^-7 */
				b = (uint8_t)(117 + (b & 3));
				break;
			default:
				break;
			}
			p[i + j] = b;
		}
	}
	if (k == K_BF16) { /* |x| in 2^-7 .. 2^-5 */
		uint16_t *h = (uint16_t *)p;
		for (size_t i = 0; i < POOL_BYTES / 2; i++)
			h[i] = (uint16_t)((h[i] & 0x807f) | ((uint16_t)(120 + (h[i] >> 7) % 3) << 7));
	} else if (k == K_F32) { /* |x| in 2^-7 .. 2^-5 */
		uint32_t *w = (uint32_t *)p;
		for (size_t i = 0; i < POOL_BYTES / 4; i++)
			w[i] = (w[i] & 0x807fffffu) | ((uint32_t)(120 + (w[i] >> 23) % 3) << 23);
	}
	return p;
}

static int write_tensor(FILE *f, const struct tens *t, uint8_t *const pools[K_N], const struct model_config *cfg)
{
	if (t->dt == MODEL_DTYPE_I64 || t->dt == MODEL_DTYPE_I32) { /* expert ids (tid2eid) */
		uint64_t n = t->bytes / model_dtype_bytes(t->dt);
		for (uint64_t i = 0; i < n; i++) {
			int64_t v = (int64_t)((i * 7919 + i / 7) % (uint64_t)cfg->n_routed_experts);
			if (t->dt == MODEL_DTYPE_I64 ? fwrite(&v, 8, 1, f) != 1 : fwrite(&(int32_t){(int32_t)v}, 4, 1, f) != 1)
				return -1;
		}
		return 0;
	}
	if (t->dt == MODEL_DTYPE_F32 && t->nd == 0) { /* NVFP4 global and input scales */
		float one = 1.0f;
		return fwrite(&one, 4, 1, f) == 1 ? 0 : -1;
	}
	const uint8_t *pool = pools[t->kind];
	uint64_t left = t->bytes;
	size_t off = (size_t)(next_u64() % (POOL_BYTES / 4096)) * 4096 % POOL_BYTES;
	while (left) {
		size_t n = POOL_BYTES - off < left ? POOL_BYTES - off : (size_t)left;
		if (fwrite(pool + off, 1, n, f) != n)
			return -1;
		left -= n;
		off = 0;
	}
	return 0;
}

static int copy_file(const char *src, const char *dst)
{
	FILE *a = fopen(src, "rb"), *b = a ? fopen(dst, "wb") : NULL;
	char buf[1 << 16];
	size_t n;
	int rc = a && b ? 0 : -1;
	while (!rc && (n = fread(buf, 1, sizeof buf, a)) > 0)
		rc = fwrite(buf, 1, n, b) == n ? 0 : -1;
	if (a)
		fclose(a);
	if (b && fclose(b))
		rc = -1;
	return rc;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: make_bench_checkpoint CONFIG.json N_LAYERS OUT_DIR [TOKENIZER_DIR]\n");
		return 2;
	}
	int n_layers = atoi(argv[2]);
	const char *out = argv[3];
	json_error_t je;
	json_t *cj = json_load_file(argv[1], 0, &je);
	if (!cj) {
		fprintf(stderr, "%s: %s\n", argv[1], je.text);
		return 1;
	}
	/* the first N layers and the MTP layer(s) */
	int n_all = (int)json_integer_value(json_object_get(cj, "num_hidden_layers"));
	json_t *cr = json_object_get(cj, "compress_ratios");
	if (n_layers < 1 || n_layers > n_all || !json_is_array(cr) || (int)json_array_size(cr) <= n_all) {
		fprintf(stderr, "N_LAYERS must be 1..%d, and the config needs compress_ratios\n", n_all);
		return 1;
	}
	json_t *ncr = json_array();
	for (size_t i = 0; i < json_array_size(cr); i++)
		if ((int)i < n_layers || (int)i >= n_all)
			json_array_append(ncr, json_array_get(cr, i));
	json_object_set_new(cj, "compress_ratios", ncr);
	json_object_set_new(cj, "num_hidden_layers", json_integer(n_layers));
	json_int_t hash = json_integer_value(json_object_get(cj, "num_hash_layers"));
	if (hash > n_layers) /* hash routing covers the first layers only; the config must stay consistent */
		json_object_set_new(cj, "num_hash_layers", json_integer(n_layers));
	json_t *q = json_object_get(cj, "quantization_config"), *ql = q ? json_object_get(q, "quantized_layers") : NULL;
	if (json_is_array(ql)) {
		json_t *nq = json_array();
		for (size_t i = 0; i < json_array_size(ql); i++) {
			const char *s = json_string_value(json_array_get(ql, i));
			int l = -1;
			if (s && sscanf(s, "layers.%d.", &l) == 1 && l >= n_layers)
				continue;
			json_array_append(nq, json_array_get(ql, i));
		}
		json_object_set_new(q, "quantized_layers", nq);
	}
	if (mkdir(out, 0755) && errno != EEXIST) {
		perror(out);
		return 1;
	}
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", out);
	if (json_dump_file(cj, path, JSON_INDENT(2))) {
		fprintf(stderr, "%s: cannot write\n", path);
		return 1;
	}
	struct model_config cfg;
	struct err e = {0};
	if (model_config_load(path, &cfg, &e)) {
		fprintf(stderr, "%s: %s\n", path, e.msg);
		return 1;
	}
	const char *mq = q ? json_string_value(json_object_get(q, "moe_quant_algo")) : NULL;
	struct gen g = {.cfg = &cfg, .routed = mq && !strcmp(mq, "NVFP4") ? MODEL_FMT_NVFP4 : MODEL_FMT_MXFP4};
	struct model_schema_visitor v = {.ctx = &g, .plain = on_plain, .linear = on_linear};
	if (model_schema_walk(&cfg, &v, &e)) {
		fprintf(stderr, "schema: %s\n", e.msg);
		return 1;
	}
	/* shards in schema order */
	int n_shards = 1;
	uint64_t in_shard = 0, total = 0;
	for (size_t i = 0; i < g.n; i++) {
		if (in_shard && in_shard + g.t[i].bytes > SHARD_MAX_BYTES) {
			n_shards++;
			in_shard = 0;
		}
		g.t[i].shard = n_shards - 1;
		g.t[i].off = in_shard;
		in_shard += g.t[i].bytes;
		total += g.t[i].bytes;
	}
	uint8_t *pools[K_N];
	for (int k = 0; k < K_N; k++)
		if (!(pools[k] = make_pool((enum kind)k))) {
			fprintf(stderr, "out of memory\n");
			return 1;
		}
	json_t *wmap = json_object();
	for (int s = 0; s < n_shards; s++) {
		char fname[64];
		snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
		json_t *hdr = json_object();
		json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
		for (size_t i = 0; i < g.n; i++) {
			const struct tens *t = &g.t[i];
			if (t->shard != s)
				continue;
			json_t *sh = json_array();
			for (int d = 0; d < t->nd; d++)
				json_array_append_new(sh, json_integer(t->shape[d]));
			json_object_set_new(hdr, t->name,
					    json_pack("{s:s,s:o,s:[I,I]}", "dtype", model_dtype_str(t->dt), "shape", sh,
						      "data_offsets", (json_int_t)t->off, (json_int_t)(t->off + t->bytes)));
			json_object_set_new(wmap, t->name, json_string(fname));
		}
		char *h = json_dumps(hdr, JSON_COMPACT);
		json_decref(hdr);
		size_t hl = strlen(h), pad = (8 - hl % 8) % 8;
		uint64_t hlen = hl + pad;
		snprintf(path, sizeof path, "%s/%s", out, fname);
		FILE *f = fopen(path, "wb");
		int rc = f ? 0 : -1;
		rc = rc || fwrite(&hlen, 8, 1, f) != 1 || fwrite(h, 1, hl, f) != hl || fwrite("        ", 1, pad, f) != pad;
		free(h);
		for (size_t i = 0; !rc && i < g.n; i++)
			if (g.t[i].shard == s)
				rc = write_tensor(f, &g.t[i], pools, &cfg);
		if (f && fclose(f))
			rc = -1;
		if (rc) {
			fprintf(stderr, "%s: write failed\n", path);
			return 1;
		}
	}
	json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
	if (json_dump_file(idx, path, JSON_INDENT(1))) {
		fprintf(stderr, "%s: cannot write\n", path);
		return 1;
	}
	json_decref(idx);
	if (argc > 4) {
		const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
		for (int i = 0; i < 3; i++) {
			char src[4096];
			snprintf(src, sizeof src, "%s/%s", argv[4], files[i]);
			snprintf(path, sizeof path, "%s/%s", out, files[i]);
			if (copy_file(src, path) && i < 2) {
				fprintf(stderr, "%s: cannot copy\n", src);
				return 1;
			}
		}
	}
	printf("%s: %zu tensors, %d shards, %.2f GiB\n", out, g.n, n_shards, (double)total / (1u << 30));
	for (int k = 0; k < K_N; k++)
		free(pools[k]);
	free(g.t);
	json_decref(cj);
	return 0;
}
