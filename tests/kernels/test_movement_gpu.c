/*
 * tests/kernels/test_movement_gpu.c (suite gpu): the generic CUDA variant of
 * every movement op (copy_rows, embed, block_copy, block_fill, round_bf16,
 * add, act_quant_sim, moe_row_weight) against its CPU reference on fresh
 * random inputs. The ops are copies and exact elementwise maps, so outputs
 * must match bit for bit (NaN results only as NaN: the GPU's NaN payload is
 * its own). The variant's run() works on device copies on a non-default
 * stream; every output buffer starts poisoned (NaN) and is compared whole, so
 * an unwritten element and a write where none belongs both fail. Index lists
 * are random with -1 entries, sizes odd and aligned (both the scalar and the
 * 16-byte paths), and each op's run_host is checked once.
 * The seed is printed (DSV4_TEST_SEED repeats a run). Exits 77 without CUDA
 * or without a GPU.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/kernels/gpu_test_util.h"

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

static uint64_t rng;

static int64_t rand_int(int64_t n)
{
	return (int64_t)(kern_rand_u64(&rng) % (uint64_t)n);
}

/* A permutation of 0..range-1 (distinct), about a quarter of the first n
 * entries -1 when holes. */
static int32_t *perm_idx(int64_t n, int64_t range, bool holes)
{
	int32_t *p = gt_malloc((size_t)(range > n ? range : n) * 4);
	for (int64_t i = 0; i < range; i++)
		p[i] = (int32_t)i;
	for (int64_t i = range - 1; i > 0; i--) {
		int64_t j = rand_int(i + 1);
		int32_t t = p[i];
		p[i] = p[j];
		p[j] = t;
	}
	for (int64_t i = 0; i < n && holes; i++)
		if (rand_int(4) == 0)
			p[i] = -1;
	return p;
}

/* Random ids in [0, range) with repeats, about a quarter -1 when holes. */
static int32_t *rand_idx(int64_t n, int64_t range, bool holes)
{
	int32_t *p = gt_malloc((size_t)n * 4);
	for (int64_t i = 0; i < n; i++)
		p[i] = holes && rand_int(4) == 0 ? -1 : (int32_t)rand_int(range);
	return p;
}

/* Bit-equal, or both NaN. */
static void cmp_bits(const char *what, const float *ref, const float *got, size_t n)
{
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t a, b;
		memcpy(&a, ref + i, 4);
		memcpy(&b, got + i, 4);
		if (a != b && !(isnan(ref[i]) && isnan(got[i])) && !bad++)
			first = i;
	}
	T_CHECKF(bad == 0, "%s: %zu of %zu differ, first [%zu] ref %a got %a", what, bad, n, first,
		 bad ? ref[first] : 0.0f, bad ? got[first] : 0.0f);
}

/* ---- copy_rows ---- */

static void t_copy_rows(int64_t n, int64_t dim, int64_t n_src, int64_t n_dst, int64_t pad_s, int64_t pad_d, int mode,
			int64_t dst_shift, bool host)
{
	int64_t ss = dim + pad_s, ds = dim + pad_d;
	size_t nsrc = (size_t)(n_src * ss), ndst = (size_t)(n_dst * ds + dst_shift);
	float *src = gt_frand(&rng, nsrc, 4), *ref = gt_fnan(ndst), *got = gt_fnan(ndst);
	int32_t *si = (mode & 1) ? rand_idx(n, n_src, true) : NULL; /* gathers may repeat a row */
	int32_t *di = (mode & 2) ? perm_idx(n, n_dst, true) : NULL; /* scatters never do */
	struct kern_copy_rows_args a = {.dst = ref + dst_shift, .dst_stride = pad_d ? ds : 0, .dst_idx = di,
					.src = src, .src_stride = pad_s ? ss : 0, .src_idx = si, .n_rows = n, .dim = dim};
	T_CHECK(kern_copy_rows_ref(&a) == ST_OK);
	const struct kern_variant *v = gt_cuda_generic(&kern_op_copy_rows);
	struct kern_copy_rows_args d = a;
	float *dd = NULL;
	if (host) {
		d.dst = got + dst_shift;
		T_CHECK(((kern_copy_rows_fn)v->run_host)(&d) == ST_OK);
	} else {
		dd = gt_dup(got, ndst * 4);
		d.dst = dd + dst_shift;
		d.src = gt_dup(src, nsrc * 4);
		d.dst_idx = di ? gt_dup(di, (size_t)n * 4) : NULL;
		d.src_idx = si ? gt_dup(si, (size_t)n * 4) : NULL;
		d.stream = gt_stream;
		T_CHECK(((kern_copy_rows_fn)v->run)(&d) == ST_OK);
		gt_down(got, dd, ndst * 4);
		gt_dfree_all();
	}
	char what[160];
	snprintf(what, sizeof what, "copy_rows n%lld dim%lld ss%lld ds%lld mode%d shift%lld host%d", (long long)n,
		 (long long)dim, (long long)ss, (long long)ds, mode, (long long)dst_shift, host);
	cmp_bits(what, ref, got, ndst);
	free(src), free(ref), free(got), free(si), free(di);
}

/* ---- embed ---- */

static void t_embed(int64_t vocab, int64_t begin, int64_t rows, int64_t n_tok, int64_t dim, int copies, bool host)
{
	uint16_t *table = gt_malloc((size_t)(rows * dim) * 2);
	for (int64_t i = 0; i < rows * dim; i++)
		table[i] = kern_f32_to_bf16(kern_rand_f32(&rng) * 3);
	int32_t *ids = rand_idx(n_tok, vocab, false);
	if (n_tok > 1)
		ids[0] = -5; /* out of every shard */
	size_t no = (size_t)(n_tok * copies * dim);
	float *ref = gt_fnan(no), *got = gt_fnan(no);
	struct kern_embed_args a = {.table = table, .vocab_begin = begin, .vocab_rows = rows, .ids = ids,
				    .n_tokens = n_tok, .dim = dim, .n_copies = copies, .out = ref};
	T_CHECK(kern_embed_ref(&a) == ST_OK);
	const struct kern_variant *v = gt_cuda_generic(&kern_op_embed);
	struct kern_embed_args d = a;
	if (host) {
		d.out = got;
		T_CHECK(((kern_embed_fn)v->run_host)(&d) == ST_OK);
	} else {
		d.table = gt_dup(table, (size_t)(rows * dim) * 2);
		d.ids = gt_dup(ids, (size_t)n_tok * 4);
		d.out = gt_dup(got, no * 4);
		d.stream = gt_stream;
		T_CHECK(((kern_embed_fn)v->run)(&d) == ST_OK);
		gt_down(got, d.out, no * 4);
		gt_dfree_all();
	}
	char what[160];
	snprintf(what, sizeof what, "embed vocab%lld begin%lld rows%lld tok%lld dim%lld copies%d host%d",
		 (long long)vocab, (long long)begin, (long long)rows, (long long)n_tok, (long long)dim, copies, host);
	cmp_bits(what, ref, got, no);
	free(table), free(ids), free(ref), free(got);
}

/* ---- block_copy, block_fill ---- */

static void t_blocks(int64_t n_blocks, int64_t stride, int64_t len, int64_t off, int64_t n, bool holes, bool host)
{
	size_t np = (size_t)(n_blocks * stride);
	float *pool = gt_frand(&rng, np, 2), *ref = gt_fcopy(pool, np), *got = gt_fcopy(pool, np);
	/* dst from the first n of a permutation, src from the rest: disjoint */
	int32_t *perm = perm_idx(0, n_blocks, false);
	int32_t *dst = gt_malloc((size_t)n * 4), *src = gt_malloc((size_t)n * 4);
	int32_t *fd = gt_malloc((size_t)n * 4), *fs = gt_malloc((size_t)n * 4);
	int64_t nf = 0;
	for (int64_t i = 0; i < n; i++) {
		dst[i] = perm[i];
		src[i] = perm[n + rand_int(n_blocks - n)];
		if (holes && rand_int(4) == 0)
			(rand_int(2) ? dst : src)[i] = -1;
		if (dst[i] >= 0 && src[i] >= 0)
			fd[nf] = dst[i], fs[nf++] = src[i];
	}
	/* the reference refuses negative ids; the CUDA variant skips their pairs */
	struct kern_block_copy_args a = {.pool = ref, .region_stride = stride, .region_len = len, .region_offset = off,
					 .dst_ids = fd, .src_ids = fs, .n = nf};
	T_CHECK(kern_block_copy_ref(&a) == ST_OK);
	const struct kern_variant *v = gt_cuda_generic(&kern_op_block_copy);
	struct kern_block_copy_args d = a;
	d.dst_ids = dst;
	d.src_ids = src;
	d.n = n;
	char what[160];
	snprintf(what, sizeof what, "block_copy blocks%lld stride%lld len%lld off%lld n%lld holes%d host%d",
		 (long long)n_blocks, (long long)stride, (long long)len, (long long)off, (long long)n, holes, host);
	if (host) {
		d.pool = got;
		T_CHECK(((kern_block_copy_fn)v->run_host)(&d) == ST_OK);
	} else {
		d.pool = gt_dup(got, np * 4);
		d.dst_ids = gt_dup(dst, (size_t)n * 4);
		d.src_ids = gt_dup(src, (size_t)n * 4);
		d.stream = gt_stream;
		T_CHECK(((kern_block_copy_fn)v->run)(&d) == ST_OK);
		gt_down(got, d.pool, np * 4);
		gt_dfree_all();
	}
	cmp_bits(what, ref, got, np);

	float value = kern_rand_f32(&rng);
	int64_t nfill = 0; /* the fill takes every dst id that is not -1 */
	for (int64_t i = 0; i < n; i++)
		if (dst[i] >= 0)
			fd[nfill++] = dst[i];
	struct kern_block_fill_args f = {.pool = ref, .region_stride = stride, .region_len = len, .region_offset = off,
					 .ids = fd, .n = nfill, .value = value};
	T_CHECK(kern_block_fill_ref(&f) == ST_OK);
	const struct kern_variant *vf = gt_cuda_generic(&kern_op_block_fill);
	struct kern_block_fill_args g = f;
	g.ids = dst;
	g.n = n;
	memcpy(what + 6, "fill", 4); /* "block_fill ..." */
	if (host) {
		g.pool = got;
		T_CHECK(((kern_block_fill_fn)vf->run_host)(&g) == ST_OK);
	} else {
		g.pool = gt_dup(got, np * 4);
		g.ids = gt_dup(dst, (size_t)n * 4);
		g.stream = gt_stream;
		T_CHECK(((kern_block_fill_fn)vf->run)(&g) == ST_OK);
		gt_down(got, g.pool, np * 4);
		gt_dfree_all();
	}
	cmp_bits(what, ref, got, np);
	free(pool), free(ref), free(got), free(perm), free(dst), free(src), free(fd), free(fs);
}

/* ---- round_bf16, add ---- */

static float *wide_values(size_t n)
{
	static const float special[] = {NAN, -NAN, INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 0.0f, -0.0f,
					1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 0x1p-130f, 0x1p-140f, 0x1.fffffep127f,
					0x1.ff8p127f};
	float *x = gt_malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)kern_rand_u64(&rng); /* every bit pattern, NaNs included */
		memcpy(x + i, &u, 4);
		if (i % 3 == 0)
			x[i] = kern_rand_f32(&rng) * 100;
		if (i < sizeof special / sizeof special[0])
			x[i] = special[i];
	}
	return x;
}

static void t_round_bf16(int64_t n, bool host)
{
	float *x = wide_values((size_t)n), *ref = gt_fcopy(x, (size_t)n), *got = gt_fcopy(x, (size_t)n);
	struct kern_round_bf16_args a = {.x = ref, .n = n};
	T_CHECK(kern_round_bf16_ref(&a) == ST_OK);
	const struct kern_variant *v = gt_cuda_generic(&kern_op_round_bf16);
	struct kern_round_bf16_args d = a;
	if (host) {
		d.x = got;
		T_CHECK(((kern_round_bf16_fn)v->run_host)(&d) == ST_OK);
	} else {
		d.x = gt_dup(x, (size_t)n * 4);
		d.stream = gt_stream;
		T_CHECK(((kern_round_bf16_fn)v->run)(&d) == ST_OK);
		gt_down(got, d.x, (size_t)n * 4);
		gt_dfree_all();
	}
	/* kd_bf16_round keeps the NaN payload exactly as the C version */
	size_t bad = memcmp(ref, got, (size_t)n * 4) != 0;
	T_CHECKF(bad == 0, "round_bf16 n%lld host%d: bits differ", (long long)n, host);
	free(x), free(ref), free(got);
}

static void t_add(int64_t n, bool same, bool host)
{
	float *y = gt_frand(&rng, (size_t)n + 1, 50), *x = same ? y : gt_frand(&rng, (size_t)n, 50);
	y[n] = NAN; /* one past the end stays as it is */
	float *ref = gt_fcopy(y, (size_t)n + 1), *got = gt_fcopy(y, (size_t)n + 1);
	struct kern_add_args a = {.y = ref, .x = same ? ref : x, .n = n};
	T_CHECK(kern_add_ref(&a) == ST_OK);
	const struct kern_variant *v = gt_cuda_generic(&kern_op_add);
	struct kern_add_args d = a;
	if (host) {
		d.y = got;
		d.x = same ? got : x;
		T_CHECK(((kern_add_fn)v->run_host)(&d) == ST_OK);
	} else {
		d.y = gt_dup(got, ((size_t)n + 1) * 4);
		d.x = same ? d.y : gt_dup(x, (size_t)n * 4);
		d.stream = gt_stream;
		T_CHECK(((kern_add_fn)v->run)(&d) == ST_OK);
		gt_down(got, d.y, ((size_t)n + 1) * 4);
		gt_dfree_all();
	}
	char what[96];
	snprintf(what, sizeof what, "add n%lld same%d host%d", (long long)n, same, host);
	cmp_bits(what, ref, got, (size_t)n + 1);
	free(y), free(ref), free(got);
	if (!same)
		free(x);
}

/* ---- act_quant_sim ---- */

static void t_act_quant(int64_t rows, int64_t cols, int64_t pad, int block, int fp4, bool specials, bool host)
{
	int64_t ld = cols + pad;
	size_t n = (size_t)(rows * ld);
	float *x = gt_malloc(n * 4);
	for (size_t i = 0; i < n; i++)
		x[i] = kern_rand_f32(&rng) * ldexpf(1.0f, (int)rand_int(40) - 20);
	for (int64_t r = 0; r < rows; r++)
		for (int64_t k = cols; k < ld; k++)
			x[r * ld + k] = NAN; /* the gaps stay as they are */
	if (specials && cols >= 8) {
		float sp[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-30f, 1e30f, -448.0f * 0x1p-3f};
		for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
			x[rand_int(rows) * ld + rand_int(cols)] = sp[i];
		for (int64_t k = 0; k < cols && k < block; k++) /* one all-zero block */
			x[k] = 0.0f;
	}
	float *ref = gt_fcopy(x, n), *got = gt_fcopy(x, n);
	struct kern_act_quant_sim_args a = {.x = ref, .n_rows = rows, .n_cols = cols, .ld = ld, .block = block,
					    .fp4 = fp4};
	T_CHECK(kern_act_quant_sim_ref(&a) == ST_OK);
	const struct kern_variant *v = gt_cuda_generic(&kern_op_act_quant_sim);
	struct kern_act_quant_sim_args d = a;
	if (host) {
		d.x = got;
		T_CHECK(((kern_act_quant_sim_fn)v->run_host)(&d) == ST_OK);
	} else {
		d.x = gt_dup(x, n * 4);
		d.stream = gt_stream;
		T_CHECK(((kern_act_quant_sim_fn)v->run)(&d) == ST_OK);
		gt_down(got, d.x, n * 4);
		gt_dfree_all();
	}
	char what[128];
	snprintf(what, sizeof what, "act_quant_sim rows%lld cols%lld ld%lld block%d fp4 %d sp%d host%d", (long long)rows,
		 (long long)cols, (long long)ld, block, fp4, specials, host);
	cmp_bits(what, ref, got, n);
	free(x), free(ref), free(got);
}

/* ---- moe_row_weight ---- */

static void t_row_weight(int64_t n_slots, int64_t max_rows, int64_t n, bool host)
{
	float *sw = gt_frand(&rng, (size_t)n_slots, 1), *ref = gt_fnan((size_t)max_rows), *got = gt_fnan((size_t)max_rows);
	int32_t *slot = gt_malloc((size_t)max_rows * 4);
	for (int64_t r = 0; r < max_rows; r++)
		slot[r] = r < n ? (int32_t)rand_int(n_slots) : (int32_t)0x7f7f7f7f; /* never read past n */
	int64_t n_ref = n > max_rows ? max_rows : n;
	struct kern_moe_row_weight_args a = {.slot_weight = sw, .row_slot = slot, .n_rows = &n_ref,
					     .max_rows = max_rows, .row_weight = ref};
	T_CHECK(kern_moe_row_weight_ref(&a) == ST_OK);
	const struct kern_variant *v = gt_cuda_generic(&kern_op_moe_row_weight);
	struct kern_moe_row_weight_args d = a;
	d.n_rows = &n; /* past max_rows: the CUDA variant clamps */
	if (host) {
		d.row_weight = got;
		T_CHECK(((kern_moe_row_weight_fn)v->run_host)(&d) == ST_OK);
	} else {
		d.slot_weight = gt_dup(sw, (size_t)n_slots * 4);
		d.row_slot = gt_dup(slot, (size_t)max_rows * 4);
		d.n_rows = gt_dup(&n, sizeof n);
		d.row_weight = gt_dup(got, (size_t)max_rows * 4);
		d.stream = gt_stream;
		T_CHECK(((kern_moe_row_weight_fn)v->run)(&d) == ST_OK);
		gt_down(got, d.row_weight, (size_t)max_rows * 4);
		gt_dfree_all();
	}
	char what[96];
	snprintf(what, sizeof what, "moe_row_weight slots%lld max%lld n%lld host%d", (long long)n_slots,
		 (long long)max_rows, (long long)n, host);
	cmp_bits(what, ref, got, (size_t)max_rows);
	free(sw), free(ref), free(got), free(slot);
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	rng = gt_seed(argc, argv, &dev);
	gt_stream_create();

	/* every movement op has a compiled CUDA variant, and selection picks it here */
	const struct kern_op *ops[] = {&kern_op_copy_rows, &kern_op_embed, &kern_op_block_copy, &kern_op_block_fill,
				       &kern_op_round_bf16, &kern_op_add, &kern_op_act_quant_sim,
				       &kern_op_moe_row_weight};
	if (!gt_generic_ops_picked(ops, sizeof ops / sizeof ops[0], &dev, true))
		return test_exit();

	for (int mode = 0; mode < 4; mode++) {
		t_copy_rows(37, 129, 41, 53, 0, 0, mode, 0, false);
		t_copy_rows(300, 7168, 311, 301, 0, 0, mode, 0, false); /* 16-byte path */
		t_copy_rows(64, 512, 70, 80, 4, 8, mode, 1, false);     /* aligned sizes, misaligned dst: scalar */
		t_copy_rows(16, 7, 16, 16, 3, 5, mode, 0, false);
		t_copy_rows(1, 1, 1, 1, 0, 2, mode, 0, false);
		t_copy_rows(0, 5, 1, 1, 0, 0, mode, 0, false);
		t_copy_rows(29, 33, 40, 40, 1, 0, mode, 0, true);
	}
	t_embed(129280, 0, 129280, 9, 64, 4, false);
	t_embed(129280, 32320, 32320, 64, 64, 1, false); /* one of 4 vocab-parallel shards */
	t_embed(3000, 0, 3000, 20, 4096, 4, false);
	t_embed(1000, 0, 1000, 33, 65, 3, false);
	t_embed(10, 9, 1, 5, 3, 2, false);
	t_embed(10, 0, 10, 0, 3, 2, false);
	t_embed(500, 100, 200, 17, 31, 2, true);
	for (int holes = 0; holes < 2; holes++) {
		t_blocks(64, 64 * 512, 64 * 512, 0, 20, holes, false); /* whole blocks, 16-byte path */
		t_blocks(40, 1000, 37, 11, 13, holes, false);
		t_blocks(9, 64, 64, 0, 4, holes, false);
		t_blocks(30, 4096, 2048, 1024, 10, holes, false);
		t_blocks(4, 10, 3, 0, 0, holes, false);
		t_blocks(20, 99, 50, 7, 6, holes, true);
	}
	t_round_bf16(100003, false);
	t_round_bf16(1, false);
	t_round_bf16(4097, true);
	t_add(1, false, false);
	t_add(1000003, false, false);
	t_add(4099, true, false);
	t_add(333, false, true);
	for (int fp4 = 0; fp4 < 2; fp4++) {
		int blk = fp4 ? 32 : 128;
		t_act_quant(17, 7168, 0, blk, fp4, false, false);
		t_act_quant(5, 300, 9, blk, fp4, true, false);
		t_act_quant(3, 77, 3, 7, fp4, true, false);
		t_act_quant(64, 4096, 0, blk, fp4, true, false);
		t_act_quant(1, 5, 0, blk, fp4, false, false);
		t_act_quant(0, 5, 0, blk, fp4, false, false);
		t_act_quant(4, 1000, 24, blk, fp4, true, true);
	}
	t_row_weight(48, 64, 40, false);
	t_row_weight(8 * 6, 8 * 6, 48, false);
	t_row_weight(6, 10, 0, false);
	t_row_weight(2048 * 6, 2048 * 6 + 256 * 128, 2048 * 6, false); /* worst-case padded grouping */
	t_row_weight(60, 50, 70, false);                                /* count past max_rows: clamped */
	t_row_weight(30, 40, 25, true);
	T_CHECK(cudaDeviceSynchronize() == cudaSuccess);
	cudaStreamDestroy(gt_stream);
	return test_exit();
}
#else
int main(void)
{
	return test_skip("built without CUDA");
}
#endif
