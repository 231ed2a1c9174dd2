/*
 * tests/kernels/test_fill_random.c: op fill_random (--load-format dummy).
 * The reference: every kind keeps its contract on fresh seeds and sizes (e4m3
 * never NaN, exponents and E8M0 bytes in range, uniforms in [lo, hi], index
 * rows distinct and in range), same seed same bytes, another seed other bytes,
 * bad arguments refused. Where a GPU is visible, fill_random_cuda_generic
 * equals the reference byte for byte (poisoned outputs, ragged sizes, one
 * launch past a grid's worth of elements). DSV4_TEST_DEVICE=cuda (the gpu
 * suite's copy) without a GPU exits 77.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/device/device.h"
#include "kernels/fill/fill_random.h"
#include "tests/test.h"

static uint64_t rng;

static uint64_t next(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static struct kern_fill_random_args random_args(enum kern_fill_kind k, int64_t n)
{
	struct kern_fill_random_args a = {.n = n, .kind = k, .seed = next()};
	a.lo = -(float)(next() % 1000) / 100.0f;
	a.hi = a.lo + (float)(next() % 1000) / 100.0f;
	a.e_lo = (int)(next() % 8);
	a.e_hi = a.e_lo + (int)(next() % 7);
	if (k == KERN_FILL_E8M0) {
		a.e_lo = 100 + (int)(next() % 20);
		a.e_hi = a.e_lo + (int)(next() % 5);
	}
	a.positive = (int)(next() % 2);
	a.cols = 1 + (int64_t)(next() % 8);
	a.n_index = a.cols + (int64_t)(next() % 300);
	return a;
}

static void check_contract(const struct kern_fill_random_args *a, const void *p)
{
	for (int64_t i = 0; i < a->n; i++) {
		switch (a->kind) {
		case KERN_FILL_UNIFORM_F32: {
			float v = ((const float *)p)[i];
			T_CHECK(v >= a->lo && v <= a->hi);
			break;
		}
		case KERN_FILL_E4M3: {
			uint8_t b = ((const uint8_t *)p)[i];
			int ex = (b >> 3) & 15;
			T_CHECK((b & 0x7f) != 0x7f && ex >= a->e_lo && ex <= a->e_hi && (!a->positive || !(b & 0x80)));
			break;
		}
		case KERN_FILL_E8M0: {
			uint8_t b = ((const uint8_t *)p)[i];
			T_CHECK(b >= a->e_lo && b <= a->e_hi);
			break;
		}
		case KERN_FILL_INDEX_I64: {
			const int64_t *v = p;
			T_CHECK(v[i] >= 0 && v[i] < a->n_index);
			for (int64_t c = i - i % a->cols; c < i; c++)
				T_CHECK(v[c] != v[i]);
			break;
		}
		default:
			break;
		}
	}
}

/* Whether another seed must change n elements of kind a (else the check
 * "another seed other bytes" would be a coin that lands wrong): every element
 * must have at least two outcomes, none of probability above about 1/2, so
 * that n >= 64 equal elements have probability below 2^-64. A bf16 range
 * narrower than two bf16 steps at its larger end can round every value to
 * one or two codes, one of them nearly always (lo -9.99, hi -9.98: all
 * -10.0); an index row of one column from a range of one is always 0. */
static int must_differ(const struct kern_fill_random_args *a, int64_t n)
{
	if (n < 64)
		return 0;
	switch (a->kind) {
	case KERN_FILL_UNIFORM_F32:
		return a->lo != a->hi;
	case KERN_FILL_UNIFORM_BF16: {
		int ex;
		frexpf(fmaxf(fabsf(a->lo), fabsf(a->hi)), &ex);
		return (double)a->hi - a->lo >= 2 * ldexp(1.0, ex - 8); /* a bf16 step at 2^(ex-1) is 2^(ex-8) */
	}
	case KERN_FILL_E8M0:
		return a->e_lo != a->e_hi;
	case KERN_FILL_INDEX_I64:
	case KERN_FILL_INDEX_I32:
		return a->n_index >= 2;
	default:
		return 1;
	}
}

int main(void)
{
	rng = test_seed() ^ 0x5eedull;
	/* the reference */
	for (int k = 0; k < KERN_FILL_KIND_COUNT; k++) {
		int64_t n = 1 + (int64_t)(next() % 5000);
		struct kern_fill_random_args a = random_args((enum kern_fill_kind)k, n);
		if (k == KERN_FILL_INDEX_I64 || k == KERN_FILL_INDEX_I32)
			n = a.n = a.cols * (1 + (int64_t)(next() % 500));
		size_t bytes = (size_t)n * (size_t)kern_fill_elem_bytes(a.kind);
		uint8_t *x = malloc(bytes), *y = malloc(bytes);
		T_CHECK(x && y);
		if (!x || !y)
			return 1;
		a.dst = x;
		T_CHECK(kern_fill_random_ref(&a) == ST_OK);
		check_contract(&a, x);
		a.dst = y;
		T_CHECK(kern_fill_random_ref(&a) == ST_OK && !memcmp(x, y, bytes));
		a.seed ^= 1;
		T_CHECK(kern_fill_random_ref(&a) == ST_OK);
		T_CHECKF(!must_differ(&a, n) || memcmp(x, y, bytes) != 0, "kind %d: seed changed nothing", k);
		free(x);
		free(y);
	}
	struct kern_fill_random_args bad = {.n = 4, .kind = KERN_FILL_E4M3, .e_lo = 3, .e_hi = 15};
	uint8_t buf[32];
	bad.dst = buf;
	T_CHECK(kern_fill_random_ref(&bad) == ST_INVALID);
	bad.kind = KERN_FILL_INDEX_I32;
	bad.cols = 0;
	T_CHECK(kern_fill_random_ref(&bad) == ST_INVALID);
	bad.kind = KERN_FILL_KIND_COUNT;
	T_CHECK(kern_fill_random_ref(&bad) == ST_INVALID && kern_fill_random_ref(NULL) == ST_INVALID);

	/* the CUDA variant against it */
	const char *want = getenv("DSV4_TEST_DEVICE");
	if (want && !strcmp(want, "cuda") && kern_device_count() < 1)
		return test_skip("no GPU");
	const struct kern_op *op = kern_registry_find_op("fill_random");
	T_CHECK(op == &kern_op_fill_random && op->n_variants == 2 && op->variants[0].backend == KERN_BACKEND_CPU);
	if (op && op->n_variants == 2 && op->variants[1].run_host && kern_device_count() > 0) {
		kern_fill_random_fn g = (kern_fill_random_fn)op->variants[1].run_host;
		int n_cases = 0;
		for (int rep = 0; rep < 6; rep++)
			for (int k = 0; k < KERN_FILL_KIND_COUNT; k++) {
				int64_t n = rep == 5 ? (int64_t)(1 << 28) + 77 + (int64_t)(next() % 1000)
						     : 1 + (int64_t)(next() % (rep < 3 ? 3000 : 3000000));
				if (rep == 5 && kern_fill_elem_bytes((enum kern_fill_kind)k) > 1)
					n = 3000001;
				struct kern_fill_random_args a = random_args((enum kern_fill_kind)k, n);
				size_t bytes = (size_t)n * (size_t)kern_fill_elem_bytes(a.kind);
				uint8_t *x = malloc(bytes), *y = malloc(bytes);
				T_CHECK(x && y);
				if (!x || !y)
					return 1;
				memset(y, 0xab, bytes);
				a.dst = x;
				T_CHECK(kern_fill_random_ref(&a) == ST_OK);
				a.dst = y;
				enum status st = g(&a);
				T_CHECKF(st == ST_OK && !memcmp(x, y, bytes), "kind %d n %lld: cuda differs (status %d)", k,
					 (long long)n, (int)st);
				free(x);
				free(y);
				n_cases++;
			}
		printf("fill_random: %d cuda cases equal the reference\n", n_cases);
	}
	return test_exit();
}
