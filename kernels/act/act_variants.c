/*
 * kernels/act/act_variants.c: the registry tables of op "swiglu".
 *
 * Variants (priority order, highest first):
 *   <op>_cuda_generic  cc >= 8.0, sm_80 image (act_generic.cu): the same args
 *                  contract on device buffers; the portable fallback, so
 *                  selection never fails on a GPU.
 *   <op>_cpu_ref   the CPU reference (act_ref.c), every shape; the oracle
 *                  for GPU variants and for load-time self-checks.
 */
#include "kernels/act/act.h"

#include "dsv4_config.h"
#include "kernels/act/act_generic.h"

static const struct kern_variant swiglu_variants[] = {
	KERN_ROW_CPU_REF("swiglu_cpu_ref", kern_swiglu_ref,
	                 .desc = "CPU reference: SwiGLU with the swiglu_limit clamps, row weight"),
	/* ---- generic cuda ops ---- */
	KERN_ROW_SM80("swiglu_cuda_generic", 10, kern_swiglu_cuda_generic, NULL,
	              .desc = "portable CUDA clamped SwiGLU (+ row weight), one thread per element"),
};

const struct kern_op kern_op_swiglu = {
	.name = "swiglu",
	.variants = swiglu_variants,
	.n_variants = (int)(sizeof swiglu_variants / sizeof swiglu_variants[0]),
};
