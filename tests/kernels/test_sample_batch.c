/*
 * tests/kernels/test_sample_batch.c: op "sample"'s CPU variant
 * (kern_sample_batch_ref) gives, row by row, what kern_sample_ref gives on
 * that row (with its own parameters, history and counter, past a padded row
 * stride); the scratch size covers the reference's and grows with rows and
 * aux entries; kern_sample_batch_aux_count counts biases and history ids; bad
 * arguments are refused; the op is listed with its CPU variant first.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "tests/kernels/mops_util.h"
#include "tests/test.h"

int main(void)
{
	mt_seed_from_env("test_sample_batch");
	enum { R = 6, V = 300, LD = 311 };
	float *logits = xcalloc((size_t)R * LD, sizeof(float));
	mt_fill(logits, (size_t)R * LD, -4, 4);
	struct kern_sampling_params p[R];
	struct kern_sample_history h[R];
	int32_t ids[R][10];
	struct kern_logit_bias bias = {7, 3.0f};
	uint64_t ctr[R];
	for (int r = 0; r < R; r++) {
		p[r] = (struct kern_sampling_params){.temperature = r % 3 ? 0.8f : 0.0f, .top_p = r & 1 ? 0.9f : 1.0f,
						     .top_k = r == 4 ? 5 : 0, .min_p = r == 5 ? 0.1f : 0.0f,
						     .repetition_penalty = r == 2 ? 1.2f : 1.0f,
						     .frequency_penalty = r == 3 ? 0.4f : 0.0f, .seed = mt_next(),
						     .logprobs = true, .top_logprobs = (uint32_t)r * 3};
		if (r == 1)
			p[r].logit_bias = &bias, p[r].n_logit_bias = 1;
		for (int i = 0; i < 10; i++)
			ids[r][i] = mt_int(0, V - 1);
		h[r] = (struct kern_sample_history){.prompt_ids = ids[r], .n_prompt = 6, .output_ids = ids[r] + 6,
						    .n_output = 4};
		ctr[r] = mt_next() % 100;
	}
	size_t ws = kern_sample_batch_workspace_bytes(V, R, kern_sample_batch_aux_count(p, h, R));
	T_CHECK(kern_sample_batch_aux_count(p, h, R) == R * 10 + 1);
	T_CHECK(ws >= kern_sample_workspace_bytes(V));
	T_CHECK(kern_sample_batch_workspace_bytes(V, R + 1, 61) > ws && kern_sample_batch_workspace_bytes(V, R, 200) > ws);
	void *work = aligned_alloc(256, (ws + 255) & ~(size_t)255);
	struct kern_sample_out got[R], want[R];
	struct kern_sample_batch_args a = {.logits = logits, .ld = LD, .vocab = V, .n_rows = R, .params = p, .hist = h,
					   .counter = ctr, .out = got, .work = work, .work_bytes = ws};
	T_CHECK(kern_sample_batch_ref(&a) == ST_OK);
	for (int r = 0; r < R; r++) {
		T_CHECK(kern_sample_ref(logits + r * LD, V, &p[r], &h[r], ctr[r], work, &want[r]) == ST_OK);
		T_CHECKF(memcmp(&got[r], &want[r], sizeof got[r]) == 0, "row %d: id %d vs %d", r, got[r].token_id,
			 want[r].token_id);
	}
	/* refusals */
	a.ld = V - 1;
	T_CHECK(kern_sample_batch_ref(&a) == ST_INVALID);
	a.ld = LD;
	a.work_bytes = 16;
	T_CHECK(kern_sample_batch_ref(&a) == ST_INVALID);
	a.work_bytes = ws;
	p[3].top_p = 0.0f;
	T_CHECK(kern_sample_batch_ref(&a) == ST_INVALID);
	p[3].top_p = 1.0f;
	a.n_rows = 0;
	T_CHECK(kern_sample_batch_ref(&a) == ST_OK);
	T_CHECK(kern_sample_batch_ref(NULL) == ST_INVALID);
	/* registry */
	const struct kern_op *op = kern_registry_find_op("sample");
	T_CHECK(op == &kern_op_sample && op->n_variants >= 1 && op->variants[0].backend == KERN_BACKEND_CPU &&
		op->variants[0].run == KERN_FN(kern_sample_batch_ref));
	free(work);
	free(logits);
	return test_exit();
}
