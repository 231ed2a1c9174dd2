/*
 * tests/kernels/test_movement.c: the CPU references of the movement ops
 * (kernels/movement/movement.h) against independent loops on fresh random
 * inputs: gathers, scatters and permutations with skipped (-1) rows and
 * strides, the vocab-parallel embedding, pool block copies and fills, bf16
 * rounding edges, the residual add, the activation quantization simulation
 * (equal to kernels/quant's functions, values on the FP8 / FP4 grids, gaps
 * untouched), the expert-row weights with rows past the count untouched, and
 * ST_INVALID for bad arguments. Every op table has its CPU reference first.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static bool same_bits(const float *a, const float *b, size_t n)
{
	return memcmp(a, b, n * sizeof(float)) == 0;
}

/* A random permutation of 0..n-1 with about a quarter of the entries -1. */
static int32_t *rand_idx(int64_t n, int64_t range, bool holes)
{
	int32_t *p = xcalloc((size_t)range + 1, sizeof *p);
	for (int64_t i = 0; i < range; i++)
		p[i] = (int32_t)i;
	for (int64_t i = range - 1; i > 0; i--) {
		int64_t j = (int64_t)(mt_next() % (uint64_t)(i + 1));
		int32_t t = p[i];
		p[i] = p[j];
		p[j] = t;
	}
	for (int64_t i = 0; i < n && holes; i++)
		if (mt_next() % 4 == 0)
			p[i] = -1;
	return p;
}

static void t_copy_rows(int64_t n, int64_t dim, int64_t n_src, int64_t n_dst, int64_t pad_s, int64_t pad_d,
			int mode /* 0 plain, 1 gather, 2 scatter, 3 both */)
{
	int64_t ss = dim + pad_s, ds = dim + pad_d;
	size_t nsrc = (size_t)(n_src * ss), ndst = (size_t)(n_dst * ds);
	float *src = xcalloc(nsrc + 1, 4), *dst = xcalloc(ndst + 1, 4), *want = xcalloc(ndst + 1, 4);
	mt_fill(src, nsrc, -5, 5);
	fill_nan(dst, ndst);
	fill_nan(want, ndst);
	int32_t *si = (mode & 1) ? rand_idx(n, n_src, true) : NULL;
	int32_t *di = (mode & 2) ? rand_idx(n, n_dst, true) : NULL;
	for (int64_t i = 0; i < n; i++) {
		int64_t d = di ? di[i] : i, s = si ? si[i] : i;
		if (d >= 0 && s >= 0)
			for (int64_t k = 0; k < dim; k++)
				want[d * ds + k] = src[s * ss + k];
	}
	struct kern_copy_rows_args a = {.dst = dst, .dst_stride = pad_d ? ds : 0, .dst_idx = di, .src = src,
					.src_stride = pad_s ? ss : 0, .src_idx = si, .n_rows = n, .dim = dim};
	T_CHECK(kern_copy_rows_ref(&a) == ST_OK);
	T_CHECKF(same_bits(dst, want, ndst), "copy_rows n %lld dim %lld mode %d", (long long)n, (long long)dim, mode);
	free(src);
	free(dst);
	free(want);
	free(si);
	free(di);
}

static void t_embed(int64_t vocab, int64_t begin, int64_t rows, int64_t n_tok, int64_t dim, int copies)
{
	uint16_t *table = xcalloc((size_t)(rows * dim) + 1, 2);
	for (int64_t i = 0; i < rows * dim; i++)
		table[i] = kern_f32_to_bf16(mt_unif(-2, 2));
	int32_t *ids = xcalloc((size_t)n_tok + 1, 4);
	for (int64_t t = 0; t < n_tok; t++)
		ids[t] = (int32_t)(mt_next() % (uint64_t)vocab);
	size_t no = (size_t)(n_tok * copies * dim);
	float *out = xcalloc(no + 1, 4);
	fill_nan(out, no);
	struct kern_embed_args a = {.table = table, .vocab_begin = begin, .vocab_rows = rows, .ids = ids,
				    .n_tokens = n_tok, .dim = dim, .n_copies = copies, .out = out};
	T_CHECK(kern_embed_ref(&a) == ST_OK);
	size_t bad = 0;
	for (int64_t t = 0; t < n_tok; t++)
		for (int c = 0; c < copies; c++)
			for (int64_t k = 0; k < dim; k++) {
				int64_t r = ids[t] - begin;
				uint32_t w = (r >= 0 && r < rows) ? (uint32_t)table[r * dim + k] << 16 : 0;
				bad += fbits(out[(t * copies + c) * dim + k]) != w;
			}
	T_CHECKF(bad == 0, "embed vocab %lld begin %lld rows %lld: %zu wrong", (long long)vocab, (long long)begin,
		 (long long)rows, bad);
	free(table);
	free(ids);
	free(out);
}

static void t_blocks(int64_t n_blocks, int64_t stride, int64_t len, int64_t off, int64_t n)
{
	size_t np = (size_t)(n_blocks * stride);
	float *pool = xcalloc(np + 1, 4), *want = xcalloc(np + 1, 4);
	mt_fill(pool, np, -3, 3);
	memcpy(want, pool, np * 4);
	/* dst from the first half of a permutation, src from the second: disjoint */
	int32_t *perm = rand_idx(n_blocks, n_blocks, false);
	int32_t *dst = xcalloc((size_t)n + 1, 4), *src = xcalloc((size_t)n + 1, 4);
	for (int64_t i = 0; i < n; i++) {
		dst[i] = perm[i];
		src[i] = perm[n + (int64_t)(mt_next() % (uint64_t)(n_blocks - n))];
		memcpy(want + dst[i] * stride + off, want + src[i] * stride + off, (size_t)len * 4);
	}
	struct kern_block_copy_args c = {.pool = pool, .region_stride = stride, .region_len = len,
					 .region_offset = off, .dst_ids = dst, .src_ids = src, .n = n};
	T_CHECK(kern_block_copy_ref(&c) == ST_OK);
	T_CHECKF(same_bits(pool, want, np), "block_copy blocks %lld stride %lld len %lld off %lld n %lld",
		 (long long)n_blocks, (long long)stride, (long long)len, (long long)off, (long long)n);
	float v = mt_unif(-1, 1);
	for (int64_t i = 0; i < n; i++)
		for (int64_t k = 0; k < len; k++)
			want[src[i] * stride + off + k] = v;
	struct kern_block_fill_args f = {.pool = pool, .region_stride = stride, .region_len = len,
					 .region_offset = off, .ids = src, .n = n, .value = v};
	T_CHECK(kern_block_fill_ref(&f) == ST_OK);
	T_CHECKF(same_bits(pool, want, np), "block_fill stride %lld len %lld off %lld", (long long)stride,
		 (long long)len, (long long)off);
	free(pool);
	free(want);
	free(perm);
	free(dst);
	free(src);
}

static void t_round_bf16(void)
{
	float x[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f + 0x1p-20f), INFINITY, -INFINITY, NAN,
		     FLT_MAX, 0.0f, -0.0f, 0x1p-130f, 0x1p-140f};
	float want[] = {1.0f, 1.0f + 0x1p-6f, -(1.0f + 0x1p-7f), INFINITY, -INFINITY, NAN, INFINITY, 0.0f, -0.0f,
			0x1p-130f, 0.0f};
	size_t n = sizeof x / sizeof x[0];
	struct kern_round_bf16_args a = {.x = x, .n = (int64_t)n};
	T_CHECK(kern_round_bf16_ref(&a) == ST_OK);
	for (size_t i = 0; i < n; i++)
		T_CHECKF(isnan(want[i]) ? isnan(x[i]) : fbits(x[i]) == fbits(want[i]), "[%zu] %a want %a", i, x[i],
			 want[i]);
	enum { N = 4099 };
	float *r = xcalloc(N, 4), *o = xcalloc(N, 4);
	for (int i = 0; i < N; i++)
		r[i] = o[i] = mt_unif(-1e3f, 1e3f) * powf(2, (float)mt_int(-30, 30));
	a = (struct kern_round_bf16_args){.x = r, .n = N};
	T_CHECK(kern_round_bf16_ref(&a) == ST_OK);
	size_t bad = 0;
	for (int i = 0; i < N; i++) {
		/* a bf16 value, within half a bf16 ulp (2^-8 relative) of the input */
		bad += (fbits(r[i]) & 0xffff) != 0 || fabs((double)r[i] - o[i]) > fabs((double)o[i]) * 0x1p-8;
	}
	T_CHECKF(bad == 0, "round_bf16: %zu of %d wrong", bad, N);
	free(r);
	free(o);
}

static void t_add(int64_t n)
{
	float *y = xcalloc((size_t)n + 1, 4), *x = xcalloc((size_t)n + 1, 4), *w = xcalloc((size_t)n + 1, 4);
	mt_fill(y, (size_t)n, -4, 4);
	mt_fill(x, (size_t)n, -4, 4);
	for (int64_t i = 0; i < n; i++)
		w[i] = y[i] + x[i];
	y[n] = 7.0f; /* past the end: untouched */
	struct kern_add_args a = {.y = y, .x = x, .n = n};
	T_CHECK(kern_add_ref(&a) == ST_OK);
	T_CHECK(same_bits(y, w, (size_t)n) && y[n] == 7.0f);
	free(y);
	free(x);
	free(w);
}

static void t_act_quant(int64_t rows, int64_t cols, int64_t pad, int block, int fp4)
{
	int64_t ld = cols + pad;
	size_t n = (size_t)(rows * ld);
	float *x = xcalloc(n + 1, 4), *want = xcalloc(n + 1, 4), *orig = xcalloc(n + 1, 4);
	for (size_t i = 0; i < n; i++)
		x[i] = mt_unif(-1, 1) * powf(2, (float)mt_int(-12, 12));
	memcpy(orig, x, n * 4);
	memcpy(want, x, n * 4);
	if (fp4)
		kern_act_quant_fp4_sim(want, rows, cols, ld, block);
	else
		kern_act_quant_fp8_sim(want, rows, cols, ld, block);
	struct kern_act_quant_sim_args a = {.x = x, .n_rows = rows, .n_cols = cols, .ld = ld, .block = block,
					    .fp4 = fp4};
	T_CHECK(kern_act_quant_sim_ref(&a) == ST_OK);
	T_CHECK(same_bits(x, want, n));
	/* gaps untouched; values within a quantization step of the block's amax */
	size_t bad = 0;
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t k = cols; k < ld; k++)
			bad += fbits(x[r * ld + k]) != fbits(orig[r * ld + k]);
		for (int64_t b0 = 0; b0 < cols; b0 += block) {
			int64_t b1 = b0 + block < cols ? b0 + block : cols;
			double amax = 0;
			for (int64_t k = b0; k < b1; k++)
				amax = fmax(amax, fabs(orig[r * ld + k]));
			for (int64_t k = b0; k < b1; k++)
				bad += fabs((double)x[r * ld + k] - orig[r * ld + k]) > amax * (fp4 ? 0.34 : 0.0626);
		}
	}
	T_CHECKF(bad == 0, "act_quant_sim rows %lld cols %lld block %d fp4 %d: %zu bad", (long long)rows,
		 (long long)cols, block, fp4, bad);
	free(x);
	free(want);
	free(orig);
}

static void t_row_weight(int64_t n_slots, int64_t max_rows, int64_t n)
{
	float *sw = xcalloc((size_t)n_slots + 1, 4), *rw = xcalloc((size_t)max_rows + 1, 4);
	int32_t *slot = xcalloc((size_t)max_rows + 1, 4);
	mt_fill(sw, (size_t)n_slots, 0, 1);
	fill_nan(rw, (size_t)max_rows);
	for (int64_t r = 0; r < max_rows; r++)
		slot[r] = r < n ? (int32_t)(mt_next() % (uint64_t)n_slots) : -99; /* past n: never read */
	struct kern_moe_row_weight_args a = {.slot_weight = sw, .row_slot = slot, .n_rows = &n, .max_rows = max_rows,
					     .row_weight = rw};
	T_CHECK(kern_moe_row_weight_ref(&a) == ST_OK);
	size_t bad = 0;
	for (int64_t r = 0; r < max_rows; r++)
		bad += r < n ? fbits(rw[r]) != fbits(sw[slot[r]]) : !isnan(rw[r]);
	T_CHECKF(bad == 0, "moe_row_weight slots %lld max %lld n %lld: %zu bad", (long long)n_slots,
		 (long long)max_rows, (long long)n, bad);
	free(sw);
	free(rw);
	free(slot);
}

static void t_invalid(void)
{
	float f[8] = {0};
	int32_t ids[2] = {0, 1}, neg[2] = {0, -1};
	T_CHECK(kern_copy_rows_ref(NULL) == ST_INVALID);
	struct kern_copy_rows_args c = {.dst = f, .src = f + 4, .n_rows = 1, .dim = 4};
	T_CHECK(kern_copy_rows_ref(&c) == ST_OK);
	c.dim = 0;
	T_CHECK(kern_copy_rows_ref(&c) == ST_INVALID);
	c.dim = 4;
	c.src_stride = 3;
	T_CHECK(kern_copy_rows_ref(&c) == ST_INVALID);
	c.src_stride = 0;
	c.src = NULL;
	T_CHECK(kern_copy_rows_ref(&c) == ST_INVALID);
	c.n_rows = 0;
	T_CHECK(kern_copy_rows_ref(&c) == ST_OK);
	c.n_rows = -1;
	T_CHECK(kern_copy_rows_ref(&c) == ST_INVALID);

	uint16_t tb[4] = {0};
	struct kern_embed_args e = {.table = tb, .vocab_rows = 2, .ids = ids, .n_tokens = 2, .dim = 2,
				    .n_copies = 1, .out = f};
	T_CHECK(kern_embed_ref(&e) == ST_OK);
	e.n_copies = 0;
	T_CHECK(kern_embed_ref(&e) == ST_INVALID);
	e.n_copies = 1;
	e.ids = NULL;
	T_CHECK(kern_embed_ref(&e) == ST_INVALID);

	struct kern_block_copy_args bc = {.pool = f, .region_stride = 4, .region_len = 2, .region_offset = 2,
					  .dst_ids = ids + 1, .src_ids = ids, .n = 1};
	T_CHECK(kern_block_copy_ref(&bc) == ST_OK);
	bc.region_offset = 3; /* past the region */
	T_CHECK(kern_block_copy_ref(&bc) == ST_INVALID);
	bc.region_offset = 0;
	bc.src_ids = neg + 1;
	T_CHECK(kern_block_copy_ref(&bc) == ST_INVALID);
	struct kern_block_fill_args bf = {.pool = f, .region_stride = 4, .region_len = 4, .ids = neg, .n = 2};
	T_CHECK(kern_block_fill_ref(&bf) == ST_INVALID);
	bf.region_stride = 0;
	bf.n = 1;
	T_CHECK(kern_block_fill_ref(&bf) == ST_INVALID);

	struct kern_round_bf16_args rb = {.x = NULL, .n = 3};
	T_CHECK(kern_round_bf16_ref(&rb) == ST_INVALID);
	rb.n = 0;
	T_CHECK(kern_round_bf16_ref(&rb) == ST_OK);
	struct kern_add_args ad = {.y = f, .x = NULL, .n = 2};
	T_CHECK(kern_add_ref(&ad) == ST_INVALID);
	ad.n = -2;
	ad.x = f;
	T_CHECK(kern_add_ref(&ad) == ST_INVALID);

	struct kern_act_quant_sim_args q = {.x = f, .n_rows = 1, .n_cols = 8, .ld = 7, .block = 4};
	T_CHECK(kern_act_quant_sim_ref(&q) == ST_INVALID);
	q.ld = 8;
	q.block = 0;
	T_CHECK(kern_act_quant_sim_ref(&q) == ST_INVALID);
	q.block = 4;
	q.fp4 = 2;
	T_CHECK(kern_act_quant_sim_ref(&q) == ST_INVALID);

	int64_t n = 3;
	struct kern_moe_row_weight_args w = {.slot_weight = f, .row_slot = ids, .n_rows = &n, .max_rows = 2,
					     .row_weight = f + 4};
	T_CHECK(kern_moe_row_weight_ref(&w) == ST_INVALID);
	n = -1;
	T_CHECK(kern_moe_row_weight_ref(&w) == ST_INVALID);
	w.n_rows = NULL;
	T_CHECK(kern_moe_row_weight_ref(&w) == ST_INVALID);
}

static void t_tables(void)
{
	const struct kern_op *ops[] = {&kern_op_copy_rows, &kern_op_embed, &kern_op_block_copy, &kern_op_block_fill,
				       &kern_op_round_bf16, &kern_op_add, &kern_op_act_quant_sim,
				       &kern_op_moe_row_weight};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		T_CHECK(ops[i]->n_variants >= 1 && ops[i]->variants[0].backend == KERN_BACKEND_CPU);
		T_CHECK(ops[i]->variants[0].run && ops[i]->variants[0].run == ops[i]->variants[0].run_host);
		T_CHECKF(kern_registry_find_op(ops[i]->name) == ops[i], "op %s not in the op list", ops[i]->name);
	}
}

int main(void)
{
	mt_seed_from_env("test_movement");
	for (int mode = 0; mode < 4; mode++) {
		t_copy_rows(37, 129, 41, 53, 0, 0, mode);
		t_copy_rows(16, 7, 16, 16, 3, 5, mode);
		t_copy_rows(1, 1, 1, 1, 0, 2, mode);
		t_copy_rows(0, 5, 1, 1, 0, 0, mode);
	}
	t_embed(1000, 0, 1000, 33, 65, 1);
	t_embed(1000, 250, 250, 64, 16, 4); /* a vocab-parallel shard: most ids give zero rows */
	t_embed(10, 9, 1, 5, 3, 2);
	t_embed(10, 0, 10, 0, 3, 2);
	t_blocks(16, 100, 37, 11, 5);
	t_blocks(9, 64, 64, 0, 4);
	t_blocks(4, 10, 0, 10, 2);
	t_blocks(4, 10, 3, 0, 0);
	t_round_bf16();
	t_add(1);
	t_add(1027);
	t_add(0);
	for (int fp4 = 0; fp4 < 2; fp4++) {
		t_act_quant(5, 300, 0, 128, fp4);
		t_act_quant(3, 77, 9, 32, fp4);
		t_act_quant(2, 64, 3, 64, fp4);
		t_act_quant(1, 5, 0, 32, fp4);
	}
	t_row_weight(48, 64, 40);
	t_row_weight(6, 10, 10);
	t_row_weight(6, 10, 0);
	t_invalid();
	t_tables();
	return test_exit();
}
