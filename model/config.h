/*
 * model/config.h: config.json of DeepseekV4ForCausalLM as a typed, validated
 * struct.
 *
 * struct model_config is a plain value: no heap pointers, copyable with `=`,
 * nothing to free. Every field that dsv4.md §1.1 lists is here. Parsing
 * validates as it goes; the first missing, mistyped or inconsistent field is
 * an error whose message names the file and the field
 * ("config.json: field o_groups: 8 does not divide num_attention_heads 12").
 *
 * Required: every field that decides a tensor shape or the forward pass.
 * Optional (defaults in brackets): rope_scaling [none], quantization_config
 * [absent], expert_dtype [absent], tie_word_embeddings [false],
 * attention_bias [false], attention_dropout [0], initializer_range [0.02],
 * torch_dtype, transformers_version, model_type [""], use_cache [true].
 * Unknown keys are ignored (HF configs carry many).
 *
 * Two spellings are read: the release's (compress_ratios, num_hash_layers,
 * qk_rope_head_dim, rope_scaling) and the one transformers' DeepseekV4Config
 * writes (layer_types + compress_rates, mlp_layer_types,
 * partial_rotary_factor, rope_parameters {main, compress}); where both are
 * present they must agree. The 0731 release's dspark_* keys make the
 * compress_ratios entries past num_hidden_layers draft stages.
 */
#ifndef DSV4_MODEL_CONFIG_H
#define DSV4_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* ---- Limits (why: keep every derived size far from int64 overflow) ---- */
#define MODEL_MAX_LAYERS 512          /* num_hidden_layers + num_nextn_predict_layers */
#define MODEL_MAX_DIM 1048576         /* any width: hidden, head_dim, lora ranks, ... */
#define MODEL_MAX_VOCAB 16777216      /* 2^24 tokens */
#define MODEL_MAX_EXPERTS 65536
#define MODEL_MAX_COMPRESS_RATIO 65536 /* real HCA uses 128 */
#define MODEL_MAX_CONFIG_BYTES (16u << 20) /* a config.json is a few KiB */
#define MODEL_CONFIG_STR_BYTES 64

/* What attention a layer runs, from compress_ratios[layer]. */
enum model_attn_kind {
	MODEL_ATTN_SLIDING = 0, /* ratio 0: sliding window only */
	MODEL_ATTN_CSA = 1,     /* ratio 4: compressed sparse attention + lightning indexer */
	MODEL_ATTN_HCA = 2,     /* ratio power of two > 4: heavily compressed attention */
};

/* The draft model a checkpoint carries (dsv4-0731.md): none, the June
 * release's NextN MTP layer (mtp.0 with e_proj/h_proj/enorm/hnorm), or the
 * 0731 release's DSpark stages (mtp.0..mtp.K-1, each a sliding V4 block,
 * main_proj/main_norm on the first, the heads on the last). The config gives
 * the kind and at most how many stages; the checkpoint reader settles the
 * count from the tensors present (model_config_set_draft_stages). */
enum model_draft_kind {
	MODEL_DRAFT_NONE = 0,
	MODEL_DRAFT_MTP = 1,
	MODEL_DRAFT_DSPARK = 2,
};

#define MODEL_MAX_DRAFT_LAYERS 16
#define MODEL_MAX_DSPARK_TARGETS 16

/* The dspark_* keys of the 0731 config (all four present or none). */
struct model_dspark_config {
	bool present;
	int64_t block_size;      /* tokens per draft block (5) */
	int64_t noise_token_id;  /* fills the block after the anchor (128799) */
	int64_t markov_rank;     /* rank of the Markov head (256) */
	int n_target_layers;     /* entries of dspark_target_layer_ids (3) */
	int64_t target_layer_ids[MODEL_MAX_DSPARK_TARGETS]; /* main layers whose outputs feed main_proj (40, 41, 42) */
};

enum model_rope_scaling_type {
	MODEL_ROPE_SCALING_NONE = 0,
	MODEL_ROPE_SCALING_YARN = 1,
};

/* Top-level "expert_dtype" (present in some revisions only, dsv4.md §1.1). */
enum model_expert_dtype {
	MODEL_EXPERT_DTYPE_ABSENT = 0,
	MODEL_EXPERT_DTYPE_FP4 = 1,
	MODEL_EXPERT_DTYPE_FP8 = 2,
	MODEL_EXPERT_DTYPE_BF16 = 3,
};

struct model_rope_scaling {
	enum model_rope_scaling_type type;
	double factor;                           /* context extension factor (16) */
	int64_t original_max_position_embeddings; /* tokens (65536) */
	double beta_fast, beta_slow;             /* YaRN ramp bounds, in rotations (32, 1) */
};

/*
 * quantization_config. Only quant_method "fp8" with fmt "e4m3" exists for
 * this model (the NVFP4 release keeps quant_method "fp8" as a compat flag and
 * adds moe_quant_algo "NVFP4"). The pattern lists (quantized_layers, ignore)
 * are informational: formats are detected from tensor dtypes per group
 * (model/schema.h), so only their sizes and whether "mtp.*" is ignored are kept.
 */
struct model_quant_config {
	bool present;
	char quant_method[MODEL_CONFIG_STR_BYTES];      /* "fp8" */
	char fmt[MODEL_CONFIG_STR_BYTES];               /* "e4m3" */
	char scale_fmt[MODEL_CONFIG_STR_BYTES];         /* "ue8m0" or "" when absent */
	char activation_scheme[MODEL_CONFIG_STR_BYTES]; /* "dynamic" or "" */
	int64_t weight_block_size[2];                   /* [out, in] elements per scale (128, 128) */
	char quant_algo[MODEL_CONFIG_STR_BYTES];        /* "MIXED_PRECISION" or "" */
	char moe_quant_algo[MODEL_CONFIG_STR_BYTES];    /* "NVFP4" or "" */
	bool moe_nvfp4;                                 /* moe_quant_algo == "NVFP4" */
	int64_t group_size;                             /* NVFP4 elements per scale (16), 0 if absent */
	int n_quantized_layers;                         /* entries of quantized_layers */
	int n_ignore;                                   /* entries of ignore */
	bool ignore_mtp;                                /* an ignore pattern matches "mtp.0.x" */
	bool quantized_mtp;                             /* a quantized_layers pattern matches mtp.0's experts */
};

struct model_config {
	/* identity */
	char architecture[MODEL_CONFIG_STR_BYTES]; /* "DeepseekV4ForCausalLM" */
	char model_type[MODEL_CONFIG_STR_BYTES];   /* "deepseek_v4" or "" */
	char torch_dtype[MODEL_CONFIG_STR_BYTES];  /* "bfloat16" or "" */
	char transformers_version[MODEL_CONFIG_STR_BYTES];

	/* sizes */
	int64_t vocab_size;          /* tokens */
	int64_t hidden_size;         /* D */
	int64_t num_hidden_layers;   /* main decoder layers */
	int64_t num_nextn_predict_layers; /* MTP layers (checkpoint prefix mtp.K.) */
	int64_t num_attention_heads; /* H */
	int64_t num_key_value_heads; /* 1: one shared K=V head */
	int64_t head_dim;            /* d, for q, k and v */
	int64_t qk_rope_head_dim;    /* rope dims, the last ones of each head */
	int64_t q_lora_rank;
	int64_t o_groups;
	int64_t o_lora_rank;
	int64_t max_position_embeddings; /* tokens */

	/* MoE */
	int64_t moe_intermediate_size;
	int64_t n_routed_experts;
	int64_t n_shared_experts;
	int64_t num_experts_per_tok;
	int64_t num_hash_layers;     /* layers [0, num_hash_layers) route by tid2eid */
	char scoring_func[MODEL_CONFIG_STR_BYTES]; /* "sqrtsoftplus" */
	char topk_method[MODEL_CONFIG_STR_BYTES];  /* "noaux_tc" */
	char hidden_act[MODEL_CONFIG_STR_BYTES];   /* "silu" */
	bool norm_topk_prob;
	double routed_scaling_factor;
	double swiglu_limit;

	/* attention */
	int64_t sliding_window;      /* tokens, the current one included */
	int n_layers_total;          /* num_hidden_layers + n_draft_layers */
	int32_t compress_ratios[MODEL_MAX_LAYERS]; /* [n_layers_total]; index i = layer i, draft layers last */
	int n_compress_ratios;       /* entries the config gave (extra ones beyond the layers are ignored) */
	double rope_theta;           /* sliding-only layers */
	double compress_rope_theta;  /* CSA/HCA layers */
	struct model_rope_scaling rope_scaling;
	int64_t index_n_heads;       /* lightning indexer */
	int64_t index_head_dim;
	int64_t index_topk;          /* compressed rows kept per query */

	/* hyper-connections and norms */
	int64_t hc_mult;             /* residual streams */
	int64_t hc_sinkhorn_iters;
	double hc_eps;
	double rms_norm_eps;

	/* tokens, misc */
	int64_t bos_token_id, eos_token_id;
	bool tie_word_embeddings;
	bool attention_bias;
	double attention_dropout;
	double initializer_range;
	bool use_cache;

	/* quantization */
	struct model_quant_config quant;
	enum model_expert_dtype expert_dtype;

	/* draft model (layers [num_hidden_layers, n_layers_total), prefix "mtp.K.") */
	enum model_draft_kind draft_kind;
	int n_draft_layers;          /* MTP: num_nextn_predict_layers; DSpark: stages; settled from tensors */
	int n_draft_layers_max;      /* what the config allows (compress_ratios entries past the main layers) */
	struct model_dspark_config dspark;
	bool hf_style;               /* transformers' key set (layer_types, rope_parameters, ...) was read */
};

/*
 * Parse and validate config.json held in json[0..n_bytes) (need not be
 * NUL-terminated). file_name is used only in messages. On success fills *out
 * and returns ST_OK; on failure returns ST_INVALID (bad or inconsistent
 * field), ST_UNSUPPORTED (valid but not this model, e.g. another
 * architecture) or ST_NOMEM, with e naming file and field. *out is
 * unspecified on failure.
 */
enum status model_config_parse(const char *json, size_t n_bytes, const char *file_name,
			       struct model_config *out, struct err *e) DSV4_WUR;

/* Read the file at path (ST_IO / ST_NOTFOUND if it cannot) and parse it. */
enum status model_config_load(const char *path, struct model_config *out, struct err *e) DSV4_WUR;

/*
 * Settle the draft model from the checkpoint's tensors: n_stages is one more
 * than the highest K of the "mtp.K." names present (0: none), dspark_layout
 * whether mtp.0.main_proj.weight is among them (the 0731 layout) and
 * mtp_layout whether mtp.0.e_proj.weight is (June). Sets draft_kind,
 * n_draft_layers and n_layers_total. ST_INVALID naming file and tensor / field
 * when config and tensors disagree (DSpark tensors without the dspark_* keys,
 * more stages than compress_ratios has entries, ...).
 */
enum status model_config_set_draft_stages(struct model_config *cfg, int n_stages, bool dspark_layout,
					  bool mtp_layout, const char *file, struct err *e) DSV4_WUR;

/* Layer kind of layer (0 <= layer < n_layers_total). */
enum model_attn_kind model_config_attn_kind(const struct model_config *cfg, int layer);

/* True for layers [0, num_hash_layers) of the main stack (never MTP). */
bool model_config_is_hash_layer(const struct model_config *cfg, int layer);

/* True when layer >= num_hidden_layers (a draft layer: NextN MTP or a DSpark stage). */
bool model_config_is_mtp_layer(const struct model_config *cfg, int layer);

/* True for a DSpark stage (a draft layer of a MODEL_DRAFT_DSPARK config). */
bool model_config_is_dspark_layer(const struct model_config *cfg, int layer);

/* "none", "mtp", "dspark". Static. */
const char *model_draft_kind_str(enum model_draft_kind k);

/* "sliding", "CSA", "HCA". Static. */
const char *model_attn_kind_str(enum model_attn_kind k);
const char *model_expert_dtype_str(enum model_expert_dtype d);

#endif
