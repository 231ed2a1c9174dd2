/*
 * tests/kernels/test_attention.c: sparse MQA attention with sink and inverse
 * rope (dsv4.md §3.3) against a double oracle over several row sources, with
 * -1 and repeated indices and variable lengths; all -1 gives 0; the sink's
 * effect (o_sink = o · Σe^s/(Σe^s + e^sink)); and the SWA/CSA/HCA index
 * builders (§3.5, §3.7, §3.8) against a brute-force enumeration, plus an
 * end-to-end check that ring + fresh-KV indices give the same attention as
 * one buffer holding the whole history (chunks longer than the window).
 */
#include <complex.h>

#include "kernels/attention/attention.h"
#include "kernels/rope/rope.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

struct problem {
	int64_t T;
	int H, d, rd, stride;
	int64_t rows[KERN_ATTN_MAX_SRC];
	float *q, *kv[KERN_ATTN_MAX_SRC], *sink, omega[32];
	int32_t *idx, *len, *pos;
};

static const float *oracle_row(const struct problem *p, int64_t i)
{
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		if (i < p->rows[s])
			return p->kv[s] + i * p->d;
		i -= p->rows[s];
	}
	return NULL;
}

/* o[t,h,:] in double; rope: apply the inverse rotation; sink: use it. */
static void oracle(const struct problem *p, bool sink, bool rope, float scale, double *out, double *sum_e)
{
	for (int64_t t = 0; t < p->T; t++)
		for (int h = 0; h < p->H; h++) {
			double *o = out + (t * p->H + h) * p->d;
			const float *q = p->q + (t * p->H + h) * p->d;
			double mx = sink ? p->sink[h] : -INFINITY;
			int n = p->len ? p->len[t] : p->stride;
			for (int j = 0; j < n; j++) {
				int32_t i = p->idx[t * p->stride + j];
				if (i < 0)
					continue;
				const float *e = oracle_row(p, i);
				double s = 0;
				for (int c = 0; c < p->d; c++)
					s += (double)q[c] * e[c];
				mx = fmax(mx, s * scale);
			}
			double den = 0;
			for (int c = 0; c < p->d; c++)
				o[c] = 0;
			for (int j = 0; j < n; j++) {
				int32_t i = p->idx[t * p->stride + j];
				if (i < 0)
					continue;
				const float *e = oracle_row(p, i);
				double s = 0;
				for (int c = 0; c < p->d; c++)
					s += (double)q[c] * e[c];
				double w = exp(s * scale - mx);
				den += w;
				for (int c = 0; c < p->d; c++)
					o[c] += w * e[c];
			}
			if (sum_e)
				sum_e[t * p->H + h] = den * exp(mx - (sink ? p->sink[h] : 0)); /* Σe^s / e^sink */
			double tot = den + (sink ? exp(p->sink[h] - mx) : 0);
			for (int c = 0; c < p->d; c++)
				o[c] = tot > 0 ? o[c] / tot : 0;
			if (rope)
				for (int i = 0; i < p->rd / 2; i++) {
					float ang = (float)p->pos[t] * p->omega[i];
					double complex z = (o[p->d - p->rd + 2 * i] + I * o[p->d - p->rd + 2 * i + 1]) *
							   cexp(-I * (double)ang);
					o[p->d - p->rd + 2 * i] = creal(z);
					o[p->d - p->rd + 2 * i + 1] = cimag(z);
				}
		}
}

static void make(struct problem *p, int64_t T, int H, int d, int rd, int stride, int neg_pct)
{
	memset(p, 0, sizeof *p);
	p->T = T, p->H = H, p->d = d, p->rd = rd, p->stride = stride;
	int64_t total = 0;
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		p->rows[s] = mt_int(s == 1 ? 0 : 1, 40);
		p->kv[s] = xcalloc((size_t)(p->rows[s] * d) + 1, sizeof(float));
		mt_fill(p->kv[s], (size_t)(p->rows[s] * d), -1, 1);
		total += p->rows[s];
	}
	p->q = xcalloc((size_t)(T * H * d) + 1, 4);
	mt_fill(p->q, (size_t)(T * H * d), -1.5f, 1.5f);
	p->sink = xcalloc((size_t)H, 4);
	mt_fill(p->sink, (size_t)H, -2, 3);
	p->idx = xcalloc((size_t)(T * stride) + 1, 4);
	p->len = xcalloc((size_t)T + 1, 4);
	p->pos = xcalloc((size_t)T + 1, 4);
	for (int64_t t = 0; t < T; t++) {
		p->len[t] = mt_int(0, stride);
		p->pos[t] = mt_int(0, 100000);
		for (int j = 0; j < stride; j++) /* -1s, repeats, and junk past len (must be ignored) */
			p->idx[t * stride + j] = j >= p->len[t] ? 99999999
						 : mt_int(0, 99) < neg_pct ? -1 : mt_int(0, (int)total - 1);
	}
	struct kern_rope_yarn y = {16, 65536, 32, 1};
	T_CHECK(kern_rope_freqs_build(p->omega, rd, 160000, &y) == ST_OK);
}

static void unmake(struct problem *p)
{
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++)
		free(p->kv[s]);
	free(p->q);
	free(p->sink);
	free(p->idx);
	free(p->len);
	free(p->pos);
}

static struct kern_sparse_attn_args args_of(struct problem *p, float *out, bool sink, bool rope, float scale)
{
	struct kern_sparse_attn_args a = {.q = p->q, .out = out, .idx = p->idx, .idx_len = p->len,
					  .idx_stride = p->stride, .sink = sink ? p->sink : NULL,
					  .softmax_scale = scale, .pos = p->pos, .omega = rope ? p->omega : NULL,
					  .rope_dim = p->rd, .n_tokens = p->T, .n_heads = p->H, .head_dim = p->d};
	for (int s = 0; s < KERN_ATTN_MAX_SRC; s++) {
		a.kv[s] = p->kv[s];
		a.kv_rows[s] = p->rows[s];
	}
	return a;
}

static void test_attn(int64_t T, int H, int d, int rd, int stride, int neg_pct)
{
	struct problem p;
	make(&p, T, H, d, rd, stride, neg_pct);
	size_t n = (size_t)(T * H * d);
	float *out = xcalloc(n + 1, 4), *out2 = xcalloc(n + 1, 4);
	double *ref = xcalloc(n + 1, 8), *sum_e = xcalloc((size_t)(T * H) + 1, 8);
	float scale = 1.0f / sqrtf((float)d);
	for (int mode = 0; mode < 4; mode++) {
		bool sink = mode & 1, rope = mode & 2;
		fill_nan(out, n);
		struct kern_sparse_attn_args a = args_of(&p, out, sink, rope, scale);
		T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
		oracle(&p, sink, rope, scale, ref, NULL);
		double e = max_rel_err(out, ref, n, 2e-6, 1e-4);
		T_CHECKF(count_nan(out, n) == 0 && e <= 1, "T %lld H %d d %d stride %d mode %d: %g", (long long)T, H,
			 d, stride, mode, e);
	}
	/* sink effect: o_sink = o_nosink · r/(r+1), r = Σe^s / e^sink */
	struct kern_sparse_attn_args a = args_of(&p, out, false, false, scale);
	T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
	a.out = out2;
	a.sink = p.sink;
	T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
	oracle(&p, true, false, scale, ref, sum_e);
	int bad = 0;
	for (int64_t t = 0; t < T; t++)
		for (int h = 0; h < H; h++) {
			double r = sum_e[t * H + h], f = r / (r + 1);
			for (int c = 0; c < d; c++) {
				size_t i = (size_t)((t * H + h) * d + c);
				bad += !(fabs(out2[i] - out[i] * f) <= 1e-5 + 1e-4 * fabs(out[i]));
			}
		}
	T_CHECK(bad == 0);
	free(out);
	free(out2);
	free(ref);
	free(sum_e);
	unmake(&p);
}

static void test_all_negative(void)
{
	struct problem p;
	make(&p, 4, 3, 32, 16, 6, 100); /* every index -1 */
	size_t n = 4 * 3 * 32;
	float out[4 * 3 * 32];
	for (int sink = 0; sink < 2; sink++) {
		fill_nan(out, n);
		struct kern_sparse_attn_args a = args_of(&p, out, sink, true, 0.125f);
		T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
		int nz = 0;
		for (size_t i = 0; i < n; i++)
			nz += out[i] != 0;
		T_CHECKF(nz == 0, "all -1 (sink %d): %d nonzero", sink, nz);
	}
	/* a huge sink drains the output */
	for (int h = 0; h < 3; h++)
		p.sink[h] = 80;
	for (int64_t t = 0; t < 4; t++) {
		p.len[t] = 6;
		for (int j = 0; j < 6; j++)
			p.idx[t * 6 + j] = j % 3;
	}
	struct kern_sparse_attn_args a = args_of(&p, out, true, false, 0.125f);
	T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
	double mx = 0;
	for (size_t i = 0; i < n; i++)
		mx = fmax(mx, fabs(out[i]));
	T_CHECK(mx < 1e-20);
	/* out-of-range indices are refused */
	p.idx[5] = (int32_t)(p.rows[0] + p.rows[1] + p.rows[2]);
	T_CHECK(kern_sparse_attn_ref(&a) == ST_INVALID);
	unmake(&p);
}

/* ---- index builders ---- */

static int cmp_i32(const void *a, const void *b)
{
	return *(const int32_t *)a - *(const int32_t *)b;
}

struct batch {
	int n_seqs, window, ratio;
	int32_t q_off[9], start[9];
	int64_t ring0[8], cmp0[8], cur0;
	int64_t T;
};

static void make_batch(struct batch *b, int n_seqs, int window, int ratio)
{
	memset(b, 0, sizeof *b);
	b->n_seqs = n_seqs, b->window = window, b->ratio = ratio;
	b->cur0 = mt_int(0, 5);
	int64_t row = b->cur0;
	for (int s = 0; s < n_seqs; s++) {
		int kind = mt_int(0, 3);
		int len = kind == 0 ? 1 : kind == 1 ? mt_int(1, 3 * window) : mt_int(1, 20);
		b->start[s] = kind == 2 ? 0 : mt_int(0, 700);
		b->q_off[s + 1] = b->q_off[s] + len;
		(void)row;
	}
	b->T = b->q_off[n_seqs];
	int64_t r = b->cur0 + b->T;
	for (int s = 0; s < n_seqs; s++) {
		b->ring0[s] = r;
		r += window;
	}
	for (int s = 0; s < n_seqs; s++) {
		b->cmp0[s] = r;
		r += 1000;
	}
}

static void test_index(int n_seqs, int window, int ratio, bool csa)
{
	struct batch b;
	make_batch(&b, n_seqs, window, ratio);
	int k = 5;
	int stride = window + (ratio ? (csa ? k : 1000 / ratio + 200) : 0) + 3;
	int32_t *idx = xcalloc((size_t)(b.T * stride) + 1, 4), *len = xcalloc((size_t)b.T + 1, 4);
	int32_t *topk = xcalloc((size_t)(b.T * k) + 1, 4);
	for (int s = 0; s < n_seqs; s++)
		for (int32_t i = b.q_off[s]; i < b.q_off[s + 1]; i++) {
			int64_t t = b.start[s] + (i - b.q_off[s]);
			int vis = ratio ? (int)((t + 1) / ratio) : 0;
			for (int j = 0; j < k; j++) /* distinct visible ids or -1 */
				topk[i * k + j] = j < vis && mt_int(0, 4) ? (int32_t)((j * 7 + t) % (vis ? vis : 1)) : -1;
			for (int j = 0; j < k; j++)
				for (int q = 0; q < j; q++)
					if (topk[i * k + j] == topk[i * k + q])
						topk[i * k + j] = -1;
		}
	struct kern_attn_index_args a = {.n_tokens = b.T, .n_seqs = n_seqs, .q_off = b.q_off, .start_pos = b.start,
					 .window = window, .cur_row0 = b.cur0, .ring_row0 = b.ring0, .ratio = ratio,
					 .cmp_row0 = b.cmp0, .topk = csa ? topk : NULL, .topk_stride = k, .idx = idx,
					 .idx_len = len, .idx_stride = stride};
	for (int64_t i = 0; i < b.T * stride; i++)
		idx[i] = -7;
	T_CHECK(kern_attn_index_ref(&a) == ST_OK);
	int bad = 0;
	int32_t *want = xcalloc((size_t)stride + 1000, 4), *got = xcalloc((size_t)stride + 1, 4);
	for (int s = 0; s < n_seqs; s++)
		for (int32_t i = b.q_off[s]; i < b.q_off[s + 1]; i++) {
			int64_t t = b.start[s] + (i - b.q_off[s]);
			int n = 0;
			for (int64_t p = 0; p <= t; p++) /* brute force over every position */
				if (t - p < window)
					want[n++] = (int32_t)(p >= b.start[s] ? b.cur0 + b.q_off[s] + (p - b.start[s])
									  : b.ring0[s] + p % window);
			if (ratio) {
				for (int64_t w = 0; w * ratio + ratio - 1 <= t; w++) { /* window finished by t */
					bool sel = !csa;
					for (int j = 0; csa && j < k; j++)
						sel |= topk[i * k + j] == w;
					if (sel)
						want[n++] = (int32_t)(b.cmp0[s] + w);
				}
			}
			bad += len[i] != n;
			memcpy(got, idx + (int64_t)i * stride, sizeof(int32_t) * (size_t)stride);
			for (int j = len[i]; j < stride; j++)
				bad += got[j] != -1;
			if (len[i] == n) {
				qsort(got, (size_t)n, 4, cmp_i32);
				qsort(want, (size_t)n, 4, cmp_i32);
				bad += memcmp(got, want, sizeof(int32_t) * (size_t)n) != 0;
			}
		}
	T_CHECKF(bad == 0, "index seqs %d window %d ratio %d csa %d: %d bad", n_seqs, window, ratio, csa, bad);
	if (csa) { /* an invisible top-k entry is refused */
		for (int32_t i = 0; i < b.T; i++) {
			int64_t t = b.start[0] + i;
			if (i < b.q_off[1]) {
				int32_t keep = topk[i * k];
				topk[i * k] = (int32_t)((t + 1) / ratio);
				T_CHECK(kern_attn_index_ref(&a) == ST_INVALID);
				topk[i * k] = keep;
				break;
			}
		}
	}
	/* the compressed rows through a paged table: same sets, rows remapped */
	if (ratio) {
		enum { PB = 3, BTS = 400 };
		int32_t *bt = xcalloc((size_t)(n_seqs * BTS), 4);
		for (int i = 0; i < n_seqs * BTS; i++)
			bt[i] = mt_int(0, 1000);
		int32_t *idx2 = xcalloc((size_t)(b.T * stride) + 1, 4), *len2 = xcalloc((size_t)b.T + 1, 4);
		struct kern_attn_index_args pa = a;
		pa.cmp_row0 = NULL;
		pa.cmp_paged = (struct kern_rowmap_paged){.block_table = bt, .bt_stride = BTS, .per_block = PB};
		pa.idx = idx2;
		pa.idx_len = len2;
		T_CHECK(kern_attn_index_ref(&pa) == ST_OK);
		int pbad = 0;
		for (int64_t i = 0; i < b.T; i++) {
			int s = 0;
			while (b.q_off[s + 1] <= i)
				s++;
			pbad += len2[i] != len[i];
			for (int j = 0; j < len[i] && len2[i] == len[i]; j++) {
				int64_t r = idx[i * stride + j], expect = r;
				if (r >= b.cmp0[s] && r < b.cmp0[s] + 1000) { /* a compressed entry: remap */
					int64_t e = r - b.cmp0[s];
					expect = (int64_t)bt[s * BTS + e / PB] * PB + e % PB;
				}
				pbad += idx2[i * stride + j] != expect;
			}
		}
		T_CHECKF(pbad == 0, "paged compressed rows: %d bad", pbad);
		free(bt);
		free(idx2);
		free(len2);
	}
	a.idx_stride = window - 1; /* too small for a full window */
	bool has_full = false;
	for (int s = 0; s < n_seqs; s++)
		has_full |= b.start[s] + (b.q_off[s + 1] - b.q_off[s]) >= window;
	if (has_full)
		T_CHECK(kern_attn_index_ref(&a) == ST_INVALID);
	free(want);
	free(got);
	free(idx);
	free(len);
	free(topk);
}

/* Ring + fresh KV through the index builder equals one whole-history buffer. */
static void test_ring_equivalence(void)
{
	enum { W = 8, H = 2, D = 16, RD = 8 };
	struct batch b;
	make_batch(&b, 3, W, 0);
	b.cur0 = 0;
	int64_t max_pos = 0;
	for (int s = 0; s < 3; s++)
		max_pos = b.start[s] + (b.q_off[s + 1] - b.q_off[s]) > max_pos ? b.start[s] + (b.q_off[s + 1] - b.q_off[s])
										 : max_pos;
	/* history[s][p]: raw KV of sequence s at position p */
	float *hist = xcalloc((size_t)(3 * max_pos * D) + 1, 4);
	mt_fill(hist, (size_t)(3 * max_pos * D), -1, 1);
	float *fresh = xcalloc((size_t)(b.T * D) + 1, 4), *ring = xcalloc(3 * W * D, 4);
	int32_t pos[1024];
	for (int s = 0; s < 3; s++) {
		for (int32_t i = b.q_off[s]; i < b.q_off[s + 1]; i++) {
			pos[i] = b.start[s] + (i - b.q_off[s]);
			memcpy(fresh + (int64_t)i * D, hist + ((int64_t)s * max_pos + pos[i]) * D, D * 4);
		}
		for (int p = 0; p < b.start[s]; p++) /* the ring as decode left it */
			memcpy(ring + ((int64_t)s * W + p % W) * D, hist + ((int64_t)s * max_pos + p) * D, D * 4);
		b.ring0[s] = b.T + (int64_t)s * W;
	}
	int32_t *idx = xcalloc((size_t)(b.T * W), 4), *len = xcalloc((size_t)b.T, 4);
	struct kern_attn_index_args ia = {.n_tokens = b.T, .n_seqs = 3, .q_off = b.q_off, .start_pos = b.start,
					  .window = W, .cur_row0 = 0, .ring_row0 = b.ring0, .idx = idx, .idx_len = len,
					  .idx_stride = W};
	T_CHECK(kern_attn_index_ref(&ia) == ST_OK);
	float *q = xcalloc((size_t)(b.T * H * D), 4), *o1 = xcalloc((size_t)(b.T * H * D), 4);
	float *o2 = xcalloc((size_t)(b.T * H * D), 4), sink[H] = {0.5f, -1};
	mt_fill(q, (size_t)(b.T * H * D), -1, 1);
	struct kern_sparse_attn_args a = {.q = q, .out = o1, .kv = {fresh, ring}, .kv_rows = {b.T, 3 * W},
					  .idx = idx, .idx_len = len, .idx_stride = W, .sink = sink,
					  .softmax_scale = 0.25f, .n_tokens = b.T, .n_heads = H, .head_dim = D};
	T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
	/* direct: indices straight into the history buffer */
	int32_t *idx2 = xcalloc((size_t)(b.T * W), 4);
	for (int s = 0; s < 3; s++)
		for (int32_t i = b.q_off[s]; i < b.q_off[s + 1]; i++) {
			int n = 0;
			for (int p = pos[i] - W + 1 < 0 ? 0 : pos[i] - W + 1; p <= pos[i]; p++)
				idx2[i * W + n++] = (int32_t)((int64_t)s * max_pos + p);
			len[i] = n;
		}
	struct kern_sparse_attn_args a2 = {.q = q, .out = o2, .kv = {hist}, .kv_rows = {3 * max_pos}, .idx = idx2,
					   .idx_len = len, .idx_stride = W, .sink = sink, .softmax_scale = 0.25f,
					   .n_tokens = b.T, .n_heads = H, .head_dim = D};
	T_CHECK(kern_sparse_attn_ref(&a2) == ST_OK);
	int bad = 0;
	for (int64_t i = 0; i < b.T * H * D; i++)
		bad += o1[i] != o2[i];
	T_CHECKF(bad == 0, "ring vs history: %d differ", bad);
	free(hist);
	free(fresh);
	free(ring);
	free(idx);
	free(len);
	free(q);
	free(o1);
	free(o2);
	free(idx2);
}

/* Several steps of random chunks (longer than the window too): the rings are
 * kept only by kern_ring_write_ref, and every step's attention through
 * ring + fresh KV equals attention over the whole history. */
static void test_ring_steps(void)
{
	enum { W = 8, H = 2, D = 16, NS = 3, MAXP = 120 };
	float *hist = xcalloc(NS * MAXP * D, 4), *ring = xcalloc(NS * W * D, 4);
	mt_fill(hist, NS * MAXP * D, -1, 1);
	fill_nan(ring, NS * W * D);
	int done[NS] = {0};
	int64_t ring0[NS] = {0, W, 2 * W};
	int bad = 0, steps = 0;
	while (steps < 40) {
		int32_t q_off[NS + 1] = {0}, start[NS];
		int64_t r0[NS];
		int ns = 0;
		for (int s = 0; s < NS; s++) {
			int n = mt_int(0, 3) == 0 ? mt_int(0, 2 * W + 3) : mt_int(0, 2);
			if (done[s] + n > MAXP)
				n = MAXP - done[s];
			start[ns] = done[s];
			q_off[ns + 1] = q_off[ns] + n;
			ns++;
		}
		int64_t T = q_off[ns];
		steps++;
		if (!T)
			continue;
		for (int k = 0; k < NS; k++) /* index space: [fresh T rows | ring pool] */
			r0[k] = T + ring0[k];
		float *fresh = xcalloc((size_t)(T * D), 4), *q = xcalloc((size_t)(T * H * D), 4);
		float *o1 = xcalloc((size_t)(T * H * D), 4), *o2 = xcalloc((size_t)(T * H * D), 4);
		int32_t *idx = xcalloc((size_t)(T * W), 4), *len = xcalloc((size_t)T, 4), *idx2 = xcalloc((size_t)(T * W), 4);
		mt_fill(q, (size_t)(T * H * D), -1, 1);
		for (int s = 0; s < NS; s++)
			for (int32_t i = q_off[s]; i < q_off[s + 1]; i++)
				memcpy(fresh + (int64_t)i * D, hist + ((int64_t)s * MAXP + start[s] + (i - q_off[s])) * D, D * 4);
		struct kern_attn_index_args ia = {.n_tokens = T, .n_seqs = NS, .q_off = q_off, .start_pos = start,
						  .window = W, .cur_row0 = 0, .ring_row0 = r0, .idx = idx, .idx_len = len,
						  .idx_stride = W};
		T_CHECK(kern_attn_index_ref(&ia) == ST_OK);
		struct kern_sparse_attn_args a = {.q = q, .out = o1, .kv = {fresh, ring}, .kv_rows = {T, NS * W},
						  .idx = idx, .idx_len = len, .idx_stride = W, .softmax_scale = 0.25f,
						  .n_tokens = T, .n_heads = H, .head_dim = D};
		T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
		for (int s = 0; s < NS; s++)
			for (int32_t i = q_off[s]; i < q_off[s + 1]; i++) {
				int p = start[s] + (i - q_off[s]), n = 0;
				for (int k = p - W + 1 < 0 ? 0 : p - W + 1; k <= p; k++)
					idx2[i * W + n++] = s * MAXP + k;
				len[i] = n;
			}
		struct kern_sparse_attn_args a2 = a;
		a2.out = o2;
		a2.kv[0] = hist;
		a2.kv_rows[0] = NS * MAXP;
		a2.kv[1] = NULL;
		a2.kv_rows[1] = 0;
		a2.idx = idx2;
		T_CHECK(kern_sparse_attn_ref(&a2) == ST_OK);
		for (int64_t i = 0; i < T * H * D; i++)
			bad += o1[i] != o2[i];
		struct kern_ring_write_args rw = {.src = fresh, .ring = ring, .ring_row0 = ring0, .n_ring_rows = NS * W,
						  .n_tokens = T, .n_seqs = NS, .q_off = q_off, .start_pos = start,
						  .window = W, .dim = D};
		T_CHECK(kern_ring_write_ref(&rw) == ST_OK);
		for (int s = 0; s < NS; s++)
			done[s] += q_off[s + 1] - q_off[s];
		free(fresh);
		free(q);
		free(o1);
		free(o2);
		free(idx);
		free(len);
		free(idx2);
	}
	T_CHECKF(bad == 0, "ring steps: %d outputs differ", bad);
	/* the rings hold exactly the last W positions of each sequence */
	bad = 0;
	for (int s = 0; s < NS; s++)
		for (int p = done[s] - W < 0 ? 0 : done[s] - W; p < done[s]; p++)
			bad += memcmp(ring + (ring0[s] + p % W) * D, hist + ((int64_t)s * MAXP + p) * D, D * 4) != 0;
	T_CHECK(bad == 0);
	struct kern_ring_write_args rw = {.src = hist, .ring = ring, .ring_row0 = ring0, .n_ring_rows = NS * W - 1,
					  .n_tokens = 1, .n_seqs = 1, .q_off = (int32_t[]){0, 1},
					  .start_pos = (int32_t[]){0}, .window = W, .dim = D};
	rw.ring_row0 = (int64_t[]){2 * W};
	T_CHECK(kern_ring_write_ref(&rw) == ST_INVALID); /* ring beyond the pool */
	free(hist);
	free(ring);
}

int main(void)
{
	mt_seed_from_env("test_attention");
	test_attn(5, 4, 64, 16, 12, 20);
	test_attn(3, 8, 512, 64, 40, 10); /* Flash head dims */
	test_attn(4, 2, 33, 8, 1, 0);     /* odd head dim, one index */
	test_attn(2, 1, 16, 16, 0, 0);    /* zero index slots: output 0 */
	test_attn(0, 4, 64, 16, 8, 0);    /* empty batch */
	test_all_negative();
	for (int rep = 0; rep < 4; rep++) {
		test_index(mt_int(1, 8), 8, 0, false);
		test_index(mt_int(1, 8), 16, 4, true);
		test_index(mt_int(1, 8), 8, 4, false);
		test_index(mt_int(1, 8), 32, 8, false);
		test_index(mt_int(1, 8), 128, 128, false);
		test_ring_equivalence();
	}
	test_ring_steps();
	return test_exit();
}
