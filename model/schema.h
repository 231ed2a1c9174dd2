/*
 * model/schema.h: the tensor set a config.json implies (dsv4.md §5.2, §5.4).
 *
 * The schema is pure: from a struct model_config it enumerates every expected
 * tensor (name, dtype, shape) in a fixed order, global tensors first, then
 * layers 0..num_hidden_layers-1 ("layers.L."), then the MTP layers
 * ("mtp.K."): the June NextN layer, or the 0731 DSpark stages (a V4
 * sliding block each; mtp.0 adds main_proj [D, D x n_targets] in the
 * mtp-projections group and main_norm, the last stage norm, hc_head_*,
 * markov_head.markov_w{1,2} [V, markov_rank] and confidence_head.proj
 * [1, D + markov_rank]). Two kinds of entries:
 *
 * - plain tensors (norms, hc_*, attn_sink, compressors, gate, embed, head):
 *   exactly one dtype and shape;
 * - linears (the projections that may be quantized): a logical [out, in]
 *   shape and the set of storage formats allowed for its group. The format is
 *   detected by the reader from the dtype of "<prefix>.weight"
 *   (model_format_of_weight_dtype), and model_schema_linear_parts() then gives
 *   the exact tensors that format consists of:
 *
 *     BF16      .weight BF16 [out, in]
 *     F32       .weight F32 [out, in]               (dequantized checkpoints)
 *     FP8       .weight F8_E4M3 [out, in] + .scale F8_E8M0 [ceil(out/bo), ceil(in/bi)],
 *               (bo, bi) = quantization_config.weight_block_size (128, 128)
 *     MXFP4     .weight I8 [out, in/2] (two e2m1 per byte) + .scale F8_E8M0 [out, in/32]
 *     NVFP4     .weight U8 [out, in/2] + .weight_scale F8_E4M3 [out, in/16]
 *               + .weight_scale_2 F32 [] + .input_scale F32 []
 *
 * Groups and their allowed formats: attention projections (incl. the
 * indexer's wq_b), shared experts and the MTP e_proj/h_proj take BF16, F32 or
 * FP8; routed experts take any of the five.
 */
#ifndef DSV4_MODEL_SCHEMA_H
#define DSV4_MODEL_SCHEMA_H

#include <stdint.h>

#include "common/status.h"
#include "model/config.h"
#include "model/safetensors.h"

/* How the weight of one linear is stored. */
enum model_weight_format {
	MODEL_FMT_NONE = 0,  /* not a linear / group absent in this layer */
	MODEL_FMT_BF16,
	MODEL_FMT_F32,       /* dequantized */
	MODEL_FMT_FP8_BLOCK, /* e4m3 with E8M0 scales per weight_block_size block (128x128) */
	MODEL_FMT_MXFP4,     /* packed e2m1, E8M0 scale per 1x32 */
	MODEL_FMT_NVFP4,     /* packed e2m1, e4m3 scale per 1x16, fp32 global scale */
	MODEL_FMT_COUNT
};

/* Which group a tensor belongs to; formats are detected and reported per
 * (layer, group). */
enum model_group {
	MODEL_GROUP_OTHER = 0,        /* plain tensors: norms, hc, embed, head, gate, compressors */
	MODEL_GROUP_ATTN,             /* wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b */
	MODEL_GROUP_SHARED_EXPERTS,   /* ffn.shared_experts.w{1,2,3} */
	MODEL_GROUP_ROUTED_EXPERTS,   /* ffn.experts.E.w{1,2,3} */
	MODEL_GROUP_MTP_PROJ,         /* mtp.K.e_proj, mtp.K.h_proj; DSpark mtp.0.main_proj */
	MODEL_GROUP_COUNT
};

/* What part of a linear a tensor is. */
enum model_tensor_role {
	MODEL_ROLE_PLAIN = 0,
	MODEL_ROLE_WEIGHT,         /* .weight */
	MODEL_ROLE_SCALE,          /* .scale (FP8, MXFP4) or .weight_scale (NVFP4) */
	MODEL_ROLE_WEIGHT_SCALE_2, /* NVFP4 per-tensor fp32 scale */
	MODEL_ROLE_INPUT_SCALE,    /* NVFP4 activation fp32 scale */
};

#define MODEL_SCHEMA_NAME_BYTES 128
#define MODEL_SCHEMA_MAX_PARTS 4

/* One expected tensor. */
struct model_schema_tensor {
	char name[MODEL_SCHEMA_NAME_BYTES];
	enum model_dtype dtype;
	int n_dims;
	int64_t shape[4];
	int layer;                 /* -1 for global tensors */
	enum model_group group;
	enum model_tensor_role role;
};

/* One expected linear; its tensors depend on the detected format. */
struct model_schema_linear {
	char prefix[MODEL_SCHEMA_NAME_BYTES - 24]; /* "layers.3.attn.wq_a"; tensors are prefix + ".weight" ... */
	int layer;
	int expert;                /* routed expert index, -1 otherwise */
	enum model_group group;
	int64_t out, in;           /* logical shape */
	uint32_t allowed;          /* bit (1u << fmt) per allowed format */
};

/* Callbacks for model_schema_walk; a non-OK return stops the walk. */
struct model_schema_visitor {
	void *ctx;
	enum status (*plain)(void *ctx, const struct model_schema_tensor *t, struct err *e);
	enum status (*linear)(void *ctx, const struct model_schema_linear *l, struct err *e);
};

/* Visit every expected tensor of cfg (which must have passed
 * model_config_parse). Returns the first non-OK callback status. */
enum status model_schema_walk(const struct model_config *cfg, const struct model_schema_visitor *v,
			      struct err *e) DSV4_WUR;

/*
 * The tensors linear l consists of when stored as fmt: fills parts[0..*n_parts)
 * (the weight first). ST_INVALID when the shape does not admit fmt (an MXFP4
 * linear whose in is not a multiple of 32, ...), naming the linear.
 */
enum status model_schema_linear_parts(const struct model_config *cfg, const struct model_schema_linear *l,
				      enum model_weight_format fmt,
				      struct model_schema_tensor parts[MODEL_SCHEMA_MAX_PARTS], int *n_parts,
				      struct err *e) DSV4_WUR;

/* The format whose .weight has dtype dt (BF16, F32, F8_E4M3 -> FP8, I8 ->
 * MXFP4, U8 -> NVFP4); MODEL_FMT_NONE for any other dtype. */
enum model_weight_format model_format_of_weight_dtype(enum model_dtype dt);

/* True for FP8, MXFP4, NVFP4. */
bool model_format_is_quantized(enum model_weight_format f);

/* Static strings: "BF16", "F32", "FP8", "MXFP4", "NVFP4", "-" (none). */
const char *model_weight_format_str(enum model_weight_format f);
const char *model_group_str(enum model_group g);

/* Name prefix of layer: "layers.L" or "mtp.K" (no trailing dot). */
void model_schema_layer_prefix(const struct model_config *cfg, int layer, char *buf, size_t n);

#endif
