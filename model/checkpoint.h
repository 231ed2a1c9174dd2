/*
 * model/checkpoint.h: a DeepSeek-V4 checkpoint directory, opened, mapped and
 * validated.
 *
 * model_checkpoint_create() reads config.json and model.safetensors.index.json
 * (or a single model.safetensors), maps every shard read-only and checks,
 * before returning, that:
 *   - every shard header is well formed (model/safetensors.h);
 *   - the index and the shards agree: no shard missing, no tensor listed in
 *     the index but absent from its shard, none in a shard but not in the
 *     index (or in another shard than the index says), and metadata.total_size
 *     equals the sum of the tensor bytes when it is given;
 *   - the tensor set is exactly what config.json implies (model/schema.h):
 *     no tensor missing, none unknown, every dtype and shape as expected, the
 *     storage format of each linear detected from its dtype, consistent within
 *     each (layer, group), and consistent with quantization_config and
 *     expert_dtype.
 * The first problem found is the error, naming the file and the tensor.
 *
 * Ownership: the checkpoint owns the mappings, the config and every
 * struct model_tensor; pointers returned by the accessors stay valid until
 * model_checkpoint_destroy(). Tensor data is never copied: `data` points into
 * a PROT_READ mapping (writing through it faults). A created checkpoint is
 * immutable, so its accessors may be called from any number of threads.
 */
#ifndef DSV4_MODEL_CHECKPOINT_H
#define DSV4_MODEL_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/schema.h"

#define MODEL_CKPT_MAX_SHARDS 4096
#define MODEL_CKPT_MAX_TENSORS (1u << 22)     /* the real checkpoint has 69,187 */
#define MODEL_CKPT_MAX_INDEX_BYTES (256u << 20) /* the real index is ~6 MB */

struct model_checkpoint;

/* --load-format: auto and safetensors read the shards; dummy needs config.json
 * only and fills every tensor the schema lists with deterministic random
 * values (model/dummy.h). */
enum model_load_format {
	MODEL_LOAD_AUTO = 0,
	MODEL_LOAD_SAFETENSORS,
	MODEL_LOAD_DUMMY,
};

struct model_checkpoint_options {
	const char *dir; /* the checkpoint directory (config.json, index, shards) */
	enum model_load_format load_format;
	const char *hf_overrides; /* JSON object merged into config.json before validation, or NULL */
	uint64_t dummy_seed;      /* MODEL_LOAD_DUMMY: the values' seed */
	bool dummy_no_fill;       /* MODEL_LOAD_DUMMY: leave the data zero (inspect, plans; or a device
				   * loader that generates each tensor itself: model/dummy.h) */
};

/* "auto", "safetensors", "dummy" -> *out; false for anything else. */
bool model_load_format_parse(const char *s, enum model_load_format *out);

/* One tensor of the checkpoint. Owned by the checkpoint. */
struct model_tensor {
	const char *name;             /* "layers.3.attn.wq_a.weight" */
	enum model_dtype dtype;
	int n_dims;                   /* 0 for a scalar */
	int64_t shape[MODEL_MAX_DIMS];
	uint64_t n_elements;
	uint64_t n_bytes;             /* n_elements * model_dtype_bytes(dtype) */
	const void *data;             /* into the read-only mapping; aligned only as the file is */
	uint64_t file_offset_bytes;   /* absolute offset of data in its shard file */
	int shard;                    /* model_checkpoint_shard_path(ck, shard) */
	int layer;                    /* -1 global, 0..n_layers_total-1 (MTP layers last) */
	enum model_group group;       /* MODEL_GROUP_OTHER for plain tensors */
	enum model_tensor_role role;
	enum model_weight_format format; /* format of its linear; MODEL_FMT_NONE for plain tensors */
};

/* A linear's tensors, by format (see model/schema.h for the layouts). */
struct model_linear {
	enum model_weight_format format;
	int64_t out, in;                        /* logical shape of W in y = x W^T */
	const struct model_tensor *weight;      /* always set */
	const struct model_tensor *scale;       /* FP8/MXFP4 .scale, NVFP4 .weight_scale; else NULL */
	const struct model_tensor *scale_2;     /* NVFP4 .weight_scale_2 (F32 scalar); else NULL */
	const struct model_tensor *input_scale; /* NVFP4 .input_scale (F32 scalar); else NULL */
};

/*
 * Open and validate the checkpoint in opt->dir. On success *out is the
 * caller's (model_checkpoint_destroy). Errors: ST_NOTFOUND (config.json,
 * the index or a shard is missing), ST_IO (unreadable, mmap failed),
 * ST_INVALID (malformed or inconsistent), ST_UNSUPPORTED (valid, but not a
 * model this program runs), ST_NOMEM; e names the file and tensor.
 */
enum status model_checkpoint_create(struct model_checkpoint **out, const struct model_checkpoint_options *opt,
				    struct err *e) DSV4_WUR;

/* Unmap and free everything. NULL is a no-op. */
void model_checkpoint_destroy(struct model_checkpoint *ck);

/* The validated config (borrowed). */
const struct model_config *model_checkpoint_config(const struct model_checkpoint *ck);

/* The tensor called name, or NULL (borrowed). O(1). */
const struct model_tensor *model_checkpoint_tensor(const struct model_checkpoint *ck, const char *name);

/* All tensors, in index order (a single-file checkpoint: header order), i in [0, n). */
size_t model_checkpoint_n_tensors(const struct model_checkpoint *ck);
const struct model_tensor *model_checkpoint_tensor_at(const struct model_checkpoint *ck, size_t i);

/*
 * The linear whose tensors are prefix + ".weight", ".scale", ... (prefix as
 * in "layers.3.attn.wq_a", "layers.0.ffn.experts.7.w2"). ST_NOTFOUND when
 * there is no such linear.
 */
enum status model_checkpoint_linear(const struct model_checkpoint *ck, const char *prefix,
				    struct model_linear *out, struct err *e) DSV4_WUR;

/* The detected format of group g in layer (MODEL_FMT_NONE when the layer has
 * no such group, e.g. MTP projections on a main layer). */
enum model_weight_format model_checkpoint_group_format(const struct model_checkpoint *ck, int layer,
						       enum model_group g);

/*
 * 64-bit fingerprint of the checkpoint: FNV-1a over the bytes of
 * config.json, of the index, and of every shard's header (8-byte length +
 * JSON), in shard order. Two nodes that compute the same value hold the same
 * layout; tensor parallel bootstrap compares it across ranks. It does not
 * hash tensor data (that would read 150 GiB).
 */
uint64_t model_checkpoint_fingerprint(const struct model_checkpoint *ck);

/* Shards: count, path (borrowed), file size. */
int model_checkpoint_n_shards(const struct model_checkpoint *ck);
const char *model_checkpoint_shard_path(const struct model_checkpoint *ck, int shard);
uint64_t model_checkpoint_shard_bytes(const struct model_checkpoint *ck, int shard);

/* True when the tensors are dummy values (no shards: n_shards is 0, shard -1). */
bool model_checkpoint_is_dummy(const struct model_checkpoint *ck);

/* The directory as given (borrowed). */
const char *model_checkpoint_dir(const struct model_checkpoint *ck);

#endif
