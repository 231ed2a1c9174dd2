/*
 * tests/kernels/test_sampling.c: kern_sample_ref against straightforward
 * re-computations written here (double precision, O(V^2) where that is
 * simplest): greedy argmax and its ties, logit bias, repetition / presence /
 * frequency penalties, raw logprobs and top_logprobs, the filtered
 * distribution under temperature / min_p / top_k / top_p (both the exact
 * token for each (seed, counter) and the empirical frequencies), the
 * counter-based RNG, and parameter validation.
 */
#include <time.h>

#include "kernels/sampling/sampling.h"
#include "tests/test.h"

static uint64_t g_rng;
static double urand(void)
{
	g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(g_rng >> 11) * 0x1.0p-53;
}
static uint32_t rnd(uint32_t n) { return (uint32_t)(urand() * n); }

static struct kern_sampling_params base(float t)
{
	struct kern_sampling_params p = {.temperature = t, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 1};
	return p;
}

/* Logits after bias and penalties, computed the long way. */
static void ref_process(const float *logits, uint32_t V, const struct kern_sampling_params *p,
			const struct kern_sample_history *h, double *out)
{
	for (uint32_t v = 0; v < V; v++) {
		double l = logits[v];
		for (uint32_t i = 0; i < p->n_logit_bias; i++)
			if (p->logit_bias[i].token_id == (int32_t)v)
				l += p->logit_bias[i].bias;
		uint32_t in_prompt = 0, count = 0;
		for (size_t i = 0; h && i < h->n_prompt; i++)
			in_prompt += h->prompt_ids[i] == (int32_t)v;
		for (size_t i = 0; h && i < h->n_output; i++)
			count += h->output_ids[i] == (int32_t)v;
		/* the kernel works in float: do the same so that equality is exact */
		float lf = (float)l;
		if (p->repetition_penalty != 1.0f && (in_prompt || count))
			lf = lf > 0 ? lf / p->repetition_penalty : lf * p->repetition_penalty;
		if (count)
			lf -= p->frequency_penalty * (float)count + p->presence_penalty;
		out[v] = lf;
	}
}

/* The softmax of l at the temperature into prob; returns its largest value. */
static double ref_softmax(const double *l, uint32_t V, const struct kern_sampling_params *p, double *prob)
{
	double mx = -INFINITY, s = 0, pmax = 0;
	for (uint32_t v = 0; v < V; v++)
		mx = fmax(mx, l[v] / p->temperature);
	for (uint32_t v = 0; v < V; v++)
		s += exp(l[v] / p->temperature - mx);
	for (uint32_t v = 0; v < V; v++) {
		prob[v] = exp(l[v] / p->temperature - mx) / s;
		pmax = fmax(pmax, prob[v]);
	}
	return pmax;
}

/* The survivors of min_p and top_k in order, sorted by (prob desc, id asc);
 * returns how many. */
static uint32_t ref_candidates(const double *prob, double pmax, uint32_t V, const struct kern_sampling_params *p,
			       uint32_t *order)
{
	uint32_t n = 0;
	for (uint32_t v = 0; v < V; v++)
		if (prob[v] >= p->min_p * pmax)
			order[n++] = v;
	for (uint32_t i = 0; i < n; i++) /* selection sort */
		for (uint32_t j = i + 1; j < n; j++)
			if (prob[order[j]] > prob[order[i]] || (prob[order[j]] == prob[order[i]] && order[j] < order[i])) {
				uint32_t t = order[i];
				order[i] = order[j];
				order[j] = t;
			}
	if (p->top_k > 0 && (uint32_t)p->top_k < n)
		n = (uint32_t)p->top_k;
	return n;
}

/* The filtered, renormalised distribution; also the candidates in order. */
static uint32_t ref_dist(const double *l, uint32_t V, const struct kern_sampling_params *p, double *prob,
			 uint32_t *order)
{
	uint32_t n = ref_candidates(prob, ref_softmax(l, V, p, prob), V, p, order);
	double mass = 0;
	for (uint32_t i = 0; i < n; i++)
		mass += prob[order[i]];
	if (p->top_p < 1.0f) {
		double c = 0;
		for (uint32_t i = 0; i < n; i++) {
			c += prob[order[i]];
			if (c >= p->top_p * mass) {
				n = i + 1;
				break;
			}
		}
	}
	double kept = 0;
	for (uint32_t i = 0; i < n; i++)
		kept += prob[order[i]];
	double *tmp = calloc(V, sizeof(double));
	for (uint32_t i = 0; i < n; i++)
		tmp[order[i]] = prob[order[i]] / kept;
	memcpy(prob, tmp, V * sizeof(double));
	free(tmp);
	return n;
}

/* Whether the filtered distribution of ref_dist is decided with a margin: the
 * kernel computes the probabilities in float, this file in double, so a
 * min_p / top_k / top_p cut within ~1e-7 of a boundary, or two kept tokens
 * whose probabilities differ by ~1 ulp (float may tie them, and ties sort by
 * id), may come out the other way with correct code; one such token changes
 * thousands of the draws below. The test redraws such inputs (each about
 * 1e-5 likely) instead of asserting an order that float cannot resolve. */
static bool ref_dist_clear(const double *l, uint32_t V, const struct kern_sampling_params *p)
{
	const double eps = 1e-5;
	double prob[V];
	uint32_t order[V];
	double pmax = ref_softmax(l, V, p, prob);
	for (uint32_t v = 0; v < V; v++) {
		if (p->min_p > 0 && prob[v] != pmax && fabs(prob[v] - p->min_p * pmax) <= eps * pmax)
			return false;
		for (uint32_t w = v + 1; w < V; w++)
			if (fabs(prob[v] - prob[w]) <= eps * fmax(prob[v], prob[w]))
				return false;
	}
	/* top_p: no running sum of the sorted survivors of min_p and top_k within eps of
	 * the target (no near-ties above, so the order is that of any precision) */
	if (p->top_p < 1.0f) {
		uint32_t m = ref_candidates(prob, pmax, V, p, order);
		double mass = 0, c = 0;
		for (uint32_t i = 0; i < m; i++)
			mass += prob[order[i]];
		for (uint32_t i = 0; i < m; i++) {
			c += prob[order[i]];
			if (fabs(c - p->top_p * mass) <= eps * mass)
				return false;
		}
	}
	return true;
}

static void test_uniform(void)
{
	double s = 0, mn = 1, mx = 0;
	for (uint64_t c = 0; c < 100000; c++) {
		double u = kern_sample_uniform(42, c);
		s += u;
		mn = fmin(mn, u);
		mx = fmax(mx, u);
		T_CHECK(u >= 0 && u < 1);
	}
	T_CLOSE(s / 100000, 0.5, 0.01, 0);
	T_CHECK(mn < 0.001 && mx > 0.999);
	T_CHECK(kern_sample_uniform(42, 7) == kern_sample_uniform(42, 7));
	T_CHECK(kern_sample_uniform(42, 7) != kern_sample_uniform(43, 7));
	T_CHECK(kern_sample_uniform(42, 7) != kern_sample_uniform(42, 8));
}

static void test_greedy_bias_penalties(void)
{
	enum { V = 300 };
	float logits[V];
	double pl[V];
	void *work = malloc(kern_sample_workspace_bytes(V));
	struct kern_sample_out out;
	for (int trial = 0; trial < 200; trial++) {
		for (uint32_t v = 0; v < V; v++)
			logits[v] = (float)(urand() * 10 - 5);
		if (trial % 10 == 0) /* ties: the lowest id wins */
			logits[17] = logits[200] = 6.0f;
		struct kern_sampling_params p = base(0);
		int32_t prompt[20], output[30];
		for (int i = 0; i < 20; i++)
			prompt[i] = (int32_t)rnd(V);
		for (int i = 0; i < 30; i++)
			output[i] = (int32_t)rnd(40); /* repeats */
		struct kern_sample_history h = {prompt, 20, output, 30};
		struct kern_logit_bias lb[3] = {{(int32_t)rnd(V), (float)(urand() * 20 - 10)},
						{(int32_t)rnd(V), 3.0f}, {5, -100.0f}};
		if (trial % 3 == 1) {
			p.repetition_penalty = (float)(0.5 + urand() * 1.5);
			p.presence_penalty = (float)(urand() * 4 - 2);
			p.frequency_penalty = (float)(urand() * 4 - 2);
		}
		if (trial % 2) {
			p.logit_bias = lb;
			p.n_logit_bias = 3;
		}
		T_CHECK(kern_sample_ref(logits, V, &p, &h, 0, work, &out) == ST_OK);
		ref_process(logits, V, &p, &h, pl);
		uint32_t best = 0;
		for (uint32_t v = 1; v < V; v++)
			if (pl[v] > pl[best])
				best = v;
		T_CHECKF(out.token_id == (int32_t)best, "trial %d: %d vs %u", trial, out.token_id, best);
		/* temperature > 0 with top_k 1 is the same argmax */
		p.temperature = 0.7f;
		p.top_k = 1;
		T_CHECK(kern_sample_ref(logits, V, &p, &h, (uint64_t)trial, work, &out) == ST_OK);
		T_CHECK(out.token_id == (int32_t)best);
	}
	free(work);
}

static void test_logprobs(void)
{
	enum { V = 1000 };
	float logits[V];
	void *work = malloc(kern_sample_workspace_bytes(V));
	for (int trial = 0; trial < 20; trial++) {
		for (uint32_t v = 0; v < V; v++)
			logits[v] = (float)(urand() * 30 - 15);
		logits[3] = logits[4] = 20.0f; /* a tie at the top */
		struct kern_sampling_params p = base(trial % 2 ? 1.0f : 0.0f);
		p.logprobs = true;
		p.top_logprobs = 1 + (uint32_t)rnd(20);
		struct kern_logit_bias lb = {9, 50.0f}; /* bias changes the pick but not the raw logprobs */
		p.logit_bias = &lb;
		p.n_logit_bias = 1;
		struct kern_sample_out out;
		T_CHECK(kern_sample_ref(logits, V, &p, NULL, (uint64_t)trial, work, &out) == ST_OK);
		double mx = -INFINITY, s = 0;
		for (uint32_t v = 0; v < V; v++)
			mx = fmax(mx, logits[v]);
		for (uint32_t v = 0; v < V; v++)
			s += exp(logits[v] - mx);
		double lse = mx + log(s);
		T_CHECK(out.token_id == 9);
		T_CLOSE(out.logprob, logits[9] - lse, 1e-4, 1e-5);
		T_CHECK(out.n_top == p.top_logprobs);
		/* the top entries are the k largest raw logits, lower id first on ties */
		bool used[V] = {0};
		for (uint32_t i = 0; i < out.n_top; i++) {
			uint32_t best = V;
			for (uint32_t v = 0; v < V; v++)
				if (!used[v] && (best == V || logits[v] > logits[best]))
					best = v;
			used[best] = true;
			T_CHECKF(out.top_ids[i] == (int32_t)best, "rank %u: %d vs %u", i, out.top_ids[i], best);
			T_CLOSE(out.top_logprobs[i], logits[best] - lse, 1e-4, 1e-5);
		}
	}
	/* no logprobs asked: none returned */
	struct kern_sampling_params p = base(0);
	struct kern_sample_out out;
	T_CHECK(kern_sample_ref(logits, V, &p, NULL, 0, work, &out) == ST_OK && out.n_top == 0 && out.logprob == 0);
	free(work);
}

static void test_distribution(void)
{
	enum { V = 12, N = 20000 };
	float logits[V];
	double pl[V], prob[V];
	uint32_t order[V];
	void *work = malloc(kern_sample_workspace_bytes(V));
	const struct {
		float t, top_p, min_p;
		int32_t top_k;
	} cases[] = {{1.0f, 1.0f, 0, 0}, {0.5f, 1.0f, 0, 0}, {1.5f, 0.8f, 0, 0}, {1.0f, 1.0f, 0, 4},
		     {1.0f, 1.0f, 0.2f, 0}, {0.8f, 0.7f, 0.05f, 6}, {2.0f, 0.3f, 0, 0}, {1.0f, 1.0f, 1.0f, 0}};
	for (uint32_t ci = 0; ci < (uint32_t)(sizeof(cases) / sizeof(cases[0])); ci++) {
		struct kern_sampling_params p = base(cases[ci].t);
		p.top_p = cases[ci].top_p;
		p.min_p = cases[ci].min_p;
		p.top_k = cases[ci].top_k;
		int redraws = 0;
		do {
			for (uint32_t v = 0; v < V; v++)
				logits[v] = (float)(urand() * 4 - 2);
			ref_process(logits, V, &p, NULL, pl);
		} while (!ref_dist_clear(pl, V, &p) && ++redraws < 100);
		T_CHECKF(redraws < 100, "case %u: no logits with clear cuts in 100 draws", ci);
		p.seed = g_rng;
		uint32_t n = ref_dist(pl, V, &p, prob, order);
		uint32_t count[V] = {0}, exact = 0;
		for (uint64_t c = 0; c < N; c++) {
			struct kern_sample_out out;
			T_CHECK(kern_sample_ref(logits, V, &p, NULL, c, work, &out) == ST_OK);
			count[out.token_id]++;
			/* the same inverse CDF by hand */
			double u = kern_sample_uniform(p.seed, c), acc = 0;
			uint32_t want = order[n - 1];
			for (uint32_t i = 0; i < n; i++) {
				acc += prob[order[i]];
				if (acc > u) {
					want = order[i];
					break;
				}
			}
			exact += out.token_id == (int32_t)want;
		}
		T_CHECKF(exact >= N - N / 1000, "case %u: %u of %u draws match the hand-computed inverse CDF", ci, exact, N);
		for (uint32_t v = 0; v < V; v++) {
			double f = (double)count[v] / N, sd = sqrt(prob[v] * (1 - prob[v]) / N);
			if (prob[v] == 0)
				T_CHECKF(count[v] == 0, "case %u: token %u filtered out but drawn %u times", ci, v, count[v]);
			else
				T_CHECKF(fabs(f - prob[v]) <= 5 * sd + 1e-3, "case %u token %u: %.4f vs %.4f", ci, v, f, prob[v]);
		}
	}
	free(work);
}

/* A -inf bias masks a token: never drawn, not even the most likely one. */
static void test_mask(void)
{
	enum { V = 50 };
	float logits[V];
	void *work = malloc(kern_sample_workspace_bytes(V));
	for (uint32_t v = 0; v < V; v++)
		logits[v] = (float)(urand() * 2);
	logits[7] = 30.0f;
	logits[8] = 29.0f;
	struct kern_logit_bias lb[2] = {{7, -INFINITY}, {8, -INFINITY}};
	struct kern_sampling_params p = base(0);
	p.logit_bias = lb;
	p.n_logit_bias = 2;
	struct kern_sample_out out;
	T_CHECK(kern_sample_ref(logits, V, &p, NULL, 0, work, &out) == ST_OK && out.token_id != 7 && out.token_id != 8);
	for (int t = 0; t < 4; t++) {
		p = base(t < 2 ? 1.0f : 3.0f);
		p.top_p = t % 2 ? 0.5f : 1.0f;
		p.logit_bias = lb;
		p.n_logit_bias = 2;
		p.seed = g_rng;
		for (uint64_t c = 0; c < 2000; c++) {
			T_CHECK(kern_sample_ref(logits, V, &p, NULL, c, work, &out) == ST_OK);
			T_CHECK(out.token_id != 7 && out.token_id != 8);
		}
	}
	free(work);
}

/* allow_mask (structured outputs): only allowed tokens are sampled, and the
 * logprobs are those of the distribution renormalised over them. */
static void test_allow_mask(void)
{
	enum { V = 70 };
	float logits[V];
	uint32_t mask[(V + 31) / 32] = {0};
	void *work = malloc(kern_sample_workspace_bytes(V));
	for (uint32_t v = 0; v < V; v++)
		logits[v] = (float)(urand() * 4 - 2);
	logits[3] = 50.0f; /* the argmax is masked out */
	uint32_t n_allowed = 0;
	for (uint32_t v = 0; v < V; v++)
		if (v != 3 && rnd(3) == 0) {
			mask[v >> 5] |= 1u << (v & 31);
			n_allowed++;
		}
	if (!n_allowed) {
		mask[1] |= 1u;
		n_allowed = 1;
	}
	double mx = -1e30, s = 0;
	for (uint32_t v = 0; v < V; v++)
		if (mask[v >> 5] >> (v & 31) & 1)
			mx = logits[v] > mx ? logits[v] : mx;
	for (uint32_t v = 0; v < V; v++)
		if (mask[v >> 5] >> (v & 31) & 1)
			s += exp(logits[v] - mx);
	double lse = mx + log(s);
	for (int t = 0; t < 3; t++) {
		struct kern_sampling_params p = base(t == 0 ? 0.0f : t == 1 ? 1.0f : 2.0f);
		p.allow_mask = mask;
		p.logprobs = true;
		p.top_logprobs = 5;
		p.seed = g_rng;
		for (uint64_t c = 0; c < 300; c++) {
			struct kern_sample_out out;
			T_CHECK(kern_sample_ref(logits, V, &p, NULL, c, work, &out) == ST_OK);
			uint32_t id = (uint32_t)out.token_id;
			T_CHECK(mask[id >> 5] >> (id & 31) & 1);
			T_CLOSE(out.logprob, logits[id] - lse, 1e-5, 1e-5);
			T_CHECK(out.n_top == (n_allowed < 5 ? n_allowed : 5));
			for (uint32_t i = 0; i < out.n_top; i++) {
				uint32_t k = (uint32_t)out.top_ids[i];
				T_CHECK(mask[k >> 5] >> (k & 31) & 1);
			}
		}
	}
	free(work);
}

static void test_invalid(void)
{
	float logits[8] = {0};
	void *work = malloc(kern_sample_workspace_bytes(8));
	struct kern_sample_out out;
	struct kern_sampling_params p = base(1.0f);
	T_CHECK(kern_sample_ref(logits, 0, &p, NULL, 0, work, &out) == ST_INVALID);
	p.top_p = 0;
	T_CHECK(kern_sample_ref(logits, 8, &p, NULL, 0, work, &out) == ST_INVALID);
	p = base(-1.0f);
	T_CHECK(kern_sample_ref(logits, 8, &p, NULL, 0, work, &out) == ST_INVALID);
	p = base(1.0f);
	struct kern_logit_bias lb = {8, 1.0f};
	p.logit_bias = &lb;
	p.n_logit_bias = 1;
	T_CHECK(kern_sample_ref(logits, 8, &p, NULL, 0, work, &out) == ST_INVALID);
	p = base(1.0f);
	p.presence_penalty = 1.0f;
	int32_t bad = 9;
	struct kern_sample_history h = {NULL, 0, &bad, 1};
	T_CHECK(kern_sample_ref(logits, 8, &p, &h, 0, work, &out) == ST_INVALID);
	p = base(1.0f);
	p.top_logprobs = 21;
	T_CHECK(kern_sample_ref(logits, 8, &p, NULL, 0, work, &out) == ST_INVALID);
	/* all-equal logits are fine: uniform over the vocabulary */
	p = base(1.0f);
	T_CHECK(kern_sample_ref(logits, 8, &p, NULL, 0, work, &out) == ST_OK && out.token_id >= 0 && out.token_id < 8);
	free(work);
}

int main(void)
{
	const char *s = getenv("DSV4_TEST_SEED");
	g_rng = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL);
	fprintf(stderr, "seed %llu\n", (unsigned long long)g_rng);
	test_uniform();
	test_greedy_bias_penalties();
	test_logprobs();
	test_distribution();
	test_mask();
	test_allow_mask();
	test_invalid();
	return test_exit();
}
