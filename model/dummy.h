/*
 * model/dummy.h: --load-format dummy: the tensor set config.json implies, in
 * its stored formats, filled with deterministic random values of sane
 * dequantized magnitude (vLLM's dummy load format).
 *
 * Every element is a pure function of (tensor seed, element index), so any
 * backend can generate a tensor in place (model_dummy_fill_cpu here; a device
 * generator must reproduce model_dummy_byte_at() bit for bit).
 */
#ifndef DSV4_MODEL_DUMMY_H
#define DSV4_MODEL_DUMMY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/checkpoint.h"

/* How one tensor is filled. u = a uniform [0,1) from the element's hash. */
enum model_dummy_kind {
	MODEL_DUMMY_UNIFORM = 0, /* BF16/F32 element lo + (hi-lo)*u */
	MODEL_DUMMY_E4M3,        /* e4m3 byte: random sign (unless positive), exponent field in [e_lo, e_hi], random mantissa */
	MODEL_DUMMY_E8M0,        /* E8M0 byte e_lo + (hash % (e_hi - e_lo + 1)) */
	MODEL_DUMMY_BYTES,       /* random bytes (packed e2m1 pairs: every code is finite) */
	MODEL_DUMMY_INDEX,       /* I64 [rows, cols]: (row hash + col) % n: distinct per row when cols <= n */
};

struct model_dummy_fill {
	enum model_dummy_kind kind;
	enum model_dtype dtype;
	uint64_t seed;   /* per tensor: from the load seed and the tensor name */
	uint64_t n_elements;
	float lo, hi;    /* UNIFORM */
	int e_lo, e_hi;  /* E4M3 exponent fields, E8M0 bytes */
	int positive;    /* E4M3: sign bit 0 */
	int64_t cols, n; /* INDEX */
};

/* The fill of tensor t (its name, dtype, shape, role and format) under cfg. */
void model_dummy_fill_of(const struct model_config *cfg, const struct model_tensor *t, uint64_t load_seed,
			 struct model_dummy_fill *out);

/* Fill dst (t->n_bytes) on the CPU. */
void model_dummy_fill_cpu(const struct model_dummy_fill *f, void *dst);

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
