/*
 * kernels/movement/movement_generic.cu: portable CUDA movement ops for every
 * cc >= 8.0 (the *_cuda_generic rows of the movement op tables; contracts in
 * movement.h). Each op is a copy or an elementwise map, so every variant
 * reproduces its reference bit for bit:
 *   copy_rows, block_copy, block_fill: one CTA per row / region over a grid-
 *     stride loop, 16-byte accesses when every address and length allows;
 *   embed: one CTA per token, bf16 -> f32 by a shift (exact);
 *   round_bf16, add: one thread per element, the C operations (integer RNE,
 *     one fp32 add, no FMA to contract);
 *   act_quant_sim: one warp per (row, block): fmaxf of |x| over the block
 *     (order-free: max is exact), then the reference's divide by the power-
 *     of-two scale, clamp, e4m3 / e2m1 rounding and multiply;
 *   moe_row_weight: reads the row count from device memory, clamps it.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "kernels/movement/movement_generic.h"
}
#include "kernels/device/host_bufs.cuh"
#include "kernels/norm/lowp_cuda.cuh"
#include "kernels/quant/quant_cuda.cuh"

#define MV_NT 256
#define MV_MAX_GRID (1 << 20)

static unsigned mv_grid(int64_t units, int64_t per_cta)
{
	int64_t b = (units + per_cta - 1) / per_cta;
	return (unsigned)(b < 1 ? 1 : (b > MV_MAX_GRID ? MV_MAX_GRID : b));
}

static enum status mv_launched(void)
{
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* 16-byte vectors are usable when every base address and every offset in
 * elements is a multiple of 4 floats. */
static bool mv_vec4(const void *p, const void *q, int64_t a, int64_t b, int64_t c)
{
	return ((uintptr_t)p % 16 == 0) && ((uintptr_t)q % 16 == 0) && a % 4 == 0 && b % 4 == 0 && c % 4 == 0;
}

/* ---- copy_rows ---- */

template <typename T>
__global__ void copy_rows_kernel(T *dst, int64_t ds, const int32_t *di, const T *src, int64_t ss, const int32_t *si,
				 int64_t n_rows, int64_t dim)
{
	for (int64_t i = blockIdx.x; i < n_rows; i += gridDim.x) {
		int64_t d = di ? di[i] : i, s = si ? si[i] : i;
		if (d < 0 || s < 0)
			continue;
		T *o = dst + d * ds;
		const T *x = src + s * ss;
		for (int64_t k = threadIdx.x; k < dim; k += blockDim.x)
			o[k] = x[k];
	}
}

extern "C" enum status kern_copy_rows_cuda_generic(const struct kern_copy_rows_args *a)
{
	enum status st = kern_copy_rows_check(a);
	if (st || a->n_rows == 0)
		return st;
	int64_t ds = a->dst_stride ? a->dst_stride : a->dim, ss = a->src_stride ? a->src_stride : a->dim;
	cudaStream_t s = (cudaStream_t)a->stream;
	unsigned nt = a->dim >= 512 ? MV_NT : 128;
	if (mv_vec4(a->dst, a->src, ds, ss, a->dim))
		copy_rows_kernel<float4><<<mv_grid(a->n_rows, 1), nt, 0, s>>>(
			(float4 *)a->dst, ds / 4, a->dst_idx, (const float4 *)a->src, ss / 4, a->src_idx, a->n_rows,
			a->dim / 4);
	else
		copy_rows_kernel<float><<<mv_grid(a->n_rows, 1), nt, 0, s>>>(a->dst, ds, a->dst_idx, a->src, ss,
									     a->src_idx, a->n_rows, a->dim);
	return mv_launched();
}

/* ---- embed ---- */

__global__ void embed_kernel(const uint16_t *table, int64_t vocab_begin, int64_t vocab_rows, const int32_t *ids,
			     int64_t n_tokens, int64_t dim, int n_copies, float *out)
{
	for (int64_t t = blockIdx.x; t < n_tokens; t += gridDim.x) {
		int64_t r = (int64_t)ids[t] - vocab_begin;
		bool in = r >= 0 && r < vocab_rows;
		float *o = out + t * n_copies * dim;
		for (int64_t k = threadIdx.x; k < dim; k += blockDim.x) {
			float v = in ? kd_bf16_to_f32(table[r * dim + k]) : 0.0f;
			for (int c = 0; c < n_copies; c++)
				o[c * dim + k] = v;
		}
	}
}

extern "C" enum status kern_embed_cuda_generic(const struct kern_embed_args *a)
{
	enum status st = kern_embed_check(a);
	if (st || a->n_tokens == 0)
		return st;
	embed_kernel<<<mv_grid(a->n_tokens, 1), a->dim >= 512 ? MV_NT : 128, 0, (cudaStream_t)a->stream>>>(
		a->table, a->vocab_begin, a->vocab_rows, a->ids, a->n_tokens, a->dim, a->n_copies, a->out);
	return mv_launched();
}

/* ---- block_copy / block_fill ---- */

/* grid.y walks the pairs, grid.x the chunks of one region. */
template <typename T>
__global__ void block_copy_kernel(T *pool, int64_t stride, int64_t len, int64_t off, const int32_t *dst_ids,
				  const int32_t *src_ids, int64_t n)
{
	for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
		int64_t d = dst_ids[i], s = src_ids[i];
		if (d < 0 || s < 0)
			continue;
		T *o = pool + d * stride + off;
		const T *x = pool + s * stride + off;
		for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < len; k += (int64_t)gridDim.x * blockDim.x)
			o[k] = x[k];
	}
}

template <typename T>
__global__ void block_fill_kernel(T *pool, int64_t stride, int64_t len, int64_t off, const int32_t *ids, int64_t n,
				  T value)
{
	for (int64_t i = blockIdx.y; i < n; i += gridDim.y) {
		int64_t d = ids[i];
		if (d < 0)
			continue;
		T *o = pool + d * stride + off;
		for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < len; k += (int64_t)gridDim.x * blockDim.x)
			o[k] = value;
	}
}

static dim3 block_grid(int64_t len, int64_t n)
{
	int64_t cx = (len + MV_NT - 1) / MV_NT;
	cx = cx < 1 ? 1 : (cx > 64 ? 64 : cx);
	return dim3((unsigned)cx, (unsigned)(n > 65535 ? 65535 : n), 1);
}

extern "C" enum status kern_block_copy_cuda_generic(const struct kern_block_copy_args *a)
{
	enum status st = kern_block_copy_check(a);
	if (st || a->n == 0 || a->region_len == 0)
		return st;
	cudaStream_t s = (cudaStream_t)a->stream;
	if (mv_vec4(a->pool, a->pool, a->region_stride, a->region_len, a->region_offset))
		block_copy_kernel<float4><<<block_grid(a->region_len / 4, a->n), MV_NT, 0, s>>>(
			(float4 *)a->pool, a->region_stride / 4, a->region_len / 4, a->region_offset / 4, a->dst_ids,
			a->src_ids, a->n);
	else
		block_copy_kernel<float><<<block_grid(a->region_len, a->n), MV_NT, 0, s>>>(
			a->pool, a->region_stride, a->region_len, a->region_offset, a->dst_ids, a->src_ids, a->n);
	return mv_launched();
}

extern "C" enum status kern_block_fill_cuda_generic(const struct kern_block_fill_args *a)
{
	enum status st = kern_block_fill_check(a);
	if (st || a->n == 0 || a->region_len == 0)
		return st;
	cudaStream_t s = (cudaStream_t)a->stream;
	if (mv_vec4(a->pool, a->pool, a->region_stride, a->region_len, a->region_offset))
		block_fill_kernel<float4><<<block_grid(a->region_len / 4, a->n), MV_NT, 0, s>>>(
			(float4 *)a->pool, a->region_stride / 4, a->region_len / 4, a->region_offset / 4, a->ids, a->n,
			make_float4(a->value, a->value, a->value, a->value));
	else
		block_fill_kernel<float><<<block_grid(a->region_len, a->n), MV_NT, 0, s>>>(
			a->pool, a->region_stride, a->region_len, a->region_offset, a->ids, a->n, a->value);
	return mv_launched();
}

/* ---- round_bf16, add ---- */

__global__ void round_bf16_kernel(float *x, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		x[i] = kd_bf16_round(x[i]);
}

extern "C" enum status kern_round_bf16_cuda_generic(const struct kern_round_bf16_args *a)
{
	enum status st = kern_round_bf16_check(a);
	if (st || a->n == 0)
		return st;
	round_bf16_kernel<<<mv_grid(a->n, MV_NT), MV_NT, 0, (cudaStream_t)a->stream>>>(a->x, a->n);
	return mv_launched();
}

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		y[i] = __fadd_rn(y[i], x[i]);
}

extern "C" enum status kern_add_cuda_generic(const struct kern_add_args *a)
{
	enum status st = kern_add_check(a);
	if (st || a->n == 0)
		return st;
	add_kernel<<<mv_grid(a->n, MV_NT), MV_NT, 0, (cudaStream_t)a->stream>>>(a->y, a->x, a->n);
	return mv_launched();
}

/* ---- act_quant_sim ---- */

/* dec(enc(v)) of kern_f32_to_e2m1 / kern_e2m1_to_f32, step for step: NaN
 * gives +0, RNE within each binade of the grid, |v| >= 6 gives 6. */
static __device__ __forceinline__ float e2m1_qdq_unit(float v)
{
	if (isnan(v))
		return 0.0f;
	float a = fabsf(v), r;
	if (a < 2.0f)
		r = rintf(a * 2.0f) * 0.5f;
	else if (a < 4.0f)
		r = rintf(a);
	else if (a < 6.0f)
		r = rintf(a * 0.5f) * 2.0f;
	else
		r = 6.0f;
	return signbit(v) ? -r : r;
}

__global__ void act_quant_sim_kernel(float *x, int64_t n_rows, int64_t n_cols, int64_t ld, int block, int fp4)
{
	const int lane = threadIdx.x & 31;
	const int64_t nb = (n_cols + block - 1) / block, n_units = n_rows * nb;
	const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
	for (int64_t u = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < n_units; u += warps) {
		int64_t r = u / nb, b = u - r * nb;
		int64_t k0 = b * block, k1 = k0 + block < n_cols ? k0 + block : n_cols;
		float *xr = x + r * ld;
		float amax = 0.0f;
		for (int64_t k = k0 + lane; k < k1; k += 32)
			amax = fmaxf(amax, fabsf(xr[k]));
		for (int o = 16; o > 0; o >>= 1)
			amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
		float s = fp4 ? kq_pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) / 6.0f) : kq_fp8_block_scale(amax);
		for (int64_t k = k0 + lane; k < k1; k += 32)
			xr[k] = fp4 ? __fmul_rn(e2m1_qdq_unit(__fdiv_rn(xr[k], s)), s) : kq_fp8_qdq(xr[k], s);
	}
}

extern "C" enum status kern_act_quant_sim_cuda_generic(const struct kern_act_quant_sim_args *a)
{
	enum status st = kern_act_quant_sim_check(a);
	if (st || a->n_rows == 0 || a->n_cols == 0)
		return st;
	int64_t units = a->n_rows * ((a->n_cols + a->block - 1) / a->block);
	act_quant_sim_kernel<<<mv_grid(units, MV_NT / 32), MV_NT, 0, (cudaStream_t)a->stream>>>(
		a->x, a->n_rows, a->n_cols, a->ld, a->block, a->fp4);
	return mv_launched();
}

/* ---- moe_row_weight ---- */

__global__ void moe_row_weight_kernel(const float *slot_weight, const int32_t *row_slot, const int64_t *n_rows,
				      int64_t max_rows, float *row_weight)
{
	int64_t n = *n_rows;
	n = n < 0 ? 0 : (n > max_rows ? max_rows : n);
	for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += (int64_t)gridDim.x * blockDim.x)
		row_weight[r] = slot_weight[row_slot[r]];
}

extern "C" enum status kern_moe_row_weight_cuda_generic(const struct kern_moe_row_weight_args *a)
{
	enum status st = kern_moe_row_weight_check(a);
	if (st || a->max_rows == 0)
		return st;
	moe_row_weight_kernel<<<mv_grid(a->max_rows, MV_NT), MV_NT, 0, (cudaStream_t)a->stream>>>(
		a->slot_weight, a->row_slot, a->n_rows, a->max_rows, a->row_weight);
	return mv_launched();
}

/* ---- host-buffer wrappers (self-checks, tests) ---- */

/* Elements spanned by rows 0..n_rows-1 of width dim at stride. */
static size_t mv_span(int64_t n_rows, int64_t stride, int64_t dim)
{
	return n_rows > 0 ? (size_t)((n_rows - 1) * stride + dim) : 0;
}

/* 1 + the largest entry of idx[0..n) (n when idx is NULL), 0 if none is >= 0. */
static int64_t mv_rows(const int32_t *idx, int64_t n)
{
	if (!idx)
		return n;
	int64_t m = -1;
	for (int64_t i = 0; i < n; i++)
		m = idx[i] > m ? idx[i] : m;
	return m + 1;
}

extern "C" enum status kern_copy_rows_cuda_generic_host(const struct kern_copy_rows_args *a)
{
	enum status st = kern_copy_rows_check(a);
	if (st || a->n_rows == 0)
		return st;
	int64_t ds = a->dst_stride ? a->dst_stride : a->dim, ss = a->src_stride ? a->src_stride : a->dim;
	struct kern_hbufs b = {};
	struct kern_copy_rows_args d = *a;
	d.dst = (float *)kern_hb_up(&b, a->dst, mv_span(mv_rows(a->dst_idx, a->n_rows), ds, a->dim) * 4, true);
	d.src = (const float *)kern_hb_up(&b, a->src, mv_span(mv_rows(a->src_idx, a->n_rows), ss, a->dim) * 4, false);
	d.dst_idx = (const int32_t *)kern_hb_up(&b, a->dst_idx, (size_t)a->n_rows * 4, false);
	d.src_idx = (const int32_t *)kern_hb_up(&b, a->src_idx, (size_t)a->n_rows * 4, false);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_copy_rows_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_embed_cuda_generic_host(const struct kern_embed_args *a)
{
	enum status st = kern_embed_check(a);
	if (st || a->n_tokens == 0)
		return st;
	struct kern_hbufs b = {};
	struct kern_embed_args d = *a;
	d.table = (const uint16_t *)kern_hb_up(&b, a->table, (size_t)(a->vocab_rows * a->dim) * 2, false);
	d.ids = (const int32_t *)kern_hb_up(&b, a->ids, (size_t)a->n_tokens * 4, false);
	d.out = (float *)kern_hb_up(&b, a->out, (size_t)(a->n_tokens * a->n_copies * a->dim) * 4, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_embed_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_block_copy_cuda_generic_host(const struct kern_block_copy_args *a)
{
	enum status st = kern_block_copy_check(a);
	if (st || a->n == 0 || a->region_len == 0)
		return st;
	int64_t m = mv_rows(a->dst_ids, a->n), ms = mv_rows(a->src_ids, a->n);
	m = ms > m ? ms : m;
	struct kern_hbufs b = {};
	struct kern_block_copy_args d = *a;
	d.pool = (float *)kern_hb_up(&b, a->pool, mv_span(m, a->region_stride, a->region_offset + a->region_len) * 4, true);
	d.dst_ids = (const int32_t *)kern_hb_up(&b, a->dst_ids, (size_t)a->n * 4, false);
	d.src_ids = (const int32_t *)kern_hb_up(&b, a->src_ids, (size_t)a->n * 4, false);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_block_copy_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_block_fill_cuda_generic_host(const struct kern_block_fill_args *a)
{
	enum status st = kern_block_fill_check(a);
	if (st || a->n == 0 || a->region_len == 0)
		return st;
	struct kern_hbufs b = {};
	struct kern_block_fill_args d = *a;
	d.pool = (float *)kern_hb_up(&b, a->pool,
				mv_span(mv_rows(a->ids, a->n), a->region_stride, a->region_offset + a->region_len) * 4, true);
	d.ids = (const int32_t *)kern_hb_up(&b, a->ids, (size_t)a->n * 4, false);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_block_fill_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_round_bf16_cuda_generic_host(const struct kern_round_bf16_args *a)
{
	enum status st = kern_round_bf16_check(a);
	if (st || a->n == 0)
		return st;
	struct kern_hbufs b = {};
	struct kern_round_bf16_args d = *a;
	d.x = (float *)kern_hb_up(&b, a->x, (size_t)a->n * 4, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_round_bf16_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_add_cuda_generic_host(const struct kern_add_args *a)
{
	enum status st = kern_add_check(a);
	if (st || a->n == 0)
		return st;
	struct kern_hbufs b = {};
	struct kern_add_args d = *a;
	d.y = (float *)kern_hb_up(&b, a->y, (size_t)a->n * 4, true);
	d.x = a->x == a->y ? d.y : (const float *)kern_hb_up(&b, a->x, (size_t)a->n * 4, false);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_add_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_act_quant_sim_cuda_generic_host(const struct kern_act_quant_sim_args *a)
{
	enum status st = kern_act_quant_sim_check(a);
	if (st || a->n_rows == 0 || a->n_cols == 0)
		return st;
	struct kern_hbufs b = {};
	struct kern_act_quant_sim_args d = *a;
	d.x = (float *)kern_hb_up(&b, a->x, mv_span(a->n_rows, a->ld, a->n_cols) * 4, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_act_quant_sim_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_moe_row_weight_cuda_generic_host(const struct kern_moe_row_weight_args *a)
{
	enum status st = kern_moe_row_weight_check(a);
	if (st || a->max_rows == 0)
		return st;
	int64_t n = *a->n_rows;
	n = n < 0 ? 0 : (n > a->max_rows ? a->max_rows : n);
	struct kern_hbufs b = {};
	struct kern_moe_row_weight_args d = *a;
	d.slot_weight = (const float *)kern_hb_up(&b, a->slot_weight, (size_t)mv_rows(a->row_slot, n) * 4, false);
	d.row_slot = (const int32_t *)kern_hb_up(&b, a->row_slot, (size_t)a->max_rows * 4, false);
	d.n_rows = (const int64_t *)kern_hb_up(&b, a->n_rows, sizeof(int64_t), false);
	d.row_weight = (float *)kern_hb_up(&b, a->row_weight, (size_t)a->max_rows * 4, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_moe_row_weight_cuda_generic(&d) : ST_CUDA);
}
