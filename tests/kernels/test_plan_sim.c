/*
 * tests/kernels/test_plan_sim.c (suite unit, no GPU): the full load-time plan
 * of the tiny fp8 and nvfp4 checkpoints on simulated GPUs of cc 8.0, 9.0,
 * 10.0, 12.0 and 12.1 (model_weights_load with kern_device_simulate, as
 * `dsv4 kernels --simulate-cc` does).
 *   CUDA build: every load succeeds and every (layer, op) row of the plan is
 *     a CUDA variant (design.md: every op has a portable variant, so
 *     selection never fails on a supported device), and the plan covers the
 *     weight-free model ops that have generic CUDA variants.
 *   CPU-only build (no CUDA image compiled): every load fails with one line
 *     naming the layer, the op and the refusal reasons.
 * Decode plans (fp8gemv: max_step_tokens 16 on 12.0 and 12.1): every layer
 * of the model runs its FP8 linears through linear_cuda_gemv (the tiny
 * model's sites with in % 128 != 0 keep the generic kernel), and no
 * tensor-core tile variant (a 64-token plan's) appears.
 * The tiny checkpoints are generated once into $DSV4_BUILD_ROOT/tiny-models
 * (shared with the forward tests, under the same lock); skips (77) when they
 * cannot be made.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsv4_config.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/weights.h"
#include "tests/test.h"
#include "tests/tiny_dir.h"


#if DSV4_HAVE_CUDA
static const struct kern_variant *variant_named(const char *op, const char *name)
{
	const struct kern_op *o = kern_registry_find_op(op);
	for (int i = 0; o && i < o->n_variants; i++)
		if (!strcmp(o->variants[i].name, name))
			return &o->variants[i];
	return NULL;
}
#endif

static void one(const char *dir, const char *variant, int major, int minor, int64_t max_step_tokens)
{
	char path[1200];
	snprintf(path, sizeof path, "%s/tiny-%s", dir, variant);
	struct model_checkpoint_options co = {.dir = path};
	struct model_checkpoint *ck = NULL;
	struct err e = {0};
	T_CHECKF(model_checkpoint_create(&ck, &co, &e) == ST_OK, "%s: %s", path, e.msg);
	if (!ck)
		return;
	struct kern_device dev;
	kern_device_simulate(&dev, major, minor);
	struct kern_disabled dis;
	T_CHECK(kern_disabled_init(&dis, NULL, false, &e) == ST_OK);
	struct model_weights w;
	memset(&w, 0, sizeof w);
	struct model_weights_options wo = {.ck = ck, .dev = &dev, .disabled = &dis, .max_step_tokens = max_step_tokens,
					   .quant_sim = true, .load_mtp = true, .rank = 0, .world_size = 1};
	enum status st = model_weights_load(&w, &wo, &e);
#if DSV4_HAVE_CUDA
	T_CHECKF(st == ST_OK, "%s cc %d.%d: load failed: %s", variant, major, minor, e.msg);
	if (st == ST_OK) {
		int bad = 0;
		const char *first = NULL;
		for (int i = 0; i < w.plan.n; i++) {
			const struct kern_plan_entry *pe = &w.plan.entries[i];
			const struct kern_variant *v = variant_named(pe->op, pe->variant);
			if (!v || v->backend != KERN_BACKEND_CUDA) {
				if (!bad++)
					first = pe->variant;
			}
		}
		T_CHECKF(w.plan.n > 50 && bad == 0, "%s cc %d.%d: %d rows, %d not CUDA (first %s)", variant, major, minor,
			 w.plan.n, bad, first ? first : "-");
		const char *need[] = {"rmsnorm", "rope", "sparse_attn", "attn_index", "compressor", "indexer_rotate",
				      "indexer_topk", "route", "moe_dispatch", "moe_row_weight", "moe_combine", "swiglu",
				      "linear", "moe_gemm", "hc_prenorm", "embed", "copy_rows", "ring_write",
				      "block_copy", "block_fill", "round_bf16", "add", "act_quant_sim"};
		for (size_t k = 0; k < sizeof need / sizeof need[0]; k++) {
			bool seen = false;
			for (int i = 0; i < w.plan.n && !seen; i++)
				seen = !strcmp(w.plan.entries[i].op, need[k]);
			T_CHECKF(seen, "%s cc %d.%d: no %s row in the plan", variant, major, minor, need[k]);
		}
		/* attention runs the portable decode row (it hands steps over 64 tokens to the generic kernel) */
		for (int i = 0; i < w.plan.n; i++)
			if (!strcmp(w.plan.entries[i].op, "sparse_attn"))
				T_CHECKF(!strcmp(w.plan.entries[i].variant, "sparse_attn_cuda_decode"),
					 "%s cc %d.%d: sparse_attn row is %s", variant, major, minor,
					 w.plan.entries[i].variant);
		if (max_step_tokens < 64) { /* a decode plan: the FP8 GEMV in every layer, no tile variant */
			int n_layers = 0, with_gemv = 0, tiles = 0;
			for (int i = 0; i < w.plan.n; i++)
				if (w.plan.entries[i].layer + 1 > n_layers)
					n_layers = w.plan.entries[i].layer + 1;
			for (int l = 0; l < n_layers; l++) {
				bool seen = false;
				for (int i = 0; i < w.plan.n && !seen; i++)
					seen = w.plan.entries[i].layer == l &&
					       !strcmp(w.plan.entries[i].variant, "linear_cuda_gemv");
				with_gemv += seen;
			}
			for (int i = 0; i < w.plan.n; i++)
				tiles += !strncmp(w.plan.entries[i].variant, "linear_mma", 10);
			T_CHECKF(n_layers > 0 && with_gemv == n_layers && tiles == 0,
				 "%s cc %d.%d decode plan: linear_cuda_gemv in %d of %d layers, %d tile rows", variant,
				 major, minor, with_gemv, n_layers, tiles);
		}
		fprintf(stderr, "%s cc %d.%d, %lld-token steps: %d rows, all CUDA\n", variant, major, minor,
			(long long)max_step_tokens, w.plan.n);
		model_weights_free(&w);
	}
#else
	T_CHECKF(st != ST_OK, "%s cc %d.%d: a CPU-only build cannot plan a GPU", variant, major, minor);
	if (st == ST_OK) {
		model_weights_free(&w);
	} else {
		T_STR_CONTAINS(e.msg, "layer ");
		T_STR_CONTAINS(e.msg, " op ");
		T_STR_CONTAINS(e.msg, "no variant fits");
		fprintf(stderr, "%s cc %d.%d: %s\n", variant, major, minor, e.msg);
	}
#endif
	model_checkpoint_destroy(ck);
}

int main(void)
{
	const char *dir = fh_tiny_dir();
	if (!dir)
		return test_skip("no tiny checkpoints (scripts/make_tiny_model needs the venv)");
	const int cc[][2] = {{8, 0}, {9, 0}, {10, 0}, {12, 0}, {12, 1}};
	for (int v = 0; v < 2; v++)
		for (int i = 0; i < 5; i++)
			one(dir, v ? "nvfp4" : "fp8", cc[i][0], cc[i][1], 512);
	for (int v = 0; v < 2; v++) /* decode plans on the Blackwell consumer parts (fp8gemv) */
		for (int i = 3; i < 5; i++)
			one(dir, v ? "nvfp4" : "fp8", cc[i][0], cc[i][1], 16);
	return test_exit();
}
