/*
 * model/checkpoint.c: open a checkpoint directory and validate it completely.
 *
 * Owns the join of three sources that must agree: config.json (what the
 * model is), model.safetensors.index.json (which file holds which tensor) and
 * the shard headers (what each file holds). The schema walk (model/schema.c)
 * turns the config into the expected tensor set; this file matches it against
 * what is on disk and records, per tensor, its layer, group, role and the
 * detected storage format. Nothing is copied: tensors point into the maps.
 */
#include "model/checkpoint.h"

#include "model/config_overrides.h"
#include "model/dummy.h"

#include "common/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_FILE "model.safetensors.index.json"
#define SINGLE_FILE "model.safetensors"

struct ckpt_shard {
	char *name;               /* file name inside dir */
	int first_seen;           /* position in the index before sorting by name */
	struct model_st_file f;   /* mapped and parsed */
	size_t n_listed;          /* tensors the index puts here */
	const char *first_listed; /* one of them, for messages */
};

struct model_checkpoint {
	char *dir;
	struct model_config cfg;
	int n_shards;
	struct ckpt_shard *shards;
	size_t n_tensors;
	struct model_tensor *tensors;
	int *index_shard;         /* [n_tensors]: shard the index names (-1 before it is known) */
	uint8_t *present;         /* [n_tensors]: found in its shard */
	uint8_t *expected;        /* [n_tensors]: claimed by the schema */
	char *names;              /* names taken from the index */
	size_t table_cap;         /* power of two */
	uint32_t *table;          /* tensor index + 1; 0 = empty */
	enum model_weight_format (*group_fmt)[MODEL_GROUP_COUNT]; /* [n_layers_total] */
	const char *(*group_first)[MODEL_GROUP_COUNT];           /* a tensor that set it */
	uint64_t fingerprint;
	uint64_t total_size;      /* index metadata.total_size, if has_total_size */
	bool has_total_size;
	struct model__dummy dummy; /* --load-format dummy: owns the data mapping */
};

/* ---- Small helpers ---- */

static char *path_join(const char *dir, const char *name)
{
	size_t a = strlen(dir), b = strlen(name);
	char *p = malloc(a + b + 2);
	if (!p)
		return NULL;
	memcpy(p, dir, a);
	p[a] = '/';
	memcpy(p + a + 1, name, b + 1);
	return p;
}

static bool file_exists(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0;
}

static uint64_t name_hash(const char *s)
{
	return model_hash_bytes(MODEL_HASH_INIT, s, strlen(s));
}

static enum status table_build(struct model_checkpoint *ck, const char *file, struct err *e)
{
	size_t cap = 16;
	while (cap < ck->n_tensors * 2)
		cap *= 2;
	ck->table = calloc(cap, sizeof *ck->table);
	if (!ck->table)
		return err_set(e, ST_NOMEM, "%s: out of memory", file);
	ck->table_cap = cap;
	for (size_t i = 0; i < ck->n_tensors; i++) {
		size_t h = (size_t)name_hash(ck->tensors[i].name) & (cap - 1);
		while (ck->table[h]) {
			if (!strcmp(ck->tensors[ck->table[h] - 1].name, ck->tensors[i].name))
				return err_set(e, ST_INVALID, "%s: tensor %s: listed twice", file, ck->tensors[i].name);
			h = (h + 1) & (cap - 1);
		}
		ck->table[h] = (uint32_t)(i + 1);
	}
	return ST_OK;
}

static long table_find(const struct model_checkpoint *ck, const char *name)
{
	if (!ck->table_cap)
		return -1;
	size_t h = (size_t)name_hash(name) & (ck->table_cap - 1);
	while (ck->table[h]) {
		if (!strcmp(ck->tensors[ck->table[h] - 1].name, name))
			return (long)ck->table[h] - 1;
		h = (h + 1) & (ck->table_cap - 1);
	}
	return -1;
}

/* A shard name from the index must be a plain file name inside dir. */
static bool valid_shard_name(const char *s)
{
	size_t n = strlen(s);
	return n > 0 && n < 256 && !strchr(s, '/') && s[0] != '.';
}

static enum status add_shard(struct model_checkpoint *ck, const char *name, int *idx, struct err *e)
{
	/* Names repeat in long runs in the index: check the last one first. */
	for (int i = ck->n_shards - 1; i >= 0; i--)
		if (!strcmp(ck->shards[i].name, name)) {
			*idx = i;
			return ST_OK;
		}
	if (ck->n_shards >= MODEL_CKPT_MAX_SHARDS)
		return err_set(e, ST_INVALID, "%s: more than %d shards", INDEX_FILE, MODEL_CKPT_MAX_SHARDS);
	struct ckpt_shard *s = realloc(ck->shards, (size_t)(ck->n_shards + 1) * sizeof *s);
	if (!s)
		return err_set(e, ST_NOMEM, "%s: out of memory", INDEX_FILE);
	ck->shards = s;
	memset(&s[ck->n_shards], 0, sizeof *s);
	s[ck->n_shards].name = strdup(name);
	if (!s[ck->n_shards].name)
		return err_set(e, ST_NOMEM, "%s: out of memory", INDEX_FILE);
	s[ck->n_shards].first_seen = ck->n_shards;
	*idx = ck->n_shards++;
	return ST_OK;
}

static int cmp_shard_name(const void *a, const void *b)
{
	return strcmp(((const struct ckpt_shard *)a)->name, ((const struct ckpt_shard *)b)->name);
}

/* Order shards by file name (model-00001-of-N first) and renumber the index. */
static enum status sort_shards(struct model_checkpoint *ck, struct err *e)
{
	qsort(ck->shards, (size_t)ck->n_shards, sizeof *ck->shards, cmp_shard_name);
	int *to = malloc((size_t)ck->n_shards * sizeof *to);
	if (!to)
		return err_set(e, ST_NOMEM, "out of memory");
	for (int s = 0; s < ck->n_shards; s++)
		to[ck->shards[s].first_seen] = s;
	for (size_t i = 0; i < ck->n_tensors; i++)
		ck->index_shard[i] = to[ck->index_shard[i]];
	free(to);
	return ST_OK;
}

static enum status alloc_tensors(struct model_checkpoint *ck, size_t n, const char *file, struct err *e)
{
	ck->n_tensors = n;
	ck->tensors = calloc(n ? n : 1, sizeof *ck->tensors);
	ck->index_shard = calloc(n ? n : 1, sizeof *ck->index_shard);
	ck->present = calloc(n ? n : 1, 1);
	ck->expected = calloc(n ? n : 1, 1);
	if (!ck->tensors || !ck->index_shard || !ck->present || !ck->expected)
		return err_set(e, ST_NOMEM, "%s: out of memory for %zu tensors", file, n);
	return ST_OK;
}

/* ---- The index ---- */

static enum status parse_index(struct model_checkpoint *ck, const char *path, const char *json, size_t n_bytes,
			       struct err *e)
{
	json_error_t je;
	json_t *root = json_loadb(json, n_bytes, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return err_set(e, ST_INVALID, "%s: not valid JSON: line %d column %d: %s", path, je.line, je.column,
			       je.text);
	enum status st = ST_OK;
	json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
	json_t *meta = json_is_object(root) ? json_object_get(root, "metadata") : NULL;
	if (!json_is_object(root))
		st = err_set(e, ST_INVALID, "%s: top level is not an object", path);
	else if (!wm)
		st = err_set(e, ST_INVALID, "%s: no weight_map", path);
	else if (!json_is_object(wm))
		st = err_set(e, ST_INVALID, "%s: weight_map is not an object", path);
	else if (json_object_size(wm) > MODEL_CKPT_MAX_TENSORS)
		st = err_set(e, ST_INVALID, "%s: more than %u tensors", path, MODEL_CKPT_MAX_TENSORS);
	else if (meta && !json_is_null(meta) && !json_is_object(meta))
		st = err_set(e, ST_INVALID, "%s: metadata is not an object", path);
	if (st == ST_OK && json_is_object(meta)) {
		json_t *ts = json_object_get(meta, "total_size");
		if (ts && !json_is_null(ts)) {
			if (!json_is_integer(ts) || json_integer_value(ts) < 0)
				st = err_set(e, ST_INVALID, "%s: metadata.total_size is not a non-negative integer", path);
			else {
				ck->has_total_size = true;
				ck->total_size = (uint64_t)json_integer_value(ts);
			}
		}
	}
	size_t names_bytes = 0;
	const char *key;
	json_t *v;
	if (st == ST_OK) {
		json_object_foreach(wm, key, v) {
			size_t kl = strlen(key);
			if (kl == 0 || kl > MODEL_ST_MAX_NAME_BYTES) {
				st = err_set(e, ST_INVALID, "%s: tensor %.64s: name empty or too long", path, key);
				break;
			}
			if (!json_is_string(v) || !valid_shard_name(json_string_value(v))) {
				st = err_set(e, ST_INVALID, "%s: tensor %s: file is not a plain file name in the directory",
					     path, key);
				break;
			}
			names_bytes += kl + 1;
		}
	}
	if (st == ST_OK)
		st = alloc_tensors(ck, json_object_size(wm), path, e);
	if (st == ST_OK && !(ck->names = malloc(names_bytes ? names_bytes : 1)))
		st = err_set(e, ST_NOMEM, "%s: out of memory", path);
	if (st == ST_OK) {
		size_t i = 0, off = 0;
		json_object_foreach(wm, key, v) {
			size_t kl = strlen(key);
			memcpy(ck->names + off, key, kl + 1);
			ck->tensors[i].name = ck->names + off;
			off += kl + 1;
			int s;
			if ((st = add_shard(ck, json_string_value(v), &s, e)) != ST_OK)
				break;
			ck->index_shard[i] = s;
			if (!ck->shards[s].n_listed++)
				ck->shards[s].first_listed = ck->tensors[i].name;
			i++;
		}
	}
	json_decref(root);
	if (st == ST_OK && ck->n_shards == 0)
		st = err_set(e, ST_INVALID, "%s: weight_map is empty", path);
	if (st == ST_OK)
		st = sort_shards(ck, e);
	return st;
}

/* ---- Shards ---- */

static enum status open_shards(struct model_checkpoint *ck, struct err *e)
{
	for (int s = 0; s < ck->n_shards; s++) {
		struct ckpt_shard *sh = &ck->shards[s];
		char *path = path_join(ck->dir, sh->name);
		if (!path)
			return err_set(e, ST_NOMEM, "out of memory");
		enum status st = model_st_file_open(path, &sh->f, e);
		free(path);
		if (st == ST_NOTFOUND && sh->first_listed)
			return err_set(e, st, "%s/%s: missing shard (%s lists %zu tensors in it, e.g. tensor %s)", ck->dir,
				       sh->name, INDEX_FILE, sh->n_listed, sh->first_listed);
		if (st == ST_IO && sh->first_listed) {
			char msg[ERR_MSG_BYTES];
			snprintf(msg, sizeof msg, "%s", e ? e->msg : "");
			return err_set(e, st, "%.300s (a shard of %zu tensors, e.g. tensor %.100s)", msg, sh->n_listed,
				       sh->first_listed);
		}
		if (st != ST_OK)
			return st;
	}
	return ST_OK;
}

/* Match every shard tensor with its index entry. */
static enum status join_index(struct model_checkpoint *ck, struct err *e)
{
	for (int s = 0; s < ck->n_shards; s++) {
		const struct model_st_file *f = &ck->shards[s].f;
		for (size_t j = 0; j < f->header.n_tensors; j++) {
			const struct model_st_tensor *st = &f->header.tensors[j];
			long i = table_find(ck, st->name);
			if (i < 0)
				return err_set(e, ST_INVALID, "%s: tensor %s: not listed in %s", f->path, st->name,
					       INDEX_FILE);
			if (ck->index_shard[i] != s)
				return err_set(e, ST_INVALID, "%s: tensor %s: %s lists it in %s", f->path, st->name,
					       INDEX_FILE, ck->shards[ck->index_shard[i]].name);
			struct model_tensor *t = &ck->tensors[i];
			t->dtype = st->dtype;
			t->n_dims = st->n_dims;
			memcpy(t->shape, st->shape, sizeof t->shape);
			t->n_elements = st->n_elements;
			t->n_bytes = st->n_bytes;
			t->data = f->data + st->data_begin_bytes;
			t->file_offset_bytes = 8 + f->header.header_bytes + st->data_begin_bytes;
			t->shard = s;
			t->layer = -1;
			ck->present[i] = 1;
		}
	}
	uint64_t sum = 0;
	for (size_t i = 0; i < ck->n_tensors; i++) {
		if (!ck->present[i])
			return err_set(e, ST_INVALID, "%s/%s: tensor %s: listed in %s but not in this shard", ck->dir,
				       ck->shards[ck->index_shard[i]].name, ck->tensors[i].name, INDEX_FILE);
		sum += ck->tensors[i].n_bytes;
	}
	if (ck->has_total_size && sum != ck->total_size)
		return err_set(e, ST_INVALID, "%s/%s: metadata.total_size %llu, but the tensors hold %llu bytes", ck->dir,
			       INDEX_FILE, (unsigned long long)ck->total_size, (unsigned long long)sum);
	return ST_OK;
}

/* ---- Matching against the schema ---- */

struct match {
	struct model_checkpoint *ck;
	const char *first_linear;           /* first linear weight seen, for messages */
	enum model_weight_format first_fmt;
	bool any_quantized;
};

static void shape_str(char *buf, size_t n, int n_dims, const int64_t *shape)
{
	size_t o = (size_t)snprintf(buf, n, "[");
	for (int i = 0; i < n_dims && o < n; i++)
		o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
	if (o < n)
		snprintf(buf + o, n - o, "]");
}

static const char *shard_path_of(const struct model_checkpoint *ck, const struct model_tensor *t)
{
	return ck->shards[t->shard].f.path;
}

/* Look up an expected tensor and check its dtype and shape. */
static enum status match_one(struct match *m, const struct model_schema_tensor *x, const char *why,
			     struct model_tensor **out, struct err *e)
{
	struct model_checkpoint *ck = m->ck;
	char want[96];
	shape_str(want, sizeof want, x->n_dims, x->shape);
	long i = table_find(ck, x->name);
	if (i < 0)
		return err_set(e, ST_INVALID, "%s/%s: tensor %s: missing (config.json implies %s %s%s)", ck->dir,
			       ck->names ? INDEX_FILE : SINGLE_FILE, x->name,
			       model_dtype_str(x->dtype), want, why);
	struct model_tensor *t = &ck->tensors[i];
	if (t->dtype != x->dtype)
		return err_set(e, ST_INVALID, "%s: tensor %s: dtype %s, expected %s%s", shard_path_of(ck, t), t->name,
			       model_dtype_str(t->dtype), model_dtype_str(x->dtype), why);
	bool same = t->n_dims == x->n_dims;
	for (int d = 0; same && d < x->n_dims; d++)
		same = t->shape[d] == x->shape[d];
	if (!same) {
		char got[96];
		shape_str(got, sizeof got, t->n_dims, t->shape);
		return err_set(e, ST_INVALID, "%s: tensor %s: shape %s, expected %s from config.json%s",
			       shard_path_of(ck, t), t->name, got, want, why);
	}
	if (ck->expected[i])
		return err_set(e, ST_INVALID, "%s: tensor %s: expected twice (schema bug)", shard_path_of(ck, t),
			       t->name);
	ck->expected[i] = 1;
	t->layer = x->layer;
	t->group = x->group;
	t->role = x->role;
	*out = t;
	return ST_OK;
}

static enum status visit_plain(void *ctx, const struct model_schema_tensor *x, struct err *e)
{
	struct model_tensor *t;
	return match_one(ctx, x, "", &t, e);
}

/* Is fmt consistent with what config.json declares for this linear? */
static enum status check_declared(struct match *m, const struct model_schema_linear *l,
				  const struct model_tensor *w, enum model_weight_format fmt, struct err *e)
{
	const struct model_config *c = &m->ck->cfg;
	const char *file = shard_path_of(m->ck, w);
	const char *fs = model_weight_format_str(fmt);
	if (model_format_is_quantized(fmt) && !c->quant.present)
		return err_set(e, ST_INVALID, "%s: tensor %s: stored as %s, but config.json has no quantization_config",
			       file, w->name, fs);
	if (l->group != MODEL_GROUP_ROUTED_EXPERTS)
		return ST_OK;
	bool mtp = model_config_is_mtp_layer(c, l->layer);
	if (c->expert_dtype == MODEL_EXPERT_DTYPE_FP4 && fmt != MODEL_FMT_MXFP4 && fmt != MODEL_FMT_NVFP4)
		return err_set(e, ST_INVALID, "%s: tensor %s: stored as %s, but config.json says expert_dtype fp4", file,
			       w->name, fs);
	if (c->expert_dtype == MODEL_EXPERT_DTYPE_FP8 && fmt != MODEL_FMT_FP8_BLOCK)
		return err_set(e, ST_INVALID, "%s: tensor %s: stored as %s, but config.json says expert_dtype fp8", file,
			       w->name, fs);
	if (c->expert_dtype == MODEL_EXPERT_DTYPE_BF16 && model_format_is_quantized(fmt))
		return err_set(e, ST_INVALID, "%s: tensor %s: stored as %s, but config.json says expert_dtype bf16",
			       file, w->name, fs);
	if (fmt == MODEL_FMT_NVFP4 && !c->quant.moe_nvfp4)
		return err_set(e, ST_INVALID,
			       "%s: tensor %s: stored as NVFP4, but config.json quantization_config.moe_quant_algo is "
			       "not NVFP4",
			       file, w->name);
	if (c->quant.moe_nvfp4 && !mtp && fmt != MODEL_FMT_NVFP4)
		return err_set(e, ST_INVALID,
			       "%s: tensor %s: stored as %s, but config.json quantization_config.moe_quant_algo is NVFP4",
			       file, w->name, fs);
	if (mtp && fmt == MODEL_FMT_MXFP4 && c->quant.moe_nvfp4 && c->quant.quantized_mtp && !c->quant.ignore_mtp)
		return err_set(e, ST_INVALID,
			       "%s: tensor %s: stored as MXFP4, but config.json quantization_config.quantized_layers lists "
			       "the draft layers' experts as NVFP4", file, w->name);
	if (mtp && fmt == MODEL_FMT_NVFP4 && c->quant.ignore_mtp)
		return err_set(e, ST_INVALID,
			       "%s: tensor %s: stored as NVFP4, but config.json quantization_config.ignore excludes mtp.*",
			       file, w->name);
	return ST_OK;
}

static enum status visit_linear(void *ctx, const struct model_schema_linear *l, struct err *e)
{
	struct match *m = ctx;
	struct model_checkpoint *ck = m->ck;
	char wname[MODEL_SCHEMA_NAME_BYTES + 8];
	snprintf(wname, sizeof wname, "%s.weight", l->prefix);
	long i = table_find(ck, wname);
	if (i < 0)
		return err_set(e, ST_INVALID, "%s/%s: tensor %s: missing (config.json implies a [%lld, %lld] %s linear)",
			       ck->dir, ck->names ? INDEX_FILE : SINGLE_FILE, wname, (long long)l->out,
			       (long long)l->in, model_group_str(l->group));
	const struct model_tensor *w = &ck->tensors[i];
	enum model_weight_format fmt = model_format_of_weight_dtype(w->dtype);
	if (fmt == MODEL_FMT_NONE || !(l->allowed & (1u << fmt)))
		return err_set(e, ST_INVALID, "%s: tensor %s: dtype %s is not a storage format for %s", shard_path_of(ck, w),
			       wname, model_dtype_str(w->dtype), model_group_str(l->group));
	enum status st = check_declared(m, l, w, fmt, e);
	if (st != ST_OK)
		return st;
	enum model_weight_format *gf = &ck->group_fmt[l->layer][l->group];
	if (*gf == MODEL_FMT_NONE) {
		*gf = fmt;
		ck->group_first[l->layer][l->group] = w->name;
	} else if (*gf != fmt) {
		return err_set(e, ST_INVALID, "%s: tensor %s: stored as %s, but %s (same layer, %s) is %s",
			       shard_path_of(ck, w), wname, model_weight_format_str(fmt),
			       ck->group_first[l->layer][l->group], model_group_str(l->group),
			       model_weight_format_str(*gf));
	}
	if (!m->first_linear) {
		m->first_linear = w->name;
		m->first_fmt = fmt;
	}
	m->any_quantized |= model_format_is_quantized(fmt);

	struct model_schema_tensor parts[MODEL_SCHEMA_MAX_PARTS];
	int n_parts;
	st = model_schema_linear_parts(&ck->cfg, l, fmt, parts, &n_parts, e);
	if (st != ST_OK)
		return err_prefix(e, "%s", shard_path_of(ck, w));
	char why[64];
	snprintf(why, sizeof why, " for a %s linear", model_weight_format_str(fmt));
	for (int p = 0; p < n_parts; p++) {
		struct model_tensor *t;
		st = match_one(m, &parts[p], why, &t, e);
		if (st != ST_OK)
			return st;
		t->format = fmt;
	}
	return ST_OK;
}

/* The draft layers from the tensor names: one past the highest K of
 * "mtp.K.", and which layout mtp.0 has (model_config_set_draft_stages). */
static enum status settle_draft(struct model_checkpoint *ck, struct err *e)
{
	int n_stages = 0;
	const char *over = NULL;
	for (size_t i = 0; i < ck->n_tensors; i++) {
		const char *nm = ck->tensors[i].name;
		if (strncmp(nm, "mtp.", 4))
			continue;
		char *end;
		long k = strtol(nm + 4, &end, 10);
		if (end == nm + 4 || *end != '.' || k < 0)
			continue; /* not a stage: check_schema calls it unknown */
		if (k >= MODEL_MAX_DRAFT_LAYERS) {
			over = nm;
			continue;
		}
		if (k + 1 > n_stages)
			n_stages = (int)k + 1;
	}
	const char *file = ck->names ? INDEX_FILE : SINGLE_FILE;
	if (over)
		return err_set(e, ST_INVALID, "%s/%s: tensor %s: draft stage index beyond %d", ck->dir, file, over,
			       MODEL_MAX_DRAFT_LAYERS - 1);
	bool dspark = table_find(ck, "mtp.0.main_proj.weight") >= 0;
	bool mtp = table_find(ck, "mtp.0.e_proj.weight") >= 0;
	char where[1100];
	snprintf(where, sizeof where, "%s/%s", ck->dir, file);
	return model_config_set_draft_stages(&ck->cfg, n_stages, dspark, mtp, where, e);
}

static enum status check_schema(struct model_checkpoint *ck, struct err *e)
{
	int n_layers = ck->cfg.n_layers_total;
	ck->group_fmt = calloc((size_t)n_layers, sizeof *ck->group_fmt);
	ck->group_first = calloc((size_t)n_layers, sizeof *ck->group_first);
	if (!ck->group_fmt || !ck->group_first)
		return err_set(e, ST_NOMEM, "out of memory");
	struct match m = {.ck = ck};
	struct model_schema_visitor v = {.ctx = &m, .plain = visit_plain, .linear = visit_linear};
	enum status st = model_schema_walk(&ck->cfg, &v, e);
	if (st != ST_OK)
		return st;
	for (size_t i = 0; i < ck->n_tensors; i++)
		if (!ck->expected[i])
			return err_set(e, ST_INVALID, "%s: tensor %s: unknown (config.json implies no such tensor)",
				       shard_path_of(ck, &ck->tensors[i]), ck->tensors[i].name);
	if (ck->cfg.quant.present && !m.any_quantized)
		return err_set(e, ST_INVALID,
			       "%s/config.json: quantization_config is present but no tensor is quantized (tensor %s is %s)",
			       ck->dir, m.first_linear ? m.first_linear : "?", model_weight_format_str(m.first_fmt));
	return ST_OK;
}

/* ---- Public ---- */

enum status model_checkpoint_create(struct model_checkpoint **out, const struct model_checkpoint_options *opt,
				    struct err *e)
{
	*out = NULL;
	if (!opt || !opt->dir || !opt->dir[0])
		return err_set(e, ST_INVALID, "checkpoint: no directory given");
	struct model_checkpoint *ck = calloc(1, sizeof *ck);
	if (!ck)
		return err_set(e, ST_NOMEM, "checkpoint: out of memory");
	char *cfg_path = NULL, *idx_path = NULL, *cfg_json = NULL, *idx_json = NULL;
	size_t cfg_bytes = 0, idx_bytes = 0;
	enum status st = ST_OK;
	ck->dir = strdup(opt->dir);
	cfg_path = path_join(opt->dir, "config.json");
	idx_path = path_join(opt->dir, INDEX_FILE);
	if (!ck->dir || !cfg_path || !idx_path) {
		st = err_set(e, ST_NOMEM, "checkpoint: out of memory");
		goto done;
	}
	struct stat sb;
	if (stat(opt->dir, &sb) || !S_ISDIR(sb.st_mode)) {
		st = err_set(e, ST_NOTFOUND, "%s: not a directory", opt->dir);
		goto done;
	}
	if ((st = file_read_all(cfg_path, MODEL_MAX_CONFIG_BYTES, &cfg_json, &cfg_bytes, e)) != ST_OK)
		goto done;
	if (opt->hf_overrides && opt->hf_overrides[0]) {
		char *merged;
		size_t merged_bytes;
		if ((st = model_config_apply_overrides(cfg_json, cfg_bytes, cfg_path, opt->hf_overrides, &merged,
						       &merged_bytes, e)) != ST_OK)
			goto done;
		free(cfg_json);
		cfg_json = merged;
		cfg_bytes = merged_bytes;
	}
	if ((st = model_config_parse(cfg_json, cfg_bytes, cfg_path, &ck->cfg, e)) != ST_OK)
		goto done;
	if (opt->load_format == MODEL_LOAD_DUMMY) {
		if ((st = model__dummy_build(&ck->cfg, opt->dummy_seed, !opt->dummy_no_fill, &ck->dummy, e)) != ST_OK)
			goto done;
		ck->n_tensors = ck->dummy.n_tensors;
		ck->tensors = ck->dummy.tensors;
		ck->names = ck->dummy.names;
		ck->group_fmt = ck->dummy.group_fmt;
		ck->dummy.tensors = NULL;
		ck->dummy.names = NULL;
		ck->dummy.group_fmt = NULL;
		if ((st = table_build(ck, cfg_path, e)) != ST_OK)
			goto done;
		uint64_t h = model_hash_bytes(MODEL_HASH_INIT, cfg_json, cfg_bytes);
		h = model_hash_bytes(h, "\0dummy\0", 7);
		ck->fingerprint = model_hash_bytes(h, &opt->dummy_seed, sizeof opt->dummy_seed);
		goto done;
	}

	if (file_exists(idx_path)) {
		if ((st = file_read_all(idx_path, MODEL_CKPT_MAX_INDEX_BYTES, &idx_json, &idx_bytes, e)) != ST_OK)
			goto done;
		if ((st = parse_index(ck, idx_path, idx_json, idx_bytes, e)) != ST_OK)
			goto done;
		if ((st = table_build(ck, idx_path, e)) != ST_OK)
			goto done;
		if ((st = open_shards(ck, e)) != ST_OK)
			goto done;
		if ((st = join_index(ck, e)) != ST_OK)
			goto done;
	} else {
		/* A single-file checkpoint: the header is the index. */
		char *single = path_join(opt->dir, SINGLE_FILE);
		bool have = single && file_exists(single);
		free(single);
		if (!have) {
			st = err_set(e, ST_NOTFOUND, "%s: neither %s nor %s exists", opt->dir, INDEX_FILE, SINGLE_FILE);
			goto done;
		}
		int s;
		if ((st = add_shard(ck, SINGLE_FILE, &s, e)) != ST_OK || (st = open_shards(ck, e)) != ST_OK)
			goto done;
		const struct model_st_header *h = &ck->shards[0].f.header;
		if ((st = alloc_tensors(ck, h->n_tensors, ck->shards[0].f.path, e)) != ST_OK)
			goto done;
		for (size_t i = 0; i < h->n_tensors; i++)
			ck->tensors[i].name = h->tensors[i].name; /* index_shard stays 0 */
		if ((st = table_build(ck, ck->shards[0].f.path, e)) != ST_OK || (st = join_index(ck, e)) != ST_OK)
			goto done;
	}
	if ((st = settle_draft(ck, e)) != ST_OK || (st = check_schema(ck, e)) != ST_OK)
		goto done;

	uint64_t h = model_hash_bytes(MODEL_HASH_INIT, cfg_json, cfg_bytes);
	h = model_hash_bytes(h, "\0index\0", 7);
	h = model_hash_bytes(h, idx_json ? idx_json : "", idx_bytes);
	for (int s = 0; s < ck->n_shards; s++)
		h = model_hash_bytes(h, &ck->shards[s].f.header_hash, sizeof ck->shards[s].f.header_hash);
	ck->fingerprint = h;
done:
	free(cfg_path);
	free(idx_path);
	free(cfg_json);
	free(idx_json);
	if (st != ST_OK) {
		model_checkpoint_destroy(ck);
		return st;
	}
	*out = ck;
	return ST_OK;
}

void model_checkpoint_destroy(struct model_checkpoint *ck)
{
	if (!ck)
		return;
	for (int s = 0; s < ck->n_shards; s++) {
		model_st_file_close(&ck->shards[s].f);
		free(ck->shards[s].name);
	}
	free(ck->shards);
	free(ck->tensors);
	free(ck->index_shard);
	free(ck->present);
	free(ck->expected);
	free(ck->names);
	free(ck->table);
	free(ck->group_fmt);
	free(ck->group_first);
	model__dummy_free(&ck->dummy);
	free(ck->dir);
	free(ck);
}

const struct model_config *model_checkpoint_config(const struct model_checkpoint *ck)
{
	return &ck->cfg;
}

const struct model_tensor *model_checkpoint_tensor(const struct model_checkpoint *ck, const char *name)
{
	long i = table_find(ck, name);
	return i < 0 ? NULL : &ck->tensors[i];
}

size_t model_checkpoint_n_tensors(const struct model_checkpoint *ck)
{
	return ck->n_tensors;
}

const struct model_tensor *model_checkpoint_tensor_at(const struct model_checkpoint *ck, size_t i)
{
	return i < ck->n_tensors ? &ck->tensors[i] : NULL;
}

enum status model_checkpoint_linear(const struct model_checkpoint *ck, const char *prefix,
				    struct model_linear *out, struct err *e)
{
	memset(out, 0, sizeof *out);
	char name[MODEL_SCHEMA_NAME_BYTES + 32];
	snprintf(name, sizeof name, "%s.weight", prefix);
	const struct model_tensor *w = model_checkpoint_tensor(ck, name);
	if (!w || w->role != MODEL_ROLE_WEIGHT || w->format == MODEL_FMT_NONE)
		return err_set(e, ST_NOTFOUND, "%s: no linear %s", ck->dir, prefix);
	out->format = w->format;
	out->weight = w;
	out->out = w->shape[0];
	out->in = w->shape[1];
	switch (w->format) {
	case MODEL_FMT_FP8_BLOCK:
		snprintf(name, sizeof name, "%s.scale", prefix);
		out->scale = model_checkpoint_tensor(ck, name);
		break;
	case MODEL_FMT_MXFP4:
		out->in *= 2;
		snprintf(name, sizeof name, "%s.scale", prefix);
		out->scale = model_checkpoint_tensor(ck, name);
		break;
	case MODEL_FMT_NVFP4:
		out->in *= 2;
		snprintf(name, sizeof name, "%s.weight_scale", prefix);
		out->scale = model_checkpoint_tensor(ck, name);
		snprintf(name, sizeof name, "%s.weight_scale_2", prefix);
		out->scale_2 = model_checkpoint_tensor(ck, name);
		snprintf(name, sizeof name, "%s.input_scale", prefix);
		out->input_scale = model_checkpoint_tensor(ck, name);
		break;
	default:
		break;
	}
	return ST_OK;
}

enum model_weight_format model_checkpoint_group_format(const struct model_checkpoint *ck, int layer,
						       enum model_group g)
{
	if (layer < 0 || layer >= ck->cfg.n_layers_total || (unsigned)g >= MODEL_GROUP_COUNT)
		return MODEL_FMT_NONE;
	return ck->group_fmt[layer][g];
}

uint64_t model_checkpoint_fingerprint(const struct model_checkpoint *ck)
{
	return ck->fingerprint;
}

int model_checkpoint_n_shards(const struct model_checkpoint *ck)
{
	return ck->n_shards;
}

const char *model_checkpoint_shard_path(const struct model_checkpoint *ck, int shard)
{
	return shard >= 0 && shard < ck->n_shards ? ck->shards[shard].f.path : NULL;
}

uint64_t model_checkpoint_shard_bytes(const struct model_checkpoint *ck, int shard)
{
	return shard >= 0 && shard < ck->n_shards ? ck->shards[shard].f.file_bytes : 0;
}

bool model_checkpoint_is_dummy(const struct model_checkpoint *ck)
{
	return ck->dummy.data != NULL || (ck->n_tensors && ck->n_shards == 0);
}

bool model_load_format_parse(const char *s, enum model_load_format *out)
{
	static const char *const names[] = {"auto", "safetensors", "dummy"};
	for (int i = 0; i < 3; i++)
		if (s && !strcmp(s, names[i])) {
			*out = (enum model_load_format)i;
			return true;
		}
	return false;
}

const char *model_checkpoint_dir(const struct model_checkpoint *ck)
{
	return ck->dir;
}
