/*
 * tests/model/golden_reader.h: reads transformers' reference logits for the
 * tiny checkpoints (tests/model/data/golden/README.md): format 2, a JSON
 * header golden_V.json plus raw little-endian arrays in golden_V.bin, and
 * the earlier format 1 (one JSON with top-16 and probes inline), both into
 * one struct so the test has one code path. Fields a format lacks are NULL.
 */
#ifndef DSV4_TESTS_MODEL_GOLDEN_READER_H
#define DSV4_TESTS_MODEL_GOLDEN_READER_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLD_MAX_PROMPTS 16

struct gold_prompt {
	const char *name;
	uint32_t n;                /* prompt tokens */
	int32_t *ids;              /* [n] */
	uint32_t n_greedy;
	int32_t *greedy;           /* [n_greedy], full recomputation, no cache */
	double *greedy_margin;     /* [n_greedy] best minus second-best logit; NULL in format 1 */
	const float *lse;          /* [n] */
	const float *norm2;        /* [n] squared L2 norm of the full row; NULL in format 1 */
	const int32_t *top_ids;    /* [n, topk] */
	const float *top_logits;   /* [n, topk] */
	const float *probe_logits; /* [n, n_probe] */
	const float *sketch;       /* [n, n_sketch]; NULL in format 1 */
};

struct golden {
	int format;
	json_t *j;
	char *bin; /* format 2: the .bin; format 1: the arrays built from the JSON */
	size_t bin_bytes;
	uint32_t vocab, topk, n_probe, n_sketch;
	uint64_t sketch_seed;
	int32_t *probe_ids;
	int n_prompts;
	struct gold_prompt p[GOLD_MAX_PROMPTS];
	char path[1200]; /* the header's path, for messages */
	char msg[512];
};

static inline int32_t *gold__ints(json_t *a, uint32_t *n)
{
	*n = (uint32_t)json_array_size(a);
	int32_t *v = calloc((size_t)*n + 1, sizeof *v);
	for (uint32_t i = 0; v && i < *n; i++)
		v[i] = (int32_t)json_integer_value(json_array_get(a, i));
	return v;
}

static inline double gold__num(json_t *v)
{
	return json_is_integer(v) ? (double)json_integer_value(v) : json_real_value(v);
}

/* The array `key` of prompt p in the .bin: checks dtype, shape and bounds. */
static inline const void *gold__array(struct golden *g, json_t *arrays, const char *pname, const char *key,
				      const char *dtype, uint32_t d0, uint32_t d1)
{
	json_t *a = json_object_get(arrays, key);
	json_t *shape = json_object_get(a, "shape");
	const char *dt = json_string_value(json_object_get(a, "dtype"));
	json_int_t off = json_integer_value(json_object_get(a, "offset"));
	size_t want_dims = d1 ? 2 : 1;
	if (!a || !dt || strcmp(dt, dtype) || json_array_size(shape) != want_dims ||
	    json_integer_value(json_array_get(shape, 0)) != d0 ||
	    (d1 && json_integer_value(json_array_get(shape, 1)) != d1)) {
		snprintf(g->msg, sizeof g->msg, "prompt %s: array %s: want %s [%u%s%u]", pname, key, dtype, d0,
			 d1 ? ", " : "", d1);
		return NULL;
	}
	size_t bytes = (size_t)d0 * (d1 ? d1 : 1) * 4;
	if (off < 0 || off % 4 || (size_t)off + bytes > g->bin_bytes) {
		snprintf(g->msg, sizeof g->msg, "prompt %s: array %s: offset %lld outside the .bin", pname, key,
			 (long long)off);
		return NULL;
	}
	return g->bin + off;
}

static inline void golden_free(struct golden *g)
{
	for (int i = 0; i < g->n_prompts; i++) {
		free(g->p[i].ids);
		free(g->p[i].greedy);
		free(g->p[i].greedy_margin);
	}
	free(g->probe_ids);
	free(g->bin);
	json_decref(g->j);
	memset(g, 0, sizeof *g);
}

static inline int gold__load_v2(struct golden *g, const char *dir)
{
	const char *bin = json_string_value(json_object_get(g->j, "bin"));
	if (!bin || strchr(bin, '/')) {
		snprintf(g->msg, sizeof g->msg, "header: bad \"bin\"");
		return -1;
	}
	char path[1400];
	snprintf(path, sizeof path, "%s/%s", dir, bin);
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(g->msg, sizeof g->msg, "cannot open %.200s", bin);
		return -1;
	}
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	g->bin_bytes = sz > 0 ? (size_t)sz : 0;
	g->bin = malloc(g->bin_bytes + 1);
	size_t got = g->bin ? fread(g->bin, 1, g->bin_bytes, f) : 0;
	fclose(f);
	if (!g->bin || got != g->bin_bytes ||
	    (json_int_t)g->bin_bytes != json_integer_value(json_object_get(g->j, "bin_bytes"))) {
		snprintf(g->msg, sizeof g->msg, "%.200s: %zu bytes, header says %lld", bin, g->bin_bytes,
			 (long long)json_integer_value(json_object_get(g->j, "bin_bytes")));
		return -1;
	}
	uint32_t one = 1;
	unsigned char le;
	memcpy(&le, &one, 1);
	if (!le) {
		snprintf(g->msg, sizeof g->msg, "big-endian host: the .bin is little-endian");
		return -1;
	}
	g->topk = (uint32_t)json_integer_value(json_object_get(g->j, "topk"));
	json_t *sk = json_object_get(g->j, "sketch");
	g->n_sketch = (uint32_t)json_integer_value(json_object_get(sk, "n"));
	g->sketch_seed = (uint64_t)json_integer_value(json_object_get(sk, "seed"));
	json_t *ps = json_object_get(g->j, "prompts");
	for (size_t i = 0; i < json_array_size(ps); i++) {
		json_t *p = json_array_get(ps, i);
		struct gold_prompt *q = &g->p[g->n_prompts++];
		q->name = json_string_value(json_object_get(p, "name"));
		q->ids = gold__ints(json_object_get(p, "ids"), &q->n);
		q->greedy = gold__ints(json_object_get(p, "greedy"), &q->n_greedy);
		json_t *m = json_object_get(p, "greedy_margin");
		q->greedy_margin = calloc((size_t)q->n_greedy + 1, sizeof(double));
		if (!q->name || !q->ids || !q->greedy || !q->greedy_margin || json_array_size(m) != q->n_greedy ||
		    (json_int_t)q->n != json_integer_value(json_object_get(p, "n_tokens"))) {
			snprintf(g->msg, sizeof g->msg, "prompt %zu: name, ids, greedy or n_tokens", i);
			return -1;
		}
		for (uint32_t k = 0; k < q->n_greedy; k++)
			q->greedy_margin[k] = gold__num(json_array_get(m, k));
		json_t *a = json_object_get(p, "arrays");
		q->lse = gold__array(g, a, q->name, "lse", "<f4", q->n, 0);
		q->norm2 = gold__array(g, a, q->name, "norm2", "<f4", q->n, 0);
		q->top_ids = gold__array(g, a, q->name, "top_ids", "<i4", q->n, g->topk);
		q->top_logits = gold__array(g, a, q->name, "top_logits", "<f4", q->n, g->topk);
		q->probe_logits = gold__array(g, a, q->name, "probe_logits", "<f4", q->n, g->n_probe);
		q->sketch = gold__array(g, a, q->name, "sketch", "<f4", q->n, g->n_sketch);
		if (!q->lse || !q->norm2 || !q->top_ids || !q->top_logits || !q->probe_logits || !q->sketch)
			return -1;
	}
	return 0;
}

/* Format 1: everything inline in the JSON; copied into one buffer. */
static inline int gold__load_v1(struct golden *g)
{
	json_t *ps = json_object_get(g->j, "prompts");
	g->topk = 0;
	size_t floats = 0;
	for (size_t i = 0; i < json_array_size(ps); i++) {
		json_t *p = json_array_get(ps, i);
		size_t n = json_array_size(json_object_get(p, "ids"));
		json_t *p0 = json_array_get(json_object_get(p, "positions"), 0);
		if (!g->topk)
			g->topk = (uint32_t)json_array_size(json_object_get(p0, "top_ids"));
		if (!g->probe_ids)
			g->probe_ids = gold__ints(json_object_get(p, "probe_ids"), &g->n_probe);
		floats += n * (1 + 2 * (size_t)g->topk + g->n_probe);
	}
	g->bin_bytes = floats * 4;
	g->bin = malloc(g->bin_bytes + 4);
	if (!g->bin || !g->topk || !g->probe_ids) {
		snprintf(g->msg, sizeof g->msg, "format 1: no positions or probes");
		return -1;
	}
	float *w = (float *)(void *)g->bin;
	for (size_t i = 0; i < json_array_size(ps); i++) {
		json_t *p = json_array_get(ps, i);
		struct gold_prompt *q = &g->p[g->n_prompts++];
		q->name = json_string_value(json_object_get(p, "name"));
		q->ids = gold__ints(json_object_get(p, "ids"), &q->n);
		q->greedy = gold__ints(json_object_get(p, "greedy_nocache"), &q->n_greedy);
		json_t *pos = json_object_get(p, "positions"), *pl = json_object_get(p, "probe_logits");
		if (json_array_size(pos) != q->n || json_array_size(pl) != q->n) {
			snprintf(g->msg, sizeof g->msg, "format 1: prompt %s: positions", q->name);
			return -1;
		}
		float *lse = w, *tl = lse + q->n, *pr = tl + (size_t)q->n * g->topk;
		int32_t *ti = (int32_t *)(void *)(pr + (size_t)q->n * g->n_probe);
		w = (float *)(void *)(ti + (size_t)q->n * g->topk);
		for (uint32_t t = 0; t < q->n; t++) {
			json_t *pt = json_array_get(pos, t), *prow = json_array_get(pl, t);
			lse[t] = (float)gold__num(json_object_get(pt, "lse"));
			for (uint32_t k = 0; k < g->topk; k++) {
				ti[(size_t)t * g->topk + k] =
					(int32_t)json_integer_value(json_array_get(json_object_get(pt, "top_ids"), k));
				tl[(size_t)t * g->topk + k] =
					(float)gold__num(json_array_get(json_object_get(pt, "top_logits"), k));
			}
			for (uint32_t k = 0; k < g->n_probe; k++)
				pr[(size_t)t * g->n_probe + k] = (float)gold__num(json_array_get(prow, k));
		}
		q->lse = lse;
		q->top_ids = ti;
		q->top_logits = tl;
		q->probe_logits = pr;
	}
	return 0;
}

/* golden_V.json under dir (and its .bin); 0 or -1 with g->path, g->msg. */
static inline int golden_load(struct golden *g, const char *dir, const char *variant)
{
	memset(g, 0, sizeof *g);
	char *path = g->path;
	snprintf(path, sizeof g->path, "%s/golden_%s.json", dir, variant);
	json_error_t je;
	g->j = json_load_file(path, 0, &je);
	if (!g->j) {
		snprintf(g->msg, sizeof g->msg, "%s", je.text);
		return -1;
	}
	const char *fmt = json_string_value(json_object_get(g->j, "format"));
	json_t *ps = json_object_get(g->j, "prompts");
	if (!json_is_array(ps) || json_array_size(ps) > GOLD_MAX_PROMPTS || !json_array_size(ps)) {
		snprintf(g->msg, sizeof g->msg, "no or too many prompts");
		return -1;
	}
	g->vocab = (uint32_t)json_integer_value(json_object_get(g->j, "vocab_size"));
	int rc;
	if (fmt && !strcmp(fmt, "dsv4-golden-logits/2")) {
		g->format = 2;
		g->probe_ids = gold__ints(json_object_get(g->j, "probe_ids"), &g->n_probe);
		rc = g->probe_ids ? gold__load_v2(g, dir) : -1;
	} else if (!fmt) {
		g->format = 1;
		rc = gold__load_v1(g);
	} else {
		snprintf(g->msg, sizeof g->msg, "unknown format %.100s", fmt);
		rc = -1;
	}
	if (rc == 0 && g->vocab)
		for (uint32_t k = 0; k < g->n_probe; k++)
			if (g->probe_ids[k] < 0 || (uint32_t)g->probe_ids[k] >= g->vocab) {
				snprintf(g->msg, sizeof g->msg, "probe id %d outside the vocabulary", g->probe_ids[k]);
				rc = -1;
			}
	if (rc) {
		char m[sizeof g->msg], pth[sizeof g->path];
		memcpy(m, g->msg, sizeof m);
		memcpy(pth, g->path, sizeof pth);
		golden_free(g);
		memcpy(g->msg, m, sizeof m);
		memcpy(g->path, pth, sizeof pth);
	}
	return rc;
}

/* splitmix64 as the writer's sketch rule (golden README). */
static inline uint64_t gold_splitmix64(uint64_t x)
{
	uint64_t z = x + 0x9E3779B97F4A7C15ull;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* Sign masks [vocab]: bit j set where R[j, v] = -1 (n_sketch <= 32). */
static inline uint32_t *golden_sketch_masks(const struct golden *g, uint32_t vocab)
{
	if (!g->n_sketch || g->n_sketch > 32)
		return NULL;
	uint32_t *m = calloc(vocab, sizeof *m);
	for (uint32_t v = 0; m && v < vocab; v++)
		for (uint32_t j = 0; j < g->n_sketch; j++)
			if (gold_splitmix64(g->sketch_seed + ((uint64_t)j << 32) + v) >> 63)
				m[v] |= 1u << j;
	return m;
}

/* s[j] = sum_v R[j, v] row[v] in double. */
static inline void golden_sketch(const uint32_t *masks, uint32_t n_sketch, const float *row, uint32_t vocab,
				 double *s)
{
	double tot = 0, neg[32] = {0};
	for (uint32_t v = 0; v < vocab; v++) {
		double x = row[v];
		tot += x;
		uint32_t m = masks[v];
		while (m) {
			int j = __builtin_ctz(m);
			neg[j] += x;
			m &= m - 1;
		}
	}
	for (uint32_t j = 0; j < n_sketch; j++)
		s[j] = tot - 2 * neg[j];
}

#endif
