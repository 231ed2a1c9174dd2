/*
 * tests/model/test_dummy.c: --load-format dummy and --hf-overrides on the real
 * DeepSeek-V4-Flash NVFP4 config (tests/model/data), shrunk by overrides to
 * two layers (one CSA, one HCA, one hash layer) and a few experts so it fits
 * in a test: every tensor in its stored format, the same seed gives the same
 * bytes, another seed other bytes, the CPU forward pass gives finite logits,
 * and bad overrides are refused naming the key.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/checkpoint.h"
#include "model/config_overrides.h"
#include "model/exec_cpu.h"
#include "tests/test.h"

#define SMALL                                                                                                     \
	"{\"num_hidden_layers\": 2, \"num_nextn_predict_layers\": 0, \"n_routed_experts\": 8, \"num_hash_layers\": 1," \
	" \"vocab_size\": 2048, \"compress_ratios\": [4, 128]}"

static char g_dir[1200];

static struct model_checkpoint *open_dummy(const char *ov, uint64_t seed, struct err *e)
{
	struct model_checkpoint_options o = {
		.dir = g_dir, .load_format = MODEL_LOAD_DUMMY, .hf_overrides = ov, .dummy_seed = seed};
	struct model_checkpoint *ck = NULL;
	if (model_checkpoint_create(&ck, &o, e) != ST_OK)
		return NULL;
	return ck;
}

static void test_refused(void)
{
	static const struct {
		const char *ov, *want;
	} bad[] = {
		{"{\"num_hidden_layerz\": 2}", "num_hidden_layerz: unknown"},
		{"{\"num_hidden_layers\": \"2\"}", "num_hidden_layers: a string"},
		{"{\"num_hidden_layers\": 2.5}", "num_hidden_layers: a number"},
		{"{\"rms_norm_eps\": null}", "rms_norm_eps: null"},
		{"[1]", "must be a JSON object"},
		{"{\"num_hidden_layers\": ", "not valid JSON"},
		{"{\"num_hidden_layers\": 0}", "num_hidden_layers"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct err e = {0};
		struct model_checkpoint *ck = open_dummy(bad[i].ov, 1, &e);
		T_CHECKF(!ck, "override %s accepted", bad[i].ov);
		T_STR_CONTAINS(e.msg, bad[i].want);
		model_checkpoint_destroy(ck);
	}
	/* a real may be given as an integer; lowering num_hidden_layers trims the schedule */
	const char *cfg = "{\"num_hidden_layers\": 4, \"rms_norm_eps\": 1e-6, \"compress_ratios\": [0, 4, 128, 4, 9]}";
	char *out = NULL;
	size_t n = 0;
	struct err e = {0};
	T_CHECKF(model_config_apply_overrides(cfg, strlen(cfg), "c.json", "{\"num_hidden_layers\": 2, \"rms_norm_eps\": 1}",
					      &out, &n, &e) == ST_OK, "%s", e.msg);
	if (out) {
		T_STR_CONTAINS(out, "\"compress_ratios\":[0,4,9]");
		T_STR_CONTAINS(out, "\"num_hidden_layers\":2");
	}
	free(out);
}

static void test_load_and_forward(void)
{
	struct err e = {0};
	struct model_checkpoint *a = open_dummy(SMALL, 42, &e);
	T_CHECKF(a != NULL, "%s", e.msg);
	if (!a)
		return;
	struct model_checkpoint *b = open_dummy(SMALL, 42, &e);
	struct model_checkpoint *c = open_dummy(SMALL, 43, &e);
	T_CHECKF(b && c, "%s", e.msg);
	const struct model_config *cfg = model_checkpoint_config(a);
	T_CHECK(cfg->num_hidden_layers == 2 && cfg->n_layers_total == 2 && cfg->vocab_size == 2048);
	T_CHECK(model_checkpoint_is_dummy(a) && model_checkpoint_n_shards(a) == 0);
	T_CHECK(model_checkpoint_group_format(a, 0, MODEL_GROUP_ROUTED_EXPERTS) == MODEL_FMT_NVFP4);
	T_CHECK(model_checkpoint_group_format(a, 1, MODEL_GROUP_ATTN) == MODEL_FMT_FP8_BLOCK);
	struct model_linear l;
	T_CHECKF(model_checkpoint_linear(a, "layers.1.ffn.experts.7.w2", &l, &e) == ST_OK, "%s", e.msg);
	T_CHECK(l.format == MODEL_FMT_NVFP4 && l.scale && l.scale_2 && l.input_scale);
	T_CHECK(model_checkpoint_tensor(a, "layers.0.ffn.gate.tid2eid") != NULL);
	T_CHECK(model_checkpoint_tensor(a, "layers.1.ffn.gate.tid2eid") == NULL);
	size_t n = model_checkpoint_n_tensors(a), n_diff = 0;
	T_CHECK(b && n == model_checkpoint_n_tensors(b) && c && n == model_checkpoint_n_tensors(c));
	for (size_t i = 0; b && c && i < n; i++) {
		const struct model_tensor *ta = model_checkpoint_tensor_at(a, i), *tb = model_checkpoint_tensor_at(b, i),
					  *tc = model_checkpoint_tensor_at(c, i);
		T_CHECK(!strcmp(ta->name, tb->name) && ta->n_bytes == tb->n_bytes);
		T_CHECKF(!memcmp(ta->data, tb->data, ta->n_bytes), "tensor %s differs under the same seed", ta->name);
		n_diff += ta->n_elements > 4 && memcmp(ta->data, tc->data, ta->n_bytes) != 0;
		if (ta->role == MODEL_ROLE_PLAIN && ta->dtype == MODEL_DTYPE_I64) {
			const int64_t *v = ta->data;
			for (uint64_t k = 0; k < ta->n_elements; k++)
				T_CHECK(v[k] >= 0 && v[k] < cfg->n_routed_experts);
		}
	}
	T_CHECKF(n_diff > n / 2, "seed 43 changed only %zu of %zu tensors", n_diff, n);
	model_checkpoint_destroy(b);
	model_checkpoint_destroy(c);

	struct model_exec_cpu_options xo = {.ck = a, .block_tokens = 128, .n_blocks = 4, .max_step_tokens = 16,
					    .max_step_seqs = 1};
	struct model_exec_cpu *x = NULL;
	T_CHECKF(model_exec_cpu_create(&x, &xo, &e) == ST_OK, "%s", e.msg);
	if (x) {
		enum { T = 9 };
		int32_t ids[T], pos[T];
		uint32_t rows[T], qs[2] = {0, T}, blocks[1] = {0};
		for (int i = 0; i < T; i++) {
			ids[i] = (int32_t)((unsigned)rand() % 2048u);
			pos[i] = i;
			rows[i] = (uint32_t)i;
		}
		struct exec_seq es = {.seq_id = 1, .n_cached_tokens = 0, .n_context_tokens = T, .n_blocks = 1};
		struct exec_step step = {.n_tokens = T, .token_ids = ids, .positions = pos, .n_seqs = 1, .seqs = &es,
					 .query_start = qs, .block_ids = blocks, .n_block_ids = 1};
		float *logits = malloc((size_t)T * 2048 * sizeof *logits);
		T_CHECK(logits != NULL);
		if (logits) {
			T_CHECKF(model_exec_cpu_forward(x, &step, rows, T, logits, &e) == ST_OK, "%s", e.msg);
			size_t bad = 0;
			double mn = INFINITY, mx = -INFINITY;
			for (size_t i = 0; i < (size_t)T * 2048; i++) {
				bad += !isfinite(logits[i]);
				mn = fmin(mn, logits[i]);
				mx = fmax(mx, logits[i]);
			}
			T_CHECKF(bad == 0, "%zu non-finite logits", bad);
			T_CHECKF(mx > mn && mx - mn < 1e4, "logits span [%g, %g]", mn, mx);
			printf("dummy forward: %zu tensors, logits in [%g, %g]\n", n, mn, mx);
		}
		free(logits);
	}
	model_exec_cpu_destroy(x);
	model_checkpoint_destroy(a);
}

int main(void)
{
	const char *root = getenv("DSV4_SOURCE_ROOT");
	snprintf(g_dir, sizeof g_dir, "%s/tests/model/data/deepseek-v4-flash-nvfp4", root ? root : ".");
	srand((unsigned)test_seed());
	test_refused();
	test_load_and_forward();
	return test_exit();
}
