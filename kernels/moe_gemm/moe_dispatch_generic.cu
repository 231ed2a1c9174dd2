/*
 * kernels/moe_gemm/moe_dispatch_generic.cu: portable CUDA moe_dispatch and
 * moe_combine (variants moe_dispatch_cuda_generic, moe_combine_cuda_generic),
 * every cc >= 8.0. Both are deterministic and give exactly the CPU result.
 *
 * dispatch: one block of 256 threads. Counts per local expert with shared
 *   atomics, an exclusive scan by one thread (n_experts <= 1024), then a
 *   stable placement chunk by chunk: within a chunk of 256 slots each thread
 *   ranks itself among earlier threads with the same expert (a shared-memory
 *   scan, 256 compares), adds the expert's running cursor, and the last
 *   thread of each expert advances the cursor. Work O(S * 256) compares:
 *   fine for a step's few thousand slots, and nothing leaves the device.
 * combine: one block per token, threads over the row; a gather (slot_row),
 *   so no atomics and a fixed summation order.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/moe_gemm/moe_dispatch.h"
}
#include "kernels/device/host_bufs.cuh"
#include "kernels/quant/quant_cuda.cuh"

#define NT 256
#define KERN_DISPATCH_MAX_EXPERTS 1024

__global__ void __launch_bounds__(NT) moe_dispatch_kernel(int64_t S, int top_k, const int32_t *__restrict__ ids,
							  int32_t base, int E, int32_t *__restrict__ off,
							  int32_t *__restrict__ row_src, int32_t *__restrict__ row_slot,
							  int32_t *__restrict__ slot_row, int64_t *__restrict__ n_rows)
{
	__shared__ int32_t cursor[KERN_DISPATCH_MAX_EXPERTS];
	__shared__ int32_t chunk[NT];
	const int tid = threadIdx.x;
	for (int x = tid; x < E; x += NT)
		cursor[x] = 0;
	__syncthreads();
	for (int64_t s = tid; s < S; s += NT) {
		const int32_t id = ids[s];
		if (id >= 0 && id - base >= 0 && id - base < E)
			atomicAdd(&cursor[id - base], 1);
	}
	__syncthreads();
	if (tid == 0) {
		int32_t acc = 0;
		for (int x = 0; x < E; x++) {
			const int32_t c = cursor[x];
			off[x] = acc;
			cursor[x] = acc;
			acc += c;
		}
		off[E] = acc;
		*n_rows = acc;
	}
	__syncthreads();
	for (int64_t c0 = 0; c0 < S; c0 += NT) {
		const int64_t s = c0 + tid;
		int x = -1;
		if (s < S) {
			const int32_t id = ids[s];
			x = (id >= 0 && id - base >= 0 && id - base < E) ? id - base : -1;
		}
		chunk[tid] = x;
		__syncthreads();
		int rank = 0;
		bool last = true;
		if (x >= 0) {
			for (int t = 0; t < NT; t++) {
				rank += (t < tid) & (chunk[t] == x);
				last &= !((t > tid) & (chunk[t] == x));
			}
			const int32_t r = cursor[x] + rank;
			slot_row[s] = r;
			row_src[r] = (int32_t)(s / top_k);
			if (row_slot)
				row_slot[r] = (int32_t)s;
		} else if (s < S) {
			slot_row[s] = -1;
		}
		__syncthreads(); /* every thread has read cursor before it moves */
		if (x >= 0 && last)
			cursor[x] += rank + 1;
		__syncthreads();
	}
}

__global__ void __launch_bounds__(NT) moe_combine_kernel(int top_k, int64_t dim, const int32_t *__restrict__ slot_row,
							 const float *__restrict__ slot_weight, const void *__restrict__ y,
							 int y_dt, int64_t ldy, void *__restrict__ out, int out_dt,
							 int64_t ldo, int accumulate)
{
	const int64_t t = blockIdx.x;
	for (int64_t d = threadIdx.x; d < dim; d += NT) {
		float acc = accumulate ? kq_load(out, out_dt, t * ldo + d) : 0.f;
		for (int j = 0; j < top_k; j++) {
			const int64_t s = t * top_k + j;
			const int32_t r = slot_row[s];
			if (r < 0)
				continue;
			const float v = kq_load(y, y_dt, (int64_t)r * ldy + d);
			acc += slot_weight ? slot_weight[s] * v : v;
		}
		kq_store(out, out_dt, t * ldo + d, acc);
	}
}

extern "C" enum status kern_moe_dispatch_cuda_generic(const struct kern_moe_dispatch_args *a)
{
	if (a->n_tokens < 0 || a->top_k <= 0 || a->n_experts <= 0 || a->n_experts > KERN_DISPATCH_MAX_EXPERTS ||
	    a->n_tokens * a->top_k > INT32_MAX)
		return ST_INVALID;
	moe_dispatch_kernel<<<1, NT, 0, (cudaStream_t)a->stream>>>(a->n_tokens * a->top_k, a->top_k, a->topk_ids,
								   a->expert_base, (int)a->n_experts, a->expert_offsets,
								   a->row_src, a->row_slot, a->slot_row, a->n_rows);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

extern "C" enum status kern_moe_combine_cuda_generic(const struct kern_moe_combine_args *a)
{
	if (a->n_tokens < 0 || a->top_k <= 0 || a->dim <= 0 || (a->ldy && a->ldy < a->dim) ||
	    (a->ldo && a->ldo < a->dim) || a->n_tokens > INT32_MAX)
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	moe_combine_kernel<<<(unsigned)a->n_tokens, NT, 0, (cudaStream_t)a->stream>>>(
		a->top_k, a->dim, a->slot_row, a->slot_weight, a->y, (int)a->y_dtype, a->ldy ? a->ldy : a->dim, a->out,
		(int)a->out_dtype, a->ldo ? a->ldo : a->dim, a->accumulate);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

/* ---- host-buffer wrappers (tests, self-checks) ---- */

extern "C" enum status kern_moe_dispatch_cuda_generic_host(const struct kern_moe_dispatch_args *a)
{
	if (!a->expert_offsets || !a->row_src || !a->slot_row || !a->n_rows || a->n_tokens < 0 || a->top_k <= 0 ||
	    a->n_experts <= 0 || (a->n_tokens && !a->topk_ids))
		return ST_INVALID;
	const size_t S = (size_t)(a->n_tokens * a->top_k), E = (size_t)a->n_experts;
	struct kern_hbufs b = {};
	struct kern_moe_dispatch_args d = *a;
	d.topk_ids = (const int32_t *)kern_hb_up(&b, a->topk_ids, S * 4, false);
	d.expert_offsets = (int32_t *)kern_hb_up(&b, a->expert_offsets, (E + 1) * 4, true);
	d.row_src = (int32_t *)kern_hb_up(&b, a->row_src, S * 4, true);
	d.row_slot = (int32_t *)kern_hb_up(&b, a->row_slot, S * 4, true);
	d.slot_row = (int32_t *)kern_hb_up(&b, a->slot_row, S * 4, true);
	d.n_rows = (int64_t *)kern_hb_up(&b, a->n_rows, 8, true);
	d.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_moe_dispatch_cuda_generic(&d) : ST_CUDA);
}

extern "C" enum status kern_moe_combine_cuda_generic_host(const struct kern_moe_combine_args *a)
{
	if (a->n_tokens < 0 || a->top_k <= 0 || a->dim <= 0 || (a->n_tokens && (!a->slot_row || !a->out)) ||
	    (a->ldy && a->ldy < a->dim) || (a->ldo && a->ldo < a->dim))
		return ST_INVALID;
	if (a->n_tokens == 0)
		return ST_OK;
	const int64_t T = a->n_tokens, k = a->top_k, ldy = a->ldy ? a->ldy : a->dim, ldo = a->ldo ? a->ldo : a->dim;
	int32_t max_row = -1;
	for (int64_t s = 0; s < T * k; s++)
		max_row = a->slot_row[s] > max_row ? a->slot_row[s] : max_row;
	const size_t yb = max_row >= 0 ? (size_t)((int64_t)max_row * ldy + a->dim) * kern_dtype_bytes(a->y_dtype) : 0;
	const size_t ob = (size_t)((T - 1) * ldo + a->dim) * kern_dtype_bytes(a->out_dtype);
	struct kern_hbufs b = {};
	struct kern_moe_combine_args c = *a;
	c.slot_row = (const int32_t *)kern_hb_up(&b, a->slot_row, (size_t)(T * k) * 4, false);
	c.slot_weight = (const float *)kern_hb_up(&b, a->slot_weight, (size_t)(T * k) * 4, false);
	c.y = kern_hb_up(&b, a->y, yb, false);
	c.out = kern_hb_up(&b, a->out, ob, true);
	c.stream = 0;
	return kern_hb_finish(&b, b.ce == cudaSuccess ? kern_moe_combine_cuda_generic(&c) : ST_CUDA);
}
