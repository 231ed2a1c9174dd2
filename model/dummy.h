/*
 * model/dummy.h: --load-format dummy: the tensor set config.json implies, in
 * its stored formats, filled with deterministic random values of sane
 * dequantized magnitude (vLLM's dummy load format).
 *
 * Every element is a pure function of (tensor seed, element index): op
 * fill_random, whose variants are bit-identical, so any backend can generate
 * a tensor in place and the same seed gives the same bytes everywhere.
 */
#ifndef DSV4_MODEL_DUMMY_H
#define DSV4_MODEL_DUMMY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/fill/fill_random.h"
#include "model/checkpoint.h"

/* The fill of tensor t (its name, dtype, shape, role and format) under cfg, as
 * the arguments of op fill_random (kernels/fill/fill_random.h) with dst and
 * stream left NULL: a device loader sets them and runs the op's CUDA variant. */
void model_dummy_fill_of(const struct model_config *cfg, const struct model_tensor *t, uint64_t load_seed,
			 struct kern_fill_random_args *out);

/* Fill dst (t->n_bytes) on the CPU (fill_random's reference). */
enum status model_dummy_fill_cpu(const struct model_config *cfg, const struct model_tensor *t, uint64_t load_seed,
				 void *dst) DSV4_WUR;

/* Internals for model/checkpoint.c: the tensors of a dummy checkpoint. */
struct model__dummy {
	size_t n_tensors;
	struct model_tensor *tensors;
	char *names;
	enum model_weight_format (*group_fmt)[MODEL_GROUP_COUNT]; /* [n_layers_total] */
	void *data;          /* anonymous mapping holding every tensor, or NULL */
	size_t data_bytes;
};

/* Settle the draft layers from cfg, walk the schema, allocate and (fill) the
 * tensors (fill: with their values; else left zero). cfg is updated (draft
 * stages). */
enum status model__dummy_build(struct model_config *cfg, uint64_t seed, bool fill, struct model__dummy *out,
			       struct err *e) DSV4_WUR;
void model__dummy_free(struct model__dummy *d);

#endif
