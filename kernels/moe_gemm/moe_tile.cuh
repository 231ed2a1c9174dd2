/*
 * kernels/moe_gemm/moe_tile.cuh: which expert and which row tile a block of
 * a grouped expert GEMM owns. Blocks along y enumerate every expert's row
 * tiles in expert order (rows sorted by expert, offsets[E + 1]); thread 0
 * walks the offsets, the block then reads the answer from shared memory.
 */
#ifndef DSV4_KERNELS_MOE_TILE_CUH
#define DSV4_KERNELS_MOE_TILE_CUH

#include <stdint.h>

/* Block slot -> expert (-1 when the slot is past the last tile) and its rows
 * [*r0, *r1), tiles of tile_rows rows. */
static __device__ __forceinline__ int moe_tile_of_slot(int64_t slot, int64_t n_experts, const int32_t *offsets,
						       int tile_rows, int *r0, int *r1)
{
	int64_t cum = 0;
	for (int64_t e = 0; e < n_experts; e++) {
		const int32_t b = offsets[e], c = offsets[e + 1];
		const int64_t tiles = (c - b + tile_rows - 1) / tile_rows;
		if (slot < cum + tiles) {
			*r0 = b + (int)(slot - cum) * tile_rows;
			*r1 = min(*r0 + tile_rows, (int)c);
			return (int)e;
		}
		cum += tiles;
	}
	return -1;
}

#endif
