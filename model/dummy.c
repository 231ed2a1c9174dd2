/*
 * model/dummy.c: the tensors of a --load-format dummy checkpoint.
 *
 * Owns the choice of a storage format per linear from config.json alone (what
 * the real checkpoint of that config stores), the per-tensor fill rules (norm
 * weights near 1, projections ~ 1/sqrt(in) after dequantization, scales that
 * keep every quantized value finite, valid expert ids for the hash tables),
 * and the counter-based generator they use: element i of a tensor depends only
 * on (seed, name, i), so the same seed gives the same bytes on every backend.
 */
#include "model/dummy.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "common/timeutil.h"
#include "model/schema.h"

#define DUMMY_ALIGN 256

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static bool ends_with(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a >= b && !strcmp(s + a - b, suf);
}

static int ilog2_round(double x)
{
	return (int)lround(log2(x));
}

void model_dummy_fill_of(const struct model_config *cfg, const struct model_tensor *t, uint64_t load_seed,
			 struct kern_fill_random_args *f)
{
	memset(f, 0, sizeof *f);
	f->n = (int64_t)t->n_elements;
	f->seed = mix64(load_seed ^ model_hash_bytes(MODEL_HASH_INIT, t->name, strlen(t->name)));
	f->kind = t->dtype == MODEL_DTYPE_F32 ? KERN_FILL_UNIFORM_F32 : KERN_FILL_UNIFORM_BF16;
	int64_t cols = t->n_dims >= 1 ? t->shape[t->n_dims - 1] : 1;
	if (t->role != MODEL_ROLE_PLAIN) {
		/* a linear's part; in = the logical input width */
		int64_t in = cols;
		if (t->format == MODEL_FMT_MXFP4 || t->format == MODEL_FMT_NVFP4)
			in = t->role == MODEL_ROLE_WEIGHT ? 2 * cols : cols * (t->format == MODEL_FMT_NVFP4 ? 16 : 32);
		if (t->format == MODEL_FMT_FP8_BLOCK && t->role == MODEL_ROLE_SCALE)
			in = cols * cfg->quant.weight_block_size[1];
		double sd = 1.0 / sqrt((double)(in > 0 ? in : 1));
		switch (t->role) {
		case MODEL_ROLE_WEIGHT:
			if (t->format == MODEL_FMT_FP8_BLOCK) {
				f->kind = KERN_FILL_E4M3; /* |w| in [0.25, 2) */
				f->e_lo = 5;
				f->e_hi = 7;
			} else if (t->format == MODEL_FMT_MXFP4 || t->format == MODEL_FMT_NVFP4) {
				f->kind = KERN_FILL_BYTES; /* e2m1 codes, mean |w| 2.25 */
			} else {
				f->lo = (float)(-sqrt(3.0) * sd);
				f->hi = -f->lo;
			}
			break;
		case MODEL_ROLE_SCALE:
			if (t->format == MODEL_FMT_NVFP4) {
				f->kind = KERN_FILL_E4M3; /* [1, 2) */
				f->e_lo = f->e_hi = 7;
				f->positive = 1;
			} else {
				f->kind = KERN_FILL_E8M0;
				int x = 127 + ilog2_round(sd / (t->format == MODEL_FMT_MXFP4 ? 2.25 : 0.9));
				f->e_lo = f->e_hi = x < 1 ? 1 : x;
			}
			break;
		case MODEL_ROLE_WEIGHT_SCALE_2:
			f->lo = f->hi = (float)(sd / (2.25 * 1.5));
			break;
		default: /* input_scale: unused by the kernels */
			f->lo = f->hi = 1.0f;
			break;
		}
		return;
	}
	const char *nm = t->name;
	float a;
	if (t->dtype == MODEL_DTYPE_I64 || t->dtype == MODEL_DTYPE_I32) {
		f->kind = t->dtype == MODEL_DTYPE_I64 ? KERN_FILL_INDEX_I64 : KERN_FILL_INDEX_I32;
		f->cols = cols > 0 ? cols : 1;
		f->n_index = cfg->n_routed_experts > 0 ? cfg->n_routed_experts : 1;
		return;
	}
	if (ends_with(nm, "norm.weight")) {
		f->lo = 0.9f;
		f->hi = 1.1f;
		return;
	}
	if (ends_with(nm, "_scale") && strstr(nm, "hc_")) {
		f->lo = 0.5f;
		f->hi = 1.0f;
		return;
	}
	if (!strcmp(nm, "embed.weight"))
		a = 0.05f;
	else if (ends_with(nm, "attn_sink"))
		a = 0.5f;
	else if (ends_with(nm, "gate.bias"))
		a = 0.01f;
	else if (t->n_dims >= 2)
		a = (float)sqrt(3.0 / (double)(cols > 0 ? cols : 1));
	else if (t->n_dims == 1)
		a = 0.1f;
	else {
		f->lo = f->hi = 1.0f;
		return;
	}
	f->lo = -a;
	f->hi = a;
}

enum status model_dummy_fill_cpu(const struct model_config *cfg, const struct model_tensor *t, uint64_t load_seed,
				 void *dst)
{
	struct kern_fill_random_args f;
	model_dummy_fill_of(cfg, t, load_seed, &f);
	f.dst = dst;
	return kern_fill_random_ref(&f);
}

/* ---- Building the tensor set ---- */

struct build {
	struct model_config *cfg;
	struct model__dummy *d;
	size_t cap;
	size_t *name_off;
	size_t names_len, names_cap;
};

static enum status add(struct build *b, const struct model_schema_tensor *x, enum model_weight_format fmt,
		       struct err *e)
{
	struct model__dummy *d = b->d;
	if (d->n_tensors == b->cap) {
		size_t nc = b->cap ? 2 * b->cap : 1024;
		struct model_tensor *t = realloc(d->tensors, nc * sizeof *t);
		if (t)
			d->tensors = t;
		size_t *o = realloc(b->name_off, nc * sizeof *o);
		if (o)
			b->name_off = o;
		if (!t || !o)
			return err_set(e, ST_NOMEM, "dummy checkpoint: out of memory");
		b->cap = nc;
	}
	size_t len = strlen(x->name) + 1;
	if (b->names_len + len > b->names_cap) {
		size_t nc = b->names_cap ? 2 * b->names_cap : 65536;
		while (nc < b->names_len + len)
			nc *= 2;
		char *s = realloc(d->names, nc);
		if (!s)
			return err_set(e, ST_NOMEM, "dummy checkpoint: out of memory");
		d->names = s;
		b->names_cap = nc;
	}
	memcpy(d->names + b->names_len, x->name, len);
	b->name_off[d->n_tensors] = b->names_len;
	b->names_len += len;
	struct model_tensor *t = &d->tensors[d->n_tensors++];
	memset(t, 0, sizeof *t);
	t->dtype = x->dtype;
	t->n_dims = x->n_dims;
	t->n_elements = 1;
	for (int i = 0; i < x->n_dims; i++) {
		t->shape[i] = x->shape[i];
		t->n_elements *= (uint64_t)x->shape[i];
	}
	t->n_bytes = t->n_elements * model_dtype_bytes(x->dtype);
	t->file_offset_bytes = d->data_bytes;
	d->data_bytes += (t->n_bytes + DUMMY_ALIGN - 1) / DUMMY_ALIGN * DUMMY_ALIGN;
	t->shard = -1;
	t->layer = x->layer;
	t->group = x->group;
	t->role = x->role;
	t->format = fmt;
	return ST_OK;
}

static enum status visit_plain(void *ctx, const struct model_schema_tensor *x, struct err *e)
{
	return add(ctx, x, MODEL_FMT_NONE, e);
}

/* What the real checkpoint of this config stores for linear l. */
static enum model_weight_format format_for(const struct model_config *c, const struct model_schema_linear *l)
{
	enum model_weight_format f = c->quant.present ? MODEL_FMT_FP8_BLOCK : MODEL_FMT_BF16;
	if (l->group == MODEL_GROUP_ROUTED_EXPERTS) {
		bool mtp = model_config_is_mtp_layer(c, l->layer);
		if (c->expert_dtype == MODEL_EXPERT_DTYPE_FP8)
			f = MODEL_FMT_FP8_BLOCK;
		else if (c->expert_dtype == MODEL_EXPERT_DTYPE_BF16)
			f = MODEL_FMT_BF16;
		else if (c->quant.moe_nvfp4 && !(mtp && c->quant.ignore_mtp))
			f = MODEL_FMT_NVFP4;
		else if (c->expert_dtype == MODEL_EXPERT_DTYPE_FP4 || c->quant.moe_nvfp4)
			f = MODEL_FMT_MXFP4;
	}
	if (!(l->allowed & (1u << f)))
		f = MODEL_FMT_BF16;
	return f;
}

static enum status visit_linear(void *ctx, const struct model_schema_linear *l, struct err *e)
{
	struct build *b = ctx;
	enum model_weight_format fmt = format_for(b->cfg, l);
	b->d->group_fmt[l->layer][l->group] = fmt;
	struct model_schema_tensor parts[MODEL_SCHEMA_MAX_PARTS];
	int n_parts;
	enum status st = model_schema_linear_parts(b->cfg, l, fmt, parts, &n_parts, e);
	for (int p = 0; st == ST_OK && p < n_parts; p++)
		st = add(b, &parts[p], fmt, e);
	return st;
}

/* Fill every tensor, FILL_THREADS threads taking tensors in turn (the
 * values do not depend on who fills what). */
#define FILL_THREADS 8

struct filler {
	const struct model_config *cfg;
	struct model__dummy *d;
	uint64_t seed;
	atomic_size_t next;
	atomic_long bad; /* index + 1 of a tensor that failed */
};

static void *fill_worker(void *arg)
{
	struct filler *f = arg;
	for (;;) {
		size_t i = atomic_fetch_add(&f->next, 1);
		if (i >= f->d->n_tensors)
			return NULL;
		struct model_tensor *t = &f->d->tensors[i];
		if (model_dummy_fill_cpu(f->cfg, t, f->seed, (void *)t->data) != ST_OK)
			atomic_store(&f->bad, (long)i + 1);
	}
}

static enum status fill_all(const struct model_config *cfg, struct model__dummy *d, uint64_t seed, struct err *e)
{
	struct filler f = {.cfg = cfg, .d = d, .seed = seed};
	atomic_init(&f.next, 0);
	atomic_init(&f.bad, 0);
	long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
	int n = n_cpu > FILL_THREADS ? FILL_THREADS : n_cpu > 1 ? (int)n_cpu : 1;
	pthread_t th[FILL_THREADS];
	int started = 0;
	for (int k = 1; k < n; k++)
		if (!pthread_create(&th[started], NULL, fill_worker, &f))
			started++;
	fill_worker(&f);
	for (int k = 0; k < started; k++)
		pthread_join(th[k], NULL);
	long bad = atomic_load(&f.bad);
	if (bad)
		return err_set(e, ST_INVALID, "dummy checkpoint: tensor %s: no fill for its dtype", d->tensors[bad - 1].name);
	return ST_OK;
}

enum status model__dummy_build(struct model_config *cfg, uint64_t seed, bool fill, struct model__dummy *d,
			       struct err *e)
{
	memset(d, 0, sizeof *d);
	bool dspark = cfg->draft_kind == MODEL_DRAFT_DSPARK;
	int n_stages = dspark ? cfg->n_draft_layers : (int)cfg->num_nextn_predict_layers;
	enum status st = model_config_set_draft_stages(cfg, n_stages, dspark, !dspark && n_stages > 0,
						       "dummy checkpoint", e);
	if (st != ST_OK)
		return st;
	d->group_fmt = calloc((size_t)cfg->n_layers_total, sizeof *d->group_fmt);
	if (!d->group_fmt)
		return err_set(e, ST_NOMEM, "dummy checkpoint: out of memory");
	double t0 = time_mono_s();
	struct build b = {.cfg = cfg, .d = d};
	struct model_schema_visitor v = {.ctx = &b, .plain = visit_plain, .linear = visit_linear};
	st = model_schema_walk(cfg, &v, e);
	if (st == ST_OK && d->data_bytes) {
		void *p = mmap(NULL, d->data_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);
		if (p == MAP_FAILED)
			st = err_set(e, ST_NOMEM, "dummy checkpoint: cannot map %zu bytes for the weights", d->data_bytes);
		else
			d->data = p;
	}
	if (st == ST_OK) {
		for (size_t i = 0; i < d->n_tensors; i++) {
			struct model_tensor *t = &d->tensors[i];
			t->name = d->names + b.name_off[i];
			t->data = (char *)d->data + t->file_offset_bytes;
		}
		if (fill)
			st = fill_all(cfg, d, seed, e);
		if (d->data)
			mprotect(d->data, d->data_bytes, PROT_READ);
		log_msg(LOG_INFO, "model", "dummy weights: %zu tensors, %.2f GiB, %d layers, seed %llu, %s in %.1f s",
			d->n_tensors, (double)d->data_bytes / (1u << 30), cfg->n_layers_total, (unsigned long long)seed,
			fill ? "filled on the CPU" : "left zero", time_mono_s() - t0);
	}
	free(b.name_off);
	if (st != ST_OK)
		model__dummy_free(d);
	return st;
}

void model__dummy_free(struct model__dummy *d)
{
	if (!d)
		return;
	if (d->data)
		munmap(d->data, d->data_bytes);
	free(d->tensors);
	free(d->names);
	free(d->group_fmt);
	memset(d, 0, sizeof *d);
}
