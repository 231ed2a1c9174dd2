/*
 * tests/model/test_spec_state.c: speculative decoding at the executor level
 * (model/spec.h) on the tiny June checkpoint, reference precision; with
 * DSV4_TEST_DEVICE=cuda (the gpu suite) the executors run on the GPU.
 *
 *  - config: --speculative-config parsing and the draft-kind check (MTP on
 *    a DSpark config is refused naming the reason, K out of range, unknown
 *    keys).
 *  - rollback: executor A (MTP, K = 3) verifies drafts that a test hook
 *    replaces by the true greedy continuation corrupted at position j
 *    (j = 0..K in turn, K = none), so exactly j drafts are accepted each
 *    step. Executor B (no proposals: its MTP layer never sees a draft
 *    position) verifies exactly the accepted drafts. After every step the
 *    whole block pool of A (every layer's rings, open compressor windows,
 *    compressed rows, indexer keys, the MTP layer's ring) is bit-identical
 *    to B's, and both produce the plain greedy tokens of executor C (no
 *    speculation, one token per step). 60 tokens cross block boundaries
 *    (B = 32), both compress ratios' windows and the 32-token ring.
 *  - rule: spec_rule_general's output distribution equals p (chi-square,
 *    p-value >= 1e-4, a second sample when the first is not) for p, q the target's and the MTP head's softmax on
 *    the tiny model.
 */
#include <math.h>

#include "model/exec_cpu.h"
#include "model/forward.h"
#include "model/spec.h"
#include "model/state.h"
#include "tests/model/fwd_harness.h"
#include "tests/model/spec_harness.h"
#include "tests/test.h"

#define BT 32
#define NB 8
#define NP 40
#define NGEN 60
#define K 3

static uint32_t V;
static uint64_t g_seed; /* test_seed(): the prompts and the rule's draws */

static struct model_exec_cpu *mk(struct model_checkpoint *ck, bool mtp)
{
	return sh_exec(ck, BT, NB, mtp, fh_device());
}

/* n floats of a state array, on the host (downloaded from a GPU pool). */
static const float *host_view(const struct model_state *s, const float *p, size_t n, float **buf)
{
	if (!s->mem.device || !p)
		return p;
	*buf = realloc(*buf, n * sizeof(float) + 4);
	struct err e = {0};
	T_CHECKF(*buf && kern_mem_download(&s->mem, *buf, p, n * sizeof(float), &e) == ST_OK, "download: %s", e.msg);
	return *buf;
}

/* On a GPU the kernels need not give bit-identical rows for different batch
 * shapes (a verify of k + 1 tokens against one of a + 1), so there a row
 * differs when it is far: relative L2 distance over 0.5, what a row left by a
 * rejected token (another token's values) shows, while rounding noise, even
 * an FP8 step, stays far below. The CPU reference compares bit for bit. */
static bool rows_far(const float *x, const float *y, size_t n, size_t w)
{
	for (size_t r = 0; r + w <= n; r += w) {
		double dd = 0, yy = 0;
		for (size_t i = r; i < r + w; i++) {
			if (x[i] == y[i])
				continue;
			if (!isfinite(x[i]) || !isfinite(y[i]))
				return true;
			dd += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
			yy += (double)y[i] * y[i];
		}
		if (dd > 0.25 * yy + 1e-12)
			return true;
	}
	return false;
}

/* The block pool of two executors, bit for bit; returns the first differing layer or -1. */
static int state_diff(const struct model_state *a, const struct model_state *b, const char **what)
{
	static float *ba, *bb;
	size_t W = a->window, d = (size_t)a->head_dim, nb = a->n_blocks;
	for (int l = 0; l < a->n_layers; l++) {
		const struct model_layer_state *x = &a->ls[l], *y = &b->ls[l];
		struct {
			const char *n;
			const float *p, *q;
			size_t len;
		} arr[] = {
			{"ring", x->ring, y->ring, nb * W * d},
			{"cmp", x->cmp, y->cmp, nb * (size_t)x->per_block * d},
			{"cmp_kv", x->cmp_kv, y->cmp_kv, nb * (size_t)x->cmp_state_floats},
			{"cmp_score", x->cmp_score, y->cmp_score, nb * (size_t)x->cmp_state_floats},
			{"ikeys", x->ikeys, y->ikeys, nb * (size_t)x->per_block * (size_t)a->index_head_dim},
			{"icmp_kv", x->icmp_kv, y->icmp_kv, nb * (size_t)x->icmp_state_floats},
			{"icmp_score", x->icmp_score, y->icmp_score, nb * (size_t)x->icmp_state_floats},
		};
		for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) {
			if (!arr[i].p || !arr[i].len)
				continue;
			const float *x = host_view(a, arr[i].p, arr[i].len, &ba), *y = host_view(b, arr[i].q, arr[i].len, &bb);
			if (!a->mem.device ? memcmp(x, y, arr[i].len * sizeof(float)) != 0
					   : rows_far(x, y, arr[i].len, d)) {
				*what = arr[i].n;
				return l;
			}
		}
	}
	return -1;
}

static void test_rollback(struct model_checkpoint *ck)
{
	srand((unsigned)g_seed);
	struct sh_seq c, a, b;
	sh_seq_init(&c, 7, NP, BT, NB, 5000);
	a = b = c;
	/* C: plain, one token per step */
	struct model_exec_cpu *xc = mk(ck, false);
	struct exec_sample o;
	while (xc && c.n_tok < NP + NGEN + K + 2)
		if (!sh_step(model_exec_cpu_exec(xc), &c, NULL, 0, &o))
			break;
	model_exec_cpu_destroy(xc);
	sh_hook_st = (struct sh_hook_state){.truth = c.toks, .n_prompt = NP, .vocab = V};

	struct model_exec_cpu *xa = mk(ck, true), *xb = mk(ck, true);
	struct model_spec_exec *sa = NULL, *sb = NULL;
	struct err e = {0};
	struct model_spec_exec_options oa = {.x = xa, .cfg = {MODEL_DRAFT_MTP, K}, .draft_hook = sh_hook};
	struct model_spec_exec_options ob = {.x = xb, .cfg = {MODEL_DRAFT_MTP, K}, .no_propose = true};
	T_CHECKF(xa && model_spec_exec_create(&sa, &oa, &e) == ST_OK, "spec A: %s", e.msg);
	T_CHECKF(xb && model_spec_exec_create(&sb, &ob, &e) == ST_OK, "spec B: %s", e.msg);
	if (!sa || !sb)
		goto out;
	T_CHECK(model_spec_exec_exec(sa)->info.max_draft_tokens == K);
	struct sh_lockstep ls = {.ea = model_spec_exec_exec(sa), .eb = model_spec_exec_exec(sb), .a = &a, .b = &b,
				 .max_drafts = K, .check_b_accepts_all = true};
	uint32_t bad_state = 0, bad_tok = 0;
	sh_lockstep_prefill(&ls);
	while (a.n_tok < NP + NGEN) {
		if (!sh_lockstep_step(&ls))
			break;
		bad_tok += memcmp(a.toks, c.toks, a.n_tok * sizeof(int32_t)) != 0 ||
			   memcmp(b.toks, c.toks, b.n_tok * sizeof(int32_t)) != 0;
		const char *what = "";
		int l = state_diff(model_exec_cpu_state(xa), model_exec_cpu_state(xb), &what);
		if (l >= 0 && bad_state++ < 3)
			fprintf(stderr, "step %u (position %u): layer %d %s differs\n", ls.steps, a.n_cached, l, what);
		ls.steps++;
	}
	const uint32_t *acc = ls.accepted_at;
	fprintf(stderr, "rollback: %u verify steps to %u tokens; accepted 0..%d drafts: %u %u %u %u; state "
			"mismatches %u, token mismatches %u\n", ls.steps, a.n_tok, K, acc[0], acc[1], acc[2], acc[3],
		bad_state, bad_tok);
	T_CHECK(bad_state == 0);
	T_CHECK(bad_tok == 0);
	T_CHECK(ls.accepted_at[0] && ls.accepted_at[1] && ls.accepted_at[2] && ls.accepted_at[3]);
out:
	model_spec_exec_destroy(sa);
	model_spec_exec_destroy(sb);
	model_exec_cpu_destroy(xa);
	model_exec_cpu_destroy(xb);
}

static void test_config(struct model_checkpoint *ck)
{
	struct spec_config c;
	struct err e = {0};
	T_CHECK(spec_config_parse("{\"method\": \"mtp\", \"num_speculative_tokens\": 2}", &c, &e) == ST_OK);
	T_CHECK(c.method == MODEL_DRAFT_MTP && c.num_speculative_tokens == 2);
	T_CHECK(spec_config_parse("{\"method\": \"dspark\"}", &c, &e) == ST_OK);
	T_CHECK(c.method == MODEL_DRAFT_DSPARK && c.num_speculative_tokens == SPEC_MAX_DSPARK_TOKENS);
	T_CHECK(spec_config_parse(NULL, &c, &e) == ST_OK && c.method == MODEL_DRAFT_NONE);
	T_CHECK(spec_config_parse("{\"method\": \"eagle\"}", &c, &e) == ST_INVALID && strstr(e.msg, "eagle"));
	T_CHECK(spec_config_parse("{\"method\": \"mtp\", \"k\": 1}", &c, &e) == ST_INVALID && strstr(e.msg, "\"k\""));
	T_CHECK(spec_config_parse("{\"method\": \"mtp\", \"num_speculative_tokens\": 0}", &c, &e) == ST_INVALID);
	T_CHECK(spec_config_parse("[1]", &c, &e) == ST_INVALID);
	T_CHECK(spec_config_parse("{\"num_speculative_tokens\": 2}", &c, &e) == ST_INVALID && strstr(e.msg, "method"));
	T_CHECK(spec_config_parse("{", &c, &e) == ST_INVALID);
	struct model_config cfg = *model_checkpoint_config(ck);
	struct spec_config mtp = {MODEL_DRAFT_MTP, 3}, mtp4 = {MODEL_DRAFT_MTP, 4}, ds = {MODEL_DRAFT_DSPARK, 5};
	T_CHECK(spec_config_check(&mtp, &cfg, &e) == ST_OK);
	T_CHECK(spec_config_check(&mtp4, &cfg, &e) == ST_INVALID && strstr(e.msg, "1..3"));
	T_CHECKF(spec_config_check(&ds, &cfg, &e) == ST_INVALID && strstr(e.msg, "NextN"), "%s", e.msg);
	/* a 0731 checkpoint: mtp.* are DSpark stages */
	cfg.draft_kind = MODEL_DRAFT_DSPARK;
	cfg.n_draft_layers = 3;
	T_CHECKF(spec_config_check(&mtp, &cfg, &e) == ST_INVALID && strstr(e.msg, "0731") && strstr(e.msg, "dspark"),
		 "%s", e.msg);
	T_CHECK(spec_config_check(&ds, &cfg, &e) == ST_OK);
	cfg.draft_kind = MODEL_DRAFT_NONE;
	cfg.n_draft_layers = 0;
	T_CHECK(spec_config_check(&mtp, &cfg, &e) == ST_INVALID && strstr(e.msg, "no draft model"));
	/* an executor without the MTP layer */
	struct model_exec_cpu *x = mk(ck, false);
	struct model_spec_exec *sx = NULL;
	struct model_spec_exec_options o = {.x = x, .cfg = mtp};
	T_CHECK(x && model_spec_exec_create(&sx, &o, &e) == ST_INVALID && strstr(e.msg, "load_mtp"));
	model_spec_exec_destroy(sx);
	model_exec_cpu_destroy(x);
}

/* Chi-square of spec_rule_general's tokens against p over the tokens with
 * expected count >= 5 (the rest pooled). */
static void test_rule(struct model_checkpoint *ck)
{
	if (fh_on_gpu()) {
		fprintf(stderr, "general rule: a host function, tested by the CPU run of this test\n");
		return;
	}
	struct model_exec_cpu *x = mk(ck, true);
	if (!x)
		return;
	int32_t ids[24];
	for (int i = 0; i < 24; i++)
		ids[i] = 3 + rand() % 5000;
	uint32_t n = 23, blocks[NB];
	for (uint32_t i = 0; i < NB; i++)
		blocks[i] = i;
	int32_t pos[24];
	for (uint32_t i = 0; i < n; i++)
		pos[i] = (int32_t)i;
	struct exec_seq es = {.seq_id = 1, .n_cached_tokens = 0, .n_context_tokens = n, .n_blocks = 1,
			      .state_slot = EXEC_NO_SLOT};
	uint32_t qs[2] = {0, n}, row = n - 1;
	struct exec_step st = {.n_tokens = n, .token_ids = ids, .positions = pos, .n_seqs = 1, .seqs = &es,
			       .query_start = qs, .block_ids = blocks, .n_block_ids = NB};
	float *lp = malloc((size_t)V * sizeof(float)), *lq = malloc((size_t)n * V * sizeof(float));
	double *p = malloc((size_t)V * sizeof(double)), *cnt = calloc(V, sizeof(double));
	float *pf = malloc((size_t)V * sizeof(float)), *qf = malloc((size_t)V * sizeof(float));
	struct err e = {0};
	T_CHECKF(model_exec_cpu_forward(x, &st, &row, 1, lp, &e) == ST_OK, "%s", e.msg);
	const struct model_config *cfg = model_checkpoint_config(ck);
	float *streams = malloc((size_t)n * (size_t)(cfg->hc_mult * cfg->hidden_size) * sizeof(float));
	T_CHECK(model_exec_cpu_read_streams(x, streams, n, &e) == ST_OK);
	T_CHECKF(model_exec_cpu_mtp(x, &st, streams, lq, &e) == ST_OK, "%s", e.msg);
	/* temperature 1.5 softmaxes (flat enough that the residual matters) */
	const float *rows[2] = {lp, lq + (size_t)(n - 1) * V};
	float *outs[2] = {pf, qf};
	for (int k = 0; k < 2; k++) {
		double mx = -INFINITY, s = 0;
		for (uint32_t v = 0; v < V; v++)
			mx = fmax(mx, rows[k][v] / 1.5);
		for (uint32_t v = 0; v < V; v++)
			s += exp(rows[k][v] / 1.5 - mx);
		for (uint32_t v = 0; v < V; v++)
			outs[k][v] = (float)(exp(rows[k][v] / 1.5 - mx) / s);
	}
	/* the 256 tokens most probable under p + q, renormalised: a small vocabulary keeps the draws cheap */
	const uint32_t VS = 256;
	uint32_t *top = malloc(VS * sizeof *top);
	for (uint32_t i = 0; i < VS; i++) {
		uint32_t best = 0;
		for (uint32_t v = 1; v < V; v++)
			if (pf[v] + qf[v] > pf[best] + qf[best])
				best = v;
		top[i] = best;
		p[i] = pf[best];
		cnt[i] = 0.5 * (qf[best] + pf[best]); /* q: the MTP head's softmax mixed with p, so both branches run */
		pf[best] = qf[best] = -1.0f;
	}
	double ps = 0, qs_ = 0;
	for (uint32_t i = 0; i < VS; i++) {
		ps += p[i];
		qs_ += cnt[i];
	}
	for (uint32_t i = 0; i < VS; i++) {
		pf[i] = (float)(p[i] / ps);
		qf[i] = (float)(cnt[i] / qs_);
		p[i] = pf[i];
		cnt[i] = 0;
	}
	free(top);
	V = VS; /* from here on */
	uint64_t seed0 = g_seed;
	for (int attempt = 0; attempt < 2; attempt++) {
		uint64_t seed = seed0 + 0x9E3779B97F4A7C15ull * (uint64_t)attempt;
		double qsum = 0;
		for (uint32_t v = 0; v < V; v++)
			qsum += qf[v];
		const uint32_t N = 40000;
		uint32_t acc = 0;
		for (uint32_t v = 0; v < V; v++)
			cnt[v] = 0;
		for (uint32_t i = 0; i < N; i++) {
			/* d ~ q by inversion */
			double u = kern_sample_uniform(seed, 3 * i) * qsum, c = 0;
			int32_t d = (int32_t)V - 1;
			for (uint32_t v = 0; v < V; v++) {
				c += qf[v];
				if (u < c) {
					d = (int32_t)v;
					break;
				}
			}
			if (!(qf[d] > 0))
				continue;
			int32_t tok;
			bool a;
			T_CHECK(spec_rule_general(pf, qf, V, d, kern_sample_uniform(seed, 3 * i + 1),
						  kern_sample_uniform(seed, 3 * i + 2), &tok, &a) == ST_OK);
			acc += a;
			cnt[tok] += 1;
		}
		double chi = 0, pool_e = 0, pool_o = 0;
		int dof = -1;
		for (uint32_t v = 0; v < V; v++) {
			double ex = p[v] * N;
			if (ex >= 5) {
				chi += (cnt[v] - ex) * (cnt[v] - ex) / ex;
				dof++;
			} else {
				pool_e += ex;
				pool_o += cnt[v];
			}
		}
		if (pool_e > 0) {
			chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
			dof++;
		}
		/* p-value >= 1e-4: chi2 below the 0.9999 quantile (Wilson-Hilferty) */
		double z = 3.719016, k = dof > 0 ? dof : 1;
		double crit = k * pow(1 - 2 / (9 * k) + z * sqrt(2 / (9 * k)), 3);
		fprintf(stderr, "general rule: %u draws, accepted %.3f, chi2 %.1f on %d dof (0.9999 quantile %.1f)\n", N,
			(double)acc / N, chi, dof, crit);
		T_CHECK(dof >= 5);
		T_CHECK(acc > N / 20 && acc < N); /* both branches ran */
		if (chi < crit)
			break;
		/* a correct rule exceeds the 0.9999 quantile once in 10^4 runs: a
		 * second fresh sample must then pass (a false failure: 1 in 10^8) */
		T_CHECKF(attempt == 0, "chi-square over the 0.9999 quantile twice");
	}
	free(lp);
	free(lq);
	free(p);
	free(cnt);
	free(pf);
	free(qf);
	free(streams);
	model_exec_cpu_destroy(x);
}

int main(void)
{
	struct model_checkpoint *ck = fh_open("bf16");
	if (!ck) {
		fprintf(stderr, "no tiny checkpoint\n");
		return 1;
	}
	V = (uint32_t)model_checkpoint_config(ck)->vocab_size;
	g_seed = test_seed();
	test_config(ck);
	test_rollback(ck);
	test_rule(ck);
	model_checkpoint_destroy(ck);
	return test_exit();
}
