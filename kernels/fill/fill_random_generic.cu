/*
 * kernels/fill/fill_random_generic.cu: the portable CUDA fill_random (every
 * cc >= 8.0): one thread per element over a grid-stride loop, the reference's
 * integer hash and its float expression with explicit round-to-nearest
 * operations (no FMA contraction), so the bytes equal the CPU reference's.
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "kernels/fill/fill_random_generic.h"
}

#define FR_NT 256
#define FR_MAX_GRID (1 << 20)

__device__ __forceinline__ uint64_t fr_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

__global__ void fill_random_kernel(struct kern_fill_random_args a)
{
	uint64_t span = (uint64_t)(a.e_hi - a.e_lo + 1);
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * blockDim.x) {
		uint64_t h = fr_mix64(a.seed ^ fr_mix64((uint64_t)i));
		float u = __fmul_rn((float)(h >> 40), 1.0f / 16777216.0f);
		float v = __fadd_rn(a.lo, __fmul_rn(__fsub_rn(a.hi, a.lo), u));
		switch (a.kind) {
		case KERN_FILL_UNIFORM_F32:
			((float *)a.dst)[i] = v;
			break;
		case KERN_FILL_UNIFORM_BF16: {
			uint32_t b = __float_as_uint(v);
			b += 0x7fffu + ((b >> 16) & 1u);
			((uint16_t *)a.dst)[i] = (uint16_t)(b >> 16);
			break;
		}
		case KERN_FILL_E4M3: {
			unsigned ex = (unsigned)a.e_lo + (unsigned)((h >> 8) % span);
			unsigned sign = a.positive ? 0u : (unsigned)(h >> 63);
			((uint8_t *)a.dst)[i] = (uint8_t)((sign << 7) | (ex << 3) | (unsigned)(h & 7u));
			break;
		}
		case KERN_FILL_E8M0:
			((uint8_t *)a.dst)[i] = (uint8_t)((uint64_t)a.e_lo + (h >> 8) % span);
			break;
		case KERN_FILL_BYTES:
			((uint8_t *)a.dst)[i] = (uint8_t)(h >> 56);
			break;
		default: {
			uint64_t r = (uint64_t)i / (uint64_t)a.cols, c = (uint64_t)i % (uint64_t)a.cols;
			uint64_t x = (fr_mix64(a.seed ^ r) + c) % (uint64_t)a.n_index;
			if (a.kind == KERN_FILL_INDEX_I64)
				((int64_t *)a.dst)[i] = (int64_t)x;
			else
				((int32_t *)a.dst)[i] = (int32_t)x;
			break;
		}
		}
	}
}

extern "C" enum status kern_fill_random_cuda_generic(const struct kern_fill_random_args *a)
{
	enum status st = kern_fill_random_check(a);
	if (st || a->n == 0)
		return st;
	int64_t b = (a->n + FR_NT - 1) / FR_NT;
	unsigned grid = (unsigned)(b > FR_MAX_GRID ? FR_MAX_GRID : b);
	fill_random_kernel<<<grid, FR_NT, 0, (cudaStream_t)a->stream>>>(*a);
	return cudaGetLastError() == cudaSuccess ? ST_OK : ST_CUDA;
}

extern "C" enum status kern_fill_random_cuda_generic_host(const struct kern_fill_random_args *a)
{
	enum status st = kern_fill_random_check(a);
	if (st || a->n == 0)
		return st;
	size_t bytes = (size_t)a->n * (size_t)kern_fill_elem_bytes(a->kind);
	void *d = NULL;
	if (cudaMalloc(&d, bytes) != cudaSuccess)
		return ST_NOMEM;
	struct kern_fill_random_args x = *a;
	x.dst = d;
	x.stream = 0;
	st = kern_fill_random_cuda_generic(&x);
	if (st == ST_OK && (cudaDeviceSynchronize() != cudaSuccess ||
			    cudaMemcpy(a->dst, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess))
		st = ST_CUDA;
	cudaFree(d);
	return st;
}
