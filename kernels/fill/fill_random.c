/*
 * kernels/fill/fill_random.c: op fill_random (fill_random.h): the CPU
 * reference, the argument check and the registry table.
 *
 * Variants (priority order, highest first):
 *   fill_random_cuda_generic  cc >= 8.0, sm_80 image (fill_random_generic.cu):
 *                             one thread per element, bit-identical;
 *   fill_random_cpu_ref       this file, every shape.
 */
#include "kernels/fill/fill_random.h"

#include <string.h>

#include "dsv4_config.h"
#if DSV4_HAVE_CUDA
#include "kernels/fill/fill_random_generic.h"
#endif

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

int kern_fill_elem_bytes(enum kern_fill_kind k)
{
	static const int b[KERN_FILL_KIND_COUNT] = {4, 2, 1, 1, 1, 8, 4};
	return (int)k >= 0 && k < KERN_FILL_KIND_COUNT ? b[k] : 0;
}

enum status kern_fill_random_check(const struct kern_fill_random_args *a)
{
	if (!a || a->n < 0 || !kern_fill_elem_bytes(a->kind) || (a->n > 0 && !a->dst))
		return ST_INVALID;
	if (a->kind == KERN_FILL_E4M3 && (a->e_lo < 0 || a->e_hi > 14 || a->e_lo > a->e_hi))
		return ST_INVALID;
	if (a->kind == KERN_FILL_E8M0 && (a->e_lo < 0 || a->e_hi > 254 || a->e_lo > a->e_hi))
		return ST_INVALID;
	if ((a->kind == KERN_FILL_INDEX_I64 || a->kind == KERN_FILL_INDEX_I32) && (a->cols < 1 || a->n_index < 1))
		return ST_INVALID;
	return ST_OK;
}

static uint16_t bf16_rne(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

enum status kern_fill_random_ref(const struct kern_fill_random_args *a)
{
	enum status st = kern_fill_random_check(a);
	if (st)
		return st;
	for (int64_t i = 0; i < a->n; i++) {
		uint64_t h = mix64(a->seed ^ mix64((uint64_t)i));
		float u = (float)(h >> 40) * (1.0f / 16777216.0f);
		float v = a->lo + (a->hi - a->lo) * u;
		uint64_t span = (uint64_t)(a->e_hi - a->e_lo + 1);
		switch (a->kind) {
		case KERN_FILL_UNIFORM_F32:
			((float *)a->dst)[i] = v;
			break;
		case KERN_FILL_UNIFORM_BF16:
			((uint16_t *)a->dst)[i] = bf16_rne(v);
			break;
		case KERN_FILL_E4M3: {
			unsigned ex = (unsigned)a->e_lo + (unsigned)((h >> 8) % span);
			unsigned sign = a->positive ? 0u : (unsigned)(h >> 63);
			((uint8_t *)a->dst)[i] = (uint8_t)((sign << 7) | (ex << 3) | (unsigned)(h & 7u));
			break;
		}
		case KERN_FILL_E8M0:
			((uint8_t *)a->dst)[i] = (uint8_t)((uint64_t)a->e_lo + (h >> 8) % span);
			break;
		case KERN_FILL_BYTES:
			((uint8_t *)a->dst)[i] = (uint8_t)(h >> 56);
			break;
		default: {
			uint64_t r = (uint64_t)i / (uint64_t)a->cols, c = (uint64_t)i % (uint64_t)a->cols;
			uint64_t x = (mix64(a->seed ^ r) + c) % (uint64_t)a->n_index;
			if (a->kind == KERN_FILL_INDEX_I64)
				((int64_t *)a->dst)[i] = (int64_t)x;
			else
				((int32_t *)a->dst)[i] = (int32_t)x;
			break;
		}
		}
	}
	return ST_OK;
}

static const struct kern_variant fill_random_variants[] = {
	{
		.name = "fill_random_cpu_ref",
		.backend = KERN_BACKEND_CPU,
		.priority = 0,
		.run = KERN_FN(kern_fill_random_ref),
		.run_host = KERN_FN(kern_fill_random_ref),
		.desc = "CPU reference: counter-based random tensor contents (--load-format dummy)",
	},
	{
		.name = "fill_random_cuda_generic",
		.backend = KERN_BACKEND_CUDA,
		.cc_min = 80,
		.cc_max = KERN_CC_ANY,
		.target = KERN_TARGET_SM80,
		.priority = 10,
#if DSV4_HAVE_CUDA
		.run = KERN_FN(kern_fill_random_cuda_generic),
		.run_host = KERN_FN(kern_fill_random_cuda_generic_host),
#endif
		.desc = "portable CUDA fill_random, one thread per element, bit-identical to the reference",
	},
};

const struct kern_op kern_op_fill_random = {
	.name = "fill_random",
	.variants = fill_random_variants,
	.n_variants = (int)(sizeof fill_random_variants / sizeof fill_random_variants[0]),
};
