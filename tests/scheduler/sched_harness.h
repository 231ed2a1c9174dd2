/*
 * tests/scheduler/sched_harness.h: what the scheduler tests that drive a real
 * scheduler by hand share: the executor stack a speculation test schedules
 * on, and one step followed by the invariant check, with a failure reported
 * under the run's name.
 */
#ifndef DSV4_TESTS_SCHEDULER_SCHED_HARNESS_H
#define DSV4_TESTS_SCHEDULER_SCHED_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/exec_cpu.h"
#include "model/spec.h"
#include "scheduler/scheduler.h"
#include "tests/test.h"

/* The executor a speculation test schedules on: a CPU executor of n_blocks
 * blocks of block_tokens (128 tokens and max_seqs sequences a step, the
 * draft layers loaded when K > 0), wrapped in a speculating one (sc: method
 * and K; hook, when not NULL, replaces its drafts) when K > 0. NULL when one
 * fails (reported under name); *x and *sx are the caller's to destroy. */
static inline struct exec *sch_spec_stack(const struct model_checkpoint *ck, uint32_t block_tokens, uint32_t n_blocks,
					  uint32_t max_seqs, struct spec_config sc, spec_draft_hook_fn hook,
					  const char *name, struct model_exec_cpu **x, struct model_spec_exec **sx)
{
	struct model_exec_cpu_options xo = {.ck = ck, .block_tokens = block_tokens, .n_blocks = n_blocks,
					    .max_step_tokens = 128, .max_step_seqs = max_seqs,
					    .load_mtp = sc.num_speculative_tokens > 0};
	struct err e = {0};
	*x = NULL;
	*sx = NULL;
	T_CHECKF(model_exec_cpu_create(x, &xo, &e) == ST_OK, "%s: exec: %s", name, e.msg);
	if (!*x)
		return NULL;
	if (!sc.num_speculative_tokens)
		return model_exec_cpu_exec(*x);
	struct model_spec_exec_options so = {.x = *x, .cfg = sc, .draft_hook = hook};
	T_CHECKF(model_spec_exec_create(sx, &so, &e) == ST_OK, "%s: spec: %s", name, e.msg);
	return *sx ? model_spec_exec_exec(*sx) : NULL;
}

/* One sched_step of s, then sched_check_invariants; *steps counts the steps
 * made. false (reported under name) when either fails: the run stops there. */
static inline bool sch_step_checked(struct sched *s, const char *name, uint32_t *steps)
{
	struct err e = {0};
	if (sched_step(s, NULL, &e) != ST_OK) {
		T_CHECKF(0, "%s: step: %s", name, e.msg);
		return false;
	}
	++*steps;
	if (sched_check_invariants(s, &e) != ST_OK) {
		T_CHECKF(0, "%s: invariants after step %u: %s", name, *steps, e.msg);
		return false;
	}
	return true;
}

#endif
