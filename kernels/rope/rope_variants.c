/*
 * kernels/rope/rope_variants.c: the registry tables of op "rope".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (rope_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (rope_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/rope/rope.h"

#include "dsv4_config.h"
#include "kernels/rope/rope_generic.h"

static const struct kern_variant rope_variants[] = {
	KERN_ROW_CPU_REF("rope_cpu_ref", kern_rope_ref,
	                 .desc = "CPU reference: interleaved rope on the last dims, forward/inverse"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("rope_cuda_generic", 10, kern_rope_cuda_generic, NULL,
	              .desc = "portable CUDA interleaved rope, one thread per (row, pair, head)"),
};

const struct kern_op kern_op_rope = {
	.name = "rope",
	.variants = rope_variants,
	.n_variants = (int)(sizeof rope_variants / sizeof rope_variants[0]),
};
