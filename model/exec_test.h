/*
 * model/exec_test.h: the deterministic test executor, an executor behind
 * model/exec.h like the model's own, that `dsv4 serve --executor test`
 * serves. No weights are read: the logits of each step are a hash of the
 * sequence's last token and position (a handful of likely tokens over a flat
 * floor), so output is reproducible and depends on the prompt, which is all
 * the HTTP, SSE and scheduler paths need to be tested without a checkpoint.
 * Sampling and prompt logprobs run the CPU reference ops on those logits.
 */
#ifndef DSV4_MODEL_EXEC_TEST_H
#define DSV4_MODEL_EXEC_TEST_H

#include <stdint.h>

#include "common/status.h"
#include "model/exec.h"

/* max_model_len 0: 65536. */
enum status model_exec_test_create(struct exec **out, uint32_t vocab_size, int32_t eos_token_id,
				   uint32_t max_model_len, struct err *e) DSV4_WUR;
/* Script the executor: every sequence's output starts with these ids
 * (copied; sampling is bypassed for them), then continues as above. For
 * tests that need a known output, e.g. a DSML tool call. */
enum status model_exec_test_script(struct exec *ex, const int32_t *ids, uint32_t n, struct err *e) DSV4_WUR;
/* Sleep this long in every step (tests that need a request to stay in
 * flight for a while, whatever the build's speed). */
void model_exec_test_set_step_delay(struct exec *ex, uint32_t delay_ms);
/* NULL is a no-op. */
void model_exec_test_destroy(struct exec *ex);

#endif
