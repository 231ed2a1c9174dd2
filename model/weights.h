/*
 * model/weights.h: the kernel plan of the forward pass and the per-layer
 * weights that follow it.
 *
 * Two steps, one selection code path (design.md "Load time is where
 * decisions are made"):
 *   1. model_plan_build(): from a config, the stored format of every weight
 *      group per layer (struct model_layer_formats) and the shapes this rank
 *      runs, choose the kernel variant of every op of every layer (kern_select
 *      for each linear site, the routed experts' GEMMs and the weight-free
 *      ops). Needs no tensor: `dsv4 kernels` plans from config.json alone
 *      (model_formats_from_config) for any simulated device.
 *   2. model_weights_load(): formats from the checkpoint
 *      (model_formats_from_checkpoint), step 1, then every weight of a layer
 *      as a kern_wmat view into the mmapped checkpoint, converted by the
 *      chosen variant's prepare() (kern_prepare_weight). The hot path reads
 *      only the resulting structs.
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
 * replicated. The plan is made for the local shapes, which are the same on
 * every rank. docs/forward.md "Tensor parallelism".
 */
#ifndef DSV4_MODEL_WEIGHTS_H
#define DSV4_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/device/mem.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"

#define MODEL_MAX_O_GROUPS 64

/* ---- the kernel plan (step 1) ---- */

/* The stored format of every weight group of one layer (model/schema.h
 * groups; MODEL_FMT_NONE where the layer has no such group, e.g. the MTP
 * projections of a main layer). Arrays of these are [cfg->n_layers_total]. */
struct model_layer_formats {
	enum model_weight_format group[MODEL_GROUP_COUNT];
};

/* The linear sites of a layer, in plan order. WO_A is one o_group's rows
 * (every group has the same shape and variant); EXP_W13 / EXP_W2 are the
 * routed experts' w1,w3 and w2 GEMMs (op moe_gemm); the others op linear. */
enum model_lin_site {
	MODEL_LIN_WQ_A, MODEL_LIN_WQ_B, MODEL_LIN_WKV, MODEL_LIN_WO_A, MODEL_LIN_WO_B,
	MODEL_LIN_CMP_WKV, MODEL_LIN_CMP_WGATE,                        /* ratio != 0 */
	MODEL_LIN_IDX_WQ_B, MODEL_LIN_IDX_WPROJ, MODEL_LIN_IDX_CMP_WKV, /* CSA */
	MODEL_LIN_IDX_CMP_WGATE,
	MODEL_LIN_GATE, MODEL_LIN_SH_W1, MODEL_LIN_SH_W3, MODEL_LIN_SH_W2,
	MODEL_LIN_EXP_W13, MODEL_LIN_EXP_W2,
	MODEL_LIN_E_PROJ, MODEL_LIN_H_PROJ,                            /* MTP */
	MODEL_LIN_COUNT
};

/* The weight-free ops of a layer, in plan order. */
enum model_layer_op {
	MODEL_OP_RMSNORM, MODEL_OP_ROPE, MODEL_OP_HC_PRENORM, MODEL_OP_HC_SPLIT, MODEL_OP_HC_PRE_COMBINE,
	MODEL_OP_HC_POST, MODEL_OP_ATTN_INDEX, MODEL_OP_SPARSE_ATTN,
	MODEL_OP_COMPRESSOR,                           /* ratio != 0 */
	MODEL_OP_INDEXER_ROTATE, MODEL_OP_INDEXER_TOPK, /* CSA */
	MODEL_OP_ROUTE, MODEL_OP_SWIGLU,
	MODEL_OP_COUNT
};

/* The ops that move data rather than compute a layer's numerics, selected
 * once for the device (plan rows at layer -1) and shared by every layer:
 * what the forward pass would otherwise do with host loops (design.md "one
 * forward pass for every backend: data movement is an op too"). */
enum model_global_op {
	MODEL_GOP_EMBED, MODEL_GOP_COPY_ROWS, MODEL_GOP_BLOCK_COPY, MODEL_GOP_BLOCK_FILL, MODEL_GOP_ROUND_BF16,
	MODEL_GOP_ADD, MODEL_GOP_ACT_QUANT_SIM, MODEL_GOP_RING_WRITE, MODEL_GOP_MOE_DISPATCH,
	MODEL_GOP_MOE_ROW_WEIGHT, MODEL_GOP_MOE_COMBINE, MODEL_GOP_SAMPLE, MODEL_GOP_TOKEN_LOGPROBS,
	MODEL_GOP_COUNT
};

/* One selection of a weighted op. */
struct model_lin_plan {
	const struct kern_variant *v; /* NULL: the layer has no such site */
	const struct kern_op *op;     /* &kern_op_linear or &kern_op_moe_gemm */
	enum kern_wfmt wfmt;          /* the stored format v was chosen for */
	int64_t out, in;              /* this rank's logical [out, in] */
	int act_quant_block;          /* 128 or 0, as struct model_lin */
	/* Steps of at most dec_tokens tokens run v_dec, a variant chosen for a
	 * decode-sized step (the portable GEMV where a tile kernel takes the
	 * plan): only when it consumes the layout v's prepare() makes, so one
	 * copy of the weight serves both. NULL: v runs every step. */
	const struct kern_variant *v_dec;
	int64_t dec_tokens;
};

struct model_layer_plan {
	int layer;
	enum model_attn_kind kind;
	int ratio;
	bool hash, mtp;                /* mtp: the NextN MTP layer */
	bool dspark;                   /* a DSpark draft stage (planned only, issue 16 runs it) */
	struct model_lin_plan lin[MODEL_LIN_COUNT];
	const struct kern_variant *op[MODEL_OP_COUNT]; /* NULL where the layer does not run the op */
	const struct kern_variant *moe_dec; /* moe-decode: op moe_decode for steps of <= 64 tokens, or NULL
					     * (no GPU variant fits: the unfused expert ops run) */
};

struct model_plan {
	int n_layers, n_mtp;             /* main layers; MTP layers planned (0 or 1) */
	int n_dspark;                    /* DSpark stages planned after them (plan_dspark), not loaded */
	struct model_layer_plan *layers; /* owned [n_layers + n_mtp + n_dspark] */
	struct model_lin_plan dspark_main_proj; /* mtp.0.main_proj when n_dspark */
	struct model_lin_plan head;      /* lm_head, layer -1 */
	const struct kern_variant *gop[MODEL_GOP_COUNT]; /* layer -1 */
	struct kern_plan rows;           /* distinct (layer, op, variant), in plan order */
};

struct model_plan_options {
	const struct kern_device *dev;        /* NULL: the CPU */
	const struct kern_disabled *disabled; /* NULL: none */
	int64_t max_step_tokens;              /* for the GEMM shape guards */
	bool quant_sim;                       /* act_quant before FP8/FP4 GEMMs */
	bool load_mtp;                        /* plan the NextN MTP layer (June layout) */
	bool plan_dspark;                     /* plan the DSpark stages too (0731 layout; dsv4 kernels) */
	int world_size;                       /* must divide heads, o_groups, experts, moe_intermediate_size, vocab */
	bool selfcheck;                       /* --kernel-selfcheck: check each non-reference pick against
					       * the CPU reference on a small random input; a variant that
					       * disagrees is dropped and the next one chosen, loudly */
};

/* Formats of a validated checkpoint, fmts[cfg->n_layers_total]. */
void model_formats_from_checkpoint(const struct model_checkpoint *ck, struct model_layer_formats *fmts);

/* The formats config.json alone implies, fmts[cfg->n_layers_total], the way
 * the releases are stored (dsv4.md §1.1, §5.3, §5.4): no
 * quantization_config: BF16 everywhere; with one: attention, shared experts
 * and MTP projections FP8 (128x128 E8M0 blocks), routed experts by
 * expert_dtype (fp8: FP8, bf16: BF16, fp4 or absent: MXFP4) unless
 * moe_quant_algo is NVFP4 (then NVFP4, except MXFP4 in MTP layers when
 * quantization_config.ignore excludes mtp.*). A dequantized (F32)
 * checkpoint is indistinguishable from BF16 here. ST_INVALID when
 * expert_dtype asks for quantized experts without a quantization_config. */
enum status model_formats_from_config(const struct model_config *cfg, struct model_layer_formats *fmts,
				      struct err *e) DSV4_WUR;

/* Select every op of every layer (and the head) for opt->dev. The first
 * failure names the layer, the site ("layers.3.attn.wq_a") and op, and every
 * variant's reason (kern_select). *out is the caller's (model_plan_free)
 * on success and empty on failure. */
enum status model_plan_build(const struct model_config *cfg, const struct model_layer_formats *fmts,
			     const struct model_plan_options *opt, struct model_plan *out, struct err *e) DSV4_WUR;
void model_plan_free(struct model_plan *p);

/* "head: linear[bf16]=...\nlayer 3 (HCA): linear[fp8_e8m0_b128]=... moe_gemm[mxfp4]=... rmsnorm=..."
 * one line per layer into buf (NUL-terminated, truncated to n); returns the
 * length needed. */
size_t model_plan_str(const struct model_plan *p, char *buf, size_t n);

/* Static names: "attn.wq_a", "ffn.experts.w1,w3", ...; the op of a layer op. */
const char *model_lin_site_name(enum model_lin_site s);
const struct kern_op *model_layer_op_kern(enum model_layer_op o);
const struct kern_op *model_global_op_kern(enum model_global_op o);

/* ---- the weights (step 2) ---- */

/* One linear: its weight view, the variant that runs it, and the
 * activation quantization block the reference applies before it (128 for
 * FP8/FP4 weights when the quantization simulation is on, else 0). */
struct model_lin {
	struct kern_wmat w;
	const struct kern_variant *v;
	kern_linear_fn run;
	int act_quant_block;
	kern_linear_fn run_dec;       /* steps of <= dec_tokens tokens (model_lin_plan.v_dec), or NULL */
	int64_t dec_tokens;
};

/* The routed experts of one layer: arrays [n_experts] of views, one GEMM
 * variant per projection. */
struct model_experts {
	struct kern_wmat *w1, *w3, *w2; /* owned arrays of views */
	struct kern_wmat *w1_dev, *w3_dev, *w2_dev; /* after model_weights_upload: device copies of the
						     * three arrays (moe_gemm's w_dev); NULL on the host */
	const struct kern_variant *v13, *v2;
	kern_moe_gemm_fn run13, run2;
	int act_quant_block;
	const struct kern_variant *vdec; /* moe-decode: the plan's moe_dec (NULL: none) */
	kern_moe_decode_fn run_dec;
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
	kern_swiglu_fn swiglu;
};

/* The run pointers of the plan's global ops (enum model_global_op). */
struct model_global_ops {
	kern_embed_fn embed;
	kern_copy_rows_fn copy_rows;
	kern_block_copy_fn block_copy;
	kern_block_fill_fn block_fill;
	kern_round_bf16_fn round_bf16;
	kern_add_fn add;
	kern_act_quant_sim_fn act_quant_sim;
	kern_ring_write_fn ring_write;
	kern_moe_dispatch_fn moe_dispatch;
	kern_moe_row_weight_fn moe_row_weight;
	kern_moe_combine_fn moe_combine;
	kern_sample_batch_fn sample;
	kern_token_logprobs_fn token_logprobs;
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

	/* MTP only (a DSpark last stage uses mtp_norm and mtp_hc_head for its head too) */
	struct model_lin e_proj, h_proj;
	const uint16_t *enorm, *hnorm, *mtp_norm;
	struct model_hc mtp_hc_head;
	/* DSpark stages (model/dspark.h): main_proj/main_norm on stage 0, the
	 * Markov head (bf16 [vocab, rank] each) on the last one */
	bool dspark;
	struct model_lin main_proj;
	const uint16_t *main_norm, *markov_w1, *markov_w2;
};

struct model_weights {
	const struct model_config *cfg; /* the checkpoint's */
	int n_layers;                   /* main layers */
	int n_mtp;                      /* MTP layers loaded (0 or 1) */
	struct model_layer *layers;     /* [n_layers + n_mtp + n_dspark] */
	int n_dspark;                   /* DSpark stages loaded (load_mtp on a 0731 checkpoint), host only */
	const uint16_t *embed;          /* bf16 [vocab_local, D]: this rank's rows [vocab_begin, +vocab_local) */
	struct model_lin head;          /* bf16 [vocab_local, D] rows of this rank, fp32 GEMM */
	const uint16_t *norm;           /* bf16 [D] */
	struct model_hc hc_head;
	/* tensor parallelism: this rank's share (everything else is replicated) */
	int rank, world_size;
	int64_t n_heads_local;   /* attention heads [rank·n, (rank+1)·n) */
	int64_t n_groups_local;  /* o_groups likewise */
	int64_t expert_begin, n_experts_local; /* routed experts [begin, begin+n) */
	int64_t vocab_begin, vocab_local;      /* embedding / lm_head rows */
	struct model_global_ops gops;   /* layer -1 ops */
	struct kern_plan plan;          /* the plan's rows (for logs and /metrics) */
	struct model_plan kernels;      /* the selections (its rows moved to plan) */
	void **owned;                   /* aligned copies of misaligned tensors */
	int n_owned, cap_owned;
	/* after model_weights_upload: every pointer above (views, norms, tables,
	 * expert arrays) is device memory of mem, owned through dev_owned */
	bool on_device;
	struct kern_mem mem;
	uint64_t device_bytes;          /* bytes uploaded */
	void **dev_owned;
	int n_dev_owned, cap_dev_owned;
};

struct model_weights_options {
	const struct model_checkpoint *ck;     /* borrowed; must outlive the weights */
	const struct kern_device *dev;          /* NULL: the CPU */
	const struct kern_disabled *disabled;   /* NULL: none */
	int64_t max_step_tokens;                /* for the GEMM shape guards */
	bool quant_sim;                         /* act_quant before FP8/FP4 GEMMs */
	bool load_mtp;                          /* the draft model: the NextN MTP layer, or the DSpark stages */
	int rank, world_size;                   /* tensor parallel; world_size must divide heads,
						 * o_groups, experts and the vocabulary */
	bool selfcheck;                         /* model_plan_options.selfcheck */
};

enum status model_weights_load(struct model_weights *w, const struct model_weights_options *opt,
			       struct err *e) DSV4_WUR;
void model_weights_free(struct model_weights *w);

/* Move the loaded weights to mem's device: every tensor the plan's variants
 * read is copied once (in the layout prepare() produced), the host copies
 * that the weights own are freed, and every pointer in w then points to
 * device memory (design.md "Load time": weights are converted at load into
 * what the chosen kernel consumes). Logs the bytes and the rate. A no-op for
 * host memory. On failure part of w may already point to the device: the
 * caller frees it with model_weights_free, which handles that. */
enum status model_weights_upload(struct model_weights *w, const struct kern_mem *mem, struct err *e) DSV4_WUR;

/* Bytes of device scratch the plan's linear variants need for steps of up to
 * max_tokens tokens (one buffer, shared by every linear: they run one at a
 * time on the executor's stream); 0 when none needs any. */
size_t model_weights_linear_workspace_bytes(const struct model_weights *w, int64_t max_tokens);

/* model_plan_str of the weights' plan. */
size_t model_weights_plan_str(const struct model_weights *w, char *buf, size_t n);

#endif
