/*
 * kernels/moe_gemm/moe_decode.cu: the host side of the fused routed-expert
 * pass of a small step, op moe_decode (moe_decode.h): variants
 * moe_decode_cuda (f32 FMA kernels, moe_decode_fma.cu, whose top comment
 * describes the two passes) and moe_decode_cuda_mma (the same passes on bf16
 * mma.sync, moe_decode_mma.cu). One path serves both: it checks the
 * arguments, picks the rows per work item (RC = 1, 2, 4 or 8: the most that
 * cover the step and whose staged rows fit in shared memory), takes the
 * combine's counters from the context's scratch and launches pass 0 (gate/up
 * + SwiGLU) then pass 1 (down + combine) of the chosen kernel family
 * (struct md_pass_kind, moe_decode.cuh). Plus the host-buffer wrappers the
 * self-checks and tests call.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "dsv4_config.h"
#include "kernels/device/ctx.h"
#include "kernels/moe_gemm/moe_decode.h"
}
#include "kernels/device/host_bufs.cuh"
#include "kernels/moe_gemm/moe_decode.cuh"

/* Per-device caches (64 devices): SM count, opt-in shared memory. */
static int md_dev_attr(int dev, cudaDeviceAttr attr, int *cache, int fallback)
{
	if (dev < 0 || dev >= 64)
		return fallback;
	if (!cache[dev]) {
		int v = 0;
		if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0) {
			cudaGetLastError();
			v = fallback;
		}
		cache[dev] = v;
	}
	return cache[dev];
}

static inline int md_rc_index(int rc)
{
	return rc == 1 ? 0 : rc == 2 ? 1 : rc == 4 ? 2 : 3; /* anything else: 8 */
}

/* Per-kernel cache of the resident blocks per SM on each of 64 devices, for
 * the dynamic shared memory size it was asked for last. */
struct md_occ {
	int blocks[64];
	size_t smem[64];
};
static md_occ md_occ_fma[2][4], md_occ_mma[2][4]; /* [pass][md_rc_index] of each family */

/* Launch pass mode (0, 1) of family k with rc rows per item and smem bytes
 * of dynamic shared memory, on a grid of what fits on the device at once
 * (the occupancy, cached per kernel in occ) times sms, at most items_ub and
 * at least 1. */
static cudaError_t md_launch(const md_pass_kind *k, md_occ (*occ)[4], int mode, int rc, const md_params &p,
			     size_t smem, int64_t items_ub, int sms, int dev, cudaStream_t s)
{
	const md_kernel_fn fn = k->kernel[mode][md_rc_index(rc)];
	md_occ *oc = &occ[mode][md_rc_index(rc)];
	cudaError_t ce;
	const bool cached = dev >= 0 && dev < 64;
	int nb = cached && oc->smem[dev] == smem ? oc->blocks[dev] : 0;
	if (!nb) {
		ce = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, fn, k->nt, smem);
		if (ce != cudaSuccess)
			return ce;
		if (nb < 1)
			nb = 1;
		if (cached) {
			oc->blocks[dev] = nb;
			oc->smem[dev] = smem;
		}
	}
	int64_t grid = (int64_t)nb * sms;
	if (grid > items_ub)
		grid = items_ub;
	if (grid < 1)
		grid = 1;
	fn<<<(unsigned)grid, k->nt, smem, s>>>(p);
	return cudaGetLastError();
}

/* Once per device, before any launch: every kernel of both families may take
 * the device's opt-in shared memory (so no attribute is set later, when a
 * stream may be capturing a graph). */
static cudaError_t md_init(int dev, int optin)
{
	static int done[64];
	if (dev >= 0 && dev < 64 && done[dev])
		return cudaSuccess;
	const int bytes = optin - 256; /* the kernels' static shared words are below 256 bytes */
	const md_pass_kind *const kinds[2] = {&kern__moe_decode_fma, &kern__moe_decode_mma};
	for (int f = 0; f < 2; f++)
		for (int mode = 0; mode < 2; mode++)
			for (int i = 0; i < 4; i++) {
				const cudaError_t ce = cudaFuncSetAttribute(
					kinds[f]->kernel[mode][i], cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
				if (ce != cudaSuccess)
					return ce;
			}
	if (dev >= 0 && dev < 64)
		done[dev] = 1;
	return cudaSuccess;
}

static bool md_fp4(enum kern_wfmt f)
{
	return f == KERN_WFMT_MXFP4 || f == KERN_WFMT_NVFP4;
}

static bool md_al(const void *p, uintptr_t a)
{
	return (uintptr_t)p % a == 0;
}

static enum status md_run(const struct kern_moe_decode_args *a, const struct md_pass_kind *k, md_occ (*occ)[4])
{
	if (!a || a->n_tokens < 0 || a->top_k <= 0 || a->n_experts <= 0 || !a->w1 || !a->w3 || !a->w2 ||
	    !a->w1_dev || !a->w3_dev || !a->w2_dev || !a->expert_offsets)
		return ST_INVALID;
	const int64_t T = a->n_tokens, K = a->top_k, E = a->n_experts;
	if (T == 0)
		return ST_OK;
	if (!a->x || !a->h || !a->y || !a->out || !a->row_src || !a->slot_row)
		return ST_INVALID;
	const enum kern_wfmt f = a->w1[0].fmt;
	const int64_t D = a->w1[0].cols, I = a->w1[0].rows;
	if (!md_fp4(f) || a->w3[0].fmt != f || a->w2[0].fmt != f || a->w3[0].rows != I || a->w3[0].cols != D ||
	    a->w2[0].rows != D || a->w2[0].cols != I)
		return ST_INVALID;
	if (a->act_quant_block != 128 || D % 128 || I % 128 || E > 1024 || K > 64)
		return ST_UNSUPPORTED;
	if (!md_al(a->x, 16) || !md_al(a->h, 16) || !md_al(a->y, 16) || !md_al(a->out, 16))
		return ST_UNSUPPORTED;
	for (int64_t e = 0; e < E; e++) {
		const struct kern_wmat *m[3] = {&a->w1[e], &a->w3[e], &a->w2[e]};
		for (int i = 0; i < 3; i++)
			if (!md_al(m[i]->data, 16) || !md_al(m[i]->scale, 2))
				return ST_UNSUPPORTED;
	}
	int dev = 0;
	if (cudaGetDevice(&dev) != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	static int smem_cache[64];
	const int sms = kern_device_sm_count();
	const int optin = md_dev_attr(dev, cudaDevAttrMaxSharedMemoryPerBlockOptin, smem_cache, 48 << 10);
	const size_t tail = (size_t)(E + 1) * 2 * sizeof(int);
	int rc = T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8;
	size_t (*const stage)(int, int64_t) = k->stage_bytes;
	while (rc > 1 && stage(rc, D) + tail + 1024 > (size_t)optin)
		rc /= 2;
	if (stage(rc, D) + tail + 1024 > (size_t)optin)
		return ST_UNSUPPORTED;
	if (md_init(dev, optin) != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}

	const size_t cnt_bytes = kern_moe_decode_scratch_bytes(T, D);
	uint32_t *cnt = (uint32_t *)kern_ctx_scratch(kern_ctx_or_default(a->ctx), cnt_bytes, a->stream);
	if (!cnt)
		return ST_NOMEM;

	const int64_t P = T * K;
	int64_t tiles_ub = (P + rc - 1) / rc + E;
	if (tiles_ub > P)
		tiles_ub = P;
	md_params p = {};
	p.n_experts = E;
	p.n_tokens = T;
	p.top_k = (int)K;
	p.offsets = a->expert_offsets;
	p.row_src = a->row_src;
	p.slot_row = a->slot_row;
	p.row_weight = a->row_weight;
	p.h = a->h;
	p.y = a->y;
	p.outp = a->out;
	p.cnt = cnt;
	p.n_cnt = (int64_t)(cnt_bytes / sizeof(uint32_t));
	p.limit = a->swiglu_limit;
	p.bf16r = a->bf16_round ? 1 : 0;
	cudaStream_t s = (cudaStream_t)a->stream;

	md_params p0 = p;
	p0.x = a->x;
	p0.in = D;
	p0.out = I;
	p0.wa = a->w1_dev;
	p0.wb = a->w3_dev;
	const int64_t per0 = k->out0, per1 = k->out1;
	cudaError_t ce =
		md_launch(k, occ, 0, rc, p0, stage(rc, D) + tail, tiles_ub * ((I + per0 - 1) / per0), sms, dev, s);
	if (ce == cudaSuccess) {
		md_params p1 = p;
		p1.x = a->h;
		p1.in = I;
		p1.out = D;
		p1.wa = a->w2_dev;
		p1.wb = a->w2_dev;
		int64_t items = tiles_ub * ((D + per1 - 1) / per1);
		if (items < T) /* the zero rows of tokens without local experts */
			items = T;
		ce = md_launch(k, occ, 1, rc, p1, stage(rc, I) + tail, items, sms, dev, s);
	}
	if (ce != cudaSuccess) {
		cudaGetLastError();
		return ST_CUDA;
	}
	return ST_OK;
}

extern "C" enum status kern_moe_decode_cuda(const struct kern_moe_decode_args *a)
{
	return md_run(a, &kern__moe_decode_fma, md_occ_fma);
}

extern "C" enum status kern_moe_decode_cuda_mma(const struct kern_moe_decode_args *a)
{
	return md_run(a, &kern__moe_decode_mma, md_occ_mma);
}

/* ---- host-buffer wrapper (tests, self-checks) ---- */

/* Copies of the E experts of one projection (data and scales 256-byte aligned)
 * and the device array of their views; experts sharing one host matrix share
 * one device copy. hw[E] receives the views (device pointers). */
static struct kern_wmat *md_experts(struct kern_hbufs *b, const struct kern_wmat *w, int64_t E, struct kern_wmat *hw)
{
	const size_t wb = kern_wmat_data_bytes(&w[0]), sb = kern_wmat_scale_bytes(&w[0]);
	const size_t wb_al = (wb + 255) & ~(size_t)255, stride = wb_al + ((sb + 255) & ~(size_t)255);
	int64_t n_distinct = 0;
	for (int64_t e = 0; e < E; e++) {
		bool seen = false;
		for (int64_t k = 0; k < e && !seen; k++)
			seen = w[k].data == w[e].data && w[k].scale == w[e].scale;
		n_distinct += !seen;
	}
	uint8_t *dw = (uint8_t *)kern_hb_alloc(b, (size_t)n_distinct * stride);
	int64_t next = 0;
	for (int64_t e = 0; e < E && b->ce == cudaSuccess; e++) {
		hw[e] = w[e];
		hw[e].owned = NULL;
		int64_t k = 0;
		while (k < e && !(w[k].data == w[e].data && w[k].scale == w[e].scale))
			k++;
		if (k < e) {
			hw[e].data = hw[k].data;
			hw[e].scale = hw[k].scale;
			continue;
		}
		hw[e].data = dw + next * stride;
		hw[e].scale = dw + next * stride + wb_al;
		next++;
		kern_hb_copy_in(b, (void *)hw[e].data, w[e].data, wb);
		kern_hb_copy_in(b, (void *)hw[e].scale, w[e].scale, sb);
	}
	return (struct kern_wmat *)kern_hb_up(b, hw, (size_t)E * sizeof *hw, false);
}

static enum status md_run_host(const struct kern_moe_decode_args *a, kern_moe_decode_fn fn)
{
	if (!a || a->n_tokens < 0 || a->top_k <= 0 || a->n_experts <= 0 || !a->w1 || !a->w3 || !a->w2 ||
	    !a->expert_offsets)
		return ST_INVALID;
	const int64_t T = a->n_tokens, K = a->top_k, E = a->n_experts, P = T * K;
	if (T == 0)
		return ST_OK;
	if (!a->x || !a->h || !a->y || !a->out || !a->row_src || !a->slot_row)
		return ST_INVALID;
	const int64_t D = a->w1[0].cols, I = a->w1[0].rows;
	struct kern_wmat *hw = (struct kern_wmat *)calloc((size_t)(3 * E), sizeof *hw);
	if (!hw)
		return ST_NOMEM;
	struct kern_hbufs b = {};
	struct kern_moe_decode_args da = *a;
	da.x = (const float *)kern_hb_up(&b, a->x, (size_t)(T * D) * sizeof(float), false);
	da.h = (float *)kern_hb_up(&b, a->h, (size_t)(P * I) * sizeof(float), true); /* poison stays visible */
	da.y = (float *)kern_hb_up(&b, a->y, (size_t)(P * D) * sizeof(float), true);
	da.out = (float *)kern_hb_up(&b, a->out, (size_t)(T * D) * sizeof(float), true);
	da.expert_offsets = (const int32_t *)kern_hb_up(&b, a->expert_offsets, (size_t)(E + 1) * sizeof(int32_t), false);
	da.row_src = (const int32_t *)kern_hb_up(&b, a->row_src, (size_t)P * sizeof(int32_t), false);
	da.slot_row = (const int32_t *)kern_hb_up(&b, a->slot_row, (size_t)P * sizeof(int32_t), false);
	da.row_weight = (const float *)kern_hb_up(&b, a->row_weight, (size_t)P * sizeof(float), false); /* NULL stays */
	da.w1_dev = md_experts(&b, a->w1, E, hw);
	da.w3_dev = md_experts(&b, a->w3, E, hw + E);
	da.w2_dev = md_experts(&b, a->w2, E, hw + 2 * E);
	da.w1 = hw;
	da.w3 = hw + E;
	da.w2 = hw + 2 * E;
	da.stream = NULL;
	da.ctx = NULL;
	/* a failed copy in is not run; kern_hb_finish turns it into ST_CUDA (and clears it) */
	const enum status st = kern_hb_finish(&b, b.ce == cudaSuccess ? fn(&da) : ST_OK);
	free(hw);
	return st;
}

extern "C" enum status kern_moe_decode_cuda_host(const struct kern_moe_decode_args *a)
{
	return md_run_host(a, kern_moe_decode_cuda);
}

extern "C" enum status kern_moe_decode_cuda_mma_host(const struct kern_moe_decode_args *a)
{
	return md_run_host(a, kern_moe_decode_cuda_mma);
}
