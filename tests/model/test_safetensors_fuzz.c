/*
 * tests/model/test_safetensors_fuzz.c: random mutations of a valid
 * safetensors file fed to the header parser under ASan/UBSan.
 *
 * Each mutated file lives in a buffer of exactly its size, so any read past
 * the end is an ASan report. Every result must be either a refusal with a
 * non-empty message or a parse whose tensors satisfy every documented
 * invariant (byte counts, ranges inside the data section, exact tiling).
 * Mutations: byte and bit flips, truncations, insertions and deletions of
 * bytes and JSON tokens, number rewrites (negative, huge, fractional,
 * overflowing), length-field changes, and combinations of those.
 *
 * DSV4_FUZZ_SEED=S reproduces a run; DSV4_FUZZ_ITERS=N changes its length.
 */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "model/safetensors.h"
#include "tests/test.h"

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static size_t rnd_below(size_t n)
{
	return n ? (size_t)(rnd() % n) : 0;
}

/* A growable byte buffer. */
struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void buf_reserve(struct buf *b, size_t n)
{
	if (n <= b->cap)
		return;
	b->cap = n * 2 + 64;
	b->p = realloc(b->p, b->cap);
	CHECK(b->p);
}

static void buf_insert(struct buf *b, size_t at, const void *src, size_t n)
{
	buf_reserve(b, b->n + n);
	memmove(b->p + at + n, b->p + at, b->n - at);
	memcpy(b->p + at, src, n);
	b->n += n;
}

static void buf_erase(struct buf *b, size_t at, size_t n)
{
	if (at + n > b->n)
		n = b->n - at;
	memmove(b->p + at, b->p + at + n, b->n - at - n);
	b->n -= n;
}

static void set_len(struct buf *b, uint64_t len)
{
	for (int i = 0; i < 8 && i < (int)b->n; i++)
		b->p[i] = (uint8_t)(len >> (8 * i));
}

/* The valid seed file: a shard-like header of a dozen tensors. */
static struct buf make_seed(void)
{
	static const char *const dt[] = {"BF16", "F32", "F16", "F8_E4M3", "F8_E8M0", "U8", "I8", "I32", "I64"};
	static const size_t el[] = {2, 4, 2, 1, 1, 1, 1, 4, 8};
	char hdr[4096];
	size_t o = (size_t)snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"format\":\"pt\"}");
	uint64_t off = 0;
	for (int i = 0; i < 12; i++) {
		int d = i % 9;
		int64_t s0 = 1 + i, s1 = (i % 3) ? 3 + i : 0;
		uint64_t n_el = (uint64_t)s0 * (s1 ? (uint64_t)s1 : 1);
		uint64_t nb = n_el * el[d];
		if (s1)
			o += (size_t)snprintf(hdr + o, sizeof hdr - o,
					      ",\"layers.%d.t%d.weight\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
					      "\"data_offsets\":[%llu,%llu]}",
					      i, i, dt[d], (long long)s0, (long long)s1, (unsigned long long)off,
					      (unsigned long long)(off + nb));
		else
			o += (size_t)snprintf(hdr + o, sizeof hdr - o,
					      ",\"layers.%d.t%d.scale\":{\"dtype\":\"%s\",\"shape\":[%lld],"
					      "\"data_offsets\":[%llu,%llu]}",
					      i, i, dt[d], (long long)s0, (unsigned long long)off,
					      (unsigned long long)(off + nb));
		off += nb;
	}
	o += (size_t)snprintf(hdr + o, sizeof hdr - o,
			      ",\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[%llu,%llu]}}",
			      (unsigned long long)off, (unsigned long long)(off + 4));
	off += 4;
	CHECK(o < sizeof hdr);
	struct buf b = {0};
	size_t pad = (8 - o % 8) % 8;
	buf_reserve(&b, 8 + o + pad + off);
	b.n = 8 + o + pad + off;
	set_len(&b, o + pad);
	memcpy(b.p + 8, hdr, o);
	memset(b.p + 8 + o, ' ', pad);
	for (uint64_t i = 0; i < off; i++)
		b.p[8 + o + pad + i] = (uint8_t)rnd();
	return b;
}

static uint64_t header_len(const struct buf *b)
{
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | (i < (int)b->n ? b->p[i] : 0);
	return n;
}

/* Position inside the header text (or anywhere if the length is broken). */
static size_t header_pos(const struct buf *b)
{
	uint64_t n = header_len(b);
	size_t end = n < b->n - 8 ? (size_t)n : b->n - 8;
	return 8 + rnd_below(end + 1);
}

static const char *const tokens[] = {"{",    "}",     "[",   "]",    ",",       ":",     "\"",   "null",
				     "true", "-",     "0",   "1e400", "\"F64\"", "[]",    "{}",   "\\u0000",
				     "\\",   "\xff",  "\"dtype\"", "\"shape\"", "\"data_offsets\"", "__metadata__",
				     "[0,0]", "[1,2,3]"};
static const char *const numbers[] = {"0", "-1", "1", "7", "18446744073709551615", "9223372036854775807",
				      "9223372036854775808", "4294967296", "1.5", "-0", "1e3", "65536",
				      "99999999999999999999999", "2", "3", "1024"};

/* Replace the digit run at a random digit in the header with another number. */
static void mutate_number(struct buf *b)
{
	size_t start = header_pos(b);
	for (size_t k = 0; k < b->n; k++) {
		size_t i = 8 + (start - 8 + k) % (b->n - 8 > 0 ? b->n - 8 : 1);
		if (i >= b->n || b->p[i] < '0' || b->p[i] > '9')
			continue;
		size_t j = i;
		while (j < b->n && b->p[j] >= '0' && b->p[j] <= '9')
			j++;
		while (i > 8 && b->p[i - 1] >= '0' && b->p[i - 1] <= '9')
			i--;
		const char *num = numbers[rnd_below(ARRAY_LEN(numbers))];
		char tmp[32];
		if (rnd() % 3 == 0) {
			snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)(rnd() % 100000));
			num = tmp;
		}
		buf_erase(b, i, j - i);
		buf_insert(b, i, num, strlen(num));
		return;
	}
}

static void mutate(struct buf *b)
{
	size_t before = b->n;
	switch (rnd() % 9) {
	case 0: /* byte flip in the header */
		if (b->n > 8)
			b->p[header_pos(b) % b->n] = (uint8_t)rnd();
		break;
	case 1: /* bit flip anywhere, length field included */
		if (b->n)
			b->p[rnd_below(b->n)] ^= (uint8_t)(1u << (rnd() % 8));
		break;
	case 2: /* truncation */
		b->n = rnd_below(b->n + 1);
		return;
	case 3: { /* token insertion */
		const char *t = tokens[rnd_below(ARRAY_LEN(tokens))];
		buf_insert(b, header_pos(b) % (b->n + 1), t, strlen(t));
		break;
	}
	case 4: /* deletion */
		if (b->n > 8)
			buf_erase(b, header_pos(b) % b->n, 1 + rnd_below(8));
		break;
	case 5:
	case 6:
		mutate_number(b);
		break;
	case 7: /* length field */
		if (b->n >= 8) {
			uint64_t n = header_len(b);
			uint64_t choices[] = {0, 1, n - 1, n + 1, n + 8, UINT64_MAX, 1ull << 63, b->n - 8, b->n, rnd()};
			set_len(b, choices[rnd_below(ARRAY_LEN(choices))]);
		}
		return;
	case 8: /* random bytes inserted */
	{
		uint8_t junk[4];
		for (int i = 0; i < 4; i++)
			junk[i] = (uint8_t)rnd();
		buf_insert(b, header_pos(b) % (b->n + 1), junk, 1 + rnd_below(4));
		break;
	}
	}
	/* Keep the length consistent with the text most of the time, so that
	 * the JSON itself (not only the framing) gets exercised. */
	if (b->n >= 8 && b->n != before && rnd() % 4)
		set_len(b, header_len(b) + b->n - before);
}

/* Check every invariant of a successful parse, and touch every byte. */
static void check_ok(const uint8_t *file, size_t n, const struct model_st_header *h)
{
	T_CHECK(8 + h->header_bytes + h->data_bytes == n);
	const uint8_t *data = file + 8 + h->header_bytes;
	uint64_t covered = 0;
	volatile uint8_t sink = 0;
	for (size_t i = 0; i < h->n_tensors; i++) {
		const struct model_st_tensor *t = &h->tensors[i];
		T_CHECK(t->name && t->name[0] && strlen(t->name) <= MODEL_ST_MAX_NAME_BYTES);
		T_CHECK((unsigned)t->dtype < MODEL_DTYPE_COUNT);
		T_CHECK(t->n_dims >= 0 && t->n_dims <= MODEL_MAX_DIMS);
		uint64_t el = 1;
		for (int d = 0; d < t->n_dims; d++) {
			T_CHECK(t->shape[d] >= 0);
			el *= (uint64_t)t->shape[d];
		}
		T_CHECK(el == t->n_elements && t->n_bytes == el * model_dtype_bytes(t->dtype));
		T_CHECK(t->data_begin_bytes <= h->data_bytes && t->n_bytes <= h->data_bytes - t->data_begin_bytes);
		if (t->n_bytes) {
			sink ^= data[t->data_begin_bytes];
			sink ^= data[t->data_begin_bytes + t->n_bytes - 1];
		}
		covered += t->n_bytes;
	}
	/* exact tiling: total bytes equal the data section (no overlap given no hole) */
	T_CHECK(covered == h->data_bytes);
	(void)sink;
}

int main(void)
{
	uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	const char *s = getenv("DSV4_FUZZ_SEED");
	if (!s)
		s = getenv("DSV4_TEST_SEED");
	if (s)
		seed = strtoull(s, NULL, 0);
	long iters = 20000;
	if ((s = getenv("DSV4_FUZZ_ITERS")))
		iters = strtol(s, NULL, 0);
	rng_state = seed ? seed : 1;
	fprintf(stderr, "seed %llu (DSV4_FUZZ_SEED or DSV4_TEST_SEED to reproduce), %ld mutations\n", (unsigned long long)seed, iters);

	struct buf seed_file = make_seed();
	struct model_st_header h;
	struct err e;
	err_clear(&e);
	T_CHECKF(model_st_header_parse(seed_file.p, seed_file.n, "seed", &h, &e) == ST_OK, "%s", e.msg);
	T_CHECK(h.n_tensors == 13);
	model_st_header_free(&h);

	long n_ok = 0, n_refused = 0;
	for (long it = 0; it < iters; it++) {
		struct buf b = {0};
		buf_reserve(&b, seed_file.n);
		memcpy(b.p, seed_file.p, seed_file.n);
		b.n = seed_file.n;
		int n_mut = 1 + (int)(rnd() % 3);
		for (int m = 0; m < n_mut; m++)
			mutate(&b);
		/* exact-size copy so ASan sees any overread */
		uint8_t *exact = malloc(b.n ? b.n : 1);
		memcpy(exact, b.p, b.n);
		err_clear(&e);
		enum status st = model_st_header_parse(exact, b.n, "mutant.safetensors", &h, &e);
		if (st == ST_OK) {
			n_ok++;
			check_ok(exact, b.n, &h);
			model_st_header_free(&h);
		} else {
			n_refused++;
			T_CHECKF(st == ST_INVALID && e.msg[0] && strstr(e.msg, "mutant.safetensors"),
				 "iteration %ld: status %s, message '%s'", it, status_str(st), e.msg);
			T_CHECK(h.tensors == NULL && h.names == NULL);
		}
		free(exact);
		free(b.p);
	}
	free(seed_file.p);
	fprintf(stderr, "%ld parsed consistently, %ld refused\n", n_ok, n_refused);
	/* Both outcomes must occur, or the mutations are not exercising the parser. */
	T_CHECK(n_ok > 0 && n_refused > iters / 4);
	return test_exit();
}
