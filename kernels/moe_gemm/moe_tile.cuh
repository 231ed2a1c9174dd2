/*
 * kernels/moe_gemm/moe_tile.cuh: which expert and which row tile a block of
 * a grouped expert GEMM owns. Blocks along y enumerate every expert's row
 * tiles in expert order (rows sorted by expert, offsets[E + 1]); thread 0
 * walks the offsets, the block then reads the answer from shared memory.
 * moe_tile_launch_shape() is the host side: the grid those blocks form.
 */
#ifndef DSV4_KERNELS_MOE_TILE_CUH
#define DSV4_KERNELS_MOE_TILE_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/status.h"
#include "kernels/moe_gemm/moe_gemm.h"
}

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

/* The grid of a grouped expert GEMM over a (its weight format already
 * checked by the caller) whose blocks own tile_rows rows and tile_cols
 * outputs: x over the outputs, y over the slots above (an upper bound: every
 * expert may end in a partial tile); *ldx, *ldy the leading dimensions (0 in
 * a: dense). ST_INVALID for an act_quant_block other than 0 or 128 or more
 * than 65535 slots; ST_OK with grid->y == 0 when there are no rows to run. */
static inline enum status moe_tile_launch_shape(const struct kern_moe_gemm_args *a, int tile_rows, int tile_cols,
						dim3 *grid, int64_t *ldx, int64_t *ldy)
{
	const int64_t in = a->w[0].cols, out = a->w[0].rows;
	*grid = dim3(0, 0, 1);
	if (a->act_quant_block != 0 && a->act_quant_block != 128)
		return ST_INVALID;
	if (a->n_rows == 0)
		return ST_OK;
	*ldx = a->ldx ? a->ldx : in;
	*ldy = a->ldy ? a->ldy : out;
	const int64_t slots = (a->n_rows + tile_rows - 1) / tile_rows + a->n_experts;
	if (slots > 65535)
		return ST_INVALID;
	*grid = dim3((unsigned)((out + tile_cols - 1) / tile_cols), (unsigned)slots);
	return ST_OK;
}

#endif
