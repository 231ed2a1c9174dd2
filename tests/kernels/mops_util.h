/*
 * tests/kernels/mops_util.h: helpers shared by the model-op tests
 * (test_norm.c ... test_act.c): a seeded random source, NaN fills to prove
 * every output was written, and small comparisons.
 *
 * Each test seeds from the clock (printed, so a failure can be replayed with
 * DSV4_TEST_SEED=<n>), so every run sees fresh inputs.
 */
#ifndef DSV4_TESTS_KERNELS_MOPS_UTIL_H
#define DSV4_TESTS_KERNELS_MOPS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t mt__state = 88172645463325252ull;

static inline uint64_t mt_next(void)
{
	mt__state ^= mt__state << 13;
	mt__state ^= mt__state >> 7;
	mt__state ^= mt__state << 17;
	return mt__state;
}

static inline void mt_seed_from_env(const char *test)
{
	const char *s = getenv("DSV4_TEST_SEED");
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t seed = s ? strtoull(s, NULL, 10)
			  : ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
	fprintf(stderr, "%s: seed %llu\n", test, (unsigned long long)seed);
	mt__state = seed * 2654435761ull + 1;
	for (int i = 0; i < 8; i++)
		mt_next();
}

/* Uniform in [lo, hi). */
static inline float mt_unif(float lo, float hi)
{
	return lo + (hi - lo) * (float)((mt_next() >> 11) * (1.0 / 9007199254740992.0));
}

static inline int mt_int(int lo, int hi_incl)
{
	return lo + (int)(mt_next() % (uint64_t)(hi_incl - lo + 1));
}

static inline void mt_fill(float *x, size_t n, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		x[i] = mt_unif(lo, hi);
}

static inline void fill_nan(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = NAN;
}

static inline size_t count_nan(const float *x, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += isnan(x[i]) ? 1 : 0;
	return k;
}

/* Largest |a-b| / (atol + rtol·|b|) over n values; <= 1 means within tolerance. */
static inline double max_rel_err(const float *a, const double *b, size_t n, double atol, double rtol)
{
	double worst = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]));
		if (!(e <= worst))
			worst = e; /* NaN propagates as the worst */
	}
	return worst;
}

static inline void *xcalloc(size_t n, size_t sz)
{
	void *p = calloc(n ? n : 1, sz);
	if (!p) {
		fprintf(stderr, "out of memory\n");
		exit(2);
	}
	return p;
}

/* ---- Golden files from the numpy references (tests/kernels/ref_mops.py) ----
 * Text format, one array after another: a line "name count" then count
 * values separated by whitespace. gf_get() returns the named array (owned by
 * the struct gf) and its length, or NULL. */
struct gf {
	int n;
	char name[64][32];
	double *val[64];
	size_t len[64];
};

static inline int gf_load(struct gf *g, const char *path)
{
	memset(g, 0, sizeof *g);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char nm[32];
	size_t cnt;
	while (g->n < 64 && fscanf(f, "%31s %zu", nm, &cnt) == 2) {
		double *v = xcalloc(cnt + 1, sizeof *v);
		for (size_t i = 0; i < cnt; i++)
			if (fscanf(f, "%lf", &v[i]) != 1) {
				free(v);
				fclose(f);
				return -1;
			}
		snprintf(g->name[g->n], sizeof g->name[0], "%s", nm);
		g->val[g->n] = v;
		g->len[g->n] = cnt;
		g->n++;
	}
	fclose(f);
	return 0;
}

static inline const double *gf_get(const struct gf *g, const char *name, size_t *len)
{
	for (int i = 0; i < g->n; i++)
		if (!strcmp(g->name[i], name)) {
			if (len)
				*len = g->len[i];
			return g->val[i];
		}
	fprintf(stderr, "golden file: no array '%s'\n", name);
	return NULL;
}

static inline void gf_free(struct gf *g)
{
	for (int i = 0; i < g->n; i++)
		free(g->val[i]);
	g->n = 0;
}

/* A float copy of a golden array (caller frees). */
static inline float *gf_floats(const struct gf *g, const char *name, size_t *len)
{
	size_t n = 0;
	const double *v = gf_get(g, name, &n);
	if (!v)
		return NULL;
	float *o = xcalloc(n + 1, sizeof *o);
	for (size_t i = 0; i < n; i++)
		o[i] = (float)v[i];
	if (len)
		*len = n;
	return o;
}

#endif
