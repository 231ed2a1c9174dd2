/*
 * kernels/hc/hc_generic.h: the portable CUDA mHC ops (kernels/hc/hc_generic.cu),
 * cc >= 8.0, same args contracts as the CPU references in hc.h:
 *   hc_prenorm_cuda_generic      mix = x·fnᵀ and Σx² per token (the op whose
 *                                unguarded DeepGEMM call broke GB10; this is
 *                                our own, runs everywhere);
 *   hc_split_cuda_generic        sigmoid / softmax / col-first Sinkhorn, HCHead;
 *   hc_pre_combine_cuda_generic  u = Σ_j pre_j X_j;
 *   hc_post_cuda_generic         X'_k = post_k f + Σ_j comb[j][k] X_j.
 * The run functions take device pointers and a cudaStream_t in a->stream;
 * the _host functions take host buffers (copy in, run, copy out, sync).
 * Present in CUDA builds only.
 */
#ifndef DSV4_KERNELS_HC_GENERIC_H
#define DSV4_KERNELS_HC_GENERIC_H

#include "kernels/hc/hc.h"

enum status kern_hc_prenorm_cuda_generic(const struct kern_hc_prenorm_args *a);
enum status kern_hc_prenorm_cuda_generic_host(const struct kern_hc_prenorm_args *a);
enum status kern_hc_split_cuda_generic(const struct kern_hc_split_args *a);
enum status kern_hc_split_cuda_generic_host(const struct kern_hc_split_args *a);
enum status kern_hc_pre_combine_cuda_generic(const struct kern_hc_pre_combine_args *a);
enum status kern_hc_pre_combine_cuda_generic_host(const struct kern_hc_pre_combine_args *a);
enum status kern_hc_post_cuda_generic(const struct kern_hc_post_args *a);
enum status kern_hc_post_cuda_generic_host(const struct kern_hc_post_args *a);

#endif
