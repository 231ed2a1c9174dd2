/*
 * kernels/routing/routing.h: MoE routing of DeepSeek-V4 (dsv4.md §3.9) and
 * the grouping of (token, expert) pairs that feeds the grouped expert GEMM.
 *
 * Learned routing (layers 3.. and MTP):
 *   σ_e = sqrt(softplus(ℓ_e)) on the fp32 gate logits ℓ = y·gateᵀ;
 *   idx = top-k of σ_e + bias_e (the bias only chooses; ties: lower expert id);
 *   w_k = σ_{idx_k} / Σ_k' σ_{idx_k'} · routed_scaling_factor.
 * Hash routing (layers 0..num_hash_layers-1): idx = tid2eid[token_id], weights
 * as above from the same unbiased σ. No group limits anywhere.
 *
 * Output order of the k slots: learned routing lists experts by decreasing
 * biased score; hash routing keeps the tid2eid column order.
 *
 * Both ops are per token over a flat batch; the grouping is one pass over all
 * pairs (a GPU variant does a histogram + scan + scatter).
 */
#ifndef DSV4_KERNELS_ROUTING_ROUTING_H
#define DSV4_KERNELS_ROUTING_ROUTING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/registry/registry.h"

struct kern_route_args {
	const float *logits;     /* [n_tokens, n_experts] gate logits (fp32) */
	const float *bias;       /* [n_experts] selection bias, or NULL (hash layers: ignored) */
	const int32_t *tid2eid;  /* [vocab, top_k] hash table, or NULL for learned routing */
	const int32_t *token_ids;/* [n_tokens] token ids; required with tid2eid */
	int64_t vocab;           /* rows of tid2eid (ids are checked against it) */
	int64_t n_tokens;        /* tokens; 0 is valid */
	int n_experts;           /* E = 256 */
	int top_k;               /* 6, <= n_experts, <= KERN_ROUTE_MAX_TOPK */
	float route_scale;       /* routed_scaling_factor = 1.5 */
	int32_t *expert_ids;     /* out [n_tokens, top_k] */
	float *weights;          /* out [n_tokens, top_k] */
	void *stream;              /* cudaStream_t for CUDA variants; ignored by the CPU reference */
};

#define KERN_ROUTE_MAX_TOPK 64 /* far above the 6 (Flash) / 8 (Pro) the models use */

/* CPU reference. ST_INVALID for NULL pointers, bad sizes, a token id outside
 * [0, vocab) or a tid2eid entry outside [0, n_experts). */
enum status kern_route_ref(const struct kern_route_args *a) DSV4_WUR;

/* ---- registry ---- */

/* Signature of run / run_host of every route variant. */
typedef enum status (*kern_route_fn)(const struct kern_route_args *a);
/* The registry table of op "route" (entry 0: the CPU reference). */
extern const struct kern_op kern_op_route;

#endif
