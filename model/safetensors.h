/*
 * model/safetensors.h: one safetensors file, memory-mapped read-only, its
 * header parsed and checked.
 *
 * File layout: u64 little-endian N, N bytes of JSON header, then the data
 * section. The header maps each tensor name to {dtype, shape, data_offsets
 * [begin, end)} relative to the data section, plus an optional
 * "__metadata__" object of strings.
 *
 * What is refused (each with a message naming the file and, where there is
 * one, the tensor): a file shorter than 8 bytes; a header length past the end
 * of the file or above MODEL_ST_MAX_HEADER_BYTES; a header that is not JSON,
 * not an object, or has duplicate names; an entry that is not an object, lacks
 * or has extra keys, has an unknown dtype, a shape that is not an array of
 * non-negative integers (at most MODEL_MAX_DIMS), offsets that are not two
 * non-negative integers with begin <= end; a byte count dtype*shape that
 * overflows or differs from end - begin; ranges past the data section,
 * overlapping each other, leaving holes, or not covering the data section to
 * its end (the rules the reference safetensors library enforces).
 *
 * Nothing reads beyond the mapping: every pointer handed out lies inside it.
 * (If another process truncates the file while it is mapped, touching the
 * lost pages raises SIGBUS; that is outside what a reader can prevent.)
 */
#ifndef DSV4_MODEL_SAFETENSORS_H
#define DSV4_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define MODEL_MAX_DIMS 8
#define MODEL_ST_MAX_HEADER_BYTES (100u << 20) /* the reference library's own cap: 100 MB */
#define MODEL_ST_MAX_TENSORS (1u << 20)        /* per file; the real shards hold ~1.5k */
#define MODEL_ST_MAX_NAME_BYTES 512            /* real names are < 64 bytes */

/* The dtypes this program reads; safetensors' spelling in model_dtype_str(). */
enum model_dtype {
	MODEL_DTYPE_BF16 = 0,
	MODEL_DTYPE_F32,
	MODEL_DTYPE_F16,
	MODEL_DTYPE_F8_E4M3, /* float8_e4m3fn */
	MODEL_DTYPE_F8_E8M0, /* float8_e8m0fnu: power-of-two scales */
	MODEL_DTYPE_U8,      /* NVFP4 packed e2m1 pairs */
	MODEL_DTYPE_I8,      /* MXFP4 packed e2m1 pairs */
	MODEL_DTYPE_I32,
	MODEL_DTYPE_I64,
	MODEL_DTYPE_COUNT
};

/* "BF16", "F32", ...; static, "?" for an out-of-range value. */
const char *model_dtype_str(enum model_dtype dt);
/* Bytes per element (1, 2, 4 or 8). */
size_t model_dtype_bytes(enum model_dtype dt);
/* Parse a safetensors dtype name; false if it is not one of ours. */
bool model_dtype_from_str(const char *s, enum model_dtype *out);

/* One tensor as described by a header. */
struct model_st_tensor {
	const char *name;             /* NUL-terminated, owned by the model_st_file */
	enum model_dtype dtype;
	int n_dims;                   /* 0 for a scalar */
	int64_t shape[MODEL_MAX_DIMS];
	uint64_t n_elements;
	uint64_t data_begin_bytes;    /* offset in the data section */
	uint64_t n_bytes;             /* end - begin == n_elements * dtype bytes */
};

/* A parsed header; owns the names. Produced from bytes in memory. */
struct model_st_header {
	size_t n_tensors;
	struct model_st_tensor *tensors; /* [n_tensors], in header (JSON key) order */
	uint64_t header_bytes;           /* N */
	uint64_t data_bytes;             /* file bytes - 8 - N */
	char *names;                     /* storage for every name */
	int n_metadata;                  /* entries of __metadata__ (0 if absent) */
};

/*
 * Parse the header of a safetensors file whose whole content is
 * file[0..file_bytes). Does not touch bytes past file_bytes. file_name is for
 * messages. On success *out owns its arrays (model_st_header_free); on
 * failure *out is zeroed and e says why (ST_INVALID, or ST_NOMEM).
 */
enum status model_st_header_parse(const uint8_t *file, uint64_t file_bytes, const char *file_name,
				  struct model_st_header *out, struct err *e) DSV4_WUR;

/* Free what model_st_header_parse allocated; zeroes h. NULL-safe. */
void model_st_header_free(struct model_st_header *h);

/* ---- A mapped file ---- */

/* An open, mapped and parsed safetensors file. */
struct model_st_file {
	char *path;                   /* owned copy */
	const uint8_t *map;           /* PROT_READ mapping of the whole file */
	uint64_t file_bytes;
	const uint8_t *data;          /* map + 8 + header_bytes: start of the data section */
	struct model_st_header header;
	uint64_t header_hash;         /* 64-bit hash of the 8-byte length + header bytes */
};

/*
 * Open path read-only, map it and parse the header. On success *out is
 * owned by the caller (model_st_file_close). ST_NOTFOUND if the file does
 * not exist, ST_IO if it cannot be read or mapped, ST_INVALID for a bad file.
 */
enum status model_st_file_open(const char *path, struct model_st_file *out, struct err *e) DSV4_WUR;

/* Unmap and free; zeroes f. Safe on a zeroed or already closed file. */
void model_st_file_close(struct model_st_file *f);

/* 64-bit FNV-1a, continuing from h (start with MODEL_HASH_INIT). */
#define MODEL_HASH_INIT 0xcbf29ce484222325ull
uint64_t model_hash_bytes(uint64_t h, const void *p, size_t n);

#endif
