/*
 * tests/kernels/test_compressor.c: the CSA/HCA KV compressor (dsv4.md §3.6).
 *   - chunking invariance: several sequences of a flat batch run in one piece,
 *     in random chunks (sequences interleaved differently per step) and token
 *     by token give bit-identical entries and final state;
 *   - the pooled C_w against the window definition of §3.6 in double
 *     (per-channel softmax over the 8 overlapping CSA slots, w = 0's empty
 *     previous window, HCA's m slots, the ape bias by position in window);
 *   - the post-processing (bf16 norm, rope at w·m, FP8 nope / Hadamard+FP4)
 *     against the separately tested ops;
 *   - with a golden file from ref_mops.py (numpy): `test_compressor FILE`.
 */
#include "kernels/compressor/compressor.h"
#include "kernels/indexer/indexer.h"
#include "kernels/norm/lowp_sim.h"
#include "kernels/norm/norm.h"
#include "kernels/rope/rope.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

#define MAXS 6

struct cfg {
	int m, d, rd;
	bool overlap;
	enum kern_cmp_post post;
};

struct world {
	struct cfg c;
	int n_seqs;
	int len[MAXS];
	float *K[MAXS], *Z[MAXS]; /* per sequence [len, c·d] */
	float *ape;
	uint16_t *norm_w;
	float omega[64];
	int64_t out_row0[MAXS], n_out_rows;
};

static int cdim(const struct cfg *c)
{
	return (c->overlap ? 2 : 1) * c->d;
}

static void world_make(struct world *w, struct cfg c, int n_seqs, int max_len)
{
	memset(w, 0, sizeof *w);
	w->c = c;
	w->n_seqs = n_seqs;
	int cd = cdim(&c);
	w->n_out_rows = 0;
	for (int s = 0; s < n_seqs; s++) {
		w->len[s] = mt_int(0, max_len);
		w->K[s] = xcalloc((size_t)(w->len[s] * cd) + 1, 4);
		w->Z[s] = xcalloc((size_t)(w->len[s] * cd) + 1, 4);
		mt_fill(w->K[s], (size_t)(w->len[s] * cd), -2, 2);
		mt_fill(w->Z[s], (size_t)(w->len[s] * cd), -3, 3);
		w->out_row0[s] = w->n_out_rows + 1;
		w->n_out_rows += w->len[s] / c.m + 2;
	}
	w->ape = xcalloc((size_t)(c.m * cd), 4);
	mt_fill(w->ape, (size_t)(c.m * cd), -1, 1);
	w->norm_w = xcalloc((size_t)c.d, 2);
	for (int i = 0; i < c.d; i++)
		w->norm_w[i] = kern__f32_to_bf16(mt_unif(0.5f, 1.5f));
	struct kern_rope_yarn y = {16, 65536, 32, 1};
	T_CHECK(kern_rope_freqs_build(w->omega, c.rd, 160000, &y) == ST_OK);
}

static void world_free(struct world *w)
{
	for (int s = 0; s < w->n_seqs; s++) {
		free(w->K[s]);
		free(w->Z[s]);
	}
	free(w->ape);
	free(w->norm_w);
}

struct result {
	float *out, *pooled, *kv, *sc;
	int32_t *bt; /* paged runs: [MAXS, BT_STRIDE] block table */
};

#define BT_STRIDE 40
#define PER_BLOCK 3

/* Run the world in steps: step_len(s, done) says how many tokens sequence s
 * advances in the next step (mode 0: everything, 1: random, 2: one). */
static void run(const struct world *w, int mode, bool paged, struct result *r)
{
	const struct cfg *c = &w->c;
	int cd = cdim(c), rows = (c->overlap ? 2 : 1) * c->m;
	size_t st_n = (size_t)(rows * cd);
	/* paged: blocks of PER_BLOCK entries, handed out in a shuffled order */
	int64_t pool_rows = paged ? (int64_t)MAXS * BT_STRIDE * PER_BLOCK : w->n_out_rows;
	r->bt = NULL;
	if (paged) {
		int n_blk = MAXS * BT_STRIDE;
		r->bt = xcalloc((size_t)n_blk, 4);
		for (int i = 0; i < n_blk; i++)
			r->bt[i] = i;
		for (int i = n_blk - 1; i > 0; i--) {
			int j = mt_int(0, i), tmp = r->bt[i];
			r->bt[i] = r->bt[j];
			r->bt[j] = tmp;
		}
	}
	r->out = xcalloc((size_t)(pool_rows * c->d) + 1, 4);
	r->pooled = xcalloc((size_t)(pool_rows * c->d) + 1, 4);
	fill_nan(r->out, (size_t)(pool_rows * c->d));
	fill_nan(r->pooled, (size_t)(pool_rows * c->d));
	/* the state pool holds the sequences in reversed slots */
	r->kv = xcalloc(st_n * MAXS, 4);
	r->sc = xcalloc(st_n * MAXS, 4);
	for (int s = 0; s < w->n_seqs; s++)
		kern_compressor_state_init(r->kv + st_n * (size_t)(MAXS - 1 - s), r->sc + st_n * (size_t)(MAXS - 1 - s),
					   c->m, c->overlap, c->d);
	int done[MAXS] = {0};
	int total = 0;
	for (int s = 0; s < w->n_seqs; s++)
		total += w->len[s];
	float *kp = xcalloc((size_t)(total * cd) + 1, 4), *gp = xcalloc((size_t)(total * cd) + 1, 4);
	for (;;) {
		int32_t q_off[MAXS + 1] = {0}, start[MAXS], slot[MAXS], bt[MAXS * BT_STRIDE];
		int64_t row0[MAXS];
		int ns = 0, left = 0;
		for (int s = 0; s < w->n_seqs; s++)
			left += w->len[s] - done[s];
		if (!left)
			break;
		/* a random subset of sequences, in a random order, with random lengths */
		int order[MAXS];
		for (int s = 0; s < w->n_seqs; s++)
			order[s] = s;
		for (int s = w->n_seqs - 1; s > 0; s--) {
			int j = mt_int(0, s), tmp = order[s];
			order[s] = order[j];
			order[j] = tmp;
		}
		int advance[MAXS];
		for (int k = 0; k < w->n_seqs; k++) {
			int s = order[k], rem = w->len[s] - done[s];
			int n = mode == 0 ? rem : mode == 2 ? (rem > 0) : mt_int(0, rem < 11 ? rem : 11);
			if (mode == 1 && mt_int(0, 2) == 0)
				n = rem < 3 ? rem : mt_int(0, 3);
			if (mode != 0 && n == 0 && mt_int(0, 1))
				continue; /* absent from this step */
			advance[ns] = n;
			start[ns] = done[s];
			slot[ns] = MAXS - 1 - s;
			row0[ns] = w->out_row0[s];
			if (paged)
				memcpy(bt + ns * BT_STRIDE, r->bt + s * BT_STRIDE, sizeof(int32_t) * BT_STRIDE);
			memcpy(kp + (int64_t)q_off[ns] * cd, w->K[s] + (int64_t)done[s] * cd, sizeof(float) * (size_t)(n * cd));
			memcpy(gp + (int64_t)q_off[ns] * cd, w->Z[s] + (int64_t)done[s] * cd, sizeof(float) * (size_t)(n * cd));
			q_off[ns + 1] = q_off[ns] + n;
			done[s] += n;
			ns++;
		}
		(void)advance;
		struct kern_compressor_args a = {.kv_proj = kp, .gate_proj = gp, .ape = w->ape, .n_tokens = q_off[ns],
						 .n_seqs = ns, .q_off = q_off, .start_pos = start, .kv_state = r->kv,
						 .score_state = r->sc, .state_slot = slot, .n_state_slots = MAXS,
						 .ratio = c->m, .overlap = c->overlap, .head_dim = c->d,
						 .rope_dim = c->rd, .norm_w = w->norm_w, .norm_eps = 1e-6f,
						 .omega = w->omega, .post = c->post, .out = r->out, .out_row0 = row0,
						 .n_out_rows = pool_rows, .pooled = r->pooled};
		if (paged)
			a.out_paged = (struct kern_rowmap_paged){.block_table = bt, .bt_stride = BT_STRIDE,
								 .per_block = PER_BLOCK};
		T_CHECK(kern_compressor_ref(&a) == ST_OK);
	}
	free(kp);
	free(gp);
}

static void result_free(struct result *r)
{
	free(r->bt);
	free(r->out);
	free(r->pooled);
	free(r->kv);
	free(r->sc);
}

/* C_w from the definition, in double. */
static void oracle_pooled(const struct world *w, int s, int64_t e, double *o)
{
	const struct cfg *c = &w->c;
	int cd = cdim(c), m = c->m, d = c->d;
	for (int ch = 0; ch < d; ch++) {
		double sc[512], kv[512];
		int n = 0;
		if (c->overlap && e > 0)
			for (int j = 0; j < m; j++) { /* previous window, first halves */
				int64_t t = (e - 1) * m + j;
				sc[n] = (double)w->Z[s][t * cd + ch] + w->ape[j * cd + ch];
				kv[n++] = w->K[s][t * cd + ch];
			}
		for (int j = 0; j < m; j++) { /* this window: second halves for CSA */
			int64_t t = e * m + j;
			int col = c->overlap ? d + ch : ch;
			sc[n] = (double)w->Z[s][t * cd + col] + w->ape[j * cd + col];
			kv[n++] = w->K[s][t * cd + col];
		}
		double mx = -INFINITY, den = 0, acc = 0;
		for (int j = 0; j < n; j++)
			mx = fmax(mx, sc[j]);
		for (int j = 0; j < n; j++) {
			den += exp(sc[j] - mx);
			acc += exp(sc[j] - mx) * kv[j];
		}
		o[ch] = acc / den;
	}
}

static void test_world(struct cfg c, int n_seqs, int max_len)
{
	struct world w;
	world_make(&w, c, n_seqs, max_len);
	struct result r0, r1, r2, r3;
	run(&w, 0, false, &r0);
	run(&w, 1, false, &r1);
	run(&w, 2, false, &r2);
	run(&w, 1, true, &r3); /* random chunks into a paged pool */
	size_t n_out = (size_t)(w.n_out_rows * c.d);
	size_t st_n = (size_t)((c.overlap ? 2 : 1) * c.m * cdim(&c)) * MAXS;
	/* bit-identical across chunkings (NaN rows: entries nobody wrote, same in all) */
	int diff = 0;
	for (size_t i = 0; i < n_out; i++) {
		diff += memcmp(&r0.out[i], &r1.out[i], 4) != 0 || memcmp(&r0.out[i], &r2.out[i], 4) != 0;
		diff += memcmp(&r0.pooled[i], &r1.pooled[i], 4) != 0 || memcmp(&r0.pooled[i], &r2.pooled[i], 4) != 0;
	}
	diff += memcmp(r0.kv, r1.kv, st_n * 4) != 0 || memcmp(r0.kv, r2.kv, st_n * 4) != 0;
	diff += memcmp(r0.sc, r1.sc, st_n * 4) != 0 || memcmp(r0.sc, r2.sc, st_n * 4) != 0;
	T_CHECKF(diff == 0, "m %d d %d overlap %d: chunkings differ (%d)", c.m, c.d, c.overlap, diff);
	/* the paged run: entry w of s at block bt[s][w / PER_BLOCK], same bits */
	diff = 0;
	for (int s = 0; s < n_seqs; s++)
		for (int64_t e = 0; e < w.len[s] / c.m; e++) {
			int64_t prow = (int64_t)r3.bt[s * BT_STRIDE + e / PER_BLOCK] * PER_BLOCK + e % PER_BLOCK;
			const float *want = r0.out + (w.out_row0[s] + e) * c.d;
			diff += memcmp(r3.out + prow * c.d, want, sizeof(float) * (size_t)c.d) != 0;
		}
	T_CHECKF(diff == 0, "m %d d %d: paged output differs (%d)", c.m, c.d, diff);

	/* exactly the completed windows were written, nothing else */
	int bad = 0, written = 0;
	double *o = xcalloc((size_t)c.d, 8);
	float *post = xcalloc((size_t)c.d, 4);
	for (int s = 0; s < n_seqs; s++) {
		int64_t lo = w.out_row0[s], hi = lo + w.len[s] / c.m;
		for (int64_t row = lo - 1; row <= hi; row++) {
			size_t nn = count_nan(r0.out + row * c.d, (size_t)c.d);
			if (row >= lo && row < hi)
				bad += nn != 0, written++;
			else /* the gap rows around a sequence's entries stay unwritten */
				bad += nn != (size_t)c.d;
		}
		for (int64_t e = 0; e < w.len[s] / c.m; e++) {
			const float *pl = r0.pooled + (lo + e) * c.d;
			oracle_pooled(&w, s, e, o);
			double err = max_rel_err(pl, o, (size_t)c.d, 1e-5, 1e-5);
			bad += !(err <= 1);
			/* post-processing from the pooled values with the tested ops */
			memcpy(post, pl, sizeof(float) * (size_t)c.d);
			struct kern_rmsnorm_args na = {.x = post, .y = post, .w_bf16 = w.norm_w, .n_rows = 1, .dim = c.d,
						       .eps = 1e-6f, .bf16_in = true, .bf16_out = true};
			T_CHECK(kern_rmsnorm_ref(&na) == ST_OK);
			int32_t pos = (int32_t)e;
			struct kern_rope_args ra = {.x = post, .pos = &pos, .omega = w.omega, .n_rows = 1, .n_heads = 1,
						    .head_dim = c.d, .rope_dim = c.rd, .pos_mul = c.m, .bf16_out = true};
			T_CHECK(kern_rope_ref(&ra) == ST_OK);
			if (c.post == KERN_CMP_POST_FP8_NOPE) {
				kern__fp8_qdq(post, c.d - c.rd, 64);
			} else if (c.post == KERN_CMP_POST_HADAMARD_FP4) {
				T_CHECK(kern_hadamard_ref(post, 1, c.d) == ST_OK);
				for (int i = 0; i < c.d; i++)
					post[i] = kern__bf16_round(post[i]);
				kern__fp4_qdq(post, c.d, 32);
			}
			bad += memcmp(post, r0.out + (lo + e) * c.d, sizeof(float) * (size_t)c.d) != 0;
		}
	}
	T_CHECKF(bad == 0, "m %d d %d overlap %d post %d: %d bad of %d entries", c.m, c.d, c.overlap, c.post, bad,
		 written);
	free(o);
	free(post);
	result_free(&r0);
	result_free(&r1);
	result_free(&r2);
	result_free(&r3);
	world_free(&w);
}

static void test_invalid(void)
{
	float kv[64], sc[64], k[8] = {0}, z[8] = {0}, ape[64] = {0}, out[16], om[4] = {0};
	uint16_t nw[8] = {0};
	int32_t q_off[2] = {0, 4}, start = 0, slot = 1;
	int64_t row0 = 0;
	struct kern_compressor_args a = {.kv_proj = k, .gate_proj = z, .ape = ape, .n_tokens = 4, .n_seqs = 1,
					 .q_off = q_off, .start_pos = &start, .kv_state = kv, .score_state = sc,
					 .state_slot = &slot, .n_state_slots = 1, .ratio = 4, .head_dim = 2,
					 .rope_dim = 2, .norm_w = nw, .norm_eps = 1e-6f, .omega = om, .out = out,
					 .out_row0 = &row0, .n_out_rows = 1};
	T_CHECK(kern_compressor_ref(&a) == ST_INVALID); /* slot out of range */
	slot = 0;
	a.n_out_rows = 0;
	T_CHECK(kern_compressor_ref(&a) == ST_INVALID); /* no room for entry 0 */
	a.n_out_rows = 1;
	kern_compressor_state_init(kv, sc, 4, false, 2);
	T_CHECK(kern_compressor_ref(&a) == ST_OK);
	T_CHECK(kern_compressor_n_emitted(3, 1, 4) == 1 && kern_compressor_n_emitted(4, 3, 4) == 0 &&
		kern_compressor_n_emitted(0, 130, 128) == 1 && kern_compressor_n_emitted(5, 0, 4) == 0);
}

/* numpy golden: one sequence from position 0; pooled tight, entries loose. */
static int run_golden(const char *path)
{
	struct gf g;
	if (gf_load(&g, path))
		return 1;
	struct cfg c = {.m = (int)gf_get(&g, "m", NULL)[0], .d = (int)gf_get(&g, "d", NULL)[0],
			.rd = (int)gf_get(&g, "rd", NULL)[0], .overlap = gf_get(&g, "overlap", NULL)[0] != 0,
			.post = (enum kern_cmp_post)gf_get(&g, "post", NULL)[0]};
	int L = (int)gf_get(&g, "L", NULL)[0], cd = cdim(&c), E = L / c.m;
	float *K = gf_floats(&g, "K", NULL), *Z = gf_floats(&g, "Z", NULL), *ape = gf_floats(&g, "ape", NULL);
	float *om = gf_floats(&g, "omega", NULL), *nwf = gf_floats(&g, "norm_w", NULL);
	{ /* the YaRN table: numpy's (from §3.4) against kern_rope_freqs_build */
		const double *yc = gf_get(&g, "yarn", NULL); /* theta, factor, L0, beta_fast, beta_slow */
		struct kern_rope_yarn y = {yc[1], yc[2], yc[3], yc[4]};
		float mine[64];
		T_CHECK(kern_rope_freqs_build(mine, c.rd, yc[0], &y) == ST_OK);
		double worst = max_rel_err(mine, gf_get(&g, "omega", NULL), (size_t)c.rd / 2, 0, 3e-7);
		T_CHECKF(worst <= 1, "numpy YaRN table: %g", worst);
	}
	uint16_t *nw = xcalloc((size_t)c.d, 2);
	for (int i = 0; i < c.d; i++)
		nw[i] = kern__f32_to_bf16(nwf[i]);
	int rows = (c.overlap ? 2 : 1) * c.m;
	float *kv = xcalloc((size_t)(rows * cd), 4), *sc = xcalloc((size_t)(rows * cd), 4);
	float *out = xcalloc((size_t)(E * c.d) + 1, 4), *pl = xcalloc((size_t)(E * c.d) + 1, 4);
	kern_compressor_state_init(kv, sc, c.m, c.overlap, c.d);
	int32_t q_off[2] = {0, L}, start = 0, slot = 0;
	int64_t row0 = 0;
	struct kern_compressor_args a = {.kv_proj = K, .gate_proj = Z, .ape = ape, .n_tokens = L, .n_seqs = 1,
					 .q_off = q_off, .start_pos = &start, .kv_state = kv, .score_state = sc,
					 .state_slot = &slot, .n_state_slots = 1, .ratio = c.m, .overlap = c.overlap,
					 .head_dim = c.d, .rope_dim = c.rd, .norm_w = nw, .norm_eps = 1e-6f,
					 .omega = om, .post = c.post, .out = out, .out_row0 = &row0, .n_out_rows = E,
					 .pooled = pl};
	T_CHECK(kern_compressor_ref(&a) == ST_OK);
	const double *ep = gf_get(&g, "pooled", NULL), *eo = gf_get(&g, "entries", NULL);
	double e1 = max_rel_err(pl, ep, (size_t)(E * c.d), 1e-5, 1e-5);
	/* entries: bf16 and fp8/fp4 steps may round differently from numpy's
	 * float64 path at a boundary; allow one quantisation step (2^-3
	 * relative for e4m3, a grid step for e2m1) on few values, and check
	 * that the bulk agrees to bf16 precision. */
	int far = 0, coarse = 0;
	for (int i = 0; i < E * c.d; i++) {
		double diff = fabs(out[i] - eo[i]), mag = fabs(eo[i]);
		if (diff > 1e-2 * mag + 1e-3)
			coarse++;
		if (diff > 0.35 * mag + 0.05)
			far++;
	}
	T_CHECKF(e1 <= 1 && far == 0 && coarse <= E * c.d / 50 + 1,
		 "numpy golden m %d d %d: pooled %g, %d far, %d coarse of %d", c.m, c.d, e1, far, coarse, E * c.d);
	free(K);
	free(Z);
	free(ape);
	free(om);
	free(nwf);
	free(nw);
	free(kv);
	free(sc);
	free(out);
	free(pl);
	gf_free(&g);
	return test_exit();
}

int main(int argc, char **argv)
{
	if (argc > 1)
		return run_golden(argv[1]);
	mt_seed_from_env("test_compressor");
	test_invalid();
	for (int rep = 0; rep < 2; rep++) {
		test_world((struct cfg){4, 64, 16, true, KERN_CMP_POST_FP8_NOPE}, MAXS, 40);   /* tiny CSA */
		test_world((struct cfg){8, 64, 16, false, KERN_CMP_POST_FP8_NOPE}, MAXS, 40);  /* tiny HCA */
		test_world((struct cfg){4, 32, 16, true, KERN_CMP_POST_HADAMARD_FP4}, 4, 30); /* tiny indexer */
		test_world((struct cfg){4, 16, 8, true, KERN_CMP_POST_NONE}, 3, 20);
	}
	test_world((struct cfg){4, 512, 64, true, KERN_CMP_POST_FP8_NOPE}, 2, 14);  /* Flash CSA */
	test_world((struct cfg){4, 128, 64, true, KERN_CMP_POST_HADAMARD_FP4}, 2, 14); /* Flash indexer */
	test_world((struct cfg){128, 512, 64, false, KERN_CMP_POST_FP8_NOPE}, 1, 300); /* Flash HCA */
	return test_exit();
}
