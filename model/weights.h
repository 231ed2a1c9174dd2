/*
 * model/weights.h: the per-layer plan of the forward pass: every weight of a
 * layer as a kern_wmat view into the mmapped checkpoint (or the buffer a
 * chosen variant's prepare() made), and the kernel variant chosen for every
 * op of that layer, selected once at load (design.md "Load time is where
 * decisions are made"). The hot path reads only these structs.
 *
 * Nothing here dequantizes: FP8 / MXFP4 / NVFP4 weights reach the kernels in
 * their stored formats (kernels/quant/wmat.h); the CPU reference variants
 * read them directly, so their views point into the mapping.
 *
 * Tensor parallelism: with world size w, rank r keeps views of its slices
 * only: heads [r·H/w, …) of wq_b and attn_sink, o_groups [r·G/w, …) of
 * wo_a, the matching columns of wo_b (a copy at load), routed experts
 * [r·E/w, …), the shared expert's intermediate rows of w1/w3 and columns of
 * w2 (a copy), vocabulary rows [r·V/w, …) of embed and head. Everything else
 * (wq_a, wkv, compressors, indexer, router, mHC, norms, MTP projections) is
 * replicated. docs/forward.md "Tensor parallelism".
 */
#ifndef DSV4_MODEL_WEIGHTS_H
#define DSV4_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"

#define MODEL_MAX_O_GROUPS 64

/* One linear: its weight view, the variant that runs it, and the
 * activation quantization block the reference applies before it (128 for
 * FP8/FP4 weights when the quantization simulation is on, else 0). */
struct model_lin {
	struct kern_wmat w;
	const struct kern_variant *v;
	kern_linear_fn run;
	int act_quant_block;
};

/* The routed experts of one layer: arrays [n_experts] of views, one GEMM
 * variant per projection. */
struct model_experts {
	struct kern_wmat *w1, *w3, *w2; /* owned arrays of views */
	const struct kern_variant *v13, *v2;
	kern_moe_gemm_fn run13, run2;
	int act_quant_block;
};

/* The ops without weights, selected per layer (all CPU references today). */
struct model_layer_ops {
	kern_rmsnorm_fn rmsnorm;
	kern_rope_fn rope;
	kern_hc_prenorm_fn hc_prenorm;
	kern_hc_split_fn hc_split;
	kern_hc_pre_combine_fn hc_pre_combine;
	kern_hc_post_fn hc_post;
	kern_sparse_attn_fn sparse_attn;
	kern_attn_index_fn attn_index;
	kern_compressor_fn compressor;
	kern_indexer_rotate_fn indexer_rotate;
	kern_indexer_topk_fn indexer_topk;
	kern_route_fn route;
	kern_moe_group_fn moe_group;
	kern_swiglu_fn swiglu;
};

/* mHC parameters of one site (attn, ffn or head). */
struct model_hc {
	const float *fn;    /* [n_out, n*D] */
	const float *base;  /* [n_out] */
	const float *scale; /* [3] or [1] (head) */
};

struct model_layer {
	int layer;                /* 0..n_layers_total-1 (MTP last) */
	enum model_attn_kind kind;
	int ratio;                /* 0, 4, or the HCA ratio */
	bool hash;                /* tid2eid routing */
	bool mtp;
	struct model_layer_ops ops;

	const uint16_t *attn_norm, *ffn_norm; /* bf16 [D] */
	struct model_hc hc_attn, hc_ffn;

	/* attention */
	struct model_lin wq_a, wq_b, wkv, wo_b;
	struct model_lin wo_a[MODEL_MAX_O_GROUPS]; /* row views of wo_a, one per group */
	const uint16_t *q_norm, *kv_norm;
	const float *attn_sink;   /* [H] */
	float *omega;             /* owned [rope_dim/2]: θ 1e4 plain, or compress θ + YaRN */

	/* compressor (CSA, HCA) */
	struct model_lin cmp_wkv, cmp_wgate;
	const float *cmp_ape;     /* [m, c*d] */
	const uint16_t *cmp_norm; /* [d] */
	/* lightning indexer (CSA) */
	struct model_lin idx_wq_b, idx_wproj, idx_cmp_wkv, idx_cmp_wgate;
	const float *idx_cmp_ape;
	const uint16_t *idx_cmp_norm;

	/* MoE */
	struct model_lin gate;    /* fp32 GEMM of bf16 weights */
	const float *gate_bias;   /* [E] or NULL (hash layers) */
	int32_t *tid2eid;         /* owned [vocab, k] (int64 in the checkpoint) or NULL */
	struct model_experts experts; /* this rank's experts only: index k is expert expert_begin + k */
	struct model_lin sh_w1, sh_w3, sh_w2;

	/* MTP only */
	struct model_lin e_proj, h_proj;
	const uint16_t *enorm, *hnorm, *mtp_norm;
	struct model_hc mtp_hc_head;
};

struct model_weights {
	const struct model_config *cfg; /* the checkpoint's */
	int n_layers;                   /* main layers */
	int n_mtp;                      /* MTP layers loaded (0 or 1) */
	struct model_layer *layers;     /* [n_layers + n_mtp] */
	const uint16_t *embed;          /* bf16 [vocab, D] */
	struct model_lin head;          /* bf16 [vocab_local, D] rows of this rank, fp32 GEMM */
	const uint16_t *norm;           /* bf16 [D] */
	struct model_hc hc_head;
	/* tensor parallelism: this rank's share (everything else is replicated) */
	int rank, world_size;
	int64_t n_heads_local;   /* attention heads [rank·n, (rank+1)·n) */
	int64_t n_groups_local;  /* o_groups likewise */
	int64_t expert_begin, n_experts_local; /* routed experts [begin, begin+n) */
	int64_t vocab_begin, vocab_local;      /* embedding / lm_head rows */
	struct kern_plan plan;
	void **owned;                   /* aligned copies of misaligned tensors */
	int n_owned, cap_owned;
};

struct model_weights_options {
	const struct model_checkpoint *ck;     /* borrowed; must outlive the weights */
	const struct kern_device *dev;          /* NULL: the CPU */
	const struct kern_disabled *disabled;   /* NULL: none */
	int64_t max_step_tokens;                /* for the GEMM shape guards */
	bool quant_sim;                         /* act_quant before FP8/FP4 GEMMs */
	bool load_mtp;
	int rank, world_size;                   /* tensor parallel; world_size must divide heads,
						 * o_groups, experts and the vocabulary */
};

enum status model_weights_load(struct model_weights *w, const struct model_weights_options *opt,
			       struct err *e) DSV4_WUR;
void model_weights_free(struct model_weights *w);

/* "layer 3: linear=linear_cpu_ref moe_gemm=... " per layer into buf; returns
 * the length needed. */
size_t model_weights_plan_str(const struct model_weights *w, char *buf, size_t n);

#endif
