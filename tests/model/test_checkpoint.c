/*
 * tests/model/test_checkpoint.c: opening and validating checkpoint
 * directories, on synthetic checkpoints written here (tests/model/
 * ckpt_fixture.h) in every storage variant, then on broken copies: each
 * error path of model/checkpoint.c must be refused with a message naming
 * the file and the tensor, under ASan/UBSan.
 *
 * Tensor counts, names and shapes below are computed by hand from
 * docs/tiny-model.md, independently of model/schema.c.
 */
#include <ftw.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "model/checkpoint.h"
#include "tests/model/ckpt_fixture.h"
#include "tests/test.h"

#define VOCAB 256

static char root_dir[] = "/tmp/dsv4-test-ckpt-XXXXXX";
static int case_no;

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(p);
}

/* A fresh directory for one case. */
static void case_dir(char *buf, size_t n, const char *what)
{
	snprintf(buf, n, "%s/%02d-%s", root_dir, case_no++, what);
}

/* Write variant v of config c (borrowed) into a new case directory. */
static void write_ckpt(char *dir, size_t n, const char *what, json_t *c, enum fx_variant v, int n_shards)
{
	case_dir(dir, n, what);
	struct fx_ckpt w;
	CHECK(fx_build(&w, c, v, n_shards) == 0);
	fx_write(&w, c, dir);
	fx_free(&w);
}

static json_t *config_for(enum fx_variant v)
{
	json_t *c = fx_tiny_config(VOCAB);
	if (v == FX_FP8)
		fx_add_quant(c, 0);
	if (v == FX_NVFP4 || v == FX_NVFP4_ALL)
		fx_add_quant(c, 1);
	return c;
}

static struct model_checkpoint *open_ok(const char *dir)
{
	struct model_checkpoint *ck = NULL;
	struct err e;
	err_clear(&e);
	struct model_checkpoint_options o = {.dir = dir};
	enum status st = model_checkpoint_create(&ck, &o, &e);
	T_CHECKF(st == ST_OK, "%s: %s", dir, e.msg);
	return st == ST_OK ? ck : NULL;
}

/* Expect dir to be refused with status st and a message containing all of
 * the given strings. */
static void refused(const char *dir, enum status want, const char *a, const char *b, const char *c)
{
	struct model_checkpoint *ck = (struct model_checkpoint *)1;
	struct err e;
	err_clear(&e);
	struct model_checkpoint_options o = {.dir = dir};
	enum status st = model_checkpoint_create(&ck, &o, &e);
	T_CHECKF(st == want, "%s: status %s, expected %s: %s", dir, status_str(st), status_str(want), e.msg);
	T_CHECK(ck == NULL);
	if (st == ST_OK)
		model_checkpoint_destroy(ck);
	const char *needles[] = {a, b, c};
	for (int i = 0; i < 3; i++)
		if (needles[i])
			T_STR_CONTAINS(e.msg, needles[i]);
}

static void check_tensor(struct model_checkpoint *ck, const char *name, enum model_dtype dt, int n_dims,
			 int64_t d0, int64_t d1)
{
	const struct model_tensor *t = model_checkpoint_tensor(ck, name);
	T_CHECKF(t != NULL, "no tensor %s", name);
	if (!t)
		return;
	T_CHECKF(t->dtype == dt, "%s: dtype %s", name, model_dtype_str(t->dtype));
	T_CHECKF(t->n_dims == n_dims, "%s: %d dims", name, t->n_dims);
	if (n_dims >= 1)
		T_CHECKF(t->shape[0] == d0, "%s: shape[0] %lld", name, (long long)t->shape[0]);
	if (n_dims >= 2)
		T_CHECKF(t->shape[1] == d1, "%s: shape[1] %lld", name, (long long)t->shape[1]);
	/* data points into the mapping at file_offset_bytes: compare with the file */
	T_CHECK(t->n_bytes == t->n_elements * model_dtype_bytes(t->dtype));
	T_CHECK(t->file_offset_bytes + t->n_bytes <= model_checkpoint_shard_bytes(ck, t->shard));
	if (t->n_bytes) {
		uint8_t got[16];
		size_t n = t->n_bytes < sizeof got ? (size_t)t->n_bytes : sizeof got;
		FILE *f = fopen(model_checkpoint_shard_path(ck, t->shard), "rb");
		T_CHECK(f && fseek(f, (long)t->file_offset_bytes, SEEK_SET) == 0 && fread(got, 1, n, f) == n);
		if (f)
			fclose(f);
		T_CHECKF(!memcmp(got, t->data, n), "%s: data pointer does not match the file", name);
	}
}

/* ---- Valid checkpoints ---- */

/* The plain (unquantised) tensors every variant has, where they are, and the names none has. */
static void check_plain_tensors(struct model_checkpoint *ck)
{
	check_tensor(ck, "embed.weight", MODEL_DTYPE_BF16, 2, VOCAB, 64);
	check_tensor(ck, "head.weight", MODEL_DTYPE_BF16, 2, VOCAB, 64);
	check_tensor(ck, "hc_head_fn", MODEL_DTYPE_F32, 2, 4, 256);
	check_tensor(ck, "hc_head_scale", MODEL_DTYPE_F32, 1, 1, 0);
	check_tensor(ck, "layers.0.hc_attn_fn", MODEL_DTYPE_F32, 2, 24, 256);
	check_tensor(ck, "layers.5.hc_ffn_scale", MODEL_DTYPE_F32, 1, 3, 0);
	check_tensor(ck, "layers.1.attn.attn_sink", MODEL_DTYPE_F32, 1, 8, 0);
	check_tensor(ck, "layers.2.attn.compressor.wkv.weight", MODEL_DTYPE_BF16, 2, 128, 64);
	check_tensor(ck, "layers.2.attn.compressor.ape", MODEL_DTYPE_F32, 2, 4, 128);
	check_tensor(ck, "layers.3.attn.compressor.ape", MODEL_DTYPE_F32, 2, 8, 64);
	check_tensor(ck, "layers.3.attn.compressor.wgate.weight", MODEL_DTYPE_BF16, 2, 64, 64);
	check_tensor(ck, "layers.4.attn.indexer.weights_proj.weight", MODEL_DTYPE_BF16, 2, 4, 64);
	check_tensor(ck, "layers.4.attn.indexer.compressor.ape", MODEL_DTYPE_F32, 2, 4, 64);
	check_tensor(ck, "layers.4.attn.indexer.compressor.norm.weight", MODEL_DTYPE_BF16, 1, 32, 0);
	check_tensor(ck, "layers.0.ffn.gate.tid2eid", MODEL_DTYPE_I64, 2, VOCAB, 2);
	check_tensor(ck, "layers.2.ffn.gate.bias", MODEL_DTYPE_F32, 1, 8, 0);
	check_tensor(ck, "mtp.0.ffn.gate.bias", MODEL_DTYPE_F32, 1, 8, 0);
	check_tensor(ck, "mtp.0.hnorm.weight", MODEL_DTYPE_BF16, 1, 64, 0);
	check_tensor(ck, "mtp.0.hc_head_base", MODEL_DTYPE_F32, 1, 4, 0);
	T_CHECK(!model_checkpoint_tensor(ck, "layers.0.ffn.gate.bias"));
	T_CHECK(!model_checkpoint_tensor(ck, "layers.3.attn.indexer.wq_b.weight"));
	T_CHECK(!model_checkpoint_tensor(ck, "layers.0.attn.compressor.ape"));
	T_CHECK(!model_checkpoint_tensor(ck, "mtp.0.ffn.gate.tid2eid"));
	T_CHECK(!model_checkpoint_tensor(ck, "nope"));
	const struct model_tensor *t = model_checkpoint_tensor(ck, "layers.4.attn.kv_norm.weight");
	T_CHECK(t && t->layer == 4 && t->group == MODEL_GROUP_OTHER && t->format == MODEL_FMT_NONE);
	T_CHECK(t && t->shard == 1);
	t = model_checkpoint_tensor(ck, "mtp.0.enorm.weight");
	T_CHECK(t && t->layer == 6 && t->shard == 2);
	t = model_checkpoint_tensor(ck, "embed.weight");
	T_CHECK(t && t->layer == -1 && t->shard == 0);
}

/* Linears found by name, with their shapes; names that are not linears, and groups
 * outside the model, are not found. */
static void check_linear_lookup(struct model_checkpoint *ck)
{
	struct model_linear l;
	struct err e;
	T_CHECK(model_checkpoint_linear(ck, "layers.1.attn.wo_a", &l, &e) == ST_OK);
	T_CHECK(l.out == 128 && l.in == 128 && l.weight);
	T_CHECK(model_checkpoint_linear(ck, "layers.0.ffn.experts.3.w2", &l, &e) == ST_OK);
	T_CHECK(l.out == 64 && l.in == 32);
	T_CHECK(model_checkpoint_linear(ck, "mtp.0.ffn.experts.7.w1", &l, &e) == ST_OK);
	T_CHECK(l.out == 32 && l.in == 64);
	T_CHECK(model_checkpoint_linear(ck, "layers.0.attn_norm", &l, &e) == ST_NOTFOUND);
	T_CHECK(model_checkpoint_linear(ck, "layers.9.attn.wq_a", &l, &e) == ST_NOTFOUND);
	T_CHECK(model_checkpoint_group_format(ck, 0, MODEL_GROUP_MTP_PROJ) == MODEL_FMT_NONE);
	T_CHECK(model_checkpoint_group_format(ck, 7, MODEL_GROUP_ATTN) == MODEL_FMT_NONE);
	T_CHECK(model_checkpoint_group_format(ck, -1, MODEL_GROUP_ATTN) == MODEL_FMT_NONE);
}

/* The weight formats variant v stores: dense linears, routed experts, the MTP layer's routed experts. */
struct variant_formats {
	enum model_weight_format dense, routed, mtp_routed;
};

static struct variant_formats variant_formats(enum fx_variant v)
{
	enum model_weight_format dense = MODEL_FMT_BF16, routed = MODEL_FMT_BF16, mtp_routed = MODEL_FMT_BF16;
	switch (v) {
	case FX_BF16: break;
	case FX_DEQ: dense = routed = mtp_routed = MODEL_FMT_F32; break;
	case FX_FP8: dense = MODEL_FMT_FP8_BLOCK; routed = mtp_routed = MODEL_FMT_MXFP4; break;
	case FX_NVFP4:
	case FX_NVFP4_ALL:
		dense = MODEL_FMT_FP8_BLOCK;
		routed = MODEL_FMT_NVFP4;
		mtp_routed = MODEL_FMT_MXFP4;
		break;
	}
	return (struct variant_formats){dense, routed, mtp_routed};
}

/* Every layer's group formats, and the quantised tensors (weights and scales) of f's formats. */
static void check_formats(struct model_checkpoint *ck, struct variant_formats f)
{
	enum model_weight_format dense = f.dense, routed = f.routed, mtp_routed = f.mtp_routed;
	struct model_linear l;
	struct err e;
	for (int L = 0; L < 7; L++) {
		T_CHECK(model_checkpoint_group_format(ck, L, MODEL_GROUP_ATTN) == dense);
		T_CHECK(model_checkpoint_group_format(ck, L, MODEL_GROUP_SHARED_EXPERTS) == dense);
		T_CHECK(model_checkpoint_group_format(ck, L, MODEL_GROUP_ROUTED_EXPERTS) ==
			(L == 6 ? mtp_routed : routed));
	}
	T_CHECK(model_checkpoint_group_format(ck, 6, MODEL_GROUP_MTP_PROJ) == dense);

	T_CHECK(model_checkpoint_linear(ck, "layers.2.attn.indexer.wq_b", &l, &e) == ST_OK);
	T_CHECK(l.format == dense && l.out == 128 && l.in == 64);
	if (dense == MODEL_FMT_FP8_BLOCK) {
		check_tensor(ck, "layers.2.attn.indexer.wq_b.weight", MODEL_DTYPE_F8_E4M3, 2, 128, 64);
		check_tensor(ck, "layers.0.attn.wq_b.scale", MODEL_DTYPE_F8_E8M0, 2, 4, 1);
		check_tensor(ck, "layers.0.attn.wq_b.weight", MODEL_DTYPE_F8_E4M3, 2, 512, 64);
		check_tensor(ck, "mtp.0.e_proj.scale", MODEL_DTYPE_F8_E8M0, 2, 1, 1);
		T_CHECK(l.scale && l.scale->role == MODEL_ROLE_SCALE && !l.scale_2 && !l.input_scale);
	} else {
		T_CHECK(!l.scale);
		check_tensor(ck, "layers.0.attn.wq_b.weight", dense == MODEL_FMT_F32 ? MODEL_DTYPE_F32
										   : MODEL_DTYPE_BF16,
			     2, 512, 64);
	}
	if (routed == MODEL_FMT_MXFP4) {
		check_tensor(ck, "layers.0.ffn.experts.3.w2.weight", MODEL_DTYPE_I8, 2, 64, 16);
		check_tensor(ck, "layers.0.ffn.experts.3.w2.scale", MODEL_DTYPE_F8_E8M0, 2, 64, 1);
		check_tensor(ck, "layers.5.ffn.experts.0.w1.scale", MODEL_DTYPE_F8_E8M0, 2, 32, 2);
	}
	if (routed == MODEL_FMT_NVFP4) {
		check_tensor(ck, "layers.0.ffn.experts.3.w1.weight", MODEL_DTYPE_U8, 2, 32, 32);
		check_tensor(ck, "layers.0.ffn.experts.3.w1.weight_scale", MODEL_DTYPE_F8_E4M3, 2, 32, 4);
		check_tensor(ck, "layers.0.ffn.experts.3.w1.weight_scale_2", MODEL_DTYPE_F32, 0, 0, 0);
		check_tensor(ck, "layers.0.ffn.experts.3.w1.input_scale", MODEL_DTYPE_F32, 0, 0, 0);
		check_tensor(ck, "layers.5.ffn.experts.7.w2.weight_scale", MODEL_DTYPE_F8_E4M3, 2, 64, 2);
		check_tensor(ck, "mtp.0.ffn.experts.7.w2.weight", MODEL_DTYPE_I8, 2, 64, 16);
		check_tensor(ck, "mtp.0.ffn.experts.7.w2.scale", MODEL_DTYPE_F8_E8M0, 2, 64, 1);
		T_CHECK(model_checkpoint_linear(ck, "layers.1.ffn.experts.2.w3", &l, &e) == ST_OK);
		T_CHECK(l.format == MODEL_FMT_NVFP4 && l.out == 32 && l.in == 64 && l.scale && l.scale_2 &&
			l.input_scale);
		T_CHECK(l.scale_2 && l.scale_2->role == MODEL_ROLE_WEIGHT_SCALE_2 && l.scale_2->n_elements == 1);
		T_CHECK(l.input_scale && l.input_scale->role == MODEL_ROLE_INPUT_SCALE);
		T_CHECK(l.weight->group == MODEL_GROUP_ROUTED_EXPERTS && l.weight->layer == 1);
	}
	if (routed == MODEL_FMT_BF16 || routed == MODEL_FMT_F32)
		check_tensor(ck, "layers.0.ffn.experts.3.w2.weight",
			     routed == MODEL_FMT_F32 ? MODEL_DTYPE_F32 : MODEL_DTYPE_BF16, 2, 64, 32);
}

/* Every tensor points into its shard's mapping, within bounds, and is found by its name. */
static void check_all_in_bounds(struct model_checkpoint *ck)
{
	for (size_t k = 0; k < model_checkpoint_n_tensors(ck); k++) {
		const struct model_tensor *x = model_checkpoint_tensor_at(ck, k);
		T_CHECK(x && x->file_offset_bytes + x->n_bytes <= model_checkpoint_shard_bytes(ck, x->shard));
		T_CHECK(x && model_checkpoint_tensor(ck, x->name) == x);
	}
	T_CHECK(model_checkpoint_tensor_at(ck, model_checkpoint_n_tensors(ck)) == NULL);
}

static void test_variants(void)
{
	/* hand count (docs/tiny-model.md): 129 plain tensors; 228 linears of which
	 * 168 routed experts (7 layers x 8 x 3) and 60 dense */
	static const struct {
		enum fx_variant v;
		const char *name;
		size_t n_tensors;
	} vs[] = {{FX_BF16, "bf16", 357}, {FX_FP8, "fp8", 129 + 60 * 2 + 168 * 2},
		  {FX_NVFP4, "nvfp4", 129 + 60 * 2 + 144 * 4 + 24 * 2}, {FX_DEQ, "deq", 357}};
	uint64_t prints[4];
	for (size_t i = 0; i < ARRAY_LEN(vs); i++) {
		char dir[512];
		json_t *c = config_for(vs[i].v);
		write_ckpt(dir, sizeof dir, vs[i].name, c, vs[i].v, 3);
		json_decref(c);
		struct model_checkpoint *ck = open_ok(dir);
		if (!ck)
			continue;
		T_CHECKF(model_checkpoint_n_tensors(ck) == vs[i].n_tensors, "%s: %zu tensors", vs[i].name,
			 model_checkpoint_n_tensors(ck));
		T_CHECK(model_checkpoint_n_shards(ck) == 3);
		T_STR_CONTAINS(model_checkpoint_shard_path(ck, 0), "model-00001-of-00003.safetensors");
		T_STR_CONTAINS(model_checkpoint_shard_path(ck, 2), "model-00003-of-00003.safetensors");
		T_CHECK(model_checkpoint_shard_path(ck, 3) == NULL);
		const struct model_config *cfg = model_checkpoint_config(ck);
		T_CHECK(cfg->hidden_size == 64 && cfg->vocab_size == VOCAB);
		T_CHECK(!strcmp(model_checkpoint_dir(ck), dir));
		prints[i] = model_checkpoint_fingerprint(ck);

		check_plain_tensors(ck);
		check_linear_lookup(ck);
		check_formats(ck, variant_formats(vs[i].v));
		check_all_in_bounds(ck);

		/* the fingerprint is a function of the files */
		struct model_checkpoint *ck2 = open_ok(dir);
		T_CHECK(ck2 && model_checkpoint_fingerprint(ck2) == prints[i]);
		model_checkpoint_destroy(ck2);
		model_checkpoint_destroy(ck);
	}
	T_CHECK(prints[0] != prints[1] && prints[1] != prints[2] && prints[0] != prints[3]);
	model_checkpoint_destroy(NULL);
}

/* A single model.safetensors without an index; tied embeddings. */
static void test_single_file(void)
{
	char dir[512], a[600], b[600];
	json_t *c = config_for(FX_BF16);
	json_object_set_new(c, "tie_word_embeddings", json_true());
	write_ckpt(dir, sizeof dir, "single", c, FX_BF16, 1);
	json_decref(c);
	snprintf(a, sizeof a, "%s/model-00001-of-00001.safetensors", dir);
	snprintf(b, sizeof b, "%s/model.safetensors", dir);
	T_CHECK(rename(a, b) == 0);
	snprintf(a, sizeof a, "%s/model.safetensors.index.json", dir);
	T_CHECK(unlink(a) == 0);
	struct model_checkpoint *ck = open_ok(dir);
	T_CHECK(ck && model_checkpoint_n_tensors(ck) == 356 && model_checkpoint_n_shards(ck) == 1);
	T_CHECK(ck && !model_checkpoint_tensor(ck, "head.weight"));
	model_checkpoint_destroy(ck);
	/* ... and without it either */
	T_CHECK(unlink(b) == 0);
	refused(dir, ST_NOTFOUND, "neither model.safetensors.index.json nor model.safetensors", dir, NULL);
}

/* ---- Broken checkpoints ---- */

struct edit {
	const char *name, *name2;
	const char *file;
	json_int_t a, b;
};

static void edit_rename_tensor(json_t *h, void *ctx)
{
	struct edit *ed = ctx;
	json_t *v = json_object_get(h, ed->name);
	CHECK(v);
	json_object_set(h, ed->name2, v);
	json_object_del(h, ed->name);
}

static void edit_index_rename(json_t *root, void *ctx)
{
	edit_rename_tensor(json_object_get(root, "weight_map"), ctx);
}

static void edit_index_del(json_t *root, void *ctx)
{
	struct edit *ed = ctx;
	json_object_del(json_object_get(root, "weight_map"), ed->name);
}

static void edit_index_set(json_t *root, void *ctx)
{
	struct edit *ed = ctx;
	json_object_set_new(json_object_get(root, "weight_map"), ed->name, json_string(ed->file));
}

static void edit_index_total(json_t *root, void *ctx)
{
	struct edit *ed = ctx;
	json_object_set_new(json_object_get(root, "metadata"), "total_size", json_integer(ed->a));
}

static void edit_index_drop_map(json_t *root, void *ctx)
{
	(void)ctx;
	json_object_del(root, "weight_map");
}

static void edit_dtype(json_t *h, void *ctx)
{
	struct edit *ed = ctx;
	json_object_set_new(json_object_get(h, ed->name), "dtype", json_string(ed->name2));
}

static void edit_shape(json_t *h, void *ctx)
{
	struct edit *ed = ctx;
	json_object_set_new(json_object_get(h, ed->name), "shape", json_pack("[I,I]", ed->a, ed->b));
}

/* Make ed->name's data_offsets those of ed->name2 (same byte count). */
static void edit_overlap(json_t *h, void *ctx)
{
	struct edit *ed = ctx;
	json_t *o = json_object_get(json_object_get(h, ed->name2), "data_offsets");
	json_object_set(json_object_get(h, ed->name), "data_offsets", o);
}

static void edit_config_int(json_t *root, void *ctx)
{
	struct edit *ed = ctx;
	json_object_set_new(root, ed->name, json_integer(ed->a));
}

static void edit_expert_fp8(json_t *root, void *ctx)
{
	(void)ctx;
	json_object_set_new(root, "expert_dtype", json_string("fp8"));
}

static void write_str(const char *path, const char *text)
{
	fx_write_file(path, text, strlen(text));
}

static void truncate_file(const char *path, long by)
{
	FILE *f = fopen(path, "rb+");
	CHECK(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fclose(f);
	CHECK(truncate(path, n - by) == 0);
}

#define DIR_LEN 512
#define PATH_LEN 700

static const char *const S1 = "model-00001-of-00003.safetensors", *const S2 = "model-00002-of-00003.safetensors",
		  *const IDX = "model.safetensors.index.json";

/* A fresh 3-shard FP8 checkpoint of config c in case directory dir (DIR_LEN)
 * named what; p (PATH_LEN) is the path of file in it, the one a case breaks. */
static void fresh_copy(char *dir, char *p, const char *what, json_t *c, const char *file)
{
	write_ckpt(dir, DIR_LEN, what, c, FX_FP8, 3);
	snprintf(p, PATH_LEN, "%s/%s", dir, file);
}

/* fresh_copy, then tensor ed->name renamed to ed->name2 in shard file and in
 * the index alike; p is left at the index. */
static void fresh_copy_renamed(char *dir, char *p, const char *what, json_t *c, const char *file, struct edit *ed)
{
	fresh_copy(dir, p, what, c, file);
	fx_edit_shard(p, edit_rename_tensor, ed);
	snprintf(p, PATH_LEN, "%s/%s", dir, IDX);
	fx_edit_json(p, edit_index_rename, ed);
}

/* A broken copy made by one edit of one file of a fresh checkpoint (a
 * shard's header, or a JSON file), and what its refusal must say. */
struct edit_case {
	const char *what, *file;
	bool shard; /* edit the shard header (fx_edit_shard), else the JSON (fx_edit_json) */
	void (*edit)(json_t *root, void *ctx);
	struct edit ed;
	enum status want;
	const char *a, *b, *c; /* the message contains each that is not NULL */
};

static void run_edit_cases(json_t *c, const struct edit_case *cs, size_t n)
{
	char dir[DIR_LEN], p[PATH_LEN];
	for (size_t i = 0; i < n; i++) {
		struct edit ed = cs[i].ed;
		fresh_copy(dir, p, cs[i].what, c, cs[i].file);
		if (cs[i].shard)
			fx_edit_shard(p, cs[i].edit, &ed);
		else
			fx_edit_json(p, cs[i].edit, &ed);
		refused(dir, cs[i].want, cs[i].a, cs[i].b, cs[i].c);
	}
}

/* Broken shard files: missing, truncated, corrupt headers, overlapping data, wrong dtypes and shapes. */
static void test_broken_shards(void)
{
	char dir[DIR_LEN], p[PATH_LEN];
	json_t *c = config_for(FX_FP8);

	/* a missing shard */
	fresh_copy(dir, p, "missing-shard", c, S2);
	unlink(p);
	refused(dir, ST_NOTFOUND, S2, "missing shard", "tensor ");

	/* a truncated shard */
	fresh_copy(dir, p, "truncated", c, S2);
	truncate_file(p, 100);
	refused(dir, ST_INVALID, S2, "tensor ", "truncated");

	/* truncated into the header */
	fresh_copy(dir, p, "truncated-header", c, S1);
	CHECK(truncate(p, 100) == 0);
	refused(dir, ST_INVALID, S1, "header length", "runs past the end");

	/* a corrupt header */
	fresh_copy(dir, p, "corrupt-header", c, S1);
	FILE *f = fopen(p, "rb+");
	fseek(f, 20, SEEK_SET);
	fwrite("\x01\x02garbage", 1, 9, f);
	fclose(f);
	refused(dir, ST_INVALID, S1, "not valid JSON", NULL);

	/* a huge header length */
	fresh_copy(dir, p, "huge-header", c, S1);
	f = fopen(p, "rb+");
	fwrite("\xff\xff\xff\xff\xff\xff\xff\x7f", 1, 8, f);
	fclose(f);
	refused(dir, ST_INVALID, S1, "header length", "corrupt");

	const struct edit_case cs[] = {
		/* overlapping offsets (same size: attn_norm of layer 0 over ffn_norm) */
		{"overlap", S1, true, edit_overlap, {.name = "layers.0.attn_norm.weight", .name2 = "layers.0.ffn_norm.weight"},
		 ST_INVALID, S1, "overlap", "tensor layers.0."},
		/* a dtype changed to another of the same width */
		{"dtype", S2, true, edit_dtype, {.name = "layers.3.attn.q_norm.weight", .name2 = "F16"}, ST_INVALID, S2,
		 "tensor layers.3.attn.q_norm.weight: dtype F16, expected BF16", NULL},
		/* the scale of an FP8 linear with the wrong dtype */
		{"scale-dtype", S1, true, edit_dtype, {.name = "layers.1.attn.wkv.scale", .name2 = "U8"}, ST_INVALID, S1,
		 "tensor layers.1.attn.wkv.scale: dtype U8, expected F8_E8M0", "FP8 linear"},
		/* a linear in a dtype that is no storage format (MXFP4 is for experts only) */
		{"weight-dtype", S1, true, edit_dtype, {.name = "layers.1.attn.wkv.weight", .name2 = "I8"}, ST_INVALID, S1,
		 "tensor layers.1.attn.wkv.weight: dtype I8 is not a storage format", NULL},
		/* a shape that does not match the config (same byte count) */
		{"shape", S1, true, edit_shape, {.name = "layers.0.attn.wo_a.weight", .a = 64, .b = 256}, ST_INVALID, S1,
		 "tensor layers.0.attn.wo_a.weight: shape [64, 256], expected [128, 128]", NULL},
	};
	run_edit_cases(c, cs, ARRAY_LEN(cs));

	json_decref(c);
}

/* A broken index: names, shards and sizes that disagree with the shards, and malformed JSON. */
static void test_broken_index(void)
{
	char dir[DIR_LEN], p[PATH_LEN];
	json_t *c = config_for(FX_FP8);
	struct edit ed;

	/* a renamed tensor (shard and index agree, the config does not) */
	ed = (struct edit){.name = "layers.2.attn.indexer.compressor.ape", .name2 = "layers.2.attn.indexer.compressor.apex"};
	fresh_copy_renamed(dir, p, "rename", c, S1, &ed);
	refused(dir, ST_INVALID, "model.safetensors.index.json", "tensor layers.2.attn.indexer.compressor.ape: missing",
		NULL);

	/* renamed in the shard only */
	fresh_copy(dir, p, "rename-shard", c, S1);
	fx_edit_shard(p, edit_rename_tensor, &ed);
	refused(dir, ST_INVALID, S1, "tensor layers.2.attn.indexer.compressor.apex: not listed in", NULL);

	const struct edit_case cs[] = {
		/* in the index but not in its shard */
		{"index-extra", IDX, false, edit_index_set, {.name = "layers.0.attn.phantom", .file = S1}, ST_INVALID, S1,
		 "tensor layers.0.attn.phantom: listed in", "not in this shard"},
		/* in a shard, but the index says another shard */
		{"index-wrong-shard", IDX, false, edit_index_set, {.name = "layers.4.ffn_norm.weight", .file = S1},
		 ST_INVALID, S2, "tensor layers.4.ffn_norm.weight", "lists it in model-00001"},
		/* in a shard but not in the index */
		{"index-missing", IDX, false, edit_index_del, {.name = "layers.4.ffn_norm.weight"}, ST_INVALID, S2,
		 "tensor layers.4.ffn_norm.weight: not listed in", NULL},
		/* an index naming a file outside the directory */
		{"index-path", IDX, false, edit_index_set, {.name = "embed.weight", .file = "../evil.safetensors"},
		 ST_INVALID, "model.safetensors.index.json", "tensor embed.weight", "plain file name"},
		/* total_size disagrees */
		{"total-size", IDX, false, edit_index_total, {.a = 12345}, ST_INVALID, "model.safetensors.index.json",
		 "total_size 12345", NULL},
	};
	run_edit_cases(c, cs, ARRAY_LEN(cs));

	/* index without weight_map; index that is not JSON */
	fresh_copy(dir, p, "index-no-map", c, IDX);
	fx_edit_json(p, edit_index_drop_map, NULL);
	refused(dir, ST_INVALID, "model.safetensors.index.json", "no weight_map", NULL);
	write_str(p, "{\"weight_map\": ");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "not valid JSON", NULL);
	write_str(p, "{\"weight_map\": {}}");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "empty", NULL);

	write_str(p, "[1, 2]");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "top level is not an object", NULL);
	write_str(p, "{\"weight_map\": []}");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "weight_map is not an object", NULL);
	write_str(p, "{\"metadata\": 1, \"weight_map\": {}}");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "metadata is not an object", NULL);
	write_str(p, "{\"metadata\": {\"total_size\": \"9\"}, \"weight_map\": {}}");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "total_size is not a non-negative integer", NULL);
	write_str(p, "{\"weight_map\": {\"\": \"a.safetensors\"}}");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "name empty", NULL);
	write_str(p, "{\"weight_map\": {\"x\": 3}}");
	refused(dir, ST_INVALID, "model.safetensors.index.json", "tensor x", "plain file name");

	json_decref(c);
}

/* A shard that is no file, a missing linear weight, config.json edits, and no directory at all. */
static void test_broken_config(void)
{
	char dir[DIR_LEN], p[PATH_LEN];
	json_t *c = config_for(FX_FP8);
	struct edit ed;

	/* a shard that is a directory */
	fresh_copy(dir, p, "shard-dir", c, S2);
	unlink(p);
	mkdir(p, 0755);
	refused(dir, ST_IO, S2, "not a regular file", "tensor ");
	rmdir(p);

	/* a linear whose .weight is missing (removed from shard and index) */
	ed = (struct edit){.name = "layers.5.ffn.shared_experts.w2.weight", .name2 = "layers.5.ffn.shared_experts.w2.weigh"};
	fresh_copy_renamed(dir, p, "no-linear-weight", c, S2, &ed);
	refused(dir, ST_INVALID, "tensor layers.5.ffn.shared_experts.w2.weight: missing", "shared experts linear",
		"model.safetensors.index.json");

	const struct edit_case cs[] = {
		/* expert_dtype fp8 with MXFP4 experts */
		{"expert-dtype-fp8", "config.json", false, edit_expert_fp8, {0}, ST_INVALID,
		 "tensor layers.0.ffn.experts.0.w1.weight", "expert_dtype fp8", S1},
		/* config.json changed: a shape no longer matches */
		{"config-shape", "config.json", false, edit_config_int, {.name = "o_lora_rank", .a = 16}, ST_INVALID,
		 "tensor layers.0.attn.wo_a.weight: shape [128, 128], expected [64, 128]", S1, NULL},
		/* config.json: an inconsistent field */
		{"config-topk", "config.json", false, edit_config_int, {.name = "index_topk", .a = 0}, ST_INVALID,
		 "config.json: field index_topk", NULL, NULL},
	};
	run_edit_cases(c, cs, ARRAY_LEN(cs));

	/* config.json missing; no directory */
	fresh_copy(dir, p, "no-config", c, "config.json");
	unlink(p);
	refused(dir, ST_NOTFOUND, "config.json", "cannot open", NULL);
	refused("/nonexistent/dsv4/ckpt", ST_NOTFOUND, "/nonexistent/dsv4/ckpt", "not a directory", NULL);
	struct model_checkpoint *ck = NULL;
	struct err e;
	T_CHECK(model_checkpoint_create(&ck, NULL, &e) == ST_INVALID && !ck);
	struct model_checkpoint_options o = {.dir = ""};
	T_CHECK(model_checkpoint_create(&ck, &o, &e) == ST_INVALID && !ck);
	T_STR_CONTAINS(e.msg, "no directory");
	json_decref(c);
}

/* Tensor set changes, made on the fixture's list before writing. */
static void test_broken_sets(void)
{
	char dir[512];
	struct fx_ckpt w;

	/* an unknown tensor */
	json_t *c = config_for(FX_NVFP4);
	CHECK(fx_build(&w, c, FX_NVFP4, 3) == 0);
	struct fx_tensor extra = w.t[0];
	snprintf(extra.name, sizeof extra.name, "layers.3.attn.extra.weight");
	extra.shard = 1;
	w.t = realloc(w.t, (w.n + 1) * sizeof *w.t);
	w.cap = w.n + 1;
	w.t[w.n++] = extra;
	case_dir(dir, sizeof dir, "unknown");
	fx_write(&w, c, dir);
	refused(dir, ST_INVALID, "model-00002-of-00003.safetensors", "tensor layers.3.attn.extra.weight: unknown",
		NULL);
	/* the same for a layer the config does not have */
	snprintf(w.t[w.n - 1].name, sizeof w.t[w.n - 1].name, "layers.6.attn_norm.weight");
	case_dir(dir, sizeof dir, "unknown-layer");
	fx_write(&w, c, dir);
	refused(dir, ST_INVALID, "tensor layers.6.attn_norm.weight: unknown", NULL, NULL);
	w.n--;

	/* a missing companion: NVFP4 without input_scale */
	int64_t k = fx_find(&w, "layers.4.ffn.experts.5.w2.input_scale");
	CHECK(k >= 0);
	struct fx_tensor saved = w.t[k];
	w.t[k] = w.t[--w.n];
	case_dir(dir, sizeof dir, "no-input-scale");
	fx_write(&w, c, dir);
	refused(dir, ST_INVALID, "tensor layers.4.ffn.experts.5.w2.input_scale: missing", "NVFP4 linear",
		"model.safetensors.index.json");
	w.t[w.n++] = w.t[k];
	w.t[k] = saved;

	/* one expert in another format than the rest of its layer */
	k = fx_find(&w, "layers.2.ffn.experts.6.w1.weight");
	CHECK(k >= 0);
	w.t[k].dtype = MODEL_DTYPE_I8; /* MXFP4 in an NVFP4 layer; same bytes */
	case_dir(dir, sizeof dir, "mixed-experts");
	fx_write(&w, c, dir);
	refused(dir, ST_INVALID, "tensor layers.2.ffn.experts.6.w1.weight", "moe_quant_algo is NVFP4", NULL);
	w.t[k].dtype = MODEL_DTYPE_U8;

	/* an NVFP4 checkpoint whose config lacks moe_quant_algo */
	json_t *c8 = config_for(FX_FP8);
	case_dir(dir, sizeof dir, "nvfp4-no-moe-algo");
	fx_write(&w, c8, dir);
	refused(dir, ST_INVALID, "tensor layers.0.ffn.experts.0.w1.weight", "stored as NVFP4",
		"moe_quant_algo is not NVFP4");
	fx_free(&w);

	/* NVFP4 MTP experts although quantization_config.ignore has mtp.* */
	CHECK(fx_build(&w, c, FX_NVFP4_ALL, 3) == 0);
	case_dir(dir, sizeof dir, "nvfp4-mtp");
	fx_write(&w, c, dir);
	refused(dir, ST_INVALID, "tensor mtp.0.ffn.experts.0.w1.weight", "ignore excludes mtp", NULL);
	/* ... which is fine when the ignore list does not exclude mtp */
	json_t *cn = json_deep_copy(c);
	json_object_set_new(json_object_get(cn, "quantization_config"), "ignore", json_pack("[s]", "head"));
	case_dir(dir, sizeof dir, "nvfp4-mtp-ok");
	fx_write(&w, cn, dir);
	struct model_checkpoint *ck = open_ok(dir);
	T_CHECK(ck && model_checkpoint_group_format(ck, 6, MODEL_GROUP_ROUTED_EXPERTS) == MODEL_FMT_NVFP4);
	model_checkpoint_destroy(ck);
	json_decref(cn);
	fx_free(&w);

	/* quantized tensors without quantization_config */
	json_t *cb = config_for(FX_BF16);
	CHECK(fx_build(&w, c8, FX_FP8, 3) == 0);
	case_dir(dir, sizeof dir, "fp8-no-quant-config");
	fx_write(&w, cb, dir);
	refused(dir, ST_INVALID, "stored as FP8, but config.json has no quantization_config", "tensor layers.0.attn.wq_a.weight",
		"model-00001-of-00003.safetensors");
	fx_free(&w);

	/* quantization_config but nothing quantized; expert_dtype contradicted */
	CHECK(fx_build(&w, cb, FX_BF16, 3) == 0);
	json_t *cq = json_deep_copy(c8);
	json_object_del(cq, "expert_dtype");
	case_dir(dir, sizeof dir, "quant-config-unquantized");
	fx_write(&w, cq, dir);
	refused(dir, ST_INVALID, "quantization_config is present but no tensor is quantized",
		"tensor layers.0.attn.wq_a.weight is BF16",
		NULL);
	case_dir(dir, sizeof dir, "expert-dtype-fp4-bf16");
	fx_write(&w, c8, dir);
	refused(dir, ST_INVALID, "tensor layers.0.ffn.experts.0.w1.weight", "expert_dtype fp4", NULL);
	json_decref(cq);

	/* one expert F32 among BF16 ones: inconsistent within the group */
	k = fx_find(&w, "layers.5.ffn.experts.1.w3.weight");
	CHECK(k >= 0);
	w.t[k].dtype = MODEL_DTYPE_F32;
	case_dir(dir, sizeof dir, "mixed-dtype-group");
	fx_write(&w, cb, dir);
	refused(dir, ST_INVALID, "tensor layers.5.ffn.experts.1.w3.weight: stored as F32",
		"layers.5.ffn.experts.0.w1.weight", "is BF16");
	fx_free(&w);

	/* MXFP4 needs in % 32 == 0: hidden_size 48 breaks w1/w3 */
	json_t *c48 = json_deep_copy(c8);
	json_object_set_new(c48, "hidden_size", json_integer(48));
	CHECK(fx_build(&w, c48, FX_BF16, 3) == 0);
	for (size_t i = 0; i < w.n; i++)
		if (strstr(w.t[i].name, ".ffn.experts.")) {
			w.t[i].dtype = MODEL_DTYPE_I8; /* MXFP4-packed [out, in/2] */
			w.t[i].shape[1] /= 2;
		}
	case_dir(dir, sizeof dir, "mxfp4-odd");
	fx_write(&w, c48, dir);
	refused(dir, ST_INVALID, "MXFP4 needs in (48) to be a multiple of 32", "tensor layers.0.ffn.experts.0.w1",
		"model-00001-of-00003.safetensors");
	fx_free(&w);
	json_decref(c48);
	json_decref(c8);
	json_decref(cb);
	json_decref(c);
}


/* ---- Random mutations of the small files, through the whole open path ---- */

static uint64_t fz_state = 0x9e3779b97f4a7c15ull;

static uint64_t fz_rnd(void)
{
	fz_state ^= fz_state << 13;
	fz_state ^= fz_state >> 7;
	fz_state ^= fz_state << 17;
	return fz_state;
}

static uint8_t *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	CHECK(f);
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc(*n + 64);
	CHECK(fread(b, 1, *n, f) == *n);
	fclose(f);
	return b;
}

/* config.json, the index and the MTP shard (its header and data) are
 * mutated one at a time; each open must succeed or fail with a message. */
static void test_fuzz_open(void)
{
	char base[512], mut[512], p[700], q[700];
	json_t *c = config_for(FX_NVFP4);
	write_ckpt(base, sizeof base, "fuzz-base", c, FX_NVFP4, 3);
	json_decref(c);
	case_dir(mut, sizeof mut, "fuzz-mutant");
	mkdir(mut, 0755);
	const char *files[] = {"config.json", "model.safetensors.index.json", "model-00003-of-00003.safetensors"};
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s/%s", base, files[i]);
		snprintf(q, sizeof q, "%s/%s", mut, files[i]);
		CHECK(symlink(p, q) == 0);
	}
	for (int i = 1; i <= 2; i++) {
		snprintf(p, sizeof p, "%s/model-%05d-of-00003.safetensors", base, i);
		snprintf(q, sizeof q, "%s/model-%05d-of-00003.safetensors", mut, i);
		CHECK(symlink(p, q) == 0);
	}
	const char *s = getenv("DSV4_FUZZ_SEED");
	if (!s)
		s = getenv("DSV4_TEST_SEED");
	fz_state = s ? strtoull(s, NULL, 0) | 1 : ((uint64_t)time(NULL) << 16) ^ (uint64_t)getpid();
	fprintf(stderr, "checkpoint fuzz seed %llu (DSV4_TEST_SEED to repeat)\n", (unsigned long long)fz_state);
	int n_ok = 0, n_refused = 0;
	for (int it = 0; it < 300; it++) {
		int which = (int)(fz_rnd() % 3);
		snprintf(p, sizeof p, "%s/%s", base, files[which]);
		snprintf(q, sizeof q, "%s/%s", mut, files[which]);
		size_t n;
		uint8_t *b = slurp(p, &n);
		/* the shard: mostly its header, where the structure is */
		size_t span = which == 2 ? (n < 4096 ? n : 4096) : n;
		for (int m = 0, k = 1 + (int)(fz_rnd() % 3); m < k && n; m++) {
			size_t at = (size_t)(fz_rnd() % span);
			switch (fz_rnd() % 4) {
			case 0: b[at] = (uint8_t)fz_rnd(); break;
			case 1: b[at] ^= (uint8_t)(1u << (fz_rnd() % 8)); break;
			case 2: n = at; break;
			case 3:
				if (b[at] >= '0' && b[at] <= '9')
					b[at] = (uint8_t)('0' + fz_rnd() % 10);
				else
					b[at] = "{}[],:\"-"[fz_rnd() % 8];
				break;
			}
			if (span > n)
				span = n ? n : 1;
		}
		unlink(q);
		fx_write_file(q, b, n);
		free(b);
		struct model_checkpoint *ck = NULL;
		struct err e;
		err_clear(&e);
		struct model_checkpoint_options o = {.dir = mut};
		enum status st = model_checkpoint_create(&ck, &o, &e);
		if (st == ST_OK) {
			n_ok++;
			T_CHECK(ck && model_checkpoint_n_tensors(ck) > 0);
			model_checkpoint_destroy(ck);
		} else {
			n_refused++;
			T_CHECKF(ck == NULL && e.msg[0], "iteration %d: status %s with no message", it, status_str(st));
			T_CHECKF(strstr(e.msg, mut) || strstr(e.msg, "config.json") || strstr(e.msg, ".safetensors"),
				 "iteration %d: message names no file: %s", it, e.msg);
		}
		unlink(q);
		CHECK(symlink(p, q) == 0);
	}
	fprintf(stderr, "checkpoint fuzz: %d opened, %d refused\n", n_ok, n_refused);
	T_CHECK(n_refused > 100);
}

/* The schema for the real DeepSeek-V4-Flash config (dsv4.md §1.1) in the
 * release's formats must give the real checkpoint's numbers (dsv4.md §5.1,
 * §5.2, counted from the actual files): 69,187 tensors, 159,609,485,896
 * bytes (148.648 GiB; 145.30 GiB without MTP), 13,369,344 bytes per expert. */
static void test_flash_schema(void)
{
	json_t *c = fx_flash_config();
	json_t *r = json_object_get(c, "compress_ratios");
	fx_add_quant(c, 0);
	struct fx_ckpt w;
	CHECK(fx_build(&w, c, FX_FP8, 3) == 0);
	uint64_t total = 0, mtp = 0, expert = 0;
	for (size_t i = 0; i < w.n; i++) {
		uint64_t b = fx_bytes(&w.t[i]);
		total += b;
		if (!strncmp(w.t[i].name, "mtp.", 4))
			mtp += b;
		if (!strncmp(w.t[i].name, "layers.17.ffn.experts.200.", 26))
			expert += b;
	}
	T_CHECKF(w.n == 69187, "%zu tensors", w.n);
	T_CHECKF(total == 159609485896ull, "%llu bytes", (unsigned long long)total);
	T_CHECK(expert == 13369344);
	T_CLOSE((double)(total - mtp) / (1u << 30), 145.30, 0.005, 0);
	int64_t k = fx_find(&w, "layers.10.attn.wo_a.scale");
	T_CHECK(k >= 0 && w.t[k].shape[0] == 64 && w.t[k].shape[1] == 32);
	k = fx_find(&w, "layers.42.attn.indexer.wq_b.weight");
	T_CHECK(k >= 0 && w.t[k].dtype == MODEL_DTYPE_F8_E4M3 && w.t[k].shape[0] == 8192 && w.t[k].shape[1] == 1024);
	k = fx_find(&w, "layers.0.ffn.experts.255.w2.scale");
	T_CHECK(k >= 0 && w.t[k].dtype == MODEL_DTYPE_F8_E8M0 && w.t[k].shape[0] == 4096 && w.t[k].shape[1] == 64);
	T_CHECK(fx_find(&w, "layers.41.attn.compressor.ape") >= 0 && fx_find(&w, "layers.41.attn.indexer.wq_b.weight") < 0);
	fx_free(&w);

	/* the 0731 release: three DSpark stages in place of the NextN layer (dsv4-0731.md: its index
	 * lists 72,317 tensors, total_size 166,878,536,440 bytes; 4,705 of them mtp.*) */
	json_array_append_new(r, json_integer(0));
	json_array_append_new(r, json_integer(0));
	json_t *d = json_pack("{s:i, s:i, s:[i,i,i], s:i}", "dspark_block_size", 5, "dspark_noise_token_id", 128799,
			      "dspark_target_layer_ids", 40, 41, 42, "dspark_markov_rank", 256);
	json_object_update(c, d);
	json_decref(d);
	CHECK(fx_build(&w, c, FX_FP8, 3) == 0);
	total = mtp = 0;
	size_t n_mtp = 0;
	for (size_t i = 0; i < w.n; i++) {
		uint64_t b = fx_bytes(&w.t[i]);
		total += b;
		if (!strncmp(w.t[i].name, "mtp.", 4))
			mtp += b, n_mtp++;
	}
	T_CHECKF(w.n == 72317, "0731: %zu tensors", w.n);
	T_CHECKF(n_mtp == 4705, "0731: %zu mtp tensors", n_mtp);
	T_CHECKF(total == 166878536440ull, "0731: %llu bytes", (unsigned long long)total);
	k = fx_find(&w, "mtp.0.main_proj.scale");
	T_CHECK(k >= 0 && w.t[k].dtype == MODEL_DTYPE_F8_E8M0 && w.t[k].shape[0] == 32 && w.t[k].shape[1] == 96);
	k = fx_find(&w, "mtp.2.confidence_head.proj.weight");
	T_CHECK(k >= 0 && w.t[k].dtype == MODEL_DTYPE_BF16 && w.t[k].shape[0] == 1 && w.t[k].shape[1] == 4352);
	k = fx_find(&w, "mtp.1.ffn.experts.3.w2.scale");
	T_CHECK(k >= 0 && w.t[k].dtype == MODEL_DTYPE_F8_E8M0 && w.t[k].shape[0] == 4096 && w.t[k].shape[1] == 64);
	T_CHECK(fx_find(&w, "mtp.0.e_proj.weight") < 0 && fx_find(&w, "mtp.1.norm.weight") < 0);
	fx_free(&w);
	/* the NVFP4 conversion leaves the 4,705 mtp.* tensors as they were (draft experts MXFP4) */
	fx_add_quant(c, 1);
	CHECK(fx_build(&w, c, FX_NVFP4, 3) == 0);
	n_mtp = 0;
	for (size_t i = 0; i < w.n; i++)
		n_mtp += !strncmp(w.t[i].name, "mtp.", 4);
	T_CHECKF(n_mtp == 4705, "0731 NVFP4: %zu mtp tensors", n_mtp);
	k = fx_find(&w, "mtp.2.ffn.experts.255.w1.weight");
	T_CHECK(k >= 0 && w.t[k].dtype == MODEL_DTYPE_I8);
	k = fx_find(&w, "layers.42.ffn.experts.255.w1.weight_scale");
	T_CHECK(k >= 0 && w.t[k].dtype == MODEL_DTYPE_F8_E4M3);
	fx_free(&w);
	json_decref(c);
}

int main(void)
{
	if (!mkdtemp(root_dir))
		return test_skip("mkdtemp failed");
	test_flash_schema();
	test_variants();
	test_single_file();
	test_broken_shards();
	test_broken_index();
	test_broken_config();
	test_broken_sets();
	test_fuzz_open();
	nftw(root_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return test_exit();
}
