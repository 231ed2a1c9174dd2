/*
 * tests/model/test_forward_golden.c: the CPU forward pass against
 * transformers' DeepseekV4ForCausalLM (float32, no cache) on the tiny
 * checkpoints: tests/model/data/golden/golden_{bf16,fp8-deq,nvfp4-deq}.json
 * (+ .bin; README there; read by golden_reader.h, which also reads the
 * earlier all-JSON format). Precision MODEL_PREC_FP32 (no quantization
 * simulations, no bf16 storage rounding), which is what transformers
 * computes.
 *
 * Every prompt is prefilled in chunks of random size (the step budget at
 * most) and every position is compared:
 *  - the acceptance bound, ||ours - ref|| / ||ref|| <= 1e-3, over the stored
 *    top-k ids ∪ probe ids. A subset because a full row is 129280 floats per
 *    position (0.5 GB per variant for the six prompts); the top-k carry the
 *    probability mass sampling sees, the 1024 probes (the special ids and a
 *    seeded spread) are a uniform sample of the rest. The full row is bound
 *    by the next two;
 *  - the full row's norm: | ||ours|| - ||ref|| | / ||ref|| <= 1e-3, and
 *    |lse - lse_ref| <= 1e-4 (log-sum-exp over the whole row);
 *  - on a random sample of positions, the full-row relative difference
 *    estimated from the 32-sign sketch (README): sqrt(mean_j (s_j -
 *    s_j_ref)^2) / ||ref|| <= 1e-3 (the estimate is within a factor ~1.3
 *    of the true value with high probability at 32 signs; the sketch costs
 *    32 adds per logit, too slow for every position under ASan);
 *  - tighter, because both sides are fp32 with different summation orders
 *    (observed max 1.5e-5): max |logit diff| over the subset <= 1e-4, and
 *    the k-th best id where its golden neighbours are more than 2e-4 away;
 *    a wrong formula anywhere (rope pair order, sink, Sinkhorn orientation,
 *    a causality limit off by one) moves logits by 1e-2 or more.
 * Then the greedy continuation (32 tokens in format 2), prefilled in chunks
 * and decoded token by token through the executor's step (cache, sampling at
 * temperature 0), must equal transformers' full recomputation exactly.
 *
 * Runs: bf16 vs golden_bf16; the quantized checkpoints read in their own
 * formats (fp8: FP8 + MXFP4; nvfp4: FP8 + NVFP4) vs the goldens of their
 * dequantized twins, every prompt; the dequantized checkpoints themselves on
 * the short prompts without greedy (their values equal the quantized runs',
 * checked directly by run_same_values; the rest would only repeat them at
 * the cost of the 129280-row head under ASan). Reference precision (the
 * simulations on) is not what transformers computes and is not compared.
 */
#include "tests/model/fwd_harness.h"
#include "tests/model/golden_reader.h"
#include "tests/test.h"

#define TOL_REL 1e-3
#define TOL_LOGIT 1e-4
#define TOL_LSE 1e-4
#define SKETCH_POSITIONS 6 /* sampled positions per prompt, plus the last */

static double g_max_lse, g_max_abs, g_max_rel, g_max_norm, g_max_sketch;
static uint32_t *g_masks;     /* sketch signs of the current golden */
static uint8_t *g_mark;       /* [vocab] scratch: ids in the subset */

struct acc {
	double lse, abs, rel, norm, sketch;
	int bad_ids, n_sketch;
};

/* Our top n ids of row (by value, ties to the lower id), n <= 64. */
static void top_n(const float *row, uint32_t V, uint32_t n, int32_t *ids)
{
	float val[64];
	uint32_t k = 0;
	for (uint32_t v = 0; v < V; v++) {
		float x = row[v];
		if (k == n && !(x > val[n - 1]))
			continue;
		uint32_t i = k < n ? k++ : n - 1;
		while (i > 0 && x > val[i - 1]) {
			val[i] = val[i - 1];
			ids[i] = ids[i - 1];
			i--;
		}
		val[i] = x;
		ids[i] = (int32_t)v;
	}
}

static void check_position(const struct golden *g, const struct gold_prompt *p, uint32_t t, const float *row,
			   uint32_t V, bool sketch, struct acc *a)
{
	double lse = fh_lse(row, V);
	a->lse = fmax(a->lse, fabs(lse - p->lse[t]));
	/* subset: top-k ∪ probes (a top id that is also a probe counted once) */
	const int32_t *ti = p->top_ids + (size_t)t * g->topk;
	const float *tl = p->top_logits + (size_t)t * g->topk, *pl = p->probe_logits + (size_t)t * g->n_probe;
	double d2 = 0, r2 = 0, mabs = 0;
	for (uint32_t k = 0; k < g->topk; k++) {
		double d = (double)row[ti[k]] - tl[k];
		d2 += d * d;
		r2 += (double)tl[k] * tl[k];
		mabs = fmax(mabs, fabs(d));
		g_mark[ti[k]] = 1;
	}
	for (uint32_t k = 0; k < g->n_probe; k++) {
		double d = (double)row[g->probe_ids[k]] - pl[k];
		mabs = fmax(mabs, fabs(d));
		if (g_mark[g->probe_ids[k]])
			continue;
		d2 += d * d;
		r2 += (double)pl[k] * pl[k];
	}
	for (uint32_t k = 0; k < g->topk; k++)
		g_mark[ti[k]] = 0;
	if (isnan(mabs) || isnan(d2))
		mabs = d2 = INFINITY;
	a->abs = fmax(a->abs, mabs);
	a->rel = fmax(a->rel, r2 > 0 ? sqrt(d2 / r2) : sqrt(d2));
	/* ranks: our k-th best must be the golden k-th where the gap is clear */
	int32_t ours[64];
	uint32_t K = g->topk < 64 ? g->topk : 64;
	top_n(row, V, K, ours);
	for (uint32_t k = 0; k + 1 < K; k++) {
		double hi = k ? tl[k - 1] : INFINITY, lo = tl[k + 1];
		if (tl[k] - lo > 2 * TOL_LOGIT && hi - tl[k] > 2 * TOL_LOGIT && ours[k] != ti[k])
			a->bad_ids++;
	}
	if (p->norm2) {
		double n2 = 0;
		for (uint32_t v = 0; v < V; v++)
			n2 += (double)row[v] * row[v];
		double rn = sqrt((double)p->norm2[t]);
		double dn = fabs(sqrt(n2) - rn) / rn;
		a->norm = fmax(a->norm, isnan(dn) ? INFINITY : dn);
		if (sketch && p->sketch && g_masks) {
			double s[32], e2 = 0;
			golden_sketch(g_masks, g->n_sketch, row, V, s);
			for (uint32_t j = 0; j < g->n_sketch; j++) {
				double d = s[j] - p->sketch[(size_t)t * g->n_sketch + j];
				e2 += d * d;
			}
			double est = sqrt(e2 / g->n_sketch) / rn;
			a->sketch = fmax(a->sketch, isnan(est) ? INFINITY : est);
			a->n_sketch++;
		}
	}
	if (getenv("FWD_DEBUG"))
		fprintf(stderr, "  %s pos %u: lse %.3g abs %.3g rel %.3g\n", p->name, t, fabs(lse - p->lse[t]), mabs,
			r2 > 0 ? sqrt(d2 / r2) : 0);
}

/* Prefill the prompt in random chunks, compare every position. */
static void check_prompt(struct model_exec_cpu *x, const struct golden *g, const struct gold_prompt *p,
			 const char *label)
{
	const struct exec_info *info = &model_exec_cpu_exec(x)->info;
	uint32_t V = info->vocab_size, n = p->n;
	uint32_t max_chunk = info->max_step_tokens < 256 ? info->max_step_tokens : 256;
	float *lg = malloc((size_t)max_chunk * V * sizeof(float));
	struct fh_pool pool = {.next = 0, .n = info->n_blocks};
	struct fh_seq s = {.id = 1, .ids = p->ids, .n_ids = n};
	struct fh_seq *sp = &s;
	struct acc a = {0};
	bool *sk = calloc(n, 1);
	for (int k = 0; k < SKETCH_POSITIONS; k++)
		sk[fh_rand(n)] = true;
	sk[n - 1] = true;
	uint32_t n_chunks = 0;
	while (lg && s.n_done < n) {
		uint32_t chunk = 1 + fh_rand(max_chunk);
		if (chunk > n - s.n_done)
			chunk = n - s.n_done;
		uint32_t t0 = s.n_done;
		struct err e = {0};
		enum status st = fh_step(x, &pool, &sp, &chunk, 1, lg, &e);
		T_CHECKF(st == ST_OK, "%s %s: %s", label, p->name, e.msg);
		if (st)
			break;
		n_chunks++;
		for (uint32_t i = 0; i < chunk; i++)
			check_position(g, p, t0 + i, lg + (size_t)i * V, V, sk[t0 + i], &a);
	}
	fprintf(stderr,
		"%s %s (%u tokens, %u chunks): max rel %.3g, |logit| %.3g, |lse| %.3g, rel norm %.3g, "
		"sketch rel %.3g (%d positions), rank mismatches %d\n",
		label, p->name, n, n_chunks, a.rel, a.abs, a.lse, a.norm, a.sketch, a.n_sketch, a.bad_ids);
	T_CHECKF(s.n_done == n, "%s %s: prefill stopped at %u", label, p->name, s.n_done);
	T_CHECKF(a.rel <= TOL_REL, "%s %s: relative difference %g", label, p->name, a.rel);
	T_CHECKF(a.norm <= TOL_REL, "%s %s: full-row norm differs by %g", label, p->name, a.norm);
	T_CHECKF(a.sketch <= TOL_REL, "%s %s: full-row sketch difference %g", label, p->name, a.sketch);
	T_CHECKF(a.lse <= TOL_LSE, "%s %s: lse %g", label, p->name, a.lse);
	T_CHECKF(a.abs <= TOL_LOGIT, "%s %s: logits %g", label, p->name, a.abs);
	T_CHECKF(a.bad_ids == 0, "%s %s: %d top ids out of order", label, p->name, a.bad_ids);
	g_max_lse = fmax(g_max_lse, a.lse);
	g_max_abs = fmax(g_max_abs, a.abs);
	g_max_rel = fmax(g_max_rel, a.rel);
	g_max_norm = fmax(g_max_norm, a.norm);
	g_max_sketch = fmax(g_max_sketch, a.sketch);
	free(sk);
	free(lg);
}

/* Greedy decoding through the step API (prefill in chunks, then one token
 * per step; sampling at temperature 0, the cache) against transformers'
 * full recomputation. */
static void check_greedy(struct model_exec_cpu *x, const struct gold_prompt *p, const char *label)
{
	struct exec *ex = model_exec_cpu_exec(x);
	uint32_t B = ex->info.block_tokens, n = p->n, ng = p->n_greedy;
	uint32_t max_q = ex->info.max_step_tokens;
	int32_t *all = calloc((size_t)n + ng + 1, sizeof *all);
	int32_t *pos = calloc(max_q, sizeof *pos);
	memcpy(all, p->ids, (size_t)n * sizeof *all);
	uint32_t blocks[FH_MAX_SEQ_BLOCKS], nblk = 0, done = 0, len = n, n_out = 0;
	struct kern_sampling_params sp = {.temperature = 0, .top_p = 1, .repetition_penalty = 1, .seed = 1};
	uint32_t ok = 0, first_bad = ng;
	while (n_out < ng) {
		uint32_t q = len - done;
		if (q > max_q)
			q = max_q;
		bool last = done + q == len;
		while (nblk * B < done + q && nblk < FH_MAX_SEQ_BLOCKS)
			blocks[nblk] = nblk, nblk++;
		for (uint32_t k = 0; k < q; k++)
			pos[k] = (int32_t)(done + k);
		struct exec_seq es = {.seq_id = 7, .n_cached_tokens = done, .n_context_tokens = done + q,
				      .n_blocks = (done + q + B - 1) / B, .block_table_start = 0, .sample = last,
				      .sampling = &sp, .prompt_ids = p->ids, .n_prompt = n, .output_ids = all + n,
				      .n_output = n_out};
		uint32_t qs[2] = {0, q};
		struct exec_step step = {.n_tokens = q, .token_ids = all + done, .positions = pos, .n_seqs = 1,
					 .seqs = &es, .query_start = qs, .block_ids = blocks, .n_block_ids = es.n_blocks,
					 .n_sample = last ? 1 : 0};
		struct exec_sample out;
		struct err e = {0};
		enum status st = ex->ops->step(ex->ctx, &step, &out, &e);
		T_CHECKF(st == ST_OK, "%s %s: %s", label, p->name, e.msg);
		if (st)
			break;
		done += q;
		if (!last)
			continue;
		all[len++] = out.out.token_id;
		if (out.out.token_id == p->greedy[n_out])
			ok++;
		else if (first_bad == ng)
			first_bad = n_out;
		n_out++;
	}
	if (ex->ops->seq_release)
		ex->ops->seq_release(ex->ctx, 7);
	if (first_bad < ng)
		fprintf(stderr, "%s %s greedy: first difference at token %u: %d, golden %d (golden margin %.3g)\n", label,
			p->name, first_bad, all[n + first_bad], p->greedy[first_bad],
			p->greedy_margin ? p->greedy_margin[first_bad] : NAN);
	fprintf(stderr, "%s %s greedy: %u of %u tokens as the full recomputation\n", label, p->name, ok, ng);
	T_CHECKF(ok == ng, "%s %s greedy continuation differs", label, p->name);
	free(all);
	free(pos);
}

static struct model_exec_cpu *make(struct model_checkpoint *ck, enum model_precision prec)
{
	struct model_exec_cpu_options o = {.ck = ck, .block_tokens = 64, .n_blocks = 16, .max_step_tokens = 256,
					   .max_step_seqs = 4, .precision = prec, .dev = fh_device()};
	struct model_exec_cpu *x = NULL;
	struct err e = {0};
	enum status st = model_exec_cpu_create(&x, &o, &e);
	T_CHECKF(st == ST_OK, "create: %s", e.msg);
	return x;
}

/* max_len: prompts longer than this are skipped, greedy: also decode (keeps
 * the dequantized twins, whose values the quantized runs already cover,
 * cheap: a decode step costs a whole lm_head pass, about half the test). */
static void run_golden(const char *variant, const char *golden, size_t max_len, bool greedy)
{
	/* DSV4_GOLDEN_DIR: other golden files (e.g. golden_logits.py --fake output, to test the reader) */
	const char *src = getenv("DSV4_SOURCE_ROOT"), *gd = getenv("DSV4_GOLDEN_DIR");
	char dir[1100];
	if (gd && *gd)
		snprintf(dir, sizeof dir, "%s", gd);
	else
		snprintf(dir, sizeof dir, "%s/tests/model/data/golden", src ? src : ".");
	struct golden g;
	int rc = golden_load(&g, dir, golden);
	T_CHECKF(rc == 0, "%s: %s", g.path, g.msg);
	struct model_checkpoint *ck = fh_open(variant);
	T_CHECK(ck != NULL);
	struct model_exec_cpu *x = rc == 0 && ck ? make(ck, MODEL_PREC_FP32) : NULL;
	if (x) {
		uint32_t V = model_exec_cpu_exec(x)->info.vocab_size;
		T_CHECKF(!g.vocab || g.vocab == V, "golden vocab %u, model %u", g.vocab, V);
		g_mark = calloc(V, 1);
		g_masks = g.format == 2 ? golden_sketch_masks(&g, V) : NULL;
		T_CHECK(g.format == 1 || g_masks);
		char label[64];
		snprintf(label, sizeof label, "%s vs golden_%s", variant, golden);
		for (int i = 0; g_mark && i < g.n_prompts; i++) {
			if (g.p[i].n > max_len)
				continue;
			T_CHECKF(g.p[i].n + g.p[i].n_greedy <= 16 * 64, "%s: prompt %s too long for the pool", label,
				 g.p[i].name);
			check_prompt(x, &g, &g.p[i], label);
			if (greedy)
				check_greedy(x, &g.p[i], label);
		}
		free(g_mark);
		free(g_masks);
		g_mark = NULL;
		g_masks = NULL;
	}
	model_exec_cpu_destroy(x);
	model_checkpoint_destroy(ck);
	if (rc == 0)
		golden_free(&g);
}

/* A quantized checkpoint read in its own format vs its dequantized twin. */
static void run_same_values(const char *q, const char *deq, double tol)
{
	struct model_checkpoint *a = fh_open(q), *b = fh_open(deq);
	T_CHECK(a && b);
	if (!a || !b) {
		model_checkpoint_destroy(a);
		model_checkpoint_destroy(b);
		return;
	}
	struct model_exec_cpu *xa = make(a, MODEL_PREC_FP32), *xb = make(b, MODEL_PREC_FP32);
	uint32_t n = 37, V = model_exec_cpu_exec(xa)->info.vocab_size;
	int32_t ids[37];
	for (uint32_t i = 0; i < n; i++)
		ids[i] = i ? (int32_t)fh_rand(V) : 0;
	float *la = malloc((size_t)n * V * 4), *lb = malloc((size_t)n * V * 4);
	struct fh_pool pa = {.n = 16}, pb = {.n = 16};
	struct fh_seq sa = {.id = 1, .ids = ids, .n_ids = n}, sb = sa;
	struct fh_seq *spa = &sa, *spb = &sb;
	struct err e = {0};
	T_CHECKF(fh_step(xa, &pa, &spa, &n, 1, la, &e) == ST_OK, "%s", e.msg);
	T_CHECKF(fh_step(xb, &pb, &spb, &n, 1, lb, &e) == ST_OK, "%s", e.msg);
	double d = fh_max_abs_diff(la, lb, (size_t)n * V);
	fprintf(stderr, "%s (own format) vs %s, fp32 precision: max |logit diff| %.3g\n", q, deq, d);
	/* Only fp32 precision: with the simulations on, act_quant runs before
	 * GEMMs of quantized weights only (as in the reference), so the
	 * dequantized twin legitimately differs. */
	T_CHECKF(d <= tol, "%s vs %s: %g", q, deq, d);
	free(la);
	free(lb);
	model_exec_cpu_destroy(xa);
	model_exec_cpu_destroy(xb);
	model_checkpoint_destroy(a);
	model_checkpoint_destroy(b);
}

/* The sketch rule against values computed by hand from the README's
 * definition (splitmix64 of seed + j*2^32 + v, top bit = minus). */
static void check_sketch_rule(void)
{
	struct golden g = {.n_sketch = 2, .sketch_seed = 0x5EED5EED};
	uint32_t *m = golden_sketch_masks(&g, 3);
	T_CHECK(m != NULL);
	if (!m)
		return;
	for (uint32_t v = 0; v < 3; v++)
		for (uint32_t j = 0; j < 2; j++) {
			uint64_t z = 0x5EED5EEDull + ((uint64_t)j << 32) + v + 0x9E3779B97F4A7C15ull;
			z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
			z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
			z ^= z >> 31;
			T_CHECK(((m[v] >> j) & 1) == (z >> 63));
		}
	float row[3] = {1, 2, 4};
	double s[2];
	golden_sketch(m, 2, row, 3, s);
	for (uint32_t j = 0; j < 2; j++) {
		double want = 0;
		for (uint32_t v = 0; v < 3; v++)
			want += ((m[v] >> j) & 1 ? -1 : 1) * row[v];
		T_CLOSE(s[j], want, 0, 0);
	}
	free(m);
}

int main(void)
{
	check_sketch_rule();
	if (!fh_tiny_dir())
		return test_skip("no tiny checkpoints (scripts/make_tiny_model needs the venv)");
	const char *seed = getenv("DSV4_TEST_SEED");
	uint64_t s = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
	fprintf(stderr, "DSV4_TEST_SEED=%llu\n", (unsigned long long)s);
	fh_rng_state ^= s;
	run_golden("bf16", "bf16", 100000, true);
	run_golden("fp8", "fp8-deq", 100000, true);
	run_golden("nvfp4", "nvfp4-deq", 100000, true);
	run_golden("fp8-deq", "fp8-deq", 64, false);
	run_golden("nvfp4-deq", "nvfp4-deq", 64, false);
	run_same_values("fp8", "fp8-deq", 1e-5);
	run_same_values("nvfp4", "nvfp4-deq", 1e-4);
	fprintf(stderr,
		"overall vs transformers: max rel %.3g, |logit| %.3g, |lse| %.3g, rel norm %.3g, sketch rel %.3g\n",
		g_max_rel, g_max_abs, g_max_lse, g_max_norm, g_max_sketch);
	return test_exit();
}
