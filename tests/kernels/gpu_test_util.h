/*
 * tests/kernels/gpu_test_util.h: what every kernel test of the gpu suite
 * (tests/kernels/test_*_gpu.c) needs, written once:
 *   - gt_open_device: the device, or the reason to skip (exit 77);
 *   - gt_seed: a fresh seed per run, printed, repeatable (argv[1] or
 *     DSV4_TEST_SEED);
 *   - random cases: gt_rnd, gt_frand, gt_x_rand (activations whose
 *     magnitude changes per 128-column block or per element),
 *     gt_expert_offsets (ragged expert loads, empties included), and one
 *     whole grouped expert GEMM case (gt_moe_gemm_case);
 *   - poisoned outputs: gt_poison fills an output with NaN before the kernel
 *     runs; gt_check_rows then compares the rows with the reference and
 *     checks that the row padding stayed NaN (an unwritten element and a
 *     write where none belongs both fail);
 *   - gt_start: gt_open_device then gt_seed, the start of every main;
 *   - guards and selection: gt_refuses (a variant refuses a problem, naming
 *     why), gt_moe_gemm_picks (selection picks one variant for the model's
 *     expert shapes), gt_mma_selected (the tensor-core variant chosen where
 *     it must be), gt_next_cuda_host (the CUDA variants with a host entry);
 *   - device round trips for tests that call run() on device buffers:
 *     gt_dalloc / gt_dup / gt_down / gt_dfree_all on gt_stream (CUDA
 *     builds).
 * Header-only (static inline): tests/test.h keeps its check counters per
 * translation unit, so the checks made here must be compiled into the test.
 */
#ifndef DSV4_TESTS_KERNELS_GPU_TEST_UTIL_H
#define DSV4_TESTS_KERNELS_GPU_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "tests/test.h"

/* 0 with *dev filled when a CUDA device is usable; otherwise the exit code:
 * 77 (skip) without CUDA in the build or without a device, 1 when a device
 * is there but cannot be read. */
static inline int gt_open_device(struct kern_device *dev)
{
	if (!DSV4_HAVE_CUDA)
		return test_skip("built without CUDA");
	if (kern_device_count() == 0)
		return test_skip("no CUDA device");
	struct err e = {0};
	if (kern_device_detect(0, dev, &e) != ST_OK) {
		fprintf(stderr, "device 0: %s\n", e.msg);
		return 1;
	}
	return 0;
}

/* A seed from argv[1] (when argc > 1), DSV4_TEST_SEED, or the clock; printed
 * with the device so that a failure can be repeated. */
static inline uint64_t gt_seed(int argc, char **argv, const struct kern_device *dev)
{
	const char *s = argc > 1 ? argv[1] : getenv("DSV4_TEST_SEED");
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t seed = s ? strtoull(s, NULL, 0)
			  : ((uint64_t)ts.tv_sec * 0x9E3779B97F4A7C15ull) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)clock();
	fprintf(stderr, "device %s (cc %d.%d), seed %llu (DSV4_TEST_SEED=<seed> repeats the run)\n", dev->name,
		dev->cc_major, dev->cc_minor, (unsigned long long)seed);
	return seed;
}

/* What a gpu-suite test's main starts from: the device and a seeded rng, or
 * the code the test exits with. */
struct gt_env {
	struct kern_device dev;
	uint64_t rng;
	int exit_code;
};

/* gt_open_device then gt_seed into *g; nonzero when the test cannot run
 * (then it returns g->exit_code). */
static inline int gt_start(int argc, char **argv, struct gt_env *g)
{
	g->exit_code = gt_open_device(&g->dev);
	if (!g->exit_code)
		g->rng = gt_seed(argc, argv, &g->dev);
	return g->exit_code;
}

/* Uniform integer in [lo, hi]. */
static inline int64_t gt_rnd(uint64_t *rng, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(kern_rand_u64(rng) % (uint64_t)(hi - lo + 1));
}

static inline void *gt_malloc(size_t bytes)
{
	void *p = malloc(bytes + 16);
	if (!p) {
		fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
		exit(2);
	}
	return p;
}

/* n uniform values in (-mag, mag). */
static inline float *gt_frand(uint64_t *rng, size_t n, float mag)
{
	float *p = gt_malloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = kern_rand_f32(rng) * mag;
	return p;
}

/* n NaNs: an output nothing has written yet. */
static inline float *gt_fnan(size_t n)
{
	float *p = gt_malloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
	return p;
}

static inline float *gt_fcopy(const float *x, size_t n)
{
	float *p = gt_malloc(n * sizeof *p);
	memcpy(p, x, n * sizeof *p);
	return p;
}

static inline int32_t *gt_ifill(size_t n, int32_t v)
{
	int32_t *p = gt_malloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = v;
	return p;
}

/* The variant of op named name, or NULL. */
static inline const struct kern_variant *gt_find(const struct kern_op *op, const char *name)
{
	for (int i = 0; i < op->n_variants; i++)
		if (!strcmp(op->variants[i].name, name))
			return &op->variants[i];
	return NULL;
}

/* The op's portable CUDA variant (the *_cuda_generic row), or NULL. */
static inline const struct kern_variant *gt_cuda_generic(const struct kern_op *op)
{
	for (int i = 0; i < op->n_variants; i++)
		if (op->variants[i].backend == KERN_BACKEND_CUDA && strstr(op->variants[i].name, "_cuda_generic"))
			return &op->variants[i];
	return NULL;
}

/* T_STR_CONTAINS on a char array trips -Waddress; this takes a pointer. */
static inline void gt_contains(const char *hay, const char *needle)
{
	T_STR_CONTAINS(hay, needle);
}

/* |got - ref| <= atol + rtol·max|ref| over n values (kern_compare_f32). */
static inline bool gt_cmp(const char *what, const float *ref, const float *got, size_t n, double atol, double rtol)
{
	char why[KERN_REASON_BYTES] = "";
	bool ok = kern_compare_f32(ref, got, n, atol, rtol, why, sizeof why);
	T_CHECKF(ok, "%s: %s", what, why);
	return ok;
}

/* Activations [rows, ldx] of dtype dt: uniform values times 2^e, e drawn in
 * [-mag_exp, mag_exp] afresh every mag_every columns of every row (128: per
 * scale block, so a transposed scale index fails; 1: per element; mag_exp
 * 0: no scaling), NaN in the columns in..ldx-1 (never to be read). */
static inline void *gt_x_rand(uint64_t *rng, int64_t rows, int64_t in, int64_t ldx, enum kern_dtype dt, int mag_exp,
			      int64_t mag_every)
{
	void *x = gt_malloc((size_t)(rows * ldx) * 4);
	float mag = 1.0f;
	for (int64_t t = 0; t < rows; t++)
		for (int64_t k = 0; k < ldx; k++) {
			if (mag_exp && k % mag_every == 0)
				mag = ldexpf(1.0f, (int)gt_rnd(rng, -mag_exp, mag_exp));
			kern_store_f32(x, dt, t * ldx + k, k < in ? kern_rand_f32(rng) * mag : NAN);
		}
	return x;
}

/* Offsets [E + 1] of R rows over E experts with random loads: about a third
 * of the experts empty, the last takes what is left (off[E] == R is the
 * contract). first >= 0: expert 0 gets exactly first rows when E > 1 and R
 * allows (a tile boundary: a full tile, a tile and one row). */
static inline void gt_expert_offsets(uint64_t *rng, int64_t E, int64_t R, int64_t first, int32_t *off)
{
	int64_t left = R;
	off[0] = 0;
	for (int64_t x = 0; x < E; x++) {
		int64_t c = x + 1 == E ? left : (kern_rand_u64(rng) % 3 == 0 ? 0 : gt_rnd(rng, 0, left));
		if (x == 0 && E > 1 && first >= 0 && left >= first)
			c = first;
		off[x + 1] = off[x] + (int32_t)c;
		left -= c;
	}
}

/* An output buffer [rows, ld] of dtype dt, every element NaN. */
static inline void *gt_poisoned(enum kern_dtype dt, int64_t rows, int64_t ld)
{
	void *y = gt_malloc((size_t)(rows * ld) * 4);
	for (int64_t i = 0; i < rows * ld; i++)
		kern_store_f32(y, dt, i, NAN);
	return y;
}

/* After a variant wrote y [rows, ldy] (dtype ydt, from gt_poisoned) with
 * status st: the first out columns of every row agree with yref [rows, out]
 * (f32) within rtol of max |yref|, and columns out..ldy-1 are still NaN.
 * name / label say which variant and which case. Returns true on a pass. */
static inline bool gt_check_rows(const char *name, const char *label, enum status st, const float *yref,
				 const void *y, enum kern_dtype ydt, int64_t rows, int64_t out, int64_t ldy, double rtol)
{
	T_CHECKF(st == ST_OK, "%s (%s): %s", name, label, status_str(st));
	if (st != ST_OK)
		return false;
	float *yf = gt_malloc((size_t)(rows * out) * 4);
	int64_t pad_written = 0;
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t o = 0; o < out; o++)
			yf[r * out + o] = kern_load_f32(y, ydt, r * ldy + o);
		for (int64_t o = out; o < ldy; o++)
			pad_written += !isnan(kern_load_f32(y, ydt, r * ldy + o));
	}
	char why[KERN_REASON_BYTES] = "";
	bool ok = kern_compare_f32(yref, yf, (size_t)(rows * out), 1e-6, rtol, why, sizeof why);
	T_CHECKF(ok, "%s %s: %s", name, label, why);
	T_CHECKF(pad_written == 0, "%s %s: %lld elements written past out into the row padding", name, label,
		 (long long)pad_written);
	free(yf);
	return ok && pad_written == 0;
}

/* kern_select_checked for p on dev with nothing disabled (slot: the plan
 * slot the choice is logged under). Returns the choice, NULL when selection
 * failed (reported); *n_dropped = variants its self-check dropped. */
static inline const struct kern_variant *gt_select_checked(const struct kern_op *op, const struct kern_problem *p,
							   const struct kern_device *dev, int slot, int *n_dropped)
{
	struct err e = {0};
	struct kern_disabled dis;
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
	const struct kern_variant *got = NULL;
	T_CHECKF(kern_select_checked(op, p, dev, &dis, slot, &got, &e) == ST_OK, "%s: %s", op->name, e.msg);
	*n_dropped = dis.n;
	return got;
}

/* Variant v refuses problem p on dev with a reason containing needle. */
static inline void gt_refuses(const struct kern_variant *v, const struct kern_problem *p, const struct kern_device *dev,
			      const char *needle)
{
	char why[KERN_REASON_BYTES] = "";
	T_CHECKF(!kern_variant_accepts(v, p, dev, NULL, why, sizeof why), "%s accepts what it must refuse (%s)", v->name,
		 needle);
	gt_contains(why, needle);
}

/* An FP4 grouped-GEMM variant v refuses, on dev, msh (an NVFP4 shape it
 * accepts) with FP8 weights and with an in that is not a multiple of 32. */
static inline void gt_fp4_moe_gemm_guards(const struct kern_variant *v, const struct kern_moe_gemm_shape *msh,
					  const struct kern_device *dev)
{
	struct kern_problem fp8 = {.wfmt = KERN_WFMT_FP8_E8M0_B128, .tp_size = 1, .shape = msh};
	gt_refuses(v, &fp8, dev, "weight format fp8");
	struct kern_moe_gemm_shape odd = *msh;
	odd.in = msh->in + 16;
	struct kern_problem op_odd = {.wfmt = KERN_WFMT_NVFP4, .tp_size = 1, .shape = &odd};
	gt_refuses(v, &op_odd, dev, "multiple of 32");
}

/* The CUDA variants of op with a host entry point (run_host), in table order:
 * for (v = gt_next_cuda_host(op, NULL); v; v = gt_next_cuda_host(op, v)). */
static inline const struct kern_variant *gt_next_cuda_host(const struct kern_op *op, const struct kern_variant *prev)
{
	for (int i = prev ? (int)(prev - op->variants) + 1 : 0; i < op->n_variants; i++)
		if (op->variants[i].backend == KERN_BACKEND_CUDA && op->variants[i].run_host)
			return &op->variants[i];
	return NULL;
}

/* Selection on dev (plan slot 3) for each expert shape [in, out] of
 * model[n_model], NVFP4 then MXFP4 weights, plans of max_rows rows: want is
 * chosen and the self-check drops nothing. */
static inline void gt_moe_gemm_picks(const struct kern_device *dev, const int64_t (*model)[2], int n_model,
				     int64_t max_rows, const struct kern_variant *want)
{
	for (int i = 0; i < n_model; i++)
		for (int f = 0; f < 2; f++) {
			struct kern_moe_gemm_shape sh = {.in = model[i][0], .out = model[i][1], .n_experts = 256,
							 .max_rows = max_rows, .act_quant_block = 128,
							 .x_dtype = KERN_DT_BF16, .y_dtype = KERN_DT_BF16};
			struct kern_problem p = {.wfmt = f ? KERN_WFMT_MXFP4 : KERN_WFMT_NVFP4, .tp_size = 1, .shape = &sh};
			int dropped = 0;
			const struct kern_variant *got = gt_select_checked(&kern_op_moe_gemm, &p, dev, 3, &dropped);
			T_CHECKF(got == want && dropped == 0, "[%lld -> %lld] %s: chose %s (%d dropped by self-check)",
				 (long long)model[i][0], (long long)model[i][1], kern_wfmt_name(p.wfmt),
				 got ? got->name : "nothing", dropped);
		}
}

/* Every op of ops[n] (weight-free) has its *_cuda_generic variant compiled
 * (run, and run_host when with_host) and selection on dev picks it. false
 * when one is missing (reported; the test cannot go on). */
static inline bool gt_generic_ops_picked(const struct kern_op *const *ops, size_t n, const struct kern_device *dev,
					 bool with_host)
{
	bool all = true;
	for (size_t i = 0; i < n; i++) {
		const struct kern_variant *v = gt_cuda_generic(ops[i]), *pick = NULL;
		const bool ok = v && v->run && (v->run_host || !with_host);
		T_CHECKF(ok, "op %s has no compiled CUDA variant", ops[i]->name);
		if (!ok) {
			all = false;
			continue;
		}
		struct err e = {0};
		struct kern_problem p = {.wfmt = KERN_WFMT_NONE, .tp_size = 1};
		T_CHECKF(kern_select(ops[i], &p, dev, NULL, -1, &pick, &e) == ST_OK && pick == v, "op %s: picked %s (%s)",
			 ops[i]->name, pick ? pick->name : "none", e.msg);
	}
	return all;
}

/* The portable tensor-core variants of op for dev: <prefix>_bf16, which
 * must accept p, then <prefix>_fp8_<image> of the device's cc when it
 * accepts p (a build with the device's own image must offer it). Returns
 * how many went into vs (0: the bf16 one is missing). */
static inline int gt_mma_variants(const struct kern_op *op, const char *prefix, const struct kern_problem *p,
				  const struct kern_device *dev, const struct kern_variant *vs[2])
{
	char name[64], why[KERN_REASON_BYTES] = "";
	snprintf(name, sizeof name, "%s_bf16", prefix);
	const struct kern_variant *bf = gt_find(op, name);
	T_CHECKF(bf != NULL, "no variant %s", name);
	if (!bf)
		return 0;
	T_CHECKF(kern_variant_accepts(bf, p, dev, NULL, why, sizeof why), "%s refused: %s", name, why);
	vs[0] = bf;
	const int cc = dev->cc_major * 10 + dev->cc_minor;
	const bool own_image = (cc == 90 && DSV4_HAVE_SM_90A) || (cc == 100 && DSV4_HAVE_SM_100A) ||
			       (cc == 120 && DSV4_HAVE_SM_120A) || (cc == 121 && DSV4_HAVE_SM_121A);
	snprintf(name, sizeof name, "%s_fp8_sm%da", prefix, cc);
	const struct kern_variant *f8 = gt_find(op, name);
	if (f8 && kern_variant_accepts(f8, p, dev, NULL, why, sizeof why)) {
		vs[1] = f8;
		return 2;
	}
	fprintf(stderr, "no %s on this device/build (%s): bf16 only\n", name, f8 ? why : "no such variant");
	T_CHECKF(!own_image, "%s refused on its own device: %s", name, f8 ? why : "no such variant");
	return 1;
}

/* Selection for p on dev (plan slot 0, nothing disabled), printed after
 * what (the problem); on cc 10.0 and 12.x it must be vs[nv - 1], the
 * device's own FP8 tensor-core variant when gt_mma_variants found one. */
static inline void gt_mma_selected(const struct kern_op *op, const struct kern_problem *p,
				   const struct kern_device *dev, const struct kern_variant *const *vs, int nv,
				   const char *what)
{
	struct err e = {0};
	struct kern_disabled dis;
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
	const struct kern_variant *got = NULL;
	T_CHECKF(kern_select(op, p, dev, &dis, 0, &got, &e) == ST_OK, "%s", e.msg);
	fprintf(stderr, "selected for %s: %s\n", what, got ? got->name : "nothing");
	const int cc = dev->cc_major * 10 + dev->cc_minor;
	if (cc == 100 || cc == 120 || cc == 121)
		T_CHECKF(got == vs[nv - 1], "chose %s, expected %s", got ? got->name : "nothing", vs[nv - 1]->name);
}

/* One grouped expert GEMM case for variant v: E random experts of fmt
 * [out, in] (prepared for v), rows grouped by off [E + 1]; gathered from 1
 * to 9 x rows through row_src when gather, else in place; x of dtype xdt
 * (gt_x_rand with mag_exp, per element); act_quant aq. v's run_host writes a
 * poisoned y of ydt, checked against kern_moe_gemm_ref (f32) within
 * 1e-4 of max |y| (f32 y: only the summation order differs) or 1e-2 (bf16
 * y: one more rounding). Returns true on a pass. */
static inline bool gt_moe_gemm_case(const struct kern_variant *v, uint64_t *rng, enum kern_wfmt fmt, int64_t E,
				    const int32_t *off, int64_t in, int64_t out, int aq, bool gather,
				    enum kern_dtype xdt, enum kern_dtype ydt, int mag_exp)
{
	struct err e = {0};
	const int64_t R = off[E];
	struct kern_wmat *w = calloc((size_t)E, sizeof *w), *wp = calloc((size_t)E, sizeof *wp);
	for (int64_t x = 0; x < E; x++) {
		T_CHECK(kern_wmat_make_random(&w[x], fmt, out, in, rng, &e) == ST_OK);
		T_CHECK(kern_prepare_weight(v, &w[x], &wp[x], &e) == ST_OK);
	}
	const int64_t X = gather ? gt_rnd(rng, 1, 9) : (R ? R : 1);
	int32_t *src = gather ? gt_malloc(sizeof(int32_t) * (size_t)R) : NULL;
	for (int64_t r = 0; gather && r < R; r++)
		src[r] = (int32_t)gt_rnd(rng, 0, X - 1);
	void *xb = gt_x_rand(rng, X, in, in, xdt, mag_exp, 1);
	float *yr = gt_malloc((size_t)(R * out) * 4);
	void *yg = gt_poisoned(ydt, R, out);
	struct kern_moe_gemm_args a = {.n_rows = R, .n_experts = E, .expert_offsets = off, .row_src = src,
				       .n_x_rows = X, .x = xb, .x_dtype = xdt, .y = yr, .y_dtype = KERN_DT_F32,
				       .w = w, .act_quant_block = aq};
	char label[112];
	snprintf(label, sizeof label, "%s E%lld R%lld in%lld out%lld aq%d gather%d x%s y%s", kern_wfmt_name(fmt),
		 (long long)E, (long long)R, (long long)in, (long long)out, aq, gather, xdt ? "bf16" : "f32",
		 ydt ? "bf16" : "f32");
	enum status rst = kern_moe_gemm_args_check(&a, &e);
	T_CHECKF(rst == ST_OK, "test built arguments outside the contract (%s): %s", label, e.msg);
	if (rst == ST_OK)
		rst = kern_moe_gemm_ref(&a);
	T_CHECKF(rst == ST_OK, "reference failed (%s): %s", label, status_str(rst));
	a.w = wp;
	a.y = yg;
	a.y_dtype = ydt;
	bool ok = rst == ST_OK && gt_check_rows(v->name, label, ((kern_moe_gemm_fn)v->run_host)(&a), yr, yg, ydt, R,
						out, out, ydt == KERN_DT_BF16 ? 1e-2 : 1e-4);
	free(xb);
	free(yr);
	free(yg);
	free(src);
	for (int64_t x = 0; x < E; x++) {
		kern_wmat_release(&wp[x]);
		kern_wmat_release(&w[x]);
	}
	free(w);
	free(wp);
	return ok;
}

#if DSV4_HAVE_CUDA
#include <cuda_runtime.h>

/* ---- device round trips for tests that call run() on device buffers ---- */

/* State behind inline accessors: a static variable here would be "unused"
 * in the tests that do not need it. */
struct gt__dev {
	cudaStream_t stream;
	void *ptrs[256];
	int n;
};

static inline struct gt__dev *gt__dev(void)
{
	static struct gt__dev d;
	return &d;
}

#define gt_stream (gt__dev()->stream) /* a non-default stream: gt_stream_create() */

static inline void gt_stream_create(void)
{
	T_CHECK(cudaStreamCreate(&gt_stream) == cudaSuccess);
}

/* bytes of device memory (uninitialised), freed by gt_dfree_all. */
static inline void *gt_dalloc(size_t bytes)
{
	void *d = NULL;
	struct gt__dev *g = gt__dev();
	if (g->n == 256 || cudaMalloc(&d, bytes + 16) != cudaSuccess) {
		fprintf(stderr, "cudaMalloc %zu failed (or more than 256 buffers)\n", bytes);
		exit(1);
	}
	g->ptrs[g->n++] = d;
	return d;
}

/* A device copy of host h (bytes; NULL stays NULL), freed by gt_dfree_all. */
static inline void *gt_dup(const void *h, size_t bytes)
{
	if (!h)
		return NULL;
	void *d = gt_dalloc(bytes);
	if (bytes)
		T_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
	return d;
}

/* h <- d (bytes) once everything on gt_stream has finished. */
static inline void gt_down(void *h, const void *d, size_t bytes)
{
	T_CHECK(cudaStreamSynchronize(gt_stream) == cudaSuccess);
	if (bytes)
		T_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}

static inline void gt_dfree_all(void)
{
	struct gt__dev *g = gt__dev();
	for (int i = 0; i < g->n; i++)
		cudaFree(g->ptrs[i]);
	g->n = 0;
}
#endif

#endif
