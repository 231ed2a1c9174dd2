/*
 * model/safetensors.c: safetensors header parsing and the read-only mapping.
 *
 * The header parser works on bytes in memory so that the fuzz test can feed it
 * arbitrary mutations; model_st_file_open() only adds open/fstat/mmap around
 * it. Every offset is checked against the byte counts before any pointer is
 * formed, with overflow-checked arithmetic, so a hostile header yields an
 * error message and never a read outside the mapping.
 */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(size_t) >= 8, "safetensors mapping needs a 64-bit address space");

/* ---- dtypes ---- */

static const struct {
	const char *name;
	size_t bytes;
} dtype_info[MODEL_DTYPE_COUNT] = {
	[MODEL_DTYPE_BF16] = {"BF16", 2},   [MODEL_DTYPE_F32] = {"F32", 4},
	[MODEL_DTYPE_F16] = {"F16", 2},     [MODEL_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
	[MODEL_DTYPE_F8_E8M0] = {"F8_E8M0", 1}, [MODEL_DTYPE_U8] = {"U8", 1},
	[MODEL_DTYPE_I8] = {"I8", 1},       [MODEL_DTYPE_I32] = {"I32", 4},
	[MODEL_DTYPE_I64] = {"I64", 8},
};

const char *model_dtype_str(enum model_dtype dt)
{
	return (unsigned)dt < MODEL_DTYPE_COUNT ? dtype_info[dt].name : "?";
}

size_t model_dtype_bytes(enum model_dtype dt)
{
	return (unsigned)dt < MODEL_DTYPE_COUNT ? dtype_info[dt].bytes : 0;
}

bool model_dtype_from_str(const char *s, enum model_dtype *out)
{
	for (int i = 0; i < MODEL_DTYPE_COUNT; i++)
		if (!strcmp(s, dtype_info[i].name)) {
			*out = (enum model_dtype)i;
			return true;
		}
	return false;
}

uint64_t model_hash_bytes(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* ---- Header ---- */

/* A JSON integer that must be >= 0; false otherwise. */
static bool nonneg_int(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

static enum status parse_entry(const char *file, const char *name, json_t *v, struct model_st_tensor *t,
			       uint64_t *end_out, struct err *e)
{
	if (!json_is_object(v))
		return err_set(e, ST_INVALID, "%s: tensor %s: header entry is not an object", file, name);
	json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
	       *jo = json_object_get(v, "data_offsets");
	if (!jd)
		return err_set(e, ST_INVALID, "%s: tensor %s: no dtype", file, name);
	if (!js)
		return err_set(e, ST_INVALID, "%s: tensor %s: no shape", file, name);
	if (!jo)
		return err_set(e, ST_INVALID, "%s: tensor %s: no data_offsets", file, name);
	if (json_object_size(v) != 3) {
		const char *k;
		json_t *x;
		json_object_foreach(v, k, x) {
			if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
				return err_set(e, ST_INVALID, "%s: tensor %s: unexpected key \"%.64s\"", file, name, k);
		}
	}
	if (!json_is_string(jd))
		return err_set(e, ST_INVALID, "%s: tensor %s: dtype is not a string", file, name);
	if (!model_dtype_from_str(json_string_value(jd), &t->dtype))
		return err_set(e, ST_INVALID, "%s: tensor %s: unsupported dtype \"%.32s\"", file, name,
			       json_string_value(jd));
	if (!json_is_array(js))
		return err_set(e, ST_INVALID, "%s: tensor %s: shape is not an array", file, name);
	size_t nd = json_array_size(js);
	if (nd > MODEL_MAX_DIMS)
		return err_set(e, ST_INVALID, "%s: tensor %s: shape has %zu dims, more than %d", file, name, nd,
			       MODEL_MAX_DIMS);
	t->n_dims = (int)nd;
	uint64_t n_el = 1;
	for (size_t i = 0; i < nd; i++) {
		uint64_t d;
		if (!nonneg_int(json_array_get(js, i), &d))
			return err_set(e, ST_INVALID, "%s: tensor %s: shape[%zu] is not a non-negative integer", file,
				       name, i);
		t->shape[i] = (int64_t)d;
		if (__builtin_mul_overflow(n_el, d, &n_el))
			return err_set(e, ST_INVALID, "%s: tensor %s: shape product overflows", file, name);
	}
	uint64_t n_bytes;
	if (__builtin_mul_overflow(n_el, (uint64_t)model_dtype_bytes(t->dtype), &n_bytes))
		return err_set(e, ST_INVALID, "%s: tensor %s: byte count overflows", file, name);
	t->n_elements = n_el;
	if (!json_is_array(jo) || json_array_size(jo) != 2)
		return err_set(e, ST_INVALID, "%s: tensor %s: data_offsets is not an array of 2 integers", file, name);
	uint64_t b, en;
	if (!nonneg_int(json_array_get(jo, 0), &b) || !nonneg_int(json_array_get(jo, 1), &en))
		return err_set(e, ST_INVALID, "%s: tensor %s: data_offsets are not non-negative integers", file, name);
	if (en < b)
		return err_set(e, ST_INVALID, "%s: tensor %s: data_offsets [%llu, %llu) end before they begin", file,
			       name, (unsigned long long)b, (unsigned long long)en);
	if (en - b != n_bytes)
		return err_set(e, ST_INVALID,
			       "%s: tensor %s: data_offsets [%llu, %llu) hold %llu bytes, but %s %s needs %llu", file,
			       name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b),
			       model_dtype_str(t->dtype), nd ? "of that shape" : "scalar", (unsigned long long)n_bytes);
	t->data_begin_bytes = b;
	t->n_bytes = n_bytes;
	*end_out = en;
	return ST_OK;
}

/* Ranges must tile [0, data_bytes) exactly: no overlap, no hole, no tail. */
static enum status check_coverage(const char *file, const struct model_st_header *h, struct err *e)
{
	size_t n = h->n_tensors;
	size_t *order = malloc((n ? n : 1) * sizeof *order);
	if (!order)
		return err_set(e, ST_NOMEM, "%s: out of memory", file);
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	/* Bottom-up merge sort by (begin, size): stable, no globals, so that
	 * several threads (TP ranks) may parse at once. */
	{
		size_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
		if (!tmp) {
			free(order);
			return err_set(e, ST_NOMEM, "%s: out of memory", file);
		}
		const struct model_st_tensor *ts = h->tensors;
		for (size_t w = 1; w < n; w *= 2) {
			for (size_t lo = 0; lo < n; lo += 2 * w) {
				size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
				size_t i = lo, j = mid, k = lo;
				while (i < mid && j < hi) {
					const struct model_st_tensor *x = &ts[order[i]], *y = &ts[order[j]];
					bool take_left = x->data_begin_bytes < y->data_begin_bytes ||
							 (x->data_begin_bytes == y->data_begin_bytes &&
							  x->n_bytes <= y->n_bytes);
					tmp[k++] = take_left ? order[i++] : order[j++];
				}
				while (i < mid)
					tmp[k++] = order[i++];
				while (j < hi)
					tmp[k++] = order[j++];
			}
			memcpy(order, tmp, n * sizeof *order);
		}
		free(tmp);
	}
	/* Overlaps first (they are the more specific diagnosis: an overlap
	 * usually leaves a hole where the moved tensor used to be), then holes. */
	uint64_t expect = 0;
	const struct model_st_tensor *prev = NULL;
	enum status st = ST_OK;
	for (size_t i = 0; i < n && st == ST_OK; i++) {
		const struct model_st_tensor *t = &h->tensors[order[i]];
		if (t->n_bytes && prev && t->data_begin_bytes < expect)
			st = err_set(e, ST_INVALID, "%s: tensor %s: data_offsets [%llu, %llu) overlap tensor %s", file,
				     t->name, (unsigned long long)t->data_begin_bytes,
				     (unsigned long long)(t->data_begin_bytes + t->n_bytes), prev->name);
		if (t->data_begin_bytes + t->n_bytes > expect) {
			expect = t->data_begin_bytes + t->n_bytes;
			prev = t;
		}
	}
	expect = 0;
	prev = NULL;
	for (size_t i = 0; i < n && st == ST_OK; i++) {
		const struct model_st_tensor *t = &h->tensors[order[i]];
		if (t->data_begin_bytes < expect)
			st = err_set(e, ST_INVALID, "%s: tensor %s: data_offsets begin at %llu, inside tensor %s", file,
				     t->name, (unsigned long long)t->data_begin_bytes, prev ? prev->name : "?");
		else if (t->data_begin_bytes > expect)
			st = err_set(e, ST_INVALID, "%s: tensor %s: data_offsets begin at %llu, leaving a hole after %llu",
				     file, t->name, (unsigned long long)t->data_begin_bytes, (unsigned long long)expect);
		expect = t->data_begin_bytes + t->n_bytes;
		prev = t;
	}
	if (st == ST_OK && expect != h->data_bytes && prev)
		st = err_set(e, ST_INVALID,
			     "%s: tensor %s: the last tensor ends at %llu, but the data section has %llu bytes "
			     "(trailing bytes)",
			     file, prev->name, (unsigned long long)expect, (unsigned long long)h->data_bytes);
	else if (st == ST_OK && expect != h->data_bytes)
		st = err_set(e, ST_INVALID, "%s: no tensors, but the data section has %llu bytes", file,
			     (unsigned long long)h->data_bytes);
	free(order);
	return st;
}

static enum status parse_root(const char *file, json_t *root, struct model_st_header *h, struct err *e)
{
	if (!json_is_object(root))
		return err_set(e, ST_INVALID, "%s: header is not a JSON object", file);
	size_t n = json_object_size(root), names_bytes = 0;
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "__metadata__")) {
			if (!json_is_object(v))
				return err_set(e, ST_INVALID, "%s: __metadata__ is not an object", file);
			const char *mk;
			json_t *mv;
			json_object_foreach(v, mk, mv) {
				if (!json_is_string(mv))
					return err_set(e, ST_INVALID, "%s: __metadata__ value of \"%.64s\" is not a string",
						       file, mk);
			}
			h->n_metadata = (int)json_object_size(v);
			n--;
			continue;
		}
		size_t kl = strlen(key);
		if (kl == 0)
			return err_set(e, ST_INVALID, "%s: a tensor has an empty name", file);
		if (kl > MODEL_ST_MAX_NAME_BYTES)
			return err_set(e, ST_INVALID, "%s: tensor %.64s...: name longer than %u bytes", file, key,
				       MODEL_ST_MAX_NAME_BYTES);
		names_bytes += kl + 1;
	}
	if (n > MODEL_ST_MAX_TENSORS)
		return err_set(e, ST_INVALID, "%s: %zu tensors, more than %u", file, n, MODEL_ST_MAX_TENSORS);
	h->tensors = calloc(n ? n : 1, sizeof *h->tensors);
	h->names = malloc(names_bytes ? names_bytes : 1);
	if (!h->tensors || !h->names)
		return err_set(e, ST_NOMEM, "%s: out of memory for %zu tensors", file, n);
	size_t i = 0, off = 0;
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "__metadata__"))
			continue;
		struct model_st_tensor *t = &h->tensors[i];
		size_t kl = strlen(key);
		memcpy(h->names + off, key, kl + 1);
		t->name = h->names + off;
		off += kl + 1;
		uint64_t end = 0;
		enum status st = parse_entry(file, t->name, v, t, &end, e);
		if (st != ST_OK)
			return st;
		i++;
		h->n_tensors = i;
		if (end > h->data_bytes)
			return err_set(e, ST_INVALID,
				       "%s: tensor %s: data_offsets end at %llu, past the %llu-byte data section "
				       "(file truncated?)",
				       file, t->name, (unsigned long long)end, (unsigned long long)h->data_bytes);
	}
	return check_coverage(file, h, e);
}

/* Best effort for messages about a broken header: the name of the last
 * `"name":{` entry that starts before byte pos, as "tensor NAME: ". */
static void near_tensor(const char *h, size_t n, int pos, char *out, size_t out_bytes)
{
	out[0] = '\0';
	size_t end = pos < 0 ? 0 : (size_t)pos < n ? (size_t)pos : n;
	for (size_t i = end; i >= 3; i--) {
		if (h[i - 1] != '{' || h[i - 2] != ':' || h[i - 3] != '"')
			continue;
		size_t q = i - 3, b = q;
		while (b > 0 && h[b - 1] != '"' && q - b < 80)
			b--;
		if (b == 0 || h[b - 1] != '"' || b == q)
			return;
		for (size_t k = b; k < q; k++)
			if ((unsigned char)h[k] < 0x20 || (unsigned char)h[k] >= 0x7f)
				return; /* not printable: do not echo it */
		if (q - b == 12 && !memcmp(h + b, "__metadata__", 12))
			return;
		snprintf(out, out_bytes, "tensor %.*s: ", (int)(q - b), h + b);
		return;
	}
}

enum status model_st_header_parse(const uint8_t *file, uint64_t file_bytes, const char *file_name,
				  struct model_st_header *out, struct err *e)
{
	const char *fn = file_name ? file_name : "(safetensors)";
	memset(out, 0, sizeof *out);
	if (file_bytes < 8)
		return err_set(e, ST_INVALID, "%s: %llu bytes, too short for the 8-byte header length (truncated)", fn,
			       (unsigned long long)file_bytes);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | file[i];
	if (n > MODEL_ST_MAX_HEADER_BYTES)
		return err_set(e, ST_INVALID, "%s: header length %llu is more than %u bytes (corrupt)", fn,
			       (unsigned long long)n, MODEL_ST_MAX_HEADER_BYTES);
	if (n > file_bytes - 8)
		return err_set(e, ST_INVALID, "%s: header length %llu runs past the end of the %llu-byte file (truncated)",
			       fn, (unsigned long long)n, (unsigned long long)file_bytes);
	if (n < 2)
		return err_set(e, ST_INVALID, "%s: header length %llu is too short for a JSON object", fn,
			       (unsigned long long)n);
	out->header_bytes = n;
	out->data_bytes = file_bytes - 8 - n;
	json_error_t je;
	json_t *root = json_loadb((const char *)file + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		char near[96];
		near_tensor((const char *)file + 8, (size_t)n, je.position, near, sizeof near);
		return err_set(e, ST_INVALID, "%s: %sheader is not valid JSON: byte %d: %s", fn, near, je.position,
			       je.text);
	}
	enum status st = parse_root(fn, root, out, e);
	json_decref(root);
	if (st != ST_OK)
		model_st_header_free(out);
	return st;
}

void model_st_header_free(struct model_st_header *h)
{
	if (!h)
		return;
	free(h->tensors);
	free(h->names);
	memset(h, 0, sizeof *h);
}

/* ---- Mapped file ---- */

enum status model_st_file_open(const char *path, struct model_st_file *out, struct err *e)
{
	memset(out, 0, sizeof *out);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return err_set(e, errno == ENOENT ? ST_NOTFOUND : ST_IO, "%s: cannot open: %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
		close(fd);
		return err_set(e, ST_IO, "%s: not a regular file", path);
	}
	out->path = strdup(path);
	if (!out->path) {
		close(fd);
		return err_set(e, ST_NOMEM, "%s: out of memory", path);
	}
	out->file_bytes = (uint64_t)sb.st_size;
	if (out->file_bytes < 8) {
		close(fd);
		model_st_file_close(out);
		return err_set(e, ST_INVALID, "%s: %lld bytes, too short for the 8-byte header length (truncated)", path,
			       (long long)sb.st_size);
	}
	void *m = mmap(NULL, (size_t)out->file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
	int mmap_errno = errno;
	close(fd);
	if (m == MAP_FAILED) {
		model_st_file_close(out);
		return err_set(e, ST_IO, "%s: mmap failed: %s", path, strerror(mmap_errno));
	}
	out->map = m;
	enum status st = model_st_header_parse(out->map, out->file_bytes, path, &out->header, e);
	if (st != ST_OK) {
		model_st_file_close(out);
		return st;
	}
	out->data = out->map + 8 + out->header.header_bytes;
	out->header_hash = model_hash_bytes(MODEL_HASH_INIT, out->map, (size_t)(8 + out->header.header_bytes));
	return ST_OK;
}

void model_st_file_close(struct model_st_file *f)
{
	if (!f)
		return;
	if (f->map)
		munmap((void *)f->map, (size_t)f->file_bytes);
	model_st_header_free(&f->header);
	free(f->path);
	memset(f, 0, sizeof *f);
}
