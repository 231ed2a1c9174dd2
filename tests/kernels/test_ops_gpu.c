/*
 * tests/kernels/test_ops_gpu.c (suite gpu): the generic CUDA variant of every
 * model op (rmsnorm, swiglu, rope, route, ring_write, attn_index,
 * sparse_attn, indexer_rotate / scores / topk, compressor; the *_cuda_generic
 * rows of the op tables) against its CPU reference on fresh random inputs,
 * over a few shapes each, including 0 rows, 1 row, odd sizes and strides.
 * The variant's run() is called on device copies on a non-default stream;
 * every device output starts as NaN (int outputs as 0x7f7f7f7f) so an
 * unwritten element fails.
 *
 * Tolerances (kern_compare_f32: |got - ref| <= atol + rtol·max|ref|):
 *   fp32 outputs whose only difference is summation order (norm Σx², dot
 *     products, online vs two-pass softmax): rtol 1e-5;
 *   elementwise ops with the reference's operation order (_rn, no FMA):
 *     only expf / device double cos, sin last bits: rtol 2e-6;
 *   bf16-rounded outputs: a 1-ulp fp32 difference can cross a bf16 rounding
 *     boundary: one bf16 ulp (<= 2^-7 of max|ref|), rtol 8e-3; where a bf16
 *     value feeds a second bf16 rounding (rmsnorm bf16_stats: rsqrt then the
 *     output; compressor: norm then rope) two ulps, rtol 1.6e-2; indexer
 *     bf16 scores sum H such products (each dot, ω and product rounded):
 *     rtol 3e-2 of max|score|;
 *   bit-reproducible paths (copies, Hadamard butterflies, index sets,
 *     top-k from given scores): exact;
 *   FP8 / FP4 quantized compressor outputs: a bf16 flip before the qdq can
 *     move a value by one e4m3/e2m1 step, so at most 3% of the values may
 *     differ, each by at most one step (<= 0.35·max|ref|), the rest 1.6e-2;
 *   top-k lists under bf16 scores (exact ties are common): the score the
 *     reference gives each chosen entry must match the reference's score at
 *     that slot (within the scores' 3e-2·max); fp32 scores: ids exact.
 * The seed is printed (DSV4_TEST_SEED repeats a run). Exits 77 without CUDA
 * or without a GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/kernels/gpu_test_util.h"

#if DSV4_HAVE_CUDA
#include "kernels/act/act_generic.h"
#endif

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

static uint64_t rng;

static int rand_int(int n)
{
	return (int)(kern_rand_u64(&rng) % (uint64_t)n);
}

static void cmp_i(const char *what, const int32_t *ref, const int32_t *got, size_t n)
{
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (ref[i] != got[i] && !bad++)
			first = i;
	T_CHECKF(bad == 0, "%s: %zu of %zu differ, first [%zu] ref %d got %d", what, bad, n, first,
		 bad ? ref[first] : 0, bad ? got[first] : 0);
}

/* Quantized outputs: at most frac of the values off by more than rtol·max,
 * none off by more than step·max. */
static void cmp_q(const char *what, const float *ref, const float *got, size_t n, double rtol, double frac,
		  double step)
{
	double mx = 0;
	for (size_t i = 0; i < n; i++)
		mx = fabs(ref[i]) > mx ? fabs(ref[i]) : mx;
	size_t off = 0, far = 0;
	for (size_t i = 0; i < n; i++) {
		double dd = fabs((double)got[i] - ref[i]);
		if (!(dd <= rtol * mx))
			off++;
		if (!(dd <= step * mx))
			far++;
	}
	T_CHECKF(far == 0 && off <= frac * n + 0.5, "%s: %zu of %zu off, %zu beyond one step", what, off, n, far);
}

/* ---- rmsnorm ---- */

static void t_rmsnorm(int64_t R, int dim, int wmode, bool bin, bool bout, bool bst, int pad, bool inplace)
{
	kern_rmsnorm_fn run = (kern_rmsnorm_fn)gt_cuda_generic(&kern_op_rmsnorm)->run;
	int64_t xs = dim + pad, ys = inplace ? xs : dim + 2 * pad;
	size_t nx = (size_t)(R * xs), ny = (size_t)(R * ys);
	float *x = gt_frand(&rng, nx, 3.0f), *yr = inplace ? gt_fcopy(x, nx) : gt_fnan(ny), *yg = gt_fnan(ny);
	float *wf = gt_frand(&rng, dim, 1.5f);
	uint16_t *wb = malloc(dim * 2 + 2);
	for (int i = 0; i < dim; i++)
		wb[i] = kern_f32_to_bf16(wf[i]);
	struct kern_rmsnorm_args a = {.x = x, .y = yr, .w_bf16 = wmode == 1 ? wb : NULL, .w_f32 = wmode == 2 ? wf : NULL,
				      .n_rows = R, .dim = dim, .x_stride = pad ? xs : 0, .y_stride = pad ? ys : 0,
				      .eps = 1e-6f, .bf16_in = bin, .bf16_out = bout, .bf16_stats = bst};
	T_CHECK(kern_rmsnorm_ref(&a) == ST_OK);
	float *dx = gt_dup(x, nx * 4), *dy = inplace ? dx : gt_dup(yg, ny * 4);
	struct kern_rmsnorm_args d = a;
	d.x = dx;
	d.y = dy;
	d.w_bf16 = gt_dup(a.w_bf16, dim * 2);
	d.w_f32 = gt_dup(a.w_f32, dim * 4);
	d.stream = gt_stream;
	T_CHECK(run(&d) == ST_OK);
	gt_down(yg, dy, ny * 4);
	char what[128];
	snprintf(what, sizeof what, "rmsnorm R%lld dim%d w%d in%d out%d st%d pad%d ip%d", (long long)R, dim, wmode, bin,
		 bout, bst, pad, inplace);
	if (R && !inplace && pad) /* the gaps between rows stay untouched (NaN) */
		T_CHECK(isnan(yg[dim]));
	if (R && !inplace && pad)
		for (int64_t r = 0; r < R; r++)
			for (int i = dim; i < ys; i++)
				yg[r * ys + i] = yr[r * ys + i] = 0;
	gt_cmp(what, yr, yg, ny, 1e-7, bst ? 1.6e-2 : (bout ? 8e-3 : 1e-5));
	/* the host wrapper too */
	if (gt_cuda_generic(&kern_op_rmsnorm)->run_host && !inplace) {
		float *yh = gt_fnan(ny);
		struct kern_rmsnorm_args h = a;
		h.y = yh;
		T_CHECK(((kern_rmsnorm_fn)gt_cuda_generic(&kern_op_rmsnorm)->run_host)(&h) == ST_OK);
		for (int64_t r = 0; pad && r < R; r++)
			for (int i = dim; i < ys; i++)
				yh[r * ys + i] = 0;
		gt_cmp(what, yr, yh, ny, 1e-7, bst ? 1.6e-2 : (bout ? 8e-3 : 1e-5));
		free(yh);
	}
	free(x), free(yr), free(yg), free(wf), free(wb);
	gt_dfree_all();
}

/* ---- swiglu ---- */

static void t_swiglu(int64_t R, int I, bool fused, bool rw, float lim, bool bout, bool inplace)
{
	kern_swiglu_fn run = (kern_swiglu_fn)gt_cuda_generic(&kern_op_swiglu)->run;
	int64_t st = fused ? 2 * I : I;
	size_t n = (size_t)(R * st) + (fused ? 0 : 0);
	float *g = gt_frand(&rng, n, 15.0f), *u = fused ? NULL : gt_frand(&rng, n, 15.0f), *w = gt_frand(&rng, R, 1.0f);
	float *ref = inplace ? gt_fcopy(g, n) : gt_fnan((size_t)(R * I)), *got;
	size_t no = inplace ? n : (size_t)(R * I);
	struct kern_swiglu_args a = {.gate = inplace ? ref : g, .up = fused ? (inplace ? ref : g) + I : u, .out = ref,
				     .row_weight = rw ? w : NULL, .n_rows = R, .dim = I, .gate_stride = fused ? st : 0,
				     .up_stride = fused ? st : 0, .out_stride = inplace ? st : 0, .limit = lim,
				     .bf16_out = bout};
	T_CHECK(kern_swiglu_ref(&a) == ST_OK);
	float *dg = gt_dup(g, n * 4), *du = fused ? dg + I : gt_dup(u, n * 4);
	float *dout = inplace ? dg : gt_dup((got = gt_fnan(no)), no * 4);
	struct kern_swiglu_args d = a;
	d.gate = dg;
	d.up = du;
	d.out = dout;
	d.row_weight = gt_dup(a.row_weight, R * 4);
	d.stream = gt_stream;
	T_CHECK(run(&d) == ST_OK);
	if (inplace)
		got = gt_fnan(no);
	gt_down(got, dout, no * 4);
	char what[128];
	snprintf(what, sizeof what, "swiglu R%lld I%d fused%d rw%d lim%g bf%d ip%d", (long long)R, I, fused, rw, lim, bout,
		 inplace);
	gt_cmp(what, ref, got, no, 1e-7, bout ? 8e-3 : 2e-6);
	free(g), free(u), free(w), free(ref), free(got);
	gt_dfree_all();
}

/* silu is no registry op (the swiglu op covers the experts); its CUDA helper
 * kern_silu_cuda_generic is checked here too. */
static void t_silu(int64_t n)
{
	float *x = gt_frand(&rng, (size_t)n, 20.0f), *xg = gt_fcopy(x, (size_t)n);
	kern_silu_ref(x, n);
	float *d = gt_dup(xg, (size_t)n * 4);
	T_CHECK(kern_silu_cuda_generic(d, n, gt_stream) == ST_OK);
	gt_down(xg, d, (size_t)n * 4);
	char what[64];
	snprintf(what, sizeof what, "silu n%lld", (long long)n);
	gt_cmp(what, x, xg, (size_t)n, 1e-7, 2e-6);
	free(x), free(xg);
	gt_dfree_all();
}

/* ---- rope ---- */

static void t_rope(int64_t R, int H, int hd, int rd, int pad, int mul, bool inv, bool bout, bool yarn)
{
	kern_rope_fn run = (kern_rope_fn)gt_cuda_generic(&kern_op_rope)->run;
	int64_t rs = (int64_t)H * hd + pad;
	size_t n = (size_t)(R * rs);
	float *x = gt_frand(&rng, n, 2.0f), *xg = gt_fcopy(x, n);
	float *om = malloc(rd / 2 * 4 + 4);
	struct kern_rope_yarn y = {.factor = 16, .original_max_pos = 65536, .beta_fast = 32, .beta_slow = 1};
	T_CHECK(kern_rope_freqs_build(om, rd, yarn ? 160000 : 10000, yarn ? &y : NULL) == ST_OK);
	int32_t *pos = malloc(R * 4 + 4);
	for (int64_t r = 0; r < R; r++)
		pos[r] = rand_int(r % 3 ? 100 : 70000);
	struct kern_rope_args a = {.x = x, .pos = pos, .omega = om, .n_rows = R, .n_heads = H, .head_dim = hd,
				   .rope_dim = rd, .row_stride = pad ? rs : 0, .pos_mul = mul, .inverse = inv,
				   .bf16_out = bout};
	T_CHECK(kern_rope_ref(&a) == ST_OK);
	struct kern_rope_args d = a;
	d.x = gt_dup(xg, n * 4);
	d.pos = gt_dup(pos, R * 4);
	d.omega = gt_dup(om, rd / 2 * 4);
	d.stream = gt_stream;
	T_CHECK(run(&d) == ST_OK);
	gt_down(xg, d.x, n * 4);
	char what[128];
	snprintf(what, sizeof what, "rope R%lld H%d hd%d rd%d mul%d inv%d bf%d", (long long)R, H, hd, rd, mul, inv, bout);
	gt_cmp(what, x, xg, n, 1e-6, bout ? 8e-3 : 2e-6);
	free(x), free(xg), free(om), free(pos);
	gt_dfree_all();
}

/* ---- route ---- */

static void t_route(int64_t T, int E, int K, bool bias, bool hash)
{
	kern_route_fn run = (kern_route_fn)gt_cuda_generic(&kern_op_route)->run;
	size_t nl = (size_t)(T * E), nk = (size_t)(T * K);
	float *l = gt_frand(&rng, nl, 4.0f), *b = gt_frand(&rng, E, 0.3f);
	int64_t vocab = 50;
	int32_t *tab = malloc(vocab * K * 4), *tok = malloc(T * 4 + 4);
	for (int64_t v = 0; v < vocab; v++)
		for (int j = 0; j < K; j++)
			tab[v * K + j] = (int32_t)((v * 7 + j * 13) % E);
	for (int64_t t = 0; t < T; t++)
		tok[t] = rand_int((int)vocab);
	int32_t *ids_r = gt_ifill(nk, 0x7f7f7f7f), *ids_g = gt_ifill(nk, 0x7f7f7f7f);
	float *w_r = gt_fnan(nk), *w_g = gt_fnan(nk);
	struct kern_route_args a = {.logits = l, .bias = bias ? b : NULL, .tid2eid = hash ? tab : NULL,
				    .token_ids = hash ? tok : NULL, .vocab = vocab, .n_tokens = T, .n_experts = E,
				    .top_k = K, .route_scale = 1.5f, .expert_ids = ids_r, .weights = w_r};
	T_CHECK(kern_route_ref(&a) == ST_OK);
	struct kern_route_args d = a;
	d.logits = gt_dup(l, nl * 4);
	d.bias = gt_dup(a.bias, E * 4);
	d.tid2eid = gt_dup(a.tid2eid, vocab * K * 4);
	d.token_ids = gt_dup(a.token_ids, T * 4);
	d.expert_ids = gt_dup(ids_g, nk * 4);
	d.weights = gt_dup(w_g, nk * 4);
	d.stream = gt_stream;
	T_CHECK(run(&d) == ST_OK);
	gt_down(ids_g, d.expert_ids, nk * 4);
	gt_down(w_g, d.weights, nk * 4);
	char what[128];
	snprintf(what, sizeof what, "route T%lld E%d K%d bias%d hash%d", (long long)T, E, K, bias, hash);
	cmp_i(what, ids_r, ids_g, nk);
	gt_cmp(what, w_r, w_g, nk, 1e-7, 2e-6);
	free(l), free(b), free(tab), free(tok), free(ids_r), free(ids_g), free(w_r), free(w_g);
	gt_dfree_all();
}

/* ---- a flat batch of sequences ---- */

struct batch {
	int n_seqs;
	int32_t q_off[9], start_pos[8];
	int64_t n_tokens;
};

static struct batch mk_batch(int n, const int *len, const int *start)
{
	struct batch b = {.n_seqs = n};
	for (int s = 0; s < n; s++) {
		b.q_off[s + 1] = b.q_off[s] + len[s];
		b.start_pos[s] = start[s];
	}
	b.n_tokens = b.q_off[n];
	return b;
}

static void t_ring_write(const struct batch *b, int window, int dim, int pad)
{
	kern_ring_write_fn run = (kern_ring_write_fn)gt_cuda_generic(&kern_op_ring_write)->run;
	int64_t ss = dim + pad, rs = dim + 2 * pad, n_ring = (int64_t)b->n_seqs * window + 3;
	size_t ns = (size_t)(b->n_tokens * ss), nr = (size_t)(n_ring * rs);
	float *src = gt_frand(&rng, ns, 1.0f), *ring_r = gt_frand(&rng, nr, 1.0f), *ring_g = gt_fcopy(ring_r, nr);
	int64_t row0[8];
	for (int s = 0; s < b->n_seqs; s++)
		row0[s] = (int64_t)(b->n_seqs - 1 - s) * window + 1;
	struct kern_ring_write_args a = {.src = src, .src_stride = ss, .ring = ring_r, .ring_stride = rs,
					 .ring_row0 = row0, .n_ring_rows = n_ring, .n_tokens = b->n_tokens,
					 .n_seqs = b->n_seqs, .q_off = b->q_off, .start_pos = b->start_pos,
					 .window = window, .dim = dim};
	T_CHECK(kern_ring_write_ref(&a) == ST_OK);
	struct kern_ring_write_args d = a;
	d.src = gt_dup(src, ns * 4);
	d.ring = gt_dup(ring_g, nr * 4);
	d.ring_row0 = gt_dup(row0, b->n_seqs * 8);
	d.q_off = gt_dup(b->q_off, (b->n_seqs + 1) * 4);
	d.start_pos = gt_dup(b->start_pos, b->n_seqs * 4);
	d.stream = gt_stream;
	T_CHECK(run(&d) == ST_OK);
	gt_down(ring_g, d.ring, nr * 4);
	char what[96];
	snprintf(what, sizeof what, "ring_write T%lld window%d dim%d", (long long)b->n_tokens, window, dim);
	gt_cmp(what, ring_r, ring_g, nr, 0, 0);
	free(src), free(ring_r), free(ring_g);
	gt_dfree_all();
}

/* mode 0 SWA, 1 HCA, 2 CSA; paged: the compressed rows through a block table */
static void t_attn_index(const struct batch *b, int window, int mode, bool paged)
{
	kern_attn_index_fn run = (kern_attn_index_fn)gt_cuda_generic(&kern_op_attn_index)->run;
	int ratio = mode ? 4 : 0, tk_stride = 6, stride = 0;
	int64_t T = b->n_tokens;
	for (int s = 0; s < b->n_seqs; s++) {
		int64_t last = b->start_pos[s] + (b->q_off[s + 1] - b->q_off[s]);
		int need = window + (mode == 1 ? (int)(last / 4) : (mode == 2 ? tk_stride : 0));
		stride = need > stride ? need : stride;
	}
	stride += 3;
	int64_t ring0[8], cmp0[8];
	int32_t bt[8 * 64];
	for (int s = 0; s < b->n_seqs; s++) {
		ring0[s] = 1000 + (int64_t)s * window;
		cmp0[s] = 5000 + (int64_t)s * 700;
		for (int k = 0; k < 64; k++)
			bt[s * 64 + k] = 3 + ((s * 64 + k) * 37) % 500;
	}
	int32_t *tk = malloc((size_t)(T * tk_stride) * 4 + 4);
	for (int s = 0; s < b->n_seqs; s++)
		for (int64_t i = b->q_off[s]; i < b->q_off[s + 1]; i++) {
			int64_t n_vis = (b->start_pos[s] + (i - b->q_off[s]) + 1) / 4;
			for (int j = 0; j < tk_stride; j++)
				tk[i * tk_stride + j] = n_vis && rand_int(4) ? rand_int((int)n_vis) : -1;
		}
	size_t ni = (size_t)(T * stride);
	int32_t *idx_r = gt_ifill(ni, 0x7f7f7f7f), *idx_g = gt_ifill(ni, 0x7f7f7f7f);
	int32_t *len_r = gt_ifill(T, 0x7f7f7f7f), *len_g = gt_ifill(T, 0x7f7f7f7f);
	struct kern_attn_index_args a = {.n_tokens = T, .n_seqs = b->n_seqs, .q_off = b->q_off,
					 .start_pos = b->start_pos, .window = window, .cur_row0 = 7, .ring_row0 = ring0,
					 .ratio = ratio, .cmp_row0 = mode ? cmp0 : NULL,
					 .topk = mode == 2 ? tk : NULL, .topk_stride = tk_stride, .idx = idx_r,
					 .idx_len = len_r, .idx_stride = stride};
	if (paged && mode) {
		a.cmp_paged.block_table = bt;
		a.cmp_paged.bt_stride = 64;
		a.cmp_paged.per_block = 8;
	}
	T_CHECK(kern_attn_index_ref(&a) == ST_OK);
	struct kern_attn_index_args d = a;
	d.q_off = gt_dup(b->q_off, (b->n_seqs + 1) * 4);
	d.start_pos = gt_dup(b->start_pos, b->n_seqs * 4);
	d.ring_row0 = gt_dup(ring0, b->n_seqs * 8);
	d.cmp_row0 = gt_dup(a.cmp_row0, b->n_seqs * 8);
	d.cmp_paged.block_table = gt_dup(a.cmp_paged.block_table, sizeof bt);
	d.topk = gt_dup(a.topk, (size_t)(T * tk_stride) * 4);
	d.idx = gt_dup(idx_g, ni * 4);
	d.idx_len = gt_dup(len_g, T * 4);
	d.stream = gt_stream;
	T_CHECK(run(&d) == ST_OK);
	gt_down(idx_g, d.idx, ni * 4);
	gt_down(len_g, d.idx_len, T * 4);
	char what[96];
	snprintf(what, sizeof what, "attn_index T%lld window%d mode%d paged%d", (long long)T, window, mode, paged);
	cmp_i(what, len_r, len_g, T);
	cmp_i(what, idx_r, idx_g, ni);
	free(tk), free(idx_r), free(idx_g), free(len_r), free(len_g);
	gt_dfree_all();
}

static void t_sparse_attn(int64_t T, int H, int d, int rd, int n_idx, bool sink, bool rope, bool bout, bool lens)
{
	kern_sparse_attn_fn run = (kern_sparse_attn_fn)gt_cuda_generic(&kern_op_sparse_attn)->run;
	int64_t rows[3] = {37, 0, 300};
	int64_t st = d + 4, total = rows[0] + rows[1] + rows[2];
	size_t nq = (size_t)(T * H * d);
	float *q = gt_frand(&rng, nq, 1.0f), *kv0 = gt_frand(&rng, (size_t)(rows[0] * st), 1.0f), *kv2 = gt_frand(&rng, (size_t)(rows[2] * st), 1.0f);
	float *snk = gt_frand(&rng, H, 2.0f), *om = malloc(rd / 2 * 4 + 4);
	T_CHECK(kern_rope_freqs_build(om, rd, 10000, NULL) == ST_OK);
	int32_t *idx = malloc((size_t)(T * n_idx) * 4 + 4), *len = malloc(T * 4 + 4), *pos = malloc(T * 4 + 4);
	for (int64_t t = 0; t < T; t++) {
		len[t] = t == 0 ? 0 : rand_int(n_idx + 1);
		pos[t] = rand_int(5000);
		for (int j = 0; j < n_idx; j++)
			idx[t * n_idx + j] = rand_int(8) == 0 ? -1 : rand_int((int)total);
	}
	float *o_r = gt_fnan(nq), *o_g = gt_fnan(nq);
	struct kern_sparse_attn_args a = {.q = q, .out = o_r, .kv = {kv0, NULL, kv2}, .kv_rows = {rows[0], rows[1], rows[2]},
					  .kv_stride = st, .idx = idx, .idx_len = lens ? len : NULL, .idx_stride = n_idx,
					  .sink = sink ? snk : NULL, .softmax_scale = 1.0f / sqrtf((float)d),
					  .pos = pos, .omega = rope ? om : NULL, .rope_dim = rd, .n_tokens = T,
					  .n_heads = H, .head_dim = d, .bf16_out = bout};
	/* logits of a useful size: q scaled so that softmax is neither flat nor one-hot */
	for (size_t i = 0; i < nq; i++)
		q[i] *= 3.0f;
	T_CHECK(kern_sparse_attn_ref(&a) == ST_OK);
	struct kern_sparse_attn_args g = a;
	g.q = gt_dup(q, nq * 4);
	g.out = gt_dup(o_g, nq * 4);
	g.kv[0] = gt_dup(kv0, (size_t)(rows[0] * st) * 4);
	g.kv[2] = gt_dup(kv2, (size_t)(rows[2] * st) * 4);
	g.idx = gt_dup(idx, (size_t)(T * n_idx) * 4);
	g.idx_len = gt_dup(a.idx_len, T * 4);
	g.sink = gt_dup(a.sink, H * 4);
	g.pos = gt_dup(pos, T * 4);
	g.omega = gt_dup(a.omega, rd / 2 * 4);
	g.stream = gt_stream;
	T_CHECK(run(&g) == ST_OK);
	gt_down(o_g, g.out, nq * 4);
	char what[128];
	snprintf(what, sizeof what, "sparse_attn T%lld H%d d%d idx%d sink%d rope%d bf%d lens%d", (long long)T, H, d, n_idx,
		 sink, rope, bout, lens);
	gt_cmp(what, o_r, o_g, nq, 1e-6, bout ? 8e-3 : 1e-5);
	free(q), free(kv0), free(kv2), free(snk), free(om), free(idx), free(len), free(pos), free(o_r), free(o_g);
	gt_dfree_all();
}

/* ---- indexer ---- */

static void t_indexer_rotate(int64_t R, int dim, int blk)
{
	kern_indexer_rotate_fn run = (kern_indexer_rotate_fn)gt_cuda_generic(&kern_op_indexer_rotate)->run;
	size_t n = (size_t)(R * dim);
	float *x = gt_frand(&rng, n, 2.0f), *xg = gt_fcopy(x, n);
	struct kern_indexer_rotate_args a = {.x = x, .n_rows = R, .dim = dim, .fp4_block = blk};
	T_CHECK(kern_indexer_rotate_quant_ref(&a) == ST_OK);
	struct kern_indexer_rotate_args d = a;
	d.x = gt_dup(xg, n * 4);
	d.stream = gt_stream;
	T_CHECK(run(&d) == ST_OK);
	gt_down(xg, d.x, n * 4);
	char what[96];
	snprintf(what, sizeof what, "indexer_rotate R%lld dim%d blk%d", (long long)R, dim, blk);
	gt_cmp(what, x, xg, n, 0, 0); /* the same butterflies and roundings: bit-identical */
	free(x), free(xg);
	gt_dfree_all();
}

static void t_indexer(const struct batch *b, int H, int D, int top_k, bool bf16, int work_mode)
{
	kern_indexer_topk_fn run_t = (kern_indexer_topk_fn)gt_cuda_generic(&kern_op_indexer_topk)->run;
	kern_indexer_topk_fn run_s = (kern_indexer_topk_fn)gt_cuda_generic(&kern_op_indexer_scores)->run;
	int64_t T = b->n_tokens, max_vis = 0;
	for (int s = 0; s < b->n_seqs; s++) {
		int64_t v = (b->start_pos[s] + (b->q_off[s + 1] - b->q_off[s])) / 4;
		max_vis = v > max_vis ? v : max_vis;
	}
	int64_t n_keys = (int64_t)b->n_seqs * (max_vis + 2), S = max_vis + 1;
	float *q = gt_frand(&rng, (size_t)(T * H * D), 1.0f), *hw = gt_frand(&rng, (size_t)(T * H), 1.0f);
	float *keys = gt_frand(&rng, (size_t)(n_keys * D), 1.0f);
	int64_t row0[8];
	for (int s = 0; s < b->n_seqs; s++)
		row0[s] = (int64_t)(b->n_seqs - 1 - s) * (max_vis + 2) + 1;
	size_t nk = (size_t)(T * top_k), nsc = (size_t)(T * S);
	int32_t *tk_r = gt_ifill(nk, 0x7f7f7f7f), *tk_g = gt_ifill(nk, 0x7f7f7f7f), *len_r = gt_ifill(T, 0x7f7f7f7f),
		*len_g = gt_ifill(T, 0x7f7f7f7f);
	float *ts_r = gt_fnan(nk), *ts_g = gt_fnan(nk), *sc_r = gt_fnan(nsc), *sc_g = gt_fnan(nsc);
	struct kern_indexer_topk_args a = {.q = q, .head_w = hw, .weight_scale = 1.0f / sqrtf((float)(D * H)),
					   .bf16_scores = bf16, .keys = keys, .n_key_rows = n_keys, .n_tokens = T,
					   .n_seqs = b->n_seqs, .q_off = b->q_off, .start_pos = b->start_pos,
					   .key_row0 = row0, .ratio = 4, .n_heads = H, .head_dim = D, .top_k = top_k,
					   .topk = tk_r, .scores = ts_r, .topk_len = len_r, .score_out = sc_r,
					   .score_stride = S};
	T_CHECK(kern_indexer_scores_ref(&a) == ST_OK);
	T_CHECK(kern_indexer_topk_ref(&a) == ST_OK);
	struct kern_indexer_topk_args d = a;
	d.q = gt_dup(q, (size_t)(T * H * D) * 4);
	d.head_w = gt_dup(hw, (size_t)(T * H) * 4);
	d.keys = gt_dup(keys, (size_t)(n_keys * D) * 4);
	d.q_off = gt_dup(b->q_off, (b->n_seqs + 1) * 4);
	d.start_pos = gt_dup(b->start_pos, b->n_seqs * 4);
	d.key_row0 = gt_dup(row0, b->n_seqs * 8);
	d.topk = gt_dup(tk_g, nk * 4);
	d.scores = gt_dup(ts_g, nk * 4);
	d.topk_len = gt_dup(len_g, T * 4);
	d.score_out = gt_dup(sc_g, nsc * 4);
	if (work_mode == 1) {
		d.work_len = T * max_vis;
		d.work = gt_dalloc((size_t)d.work_len * 4);
	}
	d.stream = gt_stream;
	T_CHECK(run_s(&d) == ST_OK);
	T_CHECK(run_t(&d) == ST_OK);
	gt_down(sc_g, d.score_out, nsc * 4);
	gt_down(tk_g, d.topk, nk * 4);
	gt_down(ts_g, d.scores, nk * 4);
	gt_down(len_g, d.topk_len, T * 4);
	char what[128];
	snprintf(what, sizeof what, "indexer T%lld H%d D%d k%d bf%d work%d vis%lld", (long long)T, H, D, top_k, bf16,
		 work_mode, (long long)max_vis);
	gt_cmp(what, sc_r, sc_g, nsc, 1e-7, bf16 ? 3e-2 : 1e-5);
	cmp_i(what, len_r, len_g, T);
	gt_cmp(what, ts_r, ts_g, nk, 1e-7, bf16 ? 3e-2 : 1e-5);
	if (!bf16) {
		cmp_i(what, tk_r, tk_g, nk);
	} else {
		/* ties: each chosen entry's reference score equals the reference's score at that slot */
		size_t bad = 0;
		float smax = 0;
		for (size_t k = 0; k < nsc; k++)
			smax = isfinite(sc_r[k]) && fabsf(sc_r[k]) > smax ? fabsf(sc_r[k]) : smax;
		for (int s = 0; s < b->n_seqs; s++)
			for (int64_t i = b->q_off[s]; i < b->q_off[s + 1]; i++)
				for (int j = 0; j < top_k; j++) {
					int32_t w = tk_g[i * top_k + j];
					float want = ts_r[i * top_k + j];
					float have = w < 0 ? -INFINITY : (w < S ? sc_r[i * S + w] : NAN);
					bad += !(have == want || fabsf(have - want) <= 3e-2f * smax);
					bad += (w < 0) != (tk_r[i * top_k + j] < 0);
				}
		T_CHECKF(bad == 0, "%s: %zu chosen entries differ in reference score", what, bad);
	}
	/* top-k from the given scores (the split form): exact */
	int32_t *tk_s = gt_ifill(nk, 0x7f7f7f7f);
	struct kern_indexer_topk_args gs = d;
	gs.scores_in = gt_dup(sc_r, nsc * 4);
	gs.scores = NULL;
	gs.topk_len = NULL;
	gs.topk = gt_dup(tk_s, nk * 4);
	T_CHECK(run_t(&gs) == ST_OK);
	gt_down(tk_s, gs.topk, nk * 4);
	struct kern_indexer_topk_args rs = a;
	rs.scores_in = sc_r;
	rs.scores = NULL;
	rs.topk_len = NULL;
	int32_t *tk_rs = gt_ifill(nk, 0x7f7f7f7f);
	rs.topk = tk_rs;
	T_CHECK(kern_indexer_topk_ref(&rs) == ST_OK);
	cmp_i(what, tk_rs, tk_s, nk);
	free(q), free(hw), free(keys), free(tk_r), free(tk_g), free(len_r), free(len_g), free(ts_r), free(ts_g),
		free(sc_r), free(sc_g), free(tk_s), free(tk_rs);
	gt_dfree_all();
}

/* ---- compressor: two calls (the second continues the state) ---- */

static void t_compressor(bool overlap, int ratio, int dim, int rd, enum kern_cmp_post post, bool paged)
{
	kern_compressor_fn run = (kern_compressor_fn)gt_cuda_generic(&kern_op_compressor)->run;
	const int n_seqs = 3, c = overlap ? 2 : 1, cd = c * dim;
	int len1[3] = {13, 0, 9}, len2[3] = {1, 6, 2 * ratio + 1}, start[3] = {0, 3, 5};
	int64_t sfl = (int64_t)c * ratio * cd, n_slots = 5, n_out = 192;
	float *kvs = malloc(n_slots * sfl * 4), *scs = malloc(n_slots * sfl * 4);
	for (int64_t k = 0; k < n_slots; k++)
		kern_compressor_state_init(kvs + k * sfl, scs + k * sfl, ratio, overlap, dim);
	float *kvs_g = gt_fcopy(kvs, n_slots * sfl), *scs_g = gt_fcopy(scs, n_slots * sfl);
	float *ape = gt_frand(&rng, (size_t)ratio * cd, 0.5f), *nwf = gt_frand(&rng, dim, 1.5f), *om = malloc(rd / 2 * 4 + 4);
	uint16_t *nw = malloc(dim * 2 + 2);
	for (int i = 0; i < dim; i++)
		nw[i] = kern_f32_to_bf16(1.0f + nwf[i]);
	struct kern_rope_yarn y = {.factor = 16, .original_max_pos = 65536, .beta_fast = 32, .beta_slow = 1};
	T_CHECK(kern_rope_freqs_build(om, rd, 160000, &y) == ST_OK);
	float *out_r = gt_fnan((size_t)(n_out * dim)), *out_g = gt_fnan((size_t)(n_out * dim));
	float *pl_r = gt_fnan((size_t)(n_out * dim)), *pl_g = gt_fnan((size_t)(n_out * dim));
	int32_t slot[3] = {4, 0, 2}, bt[3 * 16];
	int64_t row0[3] = {40, 0, 20};
	for (int i = 0; i < 3 * 16; i++)
		bt[i] = (i * 5) % 48; /* a permutation: no two sequences share a block; rows < 192 */
	float *d_kvs = gt_dup(kvs_g, n_slots * sfl * 4), *d_scs = gt_dup(scs_g, n_slots * sfl * 4);
	float *d_out = gt_dup(out_g, (size_t)(n_out * dim) * 4), *d_pl = gt_dup(pl_g, (size_t)(n_out * dim) * 4);
	for (int call = 0; call < 2; call++) {
		const int *len = call ? len2 : len1;
		int st[3];
		for (int s = 0; s < 3; s++)
			st[s] = call ? start[s] + len1[s] : start[s];
		struct batch b = mk_batch(n_seqs, len, st);
		float *kp = gt_frand(&rng, (size_t)(b.n_tokens * cd), 1.0f), *gp = gt_frand(&rng, (size_t)(b.n_tokens * cd), 2.0f);
		struct kern_compressor_args a = {.kv_proj = kp, .gate_proj = gp, .ape = ape, .n_tokens = b.n_tokens,
						 .n_seqs = n_seqs, .q_off = b.q_off, .start_pos = b.start_pos,
						 .kv_state = kvs, .score_state = scs, .state_slot = slot,
						 .n_state_slots = n_slots, .ratio = ratio, .overlap = overlap,
						 .head_dim = dim, .rope_dim = rd, .norm_w = nw, .norm_eps = 1e-6f,
						 .omega = om, .post = post, .out = out_r, .out_row0 = row0,
						 .n_out_rows = n_out, .pooled = pl_r};
		if (paged) {
			a.out_paged.block_table = bt;
			a.out_paged.bt_stride = 16;
			a.out_paged.per_block = 4;
		}
		T_CHECK(kern_compressor_ref(&a) == ST_OK);
		struct kern_compressor_args d = a;
		d.kv_proj = gt_dup(kp, (size_t)(b.n_tokens * cd) * 4);
		d.gate_proj = gt_dup(gp, (size_t)(b.n_tokens * cd) * 4);
		d.ape = gt_dup(ape, (size_t)ratio * cd * 4);
		d.q_off = gt_dup(b.q_off, (n_seqs + 1) * 4);
		d.start_pos = gt_dup(b.start_pos, n_seqs * 4);
		d.kv_state = d_kvs;
		d.score_state = d_scs;
		d.state_slot = gt_dup(slot, sizeof slot);
		d.norm_w = gt_dup(nw, dim * 2);
		d.omega = gt_dup(om, rd / 2 * 4);
		d.out = d_out;
		d.out_row0 = gt_dup(row0, sizeof row0);
		d.out_paged.block_table = gt_dup(a.out_paged.block_table, sizeof bt);
		d.pooled = d_pl;
		d.stream = gt_stream;
		T_CHECK(run(&d) == ST_OK);
		free(kp), free(gp);
	}
	gt_down(kvs_g, d_kvs, n_slots * sfl * 4);
	gt_down(scs_g, d_scs, n_slots * sfl * 4);
	gt_down(out_g, d_out, (size_t)(n_out * dim) * 4);
	gt_down(pl_g, d_pl, (size_t)(n_out * dim) * 4);
	char what[128];
	snprintf(what, sizeof what, "compressor overlap%d m%d d%d post%d paged%d", overlap, ratio, dim, (int)post, paged);
	/* -inf score slots compare as equal non-finite values; kern_compare_f32 wants finite refs there */
	size_t nst = (size_t)(n_slots * sfl), bad = 0;
	for (size_t i = 0; i < nst; i++)
		bad += !(scs_g[i] == scs[i]) || !(kvs_g[i] == kvs[i]); /* copies and one add: exact */
	T_CHECKF(bad == 0, "%s: %zu state values differ", what, bad);
	for (size_t i = 0; i < (size_t)(n_out * dim); i++)
		if (isnan(out_r[i]) && isnan(out_g[i]))
			out_r[i] = out_g[i] = pl_r[i] = pl_g[i] = 0; /* rows no entry went to */
	gt_cmp(what, pl_r, pl_g, (size_t)(n_out * dim), 1e-7, 1e-5);
	if (post == KERN_CMP_POST_NONE)
		gt_cmp(what, out_r, out_g, (size_t)(n_out * dim), 1e-7, 1.6e-2);
	else
		cmp_q(what, out_r, out_g, (size_t)(n_out * dim), 1.6e-2, 0.03, 0.35);
	free(kvs), free(scs), free(kvs_g), free(scs_g), free(ape), free(nwf), free(om), free(nw), free(out_r),
		free(out_g), free(pl_r), free(pl_g);
	gt_dfree_all();
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	rng = gt_seed(argc, argv, &dev);
	gt_stream_create();

	/* every op's generic CUDA variant is compiled and is what selection picks here
	 * (sparse_attn picks its decode row: tests/kernels/test_attn_decode_gpu.c) */
	const struct kern_op *ops[] = {&kern_op_rmsnorm, &kern_op_swiglu, &kern_op_rope, &kern_op_route,
				       &kern_op_ring_write, &kern_op_attn_index,
				       &kern_op_indexer_rotate, &kern_op_indexer_scores,
				       &kern_op_indexer_topk, &kern_op_compressor};
	if (!gt_generic_ops_picked(ops, sizeof ops / sizeof ops[0], &dev, false))
		return test_exit();

	for (int k = 0; k < 3; k++) {
		t_rmsnorm(0, 7, 1, false, false, false, 0, false);
		t_rmsnorm(1, 1, 0, false, false, false, 0, false);
		t_rmsnorm(3, 7, 2, false, false, false, 3, false);
		t_rmsnorm(17, 256, 1, true, true, false, 0, false);
		t_rmsnorm(5, 4096, 1, false, true, false, 5, false);
		t_rmsnorm(64, 512, 0, false, true, true, 0, true);
		t_rmsnorm(9, 1000, 2, true, false, false, 0, true);
	}
	t_swiglu(0, 5, false, false, 10, false, false);
	t_swiglu(1, 1, false, true, 10, false, false);
	t_swiglu(7, 33, true, true, 10, false, false);
	t_swiglu(64, 512, true, true, 10, true, false);
	t_swiglu(13, 100, false, false, 0, false, false);
	t_swiglu(5, 64, true, false, 10, false, true);
	t_silu(1);
	t_silu(1000);
	t_silu(300001);
	t_rope(0, 1, 64, 16, 0, 1, false, false, false);
	t_rope(1, 1, 64, 64, 0, 1, false, false, true);
	t_rope(5, 4, 64, 16, 3, 0, true, false, true);
	t_rope(33, 3, 512, 64, 0, 4, false, true, true);
	t_rope(8, 1, 7 * 2, 2, 1, 128, true, true, false);
	t_route(0, 256, 6, true, false);
	t_route(1, 256, 6, true, false);
	t_route(37, 256, 6, true, false);
	t_route(20, 8, 8, false, false);
	t_route(9, 300, 1, true, false);
	t_route(25, 256, 6, false, true);
	{
		int len[3] = {0, 5, 200}, st[3] = {3, 0, 100};
		struct batch b = mk_batch(3, len, st);
		t_ring_write(&b, 16, 32, 0);
		t_ring_write(&b, 128, 70, 3);
		int l1[1] = {1}, s1[1] = {77};
		struct batch b1 = mk_batch(1, l1, s1);
		t_ring_write(&b1, 8, 5, 0);
	}
	{
		int len[3] = {1, 7, 40}, st[3] = {0, 20, 130};
		struct batch b = mk_batch(3, len, st);
		for (int mode = 0; mode < 3; mode++) {
			t_attn_index(&b, 16, mode, false);
			t_attn_index(&b, 128, mode, mode > 0);
		}
		int l2[2] = {3, 0}, s2[2] = {0, 9};
		struct batch b2 = mk_batch(2, l2, s2);
		t_attn_index(&b2, 4, 1, false);
	}
	t_sparse_attn(1, 1, 32, 8, 4, false, false, false, false);
	t_sparse_attn(5, 3, 64, 16, 40, true, true, false, true);
	t_sparse_attn(4, 2, 512, 64, 300, true, true, true, true);
	t_sparse_attn(3, 4, 100, 2, 17, false, true, false, false);
	t_sparse_attn(2, 1, 512, 64, 1000, false, false, false, true);
	t_indexer_rotate(0, 32, 32);
	t_indexer_rotate(1, 32, 32);
	t_indexer_rotate(9, 128, 32);
	t_indexer_rotate(5, 128, 0);
	t_indexer_rotate(3, 2048, 32);
	{
		int len[2] = {3, 10}, st[2] = {40, 0};
		struct batch b = mk_batch(2, len, st);
		t_indexer(&b, 4, 32, 8, false, 0);
		t_indexer(&b, 4, 32, 64, false, 0);
		t_indexer(&b, 4, 32, 5, true, 0);
		int l1[1] = {2}, s1[1] = {36000}; /* 9000 visible: past the shared-memory cache */
		struct batch b1 = mk_batch(1, l1, s1);
		t_indexer(&b1, 2, 32, 8, false, 0); /* recomputed in every round */
		t_indexer(&b1, 2, 32, 8, false, 1); /* work_len: a larger opt-in shared cache */
		int l2[1] = {2}, s2[1] = {240000};  /* 60000 visible: past any opt-in cache, work rows */
		struct batch b2 = mk_batch(1, l2, s2);
		t_indexer(&b2, 2, 32, 8, false, 1);
	}
	t_compressor(true, 4, 64, 16, KERN_CMP_POST_NONE, false);
	t_compressor(true, 4, 64, 16, KERN_CMP_POST_FP8_NOPE, true);
	t_compressor(true, 4, 32, 8, KERN_CMP_POST_HADAMARD_FP4, false);
	t_compressor(false, 8, 64, 16, KERN_CMP_POST_FP8_NOPE, false);
	t_compressor(false, 8, 512, 64, KERN_CMP_POST_NONE, true);
	t_compressor(true, 4, 128, 64, KERN_CMP_POST_HADAMARD_FP4, true);

	cudaError_t ce = cudaDeviceSynchronize();
	T_CHECKF(ce == cudaSuccess, "device: %s", cudaGetErrorString(ce));
	cudaStreamDestroy(gt_stream);
	return test_exit();
}
#else
int main(void)
{
	return test_skip("built without CUDA");
}
#endif
