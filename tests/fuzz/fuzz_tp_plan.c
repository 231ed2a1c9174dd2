/*
 * tests/fuzz/fuzz_tp_plan.c: libFuzzer target for the tensor-parallel step
 * plan decoder (model_exec_tp_plan_decode), what a worker rank runs on bytes
 * from rank 0. A plan that decodes must encode again, and that encoding must
 * decode to the same encoding (the decoded step is self-consistent).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/exec_tp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct model_tp_plan p, q;
	memset(&p, 0, sizeof p);
	memset(&q, 0, sizeof q);
	struct model_tp_buf b = {0}, b2 = {0};
	struct err e = {0};
	if (model_exec_tp_plan_decode(&p, data, size, &e) == ST_OK &&
	    model_exec_tp_plan_encode(&p.step, &b, &e) == ST_OK) {
		if (model_exec_tp_plan_decode(&q, b.data, b.n, &e) != ST_OK)
			abort(); /* its own encoding must decode */
		if (model_exec_tp_plan_encode(&q.step, &b2, &e) != ST_OK || b2.n != b.n || memcmp(b.data, b2.data, b.n))
			abort(); /* and round-trip to the same bytes */
	}
	model_exec_tp_plan_free(&p);
	model_exec_tp_plan_free(&q);
	free(b.data);
	free(b2.data);
	return 0;
}
