/*
 * tests/kernels/test_moe_dispatch_gpu.c (suite gpu): the CUDA moe_dispatch
 * and moe_combine variants against the CPU references on fresh random
 * routings: dispatch must match exactly (it is deterministic), combine
 * within f32 tolerance, every output written (NaN-filled first). Exits 77
 * without a GPU.
 */
#include "tests/kernels/gpu_test_util.h"

/* The op's CUDA variant with a run_host, or NULL. */
static const struct kern_variant *cuda_variant(const struct kern_op *op)
{
	const struct kern_variant *v = gt_cuda_generic(op);
	return v && v->run_host ? v : NULL;
}

static void one_case(const struct kern_variant *vd, const struct kern_variant *vc, uint64_t *rng, int64_t T,
		     int k, int Eg, int base, int E)
{
	int64_t S = T * k;
	size_t sb = sizeof(int32_t) * (size_t)(S + 1);
	int32_t *ids = malloc(sb), *off[2], *src[2], *rsl[2], *srow[2];
	int64_t nr[2] = {-1, -1};
	for (int64_t s = 0; s < S; s++)
		ids[s] = kern_rand_u64(rng) % 13 == 0 ? -1 : (int32_t)gt_rnd(rng, 0, Eg - 1);
	for (int i = 0; i < 2; i++) {
		off[i] = malloc(sizeof(int32_t) * (size_t)(E + 1));
		src[i] = calloc((size_t)S + 1, 4);
		rsl[i] = calloc((size_t)S + 1, 4);
		srow[i] = calloc((size_t)S + 1, 4);
		struct kern_moe_dispatch_args d = {.n_tokens = T, .top_k = k, .topk_ids = ids, .expert_base = base,
						   .n_experts = E, .expert_offsets = off[i], .row_src = src[i],
						   .row_slot = rsl[i], .slot_row = srow[i], .n_rows = &nr[i]};
		enum status st = i ? ((kern_moe_dispatch_fn)vd->run_host)(&d) : kern_moe_dispatch_ref(&d);
		T_CHECKF(st == ST_OK, "dispatch %d: %s", i, status_str(st));
	}
	T_CHECK(nr[0] == nr[1]);
	T_CHECK(!memcmp(off[0], off[1], sizeof(int32_t) * (size_t)(E + 1)));
	T_CHECK(!memcmp(srow[0], srow[1], sizeof(int32_t) * (size_t)S));
	T_CHECK(nr[0] < 0 || (!memcmp(src[0], src[1], sizeof(int32_t) * (size_t)nr[0]) &&
			      !memcmp(rsl[0], rsl[1], sizeof(int32_t) * (size_t)nr[0])));
	/* Combine on the dispatched rows. */
	int64_t dim = gt_rnd(rng, 1, 600);
	int64_t R = nr[0] > 0 ? nr[0] : 1;
	float *y = malloc(sizeof(float) * (size_t)(R * dim)), *sw = malloc(sizeof(float) * (size_t)(S + 1));
	float *o0 = malloc(sizeof(float) * (size_t)(T * dim + 1)), *o1 = malloc(sizeof(float) * (size_t)(T * dim + 1));
	for (int64_t i = 0; i < R * dim; i++)
		y[i] = kern_rand_f32(rng);
	for (int64_t s = 0; s < S; s++)
		sw[s] = kern_rand_f32(rng);
	int acc = (int)(kern_rand_u64(rng) & 1);
	for (int64_t i = 0; i < T * dim; i++)
		o0[i] = o1[i] = acc ? kern_rand_f32(rng) : NAN;
	struct kern_moe_combine_args c = {.n_tokens = T, .top_k = k, .dim = dim, .slot_row = srow[0],
					  .slot_weight = (kern_rand_u64(rng) & 1) ? sw : NULL, .y = y, .out = o0,
					  .accumulate = acc};
	T_CHECK(kern_moe_combine_ref(&c) == ST_OK);
	c.out = o1;
	T_CHECK(((kern_moe_combine_fn)vc->run_host)(&c) == ST_OK);
	gt_cmp("combine", o0, o1, (size_t)(T * dim), 1e-6, 1e-5);
	for (int i = 0; i < 2; i++) {
		free(off[i]);
		free(src[i]);
		free(rsl[i]);
		free(srow[i]);
	}
	free(ids);
	free(y);
	free(sw);
	free(o0);
	free(o1);
}

int main(int argc, char **argv)
{
	struct kern_device dev;
	int rc = gt_open_device(&dev);
	if (rc)
		return rc;
	const struct kern_variant *vd = cuda_variant(&kern_op_moe_dispatch), *vc = cuda_variant(&kern_op_moe_combine);
	struct kern_problem p = {.wfmt = KERN_WFMT_NONE, .tp_size = 1};
	if (!vd || !vc || !kern_variant_accepts(vd, &p, &dev, NULL, NULL, 0) ||
	    !kern_variant_accepts(vc, &p, &dev, NULL, NULL, 0))
		return test_skip("no CUDA dispatch/combine variant loads on this device");
	uint64_t rng = gt_seed(argc, argv, &dev);
	one_case(vd, vc, &rng, 1, 6, 256, 0, 256);
	one_case(vd, vc, &rng, 3000, 6, 256, 0, 256);  /* a prefill chunk: many chunks of 256 slots */
	one_case(vd, vc, &rng, 500, 6, 256, 128, 128); /* expert-parallel half */
	for (int i = 0; i < 20; i++) {
		int Eg = (int)gt_rnd(&rng, 1, 300), base = (int)gt_rnd(&rng, 0, Eg - 1);
		one_case(vd, vc, &rng, gt_rnd(&rng, 1, 700), (int)gt_rnd(&rng, 1, 8), Eg, base,
			 (int)gt_rnd(&rng, 1, Eg - base));
	}
	return test_exit();
}
