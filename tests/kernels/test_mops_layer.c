/*
 * tests/kernels/test_mops_layer.c: the model ops composed into one CSA or HCA
 * attention layer over a flat varlen batch (the sequence documented in
 * kernels/attention/attention.h), run with every sequence in one step and
 * again in random interleaved chunks down to single decode tokens. Every
 * op is per token or per sequence state, so the attention output of each
 * (sequence, position) must be bit-identical across the two schedules; this
 * checks that the compressor state, the rings, the paged-free pools, the
 * indexer and the index builder fit together (dsv4.md §3.3-§3.8, §3.12).
 * Projections are random stand-ins for the linears (not under test here).
 */
#include "kernels/attention/attention.h"
#include "kernels/compressor/compressor.h"
#include "kernels/indexer/indexer.h"
#include "kernels/norm/lowp_sim.h"
#include "kernels/rope/rope.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

enum { NS = 3, H = 4, D = 64, R = 16, W = 16, HI = 2, DI = 32, TOPK = 5, MAXL = 70 };

struct seqdata {
	int len;
	float *q, *kv, *ck, *cz, *iq, *iw, *ik, *iz; /* per position */
};

struct layer {
	int ratio;
	bool csa;
	float omega[R / 2], ape[4 * 2 * D > 128 * D ? 4 * 2 * D : 128 * D], iape[4 * 2 * DI];
	uint16_t nw[D], inw[DI];
	float sink[H];
	struct seqdata s[NS];
};

static int cd(const struct layer *L)
{
	return (L->csa ? 2 : 1) * D;
}

static void layer_make(struct layer *L, int ratio)
{
	memset(L, 0, sizeof *L);
	L->ratio = ratio;
	L->csa = ratio == 4;
	struct kern_rope_yarn y = {16, 65536, 32, 1};
	T_CHECK(kern_rope_freqs_build(L->omega, R, 160000, &y) == ST_OK);
	mt_fill(L->ape, (size_t)(ratio * cd(L)), -1, 1);
	mt_fill(L->iape, 4 * 2 * DI, -1, 1);
	for (int i = 0; i < D; i++)
		L->nw[i] = kern__f32_to_bf16(mt_unif(0.5f, 1.5f));
	for (int i = 0; i < DI; i++)
		L->inw[i] = kern__f32_to_bf16(mt_unif(0.5f, 1.5f));
	mt_fill(L->sink, H, -1, 1);
	for (int s = 0; s < NS; s++) {
		struct seqdata *q = &L->s[s];
		q->len = mt_int(1, MAXL);
		size_t n = (size_t)q->len;
		q->q = xcalloc(n * H * D, 4), q->kv = xcalloc(n * D, 4);
		q->ck = xcalloc(n * (size_t)cd(L), 4), q->cz = xcalloc(n * (size_t)cd(L), 4);
		q->iq = xcalloc(n * HI * DI, 4), q->iw = xcalloc(n * HI, 4);
		q->ik = xcalloc(n * 2 * DI, 4), q->iz = xcalloc(n * 2 * DI, 4);
		mt_fill(q->q, n * H * D, -1, 1);
		mt_fill(q->kv, n * D, -1, 1);
		mt_fill(q->ck, n * (size_t)cd(L), -2, 2);
		mt_fill(q->cz, n * (size_t)cd(L), -2, 2);
		mt_fill(q->iq, n * HI * DI, -1, 1);
		mt_fill(q->iw, n * HI, -1, 1);
		mt_fill(q->ik, n * 2 * DI, -2, 2);
		mt_fill(q->iz, n * 2 * DI, -2, 2);
	}
}

static void layer_free(struct layer *L)
{
	for (int s = 0; s < NS; s++) {
		struct seqdata *q = &L->s[s];
		free(q->q), free(q->kv), free(q->ck), free(q->cz), free(q->iq), free(q->iw), free(q->ik), free(q->iz);
	}
}

#define CAT(dst, field, width)                                                                          \
	memcpy((dst) + (int64_t)q_off[k] * (width), L->s[s].field + (int64_t)start[k] * (width),       \
	       sizeof(float) * (size_t)(n[k] * (width)))

/* Run the layer; out[s] gets [len, H, D]. chunked: random steps. */
static void layer_run(const struct layer *L, bool chunked, float *out[NS])
{
	int m = L->ratio, c = cd(L), srows = (L->csa ? 2 : 1) * m;
	/* per-sequence state: compressor (main, indexer), ring; pools: contiguous per sequence */
	float *kvs = xcalloc((size_t)(NS * srows * c), 4), *scs = xcalloc((size_t)(NS * srows * c), 4);
	float *ikvs = xcalloc(NS * 8 * 2 * DI, 4), *iscs = xcalloc(NS * 8 * 2 * DI, 4);
	float *ring = xcalloc(NS * W * D, 4);
	int64_t cmp_rows = NS * (MAXL / m + 1), key_rows = NS * (MAXL / 4 + 1);
	float *cmp = xcalloc((size_t)(cmp_rows * D), 4), *keys = xcalloc((size_t)(key_rows * DI), 4);
	int64_t cmp0[NS], key0[NS], ring_pool0[NS];
	for (int s = 0; s < NS; s++) {
		kern_compressor_state_init(kvs + s * srows * c, scs + s * srows * c, m, L->csa, D);
		kern_compressor_state_init(ikvs + s * 8 * 2 * DI, iscs + s * 8 * 2 * DI, 4, true, DI);
		cmp0[s] = s * (MAXL / m + 1);
		key0[s] = s * (MAXL / 4 + 1);
		ring_pool0[s] = s * W;
	}
	int done[NS] = {0};
	for (;;) {
		int32_t q_off[NS + 1] = {0}, start[NS], n[NS], slot[NS], seq_of[NS];
		int ns = 0, left = 0;
		for (int s = 0; s < NS; s++) {
			int rem = L->s[s].len - done[s];
			left += rem;
			if (!rem || (chunked && mt_int(0, 3) == 0))
				continue;
			int k = ns++;
			n[k] = !chunked ? rem : mt_int(0, 2) == 0 ? mt_int(1, rem) : 1;
			if (n[k] > rem)
				n[k] = rem;
			start[k] = done[s];
			slot[k] = s;
			seq_of[k] = s;
			q_off[k + 1] = q_off[k] + n[k];
		}
		if (!left)
			break;
		int64_t T = q_off[ns];
		if (!T)
			continue;
		float *q = xcalloc((size_t)(T * H * D), 4), *kv = xcalloc((size_t)(T * D), 4);
		float *ck = xcalloc((size_t)(T * c), 4), *cz = xcalloc((size_t)(T * c), 4);
		float *iq = xcalloc((size_t)(T * HI * DI), 4), *iw = xcalloc((size_t)(T * HI), 4);
		float *ik = xcalloc((size_t)(T * 2 * DI), 4), *iz = xcalloc((size_t)(T * 2 * DI), 4);
		float *o = xcalloc((size_t)(T * H * D), 4);
		int32_t *pos = xcalloc((size_t)T, 4), *tk = xcalloc((size_t)(T * TOPK), 4);
		int stride = W + MAXL / m + TOPK + 1;
		int32_t *idx = xcalloc((size_t)(T * stride), 4), *len = xcalloc((size_t)T, 4);
		int64_t c0[NS], k0[NS], r0[NS], rp0[NS];
		for (int k = 0; k < ns; k++) {
			int s = seq_of[k];
			CAT(q, q, H * D);
			CAT(kv, kv, D);
			CAT(ck, ck, c);
			CAT(cz, cz, c);
			CAT(iq, iq, HI * DI);
			CAT(iw, iw, HI);
			CAT(ik, ik, 2 * DI);
			CAT(iz, iz, 2 * DI);
			for (int i = 0; i < n[k]; i++)
				pos[q_off[k] + i] = start[k] + i;
			c0[k] = cmp0[s], k0[k] = key0[s], r0[k] = T + ring_pool0[s], rp0[k] = ring_pool0[s];
		}
		struct kern_rope_args ra = {.x = q, .pos = pos, .omega = L->omega, .n_rows = T, .n_heads = H,
					    .head_dim = D, .rope_dim = R};
		T_CHECK(kern_rope_ref(&ra) == ST_OK);
		ra.x = kv, ra.n_heads = 1, ra.bf16_out = true;
		T_CHECK(kern_rope_ref(&ra) == ST_OK);
		for (int64_t t = 0; t < T; t++)
			kern__fp8_qdq(kv + t * D, D - R, 64);
		struct kern_compressor_args ca = {.kv_proj = ck, .gate_proj = cz, .ape = L->ape, .n_tokens = T,
						  .n_seqs = ns, .q_off = q_off, .start_pos = start, .kv_state = kvs,
						  .score_state = scs, .state_slot = slot, .n_state_slots = NS,
						  .ratio = m, .overlap = L->csa, .head_dim = D, .rope_dim = R,
						  .norm_w = L->nw, .norm_eps = 1e-6f, .omega = L->omega,
						  .post = KERN_CMP_POST_FP8_NOPE, .out = cmp, .out_row0 = c0,
						  .n_out_rows = cmp_rows};
		T_CHECK(kern_compressor_ref(&ca) == ST_OK);
		if (L->csa) {
			ra.x = iq, ra.n_heads = HI, ra.head_dim = DI, ra.bf16_out = false;
			T_CHECK(kern_rope_ref(&ra) == ST_OK);
			struct kern_indexer_rotate_args rq = {.x = iq, .n_rows = T * HI, .dim = DI, .fp4_block = 32};
			T_CHECK(kern_indexer_rotate_quant_ref(&rq) == ST_OK);
			struct kern_compressor_args ic = ca;
			ic.kv_proj = ik, ic.gate_proj = iz, ic.ape = L->iape, ic.kv_state = ikvs, ic.score_state = iscs;
			ic.ratio = 4, ic.overlap = true, ic.head_dim = DI, ic.norm_w = L->inw;
			ic.post = KERN_CMP_POST_HADAMARD_FP4, ic.out = keys, ic.out_row0 = k0, ic.n_out_rows = key_rows;
			T_CHECK(kern_compressor_ref(&ic) == ST_OK);
			struct kern_indexer_topk_args ta = {.q = iq, .head_w = iw, .weight_scale = 0.125f, .keys = keys,
							    .n_key_rows = key_rows, .n_tokens = T, .n_seqs = ns,
							    .q_off = q_off, .start_pos = start, .key_row0 = k0,
							    .ratio = 4, .n_heads = HI, .head_dim = DI, .top_k = TOPK,
							    .topk = tk};
			T_CHECK(kern_indexer_topk_ref(&ta) == ST_OK);
		}
		struct kern_attn_index_args ia = {.n_tokens = T, .n_seqs = ns, .q_off = q_off, .start_pos = start,
						  .window = W, .cur_row0 = 0, .ring_row0 = r0, .ratio = m,
						  .cmp_row0 = c0, .topk = L->csa ? tk : NULL, .topk_stride = TOPK,
						  .idx = idx, .idx_len = len, .idx_stride = stride};
		for (int k = 0; k < ns; k++) /* compressed rows come after fresh and ring rows */
			c0[k] += T + NS * W;
		T_CHECK(kern_attn_index_ref(&ia) == ST_OK);
		struct kern_sparse_attn_args aa = {.q = q, .out = o, .kv = {kv, ring, cmp},
						   .kv_rows = {T, NS * W, cmp_rows}, .idx = idx, .idx_len = len,
						   .idx_stride = stride, .sink = L->sink, .softmax_scale = 0.125f,
						   .pos = pos, .omega = L->omega, .rope_dim = R, .n_tokens = T,
						   .n_heads = H, .head_dim = D};
		T_CHECK(kern_sparse_attn_ref(&aa) == ST_OK);
		struct kern_ring_write_args rw = {.src = kv, .ring = ring, .ring_row0 = rp0, .n_ring_rows = NS * W,
						  .n_tokens = T, .n_seqs = ns, .q_off = q_off, .start_pos = start,
						  .window = W, .dim = D};
		T_CHECK(kern_ring_write_ref(&rw) == ST_OK);
		for (int k = 0; k < ns; k++) {
			int s = seq_of[k];
			memcpy(out[s] + (int64_t)start[k] * H * D, o + (int64_t)q_off[k] * H * D,
			       sizeof(float) * (size_t)(n[k] * H * D));
			done[s] += n[k];
		}
		free(q), free(kv), free(ck), free(cz), free(iq), free(iw), free(ik), free(iz), free(o);
		free(pos), free(tk), free(idx), free(len);
	}
	free(kvs), free(scs), free(ikvs), free(iscs), free(ring), free(cmp), free(keys);
}

static void test_layer(int ratio)
{
	struct layer *L = xcalloc(1, sizeof *L);
	layer_make(L, ratio);
	float *a[NS], *b[NS];
	for (int s = 0; s < NS; s++) {
		a[s] = xcalloc((size_t)(L->s[s].len * H * D), 4);
		b[s] = xcalloc((size_t)(L->s[s].len * H * D), 4);
		fill_nan(a[s], (size_t)(L->s[s].len * H * D));
		fill_nan(b[s], (size_t)(L->s[s].len * H * D));
	}
	layer_run(L, false, a);
	layer_run(L, true, b);
	int diff = 0;
	size_t nn = 0;
	for (int s = 0; s < NS; s++) {
		size_t n = (size_t)(L->s[s].len * H * D);
		nn += count_nan(a[s], n);
		diff += memcmp(a[s], b[s], n * 4) != 0;
	}
	T_CHECKF(nn == 0 && diff == 0, "ratio %d: %zu NaN, %d sequences differ between schedules", ratio, nn, diff);
	for (int s = 0; s < NS; s++) {
		free(a[s]);
		free(b[s]);
	}
	layer_free(L);
	free(L);
}

int main(void)
{
	mt_seed_from_env("test_mops_layer");
	for (int rep = 0; rep < 3; rep++) {
		test_layer(4);  /* CSA: compressor + indexer + top-k */
		test_layer(8);  /* HCA (tiny ratio) */
		test_layer(32); /* HCA, windows longer than the sliding window */
	}
	return test_exit();
}
