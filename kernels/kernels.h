/*
 * kernels/kernels.h: the kernels module's umbrella header. Including it gives
 * the device description, the number formats, the registry, and every op's
 * args struct, reference and variant table.
 *
 * Ops of the kernels-model-ops component add their headers in their block.
 */
#ifndef DSV4_KERNELS_KERNELS_H
#define DSV4_KERNELS_KERNELS_H

#include "kernels/device/device.h"
#include "kernels/quant/quant.h"
#include "kernels/quant/wmat.h"
#include "kernels/registry/registry.h"

/* ---- kernels-linear ---- */
#include "kernels/linear/linear.h"
#include "kernels/moe_gemm/moe_dispatch.h"
#include "kernels/moe_gemm/moe_gemm.h"

/* ---- kernels-model-ops ---- */
#include "kernels/norm/norm.h"
#include "kernels/rope/rope.h"
#include "kernels/hc/hc.h"
#include "kernels/attention/attention.h"
#include "kernels/compressor/compressor.h"
#include "kernels/indexer/indexer.h"
#include "kernels/routing/routing.h"
#include "kernels/act/act.h"

/* ---- gpu-ops ---- */
#include "kernels/movement/movement.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/logprobs.h"
/* ---- prefill-kernels (CUDA builds define the functions) ---- */
#include "kernels/device/ctx.h"
#include "kernels/linear/linear_mma.h"
#include "kernels/moe_gemm/moe_gemm_mma.h"
/* ---- moe-decode ---- */
#include "kernels/moe_gemm/moe_decode.h"

#endif
