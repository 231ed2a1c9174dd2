/*
 * tests/kernels/test_routing.c: sqrt(softplus) routing with bias-corrected
 * top-k and hash routing (dsv4.md §3.9) against a sort-based oracle in double.
 * (The grouping by expert is moe_dispatch's: tests/kernels/test_moe_dispatch.c.)
 */
#include "kernels/routing/routing.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

struct cand {
	double s;
	int e;
};

static int cand_cmp(const void *pa, const void *pb)
{
	const struct cand *a = pa, *b = pb;
	if (a->s != b->s)
		return a->s > b->s ? -1 : 1;
	return a->e - b->e;
}

static void test_learned(int64_t T, int E, int K, bool bias, bool ties)
{
	float *l = xcalloc((size_t)(T * E), sizeof *l), *b = xcalloc((size_t)E, sizeof *b);
	int32_t *ids = xcalloc((size_t)(T * K), sizeof *ids);
	float *w = xcalloc((size_t)(T * K), sizeof *w);
	mt_fill(l, (size_t)(T * E), -6, 6);
	mt_fill(b, (size_t)E, -0.5f, 0.5f);
	if (ties) /* coarse logits make equal scores common */
		for (int64_t i = 0; i < T * E; i++)
			l[i] = (float)mt_int(-2, 2);
	for (int64_t i = 0; i < T * K; i++)
		ids[i] = -7;
	fill_nan(w, (size_t)(T * K));
	struct kern_route_args a = {.logits = l, .bias = bias ? b : NULL, .n_tokens = T, .n_experts = E,
				    .top_k = K, .route_scale = 1.5f, .expert_ids = ids, .weights = w};
	T_CHECK(kern_route_ref(&a) == ST_OK);
	struct cand *c = xcalloc((size_t)E, sizeof *c);
	int bad = 0;
	for (int64_t t = 0; t < T; t++) {
		/* scores as the kernel computes them in fp32, so ties are exact ties */
		for (int e = 0; e < E; e++) {
			float sp = l[t * E + e] > 20 ? l[t * E + e] : log1pf(expf(l[t * E + e]));
			c[e].s = sqrtf(sp) + (bias ? b[e] : 0.0f);
			c[e].e = e;
		}
		qsort(c, (size_t)E, sizeof *c, cand_cmp);
		double sum = 0;
		for (int j = 0; j < K; j++)
			sum += sqrt(log1p(exp((double)l[t * E + c[j].e])));
		for (int j = 0; j < K; j++) {
			bad += ids[t * K + j] != c[j].e;
			double wr = sqrt(log1p(exp((double)l[t * E + c[j].e]))) / sum * 1.5;
			bad += !(fabs(w[t * K + j] - wr) <= 1e-5 * wr + 1e-7);
		}
	}
	T_CHECKF(bad == 0, "T %lld E %d K %d bias %d ties %d: %d bad", (long long)T, E, K, bias, ties, bad);
	free(c);
	free(l);
	free(b);
	free(ids);
	free(w);
}

static void test_hash(void)
{
	enum { V = 50, E = 8, K = 2, T = 20 };
	int32_t tab[V * K], tok[T], ids[T * K];
	float l[T * E], w[T * K], bias[E];
	for (int i = 0; i < V * K; i++)
		tab[i] = mt_int(0, E - 1);
	for (int t = 0; t < T; t++)
		tok[t] = mt_int(0, V - 1);
	mt_fill(l, T * E, -4, 4);
	mt_fill(bias, E, 5, 6); /* huge bias: must not matter for hash layers */
	fill_nan(w, T * K);
	struct kern_route_args a = {.logits = l, .bias = bias, .tid2eid = tab, .token_ids = tok, .vocab = V,
				    .n_tokens = T, .n_experts = E, .top_k = K, .route_scale = 1.5f,
				    .expert_ids = ids, .weights = w};
	T_CHECK(kern_route_ref(&a) == ST_OK);
	int bad = 0;
	for (int t = 0; t < T; t++) {
		double s[K], sum = 0;
		for (int j = 0; j < K; j++) {
			bad += ids[t * K + j] != tab[tok[t] * K + j];
			s[j] = sqrt(log1p(exp((double)l[t * E + tab[tok[t] * K + j]])));
			sum += s[j];
		}
		for (int j = 0; j < K; j++)
			bad += !(fabs(w[t * K + j] - s[j] / sum * 1.5) <= 1e-6);
	}
	T_CHECK(bad == 0);
	tok[3] = V;
	T_CHECK(kern_route_ref(&a) == ST_INVALID);
	tok[3] = 0;
	tab[0] = E;
	tab[1] = E;
	T_CHECK(kern_route_ref(&a) == ST_INVALID);
}

int main(void)
{
	mt_seed_from_env("test_routing");
	test_learned(17, 256, 6, true, false);
	test_learned(9, 8, 2, false, false);
	test_learned(11, 16, 4, false, true);
	test_learned(11, 16, 4, true, true);
	test_learned(0, 256, 6, true, false);
	test_hash();
	return test_exit();
}
