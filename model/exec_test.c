/*
 * model/exec_test.c: the deterministic test executor (model/exec_test.h).
 */
#include "model/exec_test.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

struct test_exec {
	struct exec ex;
	float *logits;
	void *work;
	int32_t *script;
	uint32_t n_script;
	uint32_t delay_ms;
};

static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* The test executor's logits after token tok at position pos: sparse, a
 * handful of likely tokens over a flat floor. */
static void test_logits(struct test_exec *t, int32_t tok, int32_t pos)
{
	uint32_t V = t->ex.info.vocab_size;
	uint64_t h = mix64(((uint64_t)(uint32_t)tok << 32) ^ (uint64_t)pos);
	for (uint32_t v = 0; v < V; v++)
		t->logits[v] = -4.0f;
	for (uint32_t r = 0; r < 8; r++) {
		h = mix64(h);
		uint32_t id = (uint32_t)(h % V);
		t->logits[id] = 4.0f + (float)(r == 0) * 2.0f + (float)((h >> 40) & 255) / 256.0f;
	}
	if (t->ex.info.eos_token_id >= 0 && (uint32_t)t->ex.info.eos_token_id < V)
		t->logits[t->ex.info.eos_token_id] = -8.0f; /* rarely stops by itself */
}

/* Prompt log-probabilities (model/exec.h) from the same logits, row by row. */
static enum status test_prompt_lp(struct test_exec *t, const struct exec_step *st, uint32_t i, struct err *e)
{
	const struct exec_seq *s = &st->seqs[i];
	struct exec_prompt_lp *lp = s->prompt_lp;
	if (!lp || !lp->logprob || !s->prompt_ids)
		return ST_OK;
	for (uint32_t r = st->query_start[i]; r < st->query_start[i + 1]; r++) {
		uint32_t p = (uint32_t)st->positions[r];
		if (p + 1 >= s->n_prompt)
			continue;
		test_logits(t, st->token_ids[r], st->positions[r]);
		struct kern_token_logprobs_args a = {
			.logits = t->logits, .ld = t->ex.info.vocab_size, .vocab = t->ex.info.vocab_size, .n_rows = 1,
			.target = &s->prompt_ids[p + 1], .n_top = lp->n_top, .logprob = &lp->logprob[p + 1],
			.rank = &lp->rank[p + 1], .top_ids = lp->n_top ? lp->top_ids + (size_t)(p + 1) * lp->n_top : NULL,
			.top_logprobs = lp->n_top ? lp->top_logprobs + (size_t)(p + 1) * lp->n_top : NULL};
		enum status rc = kern_token_logprobs_ref(&a);
		if (rc)
			return err_set(e, rc, "test executor: prompt logprobs failed");
	}
	return ST_OK;
}

static enum status test_step(void *ctx, const struct exec_step *st, struct exec_sample *out, struct err *e)
{
	struct test_exec *t = ctx;
	uint32_t V = t->ex.info.vocab_size, k = 0;
	if (t->delay_ms) {
		struct timespec ts = {.tv_sec = t->delay_ms / 1000, .tv_nsec = (long)(t->delay_ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	for (uint32_t i = 0; i < st->n_seqs; i++) {
		const struct exec_seq *s = &st->seqs[i];
		enum status rc = test_prompt_lp(t, st, i, e);
		if (rc)
			return rc;
		if (!s->sample)
			continue;
		if (s->n_output < t->n_script) {
			memset(&out[k], 0, sizeof out[k]);
			out[k].seq_index = i;
			out[k].out.token_id = t->script[s->n_output];
			k++;
			continue;
		}
		uint32_t last = st->query_start[i + 1] - 1;
		test_logits(t, st->token_ids[last], st->positions[last]);
		struct kern_sample_history hist = {.prompt_ids = s->prompt_ids, .n_prompt = s->n_prompt,
						   .output_ids = s->output_ids, .n_output = s->n_output};
		out[k].seq_index = i;
		rc = kern_sample_ref(t->logits, V, s->sampling, &hist, s->n_output, t->work, &out[k].out);
		if (rc)
			return err_set(e, rc, "test executor: sampling failed (bad parameters)");
		k++;
	}
	return ST_OK;
}

static const struct exec_ops test_ops = {.step = test_step};

enum status model_exec_test_create(struct exec **out, uint32_t vocab_size, int32_t eos_token_id,
				    uint32_t max_model_len, struct err *e)
{
	*out = NULL;
	struct test_exec *t = calloc(1, sizeof *t);
	if (!t)
		return err_set(e, ST_NOMEM, "test executor: out of memory");
	t->logits = malloc((size_t)vocab_size * sizeof(float));
	t->work = aligned_alloc(8, (kern_sample_workspace_bytes(vocab_size) + 7) & ~(size_t)7);
	if (!t->logits || !t->work) {
		free(t->logits);
		free(t->work);
		free(t);
		return err_set(e, ST_NOMEM, "test executor: out of memory");
	}
	struct exec_layer_mix mix = {
		.sliding_window = 32,
		.swa = {.n_layers = 2, .ring_entry_bytes = 128},
		.csa = {.n_layers = 2, .compress_ratio = 4, .overlap = true, .kv_entry_bytes = 128,
			.indexer_entry_bytes = 64, .ring_entry_bytes = 128, .compressor_token_bytes = 512},
		.hca = {.n_layers = 2, .compress_ratio = 8, .kv_entry_bytes = 128, .ring_entry_bytes = 128,
			.compressor_token_bytes = 256},
	};
	t->ex.ops = &test_ops;
	t->ex.ctx = t;
	t->ex.info = (struct exec_info){
		.mix = mix,
		.block_tokens = 64,
		.n_blocks = 8192,
		.n_state_slots = 256,
		.vocab_size = vocab_size,
		.eos_token_id = eos_token_id,
		.max_step_tokens = 8192,
		.max_step_seqs = 256,
		.max_model_len = max_model_len ? max_model_len : 65536,
	};
	*out = &t->ex;
	return ST_OK;
}

enum status model_exec_test_script(struct exec *ex, const int32_t *ids, uint32_t n, struct err *e)
{
	struct test_exec *t = ex->ctx;
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] < 0 || (uint32_t)ids[i] >= t->ex.info.vocab_size)
			return err_set(e, ST_INVALID, "test executor script: id %d outside the vocabulary", ids[i]);
	int32_t *c = malloc((n ? n : 1) * sizeof *c);
	if (!c)
		return err_set(e, ST_NOMEM, "test executor: out of memory");
	memcpy(c, ids, n * sizeof *c);
	free(t->script);
	t->script = c;
	t->n_script = n;
	return ST_OK;
}

void model_exec_test_set_step_delay(struct exec *ex, uint32_t delay_ms)
{
	((struct test_exec *)ex->ctx)->delay_ms = delay_ms;
}

void model_exec_test_destroy(struct exec *ex)
{
	if (!ex)
		return;
	struct test_exec *t = ex->ctx;
	free(t->script);
	free(t->logits);
	free(t->work);
	free(t);
}
