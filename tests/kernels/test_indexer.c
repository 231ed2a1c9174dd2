/*
 * tests/kernels/test_indexer.c: the indexer pieces (dsv4.md §2.2 item 3,
 * §3.7): the Hadamard against the explicit ±1 matrix and its orthonormality,
 * the FP4 e2m1 quant-dequant against a brute-force nearest-grid search, and
 * the scores + top-k over a flat batch against a double oracle (visibility,
 * min(k, #visible), -1 padding, exact ties broken by the lower entry id).
 */
#include "kernels/indexer/indexer.h"
#include "kernels/norm/lowp_sim.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

static void test_hadamard(int n, int rows)
{
	float *x = xcalloc((size_t)(n * rows), 4), *x0 = xcalloc((size_t)(n * rows), 4);
	mt_fill(x, (size_t)(n * rows), -3, 3);
	memcpy(x0, x, sizeof(float) * (size_t)(n * rows));
	T_CHECK(kern_hadamard_ref(x, rows, n) == ST_OK);
	int bad = 0;
	for (int r = 0; r < rows; r++) {
		double n0 = 0, n1 = 0;
		for (int i = 0; i < n; i++) {
			double s = 0;
			for (int j = 0; j < n; j++)
				s += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x0[r * n + j];
			s /= sqrt((double)n);
			bad += !(fabs(x[r * n + i] - s) <= 1e-5 * (1 + fabs(s)));
			n0 += (double)x0[r * n + i] * x0[r * n + i];
			n1 += (double)x[r * n + i] * x[r * n + i];
		}
		bad += !(fabs(n0 - n1) <= 1e-5 * n0); /* norm preserved */
	}
	T_CHECKF(bad == 0, "hadamard n %d: %d bad", n, bad);
	/* H·H = I: the transform is its own inverse */
	T_CHECK(kern_hadamard_ref(x, rows, n) == ST_OK);
	double worst = 0;
	for (int i = 0; i < n * rows; i++)
		worst = fmax(worst, fabs(x[i] - x0[i]));
	T_CHECKF(worst < 1e-5, "H·H: %g", worst);
	free(x);
	free(x0);
}

/* Brute force: the e2m1 grid point nearest to v, ties to the even code. */
static double e2m1_brute(double v)
{
	static const double g[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
	double a = fabs(v) > 6 ? 6 : fabs(v);
	int best = 0;
	for (int c = 1; c < 8; c++) {
		double dc = fabs(a - g[c]), db = fabs(a - g[best]);
		if (dc < db || (dc == db && c % 2 == 0))
			best = c;
	}
	return v < 0 ? -g[best] : g[best];
}

static void test_fp4(void)
{
	enum { N = 32 * 9 };
	float x[N], x0[N];
	for (int b = 0; b < 9; b++) {
		float mag = ldexpf(1.0f, mt_int(-20, 20));
		for (int i = 0; i < 32; i++)
			x[b * 32 + i] = mt_unif(-mag, mag);
	}
	for (int i = 0; i < 32; i++) /* a block of exact ties and grid points */
		x[i] = (float)(i % 16) * 0.25f * (i < 16 ? 1 : -1);
	x[31] = 6.0f;
	for (int i = 32; i < 64; i++) /* an all-zero block */
		x[i] = 0;
	memcpy(x0, x, sizeof x);
	kern__fp4_qdq(x, N, 32);
	int bad = 0;
	for (int b = 0; b < 9; b++) {
		double amax = 0;
		for (int i = 0; i < 32; i++)
			amax = fmax(amax, fabs(x0[b * 32 + i]));
		amax = fmax(amax, 6 * ldexp(1, -126));
		double s = 1;
		while (s < amax / 6) /* smallest power of two >= amax/6 */
			s *= 2;
		while (s / 2 >= amax / 6)
			s /= 2;
		for (int i = 0; i < 32; i++)
			bad += x[b * 32 + i] != (float)(e2m1_brute(x0[b * 32 + i] / s) * s);
	}
	T_CHECKF(bad == 0, "fp4 qdq: %d bad", bad);
	/* the tie block with s = 1: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4 */
	T_CHECK(x[1] == 0 && x[3] == 1 && x[5] == 1 && x[7] == 2 && x[10] == 2 && x[14] == 4);
	/* rotate+quant = hadamard then qdq */
	float y[128], z[128];
	mt_fill(y, 128, -1, 1);
	memcpy(z, y, sizeof y);
	struct kern_indexer_rotate_args ra = {.x = y, .n_rows = 1, .dim = 128, .fp4_block = 32};
	T_CHECK(kern_indexer_rotate_quant_ref(&ra) == ST_OK);
	T_CHECK(kern_hadamard_ref(z, 1, 128) == ST_OK);
	kern__fp4_qdq(z, 128, 32);
	T_CHECK(memcmp(y, z, sizeof y) == 0);
	T_CHECK(kern_hadamard_ref(z, 1, 96) == ST_INVALID);
}

/* Mismatches of a's output (topk, scores, topk_len) against a brute-force
 * scoring in double: lengths, -1/-inf padding, distinct visible ids, scores,
 * descending order with ties by lower id first, nothing unselected beating a
 * selected entry. */
static int topk_bad_entries(const struct kern_indexer_topk_args *a)
{
	const float *q = a->q, *hw = a->head_w, *keys = a->keys, *sc = a->scores;
	const int32_t *q_off = a->q_off, *start = a->start_pos, *tk = a->topk, *tl = a->topk_len;
	const int64_t *row0 = a->key_row0;
	int n_seqs = a->n_seqs, H = a->n_heads, d = a->head_dim, k = a->top_k;
	int bad = 0;
	double *ref = xcalloc(200, 8);
	for (int s = 0; s < n_seqs; s++)
		for (int32_t i = q_off[s]; i < q_off[s + 1]; i++) {
			int64_t t = start[s] + (i - q_off[s]);
			int nv = (int)((t + 1) / 4), want = nv < k ? nv : k;
			for (int w = 0; w < nv; w++) {
				double acc = 0;
				for (int h = 0; h < H; h++) {
					double dot = 0;
					for (int c = 0; c < d; c++)
						dot += (double)q[(i * H + h) * d + c] * keys[(row0[s] + w) * d + c];
					acc += hw[i * H + h] * fmax(dot, 0);
				}
				ref[w] = acc / sqrt((double)(d * H));
			}
			bad += tl[i] != want;
			bool seen[200] = {false};
			double min_sel = INFINITY;
			for (int j = 0; j < k; j++) {
				int32_t w = tk[i * k + j];
				if (j >= want) {
					bad += w != -1 || !(isinf(sc[i * k + j]) && sc[i * k + j] < 0);
					continue;
				}
				if (w < 0 || w >= nv || seen[w]) {
					bad++;
					continue;
				}
				seen[w] = true;
				bad += !(fabs(sc[i * k + j] - ref[w]) <= 1e-5 * (1 + fabs(ref[w])));
				min_sel = fmin(min_sel, ref[w]);
				if (j > 0) {
					int32_t pw = tk[i * k + j - 1];
					bad += sc[i * k + j] > sc[i * k + j - 1]; /* descending */
					if (sc[i * k + j] == sc[i * k + j - 1])
						bad += w < pw; /* ties: lower id first */
				}
			}
			for (int w = 0; w < nv; w++) /* nothing unselected beats a selected one */
				if (!seen[w])
					bad += ref[w] > min_sel + 1e-5 * (1 + fabs(min_sel));
		}
	free(ref);
	return bad;
}

/* The same keys as a's in a paged pool (2 entries per block, shuffled
 * blocks) select the same entries as tk_want; tk2 is scratch of a's size. */
static void topk_check_paged(const struct kern_indexer_topk_args *a, const int32_t *tk_want, int32_t *tk2)
{
	int n_seqs = a->n_seqs, d = a->head_dim, k = a->top_k;
	int64_t T = a->n_tokens, n_rows = a->n_key_rows;
	const int64_t *row0 = a->key_row0;
	const float *keys = a->keys;
	const int32_t *tk = tk_want;
	enum { PB = 2, BTS = 40 };
	int n_blk = n_seqs * BTS;
	int32_t *bt = xcalloc((size_t)n_blk, 4);
	for (int i = 0; i < n_blk; i++)
		bt[i] = i;
	for (int i = n_blk - 1; i > 0; i--) {
		int j = mt_int(0, i), tmp = bt[i];
		bt[i] = bt[j];
		bt[j] = tmp;
	}
	float *pk = xcalloc((size_t)(n_blk * PB * d), 4);
	for (int s = 0; s < n_seqs; s++)
		for (int64_t e = 0; row0[s] + e < n_rows && e < BTS * PB; e++)
			memcpy(pk + ((int64_t)bt[s * BTS + e / PB] * PB + e % PB) * d, keys + (row0[s] + e) * d,
			       sizeof(float) * (size_t)d);
	struct kern_indexer_topk_args b = *a;
	b.keys = pk;
	b.n_key_rows = n_blk * PB;
	b.key_row0 = NULL;
	b.key_paged = (struct kern_rowmap_paged){.block_table = bt, .bt_stride = BTS, .per_block = PB};
	b.topk = tk2;
	b.work = NULL;
	T_CHECK(kern_indexer_topk_ref(&b) == ST_OK);
	T_CHECK(memcmp(tk, tk2, sizeof(int32_t) * (size_t)(T * k)) == 0);
	free(bt);
	free(pk);
}

/* bf16_scores: every score is a bf16 value within bf16 rounding of the fp32
 * one, descending, with a valid id; and one case by hand. */
static void topk_check_bf16(const struct kern_indexer_topk_args *a)
{
	int k = a->top_k;
	int64_t T = a->n_tokens;
	const int32_t *tl = a->topk_len;
	float *sb = xcalloc((size_t)(T * k), 4);
	int32_t *tkb = xcalloc((size_t)(T * k), 4);
	struct kern_indexer_topk_args b = *a;
	b.bf16_scores = true;
	b.topk = tkb;
	b.scores = sb;
	b.work = NULL;
	T_CHECK(kern_indexer_topk_ref(&b) == ST_OK);
	int bb = 0;
	for (int64_t i = 0; i < T; i++)
		for (int j = 0; j < tl[i]; j++) {
			float v = sb[i * k + j];
			bb += v != kern__bf16_round(v);
			bb += j > 0 && v > sb[i * k + j - 1];
			bb += tkb[i * k + j] < 0;
		}
	T_CHECKF(bb == 0, "bf16 scores: %d bad", bb);
	/* by hand: q·k = 1 + 2^-8 rounds (to even) to 1 in bf16; fp32 keeps it */
	float q1 = 1.0f + 0x1p-8f, k1[4] = {1, 1, 1, 1}, w1 = 1, s1 = 0;
	int32_t qo[2] = {0, 1}, st = 3, id = -1;
	int64_t r0 = 0;
	struct kern_indexer_topk_args h = {.q = &q1, .head_w = &w1, .weight_scale = 1, .bf16_scores = true,
					   .keys = k1, .n_key_rows = 4, .n_tokens = 1, .n_seqs = 1, .q_off = qo,
					   .start_pos = &st, .key_row0 = &r0, .ratio = 4, .n_heads = 1,
					   .head_dim = 1, .top_k = 1, .topk = &id, .scores = &s1};
	T_CHECK(kern_indexer_topk_ref(&h) == ST_OK && id == 0 && s1 == 1.0f);
	h.bf16_scores = false;
	T_CHECK(kern_indexer_topk_ref(&h) == ST_OK && id == 0 && s1 == q1);
	free(sb);
	free(tkb);
}

static void test_topk(int n_seqs, int H, int d, int k, bool ties)
{
	int32_t q_off[9] = {0}, start[8];
	int64_t row0[8], n_rows = 0;
	for (int s = 0; s < n_seqs; s++) {
		int len = mt_int(1, 12);
		start[s] = mt_int(0, 3) == 0 ? 0 : mt_int(0, 120);
		q_off[s + 1] = q_off[s] + len;
		row0[s] = n_rows + mt_int(0, 3);
		n_rows = row0[s] + (start[s] + len) / 4 + 1;
	}
	int64_t T = q_off[n_seqs];
	float *q = xcalloc((size_t)(T * H * d), 4), *hw = xcalloc((size_t)(T * H), 4);
	float *keys = xcalloc((size_t)(n_rows * d), 4), *sc = xcalloc((size_t)(T * k), 4);
	int32_t *tk = xcalloc((size_t)(T * k), 4), *tk2 = xcalloc((size_t)(T * k), 4), *tl = xcalloc((size_t)T, 4);
	float *work = xcalloc(200, 4);
	mt_fill(q, (size_t)(T * H * d), -1, 1);
	mt_fill(hw, (size_t)(T * H), -0.5f, 1);
	mt_fill(keys, (size_t)(n_rows * d), -1, 1);
	if (ties) /* pairs of identical keys give exactly equal scores */
		for (int64_t r = 1; r < n_rows; r += 2)
			memcpy(keys + r * d, keys + (r - 1) * d, sizeof(float) * (size_t)d);
	for (int64_t i = 0; i < T * k; i++)
		tk[i] = -7;
	struct kern_indexer_topk_args a = {.q = q, .head_w = hw, .weight_scale = 1.0f / sqrtf((float)(d * H)),
					   .keys = keys, .n_key_rows = n_rows, .n_tokens = T, .n_seqs = n_seqs,
					   .q_off = q_off, .start_pos = start, .key_row0 = row0, .ratio = 4,
					   .n_heads = H, .head_dim = d, .top_k = k, .topk = tk, .scores = sc,
					   .topk_len = tl};
	T_CHECK(kern_indexer_topk_ref(&a) == ST_OK);
	int bad = topk_bad_entries(&a);
	T_CHECKF(bad == 0, "topk seqs %d H %d d %d k %d ties %d: %d bad", n_seqs, H, d, k, ties, bad);
	/* with the score cache: identical output */
	a.topk = tk2;
	a.work = work;
	a.work_len = 200;
	T_CHECK(kern_indexer_topk_ref(&a) == ST_OK);
	T_CHECK(memcmp(tk, tk2, sizeof(int32_t) * (size_t)(T * k)) == 0);
	topk_check_paged(&a, tk, tk2);
	topk_check_bf16(&a);
	/* a pool too small for the visible entries is refused */
	a.n_key_rows = row0[n_seqs - 1];
	bool any = (start[n_seqs - 1] + (q_off[n_seqs] - q_off[n_seqs - 1])) / 4 > 0;
	if (any)
		T_CHECK(kern_indexer_topk_ref(&a) == ST_INVALID);
	free(q);
	free(hw);
	free(keys);
	free(sc);
	free(tk);
	free(tk2);
	free(tl);
	free(work);
}

/* The TP-split form: two "ranks" score half the heads each, the sums are
 * added (the all-reduce), and the top-k from scores_in equals the one-rank
 * result. Integer-valued inputs make every sum exact, so the two agree bit
 * for bit whatever the summation order. */
static void test_split(void)
{
	enum { HH = 4, DD = 16, K = 6 };
	int32_t q_off[3] = {0, 0, 0}, start[2] = {mt_int(0, 40), mt_int(0, 3) ? mt_int(0, 40) : 0};
	q_off[1] = mt_int(1, 9);
	q_off[2] = q_off[1] + mt_int(1, 9);
	int64_t T = q_off[2], row0[2] = {0, 30};
	float *q = xcalloc((size_t)(T * HH * DD), 4), *hw = xcalloc((size_t)(T * HH), 4), *keys = xcalloc(60 * DD, 4);
	for (int64_t i = 0; i < T * HH * DD; i++)
		q[i] = (float)mt_int(-3, 3);
	for (int64_t i = 0; i < T * HH; i++)
		hw[i] = (float)mt_int(-2, 3);
	for (int i = 0; i < 60 * DD; i++)
		keys[i] = (float)mt_int(-3, 3);
	int64_t stride = 20;
	float *part[2], *sum = xcalloc((size_t)(T * stride), 4);
	int32_t *tk1 = xcalloc((size_t)(T * K), 4), *tk2 = xcalloc((size_t)(T * K), 4);
	struct kern_indexer_topk_args a = {.q = q, .head_w = hw, .weight_scale = 0.25f, .keys = keys,
					   .n_key_rows = 60, .n_tokens = T, .n_seqs = 2, .q_off = q_off,
					   .start_pos = start, .key_row0 = row0, .ratio = 4, .n_heads = HH,
					   .head_dim = DD, .top_k = K, .topk = tk1, .score_stride = stride};
	T_CHECK(kern_indexer_topk_ref(&a) == ST_OK);
	for (int r = 0; r < 2; r++) { /* rank r holds heads [2r, 2r+2) */
		float *qr = xcalloc((size_t)(T * 2 * DD), 4), *wr = xcalloc((size_t)(T * 2), 4);
		for (int64_t t = 0; t < T; t++) {
			memcpy(qr + t * 2 * DD, q + (t * HH + 2 * r) * DD, sizeof(float) * 2 * DD);
			wr[t * 2] = hw[t * HH + 2 * r];
			wr[t * 2 + 1] = hw[t * HH + 2 * r + 1];
		}
		part[r] = xcalloc((size_t)(T * stride), 4);
		fill_nan(part[r], (size_t)(T * stride));
		struct kern_indexer_topk_args b = a;
		b.q = qr, b.head_w = wr, b.n_heads = 2, b.score_out = part[r];
		T_CHECK(kern_indexer_scores_ref(&b) == ST_OK);
		T_CHECK(count_nan(part[r], (size_t)(T * stride)) == 0);
		free(qr);
		free(wr);
	}
	for (int64_t i = 0; i < T * stride; i++)
		sum[i] = part[0][i] + part[1][i];
	struct kern_indexer_topk_args c = {.n_tokens = T, .n_seqs = 2, .q_off = q_off, .start_pos = start,
					   .ratio = 4, .top_k = K, .topk = tk2, .scores_in = sum,
					   .score_stride = stride};
	T_CHECK(kern_indexer_topk_ref(&c) == ST_OK);
	T_CHECK(memcmp(tk1, tk2, sizeof(int32_t) * (size_t)(T * K)) == 0);
	c.score_stride = 1; /* below the visible count of a later token */
	bool any = (start[0] + q_off[1]) / 4 > 1 || (start[1] + q_off[2] - q_off[1]) / 4 > 1;
	if (any)
		T_CHECK(kern_indexer_topk_ref(&c) == ST_INVALID);
	free(q), free(hw), free(keys), free(part[0]), free(part[1]), free(sum), free(tk1), free(tk2);
}

int main(void)
{
	mt_seed_from_env("test_indexer");
	test_hadamard(128, 5);
	test_hadamard(32, 3);
	test_hadamard(1, 2);
	test_fp4();
	for (int rep = 0; rep < 5; rep++)
		test_split();
	for (int rep = 0; rep < 3; rep++) {
		test_topk(mt_int(1, 8), 4, 32, 16, false);
		test_topk(mt_int(1, 8), 4, 32, 5, true);
		test_topk(mt_int(1, 4), 8, 128, 3, false);
	}
	return test_exit();
}
