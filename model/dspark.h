/*
 * model/dspark.h: the DSpark drafter of the 0731 release (dsv4-0731.md,
 * docs/speculation.md "DSpark"), a struct spec_drafter (model/spec.h) run
 * by the CPU executor's forward pass (model/forward.h "DSpark").
 */
#ifndef DSV4_MODEL_DSPARK_H
#define DSV4_MODEL_DSPARK_H

#include <stdint.h>

#include "common/status.h"
#include "model/spec.h"

struct model_exec_cpu;

/* The drafter on x (created with load_mtp on a 0731 checkpoint: the stages
 * loaded); max_draft 1..dspark_block_size. It turns on the target-layer
 * captures of x's forward pass. */
enum status spec_dspark_drafter_create(struct spec_drafter *out, struct model_exec_cpu *x, uint32_t max_draft,
				       struct err *e) DSV4_WUR;

/* Tests: the drafter state of sequence seq_id (d = a spec_dspark drafter's
 * ctx): the positions its rings hold, [*pos_begin, *pos_end), and stage
 * k's ring [window, head_dim] (row p % window holds position p). ST_NOTFOUND
 * for an unknown sequence. */
enum status spec_dspark_ring(void *ctx, uint64_t seq_id, int stage, const float **ring, uint32_t *pos_begin,
			     uint32_t *pos_end, struct err *e) DSV4_WUR;

/* Tests: the logits (after the Markov head, K rows of vocab) and drafts of
 * the last propose for the sequence of batch index i of that propose; NULL
 * when it proposed none. */
const float *spec_dspark_last_logits(void *ctx, uint32_t i);

#endif
