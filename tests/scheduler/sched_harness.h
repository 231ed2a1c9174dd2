/*
 * tests/scheduler/sched_harness.h: what the scheduler tests that drive a real
 * scheduler by hand share: one step followed by the invariant check, with a
 * failure reported under the run's name.
 */
#ifndef DSV4_TESTS_SCHEDULER_SCHED_HARNESS_H
#define DSV4_TESTS_SCHEDULER_SCHED_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/scheduler.h"
#include "tests/test.h"

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
