/*
 * kernels/compressor/compressor_variants.c: the registry tables of op "compressor".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (compressor_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (compressor_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/compressor/compressor.h"

#include "dsv4_config.h"
#include "kernels/compressor/compressor_generic.h"

static const struct kern_variant compressor_variants[] = {
	KERN_ROW_CPU_REF("compressor_cpu_ref", kern_compressor_ref,
	                 .desc = "CPU reference: CSA/HCA KV compressor state machine"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("compressor_cuda_generic", 10, kern_compressor_cuda_generic, NULL,
	              .desc = "portable CUDA compressor state machine, one block per sequence"),
};

const struct kern_op kern_op_compressor = {
	.name = "compressor",
	.variants = compressor_variants,
	.n_variants = (int)(sizeof compressor_variants / sizeof compressor_variants[0]),
};
