/*
 * model/inspect.h: the human-readable summary of a checkpoint that
 * `dsv4 inspect` prints: config, layer-type map, tensor count, bytes per
 * dtype, quantization per group.
 */
#ifndef DSV4_MODEL_INSPECT_H
#define DSV4_MODEL_INSPECT_H

#include <stdbool.h>
#include <stdio.h>

#include "model/checkpoint.h"

struct model_inspect_options {
	bool list_tensors; /* also one line per tensor: name, dtype, shape, shard, format */
};

/* Write the summary of ck to out. Returns ST_IO if writing fails. */
enum status model_inspect_write(const struct model_checkpoint *ck, const struct model_inspect_options *opt,
				FILE *out, struct err *e) DSV4_WUR;

/* One line saying what the quantization is, e.g. "FP8 block-128 (E8M0 scales)
 * for attention and shared experts; routed experts NVFP4 (main layers), MXFP4
 * (MTP)". Writes at most n bytes (NUL-terminated). */
void model_inspect_quant_summary(const struct model_checkpoint *ck, char *buf, size_t n);

#endif
