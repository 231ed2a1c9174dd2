/*
 * tests/model/test_safetensors.c: the safetensors header parser and mapping.
 *
 * One valid file checked field by field, then every refusal the header
 * parser documents, each expected to fail with a message that names the
 * file and (where there is one) the tensor. Runs under ASan/UBSan, so an
 * out-of-bounds read on any path fails the test.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "model/safetensors.h"
#include "tests/test.h"

/* A file: u64 length of header (+pad spaces), header, data_bytes of data.
 * len_override replaces the length field when != UINT64_MAX. */
static uint8_t *make_file(const char *header, size_t pad, size_t data_bytes, uint64_t len_override, size_t *n_out)
{
	size_t hl = strlen(header);
	size_t n = 8 + hl + pad + data_bytes;
	uint8_t *b = malloc(n ? n : 1);
	uint64_t len = len_override != UINT64_MAX ? len_override : hl + pad;
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(len >> (8 * i));
	memcpy(b + 8, header, hl);
	memset(b + 8 + hl, ' ', pad);
	for (size_t i = 0; i < data_bytes; i++)
		b[8 + hl + pad + i] = (uint8_t)i;
	*n_out = n;
	return b;
}

static const char *valid_header =
	"{\"__metadata__\":{\"format\":\"pt\"},"
	"\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
	"\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[12,16]},"
	"\"z\":{\"dtype\":\"I64\",\"shape\":[0,5],\"data_offsets\":[16,16]},"
	"\"c\":{\"dtype\":\"F8_E8M0\",\"shape\":[4],\"data_offsets\":[16,20]}}";

static void test_valid(void)
{
	size_t n;
	uint8_t *f = make_file(valid_header, 5, 20, UINT64_MAX, &n);
	struct model_st_header h;
	struct err e;
	err_clear(&e);
	T_CHECKF(model_st_header_parse(f, n, "v.safetensors", &h, &e) == ST_OK, "%s", e.msg);
	T_CHECK(h.n_tensors == 4 && h.n_metadata == 1);
	T_CHECK(h.header_bytes == strlen(valid_header) + 5 && h.data_bytes == 20);
	if (h.n_tensors == 4) {
		T_CHECK(!strcmp(h.tensors[0].name, "a.weight") && h.tensors[0].dtype == MODEL_DTYPE_BF16);
		T_CHECK(h.tensors[0].n_dims == 2 && h.tensors[0].shape[0] == 2 && h.tensors[0].shape[1] == 3);
		T_CHECK(h.tensors[0].n_bytes == 12 && h.tensors[0].data_begin_bytes == 0 && h.tensors[0].n_elements == 6);
		T_CHECK(!strcmp(h.tensors[1].name, "b") && h.tensors[1].n_dims == 0 && h.tensors[1].n_elements == 1);
		T_CHECK(h.tensors[2].n_elements == 0 && h.tensors[2].n_bytes == 0);
		T_CHECK(h.tensors[3].dtype == MODEL_DTYPE_F8_E8M0 && h.tensors[3].data_begin_bytes == 16);
	}
	model_st_header_free(&h);
	model_st_header_free(&h); /* idempotent */
	free(f);

	/* The empty header {} with no data is a valid, empty file. */
	f = make_file("{}", 0, 0, UINT64_MAX, &n);
	T_CHECK(model_st_header_parse(f, n, "empty", &h, &e) == ST_OK && h.n_tensors == 0);
	model_st_header_free(&h);
	free(f);

	/* dtype table */
	const char *names[] = {"BF16", "F32", "F16", "F8_E4M3", "F8_E8M0", "U8", "I8", "I32", "I64"};
	size_t bytes[] = {2, 4, 2, 1, 1, 1, 1, 4, 8};
	for (int i = 0; i < MODEL_DTYPE_COUNT; i++) {
		enum model_dtype dt;
		T_CHECK(model_dtype_from_str(names[i], &dt) && (int)dt == i);
		T_CHECK(!strcmp(model_dtype_str(dt), names[i]) && model_dtype_bytes(dt) == bytes[i]);
	}
	enum model_dtype dt;
	T_CHECK(!model_dtype_from_str("F64", &dt) && !model_dtype_from_str("bf16", &dt));
	T_CHECK(!strcmp(model_dtype_str((enum model_dtype)99), "?"));
}

struct bad {
	const char *header;
	size_t data_bytes;
	const char *needle;
	const char *tensor; /* must also appear, or NULL */
};

static const struct bad bads[] = {
	{"{abc", 0, "not valid JSON", NULL},
	{"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
	 "\"bad.one\":{\"dtype\":\"U8\",\"shape\":[1] x}}", 1, "header is not valid JSON", "bad.one"},
	{"[]", 0, "not a JSON object", NULL},
	{"\"x\"", 0, "not valid JSON", NULL},
	{"{}", 3, "no tensors, but the data section has 3 bytes", NULL},
	{"{\"t\":5}", 0, "not an object", "t"},
	{"{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "no dtype", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "no shape", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "no data_offsets", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1, "unexpected key", "t"},
	{"{\"t\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "dtype is not a string", "t"},
	{"{\"t\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "unsupported dtype", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1, "shape is not an array", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1, "shape[0] is not a non-negative", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1, "shape[0] is not a non-negative", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1,\"2\"],\"data_offsets\":[0,2]}}", 2, "shape[1]", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "more than 8", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,1]}}", 1,
	 "shape product overflows", "t"},
	{"{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,1]}}", 1,
	 "overflows", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, "not an array of 2", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1, "not an array of 2", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, "not non-negative", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.5]}}", 1, "not non-negative", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,0]}}", 1, "end before they begin", "t"},
	{"{\"t\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 6, "needs 6", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4, "past the 4-byte data section", "t"},
	{"{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[99999999999999999999,0]}}", 1, "not valid JSON",
	 NULL},
	{"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
	 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
	 6, "overlap", "b"},
	{"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
	 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
	 4, "overlap tensor a", "b"},
	{"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
	 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
	 10, "hole", "b"},
	{"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 9, "ends at 4, but the data section has 9 bytes", "a"},
	{"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
	 "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
	 4, "not valid JSON", NULL},
	{"{\"__metadata__\":[1]}", 0, "__metadata__ is not an object", NULL},
	{"{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value", NULL},
	{"{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "empty name", NULL},
	{"{\"t\\u0000x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "not valid JSON", NULL},
};

static void test_bad_headers(void)
{
	for (size_t i = 0; i < ARRAY_LEN(bads); i++) {
		size_t n;
		uint8_t *f = make_file(bads[i].header, 0, bads[i].data_bytes, UINT64_MAX, &n);
		struct model_st_header h;
		struct err e;
		err_clear(&e);
		enum status st = model_st_header_parse(f, n, "bad.safetensors", &h, &e);
		T_CHECKF(st == ST_INVALID, "case %zu accepted: %s", i, bads[i].header);
		T_STR_CONTAINS(e.msg, bads[i].needle);
		T_STR_CONTAINS(e.msg, "bad.safetensors");
		if (bads[i].tensor) {
			char needle[64];
			snprintf(needle, sizeof needle, "tensor %s:", bads[i].tensor);
			T_STR_CONTAINS(e.msg, needle);
		}
		T_CHECK(h.n_tensors == 0 && h.tensors == NULL); /* zeroed on failure */
		free(f);
	}
	/* a name that is too long */
	char *hdr = malloc(MODEL_ST_MAX_NAME_BYTES + 200);
	char *p = hdr + sprintf(hdr, "{\"");
	memset(p, 'n', MODEL_ST_MAX_NAME_BYTES + 1);
	p += MODEL_ST_MAX_NAME_BYTES + 1;
	sprintf(p, "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
	size_t n;
	uint8_t *f = make_file(hdr, 0, 1, UINT64_MAX, &n);
	struct model_st_header h;
	struct err e;
	T_CHECK(model_st_header_parse(f, n, "long", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "name longer than");
	free(f);
	free(hdr);
}

static void test_bad_lengths(void)
{
	struct model_st_header h;
	struct err e;
	size_t n;
	uint8_t zero[8] = {0};
	T_CHECK(model_st_header_parse(zero, 0, "f0", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "too short");
	T_CHECK(model_st_header_parse(zero, 7, "f7", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "f7: 7 bytes, too short");
	uint8_t *f = make_file("{}", 0, 0, 1ull << 63, &n);
	T_CHECK(model_st_header_parse(f, n, "huge", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "huge: header length 9223372036854775808 is more than");
	free(f);
	f = make_file("{}", 0, 0, UINT64_MAX - 1, &n);
	T_CHECK(model_st_header_parse(f, n, "max", &h, &e) == ST_INVALID);
	free(f);
	f = make_file("{}", 0, 0, 3, &n);
	T_CHECK(model_st_header_parse(f, n, "past", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "runs past the end");
	free(f);
	f = make_file("{}", 0, 0, 1, &n);
	T_CHECK(model_st_header_parse(f, n, "tiny", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "too short for a JSON object");
	free(f);
	/* Header length that leaves the JSON cut short: the parser must not read past N. */
	f = make_file(valid_header, 0, 20, 40, &n);
	T_CHECK(model_st_header_parse(f, n, "cut", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "not valid JSON");
	free(f);
	/* A file truncated inside the data section. */
	f = make_file(valid_header, 0, 20, UINT64_MAX, &n);
	T_CHECK(model_st_header_parse(f, n - 3, "trunc", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "file truncated");
	T_STR_CONTAINS(e.msg, "tensor c:");
	/* Truncated inside the header. */
	T_CHECK(model_st_header_parse(f, 8 + 10, "trunc2", &h, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "runs past the end");
	free(f);
}

static void test_file(void)
{
	char dir[] = "/tmp/dsv4-test-st-XXXXXX";
	T_CHECK(mkdtemp(dir) != NULL);
	char path[256];
	snprintf(path, sizeof path, "%s/ok.safetensors", dir);
	size_t n;
	uint8_t *f = make_file(valid_header, 3, 20, UINT64_MAX, &n);
	FILE *fp = fopen(path, "wb");
	T_CHECK(fp && fwrite(f, 1, n, fp) == n);
	fclose(fp);
	struct model_st_file sf;
	struct err e;
	err_clear(&e);
	T_CHECKF(model_st_file_open(path, &sf, &e) == ST_OK, "%s", e.msg);
	T_CHECK(sf.file_bytes == n && sf.data == sf.map + 8 + strlen(valid_header) + 3);
	T_CHECK(sf.header.n_tensors == 4 && !memcmp(sf.data, f + 8 + strlen(valid_header) + 3, 20));
	T_CHECK(sf.header_hash == model_hash_bytes(MODEL_HASH_INIT, f, 8 + strlen(valid_header) + 3));
	model_st_file_close(&sf);
	model_st_file_close(&sf); /* safe twice */

	/* truncated on disk */
	fp = fopen(path, "wb");
	T_CHECK(fp && fwrite(f, 1, n - 1, fp) == n - 1);
	fclose(fp);
	T_CHECK(model_st_file_open(path, &sf, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, path);
	T_STR_CONTAINS(e.msg, "tensor c:");
	/* empty file */
	fp = fopen(path, "wb");
	fclose(fp);
	T_CHECK(model_st_file_open(path, &sf, &e) == ST_INVALID);
	T_STR_CONTAINS(e.msg, "too short");
	unlink(path);
	T_CHECK(model_st_file_open(path, &sf, &e) == ST_NOTFOUND);
	T_STR_CONTAINS(e.msg, path);
	T_CHECK(model_st_file_open(dir, &sf, &e) == ST_IO);
	free(f);
	rmdir(dir);

	T_CHECK(model_hash_bytes(MODEL_HASH_INIT, "a", 1) != model_hash_bytes(MODEL_HASH_INIT, "b", 1));
	T_CHECK(model_hash_bytes(MODEL_HASH_INIT, "", 0) == MODEL_HASH_INIT);
}

int main(void)
{
	test_valid();
	test_bad_headers();
	test_bad_lengths();
	test_file();
	return test_exit();
}
