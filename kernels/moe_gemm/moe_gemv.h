/*
 * kernels/moe_gemm/moe_gemv.h: the decode expert GEMV for FP4 experts
 * (variant moe_gemm_cuda_gemv; the kernel lives in moe_gemm_generic.cu so it
 * shares that file's generic cc >= 8.0 image). Same contract as
 * kern_moe_gemm_cuda_generic (moe_gemm.h): rows sorted by expert, device
 * offsets (n_rows may be an upper bound), optional row_src gather, optional
 * FP8 act_quant 128, every existing row of y written.
 *
 * Memory-bound design for few rows per expert: one warp per 2 output rows,
 * 16 rows per block, one block per (expert, chunk of <= 8 rows, 16 outputs),
 * so a single 4096 -> 2048 expert is 128 blocks; each lane streams 16-byte
 * loads of packed e2m1 (a warp reads 512 contiguous bytes of a row per load),
 * decodes them by PRMT table lookup, and accumulates in f32 against the
 * block's activations, staged (and act-quantized) once per block in shared
 * memory as bf16 (exact: bf16 x, or FP8 act_quant values); warp-shuffle
 * reduction at the end. The block's expert is found by a warp-parallel scan
 * of the offsets, and its first weight loads are issued before the staging.
 *
 * No dispatch inside: the registry's guard (moe_gemv_supports) gives the
 * GEMV plans with max_rows <= KERN_MOE_GEMV_MAX_ROWS (an expert with more
 * than 8 rows is done in chunks of 8, its weights re-read from L2; run()
 * itself takes any count), bf16 x or FP8 act_quant (the activations are
 * staged as bf16), and an `in` whose staged row fits the device's shared
 * memory (kern_moe_gemv_min_smem); larger batches select another variant.
 * run() returns ST_UNSUPPORTED for what the guard refuses and for weights
 * below 16-byte (data) / 2-byte (scale) alignment. MXFP4 and NVFP4 only,
 * in % 32.
 */
#ifndef DSV4_KERNELS_MOE_GEMV_H
#define DSV4_KERNELS_MOE_GEMV_H

#include <stddef.h>

#include "kernels/moe_gemm/moe_gemm.h"

#define KERN_MOE_GEMV_MAX_ROWS 64

/* Dynamic plus static shared memory per block the GEMV needs for one staged
 * row of `in` bf16 activations (its padded layout) and its shared words. */
static inline int64_t kern_moe_gemv_min_smem(int64_t in)
{
	return (in + (in >> 5) * 8) * 2 + 1024;
}

enum status kern_moe_gemv_cuda(const struct kern_moe_gemm_args *a);
/* kern_moe_gemv_cuda on host buffers (copies everything in and out, syncs). */
enum status kern_moe_gemv_cuda_host(const struct kern_moe_gemm_args *a);

/* Bandwidth probes for the benchmark (not kernels of any op): a 16-byte
 * vectorized grid-stride device copy, and a read-only pass (16-byte loads,
 * XOR-folded, nothing stored but a sink word per block that is practically
 * never written; sink needs 8 x SM-count words). 16-byte aligned. */
enum status kern_moe_gemv_bench_copy(void *dst, const void *src, size_t bytes, void *stream);
enum status kern_moe_gemv_bench_read(const void *src, size_t bytes, void *sink, void *stream);

#endif
